// Ranks as threads of one test process, for bootstrap tests: run a body per rank, see how each
// ended, and check the outcomes.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <exception>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "epcomm/bootstrap.hpp"
#include "epcomm/error.hpp"

namespace epcomm::test_support {

struct Outcome {
  bool ok = true;
  ErrorCode code = ErrorCode::kInternal;
  std::string message;
};

// Runs body(index) on one thread per index and returns how each ended.
inline std::vector<Outcome> run_threads(int count, const std::function<void(int)>& body) {
  std::vector<Outcome> outcomes(static_cast<size_t>(count));
  std::vector<std::thread> threads;
  for (int index = 0; index < count; ++index) {
    threads.emplace_back([&outcomes, &body, index] {
      Outcome& outcome = outcomes[static_cast<size_t>(index)];
      try {
        body(index);
      } catch (const Error& error) {
        outcome = {false, error.code(), error.what()};
      } catch (const std::exception& error) {
        outcome = {false, ErrorCode::kInternal, std::string("unexpected exception: ") + error.what()};
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  return outcomes;
}

inline void expect_all_ok(const std::vector<Outcome>& outcomes) {
  for (size_t rank = 0; rank < outcomes.size(); ++rank) {
    EXPECT_TRUE(outcomes[rank].ok) << "rank " << rank << ": " << outcomes[rank].message;
  }
}

// Polls bootstrap.failed_ranks() until it names `rank` or `budget` runs out; whether it did.
inline bool learns_of_failure(Bootstrap& bootstrap, int rank, std::chrono::milliseconds budget) {
  const auto until = std::chrono::steady_clock::now() + budget;
  while (std::chrono::steady_clock::now() < until) {
    const std::vector<int> failed = bootstrap.failed_ranks();
    if (std::find(failed.begin(), failed.end(), rank) != failed.end()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return false;
}

}  // namespace epcomm::test_support
