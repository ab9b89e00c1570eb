// Size classes of the default output allocator (make_stream_ordered_allocator): a tensor's memory
// comes from the pool of its class, rounded up to the class's size, so that a tensor freed in one
// step is reused whole by the next step's tensor of that class. With one pool for every size, a
// step that keeps tensors of different sizes alive in turn (a dispatch's outputs, then a
// low-latency dispatch's) paid 45-90 us of host time per call on H200, the pool never growing: by
// all signs it mapped its free pages into a block large enough on every call instead of reusing
// one (docs/PERF.md, seventeenth session).
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <map>
#include <vector>

namespace epcomm::detail {

constexpr size_t kSizeClassGranule = size_t{2} << 20;          // the driver maps device memory in 2 MiB pages
constexpr size_t kSharedClassMaxBytes = kSizeClassGranule;      // up to this, one class for every size
constexpr size_t kFineClassMaxBytes = 8 * kSizeClassGranule;    // up to this, a class every 2 MiB
constexpr int kClassesPerOctave = 4;                            // above it, quarter octaves: at most 19% more
constexpr size_t kLargestClassBytes = size_t{1} << 50;          // past it, sizes are their own class

// The bytes a tensor of `bytes` is given from its class, which also names the class; 0 for the
// shared class of small tensors (which get what they ask for).
inline size_t size_class_bytes(size_t bytes) {
  if (bytes <= kSharedClassMaxBytes) return 0;
  if (bytes > kLargestClassBytes) return bytes;  // no device holds it: the allocation fails, naming it
  const auto whole_pages = [](size_t b) { return (b + kSizeClassGranule - 1) / kSizeClassGranule * kSizeClassGranule; };
  if (bytes <= kFineClassMaxBytes) return whole_pages(bytes);
  const auto class_size = [&](int step) {
    return whole_pages(static_cast<size_t>(std::ldexp(static_cast<double>(kFineClassMaxBytes) *
                                                          std::exp2(static_cast<double>(step % kClassesPerOctave) / kClassesPerOctave),
                                                      step / kClassesPerOctave)));
  };
  // The estimate may land one class low or high of the smallest class that holds `bytes`.
  int step = static_cast<int>(std::floor(std::log2(static_cast<double>(bytes) / kFineClassMaxBytes) * kClassesPerOctave));
  if (step > 0 && class_size(step - 1) >= bytes) --step;
  while (class_size(step) < bytes) ++step;
  return class_size(step);
}

// Which class serves each request, and which classes have sat idle: the bookkeeping of
// SizeClassPools (common/device_allocation.hpp), apart from CUDA so that CPU tests check it. A
// request whose class has no free block takes one of a larger class that has (up to
// kMaxBorrowRatio its size) before its own class grows: a warmup's memory serves calls whose sizes
// fall a class lower, and sizes drifting down reuse what is there. A class not chosen during the
// last kIdleRequests requests is due to give its free memory back, so that sizes drifting across
// classes do not keep idle ones.
class SizeClassChooser {
 public:
  static constexpr uint64_t kIdleRequests = 1024;
  static constexpr double kMaxBorrowRatio = 1.5;

  // The class (its bytes; 0 for the shared class) to serve `bytes`, not yet counted as chosen.
  // `has_free_block(class_bytes)` is asked only of classes chosen before, its own first.
  template <typename HasFreeBlock>
  size_t pick(size_t bytes, HasFreeBlock&& has_free_block) const {
    const size_t own = size_class_bytes(bytes);
    if (own == 0) return 0;
    const auto largest = static_cast<size_t>(static_cast<double>(own) * kMaxBorrowRatio);
    for (auto it = last_request_.lower_bound(own); it != last_request_.end() && it->first <= largest; ++it) {
      if (has_free_block(it->first)) return it->first;
    }
    return own;  // its own class grows
  }

  // Counts a request as served by `class_bytes` (once its pool exists). Returns the classes due to
  // give their free memory back now (some, every kIdleRequests requests).
  std::vector<size_t> choose(size_t class_bytes) {
    last_request_[class_bytes] = ++requests_;
    std::vector<size_t> idle;
    if (requests_ % kIdleRequests != 0) return idle;
    for (const auto& [bytes, last] : last_request_) {
      if (requests_ - last >= kIdleRequests) idle.push_back(bytes);
    }
    return idle;
  }

 private:
  std::map<size_t, uint64_t> last_request_;  // by class bytes: each class chosen so far, when last
  uint64_t requests_ = 0;
};

}  // namespace epcomm::detail
