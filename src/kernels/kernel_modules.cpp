// CUDA loads a kernel's module on its first launch (lazy loading, the default since CUDA 12),
// which puts milliseconds into the first call. Buffer's preinitialize and warmup() call this
// instead, so every module a call can launch is resident before the first call.
#include "kernels/launchers.hpp"

namespace epcomm::kernels {

// Each kernel file defines the loader for its own kernels.
void load_layout_kernel_modules();
void load_ids_of_ranks_kernel_module();
void load_barrier_kernel_module();
void load_peer_copy_kernel_module();
void load_notify_dispatch_kernel_module();
void load_dispatch_kernel_module();
void load_combine_kernel_module();
void load_low_latency_dispatch_kernel_module();
void load_low_latency_combine_kernel_module();

void load_all_kernel_modules() {
  load_layout_kernel_modules();
  load_ids_of_ranks_kernel_module();
  load_barrier_kernel_module();
  load_peer_copy_kernel_module();
  load_notify_dispatch_kernel_module();
  load_dispatch_kernel_module();
  load_combine_kernel_module();
  load_low_latency_dispatch_kernel_module();
  load_low_latency_combine_kernel_module();
}

}  // namespace epcomm::kernels
