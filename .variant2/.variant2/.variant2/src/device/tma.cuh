// The bulk-copy (TMA) engine of sm_90, for one-dimensional copies: global -> shared completes on
// an mbarrier, shared -> global completes in bulk groups. Addresses 16-byte aligned, sizes
// multiples of 16. One thread issues; the engine moves the bytes while the SM does other work.
//
// Ordering (PTX "async proxy"): the engine is another proxy. Shared memory written by threads and
// then stored by the engine needs fence_proxy_async_shared() between; global memory the engine
// wrote is published to other ranks only after bulk_wait_all() (the writes are done) and
// fence_proxy_async_global(), then the usual release (transport/window.cuh's publish rule).
#pragma once

#include <cstdint>

namespace epcomm::device {

__device__ __forceinline__ uint32_t shared_address(const void* pointer) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(pointer));
}

__device__ __forceinline__ void mbarrier_init(uint64_t* barrier, uint32_t arrivals) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(shared_address(barrier)), "r"(arrivals) : "memory");
}

// Makes initialised mbarriers visible to the engine.
__device__ __forceinline__ void fence_mbarrier_init() {
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}

// One arrival that also expects `bytes` to land on the barrier (the load's completion).
__device__ __forceinline__ void mbarrier_arrive_expect_bytes(uint64_t* barrier, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(shared_address(barrier)), "r"(bytes)
               : "memory");
}

// Waits until the barrier's phase with parity `parity` has completed (acquire at CTA scope).
__device__ __forceinline__ void mbarrier_wait(uint64_t* barrier, uint32_t parity) {
  asm volatile(
      "{\n"
      ".reg .pred done;\n"
      "wait_again:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra wait_again;\n"
      "}\n" ::"r"(shared_address(barrier)),
      "r"(parity)
      : "memory");
}

// global -> shared; completes `bytes` on `barrier` (after mbarrier_arrive_expect_bytes).
__device__ __forceinline__ void bulk_load(void* shared, const void* global, uint32_t bytes, uint64_t* barrier) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
          shared_address(shared)),
      "l"(global), "r"(bytes), "r"(shared_address(barrier))
      : "memory");
}

// shared -> global (any address the SM can store to: this GPU's memory or a peer's over NVLink).
__device__ __forceinline__ void bulk_store(void* global, const void* shared, uint32_t bytes) {
  asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;" ::"l"(global), "r"(shared_address(shared)),
               "r"(bytes)
               : "memory");
}

// Closes the bulk group of the stores issued since the last commit.
__device__ __forceinline__ void bulk_commit() { asm volatile("cp.async.bulk.commit_group;" ::: "memory"); }

// The engine has read the shared memory of all but the newest kPending groups (it may be reused).
template <int kPending>
__device__ __forceinline__ void bulk_wait_read() {
  asm volatile("cp.async.bulk.wait_group.read %0;" ::"n"(kPending) : "memory");
}

// Every committed group is complete: its writes are done.
__device__ __forceinline__ void bulk_wait_all() { asm volatile("cp.async.bulk.wait_group 0;" ::: "memory"); }

__device__ __forceinline__ void fence_proxy_async_shared() {
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
}
__device__ __forceinline__ void fence_proxy_async_global() {
  asm volatile("fence.proxy.async.global;" ::: "memory");
}

}  // namespace epcomm::device
