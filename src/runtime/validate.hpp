// Argument checks shared by every operation. Each failure names the operation, the argument, what
// was expected and what was given: "get_dispatch_layout: topk_idx must be int64 or int32, got
// float32[4096, 8]".
#pragma once

#include <initializer_list>

#include <cuda_runtime_api.h>

#include "epcomm/types.hpp"

namespace epcomm::detail {

// Any extent; for shape checks.
inline constexpr int64_t kAnyExtent = -1;

enum class Strides { kContiguous, kAny };

// Checks dtype (one of `dtypes`), rank and extents (kAnyExtent matches any), contiguity (unless
// `strides` is kAny: then non-negative strides), and that non-empty data lives in device memory
// of `device` (the Buffer's; the pointer query this takes is the one the memory check needs).
void require_device_tensor(int device, const char* op, const char* name, const TensorView& tensor,
                           std::initializer_list<DType> dtypes, std::initializer_list<int64_t> shape,
                           Strides strides = Strides::kContiguous);

// Throws InvalidArgument unless `stream` runs work on `device` (the Buffer's): a stream of another
// device would fail its first launch with an unexplained CUDA error. The legacy and per-thread
// default streams (0, cudaStreamLegacy, cudaStreamPerThread) belong to whichever device is current,
// which the operation makes the Buffer's: they always pass, and so does a stream being captured
// (the driver may refuse the query then, and its refusal would end the capture).
void require_stream_of_device(int device, const char* op, cudaStream_t stream);

// Throws InvalidArgument "op: name=value must be ..." unless lo <= value <= hi.
void require_in_range(const char* op, const char* name, int64_t value, int64_t lo, int64_t hi);

}  // namespace epcomm::detail
