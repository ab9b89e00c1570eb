// Dead-rank detection on the host: process identities, and the watchdog's report of a killed peer
// within a fraction of a second (a killed child is a zombie until reaped: it counts as dead).
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "common/device_error.hpp"
#include "common/process_identity.hpp"
#include "epcomm/error.hpp"
#include "runtime/device_error_log.hpp"
#include "runtime/peer_watchdog.hpp"

namespace epcomm::detail {
namespace {

using namespace std::chrono_literals;

// A child process that waits until killed.
pid_t start_sleeping_child() {
  const pid_t child = fork();
  if (child == 0) {
    pause();
    _exit(0);
  }
  return child;
}

TEST(ProcessIdentity, TellsLiveDeadAndReusedProcessesApart) {
  const ProcessIdentity self = current_process();
  EXPECT_EQ(self.pid, static_cast<int64_t>(getpid()));
  EXPECT_GT(self.start_ticks, 0u);  // /proc is there on Linux
  EXPECT_GT(self.pid_namespace, 0u);
  EXPECT_TRUE(process_alive(self));
  EXPECT_TRUE(process_alive(ProcessIdentity{}));  // pid 0: nobody to watch
  ProcessIdentity reused = self;
  ++reused.start_ticks;  // the same pid, but another process's start time
  EXPECT_FALSE(process_alive(reused));

  const pid_t child = start_sleeping_child();
  ASSERT_GT(child, 0);
  const ProcessIdentity identity{child, 0};
  EXPECT_TRUE(process_alive(identity));
  kill(child, SIGKILL);
  std::this_thread::sleep_for(100ms);
  EXPECT_FALSE(process_alive(identity)) << "a killed, unreaped child (a zombie) counts as dead";
  waitpid(child, nullptr, 0);
  EXPECT_FALSE(process_alive(identity)) << "a reaped child is gone";
}

TEST(PeerWatchdog, ReportsAKilledPeerOnceAndPromptly) {
  const pid_t child = start_sleeping_child();
  ASSERT_GT(child, 0);
  std::atomic<int> reports{0};
  std::vector<DeadProcess> dead;
  const auto start = std::chrono::steady_clock::now();
  std::chrono::steady_clock::duration noticed{};
  {
    PeerWatchdog watchdog({ProcessIdentity{}, current_process(), ProcessIdentity{child, 0}},
                          [&](const std::vector<DeadProcess>& found) {
                            noticed = std::chrono::steady_clock::now() - start;
                            dead = found;
                            ++reports;
                          },
                          20ms);
    std::this_thread::sleep_for(100ms);
    EXPECT_EQ(reports.load(), 0) << "nobody has died yet";
    kill(child, SIGKILL);
    for (int i = 0; i < 100 && reports.load() == 0; ++i) std::this_thread::sleep_for(10ms);
    std::this_thread::sleep_for(100ms);  // a second report would come by now
  }
  waitpid(child, nullptr, 0);
  EXPECT_EQ(reports.load(), 1);
  ASSERT_EQ(dead.size(), 1u);
  EXPECT_EQ(dead[0].rank, 2);
  EXPECT_EQ(dead[0].pid, static_cast<int64_t>(child));
  EXPECT_LT(noticed, 500ms);
}

// Ranks on other hosts: the bootstrap's failed_ranks() names them; reported once, with the pid
// this host knows (none for a remote rank), together with any local death of the same check.
TEST(PeerWatchdog, ReportsRanksTheBootstrapFoundFailedOnce) {
  std::atomic<bool> failed{false};
  std::atomic<int> reports{0};
  std::vector<DeadProcess> dead;
  {
    PeerWatchdog watchdog({current_process(), ProcessIdentity{}, ProcessIdentity{}},
                          [&](const std::vector<DeadProcess>& found) {
                            dead = found;
                            ++reports;
                          },
                          20ms, /*keep_watching=*/true, [&] {
                            return failed.load() ? std::vector<int>{2, 7, -1} : std::vector<int>{};  // 7, -1: no such rank
                          });
    std::this_thread::sleep_for(100ms);
    EXPECT_EQ(reports.load(), 0) << "nobody has failed yet";
    failed = true;
    for (int i = 0; i < 100 && reports.load() == 0; ++i) std::this_thread::sleep_for(10ms);
    std::this_thread::sleep_for(100ms);  // a second report would come by now
  }
  EXPECT_EQ(reports.load(), 1);
  ASSERT_EQ(dead.size(), 1u);
  EXPECT_EQ(dead[0].rank, 2);
  EXPECT_EQ(dead[0].pid, 0);
}

// Whether a Buffer needs more than the operating system to watch its peers (across hosts with a
// bootstrap that cannot name failed ranks, it then sets up a liveness channel): a rank's own entry
// does not count, any unwatchable peer does.
TEST(PeerWatchdog, WatchesEveryPeerOnlyWhenEveryPeerHasAPid) {
  const ProcessIdentity here = current_process();
  const ProcessIdentity elsewhere{};  // another host or pid namespace
  EXPECT_TRUE(watches_every_peer({elsewhere}, 0)) << "a single rank has no peer";
  EXPECT_TRUE(watches_every_peer({elsewhere, here, here}, 0));
  EXPECT_FALSE(watches_every_peer({here, elsewhere, here}, 0));
  EXPECT_FALSE(watches_every_peer({here, here, elsewhere}, 1));
  EXPECT_TRUE(watches_every_peer({here, here, elsewhere}, 2));
}

TEST(DeviceErrorLog, ARankReportedByTheBootstrapIsNamedByItsConnection) {
  DeviceErrorLog log;
  log.mark_peers_dead({{6, 0}});
  try {
    log.raise_if_recorded();
    FAIL() << "a failed rank was not raised";
  } catch (const Error& error) {
    EXPECT_EQ(error.code(), ErrorCode::kPeerFailed);
    EXPECT_NE(std::string(error.what()).find("the process of rank 6 (its rendezvous connection closed or went silent) ended"),
              std::string::npos)
        << error.what();
  }
}

TEST(DeviceErrorLog, ADeadPeerStopsWaitsAndFailsEveryLaterCall) {
  DeviceErrorLog log;  // not allocated: the host-side half alone
  log.raise_if_recorded();  // nothing yet
  log.mark_peers_dead({{3, 4242}});
  log.mark_peers_dead({{5, 77}});  // only the first report counts
  for (int call = 0; call < 2; ++call) {
    try {
      log.raise_if_recorded();
      FAIL() << "a dead peer was not raised";
    } catch (const Error& error) {
      EXPECT_EQ(error.code(), ErrorCode::kPeerFailed);
      EXPECT_NE(std::string(error.what()).find("the process of rank 3 (pid 4242) ended"), std::string::npos)
          << error.what();
      EXPECT_EQ(std::string(error.what()).find("rank 5"), std::string::npos) << error.what();
    }
  }
}

// Ranks that die within one watchdog interval cannot be ordered: the report names them all.
TEST(DeviceErrorLog, RanksFoundDeadTogetherAreAllNamed) {
  DeviceErrorLog log;
  log.mark_peers_dead({{1, 10}, {5, 50}, {7, 70}});
  try {
    log.raise_if_recorded();
    FAIL() << "dead peers were not raised";
  } catch (const Error& error) {
    EXPECT_EQ(error.code(), ErrorCode::kPeerFailed);
    const std::string expected = "the processes of rank 1 (pid 10), rank 5 (pid 50) and rank 7 (pid 70) ended";
    EXPECT_NE(std::string(error.what()).find(expected), std::string::npos) << error.what();
  }
}

}  // namespace
}  // namespace epcomm::detail
