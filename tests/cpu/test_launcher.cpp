// epcomm-launch, run as a real process on /bin/sh programs, plus the launcher library relaunching
// this test binary as ranks that meet through the socket bootstrap.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <gtest/gtest.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "support/launcher.hpp"
#include "common/temp_dir.hpp"
#include "epcomm/bootstrap.hpp"

extern char** environ;

namespace epcomm::tools {
namespace {

using namespace std::chrono_literals;
using test_support::TempDir;
using Clock = std::chrono::steady_clock;

constexpr const char* kLaunchPath = EPCOMM_LAUNCH_PATH;
// Killing ranks takes the grace period plus a moment; anything near `sleep 100` is a hang.
constexpr auto kStopsPromptly = 8s;

struct LaunchResult {
  int exit_code = -1;
  std::string output;  // stdout and stderr together
  Clock::duration elapsed{};
};

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// Starts epcomm-launch with `args`, its output going to a file in `dir` (never a pipe: an
// orphaned grandchild holding a pipe open would make reading it hang). Returns its pid, or -1.
pid_t start_launcher(const TempDir& dir, const std::vector<std::string>& args) {
  const std::string output_path = dir.file("launcher-output.txt");
  std::vector<std::string> strings = {kLaunchPath};
  strings.insert(strings.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (std::string& text : strings) argv.push_back(text.data());
  argv.push_back(nullptr);

  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, output_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
  posix_spawn_file_actions_adddup2(&actions, STDOUT_FILENO, STDERR_FILENO);
  pid_t pid = -1;
  const int rc = posix_spawn(&pid, kLaunchPath, &actions, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  if (rc != 0) {
    ADD_FAILURE() << "cannot start " << kLaunchPath << ": " << std::strerror(rc);
    return -1;
  }
  return pid;
}

LaunchResult wait_for_launcher(const TempDir& dir, pid_t pid, Clock::time_point started) {
  LaunchResult run;
  if (pid < 0) return run;
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  run.elapsed = Clock::now() - started;
  run.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  run.output = read_file(dir.file("launcher-output.txt"));
  return run;
}

// A TCP port nobody listens on right now (the kernel's pick), for a rendezvous address.
int free_tcp_port() {
  const int probe = socket(AF_INET, SOCK_STREAM, 0);
  if (probe < 0) return -1;
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t length = sizeof(address);
  int port = -1;
  if (bind(probe, reinterpret_cast<sockaddr*>(&address), sizeof(address)) == 0 &&
      getsockname(probe, reinterpret_cast<sockaddr*>(&address), &length) == 0) {
    port = ntohs(address.sin_port);
  }
  close(probe);
  return port;
}

LaunchResult run_launcher(const TempDir& dir, const std::vector<std::string>& args) {
  const auto started = Clock::now();
  return wait_for_launcher(dir, start_launcher(dir, args), started);
}

// `sh -c SCRIPT sh ARG...`: the script sees ARG as $1 and so on.
std::vector<std::string> shell(const std::string& script, const std::vector<std::string>& args = {}) {
  std::vector<std::string> command = {"--", "/bin/sh", "-c", script, "sh"};
  command.insert(command.end(), args.begin(), args.end());
  return command;
}

std::vector<std::string> concat_args(std::vector<std::string> head, const std::vector<std::string>& tail) {
  head.insert(head.end(), tail.begin(), tail.end());
  return head;
}

TEST(Launcher, EveryRankGetsItsOwnRankAndTheSharedJobVariables) {
  constexpr int kRanks = 4;
  const TempDir dir;
  // Each rank writes the job variables into a file named after its own rank.
  const std::string script =
      R"(test -n "$EPCOMM_RANK" && echo "$EPCOMM_NUM_RANKS $EPCOMM_BOOTSTRAP_ADDRESS" > "$1/rank.$EPCOMM_RANK")";
  const LaunchResult run = run_launcher(dir, concat_args({"-n", std::to_string(kRanks)}, shell(script, {dir.path()})));
  ASSERT_EQ(run.exit_code, 0) << run.output;
  std::set<std::string> contents;
  for (int rank = 0; rank < kRanks; ++rank) {
    const std::string path = dir.file("rank." + std::to_string(rank));
    ASSERT_TRUE(std::filesystem::exists(path)) << "rank " << rank << " did not run";
    contents.insert(read_file(path));
  }
  ASSERT_EQ(contents.size(), 1u) << "ranks disagree on the job variables";
  const std::string line = *contents.begin();
  EXPECT_EQ(line.rfind(std::to_string(kRanks) + " unix:", 0), 0u) << line;
  // The launcher's private socket directory is gone once the job is.
  const std::string socket_path = line.substr(line.find(':') + 1, line.size() - line.find(':') - 2);
  EXPECT_FALSE(std::filesystem::exists(std::filesystem::path(socket_path).parent_path())) << socket_path;
}

TEST(Launcher, EveryJobGetsItsOwnSecretSharedByItsRanks) {
  const TempDir dir;
  // Rank r writes its EPCOMM_JOB_SECRET into "<job>.<r>"; two jobs run one after the other.
  const std::string script = R"(printf %s "$EPCOMM_JOB_SECRET" > "$1/$2.$EPCOMM_RANK")";
  for (const char* job : {"first", "second"}) {
    const LaunchResult run = run_launcher(dir, concat_args({"-n", "3"}, shell(script, {dir.path(), job})));
    ASSERT_EQ(run.exit_code, 0) << run.output;
  }
  const std::string first = read_file(dir.file("first.0"));
  EXPECT_EQ(first.size(), 64u) << first;
  EXPECT_EQ(first.find_first_not_of("0123456789abcdef"), std::string::npos) << first;
  for (int rank = 1; rank < 3; ++rank) EXPECT_EQ(read_file(dir.file("first." + std::to_string(rank))), first);
  EXPECT_NE(read_file(dir.file("second.0")), first);
}

TEST(Launcher, PassesAnExplicitAddress) {
  const TempDir dir;
  const LaunchResult run =
      run_launcher(dir, concat_args({"-n", "2", "--address", "unix:/x/y.sock"},
                                    shell(R"(test "$EPCOMM_BOOTSTRAP_ADDRESS" = "unix:/x/y.sock")")));
  EXPECT_EQ(run.exit_code, 0) << run.output;
}

TEST(Launcher, FailingRankStopsTheOthersAfterTheGracePeriod) {
  const TempDir dir;
  const LaunchResult run = run_launcher(
      dir,
      concat_args({"-n", "3", "--grace", "1"}, shell(R"(if [ "$EPCOMM_RANK" = 1 ]; then exit 3; fi; exec sleep 100)")));
  EXPECT_EQ(run.exit_code, 3) << run.output;
  EXPECT_LT(run.elapsed, kStopsPromptly);
  EXPECT_NE(run.output.find("epcomm-launch: rank 1 exited with code 3"), std::string::npos) << run.output;
  EXPECT_NE(run.output.find("sending SIGTERM to ranks 0, 2"), std::string::npos) << run.output;
}

// True once no process has `pid` (an exited child of another process, not yet reaped, counts as gone).
bool process_gone(pid_t pid) {
  if (kill(pid, 0) != 0) return errno == ESRCH;
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  std::getline(stat, line);
  const size_t end_of_name = line.rfind(')');
  return end_of_name != std::string::npos && line.compare(end_of_name, 3, ") Z") == 0;
}

bool gone_within(pid_t pid, Clock::duration limit) {
  const auto until = Clock::now() + limit;
  while (!process_gone(pid) && Clock::now() < until) std::this_thread::sleep_for(10ms);
  return process_gone(pid);
}

// The pid a rank wrote to `path` (a process it started in the background), or -1.
pid_t pid_from(const std::string& path) {
  const std::string text = read_file(path);
  return text.empty() ? -1 : static_cast<pid_t>(std::stol(text));
}

// `pid`, left running by a rank of a job stopped because rank 1 exited 3, must be gone soon after
// the launcher returned (killed here if not, so no test leaves it behind).
void expect_stopped_with_the_job(pid_t pid, const std::string& what, const LaunchResult& run) {
  const bool stopped = gone_within(pid, 2s);
  if (!stopped) kill(pid, SIGKILL);
  EXPECT_TRUE(stopped) << what << " (pid " << pid << ") outlived the stopped job\n" << run.output;
  EXPECT_EQ(run.exit_code, 3) << run.output;
  EXPECT_LT(run.elapsed, kStopsPromptly);
}

TEST(Launcher, AStoppedJobStopsWhatItsRanksLeftRunning) {
  // Rank 1 starts a helper in the background and fails; rank 0 would run on. Stopping the job must
  // stop the helper too: it outlived its rank and would hold what it holds (a GPU, a port).
  const TempDir dir;
  const LaunchResult run = run_launcher(
      dir, concat_args({"-n", "2", "--grace", "1"},
                       shell(R"(if [ "$EPCOMM_RANK" = 1 ]; then sleep 100 & echo $! > "$1/helper.pid"; exit 3; fi;
                                exec sleep 100)",
                             {dir.path()})));
  const pid_t helper = pid_from(dir.file("helper.pid"));
  ASSERT_GT(helper, 0) << run.output;
  expect_stopped_with_the_job(helper, "the helper", run);
  EXPECT_NE(run.output.find("stopped process pid " + std::to_string(helper) + " that the ranks left running"),
            std::string::npos)
      << run.output;
}

TEST(Launcher, AStoppedJobAlsoStopsTheChildrenOfWhatItsRanksLeft) {
  // The helper a failing rank leaves has a child of its own, handed to the launcher only when the
  // helper ends (on its SIGTERM): it must be found and stopped too.
  const TempDir dir;
  const LaunchResult run = run_launcher(
      dir, concat_args({"-n", "2", "--grace", "0"},
                       shell(R"(if [ "$EPCOMM_RANK" = 1 ]; then
                                  sh -c 'sleep 100 & echo $! > "$1/grandchild.pid"; wait' sh "$1" &
                                  while [ ! -s "$1/grandchild.pid" ]; do sleep 0.05; done; exit 3
                                fi; exec sleep 100)",
                             {dir.path()})));
  const pid_t grandchild = pid_from(dir.file("grandchild.pid"));
  ASSERT_GT(grandchild, 0) << run.output;
  expect_stopped_with_the_job(grandchild, "the helper's child", run);
}

TEST(Launcher, AJobThatSucceededKeepsWhatItsRanksLeftRunning) {
  // A rank may start a daemon on purpose (an MPS control daemon, say): success stops nothing.
  const TempDir dir;
  const LaunchResult run =
      run_launcher(dir, concat_args({"-n", "1"}, shell(R"(sleep 100 & echo $! > "$1/daemon.pid"; exit 0)", {dir.path()})));
  const pid_t daemon = pid_from(dir.file("daemon.pid"));
  ASSERT_GT(daemon, 0) << run.output;
  const bool alive = !process_gone(daemon);
  kill(daemon, SIGKILL);
  EXPECT_TRUE(alive) << run.output;
  EXPECT_EQ(run.exit_code, 0) << run.output;
  EXPECT_EQ(run.output.find("left running"), std::string::npos) << run.output;
}

TEST(Launcher, RankKilledBySignalIsReported) {
  const TempDir dir;
  const LaunchResult run =
      run_launcher(dir, concat_args({"-n", "2", "--grace", "1"},
                                    shell(R"(if [ "$EPCOMM_RANK" = 0 ]; then kill -SEGV $$; fi; exec sleep 100)")));
  EXPECT_EQ(run.exit_code, 128 + SIGSEGV) << run.output;
  EXPECT_LT(run.elapsed, kStopsPromptly);
  EXPECT_NE(run.output.find("rank 0 was killed by signal 11"), std::string::npos) << run.output;
}

TEST(Launcher, AReaderThatWentDoesNotKillTheLauncher) {
  // `epcomm-launch ... 2>&1 | tee log` where the reader is gone (a Ctrl-C took tee too): the
  // launcher's reports fail, but it stops the job in order and returns the job's code, instead of
  // dying of SIGPIPE midway and leaving ranks to the death signal.
  int output[2];
  ASSERT_EQ(pipe2(output, O_CLOEXEC), 0);
  std::vector<std::string> strings = concat_args(
      {kLaunchPath, "-n", "2", "--grace", "1"}, shell(R"(if [ "$EPCOMM_RANK" = 0 ]; then exit 3; fi; exec sleep 100)"));
  std::vector<char*> argv;
  for (std::string& text : strings) argv.push_back(text.data());
  argv.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, output[1], STDOUT_FILENO);
  posix_spawn_file_actions_adddup2(&actions, output[1], STDERR_FILENO);
  close(output[0]);  // no reader from the start
  const auto started = Clock::now();
  pid_t pid = -1;
  const int rc = posix_spawn(&pid, kLaunchPath, &actions, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  close(output[1]);
  ASSERT_EQ(rc, 0) << std::strerror(rc);
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  EXPECT_TRUE(WIFEXITED(status)) << "killed by signal " << (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
  if (WIFEXITED(status)) {
    EXPECT_EQ(WEXITSTATUS(status), 3);
  }
  EXPECT_LT(Clock::now() - started, kStopsPromptly);
}

TEST(Launcher, AllRanksSkippingMeansSkipped) {
  const TempDir dir;
  const LaunchResult run = run_launcher(dir, concat_args({"-n", "3"}, shell("exit 77")));
  EXPECT_EQ(run.exit_code, kExitSkipped) << run.output;
}

TEST(Launcher, SomeRanksSkippingIsAFailure) {
  const TempDir dir;
  const LaunchResult run =
      run_launcher(dir, concat_args({"-n", "2"}, shell(R"(if [ "$EPCOMM_RANK" = 1 ]; then exit 77; fi; exit 0)")));
  EXPECT_EQ(run.exit_code, kExitMixedSkip) << run.output;
  EXPECT_NE(run.output.find("rank 1 exited with code 77 (skipped) while other ranks did not"), std::string::npos)
      << run.output;
}

TEST(Launcher, ARankThatSkipsStopsTheOthersAsSkippedNotFailed) {
  const TempDir dir;
  const LaunchResult run = run_launcher(
      dir, concat_args({"-n", "2", "--grace", "0"}, shell(R"(if [ "$EPCOMM_RANK" = 1 ]; then exit 77; fi; exec sleep 100)")));
  EXPECT_EQ(run.exit_code, kExitMixedSkip) << run.output;
  EXPECT_LT(run.elapsed, kStopsPromptly);
  EXPECT_NE(run.output.find("sending SIGTERM to rank 0 (rank 1 skipped (exit 77))"), std::string::npos) << run.output;
}

TEST(Launcher, TimeoutStopsEveryRank) {
  const TempDir dir;
  const LaunchResult run = run_launcher(dir, {"-n", "2", "--timeout", "1", "--", "sleep", "100"});
  EXPECT_EQ(run.exit_code, kExitTimedOut) << run.output;
  EXPECT_LT(run.elapsed, kStopsPromptly);
  EXPECT_NE(run.output.find("did not finish within its timeout of 1 s"), std::string::npos) << run.output;
}

TEST(Launcher, InterruptedLauncherStopsItsRanks) {
  constexpr int kRanks = 2;
  constexpr auto kStartupLimit = 10s;
  const TempDir dir;
  const auto started = Clock::now();
  const pid_t pid =
      start_launcher(dir, concat_args({"-n", std::to_string(kRanks)},
                                      shell(R"(touch "$1/started.$EPCOMM_RANK"; exec sleep 100)", {dir.path()})));
  ASSERT_GT(pid, 0);
  // Interrupt only once every rank runs, so the test exercises stopping them, not starting them.
  const auto all_started = [&] {
    for (int rank = 0; rank < kRanks; ++rank) {
      if (!std::filesystem::exists(dir.file("started." + std::to_string(rank)))) return false;
    }
    return true;
  };
  while (!all_started() && Clock::now() - started < kStartupLimit) std::this_thread::sleep_for(10ms);
  kill(pid, SIGTERM);
  const LaunchResult run = wait_for_launcher(dir, pid, started);
  EXPECT_EQ(run.exit_code, 128 + SIGTERM) << run.output;
  EXPECT_LT(run.elapsed, kStopsPromptly);
  EXPECT_NE(run.output.find("received signal 15"), std::string::npos) << run.output;
}

TEST(Launcher, ASignalTheCallerIgnoresStaysIgnored) {
  // Under nohup (SIGHUP ignored), a hangup must neither stop the job nor kill its ranks.
  constexpr int kRanks = 2;
  const TempDir dir;
  struct sigaction ignore {}, saved {};
  ignore.sa_handler = SIG_IGN;
  sigemptyset(&ignore.sa_mask);
  sigaction(SIGHUP, &ignore, &saved);
  const auto started = Clock::now();
  const pid_t pid = start_launcher(
      dir, concat_args({"-n", std::to_string(kRanks)},
                       shell(R"(touch "$1/started.$EPCOMM_RANK"; sleep 1; exit 0)", {dir.path()})));
  sigaction(SIGHUP, &saved, nullptr);
  ASSERT_GT(pid, 0);
  while (!std::filesystem::exists(dir.file("started.1")) && Clock::now() - started < 10s) std::this_thread::sleep_for(10ms);
  kill(pid, SIGHUP);
  const LaunchResult run = wait_for_launcher(dir, pid, started);
  EXPECT_EQ(run.exit_code, 0) << run.output;
  EXPECT_EQ(run.output.find("received signal"), std::string::npos) << run.output;
}

TEST(Launcher, ProgramThatCannotRunIsNamed) {
  const TempDir dir;
  LaunchResult run = run_launcher(dir, {"-n", "2", "--", "epcomm-no-such-program"});
  EXPECT_EQ(run.exit_code, kExitExecFailed) << run.output;
  EXPECT_NE(run.output.find("cannot find program 'epcomm-no-such-program' in PATH"), std::string::npos) << run.output;

  const std::string not_executable = dir.file("data.txt");
  std::ofstream(not_executable) << "not a program";
  run = run_launcher(dir, {"-n", "2", "--", not_executable});
  EXPECT_EQ(run.exit_code, kExitExecFailed) << run.output;
  EXPECT_NE(run.output.find("cannot execute '" + not_executable + "': Permission denied"), std::string::npos)
      << run.output;
}

TEST(Launcher, UsageErrorsNameTheArgument) {
  const TempDir dir;
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"-n", "0", "--", "true"}, "-n 0 must be between 1 and 1024"},
      {{"-n", "2000", "--", "true"}, "-n 2000 must be between 1 and 1024"},
      {{"-n", "two", "--", "true"}, "-n 'two' is not an integer"},
      {{"--timeout", "-1", "-n", "2", "--", "true"}, "--timeout -1 must be between 0 and"},
      {{"-n", "2", "--grace=soon", "--", "true"}, "--grace 'soon' is not an integer"},
      {{"-n", "2", "--frobnicate", "--", "true"}, "unknown option '--frobnicate'"},
      {{"-n"}, "-n needs a value"},
      {{"--", "true"}, "-n N (the number of ranks) is required"},
      {{"-n", "2"}, "no program to run"},
      {{"-n", "2", "--address", "", "--", "true"}, "--address must not be empty"},
      {{"-n", "4", "--first-rank", "3", "--local-ranks", "2", "--", "true"},
       "--first-rank 3 with --local-ranks 2 goes past -n 4"},
      {{"-n", "4", "--first-rank", "2", "--", "true"}, "--first-rank 2 needs --local-ranks"},
  };
  for (const auto& [args, message] : cases) {
    const LaunchResult run = run_launcher(dir, args);
    EXPECT_EQ(run.exit_code, 2) << message;
    EXPECT_NE(run.output.find("epcomm-launch: " + message), std::string::npos) << run.output;
  }
}

