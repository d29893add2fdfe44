// Prefill (FA2 template), 8-row query tiles (decode: a request's group of
// at most 8 query heads) of fp8 or 16-bit caches: the keys are the mma's
// rows. The orders below are the fp8 tile's; keys_as_rows_tile_16 takes
// the 16-bit mainloop's (ldmatrix) orders.
//
// A 16-row tile of a 4-head group wastes 3/4 of every mma. Transposed, the
// keys fill the 16 rows (M) and the tile's 8 query rows the columns (N):
//   S^T = K Q^T   A = K (16 keys x 16 features, widened in registers from
//                 the fp8 stage), B = Q^T (16 features x 8 rows, held in
//                 registers for the whole work item);
//   O^T += V^T P^T  A = V^T (16 features x 16 keys, widened and paired per
//                 feature by byte permutes), B = P^T (movmatrix.trans of P's
//                 C fragment, 8 keys x 8 rows at a time).
// Half the mma's of the 16-row tile and half its O registers (O^T: HEAD_DIM
// / 4 floats a thread), with the same loads and conversions of each fp8 byte.
// Orders (the sums over features and keys do not care which index is which,
// as long as both operands agree):
// * S^T's k-step kk: k indices 2c, 2c + 1, 2c + 8, 2c + 9 are features 16 kk
//   + 4c .. + 3, so a thread's K fragment is one 4-byte load per key row and
//   its Q^T fragment one 8-byte load of row g.
// * O^T's m-tiles: thread (g, c) loads features 32 T + 4g .. + 3 of keys 2c,
//   2c + 1, 2c + 8, 2c + 9; m-tile 2T holds features 32 T + 4g (row g) and
//   + 1 (row g + 8), m-tile 2T + 1 features + 2 and + 3. So a thread ends
//   holding four consecutive features of rows 2c and 2c + 1.
// A thread's softmax rows are the tile's rows 2c and 2c + 1 (C columns); a
// row's keys lie across the warp's 8 lane groups g, so the row maximum takes
// three shuffles. At the end of a work item keys_to_row_state moves O, m
// and d to the 16-row kernels' layout (PrefillState<1, ...>, rows g and g +
// 8, the latter past the tile), and the epilogue is theirs.
#pragma once
#include "tessera/device/arch/fp8.cuh"
#include "tessera/device/kernels/prefill_sm80/mainloop_fp8.cuh"

namespace tessera {

#if defined(__CUDACC__) || defined(__CUDACC_RTC__)

// Per-thread state of the keys-as-rows form: rows 2c and 2c + 1 of the tile.
template <int HEAD_DIM>
struct KeysAsRowsState {
  static constexpr int FT = HEAD_DIM / 16;  // O^T m-tiles
  float m[2], d[2];  // m: the same in every lane of a row; d: this lane's keys only
  float o[FT][4];    // O^T fragments: [0], [2] row 2c; [1], [3] row 2c + 1
  u32 q[HEAD_DIM / 16][2];  // Q^T's B fragments, one pair per k-step
  __device__ __forceinline__ void init() {
    m[0] = m[1] = neg_inf();
    d[0] = d[1] = 0.f;
#pragma unroll
    for (int f = 0; f < FT; ++f)
#pragma unroll
      for (int e = 0; e < 4; ++e) o[f][e] = 0.f;
  }
  // Q^T's B fragments for 16-bit K (the mma's own k order): per k-step kk,
  // features 16 kk + 2c, + 1 and 16 kk + 8 + 2c, + 1 of row g, by ldmatrix
  // (two k-steps a load) from the 16-bit RowSwizzle Q tile (8 rows).
  __device__ __forceinline__ void load_q_16(u32 q_smem) {
    static_assert(HEAD_DIM % 32 == 0, "two k-steps a load");
    const int lane = threadIdx.x % 32, m = lane / 8;
    const u32 row = q_smem + (lane % 8) * HEAD_DIM * 2;
#pragma unroll
    for (int k2 = 0; k2 < HEAD_DIM / 32; ++k2) {
      u32 r[4];  // matrix m: features 8 (4 k2 + m) .. + 7 of the 8 rows
      ldmatrix_x4(r, row + (((4 * k2 + m) ^ (lane % 8)) << 4));
      q[2 * k2][0] = r[0], q[2 * k2][1] = r[1], q[2 * k2 + 1][0] = r[2], q[2 * k2 + 1][1] = r[3];
    }
  }
  // Q^T's fragments for fp8 K from the 16-bit RowSwizzle Q tile (8 rows): row g,
  // features 16 kk + 4c .. + 3 (chunk 2 kk + c / 2, XORed with g).
  __device__ __forceinline__ void load_q(u32 q_smem) {
    const int lane = threadIdx.x % 32, g = lane / 4, c = lane % 4;
    const u32 row = q_smem + g * HEAD_DIM * 2 + 8 * (c & 1);
    const u32 x = (c >> 1) ^ g;
#pragma unroll
    for (int kk = 0; kk < HEAD_DIM / 16; ++kk) {
      const uint2 v = ld_shared_u32x2(row + (((2 * kk) ^ x) << 4));
      q[kk][0] = v.x;
      q[kk][1] = v.y;
    }
  }
};

// The tile's rows 2c + r as RowInfo<1> (r = 0, 1): row0 the tile's first
// fused row.
__device__ __forceinline__ RowInfo<1> keys_as_rows_rows(int row0, int group, int kv_head, int qo_len) {
  const int c = threadIdx.x % 4;
  RowInfo<1> rows;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int f = row0 + 2 * c + r;
    rows.qo_idx[0][r] = f / group;
    rows.head[0][r] = kv_head * group + f % group;
    rows.valid[0][r] = rows.qo_idx[0][r] < qo_len;
  }
  return rows;
}

