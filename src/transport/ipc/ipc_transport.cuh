// The device-side transport interface the low-latency kernels reach peers through:
//   region(rank)          a pointer into a rank's region; loads and stores through it go over
//                         NVLink (the "put" of this transport is a plain store)
//   signal(flag, value)   publish: a release store of a flag in a peer's region, ordered after
//                         every earlier write of the calling thread and of those it synchronised with
//   wait(flag, expected)  a bounded acquire-wait on a flag in this rank's own region
// An NVSHMEM transport offers the same three operations (nvshmem_ptr for NVLink peers, or
// put + put-with-signal, and signal_wait_until), so kernels written against this interface can run
// across nodes without changing their logic.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/common/bounded_wait.cuh"
#include "kernels/common/memory_ordering.cuh"
#include "transport/ipc/ipc_peers.hpp"

namespace epcomm::device {

struct IpcTransport {
  const IpcPeers& peers;
  size_t region_offset;  // from each rank's buffer base to the region kernels address

  __device__ __forceinline__ void* region(int rank) const { return static_cast<char*>(peers.base(rank)) + region_offset; }

  // Pairs with the reader's wait() on the same flag.
  __device__ __forceinline__ void signal(uint64_t* flag, uint64_t value) const { st_release_sys(flag, value); }

  __device__ __forceinline__ bool wait(const uint64_t* own_flag, uint64_t expected, const KernelContext& context,
                                       const WaitSite& site) const {
    return wait_at_least(own_flag, expected, context, site);
  }
};

}  // namespace epcomm::device
