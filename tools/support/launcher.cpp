#include "support/launcher.hpp"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#ifdef __linux__
#include <sys/prctl.h>
#endif

#include <cerrno>
#include <csignal>
#include <cstdio>
#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <optional>
#include <stdexcept>
#include <system_error>
#include <thread>

#include "bootstrap/host_addresses.hpp"
#include "epcomm/bootstrap.hpp"
#include "support/adopted_orphans.hpp"

extern char** environ;

namespace epcomm::tools {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

// Waiting polls instead of sleeping on SIGCHLD: simpler than signal masks, which children would
// inherit, and 10 ms of latency is nothing next to a job's run time.
constexpr milliseconds kPollInterval{10};
// How often, while ranks run, what they left behind and has exited is reaped (a /proc scan).
constexpr milliseconds kOrphanReapInterval{1000};
// How long a start waits for the child's word on its exec. An exec that takes longer (a program on
// a hung file system, a child stopped before it) is left to the job's supervision, where its exit
// code (kExitExecFailed) or the job's timeout tells; the launcher does not hang on it here.
constexpr milliseconds kExecReportWait{10 * 1000};
constexpr milliseconds kMaxStopDelay{3600 * 1000};
// How long the check that a TCP rendezvous address is not loopback-only waits for the name service.
constexpr milliseconds kLoopbackCheckBudget{5000};
constexpr const char* kDefaultPath = "/usr/bin:/bin";
constexpr const char* kSocketName = "bootstrap.sock";
constexpr const char* kTempDirPattern = "epcomm-launch-XXXXXX";
// sun_path holds 108 bytes; leave room for the directory pattern and the socket name.
constexpr size_t kMaxTempBaseLength = 108 - 40;
constexpr int kHandledSignals[] = {SIGINT, SIGTERM, SIGHUP};

volatile std::sig_atomic_t g_received_signal = 0;
// SIGPIPE as the caller had it, which the ranks get back (the launcher ignores it: ScopedSignals).
struct sigaction g_caller_sigpipe {};

extern "C" void record_signal(int signal_number) { g_received_signal = signal_number; }

void report(const std::string& message) {
  const std::string line = "epcomm-launch: " + message + "\n";
  std::fputs(line.c_str(), stderr);  // one call per line keeps lines whole amid the ranks' output
}

std::string describe_signal(int signal_number) {
  const char* name = strsignal(signal_number);
  return "signal " + std::to_string(signal_number) + " (" + (name ? name : "unknown") + ")";
}

std::string describe_ranks(const std::vector<int>& ranks) {
  std::string text = ranks.size() == 1 ? "rank " : "ranks ";
  for (size_t i = 0; i < ranks.size(); ++i) text += (i ? ", " : "") + std::to_string(ranks[i]);
  return text;
}

std::string signal_name(int signal_number) {
  return signal_number == SIGKILL ? "SIGKILL" : describe_signal(signal_number);
}

std::string seconds_text(std::chrono::milliseconds delay) {
  const long long ms = delay.count();
  return ms % 1000 == 0 ? std::to_string(ms / 1000) + " s" : std::to_string(ms) + " ms";
}

std::string describe_pids(const std::vector<pid_t>& pids) {
  std::string text = pids.size() == 1 ? "process " : std::to_string(pids.size()) + " processes ";
  for (size_t i = 0; i < pids.size(); ++i) text += (i ? ", " : "") + std::string("pid ") + std::to_string(pids[i]);
  return text;
}

[[noreturn]] void throw_errno(const std::string& what) {
  throw std::system_error(errno, std::generic_category(), what);
}

// While ranks run: stop them (instead of orphaning them) when we are interrupted (but for a
// hangup the caller ignores), and reap them ourselves even if the caller set SIGCHLD to SIG_IGN.
// Restores the caller's handlers afterwards.
class ScopedSignals {
 public:
  ScopedSignals() {
    g_received_signal = 0;
    struct sigaction action {};
    action.sa_handler = record_signal;
    sigemptyset(&action.sa_mask);
    for (size_t i = 0; i < std::size(kHandledSignals); ++i) {
      sigaction(kHandledSignals[i], &action, &saved_[i]);
      // A hangup the caller ignores (nohup) stays ignored, here and so in the ranks, which inherit
      // it: catching it would stop the job, and exec would reset it to the default. (SIGINT and
      // SIGTERM are still caught: a shell ignores SIGINT in its background jobs, yet a kill -INT
      // of the launcher must stop them, and the ranks must get the default action.)
      if (kHandledSignals[i] == SIGHUP && saved_[i].sa_handler == SIG_IGN) sigaction(SIGHUP, &saved_[i], nullptr);
    }
    struct sigaction child_default {};
    child_default.sa_handler = SIG_DFL;
    sigemptyset(&child_default.sa_mask);
    sigaction(SIGCHLD, &child_default, &saved_child_);
    // A report to a reader that went (`2>&1 | tee log`, whose tee a Ctrl-C took too) must not kill
    // the launcher while it stops the job: the write fails instead, and the ranks are stopped in
    // order (SIGTERM, the grace period, what they left behind).
    struct sigaction ignore {};
    ignore.sa_handler = SIG_IGN;
    sigemptyset(&ignore.sa_mask);
    sigaction(SIGPIPE, &ignore, &g_caller_sigpipe);
  }
  ScopedSignals(const ScopedSignals&) = delete;
  ScopedSignals& operator=(const ScopedSignals&) = delete;
  ~ScopedSignals() {
    for (size_t i = 0; i < std::size(kHandledSignals); ++i) sigaction(kHandledSignals[i], &saved_[i], nullptr);
    sigaction(SIGCHLD, &saved_child_, nullptr);
    sigaction(SIGPIPE, &g_caller_sigpipe, nullptr);
  }