TEST(Launcher, HelpDescribesUsage) {
  const TempDir dir;
  const LaunchResult run = run_launcher(dir, {"--help"});
  EXPECT_EQ(run.exit_code, 0);
  EXPECT_NE(run.output.find("Usage: epcomm-launch -n N"), std::string::npos) << run.output;
}

TEST(LauncherLibrary, RejectsBadOptions) {
  LaunchOptions options;
  options.num_ranks = 0;
  options.argv = {"true"};
  EXPECT_THROW(launch_ranks(options), std::invalid_argument);
  options.num_ranks = 1;
  options.argv.clear();
  EXPECT_THROW(launch_ranks(options), std::invalid_argument);
}

TEST(LauncherLibrary, ARankThatOutlivesTheLastSignalIsNamedAndLeft) {
  // A rank stuck in the kernel (a driver call, I/O) outlives even SIGKILL, and waiting for it would
  // wait without bound. The stand-in: rank 1 ignores SIGTERM and the signal sent in SIGKILL's
  // place; rank 0 fails once rank 1 ignores them (its pid file is written after its trap).
  const TempDir dir;
  LaunchOptions options;
  options.num_ranks = 2;
  options.grace = 0s;
  options.kill_delay = 200ms;
  options.stuck_delay = 300ms;
  options.kill_signal = SIGUSR2;
  options.argv = {"/bin/sh", "-c",
                  R"(trap '' TERM USR2; echo $$ > "$1/rank.$EPCOMM_RANK"
                     if [ "$EPCOMM_RANK" = 0 ]; then while [ ! -s "$1/rank.1" ]; do sleep 0.05; done; exit 1; fi
                     exec sleep 30)",
                  "sh", dir.path()};
  testing::internal::CaptureStderr();
  const auto started = Clock::now();
  const int code = launch_ranks(options);
  const auto elapsed = Clock::now() - started;
  const std::string output = testing::internal::GetCapturedStderr();
  const pid_t stuck = pid_from(dir.file("rank.1"));
  if (stuck > 0 && kill(stuck, SIGKILL) == 0) waitpid(stuck, nullptr, 0);  // still this process's child
  EXPECT_EQ(code, 1) << output;
  EXPECT_LT(elapsed, kStopsPromptly);
  EXPECT_NE(output.find("rank 1 still running 300 ms after signal " + std::to_string(SIGUSR2)), std::string::npos)
      << output;
  EXPECT_NE(output.find("not waiting for it (pids " + std::to_string(stuck) + ")"), std::string::npos) << output;
}

