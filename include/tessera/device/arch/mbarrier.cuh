// Shared-memory barriers with transaction counts (mbarrier, sm_80+; the
// expect-tx form sm_90). A pipeline stage has a "full" barrier (producers
// arrive once the stage's data landed) and an "empty" one (consumers arrive
// once they are done reading it). A barrier completes a phase when the
// expected number of arrivals happened; waiters name the phase by its parity,
// so a ring of stages needs only (stage, phase bit) counters. A fresh barrier
// is in phase 0: waiting for parity 1 returns at once (the "previous" phase
// counts as complete), which lets producers start on empty stages.
#pragma once
#include "tessera/device/arch/numeric.cuh"

namespace tessera {

#if defined(__CUDACC__) || defined(__CUDACC_RTC__)

__device__ __forceinline__ void mbarrier_init(u32 bar, u32 count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}

// One arrival, with release semantics: this thread's earlier shared-memory
// writes are visible to a thread that observes the phase complete.
__device__ __forceinline__ void mbarrier_arrive(u32 bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}

// Whether the phase of parity `parity` has completed, without waiting
// (acquire when it has). Also a probe whose answer is used later, so its
// latency hides behind other work.
__device__ __forceinline__ bool mbarrier_test(u32 bar, u32 parity) {
  u32 done;
  asm volatile(
      "{\n.reg .pred p;\nmbarrier.test_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
      : "=r"(done)
      : "r"(bar), "r"(parity)
      : "memory");
  return done != 0;
}

// try_wait (sm_90) suspends the thread for a while in hardware before it
// reports "not yet"; sm_80 polls with test_wait.
__device__ __forceinline__ bool mbarrier_try_wait(u32 bar, u32 parity) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  u32 done;
  asm volatile(
      "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
      : "=r"(done)
      : "r"(bar), "r"(parity)
      : "memory");
  return done != 0;
#else
  return mbarrier_test(bar, parity);
#endif
}

// Blocks until the phase of parity `parity` has completed (acquire).
__device__ __forceinline__ void mbarrier_wait(u32 bar, u32 parity) {
  while (!mbarrier_try_wait(bar, parity)) {
  }
}

#endif

}  // namespace tessera
