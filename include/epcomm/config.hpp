// Options of a Buffer and tuning of the normal-mode kernels. Every field has a documented default;
// validate() reports the first bad field by name and value.
#pragma once

#include <chrono>
#include <cstdint>

namespace epcomm {

struct BufferOptions {
  // Bytes of the NVLink buffer each rank allocates and shares with its peers over CUDA IPC.
  int64_t num_nvl_bytes = 0;
  // Bytes of the NVSHMEM buffer for internode and RDMA low-latency traffic. Must be 0 in this
  // build: the NVSHMEM transport is not built yet (a clear Unsupported error says so).
  int64_t num_rdma_bytes = 0;
  // Prepare the low-latency mode's double-buffered per-expert receive buffers.
  bool low_latency_mode = false;
  // RDMA queue pairs per peer rank (NVSHMEM transport; recorded for it).
  int num_qps_per_rank = 24;
  // Let low-latency traffic between ranks of one node use NVLink rather than RDMA.
  bool allow_nvlink_for_low_latency_mode = true;
  // CUDA device of this rank; -1 uses the device current at construction.
  int device = -1;
  // Do every one-time cost (module loading, peer mapping first touch, a barrier round) inside
  // the constructor, so the first call costs what later calls do.
  bool preinitialize = false;
  // Bound on every GPU spin-wait. On expiry the kernel records which rank waited on which peer
  // for what, and the call fails with an epcomm::Error instead of hanging.
  std::chrono::milliseconds wait_timeout{100 * 1000};

  // Throws InvalidArgument / Unsupported naming the field and value. `num_ranks` is the
  // bootstrap's world size.
  void validate(int num_ranks) const;
};

// Tuning of the normal-mode (high-throughput) kernels, deep_ep.Config's fields.
struct Config {
  int num_sms = 20;                             // SMs the kernels use (two per channel)
  int num_max_nvl_chunked_send_tokens = 6;      // tokens a sender moves per step over NVLink
  int num_max_nvl_chunked_recv_tokens = 256;    // capacity of each NVLink receive queue, in tokens
  int num_max_rdma_chunked_send_tokens = 6;     // same over RDMA (internode)
  int num_max_rdma_chunked_recv_tokens = 256;

  void validate() const;  // throws InvalidArgument naming the field and value
};

}  // namespace epcomm