// Variant logits, mask and the online-softmax update of one tile's S^T: MK
// 16-key m-tiles of C fragments, element (mk, e) key key0 + 16 mk + g + 8 (e
// / 2) of row 2c + e % 2. Leaves P^T in s and O^T rescaled. own: bit r set
// where row 2c + r belongs to kv_head (a CTA of several KV heads gives each
// warp one head's K: the other rows get no weight).
template <typename Variant, int MK, int HEAD_DIM, typename Params>
__device__ __forceinline__ void keys_softmax(const Params& p, const Variant& variant, KeysAsRowsState<HEAD_DIM>& st,
                                             const RowInfo<1>& rows, float (&s)[MK][4], int key0, int kv_end, int b,
                                             int kv_head, bool masked, int causal_shift, float sm_scale,
                                             unsigned own = 3u) {
  using Traits = VariantTraits<Variant, Params>;
  const int g = (threadIdx.x % 32) / 4;
  constexpr bool kPlain = Variant::use_softmax && !Traits::logits_transform;
  const float scale_log2 = sm_scale * kLog2e;
  const int col0 = key0 + g;
  if constexpr (!kPlain) {
#pragma unroll
    for (int mk = 0; mk < MK; ++mk)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int r = e & 1, pos = col0 + 16 * mk + 8 * (e >> 1);
        const float logit =
            variant.LogitsTransform(p, s[mk][e] * sm_scale, b, rows.qo_idx[0][r], pos, rows.head[0][r], kv_head);
        s[mk][e] = Variant::use_softmax ? logit * kLog2e : logit;
      }
  }
  if (masked) {
#pragma unroll
    for (int mk = 0; mk < MK; ++mk)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int r = e & 1, pos = col0 + 16 * mk + 8 * (e >> 1);
        bool keep = rows.valid[0][r] && pos < kv_end;
        if constexpr (Variant::causal) keep = keep && pos <= rows.qo_idx[0][r] + causal_shift;
        if constexpr (Variant::window_left >= 0)
          keep = keep && pos >= window_first_key<Variant>(rows.qo_idx[0][r] + causal_shift);
        if constexpr (Traits::logits_mask)
          keep = keep && variant.LogitsMask(p, b, rows.qo_idx[0][r], pos, rows.head[0][r], kv_head);
        if (!keep) s[mk][e] = Variant::use_softmax ? neg_inf() : 0.f;
      }
  }
  if (own != 3u) {
#pragma unroll
    for (int mk = 0; mk < MK; ++mk)
#pragma unroll
      for (int e = 0; e < 4; ++e)
        if (!((own >> (e & 1)) & 1u)) s[mk][e] = Variant::use_softmax ? neg_inf() : 0.f;
  }
  if constexpr (Variant::use_softmax) {
    float scale[2];
    bool raised = false;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float mx = fmaxf(s[0][r], s[0][r + 2]);
#pragma unroll
      for (int mk = 1; mk < MK; ++mk) mx = fmaxf(mx, fmaxf(s[mk][r], s[mk][r + 2]));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 4));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 8));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 16));
      if constexpr (kPlain) mx *= scale_log2;  // sm_scale > 0 (checked on the host): the max commutes
      const float m_new = fmaxf(mx, st.m[r]);
      raised |= m_new > st.m[r];
      const float m_safe = m_new == neg_inf() ? 0.f : m_new;
      scale[r] = fast_exp2(st.m[r] - m_safe);
      st.m[r] = m_new;
    }
    raised = __any_sync(0xffffffffu, raised);
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const float m_safe = st.m[r] == neg_inf() ? 0.f : st.m[r];  // all masked so far: weights 0, not NaN
      float sum = 0.f;
