// BufferOptions and Config validation, and the device-error messages, on the host alone.
#include <gtest/gtest.h>

#include <cstring>

#include "common/device_error.hpp"
#include "epcomm/buffer.hpp"
#include "epcomm/config.hpp"
#include "epcomm/error.hpp"
#include "expect_error.hpp"
#include "runtime/buffer_impl.hpp"
#include "runtime/device_error_log.hpp"

namespace epcomm {
namespace {

// The message of what `call` throws ("" when it throws nothing).
template <typename Call>
std::string error_from(Call&& call) {
  try {
    call();
  } catch (const Error& error) {
    return error.what();
  }
  return "";
}

std::string validation_error(const BufferOptions& options, int num_ranks) {
  return error_from([&] { options.validate(num_ranks); });
}

TEST(BufferOptions, DefaultsAreValid) {
  for (int ranks : {1, 2, 4, 8}) EXPECT_EQ(validation_error(BufferOptions{}, ranks), "");
}

TEST(BufferOptions, BadFieldsAreNamedWithTheirValues) {
  BufferOptions options;
  options.num_nvl_bytes = 1000;
  EXPECT_NE(validation_error(options, 2).find("num_nvl_bytes=1000 must be a non-negative multiple of 128"), std::string::npos);
  options = BufferOptions{};
  options.num_nvl_bytes = -128;
  EXPECT_NE(validation_error(options, 2).find("num_nvl_bytes=-128"), std::string::npos);
  options = BufferOptions{};
  options.num_qps_per_rank = 0;
  EXPECT_NE(validation_error(options, 2).find("num_qps_per_rank=0"), std::string::npos);
  options = BufferOptions{};
  options.device = -2;
  EXPECT_NE(validation_error(options, 2).find("device=-2"), std::string::npos);
  options = BufferOptions{};
  options.wait_timeout = std::chrono::milliseconds(0);
  EXPECT_NE(validation_error(options, 2).find("wait_timeout=0 ms"), std::string::npos);
  // "Forever" as the largest int64 would overflow the deadlines: refused, naming the bound.
  options.wait_timeout = std::chrono::milliseconds(INT64_MAX);
  EXPECT_NE(validation_error(options, 2).find("wait_timeout=9223372036854775807 ms must be positive and at most "
                                              "604800000"),
            std::string::npos);
  options.wait_timeout = std::chrono::hours(7 * 24);
  EXPECT_EQ(validation_error(options, 2), "");
}

TEST(BufferOptions, EmulatedNodesMustDivideTheRanks) {
  BufferOptions options;
  options.low_latency_mode = true;
  options.num_rdma_bytes = 1 << 20;
  options.emulated_nodes = 2;
  EXPECT_EQ(validation_error(options, 4), "");
  EXPECT_NE(validation_error(options, 3).find("emulated_nodes=2 must be at least 1 and divide num_ranks=3"),
            std::string::npos);
  options.emulated_nodes = 0;
  EXPECT_NE(validation_error(options, 4).find("emulated_nodes=0"), std::string::npos);
  options.emulated_nodes = 1;
  options.ranks_per_node = 3;
  EXPECT_NE(validation_error(options, 4).find("ranks_per_node=3 must be 0 (from the hosts) or divide num_ranks=4"),
            std::string::npos);
  options.ranks_per_node = 2;
  EXPECT_EQ(validation_error(options, 4), "");
  options.ranks_per_node = 0;
  options.emulated_nodes = 2;
  options.num_nvl_bytes = 1 << 20;  // normal mode across (emulated) nodes: staged rings
  EXPECT_EQ(validation_error(options, 4), "");
}

TEST(Config, CombineLayoutsAreNamedBothWaysAndAnUnknownOneIsRefused) {
  EXPECT_EQ(Config{}.combine_layout, CombineLayout::kSplit) << "the layout measured faster over NVLink";
  for (const CombineLayout layout : {CombineLayout::kSplit, CombineLayout::kColocated}) {
    EXPECT_EQ(parse_combine_layout(combine_layout_name(layout)), layout);
    Config config;
    config.combine_layout = layout;
    EXPECT_NO_THROW(config.validate());
  }
  EXPECT_TRUE(throws_invalid_argument([] { (void)parse_combine_layout("Split"); },
                                      "combine_layout='Split' must be 'split' or 'colocated'"));
  Config bad;
  bad.combine_layout = static_cast<CombineLayout>(7);
  EXPECT_TRUE(throws_invalid_argument([&] { bad.validate(); },
                                      "Config: combine_layout=7 must be CombineLayout::kSplit or kColocated"));
}

TEST(Config, RdmaHintIsStagedRingsOfTheRdmaFieldsOnePeerPerNode) {
  Config config = default_dispatch_config(8);
  EXPECT_EQ(config.rdma_buffer_size_hint(7168 * 2, 1), 0);  // one node: no network stage
  const int64_t two = config.rdma_buffer_size_hint(7168 * 2, 2);
  const int64_t four = config.rdma_buffer_size_hint(7168 * 2, 4);
  EXPECT_GT(two, 0);
  EXPECT_EQ(two % static_cast<int64_t>(kRegionAlignment), 0);
  EXPECT_GE(four, 2 * two - static_cast<int64_t>(kRegionAlignment));  // a ring pair per peer node
  // Sized by the rdma ring: the same rings with the NVLink fields set alike take the same bytes.
  config.num_max_nvl_chunked_recv_tokens = config.num_max_rdma_chunked_recv_tokens;
  EXPECT_EQ(two, config.ring_buffer_bytes(7168 * 2, 2, true));
  for (const int nodes : {0, kMaxNvlPeers + 1}) {
    try {
      (void)config.rdma_buffer_size_hint(7168 * 2, nodes);
      FAIL() << nodes << " nodes were accepted";
    } catch (const Error& error) {
      EXPECT_NE(std::string(error.what()).find("num_nodes=" + std::to_string(nodes)), std::string::npos);
    }
  }
}

TEST(Config, RingsAcrossNodesAreStagedAndTakeTwiceTheBytes) {
  const Config config = default_dispatch_config(8);
  const int64_t one_node = config.nvl_buffer_size_hint(7168 * 2, 8);
  const int64_t two_nodes = config.nvl_buffer_size_hint(7168 * 2, 8, 2);
  EXPECT_EQ(config.nvl_buffer_size_hint(7168 * 2, 8, 3), two_nodes);  // any count above 1 stages alike
  EXPECT_EQ(config.ring_buffer_bytes(7168 * 2, 8, true), two_nodes);
  EXPECT_EQ(config.ring_buffer_bytes(7168 * 2, 8, false), one_node);
  EXPECT_GE(two_nodes, 2 * one_node - static_cast<int64_t>(kRegionAlignment));
  EXPECT_LE(two_nodes, 2 * one_node);
  for (const int nodes : {0, 9}) {
    try {
      (void)config.nvl_buffer_size_hint(7168 * 2, 8, nodes);
      FAIL() << nodes << " nodes of 8 ranks were accepted";
    } catch (const Error& error) {
      EXPECT_EQ(error.code(), ErrorCode::kInvalidArgument);
      EXPECT_NE(std::string(error.what()).find("num_nodes=" + std::to_string(nodes) + " must be in [1, num_ranks=8]"),
                std::string::npos);
    }
  }
}

TEST(BufferOptions, RdmaBytesWithoutLowLatencyAreTheRailStageRings) {
  BufferOptions options;
  options.num_rdma_bytes = 1 << 20;
  EXPECT_NE(validation_error(options, 2).find("also needs the NVLink stage's rings: pass num_nvl_bytes > 0"),
            std::string::npos);
  options.num_nvl_bytes = 1 << 20;
  EXPECT_EQ(validation_error(options, 2), "");
  options.num_rdma_bytes = 1000;
  EXPECT_NE(validation_error(options, 2).find("num_rdma_bytes=1000 must be a multiple of 128"), std::string::npos);
}

TEST(BufferOptions, WhatThisBuildCannotDoIsUnsupported) {
  try {
    BufferOptions{}.validate(kMaxRanks + 1);
    FAIL();
  } catch (const Error& error) {
    EXPECT_EQ(error.code(), ErrorCode::kUnsupported);
    EXPECT_NE(std::string(error.what()).find("num_ranks=" + std::to_string(kMaxRanks + 1)), std::string::npos);
  }
  // Past normal mode's ranks, without a rail region, only low-latency mode runs: an NVLink buffer
  // is refused, saying so.
  BufferOptions low_latency;
  low_latency.low_latency_mode = true;
  low_latency.num_rdma_bytes = 1 << 20;
  EXPECT_NO_THROW(low_latency.validate(kMaxRanks));
  low_latency.num_nvl_bytes = 1 << 20;
  low_latency.num_rail_bytes = 0;
  try {
    low_latency.validate(kMaxNvlPeers + 1);
    FAIL();
  } catch (const Error& error) {
    EXPECT_EQ(error.code(), ErrorCode::kUnsupported);
    EXPECT_NE(std::string(error.what()).find("normal mode runs at most 8 ranks"), std::string::npos) << error.what();
  }
  EXPECT_THROW(BufferOptions{}.validate(0), Error);
}

TEST(BufferOptions, LowLatencyRegionIsAllowedInsideOneNode) {
  BufferOptions options;
  options.low_latency_mode = true;
  options.num_rdma_bytes = 1 << 20;
  EXPECT_EQ(validation_error(options, 8), "");
  options.num_rdma_bytes = 1000;
  EXPECT_NE(validation_error(options, 8).find("num_rdma_bytes=1000 must be a multiple of 128"), std::string::npos);
}

TEST(BufferOptions, ShrinkModeNeedsLowLatencyMode) {
  BufferOptions options;
  options.enable_shrink = true;
  EXPECT_NE(validation_error(options, 8).find("enable_shrink=true needs low_latency_mode=true"), std::string::npos);
  options.low_latency_mode = true;
  EXPECT_EQ(validation_error(options, 8), "");
}

// Shrink mode: a dead peer is kept (named by later normal-mode calls) but does not fail the
// low-latency ones (the dead rank is masked on the device instead).
TEST(DeviceErrorLog, InShrinkModeADeadPeerIsFatalOnlyWhereAsked) {
  detail::DeviceErrorLog log;
  log.mark_peers_dead({{2, 99}});
  EXPECT_NO_THROW(log.raise_if_recorded(/*dead_peers_fatal=*/false));
  try {
    log.raise_if_recorded();
    FAIL() << "a dead peer was not raised";
  } catch (const Error& error) {
    EXPECT_EQ(error.code(), ErrorCode::kPeerFailed);
    EXPECT_NE(std::string(error.what()).find("rank 2 (pid 99)"), std::string::npos) << error.what();
  }
}

TEST(BufferOptions, WarmupShapeIsCheckedFieldByField) {
  BufferOptions options;
  options.low_latency_mode = true;
  options.warmup_shape = WarmupShape{4096, 128, 7168, 8, 256};
  EXPECT_EQ(validation_error(options, 8), "");
  options.warmup_shape.hidden = 7170;
  EXPECT_NE(validation_error(options, 8).find("warmup_shape.hidden=7170"), std::string::npos);
  options.warmup_shape.hidden = 7168;
  options.warmup_shape.num_experts = 250;
  EXPECT_NE(validation_error(options, 8).find("warmup_shape.num_experts=250"), std::string::npos);
  options.warmup_shape.num_experts = 256;
  options.warmup_shape.num_topk = 0;
  EXPECT_NE(validation_error(options, 8).find("warmup_shape.num_topk=0"), std::string::npos);
  options.warmup_shape.num_topk = 8;
  options.warmup_shape.num_tokens = -1;
  EXPECT_NE(validation_error(options, 8).find("warmup_shape.num_tokens=-1"), std::string::npos);
  options.warmup_shape.num_tokens = 0;
  options.low_latency_mode = false;
  EXPECT_NE(validation_error(options, 8).find("needs low_latency_mode"), std::string::npos);
  options.low_latency_mode = true;
  options.warmup_shape = WarmupShape{0, 128, 7168, 17, 256};
  EXPECT_NE(validation_error(options, 8).find("exceeds low-latency mode's limits"), std::string::npos);
  options.warmup_shape = WarmupShape{0, 4096, 7168, 8, 256};  // 32768 token x top-k pairs
  EXPECT_NE(validation_error(options, 8).find("num_low_latency_tokens=4096"), std::string::npos);
  options.warmup_shape = WarmupShape{4096, 0, 7168, 33, 256};
  EXPECT_NE(validation_error(options, 8).find("warmup_shape.num_topk=33"), std::string::npos);
  // No shape, no checks of the other fields: they are unused.
  options.warmup_shape = WarmupShape{0, 0, 3, 0, 0};
  EXPECT_EQ(validation_error(options, 8), "");
}

// An 8-rank job on one host and node, and in two emulated nodes (and hosts) of 4.
constexpr detail::Topology kOneNode{8, 8, 8};
constexpr detail::Topology kTwoNodes{8, 4, 4};

TEST(BufferOptions, WarmupShapeMustFitTheBuffers) {
  BufferOptions options;
  options.low_latency_mode = true;
  options.warmup_shape = WarmupShape{4096, 0, 7168, 8, 256};
  options.num_nvl_bytes = 1 << 20;
  try {
    detail::check_warmup_fits(options, kOneNode);
    FAIL();
  } catch (const Error& error) {
    EXPECT_EQ(error.code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(std::string(error.what()).find("needs num_nvl_bytes >= "), std::string::npos) << error.what();
  }
  options.num_nvl_bytes = default_dispatch_config(8).nvl_buffer_size_hint(7168 * 2, 8);  // what callers allocate
  EXPECT_NO_THROW(detail::check_warmup_fits(options, kOneNode));
  options.warmup_shape.num_low_latency_tokens = 128;
  options.num_rdma_bytes = Buffer::low_latency_buffer_size_hint(64, 7168, 8, 256);
  EXPECT_THROW(detail::check_warmup_fits(options, kOneNode), Error);
  options.num_rdma_bytes = Buffer::low_latency_buffer_size_hint(128, 7168, 8, 256);
  EXPECT_NO_THROW(detail::check_warmup_fits(options, kOneNode));
}

TEST(BufferOptions, WarmupRingsAreStagedOnlyForRanksOnAnotherHost) {
  BufferOptions options;
  options.warmup_shape = WarmupShape{4096, 0, 7168, 8, 256};
  // Room for the smallest unstaged rings a full-size round falls back to, not for staged ones.
  Config smallest;
  smallest.num_sms = kFullSizeRoundSms;
  smallest.num_max_nvl_chunked_recv_tokens = kMinRingTokens;
  options.num_nvl_bytes = smallest.ring_buffer_bytes(7168 * 2, 8, /*staged=*/false);
  // Two nodes of one host without a rail region: flat, every rank reached by store, no staging.
  EXPECT_NO_THROW(detail::check_warmup_fits(options, detail::Topology{8, 4, 8}));
  // Two emulated nodes (hosts): the rings are staged, twice the size.
  try {
    detail::check_warmup_fits(options, kTwoNodes);
    FAIL();
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("needs num_nvl_bytes >= "), std::string::npos) << error.what();
  }
}

TEST(BufferOptions, WarmupWithARailRegionSizesEachStageByItsRanks) {
  BufferOptions options;
  options.warmup_shape = WarmupShape{4096, 0, 7168, 8, 256};
  options.emulated_nodes = 2;  // 2 x 4
  const Config config = default_dispatch_config(8);
  options.num_nvl_bytes = config.nvl_buffer_size_hint(7168 * 2, 4);  // one node's ranks, unstaged
  options.num_rdma_bytes = config.rdma_buffer_size_hint(7168 * 2, 2);
  EXPECT_NO_THROW(detail::check_warmup_fits(options, kTwoNodes));
  options.num_rdma_bytes = 1 << 20;  // not even the smallest rail rings
  try {
    detail::check_warmup_fits(options, kTwoNodes);
    FAIL();
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("needs num_rdma_bytes >= "), std::string::npos) << error.what();
  }
  // On one node the rail region goes unused (normal mode is flat), so its size is not checked.
  EXPECT_NO_THROW(detail::check_warmup_fits(options, kOneNode));
  // Low-latency mode across nodes: the rail rings beside the low-latency region, num_rail_bytes.
  options.low_latency_mode = true;
  options.num_rdma_bytes = Buffer::low_latency_buffer_size_hint(128, 7168, 8, 256);
  ASSERT_GE(options.num_rdma_bytes, config.rdma_buffer_size_hint(7168 * 2, 2));
  EXPECT_NO_THROW(detail::check_warmup_fits(options, kTwoNodes)) << "num_rail_bytes -1: num_rdma_bytes again";
  options.num_rail_bytes = 1 << 20;
  try {
    detail::check_warmup_fits(options, kTwoNodes);
    FAIL();
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("needs num_rail_bytes >= "), std::string::npos) << error.what();
  }
  options.num_rail_bytes = 0;  // no rail region: flat across the nodes, nothing of it to check
  EXPECT_NO_THROW(detail::check_warmup_fits(options, kTwoNodes));
}

