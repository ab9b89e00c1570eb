// The table of the kernels compiled next to this file: libepcomm builds it for CUDA IPC, the
// NVSHMEM plugin builds the same file against its own instances of the kernels.
#include "kernels/kernel_table.hpp"

namespace epcomm::kernels {

void load_barrier_kernel_module();
void load_low_latency_dispatch_kernel_module();
void load_low_latency_combine_kernel_module();
void load_peer_copy_kernel_module();
void load_notify_dispatch_kernel_module();
void load_dispatch_kernel_module();
void load_combine_kernel_module();

namespace {

void load_cross_rank_kernel_modules() {
  load_barrier_kernel_module();
  load_low_latency_dispatch_kernel_module();
  load_low_latency_combine_kernel_module();
  load_peer_copy_kernel_module();
  load_notify_dispatch_kernel_module();
  load_dispatch_kernel_module();
  load_combine_kernel_module();
}

}  // namespace

const KernelTable& builtin_kernels() {
  static const KernelTable table{launch_nvl_barrier,     launch_low_latency_dispatch, launch_low_latency_combine,
                                 launch_notify_dispatch, launch_dispatch,             launch_combine,
                                 normal_kernel_blocks_per_sm, launch_peer_copy,        load_cross_rank_kernel_modules};
  return table;
}

}  // namespace epcomm::kernels
