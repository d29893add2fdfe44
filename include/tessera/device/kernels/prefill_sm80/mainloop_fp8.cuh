// Prefill (FA2 template), fp8 caches: one KV tile computed straight from
// the staged fp8 rows (common/tiles.cuh, Fp8RowSwizzle), widened in
// registers to q's 16-bit type as the fragments load.
//
// mma.sync takes 16-bit operands. Widening a staged tile into a 16-bit copy
// costs a shared-memory write and read of every element, and that pass, not
// the conversions, is what held tensor-core decode at ~72% of the read
// ceiling. Here each thread loads the fp8 bytes of its own fragments, in
// orders chosen so that those bytes are contiguous:
// * K, the B operand of S = Q K^T: the 16 features of k-step kk go to the
//   mma's k indices so that thread c (lane % 4) holds features 4c .. 4c + 3
//   (its k indices 2c, 2c + 1, 2c + 8, 2c + 9): one 4-byte load and two
//   packed conversions per n-tile. S sums over features, so Q's A fragments
//   take the same order: one 8-byte load from the 16-bit Q tile per row.
// * V, the B operand of O = P V (k = keys 2c, 2c + 1, 2c + 8, 2c + 9 of
//   the tile's 16, as P's fragments hold them): n-tile 4T + u, column g
//   (lane / 4) is feature 32T + 4g + u, so a thread loads 4 bytes (features
//   32T + 4g ..) of each of its 4 key rows and two byte permutes pair them
//   per feature: 4 loads, 4 permutes and 8 conversions feed 4 n-tiles.
// * O then holds feature 32T + 8c + 4e + u in register e (+ 2 for row g + 8)
//   of n-tile 4T + u; fp8_o_to_mma_order moves it to the mma order (n-tile
//   n, register e: feature 8n + 2c + e) once per work item, before the
//   epilogue, which is the 16-bit kernels'.
#pragma once
#include "tessera/device/arch/fp8.cuh"
#include "tessera/device/kernels/prefill_sm80/mainloop.cuh"