TEST(LowLatencySizeHint, CoversTheLayoutAndGrowsWithEveryShape) {
  const int64_t base = Buffer::low_latency_buffer_size_hint(128, 7168, 8, 256);
  EXPECT_GT(base, 0);
  EXPECT_EQ(base % 128, 0);
  // Two sets of [E_local][R][M] bf16 rows at least.
  EXPECT_GE(base, 2LL * 32 * 8 * 128 * 7168 * 2);
  EXPECT_GT(Buffer::low_latency_buffer_size_hint(256, 7168, 8, 256), base);
  EXPECT_GT(Buffer::low_latency_buffer_size_hint(128, 8192, 8, 256), base);
  EXPECT_THROW(Buffer::low_latency_buffer_size_hint(128, 7168, 8, 250), Error);  // 250 % 8 != 0
  EXPECT_THROW(Buffer::low_latency_buffer_size_hint(0, 7168, 8, 256), Error);
  EXPECT_THROW(Buffer::low_latency_buffer_size_hint(128, 100, 8, 256), Error);  // rows not 16-byte multiples
}

TEST(LowLatencySizeHint, ARankCountOutOfRangeIsNamedNotDividedBy) {
  // num_ranks 0 divided num_experts (SIGFPE); a negative one passed with a wrapped size.
  for (const int ranks : {0, -8, kMaxRanks + 1}) {
    const std::string message = error_from([&] { (void)Buffer::low_latency_buffer_size_hint(128, 7168, ranks, 256); });
    EXPECT_NE(message.find("num_ranks=" + std::to_string(ranks)), std::string::npos) << message;
  }
}

