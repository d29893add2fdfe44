// The example variant of docs/variants.md (a user spec with one extra tensor
// and two extra scalars), shared by the JIT and GPU tests. Its code must stay
// identical to the docs' (tests/cpu/test_variant_jit.cpp checks that).
#pragma once
#include <cmath>
#include <string>

#include "tessera/reference/attention.hpp"
#include "tessera/runtime/kernel_catalog.hpp"

namespace tessera::test {

inline const char* kDocsExampleCode =
    R"(struct DecayBias : tessera::VariantBase {
  using tessera::VariantBase::VariantBase;
  // Scale each head's logits, then subtract `decay` per key of distance
  // behind the query, counting at most max_distance keys.
  template <typename Params>
  __device__ float LogitsTransform(const Params& p, float logit, int, int qo_idx,
                                   int kv_idx, int qo_head, int) const {
    const int distance = qo_idx + (kv_len - qo_len) - kv_idx;
    const int clipped = min(max(distance, 0), p.extra.max_distance);
    return logit * p.extra.head_scale[qo_head] - p.extra.decay * clipped;
  }
};
)";

inline VariantSpec docs_example_variant() {
  VariantSpec v{"DecayBias", kDocsExampleCode};
  v.tensors = {{"head_scale", DType::kFloat32}};
  v.scalars = {{"decay", DType::kFloat32}, {"max_distance", DType::kInt32}};
  return v;
}

// The same transform for the CPU reference (reference::Options::logits_fn).
inline std::function<double(double, const reference::LogitContext&)> docs_example_logits(std::vector<double> head_scale,
                                                                                          double decay, int max_distance) {
  return [=](double logit, const reference::LogitContext& c) {
    const int64_t distance = c.qo_idx + (c.kv_len - c.qo_len) - c.kv_idx;
    const int64_t clipped = std::min<int64_t>(std::max<int64_t>(distance, 0), max_distance);
    return logit * head_scale[c.qo_head] - decay * static_cast<double>(clipped);
  };
}

}  // namespace tessera::test
