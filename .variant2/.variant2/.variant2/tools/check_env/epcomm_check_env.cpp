// epcomm-check-env: says whether this machine can run epcomm, and what to change if not.
#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <stdexcept>
#include <string>
#include <vector>

#include "check_env/advice.hpp"
#include "check_env/environment_report.hpp"
#include "check_env/report_format.hpp"
#include "support/launcher.hpp"

namespace {

constexpr int kExitOk = 0;
constexpr int kExitCannotWork = 1;
constexpr int kExitUsage = 2;

constexpr const char* kUsage =
    "Usage: epcomm-check-env [--ranks N] [--json]\n"
    "\n"
    "Reports what epcomm depends on here: CUDA driver and runtime versions, the GPUs, peer access\n"
    "and NVLink between them, MPS, NVSHMEM, InfiniBand devices and the relevant environment\n"
    "variables (NVSHMEM_*, NCCL_*, EPCOMM_*, CUDA_MPS_*, CUDA_VISIBLE_DEVICES, ...), then advice:\n"
    "fatal problems, warnings and what to set.\n"
    "\n"
    "Options:\n"
    "  --ranks N    judge a job of N ranks on this node, rank r on GPU r % (number of GPUs)\n"
    "               (1 to 1024; default: one rank per visible GPU)\n"
    "  --json       print one JSON object instead of the text report\n"
    "  -h, --help   show this help\n"
    "\n"
    "NVSHMEM's host library is looked for at $EPCOMM_NVSHMEM_LIB, $NVSHMEM_HOME/lib, the loader's\n"
    "path, then in pip's nvidia-nvshmem wheel (site-packages of $VIRTUAL_ENV, $CONDA_PREFIX, each\n"
    "python3 on $PATH, ~/.local, /usr/local, /usr).\n"
    "\n"
    "Exit status: 0 if nothing fatal was found; 1 if the configuration cannot work (including no\n"
    "usable GPU); 2 on usage errors.\n";

class UsageError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct Command {
  bool help = false;
  bool json = false;
  int ranks = 0;  // 0: one per visible GPU
};

int parse_ranks(const std::string& value) {
  errno = 0;
  char* end = nullptr;
  const long parsed = std::strtol(value.c_str(), &end, 10);
  if (value.empty() || *end != '\0' || errno == ERANGE) throw UsageError("--ranks '" + value + "' is not an integer");
  if (parsed < 1 || parsed > epcomm::tools::kMaxRanks) {
    throw UsageError("--ranks " + value + " must be between 1 and " + std::to_string(epcomm::tools::kMaxRanks));
  }
  return static_cast<int>(parsed);
}

Command parse_command_line(int argc, char** argv) {
  Command command;
  for (int index = 1; index < argc; ++index) {
    std::string arg = argv[index];
    if (arg == "-h" || arg == "--help") {
      command.help = true;
    } else if (arg == "--json") {
      command.json = true;
    } else if (arg == "--ranks") {
      if (index + 1 >= argc) throw UsageError("--ranks needs a value");
      command.ranks = parse_ranks(argv[++index]);
    } else if (arg.rfind("--ranks=", 0) == 0) {
      command.ranks = parse_ranks(arg.substr(std::string("--ranks=").size()));
    } else {
      throw UsageError("unknown argument '" + arg + "'");
    }
  }
  return command;
}

}  // namespace

int main(int argc, char** argv) {
  Command command;
  try {
    command = parse_command_line(argc, argv);
  } catch (const UsageError& error) {
    std::fprintf(stderr, "epcomm-check-env: %s\nRun 'epcomm-check-env --help' for usage.\n", error.what());
    return kExitUsage;
  }
  if (command.help) {
    std::fputs(kUsage, stdout);
    return kExitOk;
  }
  try {
    using namespace epcomm::tools;
    const EnvironmentReport report = collect_environment_report();
    const int ranks = command.ranks > 0 ? command.ranks : std::max(1, static_cast<int>(report.gpus.size()));
    const std::vector<Advice> advice = advise(report, ranks);
    const std::string text =
        command.json ? format_report_json(report, advice, ranks) + "\n" : format_report(report, advice, ranks);
    std::fputs(text.c_str(), stdout);
    return has_fatal(advice) ? kExitCannotWork : kExitOk;
  } catch (const std::exception& error) {
    // Collecting is written not to throw; this is for the unexpected (out of memory, say).
    std::fprintf(stderr, "epcomm-check-env: %s\n", error.what());
    return kExitCannotWork;
  }
}
