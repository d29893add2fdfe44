// ALiBi (Press et al.): a linear bias by distance, logit += slope * (kv_idx -
// q_pos), q_pos = qo_idx + kv_len - qo_len (bottom-right aligned), after
// sm_scale. Extra tensor alibi_slopes: float32 [num_qo_heads].
#pragma once
#include "tessera/device/primitives/variant.cuh"

namespace tessera::variants {

struct Alibi : VariantBase {
  using VariantBase::VariantBase;
  template <typename Params>
  __device__ __forceinline__ float LogitsTransform(const Params& p, float logit, int, int qo_idx, int kv_idx,
                                                   int qo_head, int) const {
    return logit + __ldg(p.extra.alibi_slopes + qo_head) * static_cast<float>(kv_idx - (qo_idx + kv_len - qo_len));
  }
};

}  // namespace tessera::variants
