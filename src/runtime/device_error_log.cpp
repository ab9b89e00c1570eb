#include "runtime/device_error_log.hpp"

#include <cstdio>
#include <cstring>

#include "epcomm/error.hpp"
#include "common/cuda_check.hpp"

namespace epcomm {

const char* device_op_name(DeviceOp op) {
  switch (op) {
    case DeviceOp::kNone: return "(no operation)";
    case DeviceOp::kDispatchLayout: return "get_dispatch_layout";
    case DeviceOp::kBarrier: return "barrier";
    case DeviceOp::kPeerCopy: return "copy_to_all_ranks";
    case DeviceOp::kNotifyDispatch: return "dispatch (notify step)";
    case DeviceOp::kDispatch: return "dispatch";
    case DeviceOp::kCombine: return "combine";
    case DeviceOp::kLowLatencyDispatch: return "low_latency_dispatch";
    case DeviceOp::kLowLatencyCombine: return "low_latency_combine";
  }
  return "(unknown operation)";
}

const char* call_field_name(CallField field) {
  switch (field) {
    case CallField::kRowBytes: return "row bytes (hidden x element size)";
    case CallField::kNumScales: return "FP8 scales per row (0: BF16 x)";
    case CallField::kNumTopk: return "num_topk";
    case CallField::kNumExperts: return "num_experts";
    case CallField::kNumChannels: return "config.num_sms";
    case CallField::kRingCapacity:
      return "config.num_max_nvl_chunked_recv_tokens (a hierarchical call's rail stage: "
             "num_max_rdma_chunked_recv_tokens)";
    case CallField::kHasTopkIdx: return "topk_idx given (2: not given, the hierarchical stages route by is_token_in_rank)";
    case CallField::kHasTopkWeights: return "topk_weights given";
    case CallField::kMaxTokens: return "num_max_dispatch_tokens_per_rank";
    case CallField::kDispatchNumber: return "dispatch number (this dispatch's, or the handle's)";
    case CallField::kSumFormat: return "use_logfmt";
    case CallField::kEarlierStageFailed: return "a failed earlier stage";
    case CallField::kOtherStageRingCapacity:
      return "the other stage's ring capacity (hierarchical: config.num_max_rdma_chunked_recv_tokens in the node "
             "stage, num_max_nvl_chunked_recv_tokens in the rail stage)";
    case CallField::kOperation: return "operation";
    case CallField::kCount: break;
  }
  return "(unknown field)";
}

const char* wait_target_name(WaitTarget target) {
  switch (target) {
    case WaitTarget::kNone: return "nothing";
    case WaitTarget::kBarrierSignal: return "barrier signal";
    case WaitTarget::kRingData: return "tokens (ring tail)";
    case WaitTarget::kRingSpace: return "free ring slots (ring head)";
    case WaitTarget::kLowLatencyFlag: return "low-latency flag (epoch, rows)";
    case WaitTarget::kLaunchCheckins: return "blocks to start";
    case WaitTarget::kLaunchGo: return "block 0 to pass the checked barrier";
  }
  return "(unknown target)";
}

namespace detail {

void DeviceErrorLog::allocate() {
  memory_ = MappedHostMemory(sizeof(DeviceErrorRecord));
  claim_ = DeviceAllocation(sizeof(int32_t));
  EPCOMM_CUDA_CHECK(cudaMemset(claim_.get(), 0, sizeof(int32_t)));
  EPCOMM_CUDA_CHECK(cudaDeviceSynchronize());  // zero before any kernel can claim
  // Pairs with a kernel's acquire of the ticket before it claims.
  __atomic_store_n(&host_record()->open_ticket, 1, __ATOMIC_RELEASE);
}

std::string DeviceErrorLog::describe(const DeviceErrorRecord& record) {
  const auto op = static_cast<DeviceOp>(record.op);
  switch (static_cast<DeviceErrorKind>(record.kind)) {
    case DeviceErrorKind::kInvalidExpertId:
      return join_message("rank ", record.rank, ": ", device_op_name(op), ": topk_idx[", record.index0, "][",
                    record.index1, "] = ", record.observed, " is outside [-1, ", record.limit,
                    ") (num_experts=", record.limit, ")");
    case DeviceErrorKind::kWaitTimeout:
      if (record.target == static_cast<int32_t>(WaitTarget::kLaunchCheckins) ||
          record.target == static_cast<int32_t>(WaitTarget::kLaunchGo)) {
        // A wait inside one launch of this rank: its blocks were not all running at once.
        return join_message("rank ", record.rank, " waited ", record.limit / 1000000, " ms in ", device_op_name(op),
                            " for its own kernel's ", wait_target_name(static_cast<WaitTarget>(record.target)),
                            " (expected >= ", record.expected, ", last saw ", record.observed,
                            "); the kernel's blocks did not all run at once (other work on the GPU, or too many "
                            "ranks' blocks for its SMs?)");
      }
      return join_message("rank ", record.rank, " waited ", record.limit / 1000000, " ms in ", device_op_name(op),
                    " for rank ", record.peer, "'s ", wait_target_name(static_cast<WaitTarget>(record.target)),
                    record.channel >= 0 ? join_message(" on channel ", record.channel) : std::string(),
                    " (expected >= ", record.expected, ", last saw ", record.observed,
                    "); that rank may have died, be stuck, or not have made the same call");
    case DeviceErrorKind::kTooManyRows:
      return join_message("rank ", record.rank, ": ", device_op_name(op), " needed ", record.observed, " rows where ",
                    op == DeviceOp::kLowLatencyDispatch ? "num_max_dispatch_tokens_per_rank=" : "num_worst_tokens=",
                    record.limit, " fit",
                    op == DeviceOp::kLowLatencyDispatch ? " (a token names one expert twice?)" : "",
                    "; the rows past it were dropped");
    case DeviceErrorKind::kCallMismatch:
      if (static_cast<CallField>(record.index0) == CallField::kOperation) {
        const auto theirs = static_cast<DeviceOp>(record.observed);
        return join_message("rank ", record.rank, ": ", device_op_name(op), ": rank ", record.peer, " made ",
                            theirs == DeviceOp::kNone ? "no call that is checked there" : device_op_name(theirs),
                            " where rank ", record.rank, " made ", device_op_name(static_cast<DeviceOp>(record.expected)),
                            ": every rank must make the same call (nothing was sent)");
      }
      if (static_cast<CallField>(record.index0) == CallField::kEarlierStageFailed) {
        return join_message("rank ", record.rank, ": ", device_op_name(op), ": rank ",
                            record.observed != 0 ? record.peer : record.rank,
                            "'s other stage of this call (hierarchical mode) found ranks making different calls; "
                            "that rank's own error says which. This stage sent nothing");
      }
      return join_message("rank ", record.rank, ": ", device_op_name(op), ": rank ", record.peer, " called with ",
                          call_field_name(static_cast<CallField>(record.index0)), " = ", record.observed, ", rank ",
                          record.rank, " with ", record.expected, ": every rank must make the same call",
                          op == DeviceOp::kLowLatencyDispatch || op == DeviceOp::kLowLatencyCombine
                              ? " (this call's outputs are unspecified)"
                              : " (nothing was sent)");
    case DeviceErrorKind::kNone:
      break;
  }
  return join_message("rank ", record.rank, ": ", device_op_name(op), ": unknown device error kind ", record.kind);
}

void DeviceErrorLog::raise_if_out_of_step() {
  raise_if_unusable();
  if (host_record() == nullptr) return;
  // Pairs with the kernel's release store of `kind`.
  if (__atomic_load_n(&host_record()->kind, __ATOMIC_ACQUIRE) == static_cast<int32_t>(DeviceErrorKind::kWaitTimeout)) {
    raise_if_recorded();
  }
}

void DeviceErrorLog::raise_if_recorded(bool dead_peers_fatal) {
  raise_if_unusable(dead_peers_fatal);
  if (host_record() == nullptr) return;  // not allocated yet: no kernel can have written
  // Pairs with the kernel's release store of `kind`, written after every other field.
  const int32_t kind = __atomic_load_n(&host_record()->kind, __ATOMIC_ACQUIRE);
  if (kind == static_cast<int32_t>(DeviceErrorKind::kNone)) return;
  const DeviceErrorRecord record = *host_record();
  // Clear `kind` before opening the next ticket (release): a kernel that wins the record again
  // must never find it with an old kind, or the host would report the old error twice.
  __atomic_store_n(&host_record()->kind, 0, __ATOMIC_RELAXED);
  __atomic_store_n(&host_record()->open_ticket, record.open_ticket + 1, __ATOMIC_RELEASE);
  ErrorCode code = ErrorCode::kDeviceError;
  switch (static_cast<DeviceErrorKind>(kind)) {
    case DeviceErrorKind::kWaitTimeout: code = ErrorCode::kTimeout; break;
    case DeviceErrorKind::kInvalidExpertId:
    case DeviceErrorKind::kTooManyRows:
    case DeviceErrorKind::kCallMismatch: code = ErrorCode::kInvalidArgument; break;
    case DeviceErrorKind::kNone: break;
  }
  const std::string message = describe(record);
  if (code == ErrorCode::kTimeout) {
    // After a timeout the ranks disagree about rings, epochs and parities: refuse further calls.
    sticky_failure_ = message;
  }
  throw Error(code, message);
}

void DeviceErrorLog::mark_peers_dead(const std::vector<DeadProcess>& dead) {
  if (dead.empty() || death_reported_.exchange(true)) return;  // the first report is the one kept
  std::string names;
  for (size_t i = 0; i < dead.size(); ++i) {
    const char* separator = i == 0 ? "" : (i + 1 == dead.size() ? " and " : ", ");
    // pid 0: a rank the bootstrap reported (on another host), whose pid this host does not know.
    names += dead[i].pid != 0 ? join_message(separator, "rank ", dead[i].rank, " (pid ", dead[i].pid, ")")
                              : join_message(separator, "rank ", dead[i].rank, " (its rendezvous connection closed or went silent)");
  }
  dead_peers_ = std::move(names);
  peer_died_.store(true, std::memory_order_release);  // publishes dead_peers_ to raise_if_unusable()
  // Pairs with the relaxed polls of every bounded wait (device/bounded_wait.cuh).
  if (host_record() != nullptr) __atomic_store_n(&host_record()->failed_peer, dead.front().rank + 1, __ATOMIC_RELEASE);
}

void DeviceErrorLog::raise_if_unusable(bool dead_peers_fatal) const {
  if (dead_peers_fatal && peer_died()) {
    const bool several = dead_peers_.find(" and ") != std::string::npos;
    fail(ErrorCode::kPeerFailed, several ? "the processes of " : "the process of ", dead_peers_,
         " ended while this Buffer was in use (killed, crashed, or exited without destroying it); every call on "
         "this Buffer fails now: destroy it where possible and restart the job");
  }
  if (!sticky_failure_.empty()) {
    fail(ErrorCode::kTimeout, "this Buffer is unusable after an earlier timeout (", sticky_failure_,
         "); destroy it and create a new one on every rank");
  }
}

}  // namespace detail
}  // namespace epcomm
