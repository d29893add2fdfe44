// FlashInfer's logits soft cap: logit = cap * tanh(logit / cap), where the
// logit is q.k * sm_scale. The cap is compiled into the kernel (one kernel per
// value). C++17 has no float template parameters, so it travels as its
// IEEE-754 bits: SoftCap<0x41f00000u> caps at 30. A composing template: on
// top of another variant, it caps that variant's logits (SoftCap<bits,
// Rope<...>>, a RoPE layer with a cap).
#pragma once
#include "tessera/device/variants/standard.cuh"

namespace tessera::variants {

// The float whose bits are `bits`, as a constant expression (finite values;
// every step is a multiplication by 2 or 1/2 of an exact value, so exact).
constexpr float float_from_bits(unsigned bits) {
  const unsigned exponent = (bits >> 23) & 0xffu, mantissa = bits & 0x7fffffu;
  float x = static_cast<float>(exponent ? (mantissa | 0x800000u) : mantissa);
  for (int e = static_cast<int>(exponent ? exponent : 1u) - 150; e > 0; --e) x *= 2.f;
  for (int e = static_cast<int>(exponent ? exponent : 1u) - 150; e < 0; ++e) x *= 0.5f;
  return (bits >> 31) ? -x : x;
}

template <unsigned CapBits, typename Base = StandardAttention>
struct SoftCap : Base {
  using Base::Base;
  static constexpr float kCap = float_from_bits(CapBits);
  template <typename Params>
  __device__ __forceinline__ float LogitsTransform(const Params& p, float logit, int b, int qo_idx, int kv_idx,
                                                   int qo_head, int kv_head) const {
    const float cap = kCap;
    return cap * tanhf(Base::LogitsTransform(p, logit, b, qo_idx, kv_idx, qo_head, kv_head) * (1.0f / cap));
  }
};

}  // namespace tessera::variants
