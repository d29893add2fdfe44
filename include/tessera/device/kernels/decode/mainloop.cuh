// Batch decode, mainloop: one work item's KV chunk streamed through a
// multi-stage cp.async pipeline into shared memory, with every query head of
// the KV head's group computed from the same tile (head-group fusion, paper
// Appendix A), so each KV byte is read from HBM once.
//
// Thread layout (x fastest): TX lanes cover the head dimension, VEC features
// (16 bytes of KV: 8 fp16, 16 fp8) each; TY groups split the GROUP query
// heads, HPT heads per thread; TZ groups split the tile's tokens, R tokens
// each, with private softmax states merged at the end of the chunk.
#pragma once
#include "tessera/device/arch/cp_async.cuh"
#include "tessera/device/arch/vector_io.cuh"
#include "tessera/abi/decode_params.cuh"
#include "tessera/abi/shared_memory.cuh"
#include "tessera/device/primitives/kv_view.cuh"
#include "tessera/device/primitives/attention_state.cuh"
#include "tessera/device/primitives/variant_traits.cuh"

namespace tessera {

#if defined(__CUDACC__) || defined(__CUDACC_RTC__)

template <typename DKV, int HEAD_DIM, int GROUP, int MIN_THREADS, int TILE, int STAGES, int MAX_HPT>
struct DecodeShape {
  // The host sizes the launch from the same geometry (abi/shared_memory.cuh).
  static constexpr DecodeGeometry G =
      decode_geometry(static_cast<int>(sizeof(DKV)), HEAD_DIM, GROUP, MIN_THREADS, TILE, STAGES, MAX_HPT);
  static constexpr int VEC = G.vec, TX = G.tx, HPT = G.hpt, TY = G.ty, TZ = G.tz, THREADS = G.threads;
  static constexpr int R = TILE / TZ;  // tokens per z-group per tile
  static constexpr int TILE_ELEMS = TILE * HEAD_DIM;
  static constexpr int SMEM_BYTES = G.smem_bytes;
  static_assert(TX <= 32 && 32 % TX == 0, "a row's lanes must sit in one warp");
  static_assert(TILE % TZ == 0, "tile must split evenly over token groups");
};

// Issues the copies of one tile (K and V) into a pipeline stage.
//
// Each thread copies PER_THREAD 16-byte chunks of K and of V. The 16 (or 8,
// 32) threads copying one token share its address, so instead of every thread
// resolving the page table, one lane per token does (lane j of a warp owns the
// j-th token that warp touches) and the offsets travel by shuffle: 1/TX of the
// index loads and address arithmetic.
template <typename Shape, typename DKV>
__device__ __forceinline__ void decode_load_tile(DKV* k_stage, DKV* v_stage, const device::PagedKV& kv, int page_base,
                                                 int tile_start, int kv_end, int h, int shift) {
  constexpr int TX = Shape::TX, VEC = Shape::VEC, THREADS = Shape::THREADS;
  constexpr int PER_THREAD = Shape::TILE_ELEMS / VEC / THREADS;
  constexpr int TPB = 32 / TX;  // tokens a warp touches per chunk round
  static_assert(Shape::TILE_ELEMS / VEC % THREADS == 0, "chunks must split evenly over threads");
  static_assert(TPB * PER_THREAD <= 32, "one lane per token of the warp");
  const int lane = threadIdx.x % 32, warp_token0 = (threadIdx.x / 32) * TPB;
  i64 my_off = -1;
  if (lane < TPB * PER_THREAD) {
    const int pos = tile_start + warp_token0 + lane % TPB + (lane / TPB) * (THREADS / TX);
    if (pos < kv_end) my_off = device::kv_token_offset(kv, page_base, pos, h, shift);
  }
  const DKV* k_base = static_cast<const DKV*>(kv.k);
  const DKV* v_base = static_cast<const DKV*>(kv.v);
  const int col = (lane % TX) * VEC;
#pragma unroll
  for (int k = 0; k < PER_THREAD; ++k) {
    const int src = lane / TX + k * TPB;
    const i64 off = static_cast<i64>(__shfl_sync(0xffffffffu, static_cast<unsigned long long>(my_off), src));
    const int c = threadIdx.x + k * THREADS;
    const bool valid = off >= 0;
    cp_async_16(k_stage + c * VEC, valid ? k_base + off + col : k_base, valid);
    cp_async_16(v_stage + c * VEC, valid ? v_base + off + col : v_base, valid);
  }
}

// Running state of one thread: HPT query heads x VEC features.
template <typename Shape>
struct DecodeState {
  float m[Shape::HPT], d[Shape::HPT], o[Shape::HPT][Shape::VEC];
  __device__ __forceinline__ void init() {
#pragma unroll
    for (int j = 0; j < Shape::HPT; ++j) {
      m[j] = neg_inf();
      d[j] = 0.f;
#pragma unroll
      for (int i = 0; i < Shape::VEC; ++i) o[j][i] = 0.f;
    }
  }
};

// Computes one tile held in shared memory into the thread's state; K and V
// are widened to float as they are read (fp8: in packed pairs, vector_io.cuh).
// sm_scale includes K's dequantization scale (read_run_scales), so a
// quantized K costs no extra multiply.
template <typename Variant, typename Shape, typename DKV, typename Params>
__device__ __forceinline__ void decode_compute_tile(const Params& p, const Variant& variant, DecodeState<Shape>& st,
                                                    float sm_scale, const float (&q)[Shape::HPT][Shape::VEC], const DKV* k_stage,
                                                    const DKV* v_stage, int tile_start, int kv_end, int b, int h,
                                                    int qo_head0, int x, int z) {
  constexpr int HPT = Shape::HPT, R = Shape::R, VEC = Shape::VEC, TX = Shape::TX;
  const int feat0 = x * VEC;
  float s[HPT][R];
#pragma unroll
  for (int r = 0; r < R; ++r) {
    const int token = z * R + r, pos = tile_start + token;
    float k[VEC];
    load_vec<VEC>(k_stage + token * (TX * VEC) + feat0, k);
    // Tokens past kv_end are zero-filled and masked below; a transform (which
    // may read per-token extras) sees only real ones.
    if (pos < kv_end) transform_key_vec<Variant, TX * VEC>(variant, p, k, k_stage + token * (TX * VEC), feat0, b, pos, h);
#pragma unroll
    for (int j = 0; j < HPT; ++j) {
      float part = 0.f;
#pragma unroll
      for (int i = 0; i < VEC; ++i) part += q[j][i] * k[i];
#pragma unroll
      for (int off = TX / 2; off > 0; off >>= 1) part += __shfl_xor_sync(0xffffffffu, part, off);
      // 16-bit KV: the scale straight from the parameter block (a constant-bank
      // operand, no register held across the loop).
      float logit = variant.LogitsTransform(p, part * (is_fp8<DKV> ? sm_scale : p.sm_scale), b, 0, pos, qo_head0 + j, h);
      // The query sits on the request's last key (its diagonal is kv_len - 1).
      const bool keep = pos < kv_end &&
                        (Variant::window_left < 0 || pos >= window_first_key<Variant>(variant.kv_len - 1)) &&
                        variant.LogitsMask(p, b, 0, pos, qo_head0 + j, h);
      s[j][r] = Variant::use_softmax ? (keep ? logit * kLog2e : neg_inf()) : (keep ? logit : 0.f);
    }
  }
  // Softmax bookkeeping once per tile (one rescale per tile, not per token).
  if (Variant::use_softmax) {
#pragma unroll
    for (int j = 0; j < HPT; ++j) {
      float m_new = st.m[j];
#pragma unroll
      for (int r = 0; r < R; ++r) m_new = fmaxf(m_new, s[j][r]);
      const float m_safe = m_new == neg_inf() ? 0.f : m_new;  // all masked so far: keep weights 0, not NaN
      const float scale = exp2f(st.m[j] - m_safe);
      float sum = 0.f;
#pragma unroll
      for (int r = 0; r < R; ++r) {
        s[j][r] = exp2f(s[j][r] - m_safe);
        sum += s[j][r];
      }
      st.d[j] = st.d[j] * scale + sum;
      st.m[j] = m_new;
#pragma unroll
      for (int i = 0; i < VEC; ++i) st.o[j][i] *= scale;
    }
  }
#pragma unroll
  for (int r = 0; r < R; ++r) {
    const int token = z * R + r, pos = tile_start + token;
    float v[VEC];
    load_vec<VEC>(v_stage + token * (TX * VEC) + feat0, v);
#pragma unroll
    for (int i = 0; i < VEC; ++i) v[i] = variant.ValueTransform(p, v[i], b, pos, h, feat0 + i);
#pragma unroll
    for (int j = 0; j < HPT; ++j)
#pragma unroll
      for (int i = 0; i < VEC; ++i) st.o[j][i] += s[j][r] * v[i];
  }
}

#endif

}  // namespace tessera
