// Warp-level reductions over the 32 lanes (butterfly shuffles: every lane ends
// with the result, and the reduction order is fixed, so results are bitwise
// deterministic).
#pragma once

namespace tessera {

#if defined(__CUDACC__) || defined(__CUDACC_RTC__)

constexpr unsigned kFullMask = 0xffffffffu;

template <int LANES = 32>
__device__ __forceinline__ float warp_sum(float x) {
#pragma unroll
  for (int off = LANES / 2; off > 0; off >>= 1) x += __shfl_xor_sync(kFullMask, x, off);
  return x;
}

template <int LANES = 32>
__device__ __forceinline__ float warp_max(float x) {
#pragma unroll
  for (int off = LANES / 2; off > 0; off >>= 1) x = fmaxf(x, __shfl_xor_sync(kFullMask, x, off));
  return x;
}

// Lane 0's value in every lane. For a value already equal across the warp
// this changes nothing but what ptxas can prove: the result is warp-uniform,
// so values derived from it may live in uniform registers (wgmma descriptors
// must; otherwise every use pays R2UR moves).
__device__ __forceinline__ int warp_uniform(int x) { return __shfl_sync(kFullMask, x, 0); }

#endif

}  // namespace tessera
