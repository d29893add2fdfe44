// Standalone RoPE (FlashInfer's apply_rope / apply_rope_pos_ids, their
// Llama 3.1 forms and apply_rope_pos_ids_cos_sin_cache): rotates the rows of
// q and k with the same math as the fused RoPE variants (primitives/rope.cuh),
// out of place or in place. MODE (abi/rope_params.cuh) picks where the angles
// come from: computed (linear or Llama 3.1 frequencies) or read from a float32
// cos/sin cache. Each pair's cos and sin are found once.
//
// Thread mapping: one thread per 16-byte chunk of one (row, head), q heads
// then k heads, in a grid-stride loop. Half-split pairs live in different
// chunks: the thread of chunk c < rotary_dim / 16 also rotates its partner
// chunk c + rotary_dim / 16 (so in place is safe) and the partner's own
// thread does nothing. Chunks past rotary_dim are copied when out of place.
#pragma once
#include "tessera/device/arch/vector_io.cuh"
#include "tessera/abi/rope_params.cuh"
#include "tessera/device/primitives/ragged.cuh"
#include "tessera/device/primitives/rope.cuh"

namespace tessera {

#if defined(__CUDACC__) || defined(__CUDACC_RTC__)

constexpr int kRopeThreads = 256;

template <typename T, int HEAD_DIM, bool INTERLEAVE, RopeMode MODE = RopeMode::kLinear>
__device__ __forceinline__ void apply_rope(const RopeParams& p) {
  constexpr int CH = HEAD_DIM / 8;
  const int heads = p.num_q_heads + p.num_k_heads;
  const i64 per_row = static_cast<i64>(heads) * CH, total = p.nnz * per_row;
  const int rot_ch = p.rotary_dim / 8, half_ch = rot_ch / 2;
  // Llama 3.1 scales f_j itself (rope_llama31_turns), so its base has no rope_scale.
  const RopeFreqs fr(MODE == RopeMode::kLlama31 ? 1.f : p.rope_scale, p.rope_theta, p.rotary_dim);
  const i64 step = static_cast<i64>(gridDim.x) * blockDim.x;
  for (i64 t = static_cast<i64>(blockIdx.x) * blockDim.x + threadIdx.x; t < total; t += step) {
    const i64 n = t / per_row;
    const int rem = static_cast<int>(t - n * per_row), h = rem / CH, c = rem % CH;
    const bool is_q = h < p.num_q_heads;
    const int hh = is_q ? h : h - p.num_q_heads;
    const T* src = is_q ? static_cast<const T*>(p.q) + n * p.q_stride_n + hh * p.q_stride_h
                        : static_cast<const T*>(p.k) + n * p.k_stride_n + hh * p.k_stride_h;
    T* dst = is_q ? static_cast<T*>(p.q_out) + n * p.qo_stride_n + hh * p.qo_stride_h
                  : static_cast<T*>(p.k_out) + n * p.ko_stride_n + hh * p.ko_stride_h;
    if (c >= rot_ch) {
      if (src != dst) *reinterpret_cast<uint4*>(dst + c * 8) = *reinterpret_cast<const uint4*>(src + c * 8);
      continue;
    }
    if (!INTERLEAVE && c >= half_ch) continue;  // rotated with its partner chunk
    int pos;
    if (p.pos_ids != nullptr) {
      pos = p.pos_ids[n];
    } else {
      const int b = find_request(p.indptr, p.batch, static_cast<int>(n));
      pos = p.offsets[b] + static_cast<int>(n) - p.indptr[b];
    }
    // cos and sin of pair j's angle.
    auto angle = [&](int j, float& cs, float& sn) {
      if constexpr (MODE == RopeMode::kCosSinCache) {
        if (pos >= 0 && pos < p.cache_rows) {
          const float* row = p.cos_sin_cache + static_cast<i64>(pos) * p.cache_stride;
          cs = __ldg(row + j);
          sn = __ldg(row + p.rotary_dim / 2 + j);
        } else {
          cs = sn = __int_as_float(0x7fffffff);  // NaN: a position outside the cache
        }
      } else if constexpr (MODE == RopeMode::kLlama31) {
        rope_sincos(rope_llama31_turns(fr.turns(j), p.smooth_a, p.smooth_b, 1.f / p.rope_scale), pos, sn, cs);
      } else {
        rope_sincos(fr.turns(j), pos, sn, cs);
      }
    };
    float a[8], b[8], ra[8], rb[8];
    load_vec<8>(src + c * 8, a);
    if constexpr (!INTERLEAVE) load_vec<8>(src + (c + half_ch) * 8, b);
    rope_rotate_chunk<INTERLEAVE, false>(c, a, b, angle, ra, rb);
    if constexpr (!INTERLEAVE) store_vec<8>(dst + (c + half_ch) * 8, rb);
    store_vec<8>(dst + c * 8, ra);
  }
}

#endif

}  // namespace tessera
