#include "transport/nvlink_reach.hpp"

#include <condition_variable>
#include <cstdio>
#include <memory>
#include <mutex>
#include <string>
#include <system_error>
#include <thread>
#include <utility>

#include "common/nvml.hpp"
#include "epcomm/error.hpp"

namespace epcomm::detail {
namespace {

// Loaded on first use and kept: nvmlInit can take up to about a second on a large host, and a
// process creating several Buffers asks the same question each time. Never destroyed: a probe's
// thread may still be inside an NVML call at exit, and nvmlShutdown and dlclose under it would
// hang or crash the exit.
const Nvml& process_nvml() {
  static const Nvml* const nvml = new Nvml();
  return *nvml;
}

void warn_of_no_answers(int rank, const RankCensus& mine, const std::string& why) {
  std::fprintf(stderr,
               "epcomm: warning: rank %d: %s whether NVLink joins GPU %s to the other GPUs of its host; the other "
               "ranks' answers decide, and pairs none could tell about count as joined\n",
               rank, why.c_str(), mine.pci_bus_id);
}

}  // namespace

bool nvlink_worth_probing(const std::vector<RankCensus>& census) {
  for (size_t a = 0; a < census.size(); ++a) {
    for (size_t b = a + 1; b < census.size(); ++b) {
      if (same_host(census[a], census[b]) && !same_gpu(census[a], census[b])) return true;
    }
  }
  return false;
}

std::vector<NvlinkState> probe_nvlink_row(const std::vector<RankCensus>& census, int rank) {
  static std::atomic<bool> nvml_stalled{false};
  const NvlinkQuestion nvml = [](const char* bus_id, const char* other_bus_id) {
    return process_nvml().nvlink_between(bus_id, other_bus_id);
  };
  return probe_nvlink_row(census, rank, nvml, kNvmlPatience, nvml_stalled);
}

std::vector<NvlinkState> probe_nvlink_row(const std::vector<RankCensus>& census, int rank, const NvlinkQuestion& ask,
                                          std::chrono::milliseconds patience, std::atomic<bool>& stalled) {
  // What the rank knows without asking: its own GPU, and the hosts. The rest stays unknown unless
  // the answers come in time.
  std::vector<NvlinkState> known(census.size(), NvlinkState::kApart);
  std::vector<size_t> to_ask;
  for (size_t peer = 0; peer < census.size(); ++peer) {
    if (same_gpu(census[rank], census[peer])) {
      known[peer] = NvlinkState::kJoined;
    } else if (same_host(census[rank], census[peer])) {
      known[peer] = NvlinkState::kUnknown;
      to_ask.push_back(peer);
    }
  }
  if (to_ask.empty()) return known;
  if (stalled.load()) {
    warn_of_no_answers(rank, census[rank], "an earlier question to NVML has not returned, so it cannot say");
    return known;
  }

  // Shared with the asking thread, which may outlive this call.
  struct Answers {
    std::mutex mutex;
    std::condition_variable done;
    bool finished = false;
    std::vector<NvlinkState> row;
  };
  const auto answers = std::make_shared<Answers>();
  const auto ask_all = [answers, row = known, census, rank, ask, to_ask, &stalled]() mutable {
    try {
      for (const size_t peer : to_ask) {
        const std::optional<bool> joined = ask(census[rank].pci_bus_id, census[peer].pci_bus_id);
        row[peer] = !joined ? NvlinkState::kUnknown : *joined ? NvlinkState::kJoined : NvlinkState::kApart;
      }
    } catch (...) {
      // A question that fails tells nothing: what is left stays unknown.
    }
    const std::lock_guard<std::mutex> lock(answers->mutex);
    answers->row = std::move(row);
    answers->finished = true;
    // Answered, late or not: later probes may ask again. Under the lock, so that a caller that gave
    // up (and set the flag, holding the lock) is always cleared after, never before.
    stalled.store(false);
    answers->done.notify_all();
  };
  try {
    std::thread(ask_all).detach();
  } catch (const std::system_error& error) {
    warn_of_no_answers(rank, census[rank], std::string("a thread to ask NVML could not start (") + error.what() +
                                               "), so it cannot say");
    return known;
  }
  std::unique_lock<std::mutex> lock(answers->mutex);
  if (answers->done.wait_for(lock, patience, [&] { return answers->finished; })) return answers->row;
  stalled.store(true);  // holding the lock: the thread, when it returns, clears it after this
  warn_of_no_answers(rank, census[rank],
                     join_message("NVML did not say within ", patience.count(), " ms (a GPU in a bad state?)"));
  return known;
}

NvlinkMatrix exchange_nvlink_rows(Bootstrap& bootstrap, const std::vector<NvlinkState>& mine) {
  const size_t num_ranks = static_cast<size_t>(bootstrap.num_ranks());
  if (mine.size() != num_ranks) {
    fail(ErrorCode::kInternal, "exchange_nvlink_rows: a row of ", mine.size(), " states among ", num_ranks, " ranks");
  }
  std::vector<NvlinkState> all(num_ranks * num_ranks);
  bootstrap.allgather(mine.data(), all.data(), num_ranks * sizeof(NvlinkState));
  NvlinkMatrix matrix(num_ranks);
  for (size_t rank = 0; rank < num_ranks; ++rank) {
    matrix[rank].assign(all.begin() + rank * num_ranks, all.begin() + (rank + 1) * num_ranks);
    // Bytes from another process: anything but the two answers reads as unknown.
    for (NvlinkState& state : matrix[rank]) {
      if (state != NvlinkState::kJoined && state != NvlinkState::kApart) state = NvlinkState::kUnknown;
    }
  }
  return matrix;
}

}  // namespace epcomm::detail