TEST(NormalSizeHint, BadRowSizesAndRankCountsAreNamed) {
  const Config config = default_dispatch_config(8);
  for (const int64_t hidden_bytes : {int64_t{0}, int64_t{-16}, int64_t{100}}) {
    const std::string message = error_from([&] { (void)config.nvl_buffer_size_hint(hidden_bytes, 8); });
    EXPECT_NE(message.find("hidden_bytes=" + std::to_string(hidden_bytes)), std::string::npos) << message;
  }
  // The rank count is named as such, not blamed on num_nodes.
  EXPECT_NE(error_from([&] { (void)config.nvl_buffer_size_hint(7168 * 2, 0); }).find("num_ranks=0"), std::string::npos);
  EXPECT_NE(error_from([&] { (void)config.ring_buffer_bytes(7168 * 2, -3, false); }).find("num_ranks=-3"),
            std::string::npos);
  EXPECT_NE(error_from([&] { (void)config.rdma_buffer_size_hint(-16, 2); }).find("hidden_bytes=-16"), std::string::npos);
}

TEST(Config, AHugeSendChunkNeedsAHugeRingNotAWrappedOne) {
  // send chunk INT_MAX: its bound used to wrap to 64 tokens, so a ring of 128 passed and the
  // dispatch waited for ring space it could never get.
  Config config = default_dispatch_config(8);
  config.num_max_nvl_chunked_send_tokens = INT32_MAX;
  config.num_max_nvl_chunked_recv_tokens = 128;
  EXPECT_NE(error_from([&] { config.validate(); }).find("num_max_nvl_chunked_recv_tokens=128 must be at least"),
            std::string::npos);
  EXPECT_GT(min_ring_tokens(INT32_MAX), int64_t{INT32_MAX});
}

