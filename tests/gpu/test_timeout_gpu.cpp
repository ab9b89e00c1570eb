// A rank that never arrives must not hang the others: their barrier times out and the error says
// which rank waited for which peer and for what.
#include <unistd.h>

#include <chrono>
#include <cstdio>

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

namespace epcomm::testing {

// A rank whose process dies while the others wait on it: the host watchdog notices, every wait
// gives up, and the call fails with an error naming the dead rank within a few seconds, though
// the wait bound is a minute.
void run_peer_death_case(RankHarness& harness) {
  const int ranks = harness.num_ranks();
  if (ranks < 2) {
    harness.check(true, "a single rank has no peer to lose");
    return;
  }
  const int dying = ranks - 1;
  BufferOptions options;
  options.wait_timeout = std::chrono::seconds(60);
  Buffer buffer(harness.bootstrap(), options);
  buffer.barrier(nullptr);
  buffer.synchronize(nullptr);
  harness.bootstrap()->barrier();  // every rank holds a working Buffer
  if (harness.rank() == dying) {
    std::fflush(stdout);
    _exit(0);  // as a killed process: no destroy(), no goodbye
  }
  const auto start = std::chrono::steady_clock::now();
  harness.expect_error(ErrorCode::kPeerFailed, "the process of rank " + std::to_string(dying),
                       [&] {
                         buffer.barrier(nullptr);
                         buffer.synchronize(nullptr);
                       },
                       "a barrier with a dead rank");
  const auto waited = std::chrono::steady_clock::now() - start;
  harness.check(waited < std::chrono::seconds(5),
                "the dead rank was reported within 5 s (took " +
                    std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(waited).count()) + " ms)");
  harness.expect_error(ErrorCode::kPeerFailed, "rank " + std::to_string(dying), [&] { buffer.barrier(nullptr); },
                       "every later call fails too");
  // destroy() cannot meet the dead rank: it releases what is local, without waiting on the bootstrap.
  const auto destroy_start = std::chrono::steady_clock::now();
  buffer.destroy();
  const auto destroy_took = std::chrono::steady_clock::now() - destroy_start;
  harness.check(!buffer.is_available() && destroy_took < std::chrono::seconds(5),
                "destroy() with a dead rank is local (took " +
                    std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(destroy_took).count()) + " ms)");
}

}  // namespace epcomm::testing