LaunchOptions with_stop(std::chrono::milliseconds kill_delay, std::chrono::milliseconds stuck_delay, int signal_number) {
  LaunchOptions options;
  options.argv = {"true"};
  options.kill_delay = kill_delay;
  options.stuck_delay = stuck_delay;
  options.kill_signal = signal_number;
  return options;
}

TEST(LauncherLibrary, RejectsBadStopDelaysOrSignal) {
  EXPECT_THROW(launch_ranks(with_stop(0ms, 1s, SIGKILL)), std::invalid_argument);
  EXPECT_THROW(launch_ranks(with_stop(1s, 0ms, SIGKILL)), std::invalid_argument);
  EXPECT_THROW(launch_ranks(with_stop(1s, std::chrono::hours(2), SIGKILL)), std::invalid_argument);
  EXPECT_THROW(launch_ranks(with_stop(1s, 1s, 0)), std::invalid_argument);
  EXPECT_THROW(launch_ranks(with_stop(1s, 1s, NSIG)), std::invalid_argument);
  EXPECT_EQ(launch_ranks(with_stop(1ms, 1ms, SIGKILL)), 0);
}

// A share of the ranks (a job across hosts) needs a TCP address and a secret every host knows.
TEST(LauncherLibrary, AShareOfTheRanksNeedsATcpAddressAndASharedSecret) {
  LaunchOptions options;
  options.num_ranks = 4;
  options.first_rank = 2;
  options.local_ranks = 2;
  options.argv = {"true"};
  const auto error_of = [&] {
    try {
      launch_ranks(options);
    } catch (const std::invalid_argument& error) {
      return std::string(error.what());
    }
    return std::string();
  };
  EXPECT_NE(error_of().find("need a TCP bootstrap address"), std::string::npos);
  options.bootstrap_address = "127.0.0.1:1";
  if (std::getenv(kEnvJobSecret) == nullptr) {
    EXPECT_NE(error_of().find("EPCOMM_JOB_SECRET set to the same value on every host"), std::string::npos);
  }
  options.extra_env = {{kEnvJobSecret, ""}};  // an empty secret admits anyone: none
  if (std::getenv(kEnvJobSecret) == nullptr) {
    EXPECT_NE(error_of().find("EPCOMM_JOB_SECRET set to the same value on every host"), std::string::npos);
    // Also over one in the environment: the ranks would get the empty one.
    setenv(kEnvJobSecret, "a secret the ranks would not see", 1);
    EXPECT_NE(error_of().find("EPCOMM_JOB_SECRET set to the same value on every host"), std::string::npos);
    unsetenv(kEnvJobSecret);
  }
  options.local_ranks = 3;
  EXPECT_NE(error_of().find("must name ranks inside [0, num_ranks=4)"), std::string::npos);
}

