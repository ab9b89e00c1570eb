// Which ranks form a node, from made-up censuses: hosts, emulated nodes and ranks_per_node, and the
// clear errors when the ranks cannot be numbered as deep_ep numbers them.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <atomic>
#include <optional>
#include <stdexcept>
#include <thread>
#include <initializer_list>
#include <string>
#include <vector>

#include "common/rank_threads.hpp"
#include "common/temp_dir.hpp"
#include "epcomm/bootstrap.hpp"
#include "epcomm/error.hpp"
#include "transport/topology.hpp"

namespace epcomm::detail {
namespace {

std::vector<RankCensus> hosts(std::initializer_list<const char*> names) {
  std::vector<RankCensus> census;
  for (const char* name : names) {
    RankCensus entry;
    std::strncpy(entry.host_name, name, RankCensus::kHostNameBytes - 1);
    census.push_back(entry);
  }
  return census;
}

std::string topology_error(const std::vector<RankCensus>& census, int emulated_nodes, int ranks_per_node) {
  try {
    (void)find_topology(census, emulated_nodes, ranks_per_node, {});
  } catch (const Error& error) {
    EXPECT_EQ(error.code(), ErrorCode::kInvalidArgument);
    return error.what();
  }
  return "";
}

TEST(Topology, ConsecutiveRanksOfAHostFormANode) {
  const Topology one = find_topology(hosts({"a", "a", "a", "a"}), 1, 0, {});
  EXPECT_EQ(one.num_nodes(), 1);
  EXPECT_EQ(one.ranks_per_node, 4);
  const Topology two = find_topology(hosts({"a", "a", "b", "b"}), 1, 0, {});
  EXPECT_EQ(two.num_nodes(), 2);
  EXPECT_EQ(two.node_of(2), 1);
  EXPECT_EQ(two.local_rank(3), 1);
  EXPECT_TRUE(two.same_node(0, 1));
  EXPECT_FALSE(two.same_node(1, 2));
  EXPECT_EQ(find_topology(hosts({"a"}), 1, 0, {}).num_nodes(), 1);
}

// Entries of one host name on machines told apart by their boot ids ("" where unknown).
std::vector<RankCensus> booted(const char* name, std::initializer_list<const char*> boot_ids) {
  std::vector<RankCensus> census;
  for (const char* boot_id : boot_ids) {
    RankCensus entry;
    std::strncpy(entry.host_name, name, RankCensus::kHostNameBytes - 1);
    std::strncpy(entry.boot_id, boot_id, RankCensus::kBootIdBytes - 1);
    census.push_back(entry);
  }
  return census;
}

TEST(Topology, MachinesOfOneNameAreToldApartByTheirBootIds) {
  // Cloned machines both called "ubuntu": two hosts, two nodes, not one node across the network.
  const std::vector<RankCensus> clones = booted("ubuntu", {"1111aaaa-x", "1111aaaa-x", "2222bbbb-y", "2222bbbb-y"});
  EXPECT_TRUE(same_host(clones[0], clones[1]));
  EXPECT_FALSE(same_host(clones[1], clones[2]));
  EXPECT_FALSE(one_host(clones, 0));
  EXPECT_EQ(find_topology(clones, 1, 0, {}).num_nodes(), 2);
  EXPECT_EQ(host_text(clones[2]), "'ubuntu' (boot id 2222bbbb)");
  // Where a side does not know its boot id, the name decides, as before.
  const std::vector<RankCensus> unknown = booted("ubuntu", {"1111aaaa-x", ""});
  EXPECT_TRUE(same_host(unknown[0], unknown[1]));
  EXPECT_EQ(host_text(unknown[1]), "'ubuntu'");
  // Boot ids count only where every rank knows its own: otherwise the host relation would not be
  // transitive (A ~ unknown ~ C, but A !~ C), and the ranks' order would decide the nodes.
  std::vector<RankCensus> partly = booted("ubuntu", {"1111aaaa-x", "", "2222bbbb-y"});
  forget_boot_ids_unless_all_known(partly);
  EXPECT_TRUE(same_host(partly[0], partly[2]));
  EXPECT_EQ(find_topology(partly, 1, 0, {}).num_nodes(), 1);
  std::vector<RankCensus> all_known = clones;
  forget_boot_ids_unless_all_known(all_known);
  EXPECT_FALSE(same_host(all_known[1], all_known[2]));
  // A machine's name and boot id both differ from another's: two hosts.
  EXPECT_FALSE(same_host(booted("a", {"1"})[0], booted("b", {"1"})[0]));
}

TEST(Topology, EmulatedNodesAndRanksPerNodeSplitAHost) {
  const Topology emulated = find_topology(hosts({"a", "a", "a", "a", "a", "a"}), 3, 0, {});
  EXPECT_EQ(emulated.ranks_per_node, 2);
  EXPECT_EQ(emulated.node_of(5), 2);
  EXPECT_EQ(find_topology(hosts({"a", "a", "a", "a"}), 1, 2, {}).num_nodes(), 2);
  EXPECT_EQ(find_topology(hosts({"a", "a", "a", "a"}), 2, 2, {}).num_nodes(), 2);  // both, agreeing
  // Emulated nodes inside real ones: two hosts of four, four nodes of two.
  EXPECT_EQ(find_topology(hosts({"a", "a", "a", "a", "b", "b", "b", "b"}), 4, 0, {}).num_nodes(), 4);
}

std::vector<RankCensus> one_host(int ranks) {
  std::vector<RankCensus> census = hosts({"a"});
  census.resize(ranks, census[0]);
  return census;
}

TEST(Topology, AHostOfMoreRanksThanANodeHoldsIsSplitIntoEqualNodes) {
  for (int ranks = 1; ranks <= 8; ++ranks) EXPECT_EQ(default_ranks_per_node(ranks), ranks);
  EXPECT_EQ(default_ranks_per_node(9), 3);
  EXPECT_EQ(default_ranks_per_node(11), 11) << "nodes of 1 would run nothing: the host stays whole";
  EXPECT_EQ(default_ranks_per_node(22), 22) << "11 nodes of 2: more nodes than a stage holds";
  EXPECT_EQ(default_ranks_per_node(12), 6);
  EXPECT_EQ(default_ranks_per_node(16), 8);
  EXPECT_EQ(default_ranks_per_node(24), 8);
  const Topology sixteen = find_topology(one_host(16), 1, 0, {});
  EXPECT_EQ(sixteen.ranks_per_node, 8);
  EXPECT_EQ(sixteen.ranks_per_host, 16);
  EXPECT_EQ(sixteen.num_nodes(), 2);
  EXPECT_FALSE(sixteen.same_node(7, 8));
  EXPECT_TRUE(sixteen.reach_directly(7, 8)) << "nodes of one host still reach each other by load and store";
  EXPECT_EQ(find_topology(one_host(32), 1, 0, {}).num_nodes(), 4);
  // Two hosts of 16: four nodes, and no load or store between the hosts.
  std::vector<RankCensus> two = one_host(32);
  for (int rank = 16; rank < 32; ++rank) std::strncpy(two[rank].host_name, "b", RankCensus::kHostNameBytes - 1);
  const Topology across = find_topology(two, 1, 0, {});
  EXPECT_EQ(across.num_nodes(), 4);
  EXPECT_TRUE(across.reach_directly(0, 15));
  EXPECT_FALSE(across.reach_directly(15, 16));
  // EP64 (kMaxRanks): eight hosts of 8 are eight nodes; rank 45's rail holds ranks 5, 13, ..., 61.
  std::vector<RankCensus> eight = one_host(64);
  for (int rank = 0; rank < 64; ++rank) {
    std::snprintf(eight[rank].host_name, RankCensus::kHostNameBytes, "host%d", rank / 8);
  }
  const Topology ep64 = find_topology(eight, 1, 0, {});
  EXPECT_EQ(ep64.num_nodes(), 8);
  EXPECT_TRUE(ep64.reach_directly(56, 63));
  EXPECT_FALSE(ep64.reach_directly(39, 40));
  const RankGroup rail = ep64.rail_group(45);
  EXPECT_EQ(rail.first, 5);
  EXPECT_EQ(rail.stride, 8);
  EXPECT_EQ(rail.count, 8);
}

TEST(Topology, OnlyEmulatedNodesHideTheRestOfTheirHost) {
  // ranks_per_node splits a host into nodes (normal mode's stages) that still share its memory.
  const Topology given = find_topology(one_host(8), 1, 4, {});
  EXPECT_EQ(given.num_nodes(), 2);
  EXPECT_TRUE(given.reach_directly(0, 7));
  // Emulated nodes reach each other only by put: each is a host of its own.
  const Topology emulated = find_topology(one_host(8), 2, 0, {});
  EXPECT_EQ(emulated.ranks_per_host, 4);
  EXPECT_TRUE(emulated.reach_directly(4, 7));
  EXPECT_FALSE(emulated.reach_directly(3, 4));
  // Given both, they agree: the same split, and still emulated.
  EXPECT_FALSE(find_topology(one_host(8), 2, 4, {}).reach_directly(3, 4));
}

TEST(Topology, RanksThatCannotBeNumberedAsDeepEpDoesAreRefusedByName) {
  EXPECT_NE(topology_error(hosts({"a", "b", "a", "b"}), 1, 0)
                .find("ranks 0-0 and 2 run on host 'a' but rank 1 runs on 'b': the ranks of a host must be consecutive"),
            std::string::npos);
  EXPECT_NE(topology_error(hosts({"a", "a", "a", "b"}), 1, 0)
                .find("host 'a' runs 3 ranks but host 'b' runs 1 (ranks 3-3): every node must hold as many ranks"),
            std::string::npos);
  EXPECT_NE(topology_error(hosts({"a", "a", "b", "b"}), 1, 4)
                .find("node 0 (ranks 0-3, from ranks_per_node=4) would hold rank 0 on host 'a' and rank 2 on host 'b'"),
            std::string::npos);
  EXPECT_NE(topology_error(hosts({"a", "a", "a", "a"}), 1, 3).find("ranks_per_node=3 must be 0 (from the hosts) or divide"),
            std::string::npos);
  EXPECT_NE(topology_error(hosts({"a", "a", "a", "a"}), 2, 1).find("ranks_per_node=1 contradicts emulated_nodes=2"),
            std::string::npos);
  EXPECT_EQ(topology_error(hosts({"a", "a", "b", "b"}), 1, 0), "");
  EXPECT_NE(topology_error(hosts({"a", "a", "a", "b", "b", "b"}), 3, 0).find("from emulated_nodes=3"), std::string::npos);
  EXPECT_EQ(find_topology(hosts({"a"}), 1, 1, {}).num_nodes(), 1);
}

// The NVLink matrix of ranks whose GPUs fall into the islands named: ranks of one island joined,
// others apart, as every rank's NVML would say.
NvlinkMatrix islands(std::initializer_list<int> island_of_rank) {
  const std::vector<int> island(island_of_rank);
  NvlinkMatrix matrix(island.size(), std::vector<NvlinkState>(island.size()));
  for (size_t a = 0; a < island.size(); ++a) {
    for (size_t b = 0; b < island.size(); ++b) {
      matrix[a][b] = island[a] == island[b] ? NvlinkState::kJoined : NvlinkState::kApart;
    }
  }
  return matrix;
}

TEST(NvlinkIslands, BridgedPairsOfAHostAreItsNodes) {
  const NvlinkMatrix pairs = islands({0, 0, 1, 1, 2, 2, 3, 3});
  const Topology topology = find_topology(one_host(8), 1, 0, pairs);
  EXPECT_EQ(topology.ranks_per_node, 2);
  EXPECT_EQ(topology.num_nodes(), 4);
  EXPECT_TRUE(topology.reach_directly(1, 2)) << "islands of one host still reach each other, over PCIe";
  EXPECT_EQ(nvlink_split_note(one_host(8), pairs), "");
  // Two hosts of two pairs each: four nodes.
  std::vector<RankCensus> two = one_host(8);
  for (int rank = 4; rank < 8; ++rank) std::strncpy(two[rank].host_name, "b", RankCensus::kHostNameBytes - 1);
  EXPECT_EQ(find_topology(two, 1, 0, pairs).num_nodes(), 4);
  // Ranks sharing a GPU (MPS) on two GPUs with no NVLink between them: a node per GPU.
  EXPECT_EQ(find_topology(one_host(8), 1, 0, islands({0, 0, 0, 0, 1, 1, 1, 1})).ranks_per_node, 4);
}

TEST(NvlinkIslands, AHostJoinedWholeOrNotProbedIsOneNode) {
  EXPECT_EQ(find_topology(one_host(8), 1, 0, islands({0, 0, 0, 0, 0, 0, 0, 0})).num_nodes(), 1);
  EXPECT_EQ(nvlink_split_note(one_host(8), islands({0, 0, 0, 0, 0, 0, 0, 0})), "");
  EXPECT_EQ(find_topology(one_host(8), 1, 0, {}).num_nodes(), 1);
  // One island of 16 GPUs (NVSwitch): split by size alone, as without the matrix.
  NvlinkMatrix whole(16, std::vector<NvlinkState>(16, NvlinkState::kJoined));
  EXPECT_EQ(find_topology(one_host(16), 1, 0, whole).ranks_per_node, 8);
}

TEST(NvlinkIslands, WhatNvmlCannotTellCountsAsJoinedAndApartFromEitherSideWins) {
  NvlinkMatrix matrix(2, std::vector<NvlinkState>(2, NvlinkState::kUnknown));
  EXPECT_TRUE(nvlink_joins(matrix, 0, 1));
  matrix[0][1] = NvlinkState::kJoined;
  EXPECT_TRUE(nvlink_joins(matrix, 0, 1));
  matrix[1][0] = NvlinkState::kApart;
  EXPECT_FALSE(nvlink_joins(matrix, 0, 1));
  EXPECT_FALSE(nvlink_joins(matrix, 1, 0)) << "both ranks decide alike, whichever asks";
}

TEST(NvlinkIslands, IslandsThatCannotBeNodesLeaveTheHostWholeAndSayWhy) {
  const auto whole_with_note = [](const std::vector<RankCensus>& census, const NvlinkMatrix& nvlink,
                                  const std::string& why) {
    EXPECT_EQ(find_topology(census, 1, 0, nvlink).ranks_per_node,
              find_topology(census, 1, 0, {}).ranks_per_node);
    EXPECT_NE(nvlink_split_note(census, nvlink).find(why), std::string::npos) << nvlink_split_note(census, nvlink);
  };
  whole_with_note(one_host(4), islands({0, 1, 2, 3}), "no NVLink joins the GPUs of host 'a': its ranks reach each other over PCIe");
  whole_with_note(one_host(4), islands({0, 1, 0, 1}), "(or a shared GPU) on host 'a' joins rank 0 to rank 2, outside rank 0's island (ranks 0-0)");
  whole_with_note(one_host(4), islands({0, 0, 0, 1}), "joins ranks 0-2 and ranks 3-3: islands of unequal size");
  // Rank 0 joined to 1 and 2, but 1 and 2 apart (a mesh, not a switch): no island holds all three.
  NvlinkMatrix mesh = islands({0, 0, 0});
  mesh[1][2] = mesh[2][1] = NvlinkState::kApart;
  whole_with_note(one_host(3), mesh, "joins rank 0 to rank 2, outside rank 0's island (ranks 0-1)");
  // Two hosts of 16 in pairs: 16 nodes, more than a stage holds; nodes of 8 by size instead.
  std::vector<RankCensus> two = one_host(32);
  for (int rank = 16; rank < 32; ++rank) std::strncpy(two[rank].host_name, "b", RankCensus::kHostNameBytes - 1);
  NvlinkMatrix pairs(32, std::vector<NvlinkState>(32, NvlinkState::kApart));
  for (int a = 0; a < 32; ++a) {
    for (int b = 0; b < 32; ++b) pairs[a][b] = a / 2 == b / 2 ? NvlinkState::kJoined : NvlinkState::kApart;
  }
  whole_with_note(two, pairs, "NVLink islands of 2 ranks would make 16 nodes, more than a hierarchical stage holds (8)");
  EXPECT_EQ(find_topology(two, 1, 0, pairs).ranks_per_node, 8);
  // Hosts whose islands differ.
  std::vector<RankCensus> mixed = one_host(8);
  for (int rank = 4; rank < 8; ++rank) std::strncpy(mixed[rank].host_name, "b", RankCensus::kHostNameBytes - 1);
  whole_with_note(mixed, islands({0, 0, 1, 1, 2, 2, 2, 2}), "NVLink islands hold 2 ranks on host 'a' but 4 on host 'b'");
}

TEST(NvlinkIslands, RanksPerNodeAndEmulatedNodesOverrideTheIslands) {
  const NvlinkMatrix pairs = islands({0, 0, 1, 1, 2, 2, 3, 3});
  EXPECT_EQ(find_topology(one_host(8), 1, 8, pairs).num_nodes(), 1) << "the user's word: one node across PCIe";
  EXPECT_EQ(find_topology(one_host(8), 1, 4, pairs).ranks_per_node, 4);
  const Topology emulated = find_topology(one_host(8), 2, 0, pairs);
  EXPECT_EQ(emulated.ranks_per_node, 4);
  EXPECT_FALSE(emulated.reach_directly(3, 4));
}

// Without NVML, or with bus ids it does not know, a rank can tell only its own GPU and other hosts.
TEST(NvlinkIslands, ARankProbesItsOwnRowWithoutNeedingNvml) {
  std::vector<RankCensus> census = one_host(4);
  // Domain ffff: no GPU a test host has.
  const char* bus_ids[] = {"ffff:fe:1f.5", "ffff:fe:1f.5", "ffff:fe:1f.6", "ffff:fe:1f.7"};
  for (int rank = 0; rank < 4; ++rank) std::strncpy(census[rank].pci_bus_id, bus_ids[rank], RankCensus::kBusIdBytes - 1);
  std::strncpy(census[3].host_name, "b", RankCensus::kHostNameBytes - 1);
  const std::vector<NvlinkState> row = probe_nvlink_row(census, 0);
  ASSERT_EQ(row.size(), 4u);
  EXPECT_EQ(row[0], NvlinkState::kJoined);
  EXPECT_EQ(row[1], NvlinkState::kJoined) << "one GPU";
  EXPECT_EQ(row[2], NvlinkState::kUnknown) << "a made-up GPU NVML cannot find";
  EXPECT_EQ(row[3], NvlinkState::kApart) << "another host";
}

// Each rank's own row goes to every rank: each rank's differs (rank 1 alone says it is apart from
// rank 2, rank 2 sends a byte that is no state for rank 0), and every rank must end with the rows
// as their ranks sent them.
TEST(NvlinkIslands, EveryRankGetsEveryRanksRowThroughTheBootstrap) {
  constexpr int kRanks = 3;
  const auto row_of = [](int rank) {
    std::vector<NvlinkState> row(kRanks, NvlinkState::kJoined);
    if (rank == 1) row[2] = NvlinkState::kApart;
    if (rank == 2) row[0] = static_cast<NvlinkState>(0x7f);
    return row;
  };
  const test_support::TempDir dir;
  test_support::expect_all_ok(test_support::run_threads(kRanks, [&](int rank) {
    auto bootstrap = make_socket_bootstrap("unix:" + dir.file("boot.sock"), rank, kRanks, std::chrono::seconds(30));
    const NvlinkMatrix matrix = exchange_nvlink_rows(*bootstrap, row_of(rank));
    ASSERT_EQ(matrix.size(), static_cast<size_t>(kRanks));
    EXPECT_EQ(matrix[0], row_of(0));
    EXPECT_EQ(matrix[1], row_of(1));
    EXPECT_EQ(matrix[2], (std::vector<NvlinkState>{NvlinkState::kUnknown, NvlinkState::kJoined, NvlinkState::kJoined}))
        << "a byte that is no state reads as unknown";
    EXPECT_FALSE(nvlink_joins(matrix, 1, 2)) << "rank 1 says apart; rank 2 says joined";
    EXPECT_TRUE(nvlink_joins(matrix, 2, 0)) << "rank 0 says joined; rank 2 could not tell";
  }));
}

TEST(NvlinkIslands, OnlyAHostOfTwoGpusIsWorthAsking) {
  std::vector<RankCensus> census = one_host(4);
  for (RankCensus& entry : census) std::strncpy(entry.pci_bus_id, "0000:19:00.0", RankCensus::kBusIdBytes - 1);
  EXPECT_FALSE(nvlink_worth_probing(census)) << "every rank on one GPU (MPS)";
  std::strncpy(census[2].host_name, "b", RankCensus::kHostNameBytes - 1);
  std::strncpy(census[3].host_name, "b", RankCensus::kHostNameBytes - 1);
  EXPECT_FALSE(nvlink_worth_probing(census)) << "a GPU per host, however the bus ids repeat";
  std::strncpy(census[3].pci_bus_id, "0000:1a:00.0", RankCensus::kBusIdBytes - 1);
  EXPECT_TRUE(nvlink_worth_probing(census));
}

// One rank's NVML says apart, the other's cannot tell: apart, and the host's islands decide.
TEST(NvlinkIslands, OneSidedAnswersDecideTheTopologyAlike) {
  NvlinkMatrix matrix(4, std::vector<NvlinkState>(4, NvlinkState::kUnknown));
  matrix[1][2] = NvlinkState::kApart;  // rank 1 alone knows: ranks 0-1 and 2-3 are apart
  matrix[0][2] = matrix[0][3] = matrix[1][3] = NvlinkState::kApart;
  EXPECT_EQ(find_topology(one_host(4), 1, 0, matrix).ranks_per_node, 2);
  // Islands of 11 ranks (2 x 11 on one host) split into no nodes a stage runs: the host stays whole.
  NvlinkMatrix elevens(22, std::vector<NvlinkState>(22));
  for (int a = 0; a < 22; ++a) {
    for (int b = 0; b < 22; ++b) elevens[a][b] = a / 11 == b / 11 ? NvlinkState::kJoined : NvlinkState::kApart;
  }
  EXPECT_EQ(find_topology(one_host(22), 1, 0, elevens).ranks_per_node, 22);
  EXPECT_NE(nvlink_split_note(one_host(22), elevens).find("NVLink islands of 11 ranks split into no nodes of at most 8"),
            std::string::npos);
}

// The questions go to NVML on a thread of their own: answers in time make the row; a stall past the
// rank's patience, or a failing question, leaves them unknown and the call returns anyway; while a
// stalled question has not returned, later probes ask nothing (one stuck thread, not one per Buffer).
TEST(NvlinkIslands, ARankWaitsForItsAnswersNoLongerThanItsPatience) {
  using std::chrono::milliseconds;
  std::vector<RankCensus> census = one_host(4);
  const char* bus_ids[] = {"ffff:fe:1f.5", "ffff:fe:1f.5", "ffff:fe:1f.6", "ffff:fe:1f.7"};
  for (int rank = 0; rank < 4; ++rank) std::strncpy(census[rank].pci_bus_id, bus_ids[rank], RankCensus::kBusIdBytes - 1);
  const std::vector<NvlinkState> unanswered{NvlinkState::kJoined, NvlinkState::kJoined, NvlinkState::kUnknown,
                                            NvlinkState::kUnknown};
  static std::atomic<bool> stalled{false};  // outlives the threads, as the probe requires
  const NvlinkQuestion answers = [](const char*, const char* other) -> std::optional<bool> {
    return std::string(other) == "ffff:fe:1f.6";
  };
  EXPECT_EQ(probe_nvlink_row(census, 0, answers, std::chrono::seconds(30), stalled),
            (std::vector<NvlinkState>{NvlinkState::kJoined, NvlinkState::kJoined, NvlinkState::kJoined,
                                      NvlinkState::kApart}));
  const NvlinkQuestion fails = [](const char*, const char*) -> std::optional<bool> { throw std::runtime_error("no"); };
  EXPECT_EQ(probe_nvlink_row(census, 0, fails, std::chrono::seconds(30), stalled), unanswered);

  const NvlinkQuestion stalls = [](const char*, const char*) -> std::optional<bool> {
    std::this_thread::sleep_for(milliseconds(200));
    return true;
  };
  const auto start = std::chrono::steady_clock::now();
  EXPECT_EQ(probe_nvlink_row(census, 1, stalls, milliseconds(20), stalled), unanswered);
  EXPECT_LT(std::chrono::steady_clock::now() - start, milliseconds(350)) << "waited past its patience";
  EXPECT_TRUE(stalled.load());
  // While the stalled questions run, a probe with all the patience in the world asks nothing.
  EXPECT_EQ(probe_nvlink_row(census, 1, answers, std::chrono::hours(1), stalled), unanswered);
  // Once they return (two questions of 200 ms), the next probe asks again.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (stalled.load() && std::chrono::steady_clock::now() < deadline) std::this_thread::sleep_for(milliseconds(10));
  EXPECT_FALSE(stalled.load());
  EXPECT_EQ(probe_nvlink_row(census, 0, answers, std::chrono::seconds(30), stalled)[2], NvlinkState::kJoined);

  // A rank with nothing to ask (its GPU and other hosts only) starts no thread and waits for nothing.
  std::strncpy(census[2].host_name, "b", RankCensus::kHostNameBytes - 1);
  std::strncpy(census[3].host_name, "b", RankCensus::kHostNameBytes - 1);
  EXPECT_EQ(probe_nvlink_row(census, 0, stalls, std::chrono::hours(1), stalled),
            (std::vector<NvlinkState>{NvlinkState::kJoined, NvlinkState::kJoined, NvlinkState::kApart,
                                      NvlinkState::kApart}));
}

}  // namespace
}  // namespace epcomm::detail
