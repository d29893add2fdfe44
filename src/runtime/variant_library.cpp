// The built-in variants as specs. Each names the device header that defines
// it (include/tessera/device/variants/<name>.cuh) and the struct to
// instantiate; the JIT includes the header and compiles the kernel exactly as
// it compiles a user's variant. Combinations are spelled through the spec's
// declarations (causal) and the composing SlidingWindow template, never as
// new code.
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdio>

#include "tessera/core/error.hpp"
#include "tessera/runtime/kernel_catalog.hpp"

namespace tessera::variants {

namespace {

// A built-in: `file` under tessera/device/variants/, `type` the struct in
// namespace tessera::variants.
VariantSpec builtin(std::string name, const char* file, const std::string& type, bool causal = false) {
  VariantSpec v{std::move(name), ""};
  v.causal = causal;
  v.headers = {std::string("tessera/device/variants/") + file};
  v.struct_name = "tessera::variants::" + type;
  return v;
}

// Identifier-safe rendering of a value for variant names: '.' -> 'p',
// '-' -> 'm', '+' dropped (e.g. 30 -> "30", 2.5 -> "2p5", 1e-05 -> "1em05").
std::string name_token(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '.') out += 'p';
    else if (c == '-') out += 'm';
    else if (c == '+') continue;
    else out += c;
  }
  return out;
}

// Every built-in softmax variant FlashInfer's plan options can select comes
// from this one generator, so any combination (a Gemma-2 layer uses a window
// and a soft cap; Llama layers add RoPE) is a spec like the others: the
// positional encoding at the bottom (StandardAttention, Rope or
// QueryIndexAlibi), SoftCap<bits, ...> on its logits, SlidingWindow<W, ...>
// declared on top; causal declared by the spec.
// cap <= 0: no soft cap; window_left = -1: no window.
VariantSpec plan_variant(bool causal, int window_left, float cap, PosEncoding pos, bool mask) {
  std::vector<std::string> parts;
  std::string type;
  VariantSpec v{"", ""};
  // The custom mask is the innermost base: every other option composes over it.
  const std::string base = mask ? "tessera::variants::CustomMaskAttention" : "";
  if (mask) {
    parts.push_back("CustomMask");
    type = base;
    v.headers.push_back("tessera/device/variants/custom_mask.cuh");
    v.custom_mask = true;
  }
  if (pos == PosEncoding::kRopeLlama) {
    parts.push_back("Rope");
    type = "tessera::variants::Rope<tessera::Pairing::kHalves, kHeadDim" + (mask ? ", " + base : "") + ">";
    v.headers.push_back("tessera/device/variants/rope.cuh");
    v.scalars = {{"rope_scale", DType::kFloat32}, {"rope_theta", DType::kFloat32}};
  } else if (pos == PosEncoding::kAlibi) {
    parts.push_back("QueryIndexAlibi");
    type = "tessera::variants::QueryIndexAlibi<" + base + ">";
    v.headers.push_back("tessera/device/variants/alibi.cuh");
    v.tensors = {{"alibi_slopes", DType::kFloat32}};
  }
  if (window_left >= 0) parts.push_back("SlidingWindow_" + std::to_string(window_left));
  if (cap > 0.f) {
    char shown[64], bits[16];
    std::snprintf(shown, sizeof shown, "%.9g", static_cast<double>(cap));
    std::snprintf(bits, sizeof bits, "0x%08xu", static_cast<unsigned>(std::bit_cast<uint32_t>(cap)));  // exact
    parts.push_back("SoftCap_" + name_token(shown));
    type = std::string("tessera::variants::SoftCap<") + bits + (type.empty() ? "" : ", " + type) + ">";
    v.headers.push_back("tessera/device/variants/soft_cap.cuh");
  }
  if (window_left >= 0) {
    type = "tessera::variants::SlidingWindow<" + std::to_string(window_left) + (type.empty() ? "" : ", " + type) + ">";
    v.headers.insert(v.headers.begin(), "tessera/device/variants/sliding_window.cuh");
  }
  v.name = causal ? "Causal" : "";
  for (size_t i = 0; i < parts.size(); ++i) v.name += (i ? "_" : "") + parts[i];
  v.causal = causal;
  v.window_left = window_left;
  v.struct_name = std::move(type);
  return v;
}