TEST(LauncherLibrary, AnEmptySecretGivenIsReplacedByTheJobsOwn) {
  // On one host an empty EPCOMM_JOB_SECRET given (it would admit anyone) makes the launcher make
  // one, as if none were given: the ranks see that one alone.
  const TempDir dir;
  LaunchOptions options;
  options.num_ranks = 2;
  // Every EPCOMM_JOB_SECRET entry of the environment the rank was started with, as exec gave it
  // (a shell's own variables keep one value of a name given twice; getenv would see the first).
  options.argv = {"/bin/sh", "-c",
                  R"(tr '\0' '\n' < /proc/$$/environ | grep '^EPCOMM_JOB_SECRET=' > "$1/secret.$EPCOMM_RANK")", "sh",
                  dir.path()};
  options.extra_env = {{kEnvJobSecret, ""}};
  ASSERT_EQ(launch_ranks(options), 0);
  const std::string entries = read_file(dir.file("secret.0"));
  const std::string prefix = std::string(kEnvJobSecret) + "=";
  EXPECT_EQ(entries.size(), prefix.size() + 64 + 1) << entries;  // one entry, with a secret of 64 hex digits
  EXPECT_EQ(entries.rfind(prefix, 0), 0u) << entries;
  EXPECT_EQ(read_file(dir.file("secret.1")), entries);
}