#pragma unroll
      for (int mk = 0; mk < MK; ++mk)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          float& x = s[mk][r + 2 * h];
          x = kPlain ? fast_exp2(fmaf(x, scale_log2, -m_safe)) : fast_exp2(x - m_safe);
          sum += x;
        }
      st.d[r] = (raised ? st.d[r] * scale[r] : st.d[r]) + sum;
    }
    if (raised) {
#pragma unroll
      for (int f = 0; f < KeysAsRowsState<HEAD_DIM>::FT; ++f)
#pragma unroll
        for (int e = 0; e < 4; ++e) st.o[f][e] *= scale[e & 1];
    }
  }

}

// P^T's B fragments for O^T += V^T P^T, from one S^T m-tile's C fragment
// (P after keys_softmax): keys 2c, 2c + 1 and 2c + 8, 2c + 9 of row g.
struct PTransposed {
  u32 b[2];
  template <typename T>
  __device__ __forceinline__ PTransposed(const float (&c)[4], T t)
      : b{movmatrix_trans(pack2(c[0], c[1], t)), movmatrix_trans(pack2(c[2], c[3], t))} {}
};

// One KV tile: S^T = K Q^T, variant logits / mask, online softmax (run-time
// scale sm_scale, k_scale folded in), O^T += V^T P^T. k_stage / v_stage:
// this tile's fp8 stages (kv_head's rows); warp wk takes keys wk *
// KV_PER_WARP ...; own as keys_softmax's.
template <typename Variant, typename Shape, typename T, typename DKV, int HEAD_DIM, typename Params>
__device__ __forceinline__ void keys_as_rows_tile_fp8(const Params& p, const Variant& variant,
                                                      KeysAsRowsState<HEAD_DIM>& st, const RowInfo<1>& rows,
                                                      u32 k_stage, u32 v_stage, int tile_start, int kv_end, int b,
                                                      int kv_head, int wk, bool masked, int causal_shift,
                                                      float sm_scale, unsigned own = 3u) {
  constexpr int MK = Shape::KV_PER_WARP / 16;  // 16-key m-tiles of S^T per warp
  using Sw = Fp8RowSwizzle<HEAD_DIM>;
  using Traits = VariantTraits<Variant, Params>;
  static_assert(!Traits::logits_mask_bits, "keys as rows: no LogitsMaskBits (the host picks 16-row tiles)");
  const int lane = threadIdx.x % 32, g = lane / 4, c = lane % 4;
  // K rows wk * KV_PER_WARP + 16 mk + g (+ 8): their swizzle depends on row % 8 == g only.
  const u32 k_row = k_stage + (wk * Shape::KV_PER_WARP + g) * HEAD_DIM + 4 * c;
  float s[MK][4] = {};  // S^T's C fragments
#pragma unroll
  for (int kk = 0; kk < HEAD_DIM / 16; ++kk) {
    const u32 k_chunk = static_cast<u32>((kk ^ Sw::x(g, kk)) << 4);
#pragma unroll
    for (int mk = 0; mk < MK; ++mk) {
      u32 a[4];
      fp8x4_to_16x2<DKV, T>(ld_shared_u32(k_row + 16 * mk * HEAD_DIM + k_chunk), a[0], a[2]);
      fp8x4_to_16x2<DKV, T>(ld_shared_u32(k_row + (16 * mk + 8) * HEAD_DIM + k_chunk), a[1], a[3]);
      mma_16816(s[mk], a, st.q[kk], T{});
    }
  }

  keys_softmax<Variant, MK>(p, variant, st, rows, s, tile_start + wk * Shape::KV_PER_WARP, kv_end, b, kv_head, masked,
                            causal_shift, sm_scale, own);

  // O^T += V^T P^T, one 16-key k-step per S^T m-tile.
  const int v_row0 = wk * Shape::KV_PER_WARP + 2 * c;  // keys 2c, 2c + 1, 2c + 8, 2c + 9 of each 16
#pragma unroll
  for (int mk = 0; mk < MK; ++mk) {
    const PTransposed pb(s[mk], T{});
#pragma unroll
    for (int T32 = 0; T32 < HEAD_DIM / 32; ++T32) {
      u32 wv[4];  // lo01, lo23, hi01, hi23: features 32 T32 + 4g .. + 3 paired per key pair
      load_v_key_pairs<HEAD_DIM>(v_stage, v_row0 + 16 * mk, T32, wv);
      u32 a0[4], a1[4];  // m-tiles 2 T32 (features + 0, + 1) and 2 T32 + 1 (+ 2, + 3)
      fp8x4_to_16x2<DKV, T>(wv[0], a0[0], a0[1]);
      fp8x4_to_16x2<DKV, T>(wv[2], a0[2], a0[3]);
      fp8x4_to_16x2<DKV, T>(wv[1], a1[0], a1[1]);
      fp8x4_to_16x2<DKV, T>(wv[3], a1[2], a1[3]);
      mma_16816(st.o[2 * T32], a0, pb.b, T{});
      mma_16816(st.o[2 * T32 + 1], a1, pb.b, T{});
    }
  }
}

