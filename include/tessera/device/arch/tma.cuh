// Tensor Memory Accelerator (sm_90): one thread describes a whole tile copy
// (global -> shared) with a tensor map, and the copy signals an mbarrier with
// its byte count on landing. The tensor map (128 bytes, built on the host by
// cuTensorMapEncodeTiled) lives in a __grid_constant__ kernel parameter.
#pragma once
#include "tessera/abi/tensor_map.cuh"
#include "tessera/device/arch/numeric.cuh"

namespace tessera {

#if defined(__CUDACC__) || defined(__CUDACC_RTC__)

// The arrival of the thread that starts a TMA copy: one arrival plus `bytes`
// expected transaction bytes, which the copies then complete.
__device__ __forceinline__ void mbarrier_arrive_expect_tx(u32 bar, u32 bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
#endif
}

// Loads the descriptor into the TMA unit's cache ahead of the first copy.
__device__ __forceinline__ void tma_prefetch_map(const TensorMap* map) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("prefetch.tensormap [%0];\n" ::"l"(map) : "memory");
#endif
}

// Box at coordinates (c0, c1, c2) of a rank-3 tensor map into shared memory
// at `dst` (aligned as the map's swizzle needs: 1024 bytes for 128-byte
// swizzle); completes `bytes` of barrier `bar`'s transaction count. Elements
// outside the tensor are zero-filled.
__device__ __forceinline__ void tma_load_3d(u32 dst, const TensorMap* map, u32 bar, int c0, int c1, int c2) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4, %5}], [%2];\n" ::"r"(dst),
      "l"(map), "r"(bar), "r"(c0), "r"(c1), "r"(c2)
      : "memory");
#endif
}

// The same box into shared memory at offset `dst` of every CTA of the
// cluster in `cta_mask` (bit r: rank r), each completing `bytes` on its own
// barrier at offset `bar`: one read of L2 for several CTAs.
__device__ __forceinline__ void tma_load_3d_multicast(u32 dst, const TensorMap* map, u32 bar, int c0, int c1, int c2,
                                                      u16 cta_mask) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster [%0], [%1, {%3, %4, "
      "%5}], [%2], %6;\n" ::"r"(dst),
      "l"(map), "r"(bar), "r"(c0), "r"(c1), "r"(c2), "h"(cta_mask)
      : "memory");
#endif
}

// The same for a rank-4 map, box at (c0, c1, c2, c3).
__device__ __forceinline__ void tma_load_4d(u32 dst, const TensorMap* map, u32 bar, int c0, int c1, int c2, int c3) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4, %5, %6}], [%2];\n" ::"r"(dst),
      "l"(map), "r"(bar), "r"(c0), "r"(c1), "r"(c2), "r"(c3)
      : "memory");
#endif
}

#endif

}  // namespace tessera