TEST(NormalSizeHint, FitsTheRingsOfTheConfig) {
  const Config config = default_dispatch_config(8);
  const int64_t hint = config.nvl_buffer_size_hint(7168 * 2, 8);
  // channels x ranks x ring slots x (row + metadata).
  EXPECT_GE(hint, static_cast<int64_t>(config.num_channels()) * 8 * config.num_max_nvl_chunked_recv_tokens * 7168 * 2);
  EXPECT_EQ(hint % 128, 0);
  EXPECT_NO_THROW(default_dispatch_config(16));  // 2 nodes of 8, hierarchical
  EXPECT_THROW(default_dispatch_config(kMaxRanks + 1), Error);
  EXPECT_THROW(default_dispatch_config(0), Error);
}

TEST(BufferOptions, PastEightRanksNormalModeIsHierarchicalOnly) {
  BufferOptions options;
  options.num_nvl_bytes = 1 << 20;
  EXPECT_NE(validation_error(options, 16).find("its rail stage needs a region: pass num_rdma_bytes > 0"), std::string::npos);
  options.num_rdma_bytes = 1 << 20;  // a rail region: the nodes are checked once known
  EXPECT_EQ(validation_error(options, 16), "");
  options.low_latency_mode = true;  // num_rdma_bytes is the low-latency region; the rail's too, beside it
  EXPECT_EQ(validation_error(options, 16), "");
  options.num_rail_bytes = 0;  // no rail region: flat, at most 8 ranks
  EXPECT_NE(validation_error(options, 16).find("its rail stage needs a region: pass num_rdma_bytes > 0"), std::string::npos);
  options.num_rail_bytes = 1 << 20;
  EXPECT_EQ(validation_error(options, 16), "");
}