 private:
  struct sigaction saved_[std::size(kHandledSignals)]{};
  struct sigaction saved_child_ {};
};

// A private directory (mode 0700 from mkdtemp) holding the job's bootstrap socket.
class TempSocketDir {
 public:
  TempSocketDir() {
    const char* tmpdir = std::getenv("TMPDIR");
    std::string base = (tmpdir && *tmpdir && std::strlen(tmpdir) < kMaxTempBaseLength) ? tmpdir : "/tmp";
    std::string pattern = base + "/" + kTempDirPattern;
    if (mkdtemp(pattern.data()) == nullptr) throw_errno("cannot create a directory like " + pattern);
    dir_ = pattern;
  }
  TempSocketDir(const TempSocketDir&) = delete;
  TempSocketDir& operator=(const TempSocketDir&) = delete;
  ~TempSocketDir() {
    unlink(socket_path().c_str());  // rank 0 normally removed it already
    rmdir(dir_.c_str());
  }
  std::string socket_path() const { return dir_ + "/" + kSocketName; }

 private:
  std::string dir_;
};

// Whether the ranks get a job secret: `overrides`' last one for it, else ours. An empty one is
// none (the bootstrap would admit anyone), even over a secret in our environment.
bool job_secret_given(const std::vector<std::pair<std::string, std::string>>& overrides) {
  const auto last = std::find_if(overrides.rbegin(), overrides.rend(),
                                 [](const auto& entry) { return entry.first == kEnvJobSecret; });
  if (last != overrides.rend()) return !last->second.empty();
  const char* inherited = std::getenv(kEnvJobSecret);
  return inherited != nullptr && inherited[0] != '\0';
}

// A TCP address whose host resolves, here, only to loopback: ranks of other hosts cannot reach a
// rank 0 listening there (Debian and Ubuntu map a machine's own name to 127.0.1.1).
bool resolves_to_loopback_only(const std::string& address) {
  const size_t colon = address.rfind(':');
  if (colon == std::string::npos) return false;
  const std::string host = address.substr(0, colon);
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  // A name service that does not answer leaves the job to rank 0's own bounded lookup.
  const std::optional<int> looked_up =
      bootstrap_detail::look_up_name(host, "", hints, Clock::now() + kLoopbackCheckBudget, found);
  if (!looked_up || *looked_up != 0) return false;  // rank 0 reports it
  bool loopback_only = true;
  for (const addrinfo* entry = found; entry != nullptr; entry = entry->ai_next) {
    if (entry->ai_family == AF_INET) {
      const uint32_t ip = ntohl(reinterpret_cast<const sockaddr_in*>(entry->ai_addr)->sin_addr.s_addr);
      loopback_only = loopback_only && (ip >> 24) == 127;
    } else if (entry->ai_family == AF_INET6) {
      loopback_only = loopback_only && IN6_IS_ADDR_LOOPBACK(&reinterpret_cast<const sockaddr_in6*>(entry->ai_addr)->sin6_addr);
    }
  }
  freeaddrinfo(found);
  return loopback_only;
}

// The environment every rank shares: ours, with EPCOMM_* and extra_env replacing any old values.
std::vector<std::string> shared_environment(const LaunchOptions& options, const std::string& address) {
  std::vector<std::pair<std::string, std::string>> overrides = options.extra_env;
  overrides.emplace_back(kEnvNumRanks, std::to_string(options.num_ranks));
  overrides.emplace_back(kEnvBootstrapAddress, address);
  // Every job gets its own secret, so no other process can join its rendezvous; one already in
  // the environment (or extra_env) is kept, so ranks started by several launchers can share it.
  if (!job_secret_given(overrides)) {
    // An empty one given is dropped: a rank's environment holds each name once.
    overrides.erase(std::remove_if(overrides.begin(), overrides.end(),
                                   [](const auto& entry) { return entry.first == kEnvJobSecret; }),
                    overrides.end());
    overrides.emplace_back(kEnvJobSecret, make_job_secret());
  }
  std::vector<std::string> env;
  for (char** entry = environ; entry && *entry; ++entry) {
    const std::string text = *entry;
    const std::string name = text.substr(0, text.find('='));
    bool replaced = name == kEnvRank;
    for (const auto& [key, value] : overrides) replaced = replaced || key == name;
    if (!replaced) env.push_back(text);
  }
  for (const auto& [key, value] : overrides) env.push_back(key + "=" + value);
  return env;
}

// Looks the program up in the ranks' PATH before forking, so a typo is one clear message
// rather than N failed ranks.
std::string find_program(const std::string& program, const std::vector<std::string>& env) {
  if (program.find('/') != std::string::npos) return program;
  std::string path = kDefaultPath;
  for (const std::string& entry : env) {
    if (entry.compare(0, 5, "PATH=") == 0) path = entry.substr(5);
  }
  size_t start = 0;
  while (start <= path.size()) {
    size_t end = path.find(':', start);
    if (end == std::string::npos) end = path.size();
    const std::string dir = end == start ? "." : path.substr(start, end - start);
    const std::string candidate = dir + "/" + program;
    struct stat info {};
    if (stat(candidate.c_str(), &info) == 0 && S_ISREG(info.st_mode) && access(candidate.c_str(), X_OK) == 0) {
      return candidate;
    }
    start = end + 1;
  }
  return "";
}

std::vector<char*> pointers_to(std::vector<std::string>& strings) {
  std::vector<char*> pointers;
  for (std::string& text : strings) pointers.push_back(text.data());
  pointers.push_back(nullptr);
  return pointers;
}

int exit_code_of(int wait_status) {
  if (WIFEXITED(wait_status)) return WEXITSTATUS(wait_status);
  if (WIFSIGNALED(wait_status)) return kExitSignalBase + WTERMSIG(wait_status);
  return kExitSignalBase;  // not reachable for a reaped child; keeps the result non-zero
}

class Job {
 public:
  explicit Job(const LaunchOptions& options)
      : options_(options),
        ranks_(static_cast<size_t>(options.local_ranks > 0 ? options.local_ranks : options.num_ranks)) {}
  Job(const Job&) = delete;
  Job& operator=(const Job&) = delete;
  // Only reached with ranks still running when starting them threw: never leave them orphaned,
  // nor what they started; bounded like a stop.
  ~Job() {
    if (!any_running()) return;
    signal_running(SIGKILL);
    const Clock::time_point give_up_at = Clock::now() + options_.stuck_delay;
    while (any_running() && Clock::now() < give_up_at) {
      reap();
      if (any_running()) std::this_thread::sleep_for(kPollInterval);
    }
    try {
      orphans_.stop_all(unreaped_rank_pids(), options_.kill_delay);
    } catch (...) {  // a destructor: what could not be stopped stays
    }
  }

