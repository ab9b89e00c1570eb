// epcomm_gpu_tests CASE: one GPU test case, run by every rank that epcomm-launch starts.
//   epcomm-launch -n 4 -- epcomm_gpu_tests layout
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "gpu/gpu_cases.hpp"
#include "runtime/backend.hpp"
#include "runtime/comm_stream_memory.hpp"

namespace {

struct Case {
  const char* name;
  void (*run)(epcomm::testing::RankHarness&);
  const char* on_request_only = nullptr;  // an environment variable that must be set for it to run
  bool needs_nvshmem = false;             // runs only where the NVSHMEM plugin loads
};

constexpr Case kCases[] = {
    {"layout", epcomm::testing::run_layout_case},
    {"peer", epcomm::testing::run_peer_case},
    {"lifecycle", epcomm::testing::run_lifecycle_case},
    {"timeout", epcomm::testing::run_timeout_case},
    {"peer_death", epcomm::testing::run_peer_death_case},
    {"peer_death_in_dispatch", epcomm::testing::run_peer_death_in_dispatch_case},
    {"peer_death_in_low_latency", epcomm::testing::run_peer_death_in_low_latency_case},
    {"peer_death_in_shrink", epcomm::testing::run_peer_death_in_shrink_case},
    {"cold_start", epcomm::testing::run_cold_start_case},
    {"normal", epcomm::testing::run_normal_case},
    {"normal_emulated", epcomm::testing::run_normal_emulated_case},
    {"normal_nvshmem", epcomm::testing::run_normal_nvshmem_case, nullptr, true},
    {"normal_hierarchical", epcomm::testing::run_normal_hierarchical_case},
    {"normal_host_nodes", epcomm::testing::run_normal_host_nodes_case},
    {"normal_hierarchical_nvshmem", epcomm::testing::run_normal_hierarchical_nvshmem_case, nullptr, true},
    {"low_latency", epcomm::testing::run_low_latency_case},
    {"low_latency_emulated", epcomm::testing::run_low_latency_emulated_case},
    {"low_latency_nvshmem", epcomm::testing::run_low_latency_nvshmem_case, nullptr, true},
    {"soak", epcomm::testing::run_soak_case, "EPCOMM_SOAK_CALLS"},
    {"modes_across_nodes", epcomm::testing::run_modes_across_nodes_case},
};

constexpr int kInternalPoisonByte = 0xC7;

int usage() {
  std::fprintf(stderr, "usage: epcomm-launch -n RANKS -- epcomm_gpu_tests CASE\ncases:");
  for (const Case& test_case : kCases) std::fprintf(stderr, " %s", test_case.name);
  std::fprintf(stderr, "\n");
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) return usage();
  const Case* selected = nullptr;
  for (const Case& test_case : kCases) {
    if (std::strcmp(argv[1], test_case.name) == 0) selected = &test_case;
  }
  if (selected == nullptr) return usage();

  const std::string reason = epcomm::testing::gpu_unavailable_reason();
  if (!reason.empty()) {
    std::printf("SKIPPED: GPU test '%s' needs a CUDA GPU: %s\n", selected->name, reason.c_str());
    return epcomm::testing::kExitSkipped;
  }
  if (selected->on_request_only != nullptr && std::getenv(selected->on_request_only) == nullptr) {
    std::printf("SKIPPED: GPU test '%s' runs only on request: set %s\n", selected->name, selected->on_request_only);
    return epcomm::testing::kExitSkipped;
  }
  if (selected->needs_nvshmem) {
    std::string why;
    if (epcomm::detail::load_nvshmem_plugin(why) == nullptr) {
#if defined(EPCOMM_HAVE_NVSHMEM_PLUGIN)
      std::printf("FAILED: GPU test '%s': this build made the NVSHMEM plugin, but it does not load: %s\n",
                  selected->name, why.c_str());
      return 1;
#else
      std::printf("SKIPPED: GPU test '%s' needs the NVSHMEM plugin: %s\n", selected->name, why.c_str());
      return epcomm::testing::kExitSkipped;
#endif
    }
  }
  // A handle's routing comes from the Buffer's own memory, not the tests' poisoning allocators.
  epcomm::detail::CommStreamMemory::fill_allocations_for_testing(kInternalPoisonByte);
  try {
    epcomm::testing::RankHarness harness;
    epcomm::testing::select_rank_device(harness.rank());
    selected->run(harness);
    return harness.finish(selected->name);
  } catch (const std::exception& error) {
    std::fprintf(stderr, "%s: uncaught error: %s\n", selected->name, error.what());
    return 1;
  }
}
