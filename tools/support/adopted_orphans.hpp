// What a job's ranks leave behind: processes a rank started (a data loader, a helper server, a
// shell's background job) that outlive it. A stopped job must not leave them running, holding GPUs
// or ports; a job that succeeded may have left them on purpose (a daemon), so only a stop ends them.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <vector>

namespace epcomm::tools {

// While it lives, this process is the subreaper of its descendants (Linux's
// PR_SET_CHILD_SUBREAPER): a rank's children that outlive the rank become this process's children,
// not init's, so they can still be found and stopped. Ranks stay in the caller's process group (a
// terminal's Ctrl-C and a group kill reach them as before). Restores the earlier setting when it
// goes. Elsewhere than Linux it does nothing.
//
// "Adopted" means a child of this process that is neither a rank nor a child it had before: a
// process that another thread of this process starts meanwhile would count too, and so would the
// orphaned children of a child it had before (epcomm-launch has neither; a library caller of
// launch_ranks should start no process during a job). What stop_all leaves, and what a job that
// succeeded leaves, stay children of a library caller's process once the job is over.
class AdoptedOrphans {
 public:
  AdoptedOrphans();
  ~AdoptedOrphans();
  AdoptedOrphans(const AdoptedOrphans&) = delete;
  AdoptedOrphans& operator=(const AdoptedOrphans&) = delete;

  // Sends SIGTERM to every adopted process, gives them `patience` to exit, then sends SIGKILL and
  // gives them `patience` again; reaps them, and those they leave in turn. Returns the pids still
  // alive after that (stuck in the kernel: a driver call, I/O), which it leaves.
  std::vector<pid_t> stop_all(const std::vector<pid_t>& ranks, std::chrono::milliseconds patience);

  // Reaps adopted processes that have exited already, so none stays a zombie; signals nothing.
  void reap_exited(const std::vector<pid_t>& ranks);

  // Every pid that stop_all signalled, in order (for its report).
  const std::vector<pid_t>& stopped() const { return stopped_; }

 private:
  std::vector<pid_t> adopted(const std::vector<pid_t>& ranks) const;

  std::vector<pid_t> children_before_;
  std::vector<pid_t> stopped_;
  int previous_setting_ = 0;
  bool active_ = false;
};

// The pids whose parent is `parent`, from /proc (empty where /proc cannot be read).
std::vector<pid_t> children_of(pid_t parent);

}  // namespace epcomm::tools
