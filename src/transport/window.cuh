// The transport window: the only way a kernel reaches another rank. Every place is named by an
// offset from the start of a rank's buffer (common/buffer_layout.hpp), which means the same place
// on every rank. The operations and the ordering each one guarantees:
//
//   own(offset)            this rank's buffer: plain loads and stores.
//   ptr(rank, offset)      a load/store pointer into `rank`'s buffer when it is direct (same GPU or
//                          NVLink), else null. Stores through it are ordered like any other store.
//   put(rank, offset, source, bytes)   warp-collective copy into `rank`'s buffer. Non-blocking:
//                          the bytes are guaranteed to be there only for a reader that saw a later
//                          signal (the publish rule below). `source` must not change until that
//                          signal (or a fence()) has run: over NVSHMEM, that is what completes puts.
//   put_value(rank, offset, value)     the same for one small value, from one thread.
//   signal(rank, offset, value)        one thread; a release store of a u64 flag at system scope.
//   wait(own_offset, expected, ...)    a bounded acquire-wait until this rank's flag >= expected;
//                          reports who waited on whom for what through the one bounded-wait helper.
//                          It can return the value it acquired: a reader may then read everything
//                          that value covers without waiting again (flags only grow).
//   quiet()                an ordering point for this thread's puts before the publish rule's
//                          barrier; it completes nothing itself (over IPC the puts are stores,
//                          ordered by the barrier and the release that follow; over NVSHMEM the
//                          signal completes them, below).
//   fence()                a system-scope acquire-release fence: writes made before it, also by
//                          earlier kernels of the stream, are ordered before what follows it.
//
// The publish rule, the same in every kernel: the writers of some data (put or direct stores)
// call quiet(), pass a barrier that covers all of them (__syncwarp, a warp group's bar.sync,
// __syncthreads, or the last-block election), and then one thread calls signal(). signal()
// publishes its own writes and everything the barrier ordered before them. Data written by an
// earlier kernel of the stream is covered only if the signalling thread calls fence() first.
// The reader waits on the flag (acquire) and reads only after that.
//
// Over CUDA IPC every operation is a load or store through the mapping. Compiled with
// EPCOMM_WINDOW_NVSHMEM (the NVSHMEM plugin's copy of the kernels), a rank in
// PeerWindow::nvshmem_ranks is reached by NVSHMEM's device API instead: put is
// nvshmemx_putmem_nbi_warp, put_value nvshmem_uint{32,64}_p, and signal is nvshmem_quiet then
// nvshmemx_signal_op (SET) from the one signalling thread: after the publish rule's barrier, that
// quiet completes every thread's puts (IBGDA and the proxy drain the whole PE; over P2P it is a
// system fence, cumulative over the barrier), so quiet() itself stays an ordering point and the
// cost is paid once per signal, not per putting thread. fence() also completes NVSHMEM puts.
// Direct ranks (nvshmem_ptr) stay loads and stores. So a kernel written against this contract
// runs across nodes unchanged.
#pragma once

#include <cstddef>
#include <cstdint>

#include "common/kernel_context.hpp"
#include "device/bounded_wait.cuh"
#include "device/memory_ordering.cuh"
#include "device/warp_ops.cuh"
#include "transport/window.hpp"

#if defined(EPCOMM_WINDOW_NVSHMEM)
#include <nvshmem.h>
#include <nvshmemx.h>
#endif

namespace epcomm::device {

class Window {
 public:
  __device__ explicit Window(const PeerWindow& peers) : peers_(peers) {}

  __device__ int rank() const { return peers_.rank; }
  __device__ int num_ranks() const { return peers_.num_ranks; }
  __device__ bool is_direct(int peer) const { return peers_.is_direct(peer); }
  __device__ bool all_direct() const { return peers_.all_direct(); }  // no put or signal goes out

  template <typename T = char>
  __device__ T* own(size_t offset) const {
    return reinterpret_cast<T*>(peers_.bases[peers_.rank] + offset);
  }

  template <typename T = char>
  __device__ T* ptr(int peer, size_t offset) const {
    return peers_.is_direct(peer) ? reinterpret_cast<T*>(peers_.bases[peer] + offset) : nullptr;
  }