TEST(LauncherLibrary, SelfExecutablePathIsThisTest) {
  const std::string path = self_executable_path();
  EXPECT_TRUE(std::filesystem::equivalent(path, "/proc/self/exe")) << path;
}

// Relaunches this binary as 3 ranks running only this test; in the ranks it takes the other branch.
TEST(LauncherEndToEnd, RanksMeetThroughTheBootstrap) {
  constexpr int kRanks = 3;
  constexpr const char* kExtraName = "EPCOMM_TEST_EXTRA";
  if (running_as_rank()) {
    const char* extra = std::getenv(kExtraName);
    EXPECT_STREQ(extra, "passed through");
    auto bootstrap = make_bootstrap_from_env(30s);
    ASSERT_EQ(bootstrap->num_ranks(), kRanks);
    const int mine = bootstrap->rank() * 10;
    int all[kRanks] = {};
    bootstrap->allgather(&mine, all, sizeof(mine));
    for (int rank = 0; rank < kRanks; ++rank) EXPECT_EQ(all[rank], rank * 10);
    bootstrap->barrier();
    return;
  }
  LaunchOptions options;
  options.num_ranks = kRanks;
  options.argv = {self_executable_path(), "--gtest_filter=LauncherEndToEnd.RanksMeetThroughTheBootstrap",
                  "--gtest_brief=1"};
  options.timeout = 60s;
  options.extra_env = {{kExtraName, "passed through"}};
  EXPECT_EQ(launch_ranks(options), 0);
}

