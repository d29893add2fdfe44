// Rotary position embedding (RoPE, Llama style) math, shared by the fused
// RoPE variants (variants::rope) and the standalone apply_rope kernels, so a
// fused and an unfused pipeline rotate identically.
//
// Feature pair j of the first rotary_dim features turns by pos * freq_j
// radians, freq_j = rope_theta^(-2j / rotary_dim) / rope_scale (rope_scale
// stretches positions, "linear" scaling). Llama 3.1 scaling
// (rope_llama31_turns) divides only the low frequencies by rope_scale: with
// f_j = rope_theta^(-2j / rotary_dim) / (2 pi) in turns per position,
// s = clamp(f_j * smooth_a + smooth_b, 0, 1) and the frequency becomes
// f_j * ((1 - s) / rope_scale + s), where smooth_a = old_context_len /
// (high_freq_factor - low_freq_factor) and smooth_b = -low_freq_factor /
// (high_freq_factor - low_freq_factor): wavelengths above old_context_len /
// low_freq_factor are stretched, those below old_context_len /
// high_freq_factor kept, the band between blended. Pairs are (j, j +
// rotary_dim / 2) (half-split, GPT-NeoX / Llama layout) or (2j, 2j + 1)
// (interleaved, GPT-J layout). The pair's first feature becomes x cos -
// partner sin, the second x cos + partner sin.
//
// Precision: angles reach thousands of radians, where a float product
// pos * freq alone would be off by ~1e-4 rad. Angles are carried in turns and
// the product's rounding error is recovered with an FMA, so what remains is
// the float frequency's own error (~1e-7 relative, as in FlashInfer's and
// PyTorch's float32 RoPE): ~1e-4 rad at position 1000, ~1e-2 rad at 10^5.
// It is the same error at every position of a pair j, so it shifts q.k of
// two tokens by ~1e-7 of their distance in turns. The reduced angle
// (|a| <= pi) goes to the hardware sin/cos (absolute error ~1e-6 there).
#pragma once
#include "tessera/device/arch/numeric.cuh"

namespace tessera {

#if defined(__CUDACC__) || defined(__CUDACC_RTC__)

struct RopeFreqs {
  float log2_step;      // -2 log2(rope_theta) / rotary_dim
  float turns_per_pos;  // 1 / (2 pi rope_scale): turns of pair 0 per position

  __device__ __forceinline__ RopeFreqs(float rope_scale, float rope_theta, int rotary_dim)
      : log2_step(-2.f * log2f(rope_theta) / static_cast<float>(rotary_dim)),
        turns_per_pos(0.159154943091895335769f / rope_scale) {}

  // Turns per position of pair j.
  __device__ __forceinline__ float turns(int j) const { return exp2f(static_cast<float>(j) * log2_step) * turns_per_pos; }
};

// Llama 3.1 scaling of a frequency f (turns per position, without
// rope_scale: RopeFreqs(1, rope_theta, rotary_dim).turns(j)); see above.
__device__ __forceinline__ float rope_llama31_turns(float f, float smooth_a, float smooth_b, float rcp_scale) {
  const float s = fminf(fmaxf(fmaf(f, smooth_a, smooth_b), 0.f), 1.f);
  return f * fmaf(1.f - s, rcp_scale, s);
}

// sin and cos of 2 pi * pos * turns, with pos * turns reduced exactly (see above).
__device__ __forceinline__ void rope_sincos(float turns, int pos, float& s, float& c) {
  const float p = static_cast<float>(pos);  // exact below 2^24
  const float hi = p * turns;
  const float lo = fmaf(p, turns, -hi);  // hi + lo == p * turns exactly
  const float r = (hi - rintf(hi)) + lo;  // the fraction of a turn, in [-0.5, 0.5]
  __sincosf(r * 6.28318530717958647692f, &s, &c);
}

// Pair index and side of feature f under a layout (INTERLEAVE: pairs
// (2j, 2j + 1), else (j, j + rotary_dim / 2)); f < rotary_dim.
template <bool INTERLEAVE>
__device__ __forceinline__ int rope_pair(int f, int rotary_dim) {
  return INTERLEAVE ? f >> 1 : (f < rotary_dim / 2 ? f : f - rotary_dim / 2);
}
template <bool INTERLEAVE>
__device__ __forceinline__ bool rope_first(int f, int rotary_dim) {
  return INTERLEAVE ? (f & 1) == 0 : f < rotary_dim / 2;
}

// Feature x of a pair turned by the angle of cosine c and sine s, its
// partner holding `partner`; first: x is the pair's first feature.
__device__ __forceinline__ float rope_turn(float x, float partner, float c, float s, bool first) {
  return first ? x * c - partner * s : x * c + partner * s;
}

// rope_turn with one IEEE rounding per operation (no FMA contraction): the
// fused RoPE + fp8 quantize kernel uses it so that a host computing
// round(round(x c) -/+ round(partner s)) in float gets the same bits.
__device__ __forceinline__ float rope_turn_rn(float x, float partner, float c, float s, bool first) {
  const float a = __fmul_rn(x, c), b = __fmul_rn(partner, s);
  return first ? __fsub_rn(a, b) : __fadd_rn(a, b);
}

// Rotates one 8-feature chunk c of a row's rotary features: interleaved
// pairs lie within the chunk (a in, ra out); half-split pairs pair it with
// the chunk half_ch further (b in, rb out, both ignored when interleaved).
// angle(j, c, s) gives pair j's cosine and sine; ROUND_EACH takes
// rope_turn_rn (one rounding per operation) instead of rope_turn.
template <bool INTERLEAVE, bool ROUND_EACH, typename Angle>
__device__ __forceinline__ void rope_rotate_chunk(int c, const float (&a)[8], const float (&b)[8], Angle&& angle,
                                                  float (&ra)[8], float (&rb)[8]) {
  auto turn = [](float x, float partner, float cs, float sn, bool first) {
    return ROUND_EACH ? rope_turn_rn(x, partner, cs, sn, first) : rope_turn(x, partner, cs, sn, first);
  };
#pragma unroll
  for (int i = 0; i < 8; i += INTERLEAVE ? 2 : 1) {
    float cs, sn;
    angle(INTERLEAVE ? (c * 8 + i) >> 1 : c * 8 + i, cs, sn);
    if constexpr (INTERLEAVE) {
      ra[i] = turn(a[i], a[i + 1], cs, sn, true);
      ra[i + 1] = turn(a[i + 1], a[i], cs, sn, false);
    } else {
      ra[i] = turn(a[i], b[i], cs, sn, true);
      rb[i] = turn(b[i], a[i], cs, sn, false);
    }
  }
}

// Feature f of a row at position pos, its pair partner holding `partner`.
template <bool INTERLEAVE>
__device__ __forceinline__ float rope_rotate(const RopeFreqs& fr, float x, float partner, int pos, int f, int rotary_dim) {
  float s, c;
  rope_sincos(fr.turns(rope_pair<INTERLEAVE>(f, rotary_dim)), pos, s, c);
  return rope_turn(x, partner, c, s, rope_first<INTERLEAVE>(f, rotary_dim));
}

#endif

}  // namespace tessera
