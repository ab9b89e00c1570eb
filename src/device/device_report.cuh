// How a kernel fails: fill the rank's DeviceErrorRecord (first failure wins) and return. The host
// raises it as an epcomm::Error at its next check, with every field in the message.
#pragma once

#include "common/device_error.hpp"
#include "common/kernel_context.hpp"
#include "device/memory_ordering.cuh"

namespace epcomm::device {

struct ErrorDetails {
  DeviceErrorKind kind = DeviceErrorKind::kNone;
  DeviceOp op = DeviceOp::kNone;
  WaitTarget target = WaitTarget::kNone;
  int peer = -1;
  int channel = -1;
  int64_t index0 = -1;
  int64_t index1 = -1;
  int64_t expected = 0;
  int64_t observed = 0;
  int64_t limit = 0;
};

__device__ __forceinline__ void report_error(const KernelContext& context, const ErrorDetails& details) {
  DeviceErrorRecord* record = context.errors;
  // The claim is a device-memory compare-and-swap (see device_error.hpp): every kernel of this rank
  // runs on one GPU, so GPU scope decides the winner. Pairs with the host's release of a new ticket.
  const int32_t ticket = ld_acquire_sys(&record->open_ticket);
  if (atomicCAS(context.error_claim, ticket - 1, ticket) != ticket - 1) return;  // an earlier failure already won
  st_relaxed_sys(&record->op, static_cast<int32_t>(details.op));
  st_relaxed_sys(&record->target, static_cast<int32_t>(details.target));
  st_relaxed_sys(&record->rank, context.world_rank(context.rank));
  st_relaxed_sys(&record->peer, details.peer >= 0 ? context.world_rank(details.peer) : details.peer);
  st_relaxed_sys(&record->channel, details.channel);
  st_relaxed_sys(&record->index0, details.index0);
  st_relaxed_sys(&record->index1, details.index1);
  st_relaxed_sys(&record->expected, details.expected);
  st_relaxed_sys(&record->observed, details.observed);
  st_relaxed_sys(&record->limit, details.limit);
  // Pairs with the host's read of `kind` before the other fields: publish them all at once.
  st_release_sys(&record->kind, static_cast<int32_t>(details.kind));
}

// topk_idx[token][slot] = expert is outside [-1, num_experts).
__device__ __forceinline__ void report_invalid_expert(const KernelContext& context, DeviceOp op, int64_t token,
                                                      int slot, int64_t expert, int num_experts) {
  ErrorDetails details;
  details.kind = DeviceErrorKind::kInvalidExpertId;
  details.op = op;
  details.index0 = token;
  details.index1 = slot;
  details.observed = expert;
  details.limit = num_experts;
  report_error(context, details);
}

}  // namespace epcomm::device
