// Starting the rank processes of one job on this host (POSIX; no CUDA). Used by epcomm-launch,
// and by tools and GPU tests that relaunch themselves as N ranks.
#pragma once

#include <csignal>
#include <chrono>
#include <string>
#include <utility>
#include <vector>

namespace epcomm::tools {

inline constexpr int kMaxRanks = 1024;
// Exit codes a launch can end with, besides a rank's own.
inline constexpr int kExitSkipped = 77;      // every rank exited 77: "skipped" (e.g. no GPU), as ctest reads it
inline constexpr int kExitMixedSkip = 1;     // some ranks skipped while others ran: inconsistent, so a failure
inline constexpr int kExitTimedOut = 124;    // the job outlived LaunchOptions::timeout (as timeout(1) reports)
inline constexpr int kExitExecFailed = 127;  // a rank's program could not be started (as a shell reports)
inline constexpr int kExitSignalBase = 128;  // 128 + N: a rank, or the launcher itself, got signal N

struct LaunchOptions {
  int num_ranks = 1;  // ranks of the whole job
  // The ranks this host runs: first_rank .. first_rank + local_ranks - 1 (local_ranks 0: all of
  // them). A job across hosts runs one launcher per host, each with its share, the same num_ranks,
  // bootstrap_address (rank 0's host:port) and EPCOMM_JOB_SECRET in the environment.
  int first_rank = 0;
  int local_ranks = 0;
  std::vector<std::string> argv;    // program (looked up in PATH unless it has a '/') and its arguments
  std::chrono::seconds timeout{0};  // whole-job limit; 0 = none
  // After the first rank fails, how long the others get to finish (typically failing themselves
  // with a clear message) before they are sent SIGTERM.
  std::chrono::seconds grace{10};
  // Passed to every rank as EPCOMM_BOOTSTRAP_ADDRESS. Empty: a unix socket in a fresh private
  // directory under $TMPDIR (or /tmp), unique to this launch and removed afterwards.
  std::string bootstrap_address;
  std::vector<std::pair<std::string, std::string>> extra_env;  // set (or overridden) in every rank
  // Stopping: SIGTERM, then `kill_signal` after `kill_delay`; a rank still running `stuck_delay`
  // after that (stuck in the kernel: a driver call, I/O; a CUDA process's teardown alone can take
  // seconds) is reported and left, so the launcher returns. Tests shorten the delays and send a
  // signal their ranks ignore. Both delays: 1 ms to 1 hour.
  std::chrono::milliseconds kill_delay{5000};
  std::chrono::milliseconds stuck_delay{60000};
  int kill_signal = SIGKILL;
};

// Starts this host's copies of options.argv (every rank by default), rank r with EPCOMM_RANK=r, EPCOMM_NUM_RANKS and
// EPCOMM_BOOTSTRAP_ADDRESS set, all in the caller's process group (so a terminal's Ctrl-C reaches
// them all), and waits for them. Reports every failed rank on stderr. Returns 0 when all ranks
// succeeded, kExitSkipped when all exited 77, kExitTimedOut on timeout, otherwise the exit code of
// the first rank to fail (128 + signal for a signal). While it waits, SIGINT/SIGTERM/SIGHUP stop
// the ranks and make it return 128 + that signal. A job it stops (a rank failed, the timeout, a
// signal) also has the processes its ranks left running stopped (adopted_orphans.hpp); a job that
// succeeded keeps them; so do a rank left as stuck. Called from a library, such processes stay the
// caller's children once it returns. Throws std::invalid_argument for bad options and
// std::system_error when the operating system refuses to start processes.
int launch_ranks(const LaunchOptions& options);

// The running program's own path (from /proc/self/exe), so a tool can relaunch itself as ranks.
std::string self_executable_path();

// True inside a process started by launch_ranks (EPCOMM_RANK is set).
bool running_as_rank();

}  // namespace epcomm::tools
