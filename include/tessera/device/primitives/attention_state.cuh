// The attention state (O, LSE) and its merge operator (paper §2.2).
//
// Convention used everywhere in Tessera: LSE is in BASE 2,
//   lse = log2( sum_i 2^(s_i) ),  with s_i = logit_i * log2(e),
// i.e. lse_base2 = lse_natural * log2(e). An empty state has lse = -inf and
// contributes nothing, whatever its O holds (even NaN).
#pragma once
#include "tessera/device/arch/numeric.cuh"

namespace tessera {

#if defined(__CUDACC__) || defined(__CUDACC_RTC__)

// Weights (wa, wb) with wa + wb = 1 that merge two states of scales sa, sb,
// and the merged scale. Exact for |sa - sb| in the hundreds: only the
// difference is exponentiated. Branch-free, on bare MUFU ops: the larger
// weight is 2^0 = 1, so their sum lies in [1, 2] and needs no range handling;
// both empty gives (0, 0, -inf).
struct MergeWeights {
  float wa, wb, lse;
};

__device__ __forceinline__ MergeWeights merge_weights(float sa, float sb) {
  const float m = fmaxf(sa, sb);
  const float m_safe = m == neg_inf() ? 0.f : m;
  const float ea = fast_exp2(sa - m_safe), eb = fast_exp2(sb - m_safe);  // -inf -> 0
  const float sum = ea + eb;
  const float inv = sum > 0.f ? fast_rcp(sum) : 0.f;
  MergeWeights w;
  w.wa = ea * inv;
  w.wb = eb * inv;
  w.lse = sum > 0.f ? m + fast_log2(sum) : neg_inf();
  return w;
}

// Combines value a (weight wa) and value b (weight wb), treating a zero weight
// as "absent" so a garbage value of an empty state never leaks (0 * NaN = NaN).
__device__ __forceinline__ float merge_value(float a, float wa, float b, float wb) {
  float r = 0.f;
  if (wa > 0.f) r += wa * a;
  if (wb > 0.f) r += wb * b;
  return r;
}

// Running softmax state of one query row, in base 2 (online softmax):
// m = running max of scores, d = sum 2^(s - m); the output accumulator o is
// kept by the caller and rescaled by the factor update() returns.
struct OnlineSoftmax {
  float m;
  float d;
  __device__ __forceinline__ void init() { m = neg_inf(); d = 0.f; }
  // Adds score s (base 2). Returns {scale for old accumulator, weight of s}.
  __device__ __forceinline__ float2 update(float s) {
    float m_new = fmaxf(m, s);
    float scale = exp2f(m - m_new);  // m = -inf -> 0
    float p = exp2f(s - m_new);
    d = d * scale + p;
    m = m_new;
    return make_float2(scale, p);
  }
  // Merges another partial state (m2, d2) into this one; returns the factors
  // to apply to this and the other accumulator.
  __device__ __forceinline__ float2 merge(float m2, float d2) {
    float m_new = fmaxf(m, m2);
    if (m_new == neg_inf()) return make_float2(0.f, 0.f);
    float s1 = exp2f(m - m_new), s2 = exp2f(m2 - m_new);
    d = d * s1 + d2 * s2;
    m = m_new;
    return make_float2(s1, s2);
  }
  __device__ __forceinline__ bool empty() const { return d == 0.f; }
  __device__ __forceinline__ float lse() const { return empty() ? neg_inf() : m + log2f(d); }
};

// Merges the partial states of chunks 0 .. n - 1 of one row in chunk order
// (deterministic), VEC features at a time: lse(c) is chunk c's base-2 LSE,
// o(c, i) its features 4i .. 4i + 3 (float4). Chunks go in blocks of BLOCK:
// a block's loads are issued together (predicated, so no remainder loop
// issues them one at a time) and then folded into a running maximum, so n
// chunks cost about n / BLOCK dependent round trips to L2 (a first loop for
// the maximum and a second for the sums, 4 chunks a trip, cost a 33-chunk
// merge ~14). Empty chunks hold lse = -inf and finite O. Leaves the merged,
// normalized output in out and returns the merged LSE; without softmax the
// plain sum and 0.
template <int VEC, bool SOFTMAX, int BLOCK = 8, typename Lse, typename Vec>
__device__ __forceinline__ float merge_chunk_states(int n, Lse lse, Vec o, float (&out)[VEC]) {
  static_assert(VEC % 4 == 0, "float4 loads");
  float m = neg_inf(), denom = 0.f;
#pragma unroll
  for (int i = 0; i < VEC; ++i) out[i] = 0.f;
  for (int c0 = 0; c0 < n; c0 += BLOCK) {
    float l[BLOCK], wgt[BLOCK];
    float4 v[BLOCK][VEC / 4];
#pragma unroll
    for (int j = 0; j < BLOCK; ++j) {
      const bool in = c0 + j < n;
      l[j] = in ? (SOFTMAX ? lse(c0 + j) : 0.f) : neg_inf();
#pragma unroll
      for (int i = 0; i < VEC / 4; ++i) v[j][i] = in ? o(c0 + j, i) : make_float4(0.f, 0.f, 0.f, 0.f);
    }
    if constexpr (SOFTMAX) {
      float m_new = m;
#pragma unroll
      for (int j = 0; j < BLOCK; ++j) m_new = fmaxf(m_new, l[j]);
      const float m_safe = m_new == neg_inf() ? 0.f : m_new;
      const float old = fast_exp2(m - m_safe);  // 0 while m is -inf
      denom *= old;
#pragma unroll
      for (int i = 0; i < VEC; ++i) out[i] *= old;
#pragma unroll
      for (int j = 0; j < BLOCK; ++j) wgt[j] = fast_exp2(l[j] - m_safe);
      m = m_new;
    } else {
#pragma unroll
      for (int j = 0; j < BLOCK; ++j) wgt[j] = c0 + j < n ? 1.f : 0.f;
    }
#pragma unroll
    for (int j = 0; j < BLOCK; ++j) {
#pragma unroll
      for (int i = 0; i < VEC / 4; ++i) {
        out[4 * i] += wgt[j] * v[j][i].x;
        out[4 * i + 1] += wgt[j] * v[j][i].y;
        out[4 * i + 2] += wgt[j] * v[j][i].z;
        out[4 * i + 3] += wgt[j] * v[j][i].w;
      }
      denom += wgt[j];
    }
  }
  if constexpr (!SOFTMAX) return 0.f;
  const float inv = denom > 0.f ? 1.f / denom : 0.f;
#pragma unroll
  for (int i = 0; i < VEC; ++i) out[i] *= inv;
  return denom > 0.f ? m + log2f(denom) : neg_inf();
}

#endif

}  // namespace tessera