// Low-latency mode's rail region: num_rdma_bytes again by default, its own size, or none; only in
// low-latency mode, only with normal mode (num_nvl_bytes), never a size that breaks alignment.
TEST(BufferOptions, RailBytesAcrossNodes) {
  BufferOptions options;
  options.num_rdma_bytes = 4 << 20;
  EXPECT_EQ(options.rail_bytes_across_nodes(), 4 << 20) << "without low-latency mode num_rdma_bytes is the rail's";
  options.num_nvl_bytes = 1 << 20;
  options.low_latency_mode = true;
  EXPECT_EQ(options.rail_bytes_across_nodes(), 4 << 20) << "deep_ep's callers size num_rdma_bytes for both modes";
  options.num_rail_bytes = 2 << 20;
  EXPECT_EQ(options.rail_bytes_across_nodes(), 2 << 20);
  options.num_rail_bytes = 0;
  EXPECT_EQ(options.rail_bytes_across_nodes(), 0);
  options.num_rail_bytes = -1;
  options.num_nvl_bytes = 0;
  EXPECT_EQ(options.rail_bytes_across_nodes(), 0) << "no normal mode, no rail rings";

  BufferOptions bad;
  bad.num_nvl_bytes = 1 << 20;
  bad.num_rdma_bytes = 1 << 20;
  bad.num_rail_bytes = 1 << 20;
  EXPECT_NE(validation_error(bad, 2).find("num_rail_bytes=1048576 is for low-latency mode"), std::string::npos)
      << validation_error(bad, 2);
  bad.low_latency_mode = true;
  bad.num_rail_bytes = -2;
  EXPECT_NE(validation_error(bad, 2).find("num_rail_bytes=-2"), std::string::npos);
  bad.num_rail_bytes = (1 << 20) + 1;
  EXPECT_NE(validation_error(bad, 2).find("multiple of"), std::string::npos);
}

