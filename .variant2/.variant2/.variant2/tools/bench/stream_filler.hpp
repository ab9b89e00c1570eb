// The stream filler of kernel timing (see stream_filler.cu).
#pragma once

#include <chrono>

#include <cuda_runtime_api.h>

namespace epcomm::bench {

// Longer than the host needs to enqueue any op the bench times (a normal-mode call enqueues a few
// events, allocations and kernels: tens of microseconds), so the GPU never waits for the host.
inline constexpr std::chrono::microseconds kKernelTimingLead{300};

// Enqueues a kernel that keeps `stream` busy for `duration`.
void keep_stream_busy(cudaStream_t stream, std::chrono::microseconds duration);

}  // namespace epcomm::bench
