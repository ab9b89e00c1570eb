#include "support/adopted_orphans.hpp"

#include <dirent.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>
#ifdef __linux__
#include <sys/prctl.h>
#endif

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>

namespace epcomm::tools {
namespace {

using Clock = std::chrono::steady_clock;
// Each round reads every /proc/PID/stat: not more often than this.
constexpr std::chrono::milliseconds kPollInterval{50};

bool contains(const std::vector<pid_t>& pids, pid_t pid) {
  return std::find(pids.begin(), pids.end(), pid) != pids.end();
}

// The parent of `pid` from /proc/PID/stat ("pid (name) state ppid ..."; the name may hold spaces
// and parentheses, so the fields after its last ')' are read), or -1.
pid_t parent_of(pid_t pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(stat, line)) return -1;
  const size_t end_of_name = line.rfind(')');
  if (end_of_name == std::string::npos) return -1;
  std::istringstream fields(line.substr(end_of_name + 1));
  char state = 0;
  long parent = -1;
  if (!(fields >> state >> parent)) return -1;
  return static_cast<pid_t>(parent);
}

// Reaps `pid` if it has exited; true once it is gone.
bool reaped(pid_t pid) {
  int status = 0;
  pid_t done;
  do {
    done = waitpid(pid, &status, WNOHANG);
  } while (done < 0 && errno == EINTR);
  return done == pid || (done < 0 && errno == ECHILD);
}

}  // namespace

std::vector<pid_t> children_of(pid_t parent) {
  std::vector<pid_t> children;
  DIR* proc = opendir("/proc");
  if (proc == nullptr) return children;
  while (const dirent* entry = readdir(proc)) {
    char* end = nullptr;
    const long pid = std::strtol(entry->d_name, &end, 10);
    if (end == entry->d_name || *end != '\0' || pid <= 0) continue;
    if (parent_of(static_cast<pid_t>(pid)) == parent) children.push_back(static_cast<pid_t>(pid));
  }
  closedir(proc);
  return children;
}

AdoptedOrphans::AdoptedOrphans() {
#ifdef __linux__
  children_before_ = children_of(getpid());  // before the setting: nothing after it may throw
  active_ = prctl(PR_GET_CHILD_SUBREAPER, &previous_setting_) == 0 && prctl(PR_SET_CHILD_SUBREAPER, 1) == 0;
#endif
}

AdoptedOrphans::~AdoptedOrphans() {
#ifdef __linux__
  if (active_) prctl(PR_SET_CHILD_SUBREAPER, previous_setting_);
#endif
}

std::vector<pid_t> AdoptedOrphans::adopted(const std::vector<pid_t>& ranks) const {
  std::vector<pid_t> found;
  if (!active_) return found;
  for (const pid_t child : children_of(getpid())) {
    if (!contains(ranks, child) && !contains(children_before_, child)) found.push_back(child);
  }
  return found;
}

void AdoptedOrphans::reap_exited(const std::vector<pid_t>& ranks) {
  for (const pid_t child : adopted(ranks)) reaped(child);
}

std::vector<pid_t> AdoptedOrphans::stop_all(const std::vector<pid_t>& ranks, std::chrono::milliseconds patience) {
  const Clock::time_point kill_at = Clock::now() + patience;
  const Clock::time_point give_up_at = kill_at + patience;
  std::vector<pid_t> alive;
  while (true) {
    // Looked for again on every round: a process stopped here leaves its own children to us, and
    // it hands them over before it can be reaped, so a round that reaped one looks again at once.
    alive.clear();
    bool reaped_any = false;
    const bool killing = Clock::now() >= kill_at;
    for (const pid_t child : adopted(ranks)) {
      if (reaped(child)) {
        reaped_any = true;
        continue;
      }
      alive.push_back(child);
      if (!contains(stopped_, child)) {
        stopped_.push_back(child);
        kill(child, SIGTERM);
        kill(child, SIGCONT);  // a stopped process (Ctrl-Z, SIGTTIN) acts on SIGTERM only once running
      }
      if (killing) kill(child, SIGKILL);
    }
    if (Clock::now() >= give_up_at) return alive;
    if (reaped_any) continue;
    if (alive.empty()) return alive;
    std::this_thread::sleep_for(kPollInterval);
  }
}

}  // namespace epcomm::tools
