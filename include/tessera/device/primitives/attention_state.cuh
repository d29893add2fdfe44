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
// difference is exponentiated.
struct MergeWeights {
  float wa, wb, lse;
};

__device__ __forceinline__ MergeWeights merge_weights(float sa, float sb) {
  MergeWeights w;
  float m = fmaxf(sa, sb);
  if (m == neg_inf()) {  // both empty
    w.wa = 0.f; w.wb = 0.f; w.lse = neg_inf();
    return w;
  }
  float ea = exp2f(sa - m), eb = exp2f(sb - m);  // -inf - m -> 0
  float inv = 1.f / (ea + eb);
  w.wa = ea * inv; w.wb = eb * inv;
  w.lse = m + log2f(ea + eb);
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

#endif

}  // namespace tessera
