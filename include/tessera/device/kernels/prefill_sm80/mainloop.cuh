// Prefill (FA2 template), mainloop: Q tile and KV tiles gathered from any KV
// source (ragged, paged, BSR: one address function) into swizzled shared
// memory with cp.async, then dense tensor-core tiles (mma.sync m16n8k16,
// ldmatrix) with online softmax (paper §3.2.1-3.2.2).
//
// Warps: WARPS_Q along the query tile (16 fused rows each) x WARPS_KV along
// the KV tile (KV_PER_WARP columns each). Each thread holds its two rows of S
// and of O in mma fragments (see arch/mma.cuh); P is re-packed from S's
// fragments straight into the A operand of P*V.
#pragma once
#include "tessera/device/arch/ldmatrix.cuh"
#include "tessera/device/arch/mma.cuh"
#include "tessera/device/arch/vector_io.cuh"
#include "tessera/device/kernels/common/softmax.cuh"
#include "tessera/abi/shared_memory.cuh"
#include "tessera/device/kernels/common/tiles.cuh"

namespace tessera {

#if defined(__CUDACC__) || defined(__CUDACC_RTC__)

// HEAD_DIM_QK: q / k features (Q and K tiles, S = Q K^T); HEAD_DIM_VO: v / o
// features (V tiles, O accumulators). Equal for most models; DeepSeek's
// prefill has 192 / 128, and head dim 512 runs as 512 / 256 twice (the
// host launches the second half of V and O separately). KV: how K / V tiles
// are held (abi/shared_memory.cuh, Fa2KvTiles).
template <int HEAD_DIM_QK, int HEAD_DIM_VO, int CTA_Q, int CTA_KV, int WARPS_Q, int WARPS_KV, int STAGES,
          Fa2KvTiles KV = Fa2KvTiles::k16Bit>
struct PrefillShape {
  static constexpr int THREADS = 32 * WARPS_Q * WARPS_KV;  // the math warps (8-row tiles add a producer warpgroup)
  // 8-row tiles (fp8 or 16-bit caches) put the keys on the mma's rows
  // (mainloop_keys.cuh); their epilogue takes one 16-row m-tile's layout.
  static constexpr bool KEYS_AS_ROWS = CTA_Q == 8;
  static constexpr int MT = KEYS_AS_ROWS ? 1 : CTA_Q / (16 * WARPS_Q);  // 16-row m-tiles per warp
  static constexpr int WARP_ROWS = KEYS_AS_ROWS ? 8 : 16 * MT;
  static constexpr int KV_PER_WARP = CTA_KV / WARPS_KV;
  static constexpr int NT_S = KV_PER_WARP / 8;   // S n-tiles per warp
  static constexpr int NT_O = HEAD_DIM_VO / 8;   // O n-tiles per warp
  static constexpr int Q_ELEMS = CTA_Q * HEAD_DIM_QK;
  static constexpr int K_ELEMS = CTA_KV * HEAD_DIM_QK;
  static constexpr int V_ELEMS = CTA_KV * HEAD_DIM_VO;
  static constexpr int STAGE_ELEMS = K_ELEMS + V_ELEMS;  // a stage: its K tile, then its V tile
  // 16-bit stages after the Q tile (none for kFp8), then the fp8 stages
  // (kFp8, kFp8Widened); the host sizes the launch with the same function.
  static constexpr int STAGES16 = KV == Fa2KvTiles::kFp8 ? 0 : STAGES;
  static constexpr int STAGING_OFFSET = 2 * (Q_ELEMS + STAGES16 * STAGE_ELEMS);
  static constexpr int STAGING_STAGE_BYTES = KV == Fa2KvTiles::k16Bit ? 0 : STAGE_ELEMS;
  static constexpr int SMEM_BYTES = fa2_smem_bytes(HEAD_DIM_QK, HEAD_DIM_VO, CTA_Q, CTA_KV, STAGES, KV);
  static_assert(SMEM_BYTES == STAGING_OFFSET + STAGES * STAGING_STAGE_BYTES, "layout and size agree");
  static_assert(MT >= 1 && CTA_Q == WARP_ROWS * WARPS_Q, "whole 16-row m-tiles per warp");
  static_assert(!KEYS_AS_ROWS || (KV != Fa2KvTiles::kFp8Widened && HEAD_DIM_QK == HEAD_DIM_VO),
                "8-row tiles: K / V rows as stored (16-bit, or fp8 widened in registers), equal head dims");
  static_assert(KV_PER_WARP % 16 == 0, "each warp needs whole 16-column k-steps for P*V");
  static_assert(HEAD_DIM_QK % 64 == 0 && HEAD_DIM_VO % 64 == 0,
                "head dims must be multiples of 64 (64, 128, 256, 512 / 256, 192 / 128)");
};

// S accumulators of one tile, zeroed.
template <int MT, int NT_S>
__device__ __forceinline__ void zero_tile(float (&s)[MT][NT_S][4]) {
#pragma unroll
  for (int t = 0; t < MT; ++t)
#pragma unroll
    for (int n = 0; n < NT_S; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) s[t][n][e] = 0.f;
}

// P's A fragments (type T) for the 16 keys of k-step j, straight from S's
// fragments: S's C layout over two n-tiles is the A layout of P V.
template <typename T, int MT, int NT_S>
__device__ __forceinline__ void pack_p(const float (&s)[MT][NT_S][4], int j, u32 (&a)[MT][4]) {
#pragma unroll
  for (int t = 0; t < MT; ++t) {
    a[t][0] = pack2(s[t][2 * j][0], s[t][2 * j][1], T{});
    a[t][1] = pack2(s[t][2 * j][2], s[t][2 * j][3], T{});
    a[t][2] = pack2(s[t][2 * j + 1][0], s[t][2 * j + 1][1], T{});
    a[t][3] = pack2(s[t][2 * j + 1][2], s[t][2 * j + 1][3], T{});
  }
}

// One KV tile: S = Q K^T, variant logits/mask, online softmax, O += P V.
// Each K/V fragment loaded from shared memory feeds all MT m-tiles of the
// warp: with 32 rows per warp, shared-memory traffic per FLOP halves, which is
// what limits an mma.sync kernel on Hopper.
// kRunScale: the softmax scale is `sm_scale` (an fp8 cache's run-time k_scale
// folded in), not p.sm_scale; the 16-bit kernels keep reading the parameter.
// after_s: called once S's mma are issued (the next tile's copies go out
// while they run).
struct NoHook {
  __device__ __forceinline__ void operator()() const {}
};
template <typename Variant, typename Shape, typename T, int HEAD_DIM_QK, int HEAD_DIM_VO, bool kRunScale = false,
          typename Params, typename AfterS = NoHook>
__device__ __forceinline__ void prefill_compute_tile(const Params& p, const Variant& variant,
                                                     PrefillState<Shape::MT, Shape::NT_O>& st,
                                                     const RowInfo<Shape::MT>& rows, u32 q_smem, u32 k_smem,
                                                     u32 v_smem, int tile_start, int kv_end, int b, int kv_head,
                                                     int wq, int wk, bool masked, int causal_shift,
                                                     float sm_scale = 0.f, AfterS after_s = {}) {
  constexpr int MT = Shape::MT, NT_S = Shape::NT_S, NT_O = Shape::NT_O;
  constexpr u32 ROW_BYTES = HEAD_DIM_QK * 2, V_ROW_BYTES = HEAD_DIM_VO * 2;  // Q and K rows; V rows
  const int lane = threadIdx.x % 32, m = lane / 8, quad = lane % 4;
  // ldmatrix row addresses as 32-bit byte offsets. Every row an ldmatrix lane
  // addresses has row % 8 == lane % 8, so the swizzled chunk of k-step kk is
  // (2 kk + c) ^ (lane % 8) = 2 kk ^ x with x per thread: one XOR with a
  // constant per step, no 64-bit pointers kept live across the loop.
  const u32 xa = (m / 2) ^ (lane % 8);  // Q (A operand) and V (.trans B operand)
  const u32 xk = (m % 2) ^ (lane % 8);  // K (B operand)
  const u32 q_row = q_smem + (wq * Shape::WARP_ROWS + (m % 2) * 8 + lane % 8) * ROW_BYTES;
  const u32 k_row = k_smem + (wk * Shape::KV_PER_WARP + (m / 2) * 8 + lane % 8) * ROW_BYTES;
  const u32 v_row = v_smem + (wk * Shape::KV_PER_WARP + (m % 2) * 8 + lane % 8) * V_ROW_BYTES;
  float s[MT][NT_S][4];
  zero_tile(s);

#pragma unroll
  for (int kk = 0; kk < HEAD_DIM_QK / 16; ++kk) {
    u32 a[MT][4];
#pragma unroll
    for (int t = 0; t < MT; ++t)
      ldmatrix_x4(a[t], q_row + t * 16 * ROW_BYTES + (((2 * kk) ^ xa) << 4));
#pragma unroll
    for (int np = 0; np < NT_S / 2; ++np) {
      u32 r[4];
      ldmatrix_x4(r, k_row + np * 16 * ROW_BYTES + (((2 * kk) ^ xk) << 4));
      const u32 b0[2] = {r[0], r[1]}, b1[2] = {r[2], r[3]};
#pragma unroll
      for (int t = 0; t < MT; ++t) {
        mma_16816(s[t][2 * np], a[t], b0, T{});
        mma_16816(s[t][2 * np + 1], a[t], b1, T{});
      }
    }
  }

  after_s();
  prefill_softmax_tile<Variant, kRunScale, kSoftmaxMaxSlack>(p, variant, st, rows, s,
                                                             tile_start + wk * Shape::KV_PER_WARP + quad * 2, kv_end, b,
                                                             kv_head, masked, causal_shift, sm_scale);

#pragma unroll
  for (int j = 0; j < NT_S / 2; ++j) {
    u32 a[MT][4];
    pack_p<T>(s, j, a);
#pragma unroll
    for (int dp = 0; dp < NT_O / 2; ++dp) {
      u32 r[4];
      ldmatrix_x4_trans(r, v_row + j * 16 * V_ROW_BYTES + (((2 * dp) ^ xa) << 4));
      const u32 b0[2] = {r[0], r[1]}, b1[2] = {r[2], r[3]};
#pragma unroll
      for (int t = 0; t < MT; ++t) {
        mma_16816(st.o[t][2 * dp], a[t], b0, T{});
        mma_16816(st.o[t][2 * dp + 1], a[t], b1, T{});
      }
    }
  }
}

#endif

}  // namespace tessera
