// The record a kernel fills when it must fail: bad input it found, or a wait that timed out.
// It lives in pinned host memory mapped into the device, so the host can read it even while a
// stream is stuck; the first failure wins and later ones are dropped.
//
// Who writes it is decided in device memory, never by an atomic on the host record: a GPU on a
// PCIe host (an H200 on x86) has no atomics on host memory. The host opens the record for ticket
// `open_ticket`; a kernel wins it by advancing the rank's claim word (device memory, see
// KernelContext::error_claim) from ticket - 1 to ticket with a compare-and-swap, writes the fields
// with plain stores and publishes `kind` last (release). Having read the record, the host clears
// `kind` and opens the next ticket.
#pragma once

#include <cstdint>

#include "common/host_device.hpp"

namespace epcomm {

enum class DeviceErrorKind : int32_t {
  kNone = 0,
  kInvalidExpertId = 1,  // index0 = token, index1 = top-k slot, observed = the id
  kWaitTimeout = 2,      // peer / channel / expected / observed describe the wait
  kTooManyRows = 3,      // observed = rows received, limit = rows allocated (num_worst_tokens)
  kCallMismatch = 4,     // peer called with another value: index0 = CallField, expected = mine, observed = peer's
};

// What every rank of one collective call must agree on (a rank lays out its rows in its peers'
// rings by its own values), in the order a mismatch is reported.
enum class CallField : int32_t {
  kRowBytes = 0,     // hidden x element size
  kNumScales,        // FP8 scales per row (0: BF16)
  kNumTopk,
  kNumExperts,
  kNumChannels,      // config.num_sms
  kRingCapacity,     // config.num_max_nvl_chunked_recv_tokens
  kHasTopkIdx,
  kHasTopkWeights,
  kMaxTokens,        // num_max_dispatch_tokens_per_rank (low-latency mode; 0 in normal mode)
  kDispatchNumber,   // which of the Buffer's dispatches made the routing (a new dispatch's own
                     // number; a combine's or cached dispatch's handle's)
  kSumFormat,        // low-latency combine: how the sums travel (0: BF16, 1: LogFMT); 0 elsewhere
  kOtherStageRingCapacity,  // hierarchical normal mode: the other stage's ring capacity, so that each
                            // stage sees every difference either would (0 elsewhere)
  kEarlierStageFailed,  // hierarchical normal mode: 1 when this rank's earlier stage of the call found
                        // ranks making different calls (every rank's later stage then fails too)
  kOperation,        // the DeviceOp of the call (0: a peer made no checked call at that barrier)
  kCount,
};

// The order in which a call's fields are compared, the first difference being the one reported:
// the operation (a peer in another call, or in none, is told so), then an earlier stage's failure
// (the cause, not the fields it left different), then the rest in order.
static_assert(static_cast<int>(CallField::kOperation) == static_cast<int>(CallField::kCount) - 1 &&
                  static_cast<int>(CallField::kEarlierStageFailed) == static_cast<int>(CallField::kCount) - 2,
              "CallField::kOperation and kEarlierStageFailed stay the last two fields");
EPCOMM_HOST_DEVICE constexpr int compared_field(int i) {
  constexpr int kFields = static_cast<int>(CallField::kCount);
  return i < 2 ? kFields - 1 - i : i - 2;
}

// One rank's values of what every rank of a call must agree on, indexed by CallField.
struct CallSignature {
  int32_t values[static_cast<int>(CallField::kCount)];

  void set(CallField field, int64_t value) { values[static_cast<int>(field)] = static_cast<int32_t>(value); }
};

// Which operation a kernel was running.
enum class DeviceOp : int32_t {
  kNone = 0,
  kDispatchLayout,
  kBarrier,
  kPeerCopy,
  kNotifyDispatch,
  kDispatch,
  kCombine,
  kLowLatencyDispatch,
  kLowLatencyCombine,
};

// What a timed-out wait was waiting for.
enum class WaitTarget : int32_t {
  kNone = 0,
  kBarrierSignal,  // a peer's arrival at a barrier
  kRingData,       // a writer's tail: tokens to read in my ring (channel, peer)
  kRingSpace,      // a reader's head: free slots in its ring (channel, me)
  kLowLatencyFlag, // a low-latency (epoch, rows) flag; `channel` holds the local expert, if any
  kLaunchCheckins, // a kernel's block 0, for its other blocks to start (peer: this rank)
  kLaunchGo,       // a kernel's other blocks, for its block 0's checked barrier (peer: this rank)
};

struct DeviceErrorRecord {
  int32_t open_ticket;  // the ticket a kernel must claim to write this record (host-written, from 1)
  int32_t kind;     // DeviceErrorKind; written last, after every other field
  int32_t op;       // DeviceOp
  int32_t target;   // WaitTarget
  int32_t rank;
  int32_t peer;     // -1 if none
  int32_t channel;  // -1 if none
  int32_t failed_peer;  // 1 + the rank whose process died (the host's watchdog writes it), 0 if none
  int64_t index0;
  int64_t index1;
  int64_t expected;
  int64_t observed;
  int64_t limit;    // e.g. num_experts for an id, or the timeout in ns
};

const char* device_op_name(DeviceOp op);
const char* call_field_name(CallField field);
const char* wait_target_name(WaitTarget target);

}  // namespace epcomm