  // Every lane of the warp calls it with the same arguments. `bytes` and both addresses are
  // multiples of 4; 16-byte vectors are used when all three allow.
  __device__ void put(int peer, size_t offset, const void* source, size_t bytes) const {
#if defined(EPCOMM_WINDOW_NVSHMEM)
    if (by_nvshmem(peer)) {
      // NVSHMEM needs `source` in its symmetric heap or registered once it goes over a network
      // (P2P takes any device memory): the kernels put from their staging areas.
      nvshmemx_putmem_nbi_warp(peers_.bases[peer] + offset, source, bytes, peers_.pe(peer));
      return;
    }
#endif
    warp_copy_any(peers_.bases[peer] + offset, source, bytes);
  }

  template <typename T>
  __device__ void put_value(int peer, size_t offset, T value) const {
#if defined(EPCOMM_WINDOW_NVSHMEM)
    if (by_nvshmem(peer)) {
      static_assert(sizeof(T) == sizeof(uint32_t) || sizeof(T) == sizeof(uint64_t), "put_value: 4 or 8 bytes");
      if constexpr (sizeof(T) == sizeof(uint32_t)) {
        nvshmem_uint32_p(reinterpret_cast<uint32_t*>(peers_.bases[peer] + offset), bit_cast<uint32_t>(value),
                         peers_.pe(peer));
      } else {
        nvshmem_uint64_p(reinterpret_cast<uint64_t*>(peers_.bases[peer] + offset), bit_cast<uint64_t>(value),
                         peers_.pe(peer));
      }
      return;
    }
#endif
    *reinterpret_cast<T*>(peers_.bases[peer] + offset) = value;
  }

  // Pairs with the reader's wait() on the same flag.
  __device__ void signal(int peer, size_t offset, uint64_t value) const {
#if defined(EPCOMM_WINDOW_NVSHMEM)
    if (by_nvshmem(peer)) {
      nvshmem_quiet();  // the puts the barrier ordered before this signal are complete
      nvshmemx_signal_op(reinterpret_cast<uint64_t*>(peers_.bases[peer] + offset), value, NVSHMEM_SIGNAL_SET,
                         peers_.pe(peer));
      return;
    }
#endif
    st_release_sys(reinterpret_cast<uint64_t*>(peers_.bases[peer] + offset), value);
  }

  // As signal(), from a thread whose last ordering operation was fence_acq_rel_sys (thread 0 of
  // the block last_block_to_arrive elected): that fence and this relaxed store form a release
  // pattern (PTX memory model: a fence followed by a strong write), so the reader's acquire of the
  // flag sees everything the fence ordered, without the release store's own fence. Not for peers
  // reached by NVSHMEM (signals_by_nvshmem): their signal() completes the puts first.
  __device__ void signal_after_fence(int peer, size_t offset, uint64_t value) const {
    st_relaxed_sys(reinterpret_cast<uint64_t*>(peers_.bases[peer] + offset), value);
  }
  __device__ bool signals_by_nvshmem(int peer) const { return by_nvshmem(peer); }

  // `acquired`: see wait_at_least.
  __device__ bool wait(size_t own_offset, uint64_t expected, const KernelContext& context, const WaitSite& site,
                       uint64_t* acquired = nullptr) const {
    return wait_at_least(own<uint64_t>(own_offset), expected, context, site, acquired);
  }

  // Whether put() needs its source inside this rank's buffer (registered memory): NVSHMEM's puts
  // do once they go over a network; stores through a mapping never do.
  __device__ bool puts_need_own_sources() const {
#if defined(EPCOMM_WINDOW_NVSHMEM)
    return peers_.nvshmem_ranks != 0;
#else
    return false;
#endif
  }

  // Ordering only, in both builds: signal() completes NVSHMEM puts (see the top of this file).
  __device__ void quiet() const { asm volatile("" ::: "memory"); }
  __device__ void fence() const {
#if defined(EPCOMM_WINDOW_NVSHMEM)
    if (peers_.nvshmem_ranks != 0) nvshmem_quiet();  // puts of earlier kernels of the stream too
#endif
    fence_acq_rel_sys();
  }

 private:
  __device__ bool by_nvshmem(int peer) const { return has_rank(peers_.nvshmem_ranks, peer); }

  template <typename To, typename From>
  __device__ static To bit_cast(From value) {
    static_assert(sizeof(To) == sizeof(From), "bit_cast: same size");
    To result;
    memcpy(&result, &value, sizeof(To));
    return result;
  }

  const PeerWindow& peers_;
};

}  // namespace epcomm::device
