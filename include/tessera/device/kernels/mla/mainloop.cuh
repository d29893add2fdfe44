// MLA kernel family, mainloop: the two-source row loader (a token's ckv and
// kpe rows, a query's q_nope and q_pe rows, side by side in one 576-wide
// shared row) and one KV tile of a row group's work on mma.sync (sm_80+):
//
//   S = Q K^T over 576 features, each warp of the row group its share of the
//       tile's keys;
//   row maxima exchanged through shared memory (every warp of the group then
//       holds the same running maximum, bit for bit);
//   P = exp2(S * scale * log2 e - m), 16-bit, into shared memory;
//   O += P V, V = the K tile's first 512 features, each warp its share of
//       O's columns over all of the tile's keys.
//
// Layouts: Q and K tiles are RowSwizzle rows of 576 16-bit features (1152
// bytes, 16-byte chunk c of row r at chunk c ^ (r % 8)), so ldmatrix reads
// of 8 rows hit 8 distinct bank groups; P rows are padded by 16 bytes.
#pragma once
#include "tessera/abi/mla_params.cuh"
#include "tessera/device/arch/cp_async.cuh"
#include "tessera/device/arch/ldmatrix.cuh"
#include "tessera/device/arch/mma.cuh"
#include "tessera/device/arch/numeric.cuh"

namespace tessera {

#if defined(__CUDACC__) || defined(__CUDACC_RTC__)

// Element offsets of a row's two parts (nope: the 512 latent features, pe:
// the 64 RoPE ones); nope < 0: the row is zero-filled.
struct MlaRowOffset {
  i64 nope, pe;
};

// A page id read from MlaParams::kv_indices, checked as PagedKV's (-1: bad,
// recorded). Split from the read so a thread can have several reads in
// flight before the first check.
__device__ __forceinline__ int mla_check_page_id(const MlaParams& p, int id) {
  if (p.page_error != nullptr && static_cast<unsigned>(id) >= static_cast<unsigned>(p.num_pages)) {
    volatile int* e = p.page_error;
    e[1] = id;
    e[2] = p.num_pages;
    __threadfence_system();
    e[0] = 1;
    return -1;
  }
  return id;
}

// The page id at MlaParams::kv_indices[idx], checked.
__device__ __forceinline__ int mla_page_id(const MlaParams& p, int idx) {
  return mla_check_page_id(p, p.kv_indices[idx]);
}

// Copies ROWS rows into RowSwizzle shared memory at shared address dst: row
// r's features 0..511 from nope + offs(r).nope, 512..575 from pe +
// offs(r).pe. Eight threads a row, thread t copying chunk t % 8 of each of
// the row's nine 64-feature groups (eight of nope, one of pe); its rows are
// THREADS / 8 apart.
template <int ROWS, int THREADS, typename T, typename Offsets>
__device__ __forceinline__ void mla_load_rows(u32 dst, const T* nope, const T* pe, Offsets offs) {
  constexpr int PER_PASS = THREADS / 8;
  constexpr int PASSES = (ROWS + PER_PASS - 1) / PER_PASS;
  const int cc = threadIdx.x % 8, r0 = threadIdx.x / 8;
#pragma unroll
  for (int i = 0; i < PASSES; ++i) {
    const int row = r0 + i * PER_PASS;
    if (ROWS % PER_PASS != 0 && row >= ROWS) break;
    const MlaRowOffset off = offs(row);
    const bool ok = off.nope >= 0;
    const u32 base = dst + static_cast<u32>(row) * kMlaRowBytes + static_cast<u32>((cc ^ (row & 7)) << 4);
#pragma unroll
    for (int g = 0; g < kMlaDimCkv / 64; ++g)
      cp_async_16(base + g * 128, ok ? nope + off.nope + g * 64 + cc * 8 : nope, ok);
    cp_async_16(base + (kMlaDimCkv / 64) * 128, ok ? pe + off.pe + cc * 8 : pe, ok);
  }
}

// Running state of a warp's two rows per thread (g and g + 8 of its 16):
// maximum m (base 2, scaled), this warp's share of the row sum d (its keys
// only; the group's shares are added at the end) and its O columns.
template <typename Shape>
struct MlaWarpState {
  float m[2], d[2];
  float o[Shape::NT_O][4];
  __device__ __forceinline__ void init() {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      m[r] = neg_inf();
      d[r] = 0.f;
    }
#pragma unroll
    for (int n = 0; n < Shape::NT_O; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) o[n][e] = 0.f;
  }
};

