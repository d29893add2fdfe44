// Prefill (Hopper template), the two warpgroup GEMMs of a KV tile: S = Q K^T
// with both operands in 128-byte-swizzled shared memory, and O += P V with P
// packed from S's accumulators into A fragments (registers) and V read
// MN-major. Both are asynchronous: the caller commits and waits
// (arch/wgmma.cuh), so a mainloop can overlap them with the softmax.
#pragma once
#include "tessera/device/arch/mma.cuh"
#include "tessera/device/arch/wgmma.cuh"

namespace tessera {

#if defined(__CUDACC__) || defined(__CUDACC_RTC__)

// Descriptors of 128-byte-swizzled operands are built once per tile base and
// moved by adding bytes / 16 (the start-address field, bits 0-13, holds any
// shared address below 256 KB, so the add never carries into other fields):
// one integer add per k-step instead of rebuilding the descriptor.
__device__ __forceinline__ u64 desc_at(u64 desc, u32 bytes) {
  // 32-bit add on the low word only: no carry chain, and the high word stays
  // a loop invariant.
  const u32 lo = static_cast<u32>(desc) + (bytes >> 4), hi = static_cast<u32>(desc >> 32);
  return (static_cast<u64>(hi) << 32) | lo;
}

#if TESSERA_HAS_WGMMA

// S = Q K^T for one warpgroup's 64 query rows. q_desc: descriptor of the
// warpgroup's first row in the Q tile's first 64-column block (K-major, SBO
// 1024); Q_BLOCK: bytes between the Q tile's column blocks (rows x 128).
// k_desc: the same for a KV_ROWS-row K tile.
template <int KV_ROWS, int HEAD_DIM, int Q_BLOCK, typename T>
__device__ __forceinline__ void wgmma_qk(float (&s)[KV_ROWS / 2], u64 q_desc, u64 k_desc) {
  wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < HEAD_DIM / 16; ++kk) {
    // k-step kk: 16 columns = 32 bytes into column block kk / 4.
    wgmma_ss(s, desc_at(q_desc, (kk / 4) * Q_BLOCK + (kk % 4) * 32),
             desc_at(k_desc, (kk / 4) * (KV_ROWS * 128) + (kk % 4) * 32), kk > 0, T{}, WgmmaN<KV_ROWS>{});
  }
}

// P (softmaxed S, fp32 accumulators) -> A fragments of 16-bit T, one per
// 16-token k-step. Must not run while a wgmma reading `a` is in flight.
template <int KV_ROWS, typename T>
__device__ __forceinline__ void pack_p(u32 (&a)[KV_ROWS / 16][4], const float (&s)[KV_ROWS / 8][4]) {
#pragma unroll
  for (int j = 0; j < KV_ROWS / 16; ++j) {
    a[j][0] = pack2(s[2 * j][0], s[2 * j][1], T{});
    a[j][1] = pack2(s[2 * j][2], s[2 * j][3], T{});
    a[j][2] = pack2(s[2 * j + 1][0], s[2 * j + 1][1], T{});
    a[j][3] = pack2(s[2 * j + 1][2], s[2 * j + 1][3], T{});
  }
}

// O += P V. k-step j covers 16 tokens (two 8-row groups, SBO apart); V's
// 64-feature column blocks are KV_ROWS * 128 bytes apart (LBO: MN-major B).
// v_desc: wgmma_desc(V tile, KV_ROWS * 128, 1024). Head dim 256 takes two
// N = 128 wgmmas per k-step, one per half of O: the accumulators of feature
// n-tile j are o[4j..4j+3] either way, so the halves are plain sub-arrays.
template <int KV_ROWS, int HEAD_DIM, typename T>
__device__ __forceinline__ void wgmma_pv(float (&o)[HEAD_DIM / 2], const u32 (&a)[KV_ROWS / 16][4], u64 v_desc) {
  constexpr int N = HEAD_DIM < 128 ? HEAD_DIM : 128, PARTS = HEAD_DIM / N;
  using Part = float[N / 2];
  wgmma_fence();
#pragma unroll
  for (int j = 0; j < KV_ROWS / 16; ++j)
#pragma unroll
    for (int h = 0; h < PARTS; ++h)
      wgmma_rs_tb(reinterpret_cast<Part&>(o[h * (N / 2)]), a[j],
                  desc_at(v_desc, j * (16 * 128) + h * (N / 64) * (KV_ROWS * 128)), 1, T{}, WgmmaN<N>{});
}

// Row sums of P on the tensor cores: P times a 16 x 8 tile of ones adds each
// row's weights into a 64 x 8 accumulator whose 8 columns all hold the row
// sum, so thread (g, q) reads the sums of its rows g and g + 8 from d[0] and
// d[2] with no quad shuffles. This replaces one FADD per element of the
// softmax (64 per thread and KV tile of 128) and sums exactly the 16-bit
// weights the P V GEMM multiplies. Each m64n8k16 costs the tensor pipe
// ~13-26 cycles (bench/micro/wgmma_rate.cu), far above its share of the
// FLOPs, so the 8 of a 128-key tile add 5-10% to a step's GEMM time; adding
// pairs of fragments first (half the wgmmas) made ptxas spill and insert
// warpgroup arrives. ones_desc: any 128-byte-swizzled descriptor inside a
// 1024-byte-aligned kilobyte of ones (every address such a wgmma reads lies
// in it).
template <int KV_ROWS, typename T>
__device__ __forceinline__ void wgmma_row_sums(float (&d)[4], const u32 (&a)[KV_ROWS / 16][4], u64 ones_desc) {
#pragma unroll
  for (int j = 0; j < KV_ROWS / 16; ++j) wgmma_rs(d, a[j], ones_desc, 1, T{}, WgmmaN<8>{});
}

#endif
#endif

}  // namespace tessera
