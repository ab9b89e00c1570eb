// The liveness channel (bootstrap/liveness_channel.hpp): set up through a bootstrap that cannot
// name failed ranks (as torch.distributed's cannot), it names them within seconds; when it cannot
// be set up, every rank goes on without it, alike. Ranks are threads of this process.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <functional>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "bootstrap/liveness_channel.hpp"
#include "bootstrap/socket_bootstrap.hpp"
#include "bootstrap/socket_io.hpp"
#include "common/free_tcp_port.hpp"
#include "common/rank_threads.hpp"
#include "epcomm/bootstrap.hpp"
#include "epcomm/error.hpp"

namespace epcomm {
namespace {

using namespace std::chrono_literals;
using bootstrap_detail::LivenessChannel;
using bootstrap_detail::LivenessOptions;
using bootstrap_detail::make_liveness_channel;
using test_support::expect_all_ok;
using test_support::run_threads;
using Clock = std::chrono::steady_clock;

constexpr auto kPromptly = 5s;
constexpr auto kCarrierPatience = 30s;
constexpr std::chrono::milliseconds kShortSetup = 1000ms;

// Exchanges among threads through memory, knowing nothing of failed ranks: the carrier a channel
// is set up through. `tamper(rank, call, out)` may change what a rank receives.
class ThreadGroup {
 public:
  using Tamper = std::function<void(int rank, int call, std::vector<char>& out)>;
  explicit ThreadGroup(int num_ranks, Tamper tamper = {}) : num_ranks_(num_ranks), tamper_(std::move(tamper)) {}

  class Member final : public Bootstrap {
   public:
    Member(ThreadGroup& group, int rank) : group_(group), rank_(rank) {}
    int rank() const override { return rank_; }
    int num_ranks() const override { return group_.num_ranks_; }
    void allgather(const void* in, void* out, size_t bytes) override {
      group_.allgather(rank_, calls_++, in, out, bytes);
    }
    void barrier() override {
      const char token = 0;
      std::vector<char> ignored(static_cast<size_t>(group_.num_ranks_));
      group_.allgather(rank_, -1, &token, ignored.data(), 1);
    }

   private:
    ThreadGroup& group_;
    int rank_;
    int calls_ = 0;
  };

 private:
  void allgather(int rank, int call, const void* in, void* out, size_t bytes) {
    {
      std::unique_lock<std::mutex> lock(mutex_);
      if (data_.size() < bytes * static_cast<size_t>(num_ranks_)) data_.resize(bytes * static_cast<size_t>(num_ranks_));
      std::memcpy(data_.data() + static_cast<size_t>(rank) * bytes, in, bytes);
      arrive(lock);  // everyone has written
      std::vector<char> result(data_.begin(), data_.begin() + static_cast<long>(bytes * static_cast<size_t>(num_ranks_)));
      if (tamper_ && call >= 0) tamper_(rank, call, result);
      std::memcpy(out, result.data(), result.size());
      arrive(lock);  // everyone has read: the next exchange may write
    }
  }
  // A rank that never comes (its test body ended early) fails the others instead of hanging them.
  void arrive(std::unique_lock<std::mutex>& lock) {
    const uint64_t generation = generation_;
    if (++arrived_ == num_ranks_) {
      arrived_ = 0;
      ++generation_;
      changed_.notify_all();
    } else if (!changed_.wait_for(lock, kCarrierPatience, [&] { return generation_ != generation; })) {
      throw std::runtime_error("a rank never reached the carrier's exchange");
    }
  }

