// Every limit and tuning constant shared by host code and kernels, defined once.
#pragma once

#include <cstddef>
#include <cstdint>

namespace epcomm {

// Ranks of one Buffer, and so the size of every per-rank table both modes share (the transport
// window, barrier signals, low-latency flags). Low-latency mode runs them all (its kernels give a
// source a lane or a thread, never a warp of its own: a warp's lanes take ranks l, l + 32, ...);
// normal mode runs them hierarchical, in nodes of at most kMaxNvlPeers (EP64: 8 nodes of 8). 64 is
// what one 64-bit rank mask covers (common/rank_mask.hpp).
inline constexpr int kMaxRanks = 64;
// Ranks normal mode runs (its kernels give each peer a team of a half-block's warps), and so the
// size of its per-peer tables (rings, notify slots).
inline constexpr int kMaxNvlPeers = 8;

inline constexpr int kWarpSize = 32;

// The stand-alone barrier kernel's block: a thread per rank (kernels/common/block_barrier.cuh).
inline constexpr int kBarrierThreads = (kMaxRanks + kWarpSize - 1) / kWarpSize * kWarpSize;

// Alignment of every buffer region: 16 bytes is the widest vector access; 128 keeps regions on
// separate cache lines so one rank's flag writes never share a line with another's data.
inline constexpr size_t kRegionAlignment = 128;
inline constexpr size_t kVectorBytes = 16;

// Dispatch layout kernel.
inline constexpr int kLayoutThreadsPerBlock = 256;
inline constexpr int kLayoutMaxExperts = 4096;  // per-block expert histogram lives in shared memory
inline constexpr int kLayoutMaxTopk = 32;
// A token's expert ids loaded together before any is counted: one memory round trip per this many.
inline constexpr int kLayoutIdsInFlight = 8;
// Blocks of one layout launch; each leaves partial counts in the Buffer's layout workspace.
inline constexpr int kLayoutMaxBlocks = 64;

// Normal mode (intranode dispatch / combine). Each channel is one block on its own SM: half of its
// warps send, half receive (kernels/intranode/channel_block.cuh); each half is split evenly among
// the peer ranks.
inline constexpr int kMaxChannels = 64;
inline constexpr int kNormalThreadsPerBlock = 512;
inline constexpr int kNormalWarpsPerBlock = kNormalThreadsPerBlock / 32;
inline constexpr int kChannelRoleWarps = kNormalWarpsPerBlock / 2;
// A sender scans this many candidate tokens per step (one per lane of a warp).
inline constexpr int kSendWindowTokens = 32;
// The combine receiver reduces one token per warp per step.
inline constexpr int kCombineWindowTokens = kChannelRoleWarps;
// Ring capacity must hold a send window plus a combine window, or the two sides can stall.
inline constexpr int kMinRingTokens = 2 * kSendWindowTokens;
// The smallest ring (tokens) that never deadlocks with a send chunk of `send_chunk` tokens: a
// sender publishes only every send_chunk tokens, in windows of kSendWindowTokens, and may wait for
// ring space before publishing, so the ring must hold a whole unpublished stretch plus a window.
// In 64 bits: any int send_chunk (a caller's INT_MAX) gives the true bound, never a wrapped one.
constexpr int64_t min_ring_tokens(int send_chunk) {
  const int64_t stretch = (int64_t{send_chunk} + kSendWindowTokens - 1) / kSendWindowTokens * kSendWindowTokens;
  return stretch + kSendWindowTokens > kMinRingTokens ? stretch + kSendWindowTokens : int64_t{kMinRingTokens};
}
// 16-byte loads each lane keeps in flight (its registers hold them): the combine receiver, and
// the row copies of normal-mode dispatch.
inline constexpr int kCombineLoadsInFlight = 16;
inline constexpr int kRowCopyLoadsInFlight = 16;
// A rank's own rows in dispatch, copied straight from x to the output: 14 is an FP8 row of 7168
// channels in one round trip; 16 made the dispatch kernel spill in its ring loops.
inline constexpr int kOwnRowCopyLoadsInFlight = 14;
// The combine sender's row copy: it shares the kernel's 128 registers per thread with the
// receiver's loads, and 16 spills there.
inline constexpr int kCombineSendLoadsInFlight = 12;
inline constexpr int kMaxTopk = 32;
// The local experts of one rank whose counts the notify step exchanges.
inline constexpr int kMaxLocalExperts = 4096;
inline constexpr int kFp8ChannelsPerScale = 128;

// Warmup's full-size normal rounds (warmup_shape) run on this many SMs: few, so that every rank's
// blocks fit on one GPU under MPS; the rings shrink to kMinRingTokens where the defaults do not fit.
inline constexpr int kFullSizeRoundSms = 8;
static_assert(kFullSizeRoundSms >= kMaxNvlPeers, "a channel per node: the rail stage has at most kMaxNvlPeers nodes");

// Low-latency mode.
inline constexpr int kLowLatencyThreadsPerBlock = 512;
inline constexpr int kLowLatencyWarpsPerBlock = kLowLatencyThreadsPerBlock / 32;
inline constexpr int kMaxLowLatencyTopk = 16;
inline constexpr int kMaxLowLatencyExperts = 1024;
// (token, k) pairs of one low-latency dispatch at most (T x K), and M at most.
inline constexpr int kMaxLowLatencyPairs = 8192;
// Blocks of one low-latency launch at most: each owns an epoch slot per buffer set
// (common/low_latency_layout.hpp).
inline constexpr int kMaxLowLatencyBlocks = 512;
inline constexpr int kUe8m0GroupsPerInt = 4;
// A warp sends one chunk of a token's row at a time: this many 16-byte vectors (512 BF16
// channels, four FP8 scale groups).
inline constexpr int kLowLatencyChunkVectors = 64;
// The dispatch's receive copies a token in chunks of this many 16-byte vectors (8 loads in flight
// per lane: 4 KB, an FP8 row of 7168 channels in two).
inline constexpr int kLowLatencyReceiveLoadsInFlight = 8;
inline constexpr int kLowLatencyReceiveChunkVectors = kLowLatencyReceiveLoadsInFlight * kWarpSize;

// Peer copy (the bandwidth roofline): threads per block; SMs it uses when warming buffers up.
inline constexpr int kCopyWarmupSms = 16;
inline constexpr int kCopyThreadsPerBlock = 512;
// The bulk-copy (TMA) roofline: one thread per SM keeps this many chunks of shared memory in
// flight (kTmaCopyStages x kTmaCopyChunkBytes of dynamic shared memory per block), of which up to
// kTmaCopyStoresInFlight are being stored while the rest load.
inline constexpr int kTmaCopyStages = 8;
inline constexpr int kTmaCopyChunkBytes = 16 << 10;
inline constexpr int kTmaCopyStoresInFlight = 4;
static_assert(kTmaCopyStoresInFlight >= 1 && kTmaCopyStoresInFlight < kTmaCopyStages, "stages left to load into");

// Bounded waits: a spin-wait reads the global timer only every this many polls, to keep the
// timer off the hot path, and gives up after the buffer's wait timeout.
inline constexpr int kPollsPerTimerRead = 64;
inline constexpr int kPollsPerErrorCheck = 64 * kPollsPerTimerRead;
inline constexpr int64_t kDefaultWaitTimeoutMs = 100 * 1000;
// The host's wait for a notify step's counts polls without yielding its core for this long first:
// the counts usually come within 10-40 us, and a yield can take microseconds to come back from (a
// system call, and more in a sandboxed kernel), which a new routing's dispatch would pay. Where
// ranks outnumber cores, a spinning rank can hold back a peer's launch by at most this much.
inline constexpr int64_t kHostSpinBeforeYieldUs = 200;
// A host wait for a kernel that itself waits (bounded by wait_timeout) lasts this much, or a tenth
// of wait_timeout, longer: the kernel's own timeout, which names the rank, is raised first.
inline constexpr int64_t kHostWaitGraceMs = 1000;

static_assert(kMaxNvlPeers <= kMaxRanks, "normal mode's ranks are some of a Buffer's");
static_assert(kMaxRanks <= kLowLatencyThreadsPerBlock, "low-latency kernels: a thread per rank (waits, signals)");
static_assert(kMaxNvlPeers <= kWarpSize, "normal mode's kernels: a lane per peer");

}  // namespace epcomm
