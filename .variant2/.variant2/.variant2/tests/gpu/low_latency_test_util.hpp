// Helpers of the low-latency GPU test: row-wise comparisons that skip the rows a dispatch leaves
// unspecified, and error expectations with several message fragments.
#pragma once

#include <cstdint>
#include <cstring>
#include <functional>
#include <initializer_list>
#include <string>
#include <vector>

#include "common/rank_harness.hpp"
#include "epcomm/error.hpp"
#include "gpu/normal_test_util.hpp"

namespace epcomm::testing {

// Rows `row` of `got` and `want` (each `row_length` elements) are equal bit for bit wherever
// row_source[row] >= 0; other rows are unspecified and not compared. Rows are grouped by expert
// (`rows_per_expert` each) to name the first difference as (expert, slot, column).
template <typename T>
bool expect_used_rows_equal(RankHarness& harness, const std::string& what, const std::vector<T>& got,
                            const std::vector<T>& want, size_t row_length, const std::vector<int32_t>& row_source,
                            size_t rows_per_expert) {
  const size_t expected = row_source.size() * row_length;
  if (got.size() != expected || want.size() != expected) {
    return harness.check(false, what + ": got " + std::to_string(got.size()) + " elements, expected " +
                                    std::to_string(expected) + " (reference has " + std::to_string(want.size()) + ")");
  }
  size_t wrong_rows = 0, used_rows = 0, first = 0;
  for (size_t row = 0; row < row_source.size(); ++row) {
    if (row_source[row] < 0) continue;
    ++used_rows;
    const size_t begin = row * row_length;
    if (std::memcmp(&got[begin], &want[begin], row_length * sizeof(T)) == 0) continue;
    if (wrong_rows++ == 0) {
      first = begin;
      while (std::memcmp(&got[first], &want[first], sizeof(T)) == 0) ++first;
    }
  }
  if (wrong_rows == 0) return harness.check(true, what);
  const size_t row = first / row_length;
  return harness.check(false, what + ": " + std::to_string(wrong_rows) + " of " + std::to_string(used_rows) +
                                  " received rows differ; first at expert " + std::to_string(row / rows_per_expert) +
                                  ", slot " + std::to_string(row % rows_per_expert) + ", column " +
                                  std::to_string(first % row_length) + ": got " + show(got[first]) + ", expected " +
                                  show(want[first]));
}

// Runs `body` expecting an epcomm::Error with `code` whose message contains every fragment.
inline void expect_error_with(RankHarness& harness, ErrorCode code, std::initializer_list<std::string> fragments,
                              const std::function<void()>& body, const std::string& what) {
  std::string wanted;
  for (const std::string& fragment : fragments) wanted += (wanted.empty() ? "'" : ", '") + fragment + "'";
  try {
    body();
    harness.check(false, what + ": expected an error containing " + wanted + ", got none");
  } catch (const Error& error) {
    const std::string message = error.what();
    bool ok = error.code() == code;
    for (const std::string& fragment : fragments) ok = ok && message.find(fragment) != std::string::npos;
    harness.check(ok, what + ": expected " + error_code_name(code) + " containing " + wanted + ", got: " + message);
  }
}

}  // namespace epcomm::testing