  int run() {
    const Clock::time_point started = Clock::now();
    start_ranks();
    Clock::time_point next_orphan_reap = started;
    while (any_running()) {
      reap();
      check_timeout_and_signals(started);
      escalate();
      if (Clock::now() >= next_orphan_reap) {  // what the ranks left that exited: no zombies pile up
        orphans_.reap_exited(unreaped_rank_pids());
        next_orphan_reap = Clock::now() + kOrphanReapInterval;
      }
      if (any_running()) std::this_thread::sleep_for(kPollInterval);
    }
    settle_left_behind();
    return result();
  }

 private:
  struct Rank {
    pid_t pid = -1;
    bool running = false;
    int wait_status = 0;
    bool ended_after_stop = false;  // exited after we sent SIGTERM: a consequence, not a cause
    bool given_up = false;          // still running stuck_delay after the last signal: not reaped
  };

  // Stops at the first rank whose program cannot be executed: without it there is no job, so the
  // ranks already started are stopped at once.
  void start_ranks() {
    std::string address = options_.bootstrap_address;
    if (address.empty()) address = "unix:" + temp_dir_.emplace().socket_path();
    std::vector<std::string> env = shared_environment(options_, address);
    const std::string program = find_program(options_.argv[0], env);
    if (program.empty()) {
      report("cannot find program '" + options_.argv[0] + "' in PATH");
      exec_failed_ = true;
      return;
    }
    std::vector<std::string> args = options_.argv;
    std::vector<char*> argv = pointers_to(args);
    env.push_back("");  // the EPCOMM_RANK slot, rewritten per rank
    for (int rank = 0; rank < static_cast<int>(ranks_.size()); ++rank) {
      env.back() = std::string(kEnvRank) + "=" + std::to_string(global_rank(rank));
      std::vector<char*> envp = pointers_to(env);
      if (!start_rank(rank, program, argv, envp)) {
        exec_failed_ = true;
        begin_stop("a rank could not be started", Clock::now());
        return;
      }
    }
  }