// One KV tile for warp (wq, wd). k_addr: the stage's shared address; red:
// the [WARPS_D][CTA_Q] row-maximum scratch; p_smem / p_addr: the P tile.
// masked: the tile crosses kv_end or (CAUSAL) the diagonal for some row of
// the warp; qo[r]: the query index of the thread's row r. Contains two
// barriers of the whole CTA (every warp calls it for every tile).
template <typename Shape, typename T, bool CAUSAL>
__device__ __forceinline__ void mla_compute_tile(MlaWarpState<Shape>& st, u32 q_addr, u32 k_addr, u16* p_smem,
                                                 u32 p_addr, float (*red)[Shape::CTA_Q], int tile_start, int kv_end,
                                                 const int (&qo)[2], int causal_shift, bool masked, float scale_log2,
                                                 int wq, int wd) {
  constexpr int NT_S = Shape::NT_S, NT_O = Shape::NT_O, KVW = Shape::KV_PER_WARP;
  const int lane = threadIdx.x % 32, m = lane / 8, g = lane / 4, quad = lane % 4;
  const u32 xa = static_cast<u32>((m / 2) ^ (lane % 8));  // Q, P (A operands) and V (.trans B operand)
  const u32 xk = static_cast<u32>((m % 2) ^ (lane % 8));  // K (B operand)
  const u32 q_row = q_addr + static_cast<u32>(wq * 16 + (m % 2) * 8 + lane % 8) * kMlaRowBytes;
  const u32 k_row = k_addr + static_cast<u32>(wd * KVW + (m / 2) * 8 + lane % 8) * kMlaRowBytes;

  // S = Q K^T for this warp's keys.
  float s[NT_S][4];
#pragma unroll
  for (int n = 0; n < NT_S; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) s[n][e] = 0.f;
#pragma unroll 4
  for (int kk = 0; kk < kMlaDimQK / 16; ++kk) {
    u32 a[4];
    ldmatrix_x4(a, q_row + (((2u * kk) ^ xa) << 4));
#pragma unroll
    for (int np = 0; np < NT_S / 2; ++np) {
      u32 r[4];
      ldmatrix_x4(r, k_row + np * 16 * kMlaRowBytes + (((2u * kk) ^ xk) << 4));
      const u32 b0[2] = {r[0], r[1]}, b1[2] = {r[2], r[3]};
      mma_16816(s[2 * np], a, b0, T{});
      mma_16816(s[2 * np + 1], a, b1, T{});
    }
  }
  const int col0 = tile_start + wd * KVW + quad * 2;
  if (masked) {
#pragma unroll
    for (int n = 0; n < NT_S; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int pos = col0 + n * 8 + (e & 1);
        bool keep = pos < kv_end;
        if constexpr (CAUSAL) keep = keep && pos <= qo[e / 2] + causal_shift;
        if (!keep) s[n][e] = neg_inf();
      }
  }

  // The row group's maxima: each warp's over its keys, then all of them.
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    float mx = neg_inf();
#pragma unroll
    for (int n = 0; n < NT_S; ++n) mx = fmaxf(mx, fmaxf(s[n][2 * r], s[n][2 * r + 1]));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
    if (quad == 0) red[wd][wq * 16 + g + 8 * r] = mx;
  }
  __syncthreads();
  float factor[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = wq * 16 + g + 8 * r;
    float mx = red[0][row];
#pragma unroll
    for (int w = 1; w < Shape::WARPS_D; ++w) mx = fmaxf(mx, red[w][row]);
    const float m_new = fmaxf(st.m[r], mx * scale_log2);  // sm_scale > 0: the maximum commutes with it
    const float m_safe = m_new == neg_inf() ? 0.f : m_new;  // all masked so far: weights 0, not NaN
    factor[r] = fast_exp2(st.m[r] - m_safe);
    st.m[r] = m_new;
    float sum = 0.f;
#pragma unroll
    for (int n = 0; n < NT_S; ++n)
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        float& x = s[n][2 * r + c];
        x = fast_exp2(fmaf(x, scale_log2, -m_safe));
        sum += x;
      }
    st.d[r] = st.d[r] * factor[r] + sum;
    // P, rounded to 16 bits as the mma takes it.
#pragma unroll
    for (int n = 0; n < NT_S; ++n)
      *reinterpret_cast<u32*>(p_smem + row * Shape::P_LD + wd * KVW + n * 8 + quad * 2) =
          pack2(s[n][2 * r], s[n][2 * r + 1], T{});
  }
#pragma unroll
  for (int n = 0; n < NT_O; ++n) {
    st.o[n][0] *= factor[0];
    st.o[n][1] *= factor[0];
    st.o[n][2] *= factor[1];
    st.o[n][3] *= factor[1];
  }
  __syncthreads();  // P complete

  // O[:, this warp's columns] += P V over every key of the tile.
  const u32 p_row = p_addr + static_cast<u32>((wq * 16 + (m % 2) * 8 + lane % 8) * Shape::P_LD * 2 + (m / 2) * 16);
  const u32 v_row = k_addr + static_cast<u32>((m % 2) * 8 + lane % 8) * kMlaRowBytes;
  const u32 chunk0 = static_cast<u32>(wd * Shape::D_PER_WARP / 8);
#pragma unroll
  for (int j = 0; j < Shape::CTA_KV / 16; ++j) {
    u32 a[4];
    ldmatrix_x4(a, p_row + j * 32);
#pragma unroll
    for (int dp = 0; dp < NT_O / 2; ++dp) {
      u32 r[4];
      ldmatrix_x4_trans(r, v_row + j * 16 * kMlaRowBytes + (((chunk0 + 2 * dp) ^ xa) << 4));
      const u32 b0[2] = {r[0], r[1]}, b1[2] = {r[2], r[3]};
      mma_16816(st.o[2 * dp], a, b0, T{});
      mma_16816(st.o[2 * dp + 1], a, b1, T{});
    }
  }
}

#endif

}  // namespace tessera
