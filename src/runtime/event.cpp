#include "epcomm/event.hpp"

#include "runtime/cuda_check.hpp"

namespace epcomm {

Event Event::record(cudaStream_t stream) {
  cudaEvent_t raw = nullptr;
  EPCOMM_CUDA_CHECK(cudaEventCreateWithFlags(&raw, cudaEventDisableTiming));
  Event event;
  event.event_ = std::shared_ptr<CUevent_st>(raw, [](cudaEvent_t e) { EPCOMM_CUDA_WARN(cudaEventDestroy(e)); });
  EPCOMM_CUDA_CHECK(cudaEventRecord(raw, stream));
  return event;
}

void Event::wait(cudaStream_t stream) const {
  if (event_) EPCOMM_CUDA_CHECK(cudaStreamWaitEvent(stream, event_.get(), 0));
}

void Event::synchronize() const {
  if (event_) EPCOMM_CUDA_CHECK(cudaEventSynchronize(event_.get()));
}

bool Event::query() const {
  if (!event_) return true;
  const cudaError_t status = cudaEventQuery(event_.get());
  if (status == cudaErrorNotReady) {
    (void)cudaGetLastError();
    return false;
  }
  EPCOMM_CUDA_CHECK(status);
  return true;
}

}  // namespace epcomm
