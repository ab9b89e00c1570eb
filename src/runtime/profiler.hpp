// EPCOMM_PROFILE=1: per-phase init timings, and per call the host overhead (wall time inside the
// API call) and the device time (CUDA events around the call's GPU work). Written when the Buffer
// is destroyed: a readable table on stderr, and a Chrome-trace JSON (opens in Perfetto) at
// $EPCOMM_PROFILE_DIR/epcomm_profile_rank<R>.json (default: the working directory). Every phase
// and call is also an NVTX range, for Nsight Systems. Costs nothing when the variable is unset.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <cuda_runtime_api.h>

namespace epcomm::detail {

struct ProfileRecord {
  enum class Kind { kInitPhase, kCall };
  Kind kind = Kind::kCall;
  std::string name;
  double host_start_us = 0;   // since the profiler started
  double host_us = 0;         // wall time on the host
  double device_start_us = -1;  // since the profiler started (aligned through a reference event); -1 if untimed
  double device_us = -1;
};

// Pure formatting, so it can be tested without a GPU.
std::string format_profile_table(const std::vector<ProfileRecord>& records, int rank);
std::string format_chrome_trace(const std::vector<ProfileRecord>& records, int rank);

class Profiler {
 public:
  static bool enabled_by_environment();  // EPCOMM_PROFILE set to anything but "" or "0"
  explicit Profiler(int rank);
  ~Profiler();
  Profiler(const Profiler&) = delete;
  Profiler& operator=(const Profiler&) = delete;

  // A timed region: host time always, device time when `stream` work is recorded (timed_stream).
  class Scope {
   public:
    // `device`: where `stream` lives (events must be made there); -1 for the current device.
    Scope(Profiler* profiler, ProfileRecord::Kind kind, const char* name, cudaStream_t stream, bool timed_stream,
          int device = -1);
    ~Scope();
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;

   private:
    Profiler* profiler_;
    size_t index_ = 0;
    cudaStream_t stream_ = nullptr;
    bool timed_stream_ = false;
    int device_ = -1;
  };

  // The records so far, with device times resolved (waits for the recorded events).
  std::vector<ProfileRecord> records();
  // Writes the table to stderr and the trace file; reports (never throws) if the file fails.
  void write_reports();

 private:
  friend class Scope;
  struct PendingEvents {
    cudaEvent_t start = nullptr;
    cudaEvent_t stop = nullptr;
    bool stopped = false;  // its scope has ended and recorded `stop`
  };
  double now_us() const;
  // Record `index`'s device times from its events, which it then frees; false (nothing done) if
  // they have not completed and `wait` is false.
  bool resolve(size_t index, bool wait);
  void resolve_completed();  // the records in order, up to the first still in flight
  static constexpr size_t kResolveEvery = 256;  // unresolved records that make a scope's end resolve

  int rank_;
  std::chrono::steady_clock::time_point origin_;
  cudaEvent_t reference_ = nullptr;
  double reference_host_us_ = 0;  // host time when reference_ was recorded: aligns the GPU track
  std::vector<ProfileRecord> records_;
  std::vector<PendingEvents> events_;  // parallel to records_
  size_t first_pending_ = 0;           // records before it are resolved, their events freed
};

// An NVTX range always (nearly free when no tool listens), and a profile record when profiling
// is on (profiler non-null).
class ProfiledRegion {
 public:
  ProfiledRegion(Profiler* profiler, ProfileRecord::Kind kind, const char* name, cudaStream_t stream = nullptr,
                 bool timed_stream = false, int device = -1);
  ~ProfiledRegion();
  ProfiledRegion(const ProfiledRegion&) = delete;
  ProfiledRegion& operator=(const ProfiledRegion&) = delete;

 private:
  std::unique_ptr<Profiler::Scope> scope_;  // pushes its own NVTX range
};

}  // namespace epcomm::detail