TEST(Config, DefaultsAreValidAndBadFieldsNamed) {
  EXPECT_NO_THROW(Config{}.validate());
  Config config;
  config.num_sms = 7;
  try {
    config.validate();
    FAIL();
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("num_sms=7"), std::string::npos);
  }
  config = Config{};
  config.num_max_nvl_chunked_recv_tokens = config.num_max_nvl_chunked_send_tokens;
  EXPECT_THROW(config.validate(), Error);
  config = Config{};
  config.num_max_nvl_chunked_send_tokens = 48;  // a 64-token stretch unpublished + a window: 96
  config.num_max_nvl_chunked_recv_tokens = 64;
  try {
    config.validate();
    FAIL();
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("must be at least 96"), std::string::npos) << error.what();
  }
  config.num_max_nvl_chunked_recv_tokens = 96;
  EXPECT_NO_THROW(config.validate());
  config = Config{};
  config.num_max_rdma_chunked_send_tokens = 0;
  EXPECT_THROW(config.validate(), Error);
}

// A timed-out wait's record: `rank` waited `limit_ms` in `op` for `peer`'s `target`.
DeviceErrorRecord timeout_record(DeviceOp op, WaitTarget target, int rank, int peer, int64_t expected, int64_t observed,
                                 int64_t limit_ms) {
  DeviceErrorRecord record{};
  record.kind = static_cast<int32_t>(DeviceErrorKind::kWaitTimeout);
  record.op = static_cast<int32_t>(op);
  record.target = static_cast<int32_t>(target);
  record.rank = rank;
  record.peer = peer;
  record.channel = -1;
  record.expected = expected;
  record.observed = observed;
  record.limit = limit_ms * 1000 * 1000;
  return record;
}