  // Returns false when the rank's program could not be executed (reported and reaped here).
  bool start_rank(int rank, const std::string& program, const std::vector<char*>& argv,
                  const std::vector<char*>& envp) {
    // The child reports a failed exec through this pipe; a successful exec closes it (CLOEXEC).
    int exec_pipe[2];
    if (pipe2(exec_pipe, O_CLOEXEC) != 0) throw_errno("cannot create a pipe for rank " + std::to_string(global_rank(rank)));
    const pid_t parent = getpid();
    const pid_t pid = fork();
    if (pid < 0) {
      const int error = errno;
      close(exec_pipe[0]);
      close(exec_pipe[1]);
      errno = error;
      throw_errno("cannot start rank " + std::to_string(global_rank(rank)));
    }
    if (pid == 0) {  // child: only async-signal-safe calls until exec
      close(exec_pipe[0]);
#ifdef __linux__
      // If the launcher is killed outright, its ranks must not live on holding GPUs.
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (getppid() != parent) _exit(kExitExecFailed);
#endif
      sigaction(SIGPIPE, &g_caller_sigpipe, nullptr);  // an ignored signal would outlive exec
      execve(program.c_str(), argv.data(), envp.data());
      const int error = errno;
      // The launcher may have stopped listening (kExecReportWait): a closed pipe must not kill
      // this child by SIGPIPE before it exits with kExitExecFailed.
      struct sigaction ignore_sigpipe {};
      ignore_sigpipe.sa_handler = SIG_IGN;
      sigaction(SIGPIPE, &ignore_sigpipe, nullptr);
      ssize_t ignored = write(exec_pipe[1], &error, sizeof(error));
      (void)ignored;
      _exit(kExitExecFailed);
    }
    close(exec_pipe[1]);
    ranks_[static_cast<size_t>(rank)].pid = pid;
    ranks_[static_cast<size_t>(rank)].running = true;
    int error = 0;
    ssize_t got = -1;
    const auto give_up = Clock::now() + kExecReportWait;
    pollfd exec_report{exec_pipe[0], POLLIN, 0};
    while (true) {
      const auto left = std::chrono::duration_cast<milliseconds>(give_up - Clock::now());
      const int ready = poll(&exec_report, 1, static_cast<int>(std::max<int64_t>(left.count(), 0)));
      if (ready < 0 && errno == EINTR) continue;
      if (ready <= 0) break;  // no word in time (or poll failed): the rank counts as started
      got = read(exec_pipe[0], &error, sizeof(error));
      if (!(got < 0 && errno == EINTR)) break;
    }
    close(exec_pipe[0]);
    if (got != static_cast<ssize_t>(sizeof(error))) return true;
    report("rank " + std::to_string(global_rank(rank)) + ": cannot execute '" + program + "': " + std::strerror(error));
    Rank& process = ranks_[static_cast<size_t>(rank)];
    while (waitpid(pid, &process.wait_status, 0) < 0 && errno == EINTR) {
    }
    process.running = false;
    process.ended_after_stop = true;  // reported just above
    return false;
  }

