// epcomm-launch: runs N copies of a program as the ranks of one job on this host.
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <stdexcept>
#include <string>

#include "support/launcher.hpp"

namespace {

using epcomm::tools::LaunchOptions;

constexpr int kExitUsage = 2;
constexpr int kExitLauncherError = 1;
constexpr long kMaxTimeoutSeconds = 7L * 24 * 3600;
constexpr long kMaxGraceSeconds = 3600;

constexpr const char* kUsage =
    "Usage: epcomm-launch -n N [--first-rank F --local-ranks K] [--timeout SECONDS] [--grace SECONDS]\n"
    "                     [--address ADDR] -- program [args...]\n"
    "\n"
    "Runs the ranks of one epcomm job on this host: all N, or ranks F .. F+K-1 of them. Rank r gets\n"
    "EPCOMM_RANK=r, EPCOMM_NUM_RANKS=N, EPCOMM_BOOTSTRAP_ADDRESS and EPCOMM_JOB_SECRET (a fresh\n"
    "random secret per job, unless one is in the environment already; ranks prove it to each\n"
    "other when they meet, so no other process can join the job).\n"
    "Across hosts, run one launcher per host with its share of the ranks (consecutive ranks per\n"
    "host), the same -n, --address IP:PORT of rank 0's host on the hosts' network, and the same\n"
    "EPCOMM_JOB_SECRET in every host's environment ($S made once, e.g. openssl rand -hex 32), e.g.\n"
    "with 8 GPUs per host and rank 0's host at 10.0.0.1:\n"
    "  host A: EPCOMM_JOB_SECRET=$S epcomm-launch -n 16 --first-rank 0 --local-ranks 8 --address 10.0.0.1:29500 -- prog\n"
    "  host B: EPCOMM_JOB_SECRET=$S epcomm-launch -n 16 --first-rank 8 --local-ranks 8 --address 10.0.0.1:29500 -- prog\n"
    "\n"
    "Options:\n"
    "  -n, --num-ranks N    number of ranks of the job, 1 to 1024 (required)\n"
    "  --first-rank F       the first rank this host runs (default 0)\n"
    "  --local-ranks K      how many ranks this host runs (default: all N)\n"
    "  --timeout SECONDS    stop all ranks after this long and exit 124 (default 0: no limit)\n"
    "  --grace SECONDS      after a rank fails, how long the others may run before SIGTERM (default 10)\n"
    "  --address ADDR       bootstrap address, unix:/path or HOST:PORT\n"
    "                       (default: a fresh unix socket under $TMPDIR or /tmp)\n"
    "  -h, --help           show this help\n"
    "\n"
    "When it stops a job (a rank failed, the timeout, a signal), it also stops what the ranks left\n"
    "running: processes they started that outlived them (SIGTERM, then SIGKILL after 5 s). A rank\n"
    "still running 60 s after SIGKILL (stuck in the kernel) is named and left.\n"
    "\n"
    "Exit status: 0 if every rank succeeded; 77 if every rank exited 77 (skipped); 1 if only some\n"
    "did; 124 on timeout; 127 if a rank's program could not be executed; 128+N if the launcher itself\n"
    "got signal N (this wins over everything else); otherwise the exit code of the first rank to fail\n"
    "(128+N if killed by signal N); 2 on usage errors. A rank that exits 1, 124 or 127 itself reads\n"
    "the same: the launcher's messages on stderr tell them apart.\n";

class UsageError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

long parse_number(const std::string& option, const std::string& value, long min, long max) {
  errno = 0;
  char* end = nullptr;
  const long parsed = std::strtol(value.c_str(), &end, 10);
  if (value.empty() || *end != '\0' || errno == ERANGE) {
    throw UsageError(option + " '" + value + "' is not an integer");
  }
  if (parsed < min || parsed > max) {
    throw UsageError(option + " " + value + " must be between " + std::to_string(min) + " and " + std::to_string(max));
  }
  return parsed;
}

struct Command {
  bool help = false;
  LaunchOptions options;
};

Command parse_command_line(int argc, char** argv) {
  Command command;
  bool have_num_ranks = false;
  int index = 1;
  while (index < argc) {
    std::string arg = argv[index++];
    if (arg == "--") break;
    if (arg.empty() || arg[0] != '-') {  // the program; what follows belongs to it
      --index;
      break;
    }
    if (arg == "-h" || arg == "--help") {
      command.help = true;
      return command;
    }
    std::string value;
    bool inline_value = false;
    const size_t equals = arg.find('=');
    if (arg.compare(0, 2, "--") == 0 && equals != std::string::npos) {  // --option=value
      value = arg.substr(equals + 1);
      arg = arg.substr(0, equals);
      inline_value = true;
    }
    if (arg != "-n" && arg != "--num-ranks" && arg != "--timeout" && arg != "--grace" && arg != "--address" &&
        arg != "--first-rank" && arg != "--local-ranks") {
      throw UsageError("unknown option '" + arg + "'");
    }
    if (!inline_value) {
      if (index >= argc) throw UsageError(arg + " needs a value");
      value = argv[index++];
    }
    if (arg == "-n" || arg == "--num-ranks") {
      command.options.num_ranks = static_cast<int>(parse_number(arg, value, 1, epcomm::tools::kMaxRanks));
      have_num_ranks = true;
    } else if (arg == "--timeout") {
      command.options.timeout = std::chrono::seconds(parse_number(arg, value, 0, kMaxTimeoutSeconds));
    } else if (arg == "--first-rank") {
      command.options.first_rank = static_cast<int>(parse_number(arg, value, 0, epcomm::tools::kMaxRanks - 1));
    } else if (arg == "--local-ranks") {
      command.options.local_ranks = static_cast<int>(parse_number(arg, value, 1, epcomm::tools::kMaxRanks));
    } else if (arg == "--grace") {
      command.options.grace = std::chrono::seconds(parse_number(arg, value, 0, kMaxGraceSeconds));
    } else {
      if (value.empty()) throw UsageError("--address must not be empty");
      command.options.bootstrap_address = value;
    }
  }
  if (!have_num_ranks) throw UsageError("-n N (the number of ranks) is required");
  if (command.options.first_rank > 0 && command.options.local_ranks == 0) {
    throw UsageError("--first-rank " + std::to_string(command.options.first_rank) +
                     " needs --local-ranks (how many of the -n ranks this host runs)");
  }
  const int here = command.options.local_ranks > 0 ? command.options.local_ranks : command.options.num_ranks;
  if (command.options.first_rank + here > command.options.num_ranks) {
    throw UsageError("--first-rank " + std::to_string(command.options.first_rank) + " with --local-ranks " +
                     std::to_string(here) + " goes past -n " + std::to_string(command.options.num_ranks));
  }
  if (index >= argc) throw UsageError("no program to run; give it after --");
  command.options.argv.assign(argv + index, argv + argc);
  return command;
}

}  // namespace

int main(int argc, char** argv) {
  Command command;
  try {
    command = parse_command_line(argc, argv);
  } catch (const UsageError& error) {
    std::fprintf(stderr, "epcomm-launch: %s\nRun 'epcomm-launch --help' for usage.\n", error.what());
    return kExitUsage;
  }
  if (command.help) {
    std::fputs(kUsage, stdout);
    return 0;
  }
  try {
    return epcomm::tools::launch_ranks(command.options);
  } catch (const std::invalid_argument& error) {  // options that cannot make a job: a usage error
    std::fprintf(stderr, "epcomm-launch: %s\n", error.what());
    return kExitUsage;
  } catch (const std::exception& error) {
    std::fprintf(stderr, "epcomm-launch: %s\n", error.what());
    return kExitLauncherError;
  }
}