TEST(DeviceErrorLog, TimeoutMessageSaysWhoWaitedForWhom) {
  DeviceErrorRecord record = timeout_record(DeviceOp::kBarrier, WaitTarget::kBarrierSignal, 2, 5, 7, 6, 1500);
  EXPECT_EQ(detail::DeviceErrorLog::describe(record),
            "rank 2 waited 1500 ms in barrier for rank 5's barrier signal (expected >= 7, last saw 6); that rank "
            "may have died, be stuck, or not have made the same call");
  record.channel = 3;
  EXPECT_NE(detail::DeviceErrorLog::describe(record).find("on channel 3"), std::string::npos);
}

TEST(DeviceErrorLog, ATimeoutInsideOneLaunchSaysTheBlocksDidNotRunTogether) {
  DeviceErrorRecord record = timeout_record(DeviceOp::kCombine, WaitTarget::kLaunchCheckins, 3, 3, 23, 20, 2000);
  EXPECT_EQ(detail::DeviceErrorLog::describe(record),
            "rank 3 waited 2000 ms in combine for its own kernel's blocks to start (expected >= 23, last saw 20); "
            "the kernel's blocks did not all run at once (other work on the GPU, or too many ranks' blocks for its "
            "SMs?)");
  record.target = static_cast<int32_t>(WaitTarget::kLaunchGo);
  EXPECT_NE(detail::DeviceErrorLog::describe(record).find("for its own kernel's block 0 to pass the checked barrier"),
            std::string::npos);
}

TEST(DeviceErrorLog, InvalidIdMessageNamesTokenSlotAndValue) {
  DeviceErrorRecord record{};
  record.kind = static_cast<int32_t>(DeviceErrorKind::kInvalidExpertId);
  record.op = static_cast<int32_t>(DeviceOp::kDispatchLayout);
  record.rank = 1;
  record.index0 = 3;
  record.index1 = 1;
  record.observed = 300;
  record.limit = 256;
  EXPECT_EQ(detail::DeviceErrorLog::describe(record),
            "rank 1: get_dispatch_layout: topk_idx[3][1] = 300 is outside [-1, 256) (num_experts=256)");
}

// A device error record of ranks that made different calls: `rank` found `peer` calling with
// `observed` where it called with `expected`, in `field`.
DeviceErrorRecord call_mismatch(DeviceOp op, int rank, int peer, CallField field, int64_t expected, int64_t observed) {
  DeviceErrorRecord record{};
  record.kind = static_cast<int32_t>(DeviceErrorKind::kCallMismatch);
  record.op = static_cast<int32_t>(op);
  record.rank = rank;
  record.peer = peer;
  record.index0 = static_cast<int64_t>(field);
  record.expected = expected;
  record.observed = observed;
  return record;
}

TEST(DeviceErrorLog, CallMismatchMessageNamesBothRanksTheFieldAndTheirValues) {
  const DeviceErrorRecord record = call_mismatch(DeviceOp::kLowLatencyDispatch, 0, 2, CallField::kMaxTokens, 128, 256);
  const std::string message = detail::DeviceErrorLog::describe(record);
  EXPECT_NE(message.find("rank 2 called with num_max_dispatch_tokens_per_rank = 256, rank 0 with 128"), std::string::npos)
      << message;
  EXPECT_NE(message.find("this call's outputs are unspecified"), std::string::npos) << message;
}

