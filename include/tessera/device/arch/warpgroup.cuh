// Warpgroup plumbing for warp-specialized kernels (sm_90a): named barriers
// that synchronize a subset of the CTA's warps, and setmaxnreg, which moves
// registers from producer warpgroups (address arithmetic only) to consumer
// warpgroups (accumulators). setmaxnreg takes effect only in a kernel compiled
// with a register cap at entry (__launch_bounds__(threads, min_blocks)) and
// where each warpgroup's role is one branch of an if/else.
#pragma once
#include "tessera/device/arch/numeric.cuh"

namespace tessera {

#if defined(__CUDACC__) || defined(__CUDACC_RTC__)

// Barrier `id` (1..15; 0 is __syncthreads) over `threads` threads (a multiple
// of 32): sync waits for all of them, arrive only counts this warp in.
__device__ __forceinline__ void named_barrier_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
__device__ __forceinline__ void named_barrier_arrive(int id, int threads) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
template <int REGS>
__device__ __forceinline__ void setmaxnreg_inc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(REGS));
}
template <int REGS>
__device__ __forceinline__ void setmaxnreg_dec() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(REGS));
}
#else
template <int REGS> __device__ __forceinline__ void setmaxnreg_inc() {}
template <int REGS> __device__ __forceinline__ void setmaxnreg_dec() {}
#endif

#endif

}  // namespace tessera