  const int num_ranks_;
  Tamper tamper_;
  std::mutex mutex_;
  std::condition_variable changed_;
  int arrived_ = 0;
  uint64_t generation_ = 0;
  std::vector<char> data_;
};

bool learns_of_failure(Bootstrap& watch, int rank) { return test_support::learns_of_failure(watch, rank, kPromptly); }

LivenessOptions options_with(const std::string& address, std::chrono::milliseconds setup = 10s) {
  LivenessOptions options;
  options.address = address;
  options.setup_budget = setup;
  return options;
}

// Sets up a channel on every rank of `group` (rank 0 on loopback, a short set-up) expecting none:
// checks that every rank goes without one, for the same reason, and that the carrier still works
// afterwards; returns the reason.
std::string reason_every_rank_goes_without(ThreadGroup& group, int num_ranks) {
  std::vector<std::string> reasons(static_cast<size_t>(num_ranks));
  expect_all_ok(run_threads(num_ranks, [&](int rank) {
    ThreadGroup::Member carrier(group, rank);
    const LivenessChannel channel = make_liveness_channel(carrier, options_with("127.0.0.1", kShortSetup));
    EXPECT_EQ(channel.watch, nullptr) << "rank " << rank;
    reasons[static_cast<size_t>(rank)] = channel.why_not;
    carrier.barrier();
  }));
  for (const std::string& reason : reasons) EXPECT_EQ(reason, reasons.front());
  return reasons.front();
}

// The default (rank 0 announces its interfaces' addresses) and an address given outright.
class LivenessAddresses : public ::testing::TestWithParam<std::string> {};

TEST_P(LivenessAddresses, APeerThatLeavesIsNamedOnEveryOtherRank) {
  constexpr int kRanks = 4;
  constexpr int kLeaver = 2;
  ThreadGroup group(kRanks);
  std::atomic<int> checked{0};
  expect_all_ok(run_threads(kRanks, [&](int rank) {
    ThreadGroup::Member carrier(group, rank);
    LivenessChannel channel = make_liveness_channel(carrier, options_with(GetParam()));
    ASSERT_NE(channel.watch, nullptr) << "rank " << rank << ": " << channel.why_not;
    EXPECT_TRUE(channel.watch->failed_ranks().empty()) << "rank " << rank;
    carrier.barrier();  // every rank has looked once at a healthy channel
    if (rank == kLeaver) {
      channel.watch.reset();  // as its process's end would close it
      return;
    }
    EXPECT_TRUE(learns_of_failure(*channel.watch, kLeaver)) << "rank " << rank << " never learned that rank 2 left";
    EXPECT_EQ(channel.watch->failed_ranks(), std::vector<int>{kLeaver}) << "rank " << rank;
    ++checked;  // nobody else leaves before every survivor has looked (or a while has passed)
    const auto until = Clock::now() + kPromptly;
    while (checked.load() < kRanks - 1 && Clock::now() < until) std::this_thread::sleep_for(1ms);
  }));
}

INSTANTIATE_TEST_SUITE_P(Liveness, LivenessAddresses, ::testing::Values("", "127.0.0.1"),
                         [](const ::testing::TestParamInfo<std::string>& param) {
                           return param.param.empty() ? "Interfaces" : "Loopback";
                         });

TEST(Liveness, RankZeroLeavingIsNamedOnEveryPeer) {
  constexpr int kRanks = 3;
  ThreadGroup group(kRanks);
  expect_all_ok(run_threads(kRanks, [&](int rank) {
    ThreadGroup::Member carrier(group, rank);
    LivenessChannel channel = make_liveness_channel(carrier, options_with("127.0.0.1"));
    ASSERT_NE(channel.watch, nullptr) << channel.why_not;
    carrier.barrier();
    if (rank == 0) return;
    EXPECT_TRUE(learns_of_failure(*channel.watch, 0)) << "rank " << rank << " never learned that rank 0 left";
  }));
}

// "off" on rank 0 (the only rank whose setting counts): no channel anywhere, and no complaint.
TEST(Liveness, OffOnRankZeroMeansNoChannelOnAnyRank) {
  constexpr int kRanks = 3;
  ThreadGroup group(kRanks);
  expect_all_ok(run_threads(kRanks, [&](int rank) {
    ThreadGroup::Member carrier(group, rank);
    const LivenessChannel channel = make_liveness_channel(carrier, options_with(rank == 0 ? "off" : ""));
    EXPECT_EQ(channel.watch, nullptr) << "rank " << rank;
    EXPECT_EQ(channel.why_not, "") << "rank " << rank;
  }));
}

// An address rank 0 cannot listen on (192.0.2.1 is reserved for documentation, on no host): every
// rank is told why, and the carrier still works.
TEST(Liveness, AnAddressRankZeroCannotListenOnLeavesEveryRankWithoutAChannelAndTheReason) {
  constexpr int kRanks = 3;
  ThreadGroup group(kRanks);
  expect_all_ok(run_threads(kRanks, [&](int rank) {
    ThreadGroup::Member carrier(group, rank);
    const LivenessChannel channel = make_liveness_channel(carrier, options_with("192.0.2.1"));
    EXPECT_EQ(channel.watch, nullptr) << "rank " << rank;
    EXPECT_NE(channel.why_not.find("rank 0 cannot listen"), std::string::npos) << "rank " << rank << ": " << channel.why_not;
    carrier.barrier();
  }));
}

// A peer that cannot reach rank 0 (here it hears a wrong port) costs every rank the channel, with
// the same reason naming it, within the set-up budget, and never the job.
TEST(Liveness, APeerThatCannotConnectCostsEveryRankTheChannelButNotTheJob) {
  constexpr int kRanks = 3;
  constexpr int kLost = 2;
  const std::string closed_port = std::to_string(test_support::free_tcp_port());
  ThreadGroup group(kRanks, [&](int rank, int call, std::vector<char>& out) {
    if (rank != kLost || call != 0) return;
    // Rank 0's announcement: version, secret, port, addresses, one per line. Replace the port.
    std::string text(out.data(), strnlen(out.data(), 1024));
    const size_t port_start = text.find('\n', text.find('\n') + 1) + 1;
    const size_t port_end = text.find('\n', port_start);
    text.replace(port_start, port_end - port_start, closed_port);
    std::fill(out.begin(), out.begin() + 1024, '\0');
    std::memcpy(out.data(), text.data(), text.size());
  });
  const auto start = Clock::now();
  const std::string reason = reason_every_rank_goes_without(group, kRanks);
  EXPECT_LT(Clock::now() - start, kShortSetup + kPromptly);
  EXPECT_NE(reason.find("rank 2"), std::string::npos) << reason;
  std::printf("the reason every rank was given: %s\n", reason.c_str());
}

// A rank that cannot read rank 0's announcement (another epcomm version) costs every rank the
// channel, with the same reason, and never the job.
TEST(Liveness, AnAnnouncementARankCannotReadCostsEveryRankTheChannel) {
  constexpr int kRanks = 3;
  ThreadGroup group(kRanks, [](int rank, int call, std::vector<char>& out) {
    if (rank == 1 && call == 0) std::memcpy(out.data(), "epcomm-liveness-9", 17);  // the version line
  });
  EXPECT_FALSE(reason_every_rank_goes_without(group, kRanks).empty());
}

// With several addresses of rank 0, a peer passes over one where nobody listens and one where
// another job's rank 0 does (it cannot prove this job's secret), and joins at the next; nothing
// it met on the way counts as a failed rank.
TEST(Liveness, APeerTriesRankZerosAddressesInTurn) {
  using bootstrap_detail::Listener;
  using bootstrap_detail::parse_address;
  auto listener = std::make_unique<Listener>(bootstrap_detail::any_port_of("127.0.0.1"), 16, bootstrap_detail::Deadline(std::chrono::seconds(10)));
  auto stranger_listener = std::make_unique<Listener>(bootstrap_detail::any_port_of("127.0.0.1"), 16, bootstrap_detail::Deadline(std::chrono::seconds(10)));
  const std::string good = "127.0.0.1:" + listener->port();
  const std::string stranger = "127.0.0.1:" + stranger_listener->port();  // listening before anyone tries it
  const std::string nobody = "127.0.0.1:" + std::to_string(test_support::free_tcp_port());
  std::thread other_job([&] {  // another job's rank 0, waiting for a rank 1 that never comes
    bootstrap_detail::Rendezvous rendezvous;
    rendezvous.addresses.push_back(parse_address(stranger));
    rendezvous.listener = std::move(stranger_listener);
    EXPECT_THROW(bootstrap_detail::make_socket_bootstrap(std::move(rendezvous), 0, 2, 1500ms, "another job's secret"),
                 Error);
  });
  expect_all_ok(run_threads(2, [&](int rank) {
    bootstrap_detail::Rendezvous rendezvous;
    for (const std::string& address : {nobody, stranger, good}) rendezvous.addresses.push_back(parse_address(address));
    if (rank == 0) rendezvous.listener = std::move(listener);
    auto bootstrap = bootstrap_detail::make_socket_bootstrap(std::move(rendezvous), rank, 2, 10s, "this job's secret");
    EXPECT_TRUE(bootstrap->failed_ranks().empty()) << "rank " << rank << " counts a rank failed";
    bootstrap->barrier();
  }));
  other_job.join();
}

// A carrier across processes that, like torch.distributed's, says nothing about failed ranks: the
// socket rendezvous with its own failure reports hidden.
class BlindCarrier final : public Bootstrap {
 public:
  explicit BlindCarrier(std::unique_ptr<Bootstrap> inner) : inner_(std::move(inner)) {}
  int rank() const override { return inner_->rank(); }
  int num_ranks() const override { return inner_->num_ranks(); }
  void allgather(const void* in, void* out, size_t bytes) override { inner_->allgather(in, out, bytes); }
  void barrier() override { inner_->barrier(); }