// A low-latency combine whose ranks disagree on the sums' format: named, and its outputs are
// unspecified (the sums were sent).
TEST(DeviceErrorLog, LowLatencyCombineMismatchNamesUseLogfmt) {
  const DeviceErrorRecord record = call_mismatch(DeviceOp::kLowLatencyCombine, 1, 0, CallField::kSumFormat, 0, 1);
  const std::string message = detail::DeviceErrorLog::describe(record);
  EXPECT_NE(message.find("rank 1: low_latency_combine: rank 0 called with use_logfmt = 1, rank 1 with 0: every rank "
                         "must make the same call (this call's outputs are unspecified)"),
            std::string::npos)
      << message;
}

// A combine whose ranks pass handles of different dispatches: the checked barrier names both
// dispatch numbers, and nothing was sent.
TEST(DeviceErrorLog, CombineWithAnotherDispatchsHandleNamesBothDispatchNumbers) {
  const DeviceErrorRecord record = call_mismatch(DeviceOp::kCombine, 1, 0, CallField::kDispatchNumber, 7, 6);
  const std::string message = detail::DeviceErrorLog::describe(record);
  EXPECT_NE(message.find("rank 1: combine: rank 0 called with dispatch number (this dispatch's, or the handle's) = 6, "
                         "rank 1 with 7: every rank must make the same call (nothing was sent)"),
            std::string::npos)
      << message;
}

// A peer that reached the checked barrier by another way (a plain barrier) made no checked call.
TEST(DeviceErrorLog, APeerWithoutACheckedCallIsNamed) {
  DeviceErrorRecord record = call_mismatch(DeviceOp::kCombine, 0, 3, CallField::kOperation,
                                           static_cast<int64_t>(DeviceOp::kCombine), static_cast<int64_t>(DeviceOp::kNone));
  EXPECT_EQ(detail::DeviceErrorLog::describe(record),
            "rank 0: combine: rank 3 made no call that is checked there where rank 0 made combine: every rank must "
            "make the same call (nothing was sent)");
  record.observed = static_cast<int64_t>(DeviceOp::kDispatch);
  EXPECT_NE(detail::DeviceErrorLog::describe(record).find("rank 3 made dispatch where rank 0 made combine"),
            std::string::npos);
}

// Every field a rank can disagree on has a name in the message.
TEST(DeviceErrorLog, AFailedEarlierStageNamesTheRankWhoseStageFailed) {
  // Rank 1 saw rank 4's earlier stage fail (observed 1), and rank 4 saw its own (expected 1).
  std::string message = detail::DeviceErrorLog::describe(call_mismatch(DeviceOp::kDispatch, 1, 4,
                                                                       CallField::kEarlierStageFailed, 0, 1));
  EXPECT_NE(message.find("rank 1: dispatch: rank 4's other stage of this call (hierarchical mode) found ranks making "
                         "different calls"), std::string::npos) << message;
  message = detail::DeviceErrorLog::describe(call_mismatch(DeviceOp::kCombine, 4, 1, CallField::kEarlierStageFailed, 1, 0));
  EXPECT_NE(message.find("rank 4: combine: rank 4's other stage"), std::string::npos) << message;
}

TEST(CallFields, TheOperationAndAnEarlierStageAreComparedFirstThenEveryFieldOnce) {
  constexpr int kFields = static_cast<int>(CallField::kCount);
  EXPECT_EQ(compared_field(0), static_cast<int>(CallField::kOperation));
  EXPECT_EQ(compared_field(1), static_cast<int>(CallField::kEarlierStageFailed));
  std::vector<int> seen(kFields, 0);
  for (int i = 0; i < kFields; ++i) ++seen[compared_field(i)];
  EXPECT_EQ(seen, std::vector<int>(kFields, 1));
}

TEST(DeviceErrorLog, EveryCallFieldHasAName) {
  for (int field = 0; field < static_cast<int>(CallField::kCount); ++field) {
    DeviceErrorRecord record{};
    record.kind = static_cast<int32_t>(DeviceErrorKind::kCallMismatch);
    record.op = static_cast<int32_t>(DeviceOp::kDispatch);
    record.index0 = field;
    EXPECT_EQ(detail::DeviceErrorLog::describe(record).find("(unknown field)"), std::string::npos) << "field " << field;
  }
}

}  // namespace
}  // namespace epcomm
