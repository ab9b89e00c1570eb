// EPCOMM_PROFILE's output formats, and background initialisation's error path (which this
// GPU-less machine exercises for real: the first call raises what the background thread hit).
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

#include "epcomm/buffer.hpp"
#include "epcomm/error.hpp"
#include "runtime/profiler.hpp"

namespace epcomm {
namespace {

using detail::ProfileRecord;

std::vector<ProfileRecord> sample_records() {
  auto record = [](ProfileRecord::Kind kind, const char* name, double start, double host, double device) {
    ProfileRecord r;
    r.kind = kind;
    r.name = name;
    r.host_start_us = start;
    r.host_us = host;
    r.device_start_us = device < 0 ? -1 : start;
    r.device_us = device;
    return r;
  };
  return {
      record(ProfileRecord::Kind::kInitPhase, "allocate, exchange and map peer buffers", 0, 12500, -1),
      record(ProfileRecord::Kind::kInitPhase, "load kernel modules", 12500, 3100, -1),
      record(ProfileRecord::Kind::kCall, "dispatch", 20000, 900, 3200),
      record(ProfileRecord::Kind::kCall, "combine", 24000, 40, -1),
      record(ProfileRecord::Kind::kCall, "dispatch", 30000, 50, 410),
      record(ProfileRecord::Kind::kCall, "dispatch", 31000, 45, 400),
  };
}

size_t count(const std::string& text, const std::string& piece) {
  size_t n = 0;
  for (size_t at = text.find(piece); at != std::string::npos; at = text.find(piece, at + 1)) ++n;
  return n;
}

TEST(ProfileTable, ShowsInitPhasesAndFirstVersusMedianPerCall) {
  const std::string table = detail::format_profile_table(sample_records(), 3);
  EXPECT_NE(table.find("epcomm profile, rank 3"), std::string::npos);
  EXPECT_NE(table.find("allocate, exchange and map peer buffers"), std::string::npos);
  EXPECT_NE(table.find("12.50"), std::string::npos);  // ms
  // dispatch: 3 calls, first host 900.0 us, median host 50.0, first device 3200.0, median device 410.0
  const size_t line = table.find("  dispatch");
  ASSERT_NE(line, std::string::npos) << table;
  const std::string dispatch = table.substr(line, table.find('\n', line) - line);
  for (const char* expected : {" 3 ", "900.0", "50.0", "3200.0", "410.0"}) {
    EXPECT_NE(dispatch.find(expected), std::string::npos) << expected << " missing in: " << dispatch;
  }
  // combine had no device time: shown as "-".
  const size_t combine = table.find("  combine");
  ASSERT_NE(combine, std::string::npos);
  EXPECT_NE(table.substr(combine, table.find('\n', combine) - combine).find(" - "), std::string::npos);
}

TEST(ProfileTrace, IsChromeTraceJsonWithHostAndDeviceTracks) {
  const std::string trace = detail::format_chrome_trace(sample_records(), 5);
  EXPECT_EQ(trace.rfind("{\"traceEvents\": [", 0), 0u);
  EXPECT_EQ(trace.back(), '\n');
  EXPECT_EQ(trace[trace.size() - 2], '}');
  // 6 host ranges + 3 device ranges, all complete events of rank (pid) 5.
  EXPECT_EQ(count(trace, "\"ph\": \"X\""), 9u);
  EXPECT_EQ(count(trace, "\"pid\": 5"), 9u);
  EXPECT_EQ(count(trace, "\"tid\": 1"), 3u);
  EXPECT_EQ(count(trace, "\"cat\": \"init\""), 2u);
  EXPECT_EQ(count(trace, "{"), count(trace, "}"));
  EXPECT_EQ(count(trace, "["), count(trace, "]"));
}

TEST(ProfileSwitch, FollowsTheEnvironment) {
  unsetenv("EPCOMM_PROFILE");
  EXPECT_FALSE(detail::Profiler::enabled_by_environment());
  setenv("EPCOMM_PROFILE", "0", 1);
  EXPECT_FALSE(detail::Profiler::enabled_by_environment());
  setenv("EPCOMM_PROFILE", "1", 1);
  EXPECT_TRUE(detail::Profiler::enabled_by_environment());
  unsetenv("EPCOMM_PROFILE");
}

TEST(ProfileTrace, WrittenIntoAFolderItMakes) {
  const std::string folder = ::testing::TempDir() + "epcomm-profile-test/nested";
  std::filesystem::remove_all(::testing::TempDir() + "epcomm-profile-test");
  setenv("EPCOMM_PROFILE_DIR", folder.c_str(), 1);
  {
    detail::Profiler profiler(7);
    { detail::Profiler::Scope phase(&profiler, ProfileRecord::Kind::kInitPhase, "a phase", nullptr, false); }
    profiler.write_reports();
  }
  unsetenv("EPCOMM_PROFILE_DIR");
  std::ifstream trace(folder + "/epcomm_profile_rank7.json");
  ASSERT_TRUE(trace.good()) << "no trace in " << folder;
  const std::string text((std::istreambuf_iterator<char>(trace)), std::istreambuf_iterator<char>());
  EXPECT_NE(text.find("\"a phase\""), std::string::npos) << text;
  std::filesystem::remove_all(::testing::TempDir() + "epcomm-profile-test");
}

bool gpu_usable() {
  int count = 0;
  const bool ok = cudaGetDeviceCount(&count) == cudaSuccess && count > 0;
  (void)cudaGetLastError();
  return ok;
}

TEST(BackgroundInitialization, ConstructorReturnsAndTheFirstCallRaisesItsError) {
  if (gpu_usable()) GTEST_SKIP() << "this checks the error path, which needs a machine without a GPU";
  BufferOptions options;
  options.initialize_in_background = true;
  options.preinitialize = true;
  Buffer buffer(make_socket_bootstrap("", 0, 1), options);  // returns at once, no throw
  for (int attempt = 0; attempt < 2; ++attempt) {            // raised at every call, not just the first
    try {
      buffer.barrier(nullptr);
      FAIL() << "expected the background initialisation's error";
    } catch (const Error& error) {
      EXPECT_EQ(error.code(), ErrorCode::kUnsupported);
      EXPECT_NE(std::string(error.what()).find("no CUDA device is usable"), std::string::npos) << error.what();
    }
  }
  EXPECT_FALSE(buffer.is_available());
}

TEST(ForegroundInitialization, ConstructorRaisesTheSameError) {
  if (gpu_usable()) GTEST_SKIP() << "this checks the error path, which needs a machine without a GPU";
  try {
    Buffer buffer(make_socket_bootstrap("", 0, 1), BufferOptions{});
    FAIL() << "expected an error";
  } catch (const Error& error) {
    EXPECT_EQ(error.code(), ErrorCode::kUnsupported);
  }
}

}  // namespace
}  // namespace epcomm
