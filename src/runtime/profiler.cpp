#include "runtime/profiler.hpp"

#include <nvtx3/nvToolsExt.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include "common/cuda_check.hpp"
#include "runtime/scoped_device.hpp"

namespace epcomm::detail {
namespace {

constexpr double kMicrosecondsPerMillisecond = 1000.0;
constexpr int kHostThread = 0;    // Chrome-trace "tid" of host ranges
constexpr int kDeviceThread = 1;  // ... and of GPU work

double median_of(std::vector<double> values) {
  if (values.empty()) return -1;
  std::sort(values.begin(), values.end());
  return values[values.size() / 2];
}

std::string json_escape(const std::string& text) {
  std::string out;
  for (const char c : text) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out;
}

std::string fixed(double value) {
  if (value < 0) return "-";
  char text[32];
  std::snprintf(text, sizeof(text), "%.1f", value);
  return text;
}

}  // namespace

std::string format_profile_table(const std::vector<ProfileRecord>& records, int rank) {
  std::ostringstream out;
  out << "epcomm profile, rank " << rank << "\n";
  out << "init phase                               host ms\n";
  for (const ProfileRecord& record : records) {
    if (record.kind != ProfileRecord::Kind::kInitPhase) continue;
    char line[128];
    std::snprintf(line, sizeof(line), "  %-38s %8.2f\n", record.name.c_str(), record.host_us / kMicrosecondsPerMillisecond);
    out << line;
  }
  // Calls, grouped by name in order of first appearance.
  std::vector<std::string> order;
  std::map<std::string, std::vector<const ProfileRecord*>> calls;
  for (const ProfileRecord& record : records) {
    if (record.kind != ProfileRecord::Kind::kCall) continue;
    if (calls.find(record.name) == calls.end()) order.push_back(record.name);
    calls[record.name].push_back(&record);
  }
  out << "call                       count   host first   host median   device first   device median   (us)\n";
  for (const std::string& name : order) {
    const std::vector<const ProfileRecord*>& list = calls[name];
    std::vector<double> host, device;
    for (const ProfileRecord* record : list) {
      host.push_back(record->host_us);
      if (record->device_us >= 0) device.push_back(record->device_us);
    }
    char line[192];
    std::snprintf(line, sizeof(line), "  %-24s %6zu %12s %13s %14s %15s\n", name.c_str(), list.size(),
                  fixed(list.front()->host_us).c_str(), fixed(median_of(host)).c_str(),
                  fixed(list.front()->device_us).c_str(), fixed(median_of(device)).c_str());
    out << line;
  }
  return out.str();
}

std::string format_chrome_trace(const std::vector<ProfileRecord>& records, int rank) {
  std::ostringstream out;
  out << "{\"traceEvents\": [";
  bool first = true;
  auto event = [&](const ProfileRecord& record, int thread, double start_us, double duration_us, const char* category) {
    out << (first ? "\n" : ",\n") << "  {\"name\": \"" << json_escape(record.name) << "\", \"cat\": \"" << category
        << "\", \"ph\": \"X\", \"pid\": " << rank << ", \"tid\": " << thread << ", \"ts\": " << fixed(std::max(0.0, start_us))
        << ", \"dur\": " << fixed(std::max(0.0, duration_us)) << "}";
    first = false;
  };
  for (const ProfileRecord& record : records) {
    const char* category = record.kind == ProfileRecord::Kind::kInitPhase ? "init" : "call";
    event(record, kHostThread, record.host_start_us, record.host_us, category);
    if (record.device_us >= 0) event(record, kDeviceThread, record.device_start_us, record.device_us, "gpu");
  }
  out << "\n], \"displayTimeUnit\": \"ms\", \"otherData\": {\"rank\": " << rank << "}}\n";
  return out.str();
}

bool Profiler::enabled_by_environment() {
  const char* value = std::getenv("EPCOMM_PROFILE");
  return value != nullptr && value[0] != '\0' && std::string(value) != "0";
}

Profiler::Profiler(int rank) : rank_(rank), origin_(std::chrono::steady_clock::now()) {}

Profiler::~Profiler() {
  for (const PendingEvents& pending : events_) {
    if (pending.start) EPCOMM_CUDA_WARN(cudaEventDestroy(pending.start));
    if (pending.stop) EPCOMM_CUDA_WARN(cudaEventDestroy(pending.stop));
  }
  if (reference_) EPCOMM_CUDA_WARN(cudaEventDestroy(reference_));
}

double Profiler::now_us() const {
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - origin_).count();
}

