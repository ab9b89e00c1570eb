// The socket bootstrap, with every rank a thread of this process: exchanges across rank counts,
// sizes and transports, and the errors a broken job must produce (promptly, naming the culprit).
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <future>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "common/free_tcp_port.hpp"
#include "common/rank_threads.hpp"
#include "common/temp_dir.hpp"
#include "bootstrap/socket_io.hpp"
#include "epcomm/bootstrap.hpp"
#include "epcomm/error.hpp"

namespace epcomm {
namespace {

using namespace std::chrono_literals;
using test_support::expect_all_ok;
using test_support::free_tcp_port;
using test_support::Outcome;
using test_support::run_threads;
using test_support::TempDir;
using Clock = std::chrono::steady_clock;

// Healthy exchanges get a timeout no loaded machine reaches; failures must arrive well before it.
constexpr std::chrono::milliseconds kGenerousTimeout = 30s;
constexpr std::chrono::milliseconds kShortTimeout = 500ms;
constexpr auto kPromptly = 5s;
constexpr size_t kMiB = size_t{1} << 20;

void expect_bootstrap_error(const Outcome& outcome, const std::string& expected_text) {
  EXPECT_FALSE(outcome.ok);
  EXPECT_EQ(outcome.code, ErrorCode::kBootstrapError) << outcome.message;
  EXPECT_NE(outcome.message.find(expected_text), std::string::npos)
      << "expected \"" << expected_text << "\" in: " << outcome.message;
}

// Distinct bytes for every (rank, round, position), so a misplaced slot cannot go unnoticed.
std::vector<unsigned char> pattern(int rank, size_t round, size_t bytes) {
  std::vector<unsigned char> data(bytes);
  for (size_t i = 0; i < bytes; ++i) data[i] = static_cast<unsigned char>(rank * 131 + round * 17 + i * 7 + i / 251);
  return data;
}

// Every rank contributes pattern(rank, round) for each size, with barriers in between.
void exchange_rounds(Bootstrap& bootstrap, const std::vector<size_t>& sizes) {
  const int rank = bootstrap.rank();
  const int num_ranks = bootstrap.num_ranks();
  for (size_t round = 0; round < sizes.size(); ++round) {
    const size_t bytes = sizes[round];
    const std::vector<unsigned char> in = pattern(rank, round, bytes);
    std::vector<unsigned char> out(bytes * static_cast<size_t>(num_ranks), 0xEE);
    bootstrap.allgather(in.data(), out.data(), bytes);
    for (int peer = 0; peer < num_ranks; ++peer) {
      const std::vector<unsigned char> expected = pattern(peer, round, bytes);
      EXPECT_TRUE(std::equal(expected.begin(), expected.end(), out.begin() + static_cast<long>(peer * bytes)))
          << "rank " << rank << ", round " << round << " (" << bytes << " bytes): the slot of rank " << peer
          << " is wrong";
    }
    bootstrap.barrier();
  }
}

std::string unix_address(const TempDir& dir) { return "unix:" + dir.file("boot.sock"); }

class BootstrapRanks : public ::testing::TestWithParam<int> {};

TEST_P(BootstrapRanks, AllgatherPlacesEveryRanksBytesInRankOrder) {
  const int num_ranks = GetParam();
  const TempDir dir;
  const std::vector<size_t> sizes = {0, 1, 13, 4096, kMiB, 8, 0, 3};
  expect_all_ok(run_threads(num_ranks, [&](int rank) {
    auto bootstrap = make_socket_bootstrap(unix_address(dir), rank, num_ranks, kGenerousTimeout);
    EXPECT_EQ(bootstrap->rank(), rank);
    EXPECT_EQ(bootstrap->num_ranks(), num_ranks);
    exchange_rounds(*bootstrap, sizes);
  }));
}

INSTANTIATE_TEST_SUITE_P(RankCounts, BootstrapRanks, ::testing::Values(1, 2, 4, 8),
                         [](const ::testing::TestParamInfo<int>& param_info) {
                           return std::to_string(param_info.param) + "Ranks";
                         });

TEST(Bootstrap, SingleRankUsesNoSocket) {
  auto bootstrap = make_socket_bootstrap("", 0, 1, kShortTimeout);
  exchange_rounds(*bootstrap, {0, 5, kMiB});
}

TEST(Bootstrap, AllgatherInPlaceFromOwnSlot) {
  constexpr int kRanks = 3;
  constexpr size_t kBytes = 100;
  const TempDir dir;
  expect_all_ok(run_threads(kRanks, [&](int rank) {
    auto bootstrap = make_socket_bootstrap(unix_address(dir), rank, kRanks, kGenerousTimeout);
    std::vector<unsigned char> buffer(kBytes * kRanks, 0);
    const std::vector<unsigned char> mine = pattern(rank, 0, kBytes);
    std::copy(mine.begin(), mine.end(), buffer.begin() + rank * static_cast<long>(kBytes));
    bootstrap->allgather(buffer.data() + rank * kBytes, buffer.data(), kBytes);
    for (int peer = 0; peer < kRanks; ++peer) {
      const std::vector<unsigned char> expected = pattern(peer, 0, kBytes);
      EXPECT_TRUE(std::equal(expected.begin(), expected.end(), buffer.begin() + peer * static_cast<long>(kBytes)))
          << "rank " << rank << ": slot of rank " << peer;
    }
  }));
}

// A job of `num_ranks` threads meeting over TCP at `host` on a free port, exchanging `sizes`.
void expect_tcp_job_exchanges(const std::string& host, int num_ranks, const std::vector<size_t>& sizes) {
  const int port = free_tcp_port();
  ASSERT_GT(port, 0) << "could not find a free TCP port on 127.0.0.1";
  const std::string address = host + ":" + std::to_string(port);
  expect_all_ok(run_threads(num_ranks, [&](int rank) {
    auto bootstrap = make_socket_bootstrap(address, rank, num_ranks, kGenerousTimeout);
    exchange_rounds(*bootstrap, sizes);
  }));
}

TEST(Bootstrap, TcpLoopback) { expect_tcp_job_exchanges("127.0.0.1", 3, {4, 0, 64 * 1024}); }

// A host name goes through the name service (on a thread of its own, so that the job's deadline
// bounds the lookup); a numeric address does not.
TEST(Bootstrap, TcpByHostName) { expect_tcp_job_exchanges("localhost", 2, {4}); }

TEST(BootstrapErrors, AnUnknownHostNameIsNamedWithinTheTimeout) {
  const auto start = std::chrono::steady_clock::now();
  const auto outcomes = run_threads(1, [&](int) { make_socket_bootstrap("no-such-host.invalid:29500", 1, 2, 300ms); });
  expect_bootstrap_error(outcomes[0], "rank 1 waited 300 ms to connect to rank 0 at no-such-host.invalid:29500");
  expect_bootstrap_error(outcomes[0], "cannot resolve 'no-such-host.invalid'");
  // The lookup, however slow the name service, ends with the timeout (and some slack for a slow machine).
  EXPECT_LT(std::chrono::steady_clock::now() - start, 3s);
}

TEST(Bootstrap, RemovesSocketFileOnceEveryRankJoined) {
  const TempDir dir;
  const std::string path = dir.file("boot.sock");
  expect_all_ok(run_threads(2, [&](int rank) {
    auto bootstrap = make_socket_bootstrap("unix:" + path, rank, 2, kGenerousTimeout);
    EXPECT_FALSE(std::filesystem::exists(path));
    bootstrap->barrier();
  }));
}

TEST(Bootstrap, ReplacesStaleSocketFile) {
  const TempDir dir;
  const std::string path = dir.file("boot.sock");
  {  // what a crashed rank 0 leaves behind: a socket file nobody listens on
    const int fd = socket(AF_UNIX, SOCK_STREAM, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::strncpy(addr.sun_path, path.c_str(), sizeof(addr.sun_path) - 1);
    ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
    close(fd);
  }
  expect_all_ok(
      run_threads(2, [&](int rank) { make_socket_bootstrap("unix:" + path, rank, 2, kGenerousTimeout)->barrier(); }));
}

TEST(Bootstrap, RefusesToDeleteAFileThatIsNotASocket) {
  const TempDir dir;
  const std::string path = dir.file("boot.sock");
  std::ofstream(path) << "precious";
  const auto outcomes = run_threads(1, [&](int) { make_socket_bootstrap("unix:" + path, 0, 2, kShortTimeout); });
  expect_bootstrap_error(outcomes[0], path + " exists and is not a socket");
  EXPECT_TRUE(std::filesystem::exists(path));
}

TEST(BootstrapErrors, MissingRankIsNamedByRankZeroAndRelayedToOthers) {
  const TempDir dir;
  const std::string address = unix_address(dir);
  const auto start = Clock::now();
  // Ranks 0 and 1 of 3 come; rank 2 never does.
  const auto outcomes = run_threads(
      2, [&](int rank) { make_socket_bootstrap(address, rank, 3, rank == 0 ? kShortTimeout : kGenerousTimeout); });
  EXPECT_LT(Clock::now() - start, kPromptly);
  expect_bootstrap_error(outcomes[0],
                         "rank 0 waited 500 ms for rank 2 to connect to " + address + " (1 of 2 peers connected");
  expect_bootstrap_error(outcomes[1], "rank 1 was stopped by rank 0");
  expect_bootstrap_error(outcomes[1], "for rank 2 to connect");
}

TEST(BootstrapErrors, PeerGivesUpWhenRankZeroNeverListens) {
  const TempDir dir;
  const std::string address = unix_address(dir);
  const auto outcomes = run_threads(1, [&](int) { make_socket_bootstrap(address, 1, 2, 300ms); });
  expect_bootstrap_error(outcomes[0], "rank 1 waited 300 ms to connect to rank 0 at " + address);
}

TEST(BootstrapErrors, RankThatNeverEntersAllgatherIsNamed) {
  const TempDir dir;
  std::promise<void> rank0_finished;
  const std::shared_future<void> released = rank0_finished.get_future().share();
  const auto outcomes = run_threads(2, [&](int rank) {
    auto bootstrap = make_socket_bootstrap(unix_address(dir), rank, 2, rank == 0 ? kShortTimeout : kGenerousTimeout);
    if (rank == 1) {  // joined, but never calls allgather: stays until rank 0 is done waiting
      released.wait();
      return;
    }
    struct Release {
      std::promise<void>& promise;
      ~Release() { promise.set_value(); }
    } release{rank0_finished};
    std::vector<unsigned char> out(2);
    const unsigned char in = 1;
    bootstrap->allgather(&in, out.data(), 1);
  });
  expect_bootstrap_error(outcomes[0], "rank 0 waited 500 ms for rank 1 to enter allgather");
  EXPECT_TRUE(outcomes[1].ok) << outcomes[1].message;
}

TEST(BootstrapErrors, PeerThatExitsIsNamedAndLaterCallsFailFast) {
  const TempDir dir;
  const auto start = Clock::now();
  const auto outcomes = run_threads(3, [&](int rank) {
    auto bootstrap = make_socket_bootstrap(unix_address(dir), rank, 3, kGenerousTimeout);
    if (rank == 2) return;  // leaves the job right after joining it
    std::vector<unsigned char> out(3);
    const unsigned char in = 1;
    try {
      bootstrap->allgather(&in, out.data(), 1);
    } catch (const Error&) {
      bootstrap->barrier();  // must fail at once, naming the earlier failure
    }
  });
  EXPECT_LT(Clock::now() - start, kPromptly);
  expect_bootstrap_error(outcomes[0], "rank 0 lost its connection to rank 2");
  expect_bootstrap_error(outcomes[0], "cannot use the bootstrap after an earlier failure");
  expect_bootstrap_error(outcomes[1], "rank 2 closed the connection");
  EXPECT_TRUE(outcomes[2].ok) << outcomes[2].message;
}

// ---- failed_ranks(): ranks whose connection closed, for the Buffer's watchdog ----

bool learns_of_failure(Bootstrap& bootstrap, int rank) {
  return test_support::learns_of_failure(bootstrap, rank, kPromptly);
}

// Fulfils a promise when it goes out of scope (or earlier, by set()), however the scope ends, so
// that a thread waiting for it never waits forever. Declared before what must be gone by then.
class SetOnExit {
 public:
  explicit SetOnExit(std::promise<void>* promise) : promise_(promise) {}
  ~SetOnExit() { set(); }
  SetOnExit(const SetOnExit&) = delete;
  SetOnExit& operator=(const SetOnExit&) = delete;
  void set() {
    if (promise_ != nullptr) promise_->set_value();
    promise_ = nullptr;
  }

 private:
  std::promise<void>* promise_;
};

class FailedRanks : public ::testing::TestWithParam<bool> {  // true: TCP, false: unix socket
 protected:
  std::string address() { return GetParam() ? "127.0.0.1:" + std::to_string(free_tcp_port()) : unix_address(dir_); }
  TempDir dir_;
};

// A healthy job: failed_ranks() polled from other threads all along names nobody and leaves every
// exchange intact (it reads nothing an exchange needs).
TEST_P(FailedRanks, NamesNobodyInAHealthyJobAndDoesNotDisturbExchanges) {
  const std::string where = address();
  const auto outcomes = run_threads(4, [&](int rank) {
    auto bootstrap = make_socket_bootstrap(where, rank, 4, kGenerousTimeout);
    std::atomic<bool> done{false};
    std::vector<int> seen;
    std::thread watcher([&] {
      while (!done) {
        for (const int failed : bootstrap->failed_ranks()) seen.push_back(failed);
        std::this_thread::sleep_for(1ms);
      }
    });
    const auto stop_watching = [&] {
      done = true;
      if (watcher.joinable()) watcher.join();
    };
    try {
      exchange_rounds(*bootstrap, {0, 1, 7, 4096, 1, 64 * 1024, 3});
    } catch (...) {
      stop_watching();
      throw;
    }
    stop_watching();
    bootstrap->barrier();  // nobody closes a connection before every rank has stopped looking
    EXPECT_TRUE(seen.empty()) << "rank " << rank << " saw a failure, the first: rank " << seen.front();
  });
  expect_all_ok(outcomes);
}

// A rank whose process ends between exchanges (here: its bootstrap goes away) is named by rank 0,
// which watches its connection, and by the other peers, whom rank 0 tells.
TEST_P(FailedRanks, APeerThatLeavesIsNamedOnEveryRankWithinSeconds) {
  const std::string where = address();
  std::promise<void> left;
  std::shared_future<void> gone = left.get_future().share();
  std::atomic<int> checked{0};
  const auto start = Clock::now();
  const auto outcomes = run_threads(3, [&](int rank) {
    // Rank 2 leaves in every case, so that the others never wait for it forever.
    SetOnExit leaving(rank == 2 ? &left : nullptr);
    auto bootstrap = make_socket_bootstrap(where, rank, 3, kGenerousTimeout);
    bootstrap->barrier();
    if (rank == 2) return;  // the bootstrap goes with the thread's scope, before `leaving`
    ASSERT_EQ(gone.wait_for(kGenerousTimeout), std::future_status::ready);
    EXPECT_TRUE(learns_of_failure(*bootstrap, 2)) << "rank " << rank << " never learned that rank 2 left";
    EXPECT_EQ(bootstrap->failed_ranks(), std::vector<int>{2}) << "rank " << rank;
    // Neither leaves before both have looked (the one that leaves first would be named too).
    ++checked;
    while (checked.load() < 2) std::this_thread::sleep_for(1ms);
  });
  expect_all_ok(outcomes);
  EXPECT_LT(Clock::now() - start, kPromptly);
}

TEST_P(FailedRanks, RankZeroLeavingIsNamedOnEveryPeer) {
  const std::string where = address();
  const auto outcomes = run_threads(3, [&](int rank) {
    auto bootstrap = make_socket_bootstrap(where, rank, 3, kGenerousTimeout);
    bootstrap->barrier();
    if (rank == 0) return;  // its connections close with it
    EXPECT_TRUE(learns_of_failure(*bootstrap, 0)) << "rank " << rank << " never learned that rank 0 left";
    EXPECT_EQ(bootstrap->failed_ranks(), std::vector<int>{0}) << "rank " << rank;
  });
  expect_all_ok(outcomes);
}

// A peer that did not look before its next exchange reads rank 0's RankFailed frame there: the
// exchange still fails with rank 0's reason, and the failed rank is known afterwards.
TEST_P(FailedRanks, AnExchangeSkipsTheNewsAndReportsRankZerosReason) {
  const std::string where = address();
  std::promise<void> left, told;
  std::shared_future<void> gone = left.get_future().share(), relayed = told.get_future().share();
  const auto outcomes = run_threads(3, [&](int rank) {
    SetOnExit leaving(rank == 2 ? &left : nullptr), telling(rank == 0 ? &told : nullptr);
    auto bootstrap = make_socket_bootstrap(where, rank, 3, kGenerousTimeout);
    bootstrap->barrier();
    if (rank == 2) return;
    ASSERT_EQ(gone.wait_for(kGenerousTimeout), std::future_status::ready);
    if (rank == 0) {
      EXPECT_TRUE(learns_of_failure(*bootstrap, 2));  // and tells rank 1
      telling.set();
    } else {
      ASSERT_EQ(relayed.wait_for(kGenerousTimeout), std::future_status::ready);
    }
    const unsigned char in = 1;
    std::vector<unsigned char> out(3);
    try {
      bootstrap->allgather(&in, out.data(), 1);
    } catch (const Error&) {
      const std::vector<int> failed = bootstrap->failed_ranks();
      EXPECT_EQ(failed, std::vector<int>{2}) << "rank " << rank;
      throw;
    }
  });
  expect_bootstrap_error(outcomes[0], "rank 0 lost its connection to rank 2");
  expect_bootstrap_error(outcomes[1], "was stopped by rank 0, which reported: rank 0 lost its connection to rank 2");
}

// A rank dies while rank 0 waits inside an exchange for another peer that will not come soon (in a
// GPU wait on the dead rank, say): the exchange fails at once naming the dead rank, and rank 0
// tells the waiting peer, instead of both waiting out the bootstrap's bound.
TEST_P(FailedRanks, ARankDyingWhileRankZeroWaitsInAnExchangeIsNamedAtOnce) {
  const std::string where = address();
  std::promise<void> left, finished;
  std::shared_future<void> gone = left.get_future().share(), done = finished.get_future().share();
  const auto outcomes = run_threads(3, [&](int rank) {
    SetOnExit leaving(rank == 2 ? &left : nullptr), ending(rank == 0 ? &finished : nullptr);
    auto bootstrap = make_socket_bootstrap(where, rank, 3, kGenerousTimeout);
    bootstrap->barrier();
    if (rank == 2) return;
    ASSERT_EQ(gone.wait_for(kGenerousTimeout), std::future_status::ready);
    if (rank == 1) {  // enters no exchange: it only asks, as a Buffer's watchdog does
      EXPECT_TRUE(learns_of_failure(*bootstrap, 2)) << "rank 1 never learned that rank 2 left";
      ASSERT_EQ(done.wait_for(kGenerousTimeout), std::future_status::ready);  // stays until rank 0 is done
      return;
    }
    const auto start = Clock::now();
    const unsigned char in = 0;
    unsigned char out[3];
    try {
      bootstrap->allgather(&in, out, 1);
    } catch (const Error&) {
      EXPECT_LT(Clock::now() - start, kPromptly);
      throw;
    }
  });
  expect_bootstrap_error(outcomes[0], "lost its connection to rank 2");
  EXPECT_TRUE(outcomes[1].ok) << outcomes[1].message;
}

// Rank 0 stops the job on purpose (here: ranks 0 and 1 disagree about an exchange) and then goes
// away, while rank 2 is not in any exchange (in a GPU wait, say) and never reads the Abort waiting
// for it: once rank 0's connection has closed, rank 2 names it, rather than waiting for an
// exchange that would read the reason.
TEST_P(FailedRanks, RankZeroThatStoppedTheJobAndLeftIsNamed) {
  const std::string where = address();
  const auto outcomes = run_threads(3, [&](int rank) {
    auto bootstrap = make_socket_bootstrap(where, rank, 3, kGenerousTimeout);
    bootstrap->barrier();
    if (rank == 2) {
      EXPECT_TRUE(learns_of_failure(*bootstrap, 0)) << "rank 2 never learned that rank 0 left";
      return;
    }
    const size_t bytes = rank == 1 ? 16 : 8;  // rank 0 finds the difference and stops the job
    std::vector<unsigned char> in(bytes), out(3 * bytes);
    bootstrap->allgather(in.data(), out.data(), bytes);
  });
  expect_bootstrap_error(outcomes[0], "allgather size mismatch");
  expect_bootstrap_error(outcomes[1], "allgather size mismatch");
  EXPECT_TRUE(outcomes[2].ok) << outcomes[2].message;
}

INSTANTIATE_TEST_SUITE_P(Transports, FailedRanks, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& param) { return param.param ? "tcp" : "unix"; });

TEST(BootstrapErrors, MismatchedAllgatherSizesFailOnEveryRank) {
  const TempDir dir;
  const auto outcomes = run_threads(3, [&](int rank) {
    auto bootstrap = make_socket_bootstrap(unix_address(dir), rank, 3, kGenerousTimeout);
    const size_t bytes = rank == 1 ? 16 : 8;
    std::vector<unsigned char> in(bytes), out(3 * bytes);
    bootstrap->allgather(in.data(), out.data(), bytes);
  });
  for (const Outcome& outcome : outcomes) {
    expect_bootstrap_error(outcome, "allgather size mismatch: rank 1 passed bytes=16 but rank 0 passed bytes=8");
  }
}

TEST(BootstrapErrors, BarrierAgainstAllgatherIsNamed) {
  const TempDir dir;
  const auto outcomes = run_threads(2, [&](int rank) {
    auto bootstrap = make_socket_bootstrap(unix_address(dir), rank, 2, kGenerousTimeout);
    if (rank == 1) {
      bootstrap->barrier();
      return;
    }
    const unsigned char in = 0;
    unsigned char out[2];
    bootstrap->allgather(&in, out, 1);
  });
  for (const Outcome& outcome : outcomes)
    expect_bootstrap_error(outcome, "rank 1 called barrier while rank 0 called allgather");
}

TEST(BootstrapErrors, DisagreementOnNumRanksIsNamed) {
  const TempDir dir;
  const auto outcomes = run_threads(
      2, [&](int rank) { make_socket_bootstrap(unix_address(dir), rank, rank == 0 ? 2 : 3, kGenerousTimeout); });
  for (const Outcome& outcome : outcomes) {
    expect_bootstrap_error(outcome, "rank 1 connected with num_ranks=3, but rank 0 has num_ranks=2");
  }
}

TEST(BootstrapErrors, DuplicateRankIsNamed) {
  const TempDir dir;
  const int ranks_of_threads[] = {0, 1, 1};
  const auto outcomes = run_threads(
      3, [&](int index) { make_socket_bootstrap(unix_address(dir), ranks_of_threads[index], 3, kGenerousTimeout); });
  for (const Outcome& outcome : outcomes) expect_bootstrap_error(outcome, "as rank 1; every rank must be unique");
}

void expect_invalid_argument(const std::function<void()>& call, const std::string& expected_text) {
  try {
    call();
    ADD_FAILURE() << "no error; expected one containing \"" << expected_text << "\"";
  } catch (const Error& error) {
    EXPECT_EQ(error.code(), ErrorCode::kInvalidArgument) << error.what();
    EXPECT_NE(std::string(error.what()).find(expected_text), std::string::npos)
        << "expected \"" << expected_text << "\" in: " << error.what();
  }
}

TEST(BootstrapErrors, InvalidArgumentsAreNamed) {
  const std::string address = "unix:/tmp/epcomm-never-used.sock";
  expect_invalid_argument([&] { make_socket_bootstrap(address, 4, 4); }, "rank=4 must be between 0 and 3");
  expect_invalid_argument([&] { make_socket_bootstrap(address, -1, 4); }, "rank=-1 must be between 0 and 3");
  expect_invalid_argument([&] { make_socket_bootstrap(address, 0, 0); }, "num_ranks=0 must be between 1 and 65536");
  expect_invalid_argument([&] { make_socket_bootstrap(address, 0, 2, 0ms); }, "timeout=0 ms must be positive");
  expect_invalid_argument([&] { make_socket_bootstrap("localhost", 0, 2); }, "'localhost' must be unix:/path");
  expect_invalid_argument([&] { make_socket_bootstrap("unix:", 0, 2); }, "'unix:' has no socket path");
  expect_invalid_argument([&] { make_socket_bootstrap("host:0", 0, 2); }, "port '0'");
  expect_invalid_argument([&] { make_socket_bootstrap("host:http", 0, 2); }, "port 'http'");
  expect_invalid_argument([&] { make_socket_bootstrap(":1234", 0, 2); }, "':1234' has no host");
  expect_invalid_argument([&] { make_socket_bootstrap("::1:1234", 0, 2); }, "write it in brackets");
  expect_invalid_argument([&] { make_socket_bootstrap("unix:/" + std::string(200, 'x'), 0, 2); },
                          "must be shorter than 108 bytes");
}

// Sets the EPCOMM_* variables for one test and restores what was there before.
class ScopedEnv {
 public:
  ScopedEnv() {
    for (const char* name : kNames) {
      const char* value = std::getenv(name);
      saved_.emplace_back(name, value ? std::optional<std::string>(value) : std::nullopt);
      unsetenv(name);
    }
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;
  ~ScopedEnv() {
    for (const auto& [name, value] : saved_) value ? setenv(name, value->c_str(), 1) : unsetenv(name);
  }
  void set(const char* name, const std::string& value) { setenv(name, value.c_str(), 1); }
  void unset(const char* name) { unsetenv(name); }

 private:
  static constexpr const char* kNames[] = {kEnvRank, kEnvNumRanks, kEnvBootstrapAddress, kEnvJobSecret};
  std::vector<std::pair<const char*, std::optional<std::string>>> saved_;
};

TEST(BootstrapFromEnv, MissingOrMalformedVariablesAreNamed) {
  ScopedEnv env;
  const auto from_env = [] { make_bootstrap_from_env(kShortTimeout); };
  expect_invalid_argument(from_env, "EPCOMM_NUM_RANKS is not set");
  env.set(kEnvNumRanks, "two");
  expect_invalid_argument(from_env, "EPCOMM_NUM_RANKS='two' is not an integer");
  env.set(kEnvNumRanks, "0");
  expect_invalid_argument(from_env, "EPCOMM_NUM_RANKS=0 must be between 1 and");
  env.set(kEnvNumRanks, "2147483647");  // rank 0 would reserve a slot per rank: bounded
  expect_invalid_argument(from_env, "EPCOMM_NUM_RANKS=2147483647 must be between 1 and 65536");
  env.set(kEnvNumRanks, "2");
  expect_invalid_argument(from_env, "EPCOMM_RANK is not set");
  env.set(kEnvRank, "");
  expect_invalid_argument(from_env, "EPCOMM_RANK='' is not an integer");
  env.set(kEnvRank, "1x");
  expect_invalid_argument(from_env, "EPCOMM_RANK='1x' is not an integer");
  env.set(kEnvRank, "2");
  expect_invalid_argument(from_env, "EPCOMM_RANK=2 must be less than EPCOMM_NUM_RANKS=2");
  env.set(kEnvRank, "1");
  expect_invalid_argument(from_env, "EPCOMM_BOOTSTRAP_ADDRESS is not set");
  env.set(kEnvBootstrapAddress, "");
  expect_invalid_argument(from_env, "EPCOMM_BOOTSTRAP_ADDRESS is empty");
  env.set(kEnvBootstrapAddress, "nowhere");
  expect_invalid_argument(from_env, "'nowhere' must be unix:/path");
}

TEST(BootstrapFromEnv, SingleRankNeedsNoAddress) {
  ScopedEnv env;
  env.set(kEnvNumRanks, "1");
  env.set(kEnvRank, "0");
  auto bootstrap = make_bootstrap_from_env(kShortTimeout);
  EXPECT_EQ(bootstrap->num_ranks(), 1);
  bootstrap->barrier();
}

TEST(BootstrapFromEnv, JoinsRanksStartedExplicitly) {
  const TempDir dir;
  ScopedEnv env;
  env.set(kEnvNumRanks, "2");
  env.set(kEnvRank, "1");
  env.set(kEnvBootstrapAddress, unix_address(dir));
  env.set(kEnvJobSecret, "the job's secret");
  SocketBootstrapOptions root;
  root.timeout = kGenerousTimeout;
  root.job_secret = "the job's secret";
  expect_all_ok(run_threads(2, [&](int rank) {
    auto bootstrap = rank == 0 ? make_socket_bootstrap(unix_address(dir), 0, 2, root)
                               : make_bootstrap_from_env(kGenerousTimeout);
    EXPECT_EQ(bootstrap->rank(), rank);
    exchange_rounds(*bootstrap, {4});
  }));
}

// A socket bound to a port that connects to that same port, nothing listening there, reaches
// itself (TCP's simultaneous open): what a peer retrying before rank 0 listens can meet when the
// port is one the kernel hands out as a source. try_connect tells it apart from rank 0.
TEST(SocketIo, ASocketThatReachedItsOwnPortIsToldApart) {
  const int port = free_tcp_port();
  ASSERT_GT(port, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  address.sin_port = htons(static_cast<uint16_t>(port));
  const bootstrap_detail::UniqueFd self(socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  ASSERT_TRUE(self);
  ASSERT_EQ(bind(self.get(), reinterpret_cast<const sockaddr*>(&address), sizeof(address)), 0) << std::strerror(errno);
  ASSERT_EQ(connect(self.get(), reinterpret_cast<const sockaddr*>(&address), sizeof(address)), 0) << std::strerror(errno);
  EXPECT_TRUE(bootstrap_detail::connected_to_itself(self.get()));

  // A connection to a listener is not.
  const bootstrap_detail::UniqueFd listener(socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  address.sin_port = 0;
  ASSERT_EQ(bind(listener.get(), reinterpret_cast<const sockaddr*>(&address), sizeof(address)), 0);
  ASSERT_EQ(listen(listener.get(), 1), 0);
  socklen_t length = sizeof(address);
  ASSERT_EQ(getsockname(listener.get(), reinterpret_cast<sockaddr*>(&address), &length), 0);
  const bootstrap_detail::UniqueFd client(socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  ASSERT_EQ(connect(client.get(), reinterpret_cast<const sockaddr*>(&address), sizeof(address)), 0);
  EXPECT_FALSE(bootstrap_detail::connected_to_itself(client.get()));
}

}  // namespace
}  // namespace epcomm
