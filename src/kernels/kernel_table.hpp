// The kernels whose work crosses ranks by put and signal, as one table: the ones a transport's
// device half changes. libepcomm's table (builtin_kernels) reaches peers through CUDA IPC; the
// NVSHMEM plugin compiles the same kernel sources against NVSHMEM's device API and hands the
// runtime its own table (runtime/nvshmem_plugin.hpp). The runtime launches these through the
// table of its Buffer's transport, and every other kernel (local, or needing every rank direct)
// directly.
#pragma once

#include "kernels/intranode/intranode_launchers.hpp"
#include "kernels/launchers.hpp"
#include "kernels/low_latency/low_latency_launchers.hpp"

namespace epcomm::kernels {

struct KernelTable {
  void (*nvl_barrier)(const PeerWindow& window, const KernelContext& context, cudaStream_t stream);
  void (*low_latency_dispatch)(const PeerWindow& window, const LowLatencyDispatchKernelArgs& args, unsigned phases,
                               const KernelContext& context, cudaStream_t stream);
  void (*low_latency_combine)(const PeerWindow& window, const LowLatencyCombineKernelArgs& args, unsigned phases,
                              const KernelContext& context, cudaStream_t stream);
  // Normal mode (kernels/intranode): the notify step, dispatch and combine, and how many of their
  // blocks one SM holds at once (every block of every rank sharing a GPU must be resident).
  void (*notify_dispatch)(const PeerWindow& window, const NotifyDispatchArgs& args, const KernelContext& context,
                          cudaStream_t stream);
  void (*dispatch)(const PeerWindow& window, const DispatchKernelArgs& args, const KernelContext& context,
                   cudaStream_t stream);
  void (*combine)(const PeerWindow& window, const CombineKernelArgs& args, const KernelContext& context,
                  cudaStream_t stream);
  int (*normal_blocks_per_sm)();
  // The all-to-all copy (copy_to_all_ranks, the warmup's first touch of every peer).
  void (*peer_copy)(const PeerWindow& window, const void* source, size_t bytes_per_peer, int num_blocks,
                    const KernelContext& context, cudaStream_t stream);
  // Loads the modules of the kernels above (kernel_modules.cpp says why).
  void (*load_modules)();
};

// The table of the kernels compiled into this library (the IPC transport's).
const KernelTable& builtin_kernels();

}  // namespace epcomm::kernels
