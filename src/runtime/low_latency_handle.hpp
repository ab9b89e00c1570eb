// What a LowLatencyHandle holds: the origin of every received row, and what the combine needs to
// send each source one weighted sum per token (kernels::Routing).
#pragma once

#include <atomic>
#include <memory>

#include "epcomm/low_latency.hpp"

namespace epcomm::detail {

struct LowLatencyHandleState {
  uint64_t owner = 0;  // Buffer::Impl::id of the Buffer that made it
  int num_tokens = 0;           // T of the dispatching rank
  int num_topk = 0;
  int max_tokens = 0;           // M
  int hidden = 0;
  int num_experts = 0;
  uint32_t dispatch_number = 0;  // which of the Buffer's dispatches made it (the same on every rank)
  Tensor recv_count_from;  // int32 [E_local, R]
  Tensor recv_src_info;    // int32 [E_local, R * M]
  Tensor tokens_from;      // int32 [R]: T of each source
  Tensor topk_from;        // int32 [R, M, K]: each source's top-k ids
  Tensor pair_row;         // int32 [R, M, K]: where each source pair naming an expert here landed
  // Hook mode: true until the dispatch's receive hook has launched the receive (which fills the
  // tensors above); null without a hook.
  std::shared_ptr<std::atomic<bool>> receive_pending;
};

}  // namespace epcomm::detail
