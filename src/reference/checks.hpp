// Argument checks shared by the reference's entry points. Every message names the operation, the
// argument and the offending value, as epcomm's error model asks.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "epcomm/error.hpp"

namespace epcomm::reference::detail {

inline void check_size(const char* op, const std::string& what, size_t actual, size_t expected) {
  if (actual != expected) {
    fail(ErrorCode::kInvalidArgument, op, ": ", what, " has ", actual, " elements, expected ", expected);
  }
}

inline void check_at_least(const char* op, const char* what, int64_t value, int64_t minimum) {
  if (value < minimum) fail(ErrorCode::kInvalidArgument, op, ": ", what, " = ", value, " must be >= ", minimum);
}

inline void check_in_range(const char* op, const char* what, int64_t value, int64_t first, int64_t last) {
  if (value < first || value > last) {
    fail(ErrorCode::kInvalidArgument, op, ": ", what, " = ", value, " must be in [", first, ", ", last, "]");
  }
}

inline void check_divisible(const char* op, const char* what, int64_t value, int64_t divisor, const char* why) {
  if (value % divisor != 0) {
    fail(ErrorCode::kInvalidArgument, op, ": ", what, " = ", value, " must be a multiple of ", divisor, " ", why);
  }
}

inline size_t product(int64_t a, int64_t b) { return static_cast<size_t>(a) * static_cast<size_t>(b); }

// `ids` is [num_tokens, num_topk]; every id must lie in [-1, num_experts).
inline void check_topk_idx(const char* op, const std::string& what, const std::vector<int64_t>& ids,
                           int num_tokens, int num_topk, int num_experts) {
  check_size(op, what, ids.size(), product(num_tokens, num_topk));
  for (int t = 0; t < num_tokens; ++t) {
    for (int k = 0; k < num_topk; ++k) {
      const int64_t id = ids[product(t, num_topk) + k];
      if (id < -1 || id >= num_experts) {
        fail(ErrorCode::kInvalidArgument, op, ": ", what, "[", t, "][", k, "] = ", id, " is outside [-1, ",
             num_experts, ")");
      }
    }
  }
}

}  // namespace epcomm::reference::detail
