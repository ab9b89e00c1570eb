// Options of a Buffer and tuning of the normal-mode kernels. Every field has a documented default;
// validate() reports the first bad field by name and value.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include <cuda_runtime_api.h>

#include "epcomm/types.hpp"

namespace epcomm {

// The largest calls a caller will make (BufferOptions::warmup_shape). Zero token counts: none.
struct WarmupShape {
  int num_tokens = 0;              // tokens per rank of a normal-mode dispatch
  int num_low_latency_tokens = 0;  // num_max_dispatch_tokens_per_rank of low-latency calls
  int hidden = 0;
  int num_topk = 0;
  int num_experts = 0;

  bool empty() const { return num_tokens == 0 && num_low_latency_tokens == 0; }
};

// How a Buffer's ranks reach each other (BufferOptions::transport).
enum class TransportKind {
  kAuto,     // CUDA IPC when every rank runs on this host, NVSHMEM when they span hosts
  kIpc,      // CUDA IPC: the ranks of one host
  kNvshmem,  // NVSHMEM (its P2P transport inside a node, RDMA across nodes); needs a build with
             // NVSHMEM (README, "Across nodes")
};
// "auto", "ipc" or "nvshmem" (as tools and the Python binding spell them); anything else throws
// InvalidArgument naming `what` and the value.
TransportKind parse_transport_kind(const std::string& name, const char* what = "transport");

struct BufferOptions {
  // Bytes of the NVLink buffer (normal mode's rings) each rank allocates and shares with its peers.
  // Past 8 ranks (kMaxNvlPeers) normal mode runs only hierarchical, across nodes of at most 8
  // (ranks_per_node): then it needs a rail region too (num_rdma_bytes), or must be 0.
  int64_t num_nvl_bytes = 0;
  // Bytes of deep_ep's RDMA buffer, shared like the NVLink buffer (CUDA IPC, or NVSHMEM's heap).
  // With low_latency_mode: the low-latency region (Buffer::low_latency_buffer_size_hint). Without:
  // the rings of normal mode's network stage across nodes (Config::rdma_buffer_size_hint), which
  // make normal mode hierarchical as deep_ep's is: a token crosses the network once per destination
  // node, to the rank of its own local index there, which forwards it over NVLink; combine reduces
  // inside the node first. 0 (or one node) keeps normal mode flat: across hosts every token is put
  // once per destination rank, in the rings of num_nvl_bytes (nvl_buffer_size_hint with num_nodes);
  // past 8 ranks flat is refused. Between the nodes of one host (past 8 ranks, NVLink islands, or
  // ranks_per_node) the "network" stage runs over stores (NVLink, or PCIe between islands). With low_latency_mode across nodes, normal mode is
  // hierarchical too, its rail rings beside the low-latency region (num_rail_bytes).
  int64_t num_rdma_bytes = 0;
  // Low-latency mode across nodes (with num_nvl_bytes > 0): the bytes of normal mode's rail rings,
  // a region of their own beside the low-latency one, so that the two modes never need
  // clean_low_latency_buffer between them (deep_ep's modes share one region). -1: num_rdma_bytes
  // (deep_ep's callers size it for both modes; Config::rdma_buffer_size_hint needs less); 0: none
  // (normal mode across nodes then flat: refused past 8 ranks, where normal mode needs the rail).
  // Without low_latency_mode it must stay -1: num_rdma_bytes holds the rail rings.
  int64_t num_rail_bytes = -1;
  // The rail rings' bytes when the ranks form several nodes, from the two fields above.
  int64_t rail_bytes_across_nodes() const;
  // Prepare the low-latency mode's double-buffered per-expert receive buffers.
  bool low_latency_mode = false;
  // RDMA queue pairs per peer rank (NVSHMEM transport; recorded for it).
  int num_qps_per_rank = 24;
  // Let low-latency traffic between ranks of one node use NVLink rather than RDMA.
  bool allow_nvlink_for_low_latency_mode = true;
  // deep_ep's shrink mode (needs low_latency_mode): ranks can be masked
  // (Buffer::low_latency_update_mask_buffer), and low-latency calls leave masked ranks out:
  // nothing is sent to them, nothing awaited from them, their experts add nothing to a combine.
  // A rank whose process dies, or that a low-latency wait gives up on after wait_timeout, is
  // masked instead of failing the call (normal-mode calls still fail with a dead rank).
  bool enable_shrink = false;
  // Test the path across nodes on one machine: split the ranks into this many equal groups
  // ("nodes") that reach each other only through the transport's put and signal, never by loads
  // or stores into each other's memory, as ranks of different nodes do. 1: off. Both modes (normal
  // mode's rings are then staged: nvl_buffer_size_hint with num_nodes); every rank passes the same.
  int emulated_nodes = 1;
  // Ranks per node (deep_ep's numbering: rank = node x ranks_per_node + local rank): the ranks
  // normal mode joins in one NVLink stage; across nodes it runs hierarchical. 0: the consecutive
  // ranks of one host, or past 8 (kMaxNvlPeers) the largest equal split of them into nodes of at
  // most 8 (16 -> 2 x 8, 12 -> 2 x 6). Where normal mode has a rail region of its own
  // (num_rdma_bytes without low_latency_mode, num_rail_bytes > 0 with it) and the host's GPUs form
  // NVLink islands (bridged pairs; each rank asks NVML about its own GPU), a node is one island,
  // so that the NVLink stage stays on NVLink and only the rail stage crosses PCIe. Islands that
  // cannot be nodes (GPUs with no NVLink at all, islands of unequal size or not of consecutive
  // ranks, more than 8 of them) leave the host whole, and rank 0 prints why. > 0: this many, which
  // must divide the ranks and share a host, islands or not. The nodes of one host still reach each
  // other by load and store (their rail stage runs over NVLink, or PCIe between islands); only
  // emulated_nodes hides them from each other. Every rank passes the same value; emulated_nodes,
  // when given, must agree with it.
  int ranks_per_node = 0;
  // Which transport joins the ranks; every rank passes the same. kNvshmem on one host runs
  // NVSHMEM's P2P transport, and with emulated_nodes its put path carries the traffic between the
  // emulated nodes (the NVSHMEM path across nodes, tested on one machine).
  TransportKind transport = TransportKind::kAuto;
  // CUDA device of this rank; -1 uses the device current at construction.
  int device = -1;
  // Do every one-time cost (module loading, peer mapping first touch, a dummy round of each mode)
  // inside the constructor, so the first call costs what later calls do. On by default: without
  // it the first dispatch costs 30-40x a steady one (tens of ms); with it the constructor takes
  // about 50-140 ms longer on 2 GPUs (docs/PERF.md). false defers those costs to the first calls.
  bool preinitialize = true;
  // Run the initialisation (allocation, peer mapping, preinitialize) on a background thread: the
  // constructor returns at once and the first call waits for it; its errors surface at that call
  // (and every later one). The bootstrap belongs to that thread until then: make no other use of
  // it (another Buffer on it, a barrier) and capture no CUDA graph in global mode meanwhile.
  bool initialize_in_background = false;
  // deep_ep's explicitly_destroy: the caller tears the Buffer down with destroy() (collective)
  // itself. One destroyed without it (a rank unwinding from an error) does not wait for its peers:
  // it closes its mappings, warns, and leaves its memory to the process's exit; its peers see it
  // as dead and their own teardown does the same. false: the destructor calls destroy().
  bool explicitly_destroy = false;
  // Bound on every GPU spin-wait. On expiry the kernel records which rank waited on which peer
  // for what, and the call fails with an epcomm::Error instead of hanging.
  std::chrono::milliseconds wait_timeout{100 * 1000};