  // What the ranks left behind (adopted_orphans.hpp): stopped with a stopped job; after a job that
  // succeeded, left running (a rank may start a daemon on purpose) and only reaped once exited.
  void settle_left_behind() {
    const std::vector<pid_t> rank_pids = unreaped_rank_pids();
    if (!stopping_) {
      orphans_.reap_exited(rank_pids);
      return;
    }
    const std::vector<pid_t> stuck = orphans_.stop_all(rank_pids, options_.kill_delay);
    if (!orphans_.stopped().empty()) {
      report("stopped " + describe_pids(orphans_.stopped()) + " that the ranks left running (" + stop_reason_ + ")");
    }
    if (!stuck.empty()) {
      report(describe_pids(stuck) + " left by the ranks still running " + seconds_text(options_.kill_delay) +
             " after SIGKILL (stuck in the kernel: a driver call, I/O?); leaving them");
    }
    for (Rank& process : ranks_) {  // a rank left as stuck may have ended meanwhile
      if (process.given_up && waitpid(process.pid, &process.wait_status, WNOHANG) == process.pid) process.given_up = false;
    }
  }

  // The ranks not reaped (running, or left as stuck): a reaped rank's pid may be reused by now.
  std::vector<pid_t> unreaped_rank_pids() const {
    std::vector<pid_t> pids;
    for (const Rank& process : ranks_) {
      if (process.running || process.given_up) pids.push_back(process.pid);
    }
    return pids;
  }

  void reap() {
    for (size_t rank = 0; rank < ranks_.size(); ++rank) {
      Rank& process = ranks_[rank];
      if (!process.running) continue;
      int status = 0;
      const pid_t done = waitpid(process.pid, &status, WNOHANG);
      if (done == 0 || (done < 0 && errno == EINTR)) continue;
      process.running = false;
      // ECHILD means someone else reaped our child and its status is lost; count it as a failure.
      constexpr int kLostStatus = kExitSignalBase << 8;  // reads back as "exited with code 128"
      process.wait_status = done < 0 ? kLostStatus : status;
      process.ended_after_stop = sent_term_;
      on_rank_finished(static_cast<int>(rank), process);
    }
  }

  void on_rank_finished(int rank, const Rank& process) {
    const int code = exit_code_of(process.wait_status);
    if (code == 0 || process.ended_after_stop) return;
    if (first_failure_ < 0 && code != kExitSkipped) first_failure_ = rank;
    const std::string who = "rank " + std::to_string(global_rank(rank));
    if (WIFSIGNALED(process.wait_status)) {
      report(who + " was killed by " + describe_signal(WTERMSIG(process.wait_status)));
    } else if (code != kExitSkipped) {  // skips are reported at the end, unless every rank skipped
      report(who + " exited with code " + std::to_string(code));
    }
    begin_stop(who + (code == kExitSkipped ? " skipped (exit 77)" : " failed"), Clock::now() + options_.grace);
  }

  void check_timeout_and_signals(Clock::time_point started) {
    if (g_received_signal != 0 && interrupted_by_ == 0) {
      interrupted_by_ = g_received_signal;
      report("received " + describe_signal(interrupted_by_) + "; stopping all ranks");
      begin_stop("the launcher was interrupted", Clock::now());
    }
    if (options_.timeout.count() > 0 && !timed_out_ && Clock::now() - started >= options_.timeout) {
      timed_out_ = true;
      report("the job did not finish within its timeout of " + std::to_string(options_.timeout.count()) +
             " s; stopping " + describe_ranks(running_ranks()));
      begin_stop("the job timed out", Clock::now());
    }
  }

  // Schedules SIGTERM for the ranks still running; an earlier schedule wins.
  void begin_stop(const std::string& reason, Clock::time_point terminate_at) {
    if (!stopping_ || terminate_at < terminate_at_) {
      terminate_at_ = terminate_at;
      stop_reason_ = reason;
    }
    stopping_ = true;
  }

