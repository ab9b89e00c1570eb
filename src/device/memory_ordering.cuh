// Memory-ordering primitives, named by semantics, scope and space. Every synchronisation between
// ranks goes through these; each carries a "memory" clobber so the compiler cannot move ordinary
// loads and stores across it.
//
// Scope: ranks live in different processes and, on a multi-GPU node, on different GPUs that reach
// each other's memory over NVLink. GPU scope only orders memory as seen from one GPU, so every
// flag that another rank reads uses system scope (.sys). On one GPU shared by several processes
// (MPS) .gpu would suffice, but the same code must be right on NVLink, so .sys everywhere.
#pragma once

#include <cstdint>

namespace epcomm::device {

// Acquire load: later reads in this thread see everything the releasing writer wrote before its
// paired release store.
__device__ __forceinline__ uint64_t ld_acquire_sys(const uint64_t* address) {
  uint64_t value;
  asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(value) : "l"(address) : "memory");
  return value;
}

__device__ __forceinline__ int32_t ld_acquire_sys(const int32_t* address) {
  int32_t value;
  asm volatile("ld.acquire.sys.global.s32 %0, [%1];" : "=r"(value) : "l"(address) : "memory");
  return value;
}

// Relaxed load at system scope: for polling a flag cheaply. A poll that succeeds must be followed
// by an acquire (ld_acquire_sys of the same flag) before the data it guards is read.
__device__ __forceinline__ uint64_t ld_relaxed_sys(const uint64_t* address) {
  uint64_t value;
  asm volatile("ld.relaxed.sys.global.u64 %0, [%1];" : "=l"(value) : "l"(address) : "memory");
  return value;
}

__device__ __forceinline__ int32_t ld_relaxed_sys(const int32_t* address) {
  int32_t value;
  asm volatile("ld.relaxed.sys.global.s32 %0, [%1];" : "=r"(value) : "l"(address) : "memory");
  return value;
}

// Release store: everything this thread wrote (and observed) before becomes visible to a reader
// whose acquire load sees this value.
__device__ __forceinline__ void st_release_sys(uint64_t* address, uint64_t value) {
  asm volatile("st.release.sys.global.u64 [%0], %1;" ::"l"(address), "l"(value) : "memory");
}

__device__ __forceinline__ void st_release_sys(int32_t* address, int32_t value) {
  asm volatile("st.release.sys.global.s32 [%0], %1;" ::"l"(address), "r"(value) : "memory");
}

// Relaxed store at system scope: for a field published later by a release store, or a flag
// right after this thread's own fence_acq_rel_sys (a fence followed by a strong write is a release
// pattern in the PTX memory model: Window::signal_after_fence).
__device__ __forceinline__ void st_relaxed_sys(int64_t* address, int64_t value) {
  asm volatile("st.relaxed.sys.global.s64 [%0], %1;" ::"l"(address), "l"(value) : "memory");
}

__device__ __forceinline__ void st_relaxed_sys(uint64_t* address, uint64_t value) {
  asm volatile("st.relaxed.sys.global.u64 [%0], %1;" ::"l"(address), "l"(value) : "memory");
}

__device__ __forceinline__ void st_relaxed_sys(int32_t* address, int32_t value) {
  asm volatile("st.relaxed.sys.global.s32 [%0], %1;" ::"l"(address), "r"(value) : "memory");
}

// Full acquire-release fence at system scope. Used where writes made by an earlier kernel in the
// stream (not by this thread) must be ordered before a release store that announces them.
__device__ __forceinline__ void fence_acq_rel_sys() { asm volatile("fence.acq_rel.sys;" ::: "memory"); }

// The same at GPU scope: for work no other GPU or process reads (a rank's own dispatch layout),
// where a system-scope fence would also wait for writes to be visible across NVLink and the host.
__device__ __forceinline__ void fence_acq_rel_gpu() { asm volatile("fence.acq_rel.gpu;" ::: "memory"); }

// Nanoseconds from the GPU's global timer; used only to bound waits, never to time work.
__device__ __forceinline__ uint64_t global_timer_ns() {
  uint64_t now;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
  return now;
}

}  // namespace epcomm::device
