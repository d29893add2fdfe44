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
  static constexpr int KV_PER_WARP = CTA_KV / WARPS_KV;
  static constexpr int NT_S = KV_PER_WARP / 8;  // S n-tiles per warp
  static constexpr int NT_O = HEAD_DIM / 8;     // O n-tiles per warp
  static constexpr int CHUNKS = HEAD_DIM / 8;   // 16-byte chunks per row
  static constexpr int Q_ELEMS = CTA_Q * HEAD_DIM;
  static constexpr int KV_ELEMS = CTA_KV * HEAD_DIM;
  static constexpr int SMEM_BYTES = 2 * (Q_ELEMS + STAGES * 2 * KV_ELEMS);
  static_assert(CTA_Q == 16 * WARPS_Q, "16 query rows per warp");
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

// Per-thread softmax state for its two rows (g and g + 8 of the warp's 16).
template <int NT_O>
struct PrefillState {
  float m[2], d[2];
  float o[NT_O][4];
  __device__ __forceinline__ void init() {
    m[0] = m[1] = neg_inf();
    d[0] = d[1] = 0.f;
#pragma unroll
    for (int n = 0; n < NT_O; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) o[n][e] = 0.f;
  }
};

// The two rows this thread owns, resolved once per work item.
struct RowInfo {
  int qo_idx[2];  // position within the request
  int head[2];    // query head
  bool valid[2];
};

// One KV tile: S = Q K^T, variant logits/mask, online softmax, O += P V.
template <typename Variant, typename Shape, typename T, int HEAD_DIM, typename Params>
__device__ __forceinline__ void prefill_compute_tile(const Params& p, const Variant& variant, PrefillState<Shape::NT_O>& st,
                                                     const RowInfo& rows, const T* q_smem, const T* k_smem,
                                                     const T* v_smem, int tile_start, int kv_end, int b, int kv_head,
                                                     int wq, int wk) {
  constexpr int NT_S = Shape::NT_S, NT_O = Shape::NT_O;
  const int lane = threadIdx.x % 32, m = lane / 8, quad = lane % 4;
  float s[NT_S][4];
#pragma unroll
  for (int n = 0; n < NT_S; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) s[n][e] = 0.f;

#pragma unroll
  for (int kk = 0; kk < HEAD_DIM / 16; ++kk) {
    u32 a[4];
    ldmatrix_x4(a, q_smem + swz<HEAD_DIM>(wq * 16 + (m % 2) * 8 + lane % 8, kk * 2 + m / 2));
#pragma unroll
    for (int np = 0; np < NT_S / 2; ++np) {
      u32 r[4];
      ldmatrix_x4(r, k_smem + swz<HEAD_DIM>(wk * Shape::KV_PER_WARP + np * 16 + (m / 2) * 8 + lane % 8, kk * 2 + m % 2));
      const u32 b0[2] = {r[0], r[1]}, b1[2] = {r[2], r[3]};
      mma_16816(s[2 * np], a, b0, T{});
      mma_16816(s[2 * np + 1], a, b1, T{});
    }
  }

  // Logits through the variant, masked, in base 2.
#pragma unroll
  for (int n = 0; n < NT_S; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int r = e / 2;
      const int pos = tile_start + wk * Shape::KV_PER_WARP + n * 8 + quad * 2 + (e & 1);
      float logit = variant.LogitsTransform(p, s[n][e] * p.sm_scale, b, rows.qo_idx[r], pos, rows.head[r], kv_head);
      const bool keep = rows.valid[r] && pos < kv_end && variant.LogitsMask(p, b, rows.qo_idx[r], pos, rows.head[r], kv_head);
      s[n][e] = Variant::use_softmax ? (keep ? logit * kLog2e : neg_inf()) : (keep ? logit : 0.f);
    }

  if (Variant::use_softmax) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float mx = st.m[r];
#pragma unroll
      for (int n = 0; n < NT_S; ++n) mx = fmaxf(mx, fmaxf(s[n][2 * r], s[n][2 * r + 1]));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
      const float m_safe = mx == neg_inf() ? 0.f : mx;
      const float scale = exp2f(st.m[r] - m_safe);
      float sum = 0.f;
#pragma unroll
      for (int n = 0; n < NT_S; ++n) {
        s[n][2 * r] = exp2f(s[n][2 * r] - m_safe);
        s[n][2 * r + 1] = exp2f(s[n][2 * r + 1] - m_safe);
        sum += s[n][2 * r] + s[n][2 * r + 1];
      }
      st.d[r] = st.d[r] * scale + sum;  // a quarter of the row: quads are summed at the end
      st.m[r] = mx;
#pragma unroll
      for (int n = 0; n < NT_O; ++n) {
        st.o[n][2 * r] *= scale;
        st.o[n][2 * r + 1] *= scale;
      }
    }
  }

#pragma unroll
  for (int j = 0; j < NT_S / 2; ++j) {
    const u32 a[4] = {pack2(s[2 * j][0], s[2 * j][1], T{}), pack2(s[2 * j][2], s[2 * j][3], T{}),
                      pack2(s[2 * j + 1][0], s[2 * j + 1][1], T{}), pack2(s[2 * j + 1][2], s[2 * j + 1][3], T{})};
#pragma unroll
    for (int dp = 0; dp < NT_O / 2; ++dp) {
      u32 r[4];
      ldmatrix_x4_trans(r, v_smem + swz<HEAD_DIM>(wk * Shape::KV_PER_WARP + j * 16 + (m % 2) * 8 + lane % 8, dp * 2 + m / 2));
      const u32 b0[2] = {r[0], r[1]}, b1[2] = {r[2], r[3]};
      mma_16816(st.o[2 * dp], a, b0, T{});
      mma_16816(st.o[2 * dp + 1], a, b1, T{});
    }
  }
}

#endif

}  // namespace tessera