  void escalate() {
    if (!stopping_ || !any_running()) return;
    const Clock::time_point now = Clock::now();
    if (!sent_term_ && now >= terminate_at_) {
      report("sending SIGTERM to " + describe_ranks(running_ranks()) + " (" + stop_reason_ + ")");
      signal_running(SIGTERM);
      sent_term_ = true;
      kill_at_ = now + options_.kill_delay;
    } else if (sent_term_ && !sent_kill_ && now >= kill_at_) {
      report("sending " + signal_name(options_.kill_signal) + " to " + describe_ranks(running_ranks()) +
             ", still running " + seconds_text(options_.kill_delay) + " after SIGTERM");
      signal_running(options_.kill_signal);
      sent_kill_ = true;
      give_up_at_ = now + options_.stuck_delay;
    } else if (sent_kill_ && now >= give_up_at_) {
      give_up_on_running_ranks();
    }
  }

  // A rank that outlives SIGKILL is stuck in the kernel (a driver call, I/O); waiting for it
  // would be waiting without bound. Reported, counted as killed, and left.
  void give_up_on_running_ranks() {
    report(describe_ranks(running_ranks()) + " still running " + seconds_text(options_.stuck_delay) + " after " +
           signal_name(options_.kill_signal) + " (stuck in the kernel: a driver call, I/O?); not waiting for " +
           (running_ranks().size() == 1 ? "it" : "them") + " (pids " + running_pids() + ")");
    for (Rank& process : ranks_) {
      if (!process.running) continue;
      process.running = false;
      process.given_up = true;
      process.wait_status = options_.kill_signal;  // reads as "killed by" that signal
      process.ended_after_stop = true;
    }
  }

  std::string running_pids() const {
    std::string text;
    for (const Rank& process : ranks_) {
      if (process.running) text += (text.empty() ? "" : ", ") + std::to_string(process.pid);
    }
    return text;
  }

  void signal_running(int signal_number) {
    // Each pid on its own: the process group also holds the launcher and whoever started it.
    for (const Rank& process : ranks_) {
      if (!process.running) continue;
      kill(process.pid, signal_number);
      if (signal_number == SIGTERM) kill(process.pid, SIGCONT);  // a stopped rank acts on it only once running
    }
  }

  int result() const {
    if (interrupted_by_ != 0) return kExitSignalBase + interrupted_by_;
    if (exec_failed_) return kExitExecFailed;
    if (timed_out_) return kExitTimedOut;
    std::vector<int> skipped;
    for (size_t rank = 0; rank < ranks_.size(); ++rank) {
      const Rank& process = ranks_[rank];
      if (exit_code_of(process.wait_status) == kExitSkipped && !process.ended_after_stop) {
        skipped.push_back(global_rank(static_cast<int>(rank)));
      }
    }
    if (skipped.size() == ranks_.size()) {
      report("all " + std::to_string(ranks_.size()) + " ranks" +
             (static_cast<int>(ranks_.size()) < options_.num_ranks ? " of this host" : "") +
             " exited with code 77 (skipped)");
      return kExitSkipped;
    }
    if (!skipped.empty()) {
      report(describe_ranks(skipped) + " exited with code 77 (skipped) while other ranks did not");
    }
    // A genuine failure explains more than a skip, even when the skip came first.
    if (first_failure_ >= 0) return exit_code_of(ranks_[static_cast<size_t>(first_failure_)].wait_status);
    return skipped.empty() ? 0 : kExitMixedSkip;
  }

  // The job's rank number of this host's `local`-th process.
  int global_rank(int local) const { return options_.first_rank + local; }

  bool any_running() const {
    for (const Rank& process : ranks_) {
      if (process.running) return true;
    }
    return false;
  }

  std::vector<int> running_ranks() const {
    std::vector<int> running;
    for (size_t rank = 0; rank < ranks_.size(); ++rank) {
      if (ranks_[rank].running) running.push_back(global_rank(static_cast<int>(rank)));
    }
    return running;
  }

  const LaunchOptions& options_;
  std::vector<Rank> ranks_;
  AdoptedOrphans orphans_;  // before the ranks start: their children that outlive them come to us
  std::optional<TempSocketDir> temp_dir_;  // set when we chose the address; outlives ~Job's reaping
  bool exec_failed_ = false;
  bool stopping_ = false;
  bool timed_out_ = false;
  int interrupted_by_ = 0;
  bool sent_term_ = false;
  bool sent_kill_ = false;
  int first_failure_ = -1;
  std::string stop_reason_;
  Clock::time_point terminate_at_{};
  Clock::time_point kill_at_{};
  Clock::time_point give_up_at_{};
};

}  // namespace

