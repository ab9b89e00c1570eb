// Kernel time with CUDA events: keep the stream busy while the host enqueues the op, so that the
// start event fires only when the GPU is ready to run the op, not when the host began calling it.
#include "bench/stream_filler.hpp"

#include "common/cuda_check.hpp"

namespace epcomm::bench {
namespace {

// One thread spins on the global timer: a stream stays busy for `ns` nanoseconds, whatever the
// memory system or the other ranks on the GPU are doing.
__global__ void spin_kernel(uint64_t ns) {
  uint64_t start = 0, now = 0;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
  do {
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
  } while (now - start < ns);
}

}  // namespace

void keep_stream_busy(cudaStream_t stream, std::chrono::microseconds duration) {
  const uint64_t ns = static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(duration).count());
  spin_kernel<<<1, 1, 0, stream>>>(ns);
  EPCOMM_CUDA_CHECK(cudaGetLastError());
}

}  // namespace epcomm::bench
