#include "common/cuda_check.hpp"

#include <cstdio>

namespace epcomm::detail {

void warn_cuda(const char* call, cudaError_t status, const char* file, int line) noexcept {
  std::fprintf(stderr, "epcomm: warning: %s failed: %s (%s) at %s:%d\n", call, cudaGetErrorName(status),
               cudaGetErrorString(status), file, line);
}

}  // namespace epcomm::detail
