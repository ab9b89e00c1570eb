// A small harness for tests that run as N rank processes (started by epcomm-launch): each rank
// counts its own checks, prints its failures with its rank, and exits 0 (pass), 1 (fail) or
// kExitSkipped when there is no GPU, which ctest reports as a skip.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <string>

#include "common/gpu_presence.hpp"
#include "epcomm/bootstrap.hpp"
#include "epcomm/error.hpp"

namespace epcomm::testing {

inline constexpr int kExitSkipped = 77;

class RankHarness {
 public:
  RankHarness() : bootstrap_(make_bootstrap_from_env()) {}

  int rank() const { return bootstrap_->rank(); }
  int num_ranks() const { return bootstrap_->num_ranks(); }
  std::shared_ptr<Bootstrap> bootstrap() const { return bootstrap_; }

  // Records a check; prints it if it failed. Returns `ok` so callers can stop early.
  bool check(bool ok, const std::string& what) {
    ++checks_;
    if (!ok) {
      ++failures_;
      std::fprintf(stderr, "[rank %d] FAIL: %s\n", rank(), what.c_str());
    }
    return ok;
  }

  // Runs `body` expecting an epcomm::Error with `code` whose message contains `fragment`.
  void expect_error(ErrorCode code, const std::string& fragment, const std::function<void()>& body,
                    const std::string& what) {
    try {
      body();
      check(false, what + ": expected an error containing '" + fragment + "', got none");
    } catch (const Error& error) {
      const std::string message = error.what();
      check(error.code() == code && message.find(fragment) != std::string::npos,
            what + ": expected " + error_code_name(code) + " containing '" + fragment + "', got: " + message);
    }
  }

  int finish(const char* case_name) const {
    std::printf("[rank %d] %s: %s (%d checks, %d failed)\n", rank(), case_name, failures_ ? "FAILED" : "passed",
                checks_, failures_);
    std::fflush(stdout);
    return failures_ ? EXIT_FAILURE : EXIT_SUCCESS;
  }

 private:
  std::shared_ptr<Bootstrap> bootstrap_;
  int checks_ = 0;
  int failures_ = 0;
};

// Why GPU tests cannot run here, or an empty string if a CUDA device is usable.
inline std::string gpu_unavailable_reason() {
  int count = 0;
  const cudaError_t status = cudaGetDeviceCount(&count);
  if (status != cudaSuccess) return detail::no_gpu_reason(status, count);
  if (count == 0) return "no CUDA device is visible";
  return "";
}

// Each rank uses GPU rank % device_count: one GPU per rank on a multi-GPU node, all ranks on one
// GPU (under MPS) otherwise.
inline int select_rank_device(int rank) {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) return -1;
  const int device = rank % count;
  if (cudaSetDevice(device) != cudaSuccess) return -1;
  return device;
}

}  // namespace epcomm::testing
