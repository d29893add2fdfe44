// Prefill (Hopper template), the two warpgroup GEMMs of a KV tile: S = Q K^T
// with both operands in 128-byte-swizzled shared memory, and O += P V with P
// packed from S's accumulators into A fragments (registers) and V read
// MN-major. Both are asynchronous: the caller commits and waits
// (arch/wgmma.cuh), so a mainloop can overlap them with the softmax.
#pragma once
#include "tessera/device/arch/mma.cuh"
#include "tessera/device/arch/wgmma.cuh"
#include "tessera/device/arch/wgmma_fp8.cuh"

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

// ---- fp8 tensor cores (PrefillOptions::fp8_mma: head dim 128, 128-key tiles)
// S = (Q_hi + Q_lo) K^T: q as the sum of two e4m3 tiles (its rounding and
// the rounding's residual, about 7 significant bits together) times K, the
// cache's fp8 rows, all K-major in 128-byte-swizzled tiles of 128-byte rows
// (a k-step is 32 features, 32 bytes, as a 16-bit k-step is); q_lo_desc is
// q_desc plus Q_LO bytes.
template <int KV_ROWS, int HEAD_DIM, int Q_LO, typename DKV>
__device__ __forceinline__ void wgmma_qk_fp8(float (&s)[KV_ROWS / 2], u64 q_desc, u64 k_desc) {
  static_assert(KV_ROWS == 128 && HEAD_DIM == 128, "fp8 tensor cores: 128-key tiles of head dim 128");
  wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < 2 * HEAD_DIM / 32; ++kk) {
    const int f = kk % (HEAD_DIM / 32);  // the k-step's features, of Q_hi then of Q_lo
    wgmma_ss_fp8(s, desc_at(q_desc, (kk >= HEAD_DIM / 32 ? Q_LO : 0) + f * 32), desc_at(k_desc, f * 32), kk > 0, DKV{});
  }
}

// P (fp32, scaled by 2^8 so that e4m3 keeps small weights) -> e4m3 A
// fragments, one per 32-key k-step. The accumulators give thread (g, q) the
// keys 8n + 2q, 8n + 2q + 1 of each n-tile, while an fp8 A fragment wants
// k = 4q .. 4q + 3: the thread packs its own keys 2q, 2q + 1, 8 + 2q, 9 + 2q
// (of each 16) as k = 4q .. 4q + 3, and the producer stores V^T with its
// keys in that same order (fp8_vt_position), so P V sums the same products.
template <int KV_ROWS>
__device__ __forceinline__ void pack_p_fp8(u32 (&a)[KV_ROWS / 32][4], const float (&s)[KV_ROWS / 8][4]) {
  auto four = [](float x0, float x1, float x2, float x3) {
    return float_to_fp8x2<fp8_e4m3_t>(x0, x1) | (float_to_fp8x2<fp8_e4m3_t>(x2, x3) << 16);
  };
#pragma unroll
  for (int j = 0; j < KV_ROWS / 32; ++j) {
    a[j][0] = four(s[4 * j][0], s[4 * j][1], s[4 * j + 1][0], s[4 * j + 1][1]);
    a[j][1] = four(s[4 * j][2], s[4 * j][3], s[4 * j + 1][2], s[4 * j + 1][3]);
    a[j][2] = four(s[4 * j + 2][0], s[4 * j + 2][1], s[4 * j + 3][0], s[4 * j + 3][1]);
    a[j][3] = four(s[4 * j + 2][2], s[4 * j + 2][3], s[4 * j + 3][2], s[4 * j + 3][3]);
  }
}

// O += P V^T-tile: vt_desc describes V^T (HEAD_DIM rows of KV_ROWS keys,
// K-major, 128-byte swizzle); k-step j is 32 keys, 32 bytes into each row.
template <int KV_ROWS, int HEAD_DIM, typename DKV>
__device__ __forceinline__ void wgmma_pv_fp8(float (&o)[HEAD_DIM / 2], const u32 (&a)[KV_ROWS / 32][4], u64 vt_desc) {
  static_assert(KV_ROWS == 128 && HEAD_DIM == 128, "fp8 tensor cores: 128-key tiles of head dim 128");
  wgmma_fence();
#pragma unroll
  for (int j = 0; j < KV_ROWS / 32; ++j) wgmma_rs_fp8(o, a[j], desc_at(vt_desc, j * 32), 1, DKV{});
}

// The consumer's two GEMMs of a KV tile in 16-bit (FP8 = false) or on fp8
// tensor cores: the P fragments, their packing, the V operand's
// descriptor and a K / V stage's bytes.
template <bool FP8, typename T, typename DKV, int HEAD_DIM, int CTA_KV, int Q_BLOCK>
struct Sm90Gemms {
  static constexpr int kKvTileBytes = CTA_KV * HEAD_DIM * 2;
  using PFrag = u32[CTA_KV / 16][4];
  __device__ __forceinline__ static u64 v_desc(u32 addr) { return wgmma_desc(addr, CTA_KV * 128, 1024); }
  __device__ __forceinline__ static void qk(float (&s)[CTA_KV / 2], u64 q, u64 k) {
    wgmma_qk<CTA_KV, HEAD_DIM, Q_BLOCK, T>(s, q, k);
  }
  __device__ __forceinline__ static void pv(float (&o)[HEAD_DIM / 2], const PFrag& a, u64 v) {
    wgmma_pv<CTA_KV, HEAD_DIM, T>(o, a, v);
  }
  __device__ __forceinline__ static void pack(PFrag& a, const float (&s)[CTA_KV / 8][4]) { pack_p<CTA_KV, T>(a, s); }
};
// Q_hi and Q_lo are CTA_Q x 128-byte tiles, Q_lo Q_BLOCK (CTA_Q x 128) bytes
// after Q_hi.
template <typename T, typename DKV, int HEAD_DIM, int CTA_KV, int Q_BLOCK>
struct Sm90Gemms<true, T, DKV, HEAD_DIM, CTA_KV, Q_BLOCK> {
  static constexpr int kKvTileBytes = CTA_KV * HEAD_DIM;
  using PFrag = u32[CTA_KV / 32][4];
  __device__ __forceinline__ static u64 v_desc(u32 addr) { return wgmma_desc(addr, 16, 1024); }
  __device__ __forceinline__ static void qk(float (&s)[CTA_KV / 2], u64 q, u64 k) {
    wgmma_qk_fp8<CTA_KV, HEAD_DIM, Q_BLOCK, DKV>(s, q, k);
  }
  __device__ __forceinline__ static void pv(float (&o)[HEAD_DIM / 2], const PFrag& a, u64 v) {
    wgmma_pv_fp8<CTA_KV, HEAD_DIM, DKV>(o, a, v);
  }
  __device__ __forceinline__ static void pack(PFrag& a, const float (&s)[CTA_KV / 8][4]) { pack_p_fp8<CTA_KV>(a, s); }
};

#endif
#endif

}  // namespace tessera
