// The GPU test cases. Each runs on every rank of an epcomm-launch group and returns the number of
// failed checks through the harness.
#pragma once

#include "common/rank_harness.hpp"

namespace epcomm::testing {

void run_layout_case(RankHarness& harness);
void run_peer_case(RankHarness& harness);
void run_lifecycle_case(RankHarness& harness);
void run_timeout_case(RankHarness& harness);
void run_peer_death_case(RankHarness& harness);
void run_peer_death_in_dispatch_case(RankHarness& harness);
void run_peer_death_in_low_latency_case(RankHarness& harness);
void run_peer_death_in_shrink_case(RankHarness& harness);
void run_cold_start_case(RankHarness& harness);
void run_normal_case(RankHarness& harness);
void run_normal_emulated_case(RankHarness& harness);
void run_normal_nvshmem_case(RankHarness& harness);
void run_normal_hierarchical_case(RankHarness& harness);
void run_normal_host_nodes_case(RankHarness& harness);
void run_normal_hierarchical_nvshmem_case(RankHarness& harness);
void run_low_latency_case(RankHarness& harness);
void run_low_latency_emulated_case(RankHarness& harness);
void run_low_latency_nvshmem_case(RankHarness& harness);
void run_soak_case(RankHarness& harness);
void run_modes_across_nodes_case(RankHarness& harness);

}  // namespace epcomm::testing
