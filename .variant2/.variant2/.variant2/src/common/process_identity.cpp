#include "common/process_identity.hpp"

#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

namespace epcomm::detail {
namespace {

constexpr int kStartTimeField = 22;  // /proc/PID/stat, proc(5)

// State letter and start time from /proc/PID/stat; false if it cannot be read.
bool read_stat(int64_t pid, char& state, uint64_t& start_ticks) {
  std::ifstream file("/proc/" + std::to_string(pid) + "/stat");
  std::string text;
  if (!file || !std::getline(file, text)) return false;
  // The command name (field 2) is in parentheses and may hold spaces: parse after the last ')'.
  const size_t close = text.rfind(')');
  if (close == std::string::npos) return false;
  std::istringstream fields(text.substr(close + 1));
  std::string field;
  int number = 2;
  while (fields >> field) {
    ++number;
    if (number == 3) state = field.empty() ? '?' : field[0];
    if (number == kStartTimeField) {
      start_ticks = std::stoull(field);
      return true;
    }
  }
  return false;
}

}  // namespace

// The inode in "pid:[4026531836]", the target of /proc/self/ns/pid; 0 if unreadable.
static uint64_t own_pid_namespace() {
  char target[64] = {};
  const ssize_t length = readlink("/proc/self/ns/pid", target, sizeof(target) - 1);
  if (length <= 0) return 0;
  const std::string text(target, static_cast<size_t>(length));
  const size_t open = text.find('[');
  return open == std::string::npos ? 0 : std::strtoull(text.c_str() + open + 1, nullptr, 10);
}

ProcessIdentity current_process() {
  ProcessIdentity self;
  self.pid = static_cast<int64_t>(getpid());
  self.pid_namespace = own_pid_namespace();
  char state = '?';
  if (!read_stat(self.pid, state, self.start_ticks)) self.start_ticks = 0;
  return self;
}

bool process_alive(const ProcessIdentity& process) {
  if (process.pid <= 0) return true;
  if (kill(static_cast<pid_t>(process.pid), 0) != 0 && errno == ESRCH) return false;
  char state = '?';
  uint64_t start_ticks = 0;
  if (!read_stat(process.pid, state, start_ticks)) return true;  // no /proc here: kill() said alive
  if (state == 'Z' || state == 'X') return false;
  return process.start_ticks == 0 || start_ticks == process.start_ticks;
}

}  // namespace epcomm::detail
