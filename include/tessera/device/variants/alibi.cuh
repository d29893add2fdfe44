// ALiBi (Press et al.): a linear bias by distance, logit += slope * (kv_idx -
// q_pos), after sm_scale. Extra tensor alibi_slopes: float32 [num_qo_heads].
//
// Alibi: q_pos = qo_idx + kv_len - qo_len, the query's position in its
// sequence (bottom-right aligned, like the declared causal mask).
// QueryIndexAlibi: q_pos = qo_idx, the query's index among the request's new
// tokens, as FlashInfer's pos_encoding_mode="ALIBI" computes it. The two
// differ by a constant per query row, so their outputs are equal and their
// LSEs differ by slope * (kv_len - qo_len); the wrappers' "ALIBI" uses the
// second so that the LSE they return is FlashInfer's. A composing template
// like SoftCap.
#pragma once
#include "tessera/device/variants/standard.cuh"

namespace tessera::variants {

struct Alibi : VariantBase {
  using VariantBase::VariantBase;
  template <typename Params>
  __device__ __forceinline__ float LogitsTransform(const Params& p, float logit, int, int qo_idx, int kv_idx,
                                                   int qo_head, int) const {
    return logit + __ldg(p.extra.alibi_slopes + qo_head) * static_cast<float>(kv_idx - (qo_idx + kv_len - qo_len));
  }
};

template <typename Base = StandardAttention>
struct QueryIndexAlibi : Base {
  using Base::Base;
  template <typename Params>
  __device__ __forceinline__ float LogitsTransform(const Params& p, float logit, int b, int qo_idx, int kv_idx,
                                                   int qo_head, int kv_head) const {
    return Base::LogitsTransform(p, logit, b, qo_idx, kv_idx, qo_head, kv_head) +
           __ldg(p.extra.alibi_slopes + qo_head) * static_cast<float>(kv_idx - qo_idx);
  }
};

}  // namespace tessera::variants