Profiler::Scope::Scope(Profiler* profiler, ProfileRecord::Kind kind, const char* name, cudaStream_t stream,
                       bool timed_stream, int device)
    // Work being captured into a graph runs later, if ever: its events could not be timed (and a
    // reference event recorded into the capture would leave every later one untimed).
    : profiler_(profiler), stream_(stream), timed_stream_(timed_stream && !is_capturing(stream)), device_(device) {
  nvtxRangePushA(name);
  ProfileRecord record;
  record.kind = kind;
  record.name = name;
  record.host_start_us = profiler_->now_us();
  // The events first: a failure here leaves no record behind that would never be resolved.
  PendingEvents pending;
  if (timed_stream_) {
    try {
      int current = 0;
      EPCOMM_CUDA_CHECK(cudaGetDevice(&current));
      const ScopedDevice on_stream_device(device_ >= 0 ? device_ : current);
      if (profiler_->reference_ == nullptr) {
        EPCOMM_CUDA_CHECK(cudaEventCreate(&profiler_->reference_));
        EPCOMM_CUDA_CHECK(cudaEventRecord(profiler_->reference_, stream_));
        profiler_->reference_host_us_ = profiler_->now_us();
      }
      EPCOMM_CUDA_CHECK(cudaEventCreate(&pending.start));
      EPCOMM_CUDA_CHECK(cudaEventCreate(&pending.stop));
      EPCOMM_CUDA_CHECK(cudaEventRecord(pending.start, stream_));
    } catch (...) {
      if (pending.start) EPCOMM_CUDA_WARN(cudaEventDestroy(pending.start));
      if (pending.stop) EPCOMM_CUDA_WARN(cudaEventDestroy(pending.stop));
      nvtxRangePop();
      throw;
    }
  }
  index_ = profiler_->records_.size();
  profiler_->records_.push_back(record);
  profiler_->events_.push_back(pending);
}

Profiler::Scope::~Scope() {
  ProfileRecord& record = profiler_->records_[index_];
  if (timed_stream_) {
    int current = 0;
    if (cudaGetDevice(&current) == cudaSuccess) {
      const ScopedDevice on_stream_device(device_ >= 0 ? device_ : current);
      EPCOMM_CUDA_WARN(cudaEventRecord(profiler_->events_[index_].stop, stream_));
    }
    profiler_->events_[index_].stopped = true;
  }
  record.host_us = profiler_->now_us() - record.host_start_us;
  nvtxRangePop();
  // A long profiled run keeps only the events of calls still in flight (two per timed call).
  if (profiler_->records_.size() - profiler_->first_pending_ >= kResolveEvery) profiler_->resolve_completed();
}

bool Profiler::resolve(size_t index, bool wait) {
  PendingEvents& pending = events_[index];
  if (pending.start == nullptr) return true;  // untimed, or resolved already
  // A scope still open has not recorded `stop` (and an event never recorded reads as complete).
  if (!wait && !pending.stopped) return false;
  if (!wait && cudaEventQuery(pending.stop) == cudaErrorNotReady) {
    (void)cudaGetLastError();  // "not ready" is no error of the caller's next launch
    return false;
  }
  float start_ms = 0, duration_ms = 0;
  if (cudaEventSynchronize(pending.stop) == cudaSuccess &&
      cudaEventElapsedTime(&start_ms, reference_, pending.start) == cudaSuccess &&
      cudaEventElapsedTime(&duration_ms, pending.start, pending.stop) == cudaSuccess) {
    // The reference event was recorded at reference_host_us_: put GPU work on the host's clock.
    records_[index].device_start_us = std::max(0.0, reference_host_us_ + start_ms * kMicrosecondsPerMillisecond);
    records_[index].device_us = duration_ms * kMicrosecondsPerMillisecond;
  }
  (void)cudaGetLastError();  // untimed on failure; the table shows "-"
  EPCOMM_CUDA_WARN(cudaEventDestroy(pending.start));
  EPCOMM_CUDA_WARN(cudaEventDestroy(pending.stop));
  pending = PendingEvents{};
  return true;
}

void Profiler::resolve_completed() {
  while (first_pending_ < records_.size() && resolve(first_pending_, /*wait=*/false)) ++first_pending_;
}

std::vector<ProfileRecord> Profiler::records() {
  for (size_t i = first_pending_; i < records_.size(); ++i) resolve(i, /*wait=*/true);
  first_pending_ = records_.size();
  return records_;
}

void Profiler::write_reports() {
  const std::vector<ProfileRecord> all = records();
  std::fprintf(stderr, "%s", format_profile_table(all, rank_).c_str());
  const char* directory = std::getenv("EPCOMM_PROFILE_DIR");
  const std::string folder = directory && directory[0] ? directory : ".";
  std::error_code ignored;  // a folder that cannot be made shows as the write failing below
  std::filesystem::create_directories(folder, ignored);
  const std::string path = folder + "/epcomm_profile_rank" + std::to_string(rank_) + ".json";
  std::ofstream file(path);
  if (!file) {
    std::fprintf(stderr, "epcomm: warning: cannot write the profile trace to %s\n", path.c_str());
    return;
  }
  file << format_chrome_trace(all, rank_);
  std::fprintf(stderr, "epcomm: profile trace written to %s (open it in Perfetto)\n", path.c_str());
}

ProfiledRegion::ProfiledRegion(Profiler* profiler, ProfileRecord::Kind kind, const char* name, cudaStream_t stream,
                               bool timed_stream, int device) {
  if (profiler != nullptr) {
    scope_ = std::make_unique<Profiler::Scope>(profiler, kind, name, stream, timed_stream, device);
  } else {
    nvtxRangePushA(name);
  }
}

ProfiledRegion::~ProfiledRegion() {
  if (!scope_) nvtxRangePop();
}

}  // namespace epcomm::detail
