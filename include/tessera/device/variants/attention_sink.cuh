// Attention sink (Streaming-LLM): the first sink_size keys, and the
// window_left keys before the query's bottom-right-aligned position; causal
// masks the keys after it. Extra int32 scalars sink_size, window_left (a
// run-time value here, unlike SlidingWindow's compiled one).
#pragma once
#include "tessera/device/primitives/variant.cuh"

namespace tessera::variants {

struct AttentionSink : VariantBase {
  using VariantBase::VariantBase;
  static constexpr bool causal = true;
  template <typename Params>
  __device__ __forceinline__ bool LogitsMask(const Params& p, int, int qo_idx, int kv_idx, int, int) const {
    return kv_idx < p.extra.sink_size || kv_idx >= qo_idx + (kv_len - qo_len) - p.extra.window_left;
  }
};

}  // namespace tessera::variants
