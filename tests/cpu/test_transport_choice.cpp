// Choosing a transport, without a GPU: the census every rank takes (agreement, hosts, GPUs,
// watchable processes) and loading the NVSHMEM plugin (clear errors when it cannot be).
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "common/temp_dir.hpp"
#include "epcomm/bootstrap.hpp"
#include "epcomm/error.hpp"
#include "runtime/backend.hpp"
#include "runtime/nvshmem_plugin.hpp"
#include "transport/rank_census.hpp"

namespace epcomm::detail {
namespace {

using namespace std::chrono_literals;

RankCensus entry(const char* host, const char* bus_id, const char* agreed, int64_t pid, uint64_t pid_namespace = 7) {
  RankCensus census;
  census.total_bytes = 1 << 20;
  census.process.pid = pid;
  census.process.pid_namespace = pid_namespace;
  std::strncpy(census.host_name, host, RankCensus::kHostNameBytes - 1);
  std::strncpy(census.pci_bus_id, bus_id, RankCensus::kBusIdBytes - 1);
  std::strncpy(census.agreed, agreed, RankCensus::kAgreedBytes - 1);
  return census;
}

// Every rank is a thread; returns each rank's error message ("" when it got none).
std::vector<std::string> census_errors(const std::vector<RankCensus>& entries) {
  const test_support::TempDir dir;
  const int ranks = static_cast<int>(entries.size());
  std::vector<std::string> errors(entries.size());
  std::vector<std::thread> threads;
  for (int rank = 0; rank < ranks; ++rank) {
    threads.emplace_back([&, rank] {
      try {
        auto bootstrap = make_socket_bootstrap("unix:" + dir.file("boot.sock"), rank, ranks, 30s);
        const std::vector<RankCensus> census = take_census(*bootstrap, entries[rank]);
        EXPECT_EQ(census.size(), entries.size());
        EXPECT_STREQ(census[ranks - 1].host_name, entries[ranks - 1].host_name);
      } catch (const Error& error) {
        errors[rank] = error.what();
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  return errors;
}

TEST(RankCensus, RanksThatAgreeGetEveryRanksEntry) {
  const std::vector<std::string> errors =
      census_errors({entry("a", "0000:01:00.0", "x=1", 10), entry("a", "0000:02:00.0", "x=1", 11),
                     entry("b", "0000:01:00.0", "x=1", 12)});
  for (const std::string& error : errors) EXPECT_EQ(error, "");
}

// A rank created with other options fails every rank, naming both ranks and both option sets.
TEST(RankCensus, ARankWithOtherOptionsFailsEveryRankNamingBoth) {
  const std::vector<std::string> errors =
      census_errors({entry("a", "0000:01:00.0", "num_rdma_bytes=1024", 10), entry("a", "0000:02:00.0", "num_rdma_bytes=2048", 11)});
  EXPECT_NE(errors[0].find("rank 1 was created with {num_rdma_bytes=2048}"), std::string::npos) << errors[0];
  EXPECT_NE(errors[0].find("but rank 0 with {num_rdma_bytes=1024}"), std::string::npos) << errors[0];
  EXPECT_NE(errors[1].find("rank 0 was created with {num_rdma_bytes=1024}"), std::string::npos) << errors[1];
  EXPECT_NE(errors[1].find("every rank must pass the same options"), std::string::npos) << errors[1];
}

TEST(RankCensus, HostsGpusAndWatchableProcesses) {
  const std::vector<RankCensus> census = {entry("a", "0000:01:00.0", "", 10), entry("a", "0000:01:00.0", "", 11),
                                          entry("a", "0000:02:00.0", "", 12, /*pid_namespace=*/8),
                                          entry("b", "0000:01:00.0", "", 13)};
  EXPECT_FALSE(one_host(census, 0));
  EXPECT_TRUE(one_host({census[0], census[1], census[2]}, 1));
  EXPECT_EQ(ranks_on_device_of(census, 0), 2);  // rank 3 has the same bus id on another host
  EXPECT_EQ(ranks_on_device_of(census, 3), 1);
  const std::vector<ProcessIdentity> watched = watchable_processes(census, 0);
  EXPECT_EQ(watched[0].pid, 0);   // itself
  EXPECT_EQ(watched[1].pid, 11);  // same host, same pid namespace
  EXPECT_EQ(watched[2].pid, 0);   // another pid namespace
  EXPECT_EQ(watched[3].pid, 0);   // another host
}

TEST(RankCensus, AMachineOfTheSameNameIsNotWatchedHere) {
  // Cloned machines both called "node": the same name and the host pid namespace's fixed inode, but
  // another boot id. Its pid means nothing here: watching it would call a live rank dead.
  std::vector<RankCensus> census = {entry("node", "0000:01:00.0", "opts", 10), entry("node", "0000:01:00.0", "opts", 11)};
  std::strncpy(census[0].boot_id, "aaaa", RankCensus::kBootIdBytes - 1);
  std::strncpy(census[1].boot_id, "bbbb", RankCensus::kBootIdBytes - 1);
  EXPECT_EQ(watchable_processes(census, 0)[1].pid, 0);
  EXPECT_EQ(ranks_on_device_of(census, 0), 1) << "the same bus id on another machine is another GPU";
  std::strncpy(census[1].boot_id, "aaaa", RankCensus::kBootIdBytes - 1);  // the same machine after all
  EXPECT_EQ(watchable_processes(census, 0)[1].pid, 11);
}

TEST(NvshmemPlugin, AMissingFileIsNamedWithTheLoadersReason) {
  std::string why;
  EXPECT_EQ(load_nvshmem_plugin_from("/nonexistent/libepcomm_nvshmem.so", why), nullptr);
  EXPECT_NE(why.find("cannot load the NVSHMEM plugin /nonexistent/libepcomm_nvshmem.so"), std::string::npos) << why;
}

TEST(NvshmemPlugin, ALibraryWithoutTheEntryIsNotAPlugin) {
  std::string why;
  EXPECT_EQ(load_nvshmem_plugin_from("libm.so.6", why), nullptr);
  EXPECT_NE(why.find("has no epcomm_nvshmem_plugin"), std::string::npos) << why;
}

// This build's own plugin: loads with this version and a full kernel table, or says why not.
TEST(NvshmemPlugin, ThisBuildsPluginLoadsOrSaysWhy) {
  std::string why;
  const NvshmemPlugin* plugin = load_nvshmem_plugin(why);
  if (plugin == nullptr) {
    EXPECT_FALSE(why.empty());
    GTEST_SKIP() << "no NVSHMEM plugin here: " << why;
  }
  EXPECT_EQ(plugin->abi, kNvshmemPluginAbi);
  EXPECT_STREQ(plugin->epcomm_version, EPCOMM_VERSION_STRING);
  ASSERT_NE(plugin->kernels, nullptr);
  EXPECT_NE(plugin->kernels->low_latency_dispatch, nullptr);
  EXPECT_NE(plugin->kernels->combine, nullptr);
  EXPECT_NE(plugin->make_transport, nullptr);
  // Its kernels are its own, not libepcomm's.
  EXPECT_NE(plugin->kernels->low_latency_dispatch, kernels::builtin_kernels().low_latency_dispatch);
}

}  // namespace
}  // namespace epcomm::detail
