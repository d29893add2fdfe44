// FlashSigmoid (Ramapuram et al.): no softmax, o = sum_j sigmoid(logit_j *
// sigmoid_scale + sigmoid_bias) v_j over visible keys (logit = q.k *
// sm_scale). Extra float32 scalars sigmoid_scale, sigmoid_bias.
#pragma once
#include "tessera/device/primitives/variant.cuh"

namespace tessera::variants {

struct FlashSigmoid : VariantBase {
  using VariantBase::VariantBase;
  static constexpr bool use_softmax = false;
  template <typename Params>
  __device__ __forceinline__ float LogitsTransform(const Params& p, float logit, int, int, int, int, int) const {
    return 1.f / (1.f + __expf(-(logit * p.extra.sigmoid_scale + p.extra.sigmoid_bias)));
  }
};

}  // namespace tessera::variants