int launch_ranks(const LaunchOptions& options) {
  if (options.num_ranks < 1 || options.num_ranks > kMaxRanks) {
    throw std::invalid_argument("launch_ranks: num_ranks=" + std::to_string(options.num_ranks) +
                                " must be between 1 and " + std::to_string(kMaxRanks));
  }
  if (options.argv.empty() || options.argv[0].empty()) {
    throw std::invalid_argument("launch_ranks: argv must name a program to run");
  }
  const int here = options.local_ranks > 0 ? options.local_ranks : options.num_ranks;
  if (options.local_ranks < 0 || options.first_rank < 0 || options.first_rank + here > options.num_ranks) {
    throw std::invalid_argument("launch_ranks: first_rank=" + std::to_string(options.first_rank) + " and local_ranks=" +
                                std::to_string(options.local_ranks) + " must name ranks inside [0, num_ranks=" +
                                std::to_string(options.num_ranks) + ")");
  }
  if (here < options.num_ranks) {
    // Ranks on other hosts reach rank 0's listener by TCP, and must prove the same secret.
    if (options.bootstrap_address.empty() || options.bootstrap_address.rfind("unix:", 0) == 0) {
      throw std::invalid_argument("launch_ranks: ranks on several hosts (this one runs " + std::to_string(here) + " of " +
                                  std::to_string(options.num_ranks) + ") need a TCP bootstrap address, HOST:PORT of "
                                  "rank 0's host, the same on every host, not '" + options.bootstrap_address + "'");
    }
    if (options.first_rank == 0 && resolves_to_loopback_only(options.bootstrap_address)) {
      // A warning, not a refusal: "hosts" on one machine (a test) meet on loopback fine.
      std::fprintf(stderr,
                   "epcomm-launch: warning: bootstrap address '%s' names only loopback on this host, where rank 0 "
                   "listens: ranks of other hosts cannot reach it; give this host's address on the network the "
                   "hosts share\n",
                   options.bootstrap_address.c_str());
    }
    if (!job_secret_given(options.extra_env)) {
      throw std::invalid_argument(std::string("launch_ranks: ranks on several hosts need ") + kEnvJobSecret +
                                  " set to the same value on every host (e.g. the output of `openssl rand -hex 32`), "
                                  "so that they can prove to each other they belong to one job");
    }
  }
  const auto bad_delay = [](milliseconds delay) { return delay < milliseconds{1} || delay > kMaxStopDelay; };
  if (bad_delay(options.kill_delay) || bad_delay(options.stuck_delay) || options.kill_signal <= 0 ||
      options.kill_signal >= NSIG) {
    throw std::invalid_argument("launch_ranks: kill_delay=" + std::to_string(options.kill_delay.count()) +
                                " ms and stuck_delay=" + std::to_string(options.stuck_delay.count()) +
                                " ms must be 1 ms to 1 hour, and kill_signal=" + std::to_string(options.kill_signal) +
                                " a signal");
  }
  if (options.timeout.count() < 0 || options.grace.count() < 0) {
    throw std::invalid_argument("launch_ranks: timeout=" + std::to_string(options.timeout.count()) +
                                " s and grace=" + std::to_string(options.grace.count()) + " s must not be negative");
  }
  for (const auto& [name, value] : options.extra_env) {
    if (name.empty() || name.find('=') != std::string::npos) {
      throw std::invalid_argument("launch_ranks: extra_env name '" + name + "' must be non-empty and have no '='");
    }
  }
  const ScopedSignals signals;
  Job job(options);
  return job.run();
}

std::string self_executable_path() {
  std::string path(256, '\0');
  while (true) {
    const ssize_t length = readlink("/proc/self/exe", path.data(), path.size());
    if (length < 0) throw_errno("cannot read /proc/self/exe");
    if (static_cast<size_t>(length) < path.size()) {
      path.resize(static_cast<size_t>(length));
      return path;
    }
    path.resize(path.size() * 2);  // possibly truncated: readlink does not say, so retry larger
  }
}

bool running_as_rank() { return std::getenv(kEnvRank) != nullptr; }

}  // namespace epcomm::tools
