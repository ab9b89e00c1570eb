#include "epcomm/event.hpp"

#include <map>
#include <mutex>
#include <vector>

#include "common/cuda_check.hpp"

namespace epcomm {
namespace {

// Events of each device, kept for reuse once no Event holds them: a normal-mode call records
// three, and creating and destroying an event are two driver calls each, host time on every call.
// Reuse is safe: a cudaStreamWaitEvent already enqueued waits for the recording it saw, not for
// a later one.
class EventPool {
 public:
  cudaEvent_t take(int device) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      std::vector<cudaEvent_t>& free = free_[device];
      if (!free.empty()) {
        const cudaEvent_t event = free.back();
        free.pop_back();
        return event;
      }
    }
    cudaEvent_t event = nullptr;
    EPCOMM_CUDA_CHECK(cudaEventCreateWithFlags(&event, cudaEventDisableTiming));
    return event;
  }

  void give_back(int device, cudaEvent_t event) {
    std::lock_guard<std::mutex> lock(mutex_);
    free_[device].push_back(event);
  }

 private:
  std::mutex mutex_;
  std::map<int, std::vector<cudaEvent_t>> free_;
};

// Never destroyed: an Event may be released during static destruction (a Python Buffer collected
// at exit), and the driver frees what the pool holds when the process ends.
EventPool& event_pool() {
  static EventPool* const pool = std::make_unique<EventPool>().release();
  return *pool;
}

}  // namespace

Event Event::record(cudaStream_t stream) {
  int device = 0;
  EPCOMM_CUDA_CHECK(cudaGetDevice(&device));
  const cudaEvent_t raw = event_pool().take(device);
  Event event;
  event.event_ = std::shared_ptr<CUevent_st>(raw, [device](cudaEvent_t e) { event_pool().give_back(device, e); });
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
