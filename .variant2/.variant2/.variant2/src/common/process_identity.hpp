// Who a process is, as ranks tell each other at creation: pid and start time. Ranks that reach
// each other through the IPC transport share a host, so a rank can ask the operating system
// whether a peer's process still runs (runtime/peer_watchdog.hpp does, to notice dead ranks).
#pragma once

#include <cstdint>

namespace epcomm::detail {

// pid and start time (clock ticks since boot, /proc/PID/stat), which together name a process even
// after its pid is reused. pid 0: nobody (not watched).
struct ProcessIdentity {
  int64_t pid = 0;
  uint64_t start_ticks = 0;
  // The pid namespace the pid belongs to (its /proc/self/ns/pid inode; 0 if unknown): a peer in
  // another namespace (another container on the host) cannot be looked up by pid from here.
  uint64_t pid_namespace = 0;
};

// A rank whose process was found dead, and the pid it had.
struct DeadProcess {
  int rank = -1;
  int64_t pid = 0;
};

// This process.
ProcessIdentity current_process();
// Whether `process` still runs: false once it exited, is a zombie, or its pid names another
// process (a different start time). Without /proc, kill(pid, 0) alone decides.
bool process_alive(const ProcessIdentity& process);

}  // namespace epcomm::detail