// The same tile over 16-bit K / V stages (RowSwizzle rows, the 16-bit
// mainloop's layout): K's A fragments by ldmatrix (16 keys x 16 features),
// Q^T's B fragments held from load_q_16, V^T's A fragments by
// ldmatrix.trans (16 features x 16 keys). O^T's m-tile ft holds features
// 16 ft + g (row g of the fragment) and 16 ft + 8 + g (row g + 8).
template <typename Variant, typename Shape, typename T, int HEAD_DIM, typename Params>
__device__ __forceinline__ void keys_as_rows_tile_16(const Params& p, const Variant& variant,
                                                     KeysAsRowsState<HEAD_DIM>& st, const RowInfo<1>& rows,
                                                     u32 k_stage, u32 v_stage, int tile_start, int kv_end, int b,
                                                     int kv_head, int wk, bool masked, int causal_shift,
                                                     float sm_scale) {
  constexpr int MK = Shape::KV_PER_WARP / 16;
  constexpr u32 ROW_BYTES = HEAD_DIM * 2;
  using Traits = VariantTraits<Variant, Params>;
  static_assert(!Traits::logits_mask_bits, "keys as rows: no LogitsMaskBits (the host picks 16-row tiles)");
  const int lane = threadIdx.x % 32, m = lane / 8;
  // ldmatrix lanes: matrix m, row lane % 8 (every row's swizzle is lane % 8).
  // K (A): keys 8 (m % 2) + lane % 8, chunk 2 kk + m / 2. V (.trans A):
  // keys 8 (m / 2) + lane % 8, chunk 2 ft + m % 2.
  const u32 xk = (m / 2) ^ (lane % 8), xv = (m % 2) ^ (lane % 8);
  const u32 k_row = k_stage + (wk * Shape::KV_PER_WARP + (m % 2) * 8 + lane % 8) * ROW_BYTES;
  const u32 v_row = v_stage + (wk * Shape::KV_PER_WARP + (m / 2) * 8 + lane % 8) * ROW_BYTES;
  float s[MK][4] = {};  // S^T's C fragments
#pragma unroll
  for (int kk = 0; kk < HEAD_DIM / 16; ++kk)
#pragma unroll
    for (int mk = 0; mk < MK; ++mk) {
      u32 a[4];
      ldmatrix_x4(a, k_row + 16 * mk * ROW_BYTES + (((2 * kk) ^ xk) << 4));
      mma_16816(s[mk], a, st.q[kk], T{});
    }

  keys_softmax<Variant, MK>(p, variant, st, rows, s, tile_start + wk * Shape::KV_PER_WARP, kv_end, b, kv_head, masked,
                            causal_shift, sm_scale);

#pragma unroll
  for (int mk = 0; mk < MK; ++mk) {
    const PTransposed pb(s[mk], T{});
#pragma unroll
    for (int ft = 0; ft < HEAD_DIM / 16; ++ft) {
      u32 a[4];
      ldmatrix_x4_trans(a, v_row + 16 * mk * ROW_BYTES + (((2 * ft) ^ xv) << 4));
      mma_16816(st.o[ft], a, pb.b, T{});
    }
  }
}

