// A rank that never arrives must not hang the others: their barrier times out and the error says
// which rank waited for which peer and for what.
#include <chrono>

#include "epcomm/buffer.hpp"
#include "gpu/gpu_cases.hpp"

namespace epcomm::testing {

void run_timeout_case(RankHarness& harness) {
  if (harness.num_ranks() < 2) {
    harness.check(true, "a single rank has no peer to wait for");
    return;
  }
  constexpr int kAbsentRank = 0;
  BufferOptions options;
  options.wait_timeout = std::chrono::milliseconds(500);
  Buffer buffer(harness.bootstrap(), options);

  if (harness.rank() != kAbsentRank) {
    const auto start = std::chrono::steady_clock::now();
    harness.expect_error(ErrorCode::kTimeout, "for rank " + std::to_string(kAbsentRank) + "'s barrier signal",
                         [&] {
                           buffer.barrier(nullptr);
                           buffer.synchronize(nullptr);
                         },
                         "barrier without rank 0");
    const auto waited = std::chrono::steady_clock::now() - start;
    harness.check(waited < std::chrono::seconds(30), "the timed-out barrier returned within 30 s");
  }
  // Every rank reaches the host-side teardown; the device barrier state is abandoned with the Buffer.
  harness.bootstrap()->barrier();
}

}  // namespace epcomm::testing
