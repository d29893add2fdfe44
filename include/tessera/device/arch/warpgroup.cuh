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

// What setmaxnreg can hand out: it moves registers between the warpgroups of
// a CTA within what the CTA got at launch, every thread the register count
// that __launch_bounds__(threads, ctas) caps (ptxas gives a kernel that uses
// setmaxnreg the whole cap): the 64K file's share, rounded down to the
// allocation unit of 8, at most 256. A split that asks for more does not
// fail: setmaxnreg.inc waits for registers that never come, and the kernel
// hangs. Warp-specialized kernels static_assert their split against this.
constexpr int launch_registers(int threads, int ctas) {
  const int share = 65536 / (threads * ctas) / 8 * 8;
  return share < 256 ? share : 256;
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