// Floats of the per-warp scratch keys_to_row_state uses: 8 rows of HEAD_DIM
// features, m and d, padded to whole float4s.
template <int HEAD_DIM>
constexpr int kKeysScratchLd = HEAD_DIM + 4;

// Moves a finished item's state to the 16-row kernels' layout: row g of the
// tile in st's first row (O pairs at features 8n + 2c, m, d summed over the
// row's keys in lane c = 0 only, as prefill_sum_quads expects), the second
// row (g + 8, past the 8-row tile) empty. scratch: this warp's
// 8 * kKeysScratchLd<HEAD_DIM> floats, 16-byte aligned.
template <bool FP8_ORDER, int HEAD_DIM, int NT_O>
__device__ __forceinline__ void keys_to_row_state(KeysAsRowsState<HEAD_DIM>& ks, PrefillState<1, NT_O>& st,
                                                  float* scratch) {
  static_assert(NT_O * 8 == HEAD_DIM, "one head dim");
  constexpr int LD = kKeysScratchLd<HEAD_DIM>;
  const int lane = threadIdx.x % 32, g = lane / 4, c = lane % 4;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    ks.d[r] += __shfl_xor_sync(0xffffffffu, ks.d[r], 4);
    ks.d[r] += __shfl_xor_sync(0xffffffffu, ks.d[r], 8);
    ks.d[r] += __shfl_xor_sync(0xffffffffu, ks.d[r], 16);
    float* row = scratch + (2 * c + r) * LD;
    if constexpr (FP8_ORDER) {  // m-tile 2 T32 + u: features 32 T32 + 4g + 2u (+ 1)
#pragma unroll
      for (int T32 = 0; T32 < HEAD_DIM / 32; ++T32)
        *reinterpret_cast<float4*>(row + 32 * T32 + 4 * g) =
            make_float4(ks.o[2 * T32][r], ks.o[2 * T32][r + 2], ks.o[2 * T32 + 1][r], ks.o[2 * T32 + 1][r + 2]);
    } else {  // m-tile ft: features 16 ft + g and 16 ft + 8 + g
#pragma unroll
      for (int ft = 0; ft < HEAD_DIM / 16; ++ft) {
        row[16 * ft + g] = ks.o[ft][r];
        row[16 * ft + 8 + g] = ks.o[ft][r + 2];
      }
    }
    if (g == 0) {
      row[HEAD_DIM] = ks.m[r];
      row[HEAD_DIM + 1] = ks.d[r];
    }
  }
  __syncwarp();
  const float* row = scratch + g * LD;
#pragma unroll
  for (int n = 0; n < NT_O; ++n) {
    const float2 v = *reinterpret_cast<const float2*>(row + 8 * n + 2 * c);
    st.o[0][n][0] = v.x;
    st.o[0][n][1] = v.y;
    st.o[0][n][2] = st.o[0][n][3] = 0.f;
  }
  st.m[0][0] = row[HEAD_DIM];
  st.d[0][0] = c == 0 ? row[HEAD_DIM + 1] : 0.f;
  st.m[0][1] = neg_inf();
  st.d[0][1] = 0.f;
  __syncwarp();
}

#endif

}  // namespace tessera
