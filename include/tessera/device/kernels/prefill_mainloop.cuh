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
#include "tessera/device/arch/cp_async.cuh"
#include "tessera/device/arch/ldmatrix.cuh"
#include "tessera/device/arch/mma.cuh"
#include "tessera/device/arch/vector_io.cuh"
#include "tessera/device/kernels/prefill_params.cuh"
#include "tessera/device/primitives/attention_state.cuh"
#include "tessera/device/primitives/variant_traits.cuh"

namespace tessera {

#if defined(__CUDACC__) || defined(__CUDACC_RTC__)

template <int HEAD_DIM, int CTA_Q, int CTA_KV, int WARPS_Q, int WARPS_KV, int STAGES>
struct PrefillShape {
  static constexpr int THREADS = 32 * WARPS_Q * WARPS_KV;
  static constexpr int MT = CTA_Q / (16 * WARPS_Q);  // 16-row m-tiles per warp
  static constexpr int WARP_ROWS = 16 * MT;
  static constexpr int KV_PER_WARP = CTA_KV / WARPS_KV;
  static constexpr int NT_S = KV_PER_WARP / 8;  // S n-tiles per warp
  static constexpr int NT_O = HEAD_DIM / 8;     // O n-tiles per warp
  static constexpr int CHUNKS = HEAD_DIM / 8;   // 16-byte chunks per row
  static constexpr int Q_ELEMS = CTA_Q * HEAD_DIM;
  static constexpr int KV_ELEMS = CTA_KV * HEAD_DIM;
  static constexpr int SMEM_BYTES = 2 * (Q_ELEMS + STAGES * 2 * KV_ELEMS);
  static_assert(MT >= 1 && CTA_Q == WARP_ROWS * WARPS_Q, "whole 16-row m-tiles per warp");
  static_assert(KV_PER_WARP % 16 == 0, "each warp needs whole 16-column k-steps for P*V");
  static_assert(HEAD_DIM % 64 == 0, "head_dim must be 64, 128 or 256");
};

// Element index of (row, 16-byte chunk) in a swizzled [rows][HEAD_DIM] tile:
// the chunk is XORed with row % 8, so the 8 rows one ldmatrix reads, and the
// chunks one row's copies write, fall in different banks.
template <int HEAD_DIM>
__device__ __forceinline__ int swz(int row, int chunk) {
  return row * HEAD_DIM + ((chunk ^ (row & 7)) << 3);
}

// Copies a [rows][HEAD_DIM] tile whose row r lives at src_offset(r) (or is
// zero-filled when src_offset(r) < 0) into swizzled shared memory.
template <int HEAD_DIM, int ROWS, int THREADS, typename T, typename RowOffset>
__device__ __forceinline__ void load_tile(T* smem, const T* base, RowOffset row_offset) {
  constexpr int CH = HEAD_DIM / 8;
#pragma unroll
  for (int c = threadIdx.x; c < ROWS * CH; c += THREADS) {
    const int row = c / CH, ch = c % CH;
    const i64 off = row_offset(row);
    cp_async_16(smem + swz<HEAD_DIM>(row, ch), off >= 0 ? base + off + ch * 8 : base, off >= 0);
  }
}

// Copies one KV tile (K and V rows share their address) into swizzled shared
// memory. Fully unrolled: thread t always copies chunk t % CH of rows
// t / CH + i * (THREADS / CH), so each row's address (a page-table lookup for
// paged KV) is resolved once for K and V together.
template <int HEAD_DIM, int ROWS, int THREADS, typename T, typename RowOffset>
__device__ __forceinline__ void load_kv_tile(T* k_smem, T* v_smem, const T* k_base, const T* v_base,
                                             RowOffset row_offset) {
  constexpr int CH = HEAD_DIM / 8;
  static_assert(THREADS % CH == 0 && ROWS * CH % THREADS == 0, "whole rows per pass");
  constexpr int ROWS_PER_PASS = THREADS / CH, PASSES = ROWS / ROWS_PER_PASS;
  const int ch = threadIdx.x % CH, row0 = threadIdx.x / CH;
#pragma unroll
  for (int i = 0; i < PASSES; ++i) {
    const int row = row0 + i * ROWS_PER_PASS;
    const i64 off = row_offset(row);
    const bool ok = off >= 0;
    const int dst = swz<HEAD_DIM>(row, ch);
    cp_async_16(k_smem + dst, ok ? k_base + off + ch * 8 : k_base, ok);
    cp_async_16(v_smem + dst, ok ? v_base + off + ch * 8 : v_base, ok);
  }
}

// Applies an element-wise transform in place to a swizzled tile (only for
// variants that override the slot; see VariantTraits).
template <int HEAD_DIM, int ROWS, int THREADS, typename T, typename Fn>
__device__ __forceinline__ void transform_tile(T* smem, Fn fn) {
  for (int i = threadIdx.x; i < ROWS * HEAD_DIM; i += THREADS) {
    const int row = i / HEAD_DIM, col = i % HEAD_DIM;
    T* e = smem + swz<HEAD_DIM>(row, col / 8) + col % 8;
    *e = from_float<T>(fn(row, col, to_float(*e)));
  }
}

// Per-thread softmax state: for each of the warp's MT m-tiles, the thread's
// two rows (g and g + 8 of the m-tile).
template <int MT, int NT_O>
struct PrefillState {
  float m[MT][2], d[MT][2];
  float o[MT][NT_O][4];
  __device__ __forceinline__ void init() {
#pragma unroll
    for (int t = 0; t < MT; ++t) {
      m[t][0] = m[t][1] = neg_inf();
      d[t][0] = d[t][1] = 0.f;
#pragma unroll
      for (int n = 0; n < NT_O; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) o[t][n][e] = 0.f;
    }
  }
};

// The rows this thread owns, resolved once per work item.
template <int MT>
struct RowInfo {
  int qo_idx[MT][2];  // position within the request
  int head[MT][2];    // query head
  bool valid[MT][2];
};

// One KV tile: S = Q K^T, variant logits/mask, online softmax, O += P V.
// Each K/V fragment loaded from shared memory feeds all MT m-tiles of the
// warp: with 32 rows per warp, shared-memory traffic per FLOP halves, which is
// what limits an mma.sync kernel on Hopper.
template <typename Variant, typename Shape, typename T, int HEAD_DIM, typename Params>
__device__ __forceinline__ void prefill_compute_tile(const Params& p, const Variant& variant,
                                                     PrefillState<Shape::MT, Shape::NT_O>& st,
                                                     const RowInfo<Shape::MT>& rows, u32 q_smem, u32 k_smem,
                                                     u32 v_smem, int tile_start, int kv_end, int b, int kv_head,
                                                     int wq, int wk, bool masked, int causal_shift) {
  constexpr int MT = Shape::MT, NT_S = Shape::NT_S, NT_O = Shape::NT_O;
  constexpr u32 ROW_BYTES = HEAD_DIM * 2;
  const int lane = threadIdx.x % 32, m = lane / 8, quad = lane % 4;
  // ldmatrix row addresses as 32-bit byte offsets. Every row an ldmatrix lane
  // addresses has row % 8 == lane % 8, so the swizzled chunk of k-step kk is
  // (2 kk + c) ^ (lane % 8) = 2 kk ^ x with x per thread: one XOR with a
  // constant per step, no 64-bit pointers kept live across the loop.
  const u32 xa = (m / 2) ^ (lane % 8);  // Q (A operand) and V (.trans B operand)
  const u32 xk = (m % 2) ^ (lane % 8);  // K (B operand)
  const u32 q_row = q_smem + (wq * Shape::WARP_ROWS + (m % 2) * 8 + lane % 8) * ROW_BYTES;
  const u32 k_row = k_smem + (wk * Shape::KV_PER_WARP + (m / 2) * 8 + lane % 8) * ROW_BYTES;
  const u32 v_row = v_smem + (wk * Shape::KV_PER_WARP + (m % 2) * 8 + lane % 8) * ROW_BYTES;
  float s[MT][NT_S][4];
#pragma unroll
  for (int t = 0; t < MT; ++t)
#pragma unroll
    for (int n = 0; n < NT_S; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) s[t][n][e] = 0.f;

#pragma unroll
  for (int kk = 0; kk < HEAD_DIM / 16; ++kk) {
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

  // Logits. Plain softmax variants keep S raw and fold sm_scale * log2(e)
  // into the exponent (one FFMA + MUFU per element); others run the variant's
  // LogitsTransform and move to base 2. Masks run only on tiles that need one
  // (`masked`: crosses kv_end, the causal diagonal or the last query row, or
  // the variant has its own LogitsMask).
  using Traits = VariantTraits<Variant, Params>;
  constexpr bool kPlain = Variant::use_softmax && !Traits::logits_transform;
  const float scale_log2 = p.sm_scale * kLog2e;
  const int col0 = tile_start + wk * Shape::KV_PER_WARP + quad * 2;
  auto keep = [&](int t, int r, int pos) {
    bool k = rows.valid[t][r] && pos < kv_end;
    if constexpr (Variant::causal) k = k && pos <= rows.qo_idx[t][r] + causal_shift;
    if constexpr (Traits::logits_mask) k = k && variant.LogitsMask(p, b, rows.qo_idx[t][r], pos, rows.head[t][r], kv_head);
    return k;
  };
#pragma unroll
  for (int t = 0; t < MT; ++t)
#pragma unroll
    for (int n = 0; n < NT_S; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int r = e / 2, pos = col0 + n * 8 + (e & 1);
        if constexpr (kPlain) {
          if (masked && !keep(t, r, pos)) s[t][n][e] = neg_inf();
        } else {
          const float logit = variant.LogitsTransform(p, s[t][n][e] * p.sm_scale, b, rows.qo_idx[t][r], pos,
                                                      rows.head[t][r], kv_head);
          const bool k = !masked || keep(t, r, pos);
          s[t][n][e] = Variant::use_softmax ? (k ? logit * kLog2e : neg_inf()) : (k ? logit : 0.f);
        }
      }

  if (Variant::use_softmax) {
    // New row maxima first; O and d are rescaled only when some row of the
    // warp raised its maximum (after the first tiles of a long row this is
    // rare, and the rescale is MT x NT_O x 4 multiplies).
    float m_new[MT][2];
    bool raised = false;
#pragma unroll
    for (int t = 0; t < MT; ++t)
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        float mx = neg_inf();
#pragma unroll
        for (int n = 0; n < NT_S; ++n) mx = fmaxf(mx, fmaxf(s[t][n][2 * r], s[t][n][2 * r + 1]));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
        if constexpr (kPlain) mx *= scale_log2;  // sm_scale > 0 (checked on the host): the max commutes
        m_new[t][r] = fmaxf(mx, st.m[t][r]);
        raised |= m_new[t][r] > st.m[t][r];
      }
    if (__any_sync(0xffffffffu, raised)) {
#pragma unroll
      for (int t = 0; t < MT; ++t)
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          const float m_safe = m_new[t][r] == neg_inf() ? 0.f : m_new[t][r];
          const float scale = fast_exp2(st.m[t][r] - m_safe);
          st.d[t][r] *= scale;
#pragma unroll
          for (int n = 0; n < NT_O; ++n) {
            st.o[t][n][2 * r] *= scale;
            st.o[t][n][2 * r + 1] *= scale;
          }
          st.m[t][r] = m_new[t][r];
        }
    }
#pragma unroll
    for (int t = 0; t < MT; ++t)
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const float m_safe = st.m[t][r] == neg_inf() ? 0.f : st.m[t][r];  // all masked so far: weights 0, not NaN
        float sum = 0.f;
#pragma unroll
        for (int n = 0; n < NT_S; ++n)
#pragma unroll
          for (int c = 0; c < 2; ++c) {
            float& x = s[t][n][2 * r + c];
            x = kPlain ? fast_exp2(fmaf(x, scale_log2, -m_safe)) : fast_exp2(x - m_safe);
            sum += x;
          }
        st.d[t][r] += sum;  // a quarter of the row: quads are summed at the end
      }
  }

#pragma unroll
  for (int j = 0; j < NT_S / 2; ++j) {
    u32 a[MT][4];
#pragma unroll
    for (int t = 0; t < MT; ++t) {
      a[t][0] = pack2(s[t][2 * j][0], s[t][2 * j][1], T{});
      a[t][1] = pack2(s[t][2 * j][2], s[t][2 * j][3], T{});
      a[t][2] = pack2(s[t][2 * j + 1][0], s[t][2 * j + 1][1], T{});
      a[t][3] = pack2(s[t][2 * j + 1][2], s[t][2 * j + 1][3], T{});
    }
#pragma unroll
    for (int dp = 0; dp < NT_O / 2; ++dp) {
      u32 r[4];
      ldmatrix_x4_trans(r, v_row + j * 16 * ROW_BYTES + (((2 * dp) ^ xa) << 4));
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