// A job across hosts as its launchers run it: two epcomm-launch processes, each with half of the
// ranks, meeting over TCP with a secret both were given (on one machine here, as two hosts would).
TEST(LauncherEndToEnd, TwoLaunchersRunOneJobAsTwoHostsWould) {
  constexpr int kRanks = 4;
  constexpr int kPerLauncher = 2;
  if (running_as_rank()) {
    auto bootstrap = make_bootstrap_from_env(30s);
    ASSERT_EQ(bootstrap->num_ranks(), kRanks);
    const int mine = bootstrap->rank() + 100;
    int all[kRanks] = {};
    bootstrap->allgather(&mine, all, sizeof(mine));
    for (int rank = 0; rank < kRanks; ++rank) EXPECT_EQ(all[rank], rank + 100);
    bootstrap->barrier();
    return;
  }
  const int port = free_tcp_port();
  ASSERT_GT(port, 0);
  const std::string address = "127.0.0.1:" + std::to_string(port);
  const TempDir first_host, second_host;
  const auto args_for = [&](int first_rank) {
    return std::vector<std::string>{"-n", std::to_string(kRanks), "--first-rank", std::to_string(first_rank),
                                    "--local-ranks", std::to_string(kPerLauncher), "--address", address,
                                    "--timeout", "60", "--", self_executable_path(),
                                    "--gtest_filter=LauncherEndToEnd.TwoLaunchersRunOneJobAsTwoHostsWould",
                                    "--gtest_brief=1"};
  };
  const auto started = Clock::now();
  const char* inherited = std::getenv(kEnvJobSecret);
  const std::string kept = inherited != nullptr ? inherited : "";
  setenv(kEnvJobSecret, "5ec7e75ec7e75ec7e75ec7e75ec7e75ec7e75ec7e75ec7e75ec7e75ec7e75ec7", 1);
  const pid_t first = start_launcher(first_host, args_for(0));
  const pid_t second = start_launcher(second_host, args_for(kPerLauncher));
  if (inherited != nullptr) {
    setenv(kEnvJobSecret, kept.c_str(), 1);
  } else {
    unsetenv(kEnvJobSecret);
  }
  const LaunchResult first_run = wait_for_launcher(first_host, first, started);
  const LaunchResult second_run = wait_for_launcher(second_host, second, started);
  EXPECT_EQ(first_run.exit_code, 0) << first_run.output;
  EXPECT_EQ(second_run.exit_code, 0) << second_run.output;
}

}  // namespace
}  // namespace epcomm::tools
