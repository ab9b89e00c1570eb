// The buffer layouts on the host alone: regions of a rank's buffer never overlap, every offset a
// kernel hands to the transport window is aligned as its accesses need, and the low-latency
// zero-copy combine input has a place of its own in each set.
#include <gtest/gtest.h>

#include <iterator>

#include "common/buffer_layout.hpp"
#include "common/low_latency_layout.hpp"

namespace epcomm {
namespace {

TEST(BufferLayout, RegionsFollowEachOtherInOrder) {
  BufferLayout layout;
  layout.nvl_bytes = 3 * kRegionAlignment;
  layout.low_latency_bytes = 5 * kRegionAlignment;
  EXPECT_EQ(BufferLayout::normal_offset(), NvlLayout::kDataOffset);  // after the barrier's control block
  EXPECT_GE(BufferLayout::normal_offset(), NvlLayout::kControlEnd);
  EXPECT_EQ(BufferLayout::nvl_offset(), BufferLayout::normal_offset() + NvlLayout::kDataOffset);
  EXPECT_EQ(layout.low_latency_offset(), BufferLayout::nvl_offset() + layout.nvl_bytes);
  EXPECT_EQ(layout.total_bytes(), layout.low_latency_offset() + layout.low_latency_bytes);
  EXPECT_EQ(layout.rail_region_bytes(), 0u);  // no rail stage: nothing between the rings and low latency
}

TEST(BufferLayout, RailRegionHasItsOwnControlBlock) {
  BufferLayout layout;
  layout.nvl_bytes = 3 * kRegionAlignment;
  layout.rail_ring_bytes = 2 * kRegionAlignment;
  layout.low_latency_bytes = 5 * kRegionAlignment;
  EXPECT_EQ(layout.rail_offset(), BufferLayout::nvl_offset() + layout.nvl_bytes);
  EXPECT_EQ(layout.rail_region_bytes(), NvlLayout::kDataOffset + layout.rail_ring_bytes);
  EXPECT_EQ(layout.low_latency_offset(), layout.rail_offset() + layout.rail_region_bytes());
  EXPECT_EQ(layout.rail_offset() % kRegionAlignment, 0u);
  EXPECT_EQ(layout.low_latency_offset() % kRegionAlignment, 0u);
}

TEST(NvlLayout, RingSlotsStartAfterTheControlBlock) {
  RingLayout ring;
  ring.slot = SlotLayout::dispatch(7168, 56, 8);
  ring.num_ranks = 8;
  ring.capacity = 128;
  EXPECT_EQ(ring.slot_at(0, 0, 0), NvlLayout::kDataOffset);
  EXPECT_EQ(ring.slot_at(0, 0, 128), NvlLayout::kDataOffset);  // positions wrap around the ring
  EXPECT_EQ(ring.slot_at(1, 2, 3), NvlLayout::kDataOffset + ((1 * 8 + 2) * 128 + 3) * ring.slot.bytes);
  EXPECT_EQ(NvlLayout::ring_tail(1, 2) % sizeof(uint64_t), 0u);
  // Barrier signals for every rank a Buffer may have (low-latency mode's too), before the header.
  EXPECT_LE(NvlLayout::barrier_signal(kMaxRanks - 1) + sizeof(uint64_t), NvlLayout::barrier_epoch());
  EXPECT_LE(NvlLayout::call_verdict() + sizeof(int32_t), NvlLayout::ring_tail(0, 0));
  EXPECT_LT(NvlLayout::notify_slot(1, kMaxNvlPeers - 1) + sizeof(NotifySlot), NvlLayout::kControlEnd + 1);
}

// The checked barrier's slots: one per (parity, source), apart, after the notify slots and
// inside the control block, their epochs 8-byte aligned; the verdict word in the owner-only header.
TEST(NvlLayout, CheckedCallSlotsAreApartAndInsideTheControlBlock) {
  EXPECT_GE(NvlLayout::call_slot(0, 0), NvlLayout::notify_slot(1, kMaxNvlPeers - 1) + sizeof(NotifySlot));
  EXPECT_EQ(NvlLayout::call_slot(0, 1) - NvlLayout::call_slot(0, 0), sizeof(CheckedCallSlot));
  EXPECT_EQ(NvlLayout::call_slot(1, 0), NvlLayout::call_slot(0, kMaxNvlPeers - 1) + sizeof(CheckedCallSlot));
  EXPECT_LE(NvlLayout::call_slot(1, kMaxNvlPeers - 1) + sizeof(CheckedCallSlot), NvlLayout::kControlEnd);
  EXPECT_EQ(NvlLayout::call_slot(1, 3) % sizeof(uint64_t), 0u);
  EXPECT_GE(NvlLayout::call_verdict(), NvlLayout::notify_parity() + sizeof(uint64_t));
  EXPECT_LE(NvlLayout::call_verdict() + sizeof(int32_t), NvlLayout::ring_tail(0, 0));
}

// Across nodes a sender stages what it puts: its staging rings follow the receive rings, each slot
// at the same index as the slot it is put into, so a run of positions is one copy on both sides.
TEST(NvlLayout, StagingRingsFollowTheReceiveRingsSlotForSlot) {
  RingLayout ring;
  ring.slot = SlotLayout::combine(7168 * 2, 8);
  ring.num_ranks = 4;
  ring.num_channels = 6;
  ring.capacity = 64;
  EXPECT_EQ(ring.total_bytes(), ring.receive_bytes());
  ring.staged = true;
  EXPECT_EQ(ring.total_bytes(), 2 * ring.receive_bytes());
  EXPECT_EQ(ring.receive_bytes(), size_t{6} * 4 * 64 * ring.slot.bytes);
  EXPECT_EQ(ring.staging_at(0, 0, 0), NvlLayout::kDataOffset + ring.receive_bytes());
  for (const uint64_t position : {uint64_t{0}, uint64_t{63}, uint64_t{64}, uint64_t{1000}}) {
    EXPECT_EQ(ring.staging_at(5, 3, position) - ring.staging_at(0, 0, 0), ring.slot_at(5, 3, position) - ring.slot_at(0, 0, 0));
  }
  EXPECT_EQ(ring.staging_at(5, 3, 63) + ring.slot.bytes, NvlLayout::kDataOffset + ring.total_bytes());
  EXPECT_EQ(ring.staging_at(2, 1, 7) % kVectorBytes, 0u);
  // The staged notify slots: inside the control block, after the checked barrier's, aligned.
  EXPECT_GE(NvlLayout::notify_staging(0), NvlLayout::call_slot(1, kMaxNvlPeers - 1) + sizeof(CheckedCallSlot));
  EXPECT_LE(NvlLayout::notify_staging(kMaxNvlPeers - 1) + NvlLayout::kNotifySlotBytes, NvlLayout::kControlEnd);
  EXPECT_EQ(NvlLayout::notify_staging(3) % kRegionAlignment, 0u);
}

// A combine's signatures: apart from the dispatch's, one slot per (set, epoch parity, owner), inside
// the control block (an owner in hook mode may write the set's next combine's before this one's
// is read).
TEST(LowLatencyLayout, CombineSignaturesHaveSlotsOfTheirOwnByEpochParity) {
  const LowLatencyLayout layout = LowLatencyLayout::of(4096, 8, 256, 128, 7168);
  const int last = kMaxRanks - 1;
  EXPECT_GE(layout.combine_signature(0, 0, 0), layout.signature(LowLatencyLayout::kNumSets - 1, last) + sizeof(CallSignature));
  EXPECT_NE(layout.combine_signature(1, 6, 3), layout.combine_signature(1, 7, 3));
  EXPECT_EQ(layout.combine_signature(1, 6, 3), layout.combine_signature(1, 8, 3));
  EXPECT_LE(layout.combine_signature(LowLatencyLayout::kNumSets - 1, 1, last) + sizeof(CallSignature),
            layout.base + LowLatencyLayout::kControlBytes);
  EXPECT_EQ(layout.combine_signature(0, 1, 2) % sizeof(int32_t), 0u);
}

// A routed pair carries its expert and its capped index; "no expert" stays -1 and unpacks as none.
// A flag carries the set's call count (its epoch) above the row count. The count never wraps in
// practice: a 32-bit one did after 2^32 calls of a set, and then a wait for a new call
// (pack_flag(epoch, 0)) passed on any stale flag.
TEST(LowLatencyFlag, CarriesEpochsPast32BitsAndOrdersByEpochFirst) {
  const uint64_t epoch = (uint64_t{1} << 32) + 5;
  const uint64_t flag = pack_flag(epoch, kMaxLowLatencyPairs);
  EXPECT_EQ(flag_epoch(flag), epoch);
  EXPECT_EQ(flag_rows(flag), static_cast<uint32_t>(kMaxLowLatencyPairs));
  EXPECT_EQ(flag_rows(pack_flag(epoch, 0)), 0u);
  // A waiter for epoch e takes a flag of e (any rows) or later, never one of e - 1.
  EXPECT_GE(flag, pack_flag(epoch, 0));
  EXPECT_LT(pack_flag(epoch - 1, kMaxLowLatencyPairs), pack_flag(epoch, 0));
  EXPECT_GT(pack_flag(epoch, 0), uint64_t{0});
}

TEST(RoutedPair, PacksTheExpertAndTheIndexAndStaysNonNegative) {
  for (const int expert : {0, 1, 255, kMaxLowLatencyExperts - 1}) {
    for (const int index : {0, 1, 127, kMaxLowLatencyPairs}) {
      const int32_t entry = RoutedPair::pack(expert, index);
      EXPECT_GE(entry, 0) << expert << ", " << index;
      EXPECT_EQ(RoutedPair::expert(entry), expert);
      EXPECT_EQ(RoutedPair::index(entry), index);
    }
  }
  EXPECT_EQ(RoutedPair::expert(RoutedPair::kNone), -1);
  EXPECT_EQ(RoutedPair::index(RoutedPair::kNone), 0);
}

struct Shape {
  int ranks, experts, max_tokens, hidden;
};

class LowLatencyLayoutTest : public ::testing::TestWithParam<Shape> {};

TEST_P(LowLatencyLayoutTest, SetsAreDisjointAlignedAndHoldTheZeroCopyInput) {
  const Shape shape = GetParam();
  constexpr size_t kBase = 4096 + 128;  // where a Buffer with some normal-mode bytes puts the region
  const LowLatencyLayout layout = LowLatencyLayout::of(kBase, shape.ranks, shape.experts, shape.max_tokens, shape.hidden);
  const int last_rank = shape.ranks - 1, last_token = shape.max_tokens - 1;
  EXPECT_EQ(layout.message_stride() % kVectorBytes, 0u);
  EXPECT_EQ(layout.message_scales() % kVectorBytes, 0u);
  EXPECT_GE(layout.message_scales(), static_cast<size_t>(shape.hidden) * 2);
  EXPECT_GE(layout.message_stride(), layout.message_scales() + shape.hidden / kFp8ChannelsPerScale * sizeof(float));
  EXPECT_GE(layout.routing_bytes(), static_cast<size_t>(shape.max_tokens) * kMaxLowLatencyTopk * sizeof(int32_t));
  // A combine's row: BF16 positions, then LogFMT's (L_min, step) per 128 channels, 16-byte aligned.
  EXPECT_EQ(layout.sum_stride() % kVectorBytes, 0u);
  EXPECT_GE(layout.sum_stride(), layout.logfmt_meta() + shape.hidden / kLogfmtChannelsPerGroup * 2 * sizeof(float));
  for (int set = 0; set < LowLatencyLayout::kNumSets; ++set) {
    EXPECT_EQ(layout.set(set) % kRegionAlignment, kBase % kRegionAlignment);
    EXPECT_GE(layout.set(set), kBase + LowLatencyLayout::kControlBytes);
    // Every part follows the one before it inside the set, 16-byte aligned.
    const size_t ends[] = {
        layout.token(set, last_rank, last_token) + layout.message_stride(),
        layout.routing(set, last_rank) + layout.routing_bytes(),
        layout.counts(set, last_rank) + layout.experts_per_rank * sizeof(int32_t),
        layout.weights(set, last_rank) + layout.routing_bytes(),
        layout.staging(set, last_token) + layout.message_stride(),
        layout.ids(set) + layout.routing_bytes(),
        layout.count_staging(set) + static_cast<size_t>(shape.experts) * sizeof(int32_t),
        layout.partial(set, last_rank, last_token) + layout.sum_stride(),
        layout.returned(set, last_rank, last_token) + layout.sum_stride(),
        layout.combine_input(set) + layout.combine_rows() * shape.hidden * 2,
    };
    const size_t starts[] = {
        layout.token(set, 0, 0),    layout.routing(set, 0),      layout.counts(set, 0),
        layout.weights(set, 0),     layout.staging(set, 0),      layout.ids(set),
        layout.count_staging(set),  layout.partial(set, 0, 0),   layout.returned(set, 0, 0),
        layout.combine_input(set),
    };
    EXPECT_EQ(starts[0], layout.set(set));
    for (size_t part = 0; part < std::size(starts); ++part) {
      EXPECT_EQ(starts[part] % kVectorBytes, 0u) << "part " << part;
      if (part > 0) {
        EXPECT_LE(ends[part - 1], starts[part]) << "part " << part;
      }
    }
    EXPECT_LE(ends[std::size(ends) - 1], layout.set(set) + layout.set_bytes());
  }
  EXPECT_EQ(layout.set(1), layout.set(0) + layout.set_bytes());
  EXPECT_LE(layout.set(1) + layout.set_bytes(), kBase + layout.total_bytes());
  // Flags sit in the control block, apart for every (set, rank) and kind.
  EXPECT_LT(layout.dispatch_flag(1, kMaxRanks - 1), layout.weights_flag(0, 0));
  EXPECT_LT(layout.weights_flag(1, kMaxRanks - 1), layout.combine_flag(0, 0));
  EXPECT_LT(layout.combine_flag(1, kMaxRanks - 1), kBase + LowLatencyLayout::kControlBytes);
  // The agreed arrivals (16 bytes, atomically swapped): aligned for it, past the send counters,
  // before the flags, the two sets' apart.
  for (int set = 0; set < LowLatencyLayout::kNumSets; ++set) {
    EXPECT_EQ(layout.dispatch_arrivals(set) % LowLatencyLayout::kDispatchArrivalsBytes, 0u);
    EXPECT_GE(layout.dispatch_arrivals(set), layout.send_blocks_done(LowLatencyLayout::kNumSets - 1) + sizeof(uint32_t));
    EXPECT_LE(layout.dispatch_arrivals(set) + LowLatencyLayout::kDispatchArrivalsBytes, layout.dispatch_flag(0, 0));
  }
  EXPECT_EQ(layout.dispatch_arrivals(1), layout.dispatch_arrivals(0) + LowLatencyLayout::kDispatchArrivalsBytes);
}

// With the region's size, each set starts at a fixed half of it whatever the call's shapes: a call
// whose ranks disagree about the shapes writes only into its own set.
TEST(LowLatencyLayout, SetsStartAtFixedHalvesOfTheRegion) {
  constexpr size_t kBase = 4096;
  const size_t region = LowLatencyLayout::of(0, 8, 256, 128, 7168).total_bytes();
  const LowLatencyLayout large = LowLatencyLayout::of(kBase, 8, 256, 128, 7168, region);
  const LowLatencyLayout small = LowLatencyLayout::of(kBase, 8, 64, 17, 2048, region);
  for (int set = 0; set < LowLatencyLayout::kNumSets; ++set) {
    EXPECT_EQ(large.set(set), small.set(set));
    EXPECT_LE(large.set(set) + large.set_bytes(), large.set(set) + large.set_stride()) << "the call fits its half";
    EXPECT_LE(small.set(set) + small.set_bytes(), small.set(set) + small.set_stride());
  }
  EXPECT_EQ(large.set(1), large.set(0) + large.set_stride());
  EXPECT_LE(large.set(1) + large.set_stride(), kBase + region);
}

INSTANTIATE_TEST_SUITE_P(Shapes, LowLatencyLayoutTest,
                         ::testing::Values(Shape{1, 8, 1, 128}, Shape{2, 256, 128, 7168}, Shape{8, 256, 128, 7168},
                                           Shape{8, 64, 17, 2048}, Shape{4, 1024, 256, 8192},
                                           Shape{16, 256, 128, 7168}));

}  // namespace
}  // namespace epcomm
