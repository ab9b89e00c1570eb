// epcomm-check-env's library: collecting the report on this machine (which may have no GPU or
// driver), the advice rules on made-up machines, and both output formats.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <optional>
#include <string>
#include <vector>

#include "check_env/advice.hpp"
#include "common/constants.hpp"
#include "check_env/environment_report.hpp"
#include "check_env/report_format.hpp"
#include "common/json_checker.hpp"
#include "common/temp_dir.hpp"

namespace epcomm::tools {
namespace {

using test_support::JsonChecker;
using test_support::TempDir;

constexpr int64_t kH200Bytes = 150'000'000'000;

// Sets a variable for one test and puts back what was there before.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    setenv(name, value, 1);
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;
  ~ScopedEnv() {
    if (old_) {
      setenv(name_.c_str(), old_->c_str(), 1);
    } else {
      unsetenv(name_.c_str());
    }
  }

 private:
  std::string name_;
  std::optional<std::string> old_;
};

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

// A healthy node: `gpus` H200s, all pairs joined by NVLink, multicast switched off.
EnvironmentReport hopper_node(int gpus) {
  EnvironmentReport report;
  report.runtime_version = 13000;
  report.driver_version = 13000;
  for (int i = 0; i < gpus; ++i) {
    report.gpus.push_back({i, "NVIDIA H200", "0000:0" + std::to_string(i) + ":00.0", 132, kH200Bytes, 9, 0, ""});
  }
  for (int from = 0; from < gpus; ++from) {
    for (int to = 0; to < gpus; ++to) {
      if (from == to) continue;
      PeerLink link;
      link.from = from;
      link.to = to;
      link.can_access_peer = link.access_supported = link.native_atomics = true;
      link.performance_rank = 0;
      link.nvlink = true;
      report.peers.push_back(link);
    }
  }
  report.mps_pipe_directory = "/tmp/nvidia-mps";
  report.nvshmem.detail = "libnvshmem_host.so.3: cannot open shared object file";
  report.infiniband_error = "/sys/class/infiniband: No such file or directory";
  report.host_addresses = {"10.0.0.7", "[2001:db8::7]"};
  report.environment = {{"NCCL_NVLS_ENABLE", "0"}, {"NVSHMEM_DISABLE_NVLS", "1"}, {"TORCH_SYMM_MEM_DISABLE_MULTICAST", "1"}};
  return report;
}

EnvironmentReport no_gpu_node() {
  EnvironmentReport report = hopper_node(0);
  report.driver_version = 0;
  report.gpu_error = "cudaGetDeviceCount: cudaErrorInsufficientDriver (CUDA driver version is insufficient)";
  return report;
}

std::vector<Advice> of_severity(const std::vector<Advice>& advice, Severity severity) {
  std::vector<Advice> chosen;
  std::copy_if(advice.begin(), advice.end(), std::back_inserter(chosen),
               [&](const Advice& a) { return a.severity == severity; });
  return chosen;
}

// The first entry of `severity` whose text contains `part`, or nullptr.
const Advice* find_advice(const std::vector<Advice>& advice, Severity severity, const std::string& part) {
  for (const Advice& entry : advice) {
    if (entry.severity == severity && contains(entry.text, part)) return &entry;
  }
  return nullptr;
}

std::string describe(const std::vector<Advice>& advice) {
  std::string text;
  for (const Advice& entry : advice) text += std::string(severity_name(entry.severity)) + ": " + entry.text + "\n";
  return text;
}

// ---- Collecting on this machine ----

TEST(CheckEnvCollect, NeverFailsAndExplainsMissingGpus) {
  const EnvironmentReport report = collect_environment_report();
  EXPECT_GT(report.runtime_version, 0);
  if (report.gpus.empty()) {
    EXPECT_FALSE(report.gpu_error.empty()) << "no GPU, but no reason given";
    EXPECT_TRUE(report.peers.empty());
  } else {
    for (const GpuInfo& gpu : report.gpus) {
      if (!gpu.error.empty()) continue;
      EXPECT_FALSE(gpu.name.empty());
      EXPECT_GT(gpu.sm_count, 0);
      EXPECT_GT(gpu.memory_bytes, 0);
      EXPECT_FALSE(gpu.pci_bus_id.empty());
    }
    EXPECT_EQ(report.peers.size(), report.gpus.size() * (report.gpus.size() - 1));
  }
}

TEST(CheckEnvCollect, NoGpuHereGivesFatalAdvice) {
  const EnvironmentReport report = collect_environment_report();
  if (!report.gpus.empty()) GTEST_SKIP() << "this machine has a GPU";
  const std::vector<Advice> advice = advise(report, 1);
  EXPECT_TRUE(has_fatal(advice));
  EXPECT_NE(find_advice(advice, Severity::kFatal, "no CUDA GPU"), nullptr) << describe(advice);
}

TEST(CheckEnvCollect, ListsOnlyRelevantVariables) {
  const ScopedEnv epcomm("EPCOMM_CHECK_ENV_TEST", "1");
  const ScopedEnv nccl("NCCL_FOO", "bar");
  const ScopedEnv lookalike("XNCCL_FOO", "not mine");
  const auto environment = collect_environment_report().environment;
  const auto has = [&](const std::string& name, const std::string& value) {
    return std::find(environment.begin(), environment.end(), std::make_pair(name, value)) != environment.end();
  };
  EXPECT_TRUE(has("EPCOMM_CHECK_ENV_TEST", "1"));
  EXPECT_TRUE(has("NCCL_FOO", "bar"));
  for (const auto& [name, value] : environment) {
    EXPECT_TRUE(is_relevant_variable(name)) << name;
    EXPECT_NE(name, "XNCCL_FOO");
    EXPECT_NE(name, "PATH");
  }
  EXPECT_TRUE(std::is_sorted(environment.begin(), environment.end()));
}

TEST(CheckEnvCollect, RelevantEnvironmentFromAnArray) {
  std::vector<std::string> entries = {"PATH=/bin",
                                      "NCCL_B=2",
                                      "EPCOMM_A=x=y",
                                      "CUDA_VISIBLE_DEVICES=0,1",
                                      "CUDA_VISIBLE_DEVICES_EXTRA=1",
                                      "CUDA_MPS_PIPE_DIRECTORY=/p",
                                      "TORCH_SYMM_MEM_DISABLE_MULTICAST=1",
                                      "NVSHMEM_DISABLE_NVLS=",
                                      "NO_EQUALS_SIGN"};
  std::vector<char*> array;
  for (std::string& entry : entries) array.push_back(entry.data());
  array.push_back(nullptr);
  const std::vector<std::pair<std::string, std::string>> expected = {
      {"CUDA_MPS_PIPE_DIRECTORY", "/p"}, {"CUDA_VISIBLE_DEVICES", "0,1"},
      {"EPCOMM_A", "x=y"},               {"NCCL_B", "2"},
      {"NVSHMEM_DISABLE_NVLS", ""},      {"TORCH_SYMM_MEM_DISABLE_MULTICAST", "1"}};
  EXPECT_EQ(collect_relevant_environment(array.data()), expected);
}

TEST(CheckEnvCollect, TheJobSecretIsSaidToBeSetNotShown) {
  std::string secret = "EPCOMM_JOB_SECRET=hunter2-abcdef";
  std::vector<char*> array = {secret.data(), nullptr};
  const auto collected = collect_relevant_environment(array.data());
  ASSERT_EQ(collected.size(), 1u);
  EXPECT_EQ(collected[0].first, "EPCOMM_JOB_SECRET");
  EXPECT_EQ(collected[0].second, "<set, 14 characters, not shown>");
  EXPECT_EQ(collected[0].second.find("hunter2"), std::string::npos);
}

TEST(CheckEnvCollect, MpsControlPipe) {
  const TempDir dir;
  EXPECT_FALSE(mps_control_pipe_exists(dir.path()));
  std::ofstream(dir.file("control")).put('\n');
  EXPECT_TRUE(mps_control_pipe_exists(dir.path()));
  {
    const ScopedEnv pipe("CUDA_MPS_PIPE_DIRECTORY", dir.path().c_str());
    EXPECT_EQ(mps_pipe_directory(), dir.path());
  }
  {
    const ScopedEnv pipe("CUDA_MPS_PIPE_DIRECTORY", "");
    EXPECT_EQ(mps_pipe_directory(), "/tmp/nvidia-mps");
  }
}

TEST(CheckEnvCollect, InfinibandFromSysfs) {
  const TempDir root;
  namespace fs = std::filesystem;
  fs::create_directories(root.path() + "/mlx5_1/ports/1");  // no state file: unreadable
  fs::create_directories(root.path() + "/mlx5_0/ports/2");
  fs::create_directories(root.path() + "/mlx5_0/ports/1");
  std::ofstream(root.path() + "/mlx5_0/ports/1/state") << "4: ACTIVE\n";
  std::ofstream(root.path() + "/mlx5_0/ports/2/state") << "1: DOWN\n";
  std::string error;
  const std::vector<InfinibandDevice> devices = collect_infiniband(root.path(), &error);
  ASSERT_EQ(devices.size(), 2u);
  EXPECT_EQ(devices[0].name, "mlx5_0");
  ASSERT_EQ(devices[0].ports.size(), 2u);
  EXPECT_EQ(devices[0].ports[0].port, "1");
  EXPECT_EQ(devices[0].ports[0].state, "4: ACTIVE");
  EXPECT_EQ(devices[0].ports[1].state, "1: DOWN");
  EXPECT_EQ(devices[1].name, "mlx5_1");
  ASSERT_EQ(devices[1].ports.size(), 1u);
  EXPECT_EQ(devices[1].ports[0].state, "unknown");
  EXPECT_TRUE(error.empty());

  EXPECT_TRUE(collect_infiniband(root.file("missing"), &error).empty());
  EXPECT_TRUE(contains(error, "missing")) << error;
}

TEST(CheckEnvCollect, NvshmemPathVariable) {
  {
    const ScopedEnv path("EPCOMM_NVSHMEM_LIB", "/nonexistent/libnvshmem_host.so.3");
    const NvshmemInfo info = find_nvshmem();
    if (!info.found) {
      EXPECT_TRUE(contains(info.detail, "/nonexistent/libnvshmem_host.so.3")) << info.detail;
    }
  }
  {
    // Any loadable library stands in for NVSHMEM: found, where it was loaded from, no version.
    const ScopedEnv path("EPCOMM_NVSHMEM_LIB", "libc.so.6");
    const NvshmemInfo info = find_nvshmem();
    ASSERT_TRUE(info.found) << info.detail;
    EXPECT_TRUE(contains(info.path, "libc")) << info.path;
    EXPECT_EQ(info.version, "unknown");
  }
}

TEST(CheckEnvCollect, PluginPathVariable) {
  {
    const ScopedEnv path("EPCOMM_NVSHMEM_PLUGIN", "/nonexistent/libepcomm_nvshmem.so");
    const PluginInfo info = find_plugin();
    if (!info.found) {
      EXPECT_TRUE(contains(info.detail, "/nonexistent/libepcomm_nvshmem.so")) << info.detail;
    }
  }
  {
    // A library that loads but has no entry point is named as not a plugin.
    const ScopedEnv path("EPCOMM_NVSHMEM_PLUGIN", "libc.so.6");
    const std::vector<std::string> candidates = plugin_candidates();
    ASSERT_FALSE(candidates.empty());
    EXPECT_EQ(candidates.front(), "libc.so.6");
    const PluginInfo info = find_plugin();
    if (!info.found) {
      EXPECT_TRUE(contains(info.detail, "libc.so.6: not an epcomm NVSHMEM plugin")) << info.detail;
    }
  }
}

TEST(CheckEnvAdvice, NvshmemWithoutThePluginSaysToRebuild) {
  EnvironmentReport report = hopper_node(2);
  report.nvshmem.found = true;
  report.nvshmem.version = "3.4.5";
  report.plugin.detail = "no libepcomm_nvshmem.so beside this build";
  const std::vector<Advice> advice = advise(report, 2);
  EXPECT_NE(find_advice(advice, Severity::kInfo, "epcomm's NVSHMEM plugin is not"), nullptr) << describe(advice);
  report.plugin.found = true;
  EXPECT_EQ(find_advice(advise(report, 2), Severity::kInfo, "plugin is not"), nullptr);
}

TEST(CheckEnvCollect, NvshmemFromNvshmemHomeAndPipWheels) {
  namespace fs = std::filesystem;
  const TempDir root;
  const std::string home_library = root.path() + "/nvshmem/lib/libnvshmem_host.so.3";
  const std::string wheel_library =
      root.path() + "/venv/lib/python3.12/site-packages/nvidia/nvshmem/lib/libnvshmem_host.so.3";
  for (const std::string& library : {home_library, wheel_library}) {
    fs::create_directories(fs::path(library).parent_path());
    std::ofstream(library) << "";
  }
  const ScopedEnv home("NVSHMEM_HOME", (root.path() + "/nvshmem").c_str());
  const ScopedEnv venv("VIRTUAL_ENV", (root.path() + "/venv").c_str());
  const std::vector<std::string> candidates = nvshmem_candidates();
  const auto at = [&](const std::string& path) { return std::find(candidates.begin(), candidates.end(), path) - candidates.begin(); };
  const auto end = static_cast<std::ptrdiff_t>(candidates.size());
  ASSERT_LT(at(home_library), end);
  ASSERT_LT(at(wheel_library), end);
  ASSERT_LT(at("libnvshmem_host.so.3"), end);
  EXPECT_LT(at(home_library), at("libnvshmem_host.so.3"));  // NVSHMEM_HOME before the loader's path
  EXPECT_LT(at("libnvshmem_host.so.3"), at(wheel_library));  // which wins over a pip wheel
}

TEST(CheckEnvCollect, CudaVersionString) {
  EXPECT_EQ(cuda_version_string(13000), "13.0");
  EXPECT_EQ(cuda_version_string(12080), "12.8");
  EXPECT_EQ(cuda_version_string(0), "none");
}

// ---- Advice on made-up machines ----

TEST(CheckEnvAdvice, HealthyNvlinkNodeHasNothingToFix) {
  const std::vector<Advice> advice = advise(hopper_node(2), 2);
  EXPECT_TRUE(of_severity(advice, Severity::kFatal).empty()) << describe(advice);
  EXPECT_TRUE(of_severity(advice, Severity::kWarning).empty()) << describe(advice);
}

TEST(CheckEnvAdvice, NoGpuIsFatalAndSaysWhy) {
  const std::vector<Advice> advice = advise(no_gpu_node(), 1);
  ASSERT_TRUE(has_fatal(advice));
  EXPECT_EQ(advice.front().severity, Severity::kFatal);  // fatal entries come first
  const Advice* fatal = find_advice(advice, Severity::kFatal, "no CUDA GPU");
  ASSERT_NE(fatal, nullptr) << describe(advice);
  EXPECT_TRUE(contains(fatal->text, "cudaErrorInsufficientDriver"));
  EXPECT_TRUE(contains(fatal->text, "no NVIDIA driver"));

  EnvironmentReport hidden = no_gpu_node();
  hidden.driver_version = 13000;
  hidden.environment.emplace_back("CUDA_VISIBLE_DEVICES", "");
  EXPECT_NE(find_advice(advise(hidden, 1), Severity::kFatal, "CUDA_VISIBLE_DEVICES=''"), nullptr);

  EnvironmentReport old_driver = no_gpu_node();
  old_driver.driver_version = 12020;
  EXPECT_NE(find_advice(advise(old_driver, 1), Severity::kFatal, "update the NVIDIA driver"), nullptr);
}

TEST(CheckEnvAdvice, PairWithoutPeerAccessIsFatalWhenRanksSpanIt) {
  EnvironmentReport report = hopper_node(2);
  for (PeerLink& link : report.peers) link.can_access_peer = false;
  const std::vector<Advice> advice = advise(report, 2);
  EXPECT_NE(find_advice(advice, Severity::kFatal, "GPUs 0 and 1 cannot access each other's memory"), nullptr)
      << describe(advice);
  // One rank uses GPU 0 only, so the pair does not matter.
  EXPECT_FALSE(has_fatal(advise(report, 1))) << describe(advise(report, 1));
}

TEST(CheckEnvAdvice, OneWayPeerAccessIsFatalToo) {
  EnvironmentReport report = hopper_node(3);
  report.peers.at(0).can_access_peer = false;  // 0 -> 1
  const std::vector<Advice> advice = advise(report, 3);
  const Advice* fatal = find_advice(advice, Severity::kFatal, "GPUs 0 and 1");
  ASSERT_NE(fatal, nullptr) << describe(advice);
  EXPECT_TRUE(contains(fatal->text, "0->1: no, 1->0: yes")) << fatal->text;
  EXPECT_EQ(of_severity(advice, Severity::kFatal).size(), 1u) << describe(advice);
}

TEST(CheckEnvAdvice, PciePeerAccessIsAWarning) {
  EnvironmentReport report = hopper_node(2);
  for (PeerLink& link : report.peers) link.nvlink = false;
  const std::vector<Advice> advice = advise(report, 2);
  EXPECT_FALSE(has_fatal(advice));
  EXPECT_NE(find_advice(advice, Severity::kWarning, "without NVLink"), nullptr) << describe(advice);
}

// NVLink in islands: the advice says which nodes normal mode makes of them, by the library's rule.
TEST(CheckEnvAdvice, NvlinkIslandsSayWhichNodesNormalModeMakes) {
  const auto with_islands = [](int gpus, int gpus_per_island) {
    EnvironmentReport report = hopper_node(gpus);
    for (PeerLink& link : report.peers) link.nvlink = link.from / gpus_per_island == link.to / gpus_per_island;
    return report;
  };
  const std::vector<Advice> pairs = advise(with_islands(8, 2), 8);
  const Advice* nodes = find_advice(pairs, Severity::kInfo, "normal mode makes 4 node(s) of 2 ranks, one per island");
  EXPECT_NE(nodes, nullptr) << describe(pairs);
  // Two ranks per GPU (MPS), rank r on GPU r % 8: an island's ranks are not consecutive (0, 1, 8, 9),
  // so the islands cannot be nodes, and 16 ranks on the host split by count: 2 nodes of 8.
  const std::vector<Advice> shared = advise(with_islands(8, 2), 16);
  EXPECT_NE(find_advice(shared, Severity::kInfo, "joins rank 0 to rank 8, outside rank 0's island (ranks 0-1)"),
            nullptr)
      << describe(shared);
  EXPECT_NE(find_advice(shared, Severity::kInfo, "nodes follow the host, 2 node(s) of 8 ranks (ranks placed as rank "
                                                 "r on GPU r % 8)"),
            nullptr)
      << describe(shared);
  // Islands of unequal size cannot be nodes: said, with the library's reason; 3 ranks stay one node.
  EnvironmentReport uneven = hopper_node(3);
  for (PeerLink& link : uneven.peers) link.nvlink = (link.from < 2) == (link.to < 2);
  EXPECT_NE(find_advice(advise(uneven, 3), Severity::kInfo, "joins ranks 0-1 and ranks 2-2: islands of unequal size): "
                                                             "normal mode's nodes follow the host, 1 node(s) of 3 ranks"),
            nullptr)
      << describe(advise(uneven, 3));
  // Some links unknown, the rest apart in pairs: unknown counts as joined, as the library counts it.
  EnvironmentReport unknown = with_islands(4, 2);
  for (PeerLink& link : unknown.peers) {
    if (link.from / 2 == link.to / 2) link.nvlink.reset();
  }
  EXPECT_NE(find_advice(advise(unknown, 4), Severity::kInfo, "makes 2 node(s) of 2 ranks, one per island"), nullptr)
      << describe(advise(unknown, 4));
  // All joined, or none: nothing about nodes (the PCIe warning covers the second).
  EXPECT_EQ(find_advice(advise(hopper_node(8), 8), Severity::kInfo, "nodes"), nullptr);
  EXPECT_EQ(find_advice(advise(with_islands(4, 1), 4), Severity::kInfo, "nodes"), nullptr);
  // One rank: no pair to speak of; past the ranks a Buffer takes, nothing either.
  EXPECT_EQ(find_advice(advise(with_islands(8, 2), 1), Severity::kInfo, "nodes"), nullptr);
  EXPECT_EQ(find_advice(advise(with_islands(8, 2), kMaxRanks + 1), Severity::kInfo, "nodes"), nullptr);
}

TEST(CheckEnvAdvice, SharedGpuWithoutMpsWarns) {
  EnvironmentReport report = hopper_node(1);
  const std::vector<Advice> advice = advise(report, 8);
  const Advice* warning = find_advice(advice, Severity::kWarning, "MPS");
  ASSERT_NE(warning, nullptr) << describe(advice);
  EXPECT_TRUE(contains(warning->text, "8 ranks share 1 GPU"));
  EXPECT_TRUE(contains(warning->command, "nvidia-cuda-mps-control -d"));
  EXPECT_FALSE(has_fatal(advice));

  report.mps_active = true;
  const std::vector<Advice> with_mps = advise(report, 8);
  EXPECT_EQ(find_advice(with_mps, Severity::kWarning, "MPS"), nullptr) << describe(with_mps);
  EXPECT_NE(find_advice(with_mps, Severity::kInfo, "under MPS"), nullptr) << describe(with_mps);
}

TEST(CheckEnvAdvice, ComputeCapabilityBelowHopperIsFatal) {
  EnvironmentReport report = hopper_node(1);
  report.gpus[0].name = "NVIDIA A100";
  report.gpus[0].compute_major = 8;
  const std::vector<Advice> advice = advise(report, 1);
  EXPECT_NE(find_advice(advice, Severity::kFatal, "compute capability 8.0"), nullptr) << describe(advice);

  report.gpus[0].compute_major = 10;  // newer GPUs run the compute_90 PTX
  EXPECT_FALSE(has_fatal(advise(report, 1)));
}

TEST(CheckEnvAdvice, OldGpuNotUsedByAnyRankIsNotFatal) {
  EnvironmentReport report = hopper_node(2);
  report.gpus[1].compute_major = 7;
  EXPECT_FALSE(has_fatal(advise(report, 1)));
  EXPECT_TRUE(has_fatal(advise(report, 2)));
}

TEST(CheckEnvAdvice, GpuThatCannotBeQueriedIsFatal) {
  EnvironmentReport report = hopper_node(1);
  report.gpus[0].error = "cudaGetDeviceProperties: cudaErrorUnknown (unknown error)";
  EXPECT_NE(find_advice(advise(report, 1), Severity::kFatal, "could not be queried"), nullptr);
}

TEST(CheckEnvAdvice, MulticastSwitchesUnsetWarnsWithAllThree) {
  EnvironmentReport report = hopper_node(1);
  report.environment.clear();
  const std::vector<Advice> advice = advise(report, 1);
  const Advice* warning = find_advice(advice, Severity::kWarning, "multicast");
  ASSERT_NE(warning, nullptr) << describe(advice);
  for (const char* name : {"NCCL_NVLS_ENABLE", "NVSHMEM_DISABLE_NVLS", "TORCH_SYMM_MEM_DISABLE_MULTICAST"}) {
    EXPECT_TRUE(contains(warning->text, name)) << name;
  }
  EXPECT_EQ(warning->command, "export NCCL_NVLS_ENABLE=0 NVSHMEM_DISABLE_NVLS=1 TORCH_SYMM_MEM_DISABLE_MULTICAST=1");

  report.environment = {{"NCCL_NVLS_ENABLE", "1"}, {"NVSHMEM_DISABLE_NVLS", "1"}, {"TORCH_SYMM_MEM_DISABLE_MULTICAST", "1"}};
  const std::vector<Advice> wrong = advise(report, 1);
  const Advice* wrong_value = find_advice(wrong, Severity::kWarning, "NCCL_NVLS_ENABLE=1");
  ASSERT_NE(wrong_value, nullptr);
  EXPECT_FALSE(contains(wrong_value->text, "not set"));
}

TEST(CheckEnvAdvice, InternodeAbsenceIsOnlyInformation) {
  const std::vector<Advice> advice = advise(hopper_node(1), 1);
  EXPECT_NE(find_advice(advice, Severity::kInfo, "NVSHMEM was not found"), nullptr) << describe(advice);
  EXPECT_NE(find_advice(advice, Severity::kInfo, "no InfiniBand devices"), nullptr) << describe(advice);

  EnvironmentReport equipped = hopper_node(1);
  equipped.nvshmem = {true, "/opt/nvshmem/lib/libnvshmem_host.so.3", "3.2.5", ""};
  equipped.plugin = {true, "/opt/epcomm/lib/libepcomm_nvshmem.so", "3.2.5", ""};
  equipped.infiniband = {{"mlx5_0", {{"1", "1: DOWN"}}}};
  equipped.gpudirect.peer_memory_module = "nvidia_peermem";
  equipped.gpudirect.peer_mapping_override = true;
  const std::vector<Advice> down = advise(equipped, 1);
  EXPECT_EQ(find_advice(down, Severity::kInfo, "NVSHMEM"), nullptr) << describe(down);
  EXPECT_NE(find_advice(down, Severity::kInfo, "no port is ACTIVE"), nullptr) << describe(down);
  EXPECT_EQ(find_advice(down, Severity::kWarning, "GPUDirect RDMA"), nullptr) << describe(down);
}

// With a NIC but no way for it to reach GPU memory, NVSHMEM across hosts would fail to start: a
// warning with the command; without the regkey or GDRCopy, IBGDA goes through the CPU: information.
TEST(CheckEnvAdvice, GpuDirectRdmaNotReadyIsAWarningWithTheCommand) {
  EnvironmentReport report = hopper_node(1);
  report.infiniband = {{"mlx5_0", {{"1", "4: ACTIVE"}}}};
  const std::vector<Advice> advice = advise(report, 1);
  const Advice* warning = find_advice(advice, Severity::kWarning, "GPUDirect RDMA is not ready");
  ASSERT_NE(warning, nullptr) << describe(advice);
  EXPECT_EQ(warning->command, "modprobe nvidia_peermem");
  EXPECT_NE(find_advice(advice, Severity::kInfo, "PeerMappingOverride=1"), nullptr) << describe(advice);
  report.gpudirect.open_kernel_modules = true;
  report.gpudirect.dma_buf = true;
  report.gpudirect.gdrcopy = true;
  const std::vector<Advice> ready = advise(report, 1);
  EXPECT_EQ(find_advice(ready, Severity::kWarning, "GPUDirect RDMA"), nullptr) << describe(ready);
  EXPECT_EQ(find_advice(ready, Severity::kInfo, "PeerMappingOverride"), nullptr) << describe(ready);
}

TEST(CheckEnvCollect, GpuDirectRdmaFromModulesDriverAndDevices) {
  namespace fs = std::filesystem;
  const TempDir root;
  fs::create_directories(root.path() + "/module/nvidia_peermem");
  fs::create_directories(root.path() + "/driver");
  fs::create_directories(root.path() + "/dev");
  std::ofstream(root.path() + "/driver/version")
      << "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.159.04  Release Build\n";
  std::ofstream(root.path() + "/driver/params") << "EnableStreamMemOPs: 0\nRegistryDwords: \"PeerMappingOverride=1;\"\n";
  std::ofstream(root.path() + "/dev/gdrdrv") << "";
  const GpuDirectRdmaInfo found =
      collect_gpudirect(root.path() + "/module", root.path() + "/driver", root.path() + "/dev", "6.8.0-45-generic");
  EXPECT_EQ(found.peer_memory_module, "nvidia_peermem");
  EXPECT_TRUE(found.open_kernel_modules);
  EXPECT_TRUE(found.dma_buf);
  EXPECT_TRUE(found.gdrcopy);
  EXPECT_TRUE(found.peer_mapping_override);
  EXPECT_TRUE(found.ready());
  const GpuDirectRdmaInfo old_kernel =
      collect_gpudirect(root.file("none"), root.path() + "/driver", root.file("none"), "5.4.0-100-generic");
  EXPECT_TRUE(old_kernel.peer_memory_module.empty());
  EXPECT_FALSE(old_kernel.dma_buf);  // open modules, but before Linux 5.12
  EXPECT_FALSE(old_kernel.gdrcopy);
  EXPECT_FALSE(old_kernel.ready());
  EXPECT_TRUE(kernel_at_least("5.12.0", 5, 12));
  EXPECT_FALSE(kernel_at_least("5.11.9", 5, 12));
  EXPECT_FALSE(kernel_at_least("", 5, 12));
}

// ---- Output ----

TEST(CheckEnvFormat, TextHasEverySection) {
  EnvironmentReport report = hopper_node(2);
  report.peers[1].can_access_peer = false;  // 1 -> 0
  const std::vector<Advice> advice = advise(report, 2);
  const std::string text = format_report(report, advice, 2);
  for (const char* section :
       {"CUDA", "GPUs", "Peer access", "MPS", "NVSHMEM", "InfiniBand", "Network", "GPUDirect RDMA", "Environment", "Advice"}) {
    EXPECT_TRUE(contains(text, std::string("== ") + section + " ==")) << section << "\n" << text;
  }
  EXPECT_TRUE(contains(text, "NVIDIA H200, compute capability 9.0, 132 SMs")) << text;
  EXPECT_TRUE(contains(text, "addresses of this host: 10.0.0.7, [2001:db8::7]\n")) << text;
  EXPECT_TRUE(contains(text, "NVLink")) << text;
  EXPECT_TRUE(contains(text, "NO")) << text;
  EXPECT_TRUE(contains(text, "FATAL: GPUs 0 and 1")) << text;
  EXPECT_TRUE(contains(text, "cannot work")) << text;
  EXPECT_TRUE(contains(format_report(hopper_node(1), advise(hopper_node(1), 1), 1), "Result: OK"));
}

TEST(CheckEnvFormat, NoGpuTextSaysSoClearly) {
  const EnvironmentReport report = no_gpu_node();
  const std::string text = format_report(report, advise(report, 1), 1);
  EXPECT_TRUE(contains(text, "no CUDA GPU is usable")) << text;
  EXPECT_TRUE(contains(text, "FATAL: no CUDA GPU")) << text;
}

TEST(CheckEnvFormat, JsonIsOneObject) {
  EnvironmentReport report = hopper_node(2);
  report.gpus[0].name = "quote\" backslash\\ newline\n tab\t bell\a";  // must come out escaped
  report.environment.emplace_back("EPCOMM_X", "a\"b");
  report.infiniband = {{"mlx5_0", {{"1", "4: ACTIVE"}}}};
  for (const EnvironmentReport& subject : {report, no_gpu_node(), collect_environment_report()}) {
    const std::string json = format_report_json(subject, advise(subject, 4), 4);
    EXPECT_EQ(json.front(), '{');
    EXPECT_EQ(json.back(), '}');
    for (const char* key : {"\"gpus\"", "\"peers\"", "\"advice\"", "\"environment\"", "\"host_addresses\"", "\"ok\""}) {
      EXPECT_TRUE(contains(json, key)) << key;
    }
    EXPECT_TRUE(JsonChecker(json).is_one_object()) << json;
  }
  EXPECT_TRUE(contains(format_report_json(no_gpu_node(), advise(no_gpu_node(), 1), 1), "\"ok\": false"));
  EXPECT_TRUE(contains(format_report_json(report, advise(report, 4), 4), "\"host_addresses\": [\"10.0.0.7\", \"[2001:db8::7]\"]"));
}

TEST(CheckEnvFormat, JsonCheckerRejectsBrokenJson) {
  for (const char* broken : {"{\"a\": 1,}", "{\"a\" 1}", "{\"a\": \"x\ny\"}", "{} {}", "[1]", "{\"a\": tru}", ""}) {
    EXPECT_FALSE(JsonChecker(broken).is_one_object()) << broken;
  }
  EXPECT_TRUE(JsonChecker("{\"a\": [1, -2.5e3, true, null, {\"b\": \"c\\\"d\"}], \"e\": {}}").is_one_object());
}

}  // namespace
}  // namespace epcomm::tools
