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

// 4 x 4 transpose across the 4 lanes of a quad (lanes 4k .. 4k + 3, all of
// which must call it): afterwards lane i's a[j] is lane j's a[i] from
// before. Two exchanges of 2 x 2 blocks (lane ^ 2), then of elements inside
// them (lane ^ 1): 4 shuffles. Used to turn an MMA accumulator's 2-column
// slivers into whole 16-byte chunks of a row.
__device__ __forceinline__ void quad_transpose(unsigned (&a)[4]) {
  const int lane = threadIdx.x % 32, quad = lane % 4;
  const unsigned mask = 0xfu << (lane & ~3);
  const bool hi = quad & 2, odd = quad & 1;
  unsigned r0 = __shfl_xor_sync(mask, hi ? a[0] : a[2], 2), r1 = __shfl_xor_sync(mask, hi ? a[1] : a[3], 2);
  if (hi) { a[0] = r0; a[1] = r1; } else { a[2] = r0; a[3] = r1; }
  r0 = __shfl_xor_sync(mask, odd ? a[0] : a[1], 1);
  r1 = __shfl_xor_sync(mask, odd ? a[2] : a[3], 1);
  if (odd) { a[0] = r0; a[2] = r1; } else { a[1] = r0; a[3] = r1; }
}

#endif

}  // namespace tessera