namespace tessera {

#if defined(__CUDACC__) || defined(__CUDACC_RTC__)

// V's bytes for one 16-key step of the O = P V / O^T = V^T P^T fragments:
// features 32 T32 + 4g .. + 3 of this thread's keys 2c, 2c + 1, 2c + 8, 2c + 9
// (stage rows row0, row0 + 1, row0 + 8, row0 + 9), paired per feature by two
// byte permutes a pair of words. Word 0 (lo01) holds features + 0, + 1 of
// keys (2c, 2c + 1) as bytes f0k0, f0k1, f1k0, f1k1; word 1 (lo23) features
// + 2, + 3; words 2, 3 (hi01, hi23) the same of keys (2c + 8, 2c + 9).
template <int HEAD_DIM>
__device__ __forceinline__ void load_v_key_pairs(u32 v_stage, int row0, int T32, u32 (&w)[4]) {
  using Sw = Fp8RowSwizzle<HEAD_DIM>;
  const int lane = threadIdx.x % 32, g = lane / 4, c = lane % 4;
  const int chunk = 2 * T32 + (g >> 2);
  u32 r[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int row = row0 + (i & 1) + 8 * (i >> 1);
    r[i] = ld_shared_u32(v_stage + row * HEAD_DIM + ((chunk ^ Sw::x(2 * c + (i & 1), chunk)) << 4) + 4 * (g & 3));
  }
  w[0] = byte_perm(r[0], r[1], 0x5140);
  w[1] = byte_perm(r[0], r[1], 0x7362);
  w[2] = byte_perm(r[2], r[3], 0x5140);
  w[3] = byte_perm(r[2], r[3], 0x7362);
}

// One KV tile of an fp8 cache (DKV) with q of 16-bit type T: S = Q K^T,
// variant logits / mask, online softmax (the run-time scale sm_scale, into
// which k_scale is folded), O += P V. q_smem: the 16-bit RowSwizzle Q tile;
// k_stage / v_stage: this tile's fp8 K / V stages.
template <typename Variant, typename Shape, typename T, typename DKV, int HEAD_DIM, typename Params>
__device__ __forceinline__ void prefill_compute_tile_fp8(const Params& p, const Variant& variant,
                                                         PrefillState<Shape::MT, Shape::NT_O>& st,
                                                         const RowInfo<Shape::MT>& rows, u32 q_smem, u32 k_stage,
                                                         u32 v_stage, int tile_start, int kv_end, int b, int kv_head,
                                                         int wq, int wk, bool masked, int causal_shift,
                                                         float sm_scale) {
  constexpr int MT = Shape::MT, NT_S = Shape::NT_S;
  constexpr u32 Q_ROW_BYTES = HEAD_DIM * 2;
  using Sw = Fp8RowSwizzle<HEAD_DIM>;
  const int lane = threadIdx.x % 32, g = lane / 4, c = lane % 4;
  // Q rows wq * WARP_ROWS + 16 t + g (+ 8): row % 8 == g, so chunk 2 kk + c / 2
  // swizzles to 2 kk ^ xq.
  const u32 xq = (c >> 1) ^ g;
  const u32 q_row = q_smem + (wq * Shape::WARP_ROWS + g) * Q_ROW_BYTES + 8 * (c & 1);
  // K rows wk * KV_PER_WARP + 8 n + g: their swizzle depends on row % 8 == g only.
  const u32 k_row = k_stage + (wk * Shape::KV_PER_WARP + g) * HEAD_DIM + 4 * c;
  // V rows wk * KV_PER_WARP + 16 j + 2c + {0, 1, 8, 9}: row % 8 is 2c + {0, 1}.
  const int v_row0 = wk * Shape::KV_PER_WARP + 2 * c;
  float s[MT][NT_S][4];
  zero_tile(s);

#pragma unroll
  for (int kk = 0; kk < HEAD_DIM / 16; ++kk) {
    u32 a[MT][4];
#pragma unroll
    for (int t = 0; t < MT; ++t) {
      const u32 at = q_row + t * 16 * Q_ROW_BYTES + (((2 * kk) ^ xq) << 4);
      const uint2 lo = ld_shared_u32x2(at), hi = ld_shared_u32x2(at + 8 * Q_ROW_BYTES);
      a[t][0] = lo.x;  // row g, features 4c, 4c + 1 (k indices 2c, 2c + 1)
      a[t][1] = hi.x;  // row g + 8
      a[t][2] = lo.y;  // row g, features 4c + 2, 4c + 3 (k indices 2c + 8, 2c + 9)
      a[t][3] = hi.y;
    }
    const u32 k_chunk = static_cast<u32>((kk ^ Sw::x(g, kk)) << 4);
#pragma unroll
    for (int n = 0; n < NT_S; ++n) {
      u32 bk[2];
      fp8x4_to_16x2<DKV, T>(ld_shared_u32(k_row + n * 8 * HEAD_DIM + k_chunk), bk[0], bk[1]);
#pragma unroll
      for (int t = 0; t < MT; ++t) mma_16816(s[t][n], a[t], bk, T{});
    }
  }

  prefill_softmax_tile<Variant, true, kSoftmaxMaxSlack>(p, variant, st, rows, s,
                                                        tile_start + wk * Shape::KV_PER_WARP + c * 2, kv_end, b,
                                                        kv_head, masked, causal_shift, sm_scale);

#pragma unroll
  for (int j = 0; j < NT_S / 2; ++j) {
    u32 a[MT][4];
    pack_p<T>(s, j, a);
#pragma unroll
    for (int T32 = 0; T32 < HEAD_DIM / 32; ++T32) {
      u32 wv[4];  // lo01, lo23, hi01, hi23 (load_v_key_pairs)
      load_v_key_pairs<HEAD_DIM>(v_stage, v_row0 + 16 * j, T32, wv);
      u32 bv[4][2];  // n-tile 4 T32 + u: feature 32 T32 + 4g + u
      fp8x4_to_16x2<DKV, T>(wv[0], bv[0][0], bv[1][0]);
      fp8x4_to_16x2<DKV, T>(wv[1], bv[2][0], bv[3][0]);
      fp8x4_to_16x2<DKV, T>(wv[2], bv[0][1], bv[1][1]);
      fp8x4_to_16x2<DKV, T>(wv[3], bv[2][1], bv[3][1]);
#pragma unroll
      for (int u = 0; u < 4; ++u)
#pragma unroll
        for (int t = 0; t < MT; ++t) mma_16816(st.o[t][4 * T32 + u], a[t], bv[u], T{});
    }
  }
}

// Floats of the per-warp scratch fp8_o_to_mma_order uses: 16 rows of 32
// features, padded.
constexpr int kFp8OrderScratchLd = 36;
constexpr int kFp8OrderScratchFloats = 16 * kFp8OrderScratchLd;

// Moves O from prefill_compute_tile_fp8's feature order to the mma order,
// 32 features of one m-tile at a time through this warp's `scratch`
// (kFp8OrderScratchFloats floats, 16-byte aligned).
template <int MT, int NT_O>
__device__ __forceinline__ void fp8_o_to_mma_order(PrefillState<MT, NT_O>& st, float* scratch) {
  static_assert(NT_O % 4 == 0, "whole 32-feature groups");
  constexpr int LD = kFp8OrderScratchLd;
  const int lane = threadIdx.x % 32, g = lane / 4, c = lane % 4;
#pragma unroll
  for (int t = 0; t < MT; ++t)
#pragma unroll
    for (int T32 = 0; T32 < NT_O / 4; ++T32) {
      float(*o)[4] = st.o[t] + 4 * T32;  // n-tiles 4 T32 .. 4 T32 + 3
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        float* row = scratch + (g + 8 * r) * LD + 8 * c;  // this thread's features 8c .. 8c + 7
        *reinterpret_cast<float4*>(row) = make_float4(o[0][2 * r], o[1][2 * r], o[2][2 * r], o[3][2 * r]);
        *reinterpret_cast<float4*>(row + 4) =
            make_float4(o[0][2 * r + 1], o[1][2 * r + 1], o[2][2 * r + 1], o[3][2 * r + 1]);
      }
      __syncwarp();
#pragma unroll
      for (int r = 0; r < 2; ++r)
#pragma unroll
        for (int n = 0; n < 4; ++n) {
          const float2 v = *reinterpret_cast<const float2*>(scratch + (g + 8 * r) * LD + 8 * n + 2 * c);
          o[n][2 * r] = v.x;
          o[n][2 * r + 1] = v.y;
        }
      __syncwarp();
    }
}

#endif

}  // namespace tessera
