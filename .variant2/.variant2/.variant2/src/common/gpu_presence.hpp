// Why no GPU is usable, in words a newcomer can act on. Without any NVIDIA driver the CUDA
// runtime says "CUDA driver version is insufficient for CUDA runtime version", which sends people
// looking for a driver upgrade; this says the driver is missing. Header-only: the tools that must
// not link libepcomm (epcomm-check-env, the tests' harness) use it too.
#pragma once

#include <dlfcn.h>

#include <cstdlib>
#include <string>

#include <cuda_runtime_api.h>

namespace epcomm::detail {

// Empty when cudaGetDeviceCount gave `status` == cudaSuccess and `count` > 0.
inline std::string no_gpu_reason(cudaError_t status, int count) {
  if (status == cudaSuccess && count > 0) return "";
  void* driver = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_LOCAL);
  if (driver == nullptr) return "no NVIDIA driver is installed here (libcuda.so.1 cannot be loaded)";
  dlclose(driver);
  if (status != cudaSuccess) {
    return std::string("cudaGetDeviceCount: ") + cudaGetErrorName(status) + " (" + cudaGetErrorString(status) + ")";
  }
  const char* visible = std::getenv("CUDA_VISIBLE_DEVICES");
  return visible != nullptr ? std::string("the NVIDIA driver shows no GPU (CUDA_VISIBLE_DEVICES='") + visible + "')"
                            : std::string("the NVIDIA driver shows no GPU");
}

}  // namespace epcomm::detail