void check_cap(float cap, const char* arg) {
  if (!(cap > 0.f) || !std::isfinite(cap)) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%.9g", static_cast<double>(cap));
    throw InvalidArgument(std::string(arg) + ": expected a finite soft cap > 0, got " + buf);
  }
}

void check_window(int window_left, int lowest, const char* expected) {
  if (window_left < lowest)
    throw InvalidArgument(std::string("window_left: expected ") + expected + ", got " + std::to_string(window_left));
}

}  // namespace

VariantSpec standard() { return builtin("StandardAttention", "standard.cuh", "StandardAttention"); }

VariantSpec causal() { return builtin("CausalAttention", "causal.cuh", "CausalAttention", true); }

VariantSpec custom_mask() {
  VariantSpec v = builtin("CustomMaskAttention", "custom_mask.cuh", "CustomMaskAttention");
  v.custom_mask = true;
  return v;
}

VariantSpec soft_cap(float cap, bool causal) {
  check_cap(cap, "cap");
  return plan_variant(causal, -1, cap, PosEncoding::kNone, false);
}

VariantSpec sliding_window(int window_left, bool causal) {
  check_window(window_left, 0, ">= 0 (keys a query sees to its left)");
  return plan_variant(causal, window_left, 0.f, PosEncoding::kNone, false);
}

VariantSpec from_plan_options(bool causal, int window_left, float logits_soft_cap, PosEncoding pos_encoding,
                              bool custom_mask) {
  check_window(window_left, -1, "-1 (no window) or >= 0 (keys a query sees to its left)");
  if (logits_soft_cap != 0.f) check_cap(logits_soft_cap, "logits_soft_cap");
  if (pos_encoding != PosEncoding::kNone && pos_encoding != PosEncoding::kRopeLlama &&
      pos_encoding != PosEncoding::kAlibi)
    throw InvalidArgument("pos_encoding: expected kNone, kRopeLlama or kAlibi, got " +
                          std::to_string(static_cast<int>(pos_encoding)));
  if (causal && custom_mask)
    throw InvalidArgument("causal: expected false with a custom mask (put the causal part into the mask)");
  const bool plain = window_left < 0 && logits_soft_cap == 0.f;
  if (custom_mask && plain && pos_encoding == PosEncoding::kNone) return variants::custom_mask();
  if (!custom_mask && plain && pos_encoding == PosEncoding::kRopeLlama) return rope(false, causal);
  if (!custom_mask && plain && pos_encoding == PosEncoding::kNone) return causal ? variants::causal() : standard();
  return plan_variant(causal, window_left, logits_soft_cap, pos_encoding, custom_mask);
}

bool is_causal(const VariantSpec& v) { return v.causal; }

VariantSpec alibi(bool causal) {
  VariantSpec v = builtin(causal ? "CausalAlibi" : "Alibi", "alibi.cuh", "Alibi", causal);
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
  VariantSpec v = builtin(causal ? "CausalFlashSigmoid" : "FlashSigmoid", "flash_sigmoid.cuh", "FlashSigmoid", causal);
  v.use_softmax = false;
  v.scalars = {{"sigmoid_scale", DType::kFloat32}, {"sigmoid_bias", DType::kFloat32}};
  return v;
}

VariantSpec attention_sink() {
  VariantSpec v = builtin("AttentionSink", "attention_sink.cuh", "AttentionSink", true);
  v.scalars = {{"sink_size", DType::kInt32}, {"window_left", DType::kInt32}};
  return v;
}

VariantSpec rope(bool interleave, bool causal) {
  const std::string name = std::string(causal ? "Causal" : "") + (interleave ? "RopeInterleaved" : "Rope");
  VariantSpec v = builtin(name, "rope.cuh",
                          std::string("Rope<tessera::Pairing::") + (interleave ? "kAdjacent" : "kHalves") + ", kHeadDim>",
                          causal);
  v.scalars = {{"rope_scale", DType::kFloat32}, {"rope_theta", DType::kFloat32}};
  return v;
}

}  // namespace tessera::variants