  // What warmup (and preinitialize) prepares beyond the fixed costs. Output memory grows with the
  // data: with a warmup_shape, the dummy rounds run at that size, twice, with routing that reaches
  // as many ranks as top-k allows and each round's results kept alive as a caller keeps the
  // previous call's, so the output allocator holds what steady state needs before the first real
  // call. Without one they move a single token.
  WarmupShape warmup_shape;
  // The allocator the dummy rounds take outputs from: pass the one your calls will pass, so that
  // it is the one that grows. Null: the Buffer's own (Buffer::output_allocator()).
  std::shared_ptr<Allocator> output_allocator;
  // The stream preinitialize runs the dummy rounds on: the one your calls will use (a stream's
  // first launch, and a caching allocator's per-stream free lists, are first-call costs too).
  // Unset: the Buffer's communication stream. With initialize_in_background the warmup runs on it
  // from another thread while the caller goes on: give a stream that carries no work of the
  // caller's (its kernels wait for other ranks) until the Buffer is ready, or leave it unset.
  std::optional<cudaStream_t> warmup_stream;
  // A stream of the caller's for the Buffer's communication work, instead of one it creates and
  // destroys with itself. Results made on it (dispatch handles; outputs with
  // allocate_on_comm_stream) are freed in its order: with the Buffer's own stream they must go
  // before the Buffer; to keep them longer (or for memory that remembers the streams that used it,
  // like PyTorch's record_stream), give a stream that lives as long as they do. On `device`.
  std::optional<cudaStream_t> comm_stream;

