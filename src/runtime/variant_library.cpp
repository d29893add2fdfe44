// Built-in variants whose parameters are extras (values given at run() by
// name, one kernel for all values): ALiBi, FlashSigmoid, attention sink and
// fused RoPE. Each is only a VariantSpec, compiled by the same JIT path as a
// user's variant.
#include <cmath>

#include "tessera/core/error.hpp"
#include "tessera/runtime/kernel_catalog.hpp"

namespace tessera::variants {

namespace {

// The struct header every spec below starts with.
std::string open_struct(const std::string& name, bool causal) {
  return "struct " + name + " : tessera::VariantBase {\n  using tessera::VariantBase::VariantBase;\n" +
         (causal ? "  static constexpr bool causal = true;\n" : "");
}

VariantSpec make(std::string name, std::string code, bool causal) {
  VariantSpec v{std::move(name), std::move(code)};
  v.causal = causal;
  return v;
}

// A variant whose one slot is LogitsTransform returning `expr` (over p,
// logit, qo_idx, kv_idx, qo_head and the base's qo_len / kv_len).
VariantSpec logits_variant(const std::string& name, bool causal, const std::string& decls, const std::string& expr) {
  return make(name,
              open_struct(name, causal) + decls +
                  "  template <typename Params>\n"
                  "  __device__ __forceinline__ float LogitsTransform(const Params& p, float logit, int, int qo_idx,\n"
                  "                                                   int kv_idx, int qo_head, int) const {\n"
                  "    return " + expr + ";\n"
                  "  }\n"
                  "};\n",
              causal);
}

}  // namespace

VariantSpec alibi(bool causal) {
  VariantSpec v = logits_variant(causal ? "CausalAlibi" : "Alibi", causal,
                                 "  // Linear bias by distance: slope * (kv_idx - q_pos), q_pos bottom-right aligned.\n",
                                 "logit + __ldg(p.extra.alibi_slopes + qo_head) * static_cast<float>(kv_idx - (qo_idx + kv_len - qo_len))");
  v.tensors = {{"alibi_slopes", DType::kFloat32}};
  return v;
}

std::vector<float> alibi_slopes(int num_heads) {
  if (num_heads < 1) throw InvalidArgument("num_heads: expected >= 1, got " + std::to_string(num_heads));
  int m = 1;
  while (m * 2 <= num_heads) m *= 2;
  std::vector<float> out;
  for (int h = 1; h <= m; ++h) out.push_back(static_cast<float>(std::exp2(-8.0 * h / m)));
  for (int h = 1; static_cast<int>(out.size()) < num_heads; h += 2)  // odd powers of 2m's base
    out.push_back(static_cast<float>(std::exp2(-8.0 * h / (2 * m))));
  return out;
}

VariantSpec flash_sigmoid(bool causal) {
  VariantSpec v = logits_variant(causal ? "CausalFlashSigmoid" : "FlashSigmoid", causal,
                                 "  static constexpr bool use_softmax = false;\n"
                                 "  // o = sum_j sigmoid(logit_j * scale + bias) v_j\n",
                                 "1.f / (1.f + __expf(-(logit * p.extra.sigmoid_scale + p.extra.sigmoid_bias)))");
  v.use_softmax = false;
  v.scalars = {{"sigmoid_scale", DType::kFloat32}, {"sigmoid_bias", DType::kFloat32}};
  return v;
}

VariantSpec attention_sink() {
  VariantSpec v = make("AttentionSink",
                       open_struct("AttentionSink", true) +
                           "  // Streaming-LLM: the first sink_size keys, and the window_left keys before the\n"
                           "  // query's (bottom-right aligned) position; causal masks the keys after it.\n"
                           "  template <typename Params>\n"
                           "  __device__ __forceinline__ bool LogitsMask(const Params& p, int, int qo_idx, int kv_idx, int,\n"
                           "                                             int) const {\n"
                           "    return kv_idx < p.extra.sink_size || kv_idx >= qo_idx + (kv_len - qo_len) - p.extra.window_left;\n"
                           "  }\n"
                           "};\n",
                       true);
  v.scalars = {{"sink_size", DType::kInt32}, {"window_left", DType::kInt32}};
  return v;
}

VariantSpec rope(bool interleave, bool causal) {
  const std::string name = std::string(causal ? "Causal" : "") + (interleave ? "RopeInterleaved" : "Rope");
  const std::string layout = interleave ? "true" : "false";
  std::string code = "struct " + name + " : tessera::VariantBase {\n" +
                     (causal ? "  static constexpr bool causal = true;\n" : "") +
                     "  // Llama RoPE on q (at q_pos = qo_idx + kv_len - qo_len) and k (at kv_idx), pairs " +
                     (interleave ? "(2j, 2j + 1)" : "(j, j + head_dim / 2)") +
                     ".\n"
                     "  static constexpr tessera::Pairing pairing = tessera::Pairing::" +
                     (interleave ? "kAdjacent" : "kHalves") +
                     ";\n"
                     "  tessera::RopeFreqs freqs;\n"
                     "  template <typename Params>\n"
                     "  __device__ __forceinline__ " +
                     name +
                     "(const Params& p, int b, int qo_len_, int kv_len_)\n"
                     "      : tessera::VariantBase(p, b, qo_len_, kv_len_), freqs(p.extra.rope_scale, p.extra.rope_theta, kHeadDim) {}\n"
                     "  template <typename Params>\n"
                     "  __device__ __forceinline__ float QueryTransform(const Params&, float q, float partner, int, int qo_idx,\n"
                     "                                                  int, int feat) const {\n"
                     "    return tessera::rope_rotate<" +
                     layout +
                     ">(freqs, q, partner, qo_idx + kv_len - qo_len, feat, kHeadDim);\n"
                     "  }\n"
                     "  template <typename Params>\n"
                     "  __device__ __forceinline__ float KeyTransform(const Params&, float k, float partner, int, int kv_idx,\n"
                     "                                                int, int feat) const {\n"
                     "    return tessera::rope_rotate<" +
                     layout +
                     ">(freqs, k, partner, kv_idx, feat, kHeadDim);\n"
                     "  }\n"
                     "};\n";
  VariantSpec v = make(name, std::move(code), causal);
  v.scalars = {{"rope_scale", DType::kFloat32}, {"rope_theta", DType::kFloat32}};
  return v;
}

}  // namespace tessera::variants