 private:
  std::unique_ptr<Bootstrap> inner_;
};

// A rank whose process is killed (SIGKILL: nothing of it runs any more; the kernel closes its
// sockets) is named by the channel on every other rank within seconds.
TEST(Liveness, ARankWhoseProcessIsKilledIsNamedOnTheOthers) {
  constexpr int kRanks = 3;
  constexpr int kVictim = 2;
  constexpr unsigned kChildLifetimeSeconds = 60;  // the child never outlives a test that went wrong
  const std::string address = "127.0.0.1:" + std::to_string(test_support::free_tcp_port());
  SocketBootstrapOptions options;
  options.timeout = 20s;
  options.job_secret = "liveness kill test";
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {  // rank 2: joins, then waits to be killed
    alarm(kChildLifetimeSeconds);
    try {
      BlindCarrier carrier(make_socket_bootstrap(address, kVictim, kRanks, options));
      const LivenessChannel channel = make_liveness_channel(carrier, options_with("127.0.0.1"));
      carrier.barrier();
      while (true) pause();
    } catch (...) {
      _exit(1);
    }
  }
  std::atomic<int> ready{0};
  std::thread killer([&] {
    while (ready.load() < kRanks - 1) std::this_thread::sleep_for(1ms);
    kill(child, SIGKILL);
  });
  expect_all_ok(run_threads(kRanks - 1, [&](int rank) {
    BlindCarrier carrier(make_socket_bootstrap(address, rank, kRanks, options));
    const LivenessChannel channel = make_liveness_channel(carrier, options_with("127.0.0.1"));
    carrier.barrier();
    ++ready;
    ASSERT_NE(channel.watch, nullptr) << channel.why_not;
    EXPECT_TRUE(learns_of_failure(*channel.watch, kVictim)) << "rank " << rank << " never learned that rank 2 died";
  }));
  if (ready.load() < kRanks - 1) ready = kRanks;  // a rank that failed early must not leave the killer waiting
  killer.join();
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
}

}  // namespace
}  // namespace epcomm