  // Throws InvalidArgument / Unsupported naming the field and value. `num_ranks` is the
  // bootstrap's world size.
  void validate(int num_ranks) const;
};

// Where normal-mode combine puts a channel's senders and receivers (epcomm's own; deep_ep has one).
// Measured both ways, neither wins everywhere (docs/PERF.md): over NVLink between two H200s split
// was 13% faster at 24 SMs (2026-11-30, older kernels); on one H200 shared by 2 ranks colocated
// takes 7-9% less kernel time, at 1 rank 23-25% less, at 8 ranks they trade places by 3-5%
// (2026-12-03). Ranks may pass different layouts: the rings between them do not depend on it.
enum class CombineLayout {
  kSplit,      // even blocks hold two channels' senders, odd blocks their receivers: a receiver never
               // waits behind a sender's stores to a peer in its SM's memory pipeline
  kColocated,  // each block holds one channel's sender and receiver: every SM does both, so neither
               // side idles while the other has more to do (at 2 ranks a receiver passes 3 rows per
               // token through its SM, reading its own and the peer's and writing the sum, its
               // sender 2, copying one)
};
// "split" or "colocated" (as tools and the Python binding spell them); anything else throws
// InvalidArgument naming `what` and the value.
CombineLayout parse_combine_layout(const std::string& name, const char* what = "combine_layout");
const char* combine_layout_name(CombineLayout layout);

// Tuning of the normal-mode kernels: deep_ep.Config's fields, and combine_layout. The defaults are those of
// default_dispatch_config().
struct Config {
  int num_sms = 24;                             // SMs the kernels use (one channel each)
  int num_max_nvl_chunked_send_tokens = 8;      // a sender publishes its progress every this many tokens
  int num_max_nvl_chunked_recv_tokens = 128;    // capacity of each NVLink ring, in tokens
  int num_max_rdma_chunked_send_tokens = 6;     // same over RDMA (internode)
  int num_max_rdma_chunked_recv_tokens = 256;
  CombineLayout combine_layout = CombineLayout::kSplit;  // combine's SMs (above); dispatch ignores it

  void validate() const;  // throws InvalidArgument naming the field and value
  int num_channels() const { return num_sms; }
  // NVLink buffer bytes normal-mode dispatch and combine need with this config, for tokens of
  // `hidden_bytes` (hidden x element size) among `num_ranks` ranks (deep_ep's hint). With ranks
  // on more than one host (`num_nodes` > 1 here: hosts, or emulated_nodes), the rings take twice as
  // much: a sender stages what it puts to ranks of other hosts in its own buffer. Nodes of one
  // host need no staging: pass 1.
  int64_t nvl_buffer_size_hint(int64_t hidden_bytes, int num_ranks, int num_nodes = 1) const;
  // The same, said directly: `staged` when some rank is reached only by put.
  int64_t ring_buffer_bytes(int64_t hidden_bytes, int num_ranks, bool staged) const;
  // Rail ring bytes (BufferOptions::num_rdma_bytes without low_latency_mode, num_rail_bytes with
  // it) the hierarchical normal mode's network stage needs among `num_nodes` nodes: staged rings
  // of the rdma fields' sizes, one peer per node (enough too for the unstaged rings between the
  // nodes of one host). 0 for one node.
  int64_t rdma_buffer_size_hint(int64_t hidden_bytes, int num_nodes) const;

 private:
  int64_t rings_bytes(int64_t hidden_bytes, int num_ranks, bool staged, int capacity) const;
};

// Configs tuned for each rank count (deep_ep's get_dispatch_config / get_combine_config).
Config default_dispatch_config(int num_ranks);
Config default_combine_config(int num_ranks);

}  // namespace epcomm
