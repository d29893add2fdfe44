// The built-in variants (and the docs' example) as GPU test cases: each one's
// spec, the values of its extras (device tensors kept alive here), the CPU
// reference options that compute the same thing, and the input spread that
// keeps the comparison meaningful.
#pragma once
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "gpu_util.hpp"
#include "tessera/reference/attention.hpp"
#include "tessera/runtime/variant_params.hpp"
#include "variant_cases.hpp"

namespace tessera::test {

// Device copies of extra tensors, owned for the duration of a test.
struct ExtraTensors {
  std::vector<std::unique_ptr<DeviceTensor>> keep;
  TensorView upload(const HostTensor& h) {
    keep.push_back(std::make_unique<DeviceTensor>(to_device(h)));
    return keep.back()->view;
  }
};

inline HostTensor floats(const std::vector<double>& v) {
  HostTensor t = make_host(DType::kFloat32, {static_cast<int64_t>(v.size())});
  for (size_t i = 0; i < v.size(); ++i) t.set(i, static_cast<float>(v[i]));
  return t;
}

struct BuiltinCase {
  std::string name;
  std::function<VariantSpec()> spec;
  // Fills the run() arguments and the matching reference options for Hq query heads.
  std::function<void(int hq, ExtraTensors&, VariantArgs&, reference::Options&)> setup;
  bool masks = false;     // masks keys by position (the BSR reference takes no masks)
  bool pairwise = false;  // pairwise Q/K transform (fused RoPE)
  // q and k are uniform in [-spread, spread] (v in [-1, 1]). RoPE keeps it at
  // 1: the kernels round rotated q / k to the storage dtype, as an unfused
  // apply_rope would, and that error grows with |q| |k|.
  float spread = 2.f;
};

inline std::vector<BuiltinCase> builtin_cases() {
  using O = reference::Options;
  auto alibi = [](bool causal) {
    return [causal](int hq, ExtraTensors& t, VariantArgs& a, O& o) {
      const std::vector<float> s = variants::alibi_slopes(hq);
      o.alibi_slopes.assign(s.begin(), s.end());
      o.causal = causal;
      a.set("alibi_slopes", t.upload(floats(o.alibi_slopes)));
    };
  };
  auto sigmoid = [](bool causal) {
    return [causal](int, ExtraTensors&, VariantArgs& a, O& o) {
      a.set("sigmoid_scale", 0.7).set("sigmoid_bias", -1.5);
      o.flash_sigmoid = true, o.sigmoid_scale = 0.7, o.sigmoid_bias = -1.5, o.causal = causal;
    };
  };
  auto rope = [](bool interleave, bool causal, double scale, double theta) {
    return [=](int, ExtraTensors&, VariantArgs& a, O& o) {
      a.set("rope_scale", scale).set("rope_theta", theta);
      o.rope = reference::RopeOptions{interleave, scale, theta, -1};
      o.causal = causal;
    };
  };
  return {
      {"causal", [] { return variants::causal(); }, [](int, ExtraTensors&, VariantArgs&, O& o) { o.causal = true; }, true},
      {"soft_cap", [] { return variants::soft_cap(5.f); }, [](int, ExtraTensors&, VariantArgs&, O& o) { o.logits_soft_cap = 5; }},
      {"alibi", [] { return variants::alibi(false); }, alibi(false)},
      {"alibi_causal", [] { return variants::alibi(true); }, alibi(true), true},
      {"sliding_window", [] { return variants::sliding_window(7, true); },
       [](int, ExtraTensors&, VariantArgs&, O& o) { o.causal = true, o.window_left = 7; }, true},
      {"flash_sigmoid", [] { return variants::flash_sigmoid(false); }, sigmoid(false)},
      {"flash_sigmoid_causal", [] { return variants::flash_sigmoid(true); }, sigmoid(true), true},
      {"attention_sink", [] { return variants::attention_sink(); },
       [](int, ExtraTensors&, VariantArgs& a, O& o) {
         a.set("sink_size", 4).set("window_left", 16);
         o.causal = true, o.sink_size = 4, o.window_left = 16;
       },
       true},
      {"rope_causal", [] { return variants::rope(false, true); }, rope(false, true, 1.0, 1e4), true, true, 1.f},
      {"rope_interleaved", [] { return variants::rope(true, false); }, rope(true, false, 2.0, 5e5), false, true, 1.f},
      {"docs_example", [] { return docs_example_variant(); },
       [](int hq, ExtraTensors& t, VariantArgs& a, O& o) {
         std::vector<double> scale(hq);
         for (int h = 0; h < hq; ++h) scale[h] = 0.5 + 0.25 * (h % 5);
         a.set("head_scale", t.upload(floats(scale))).set("decay", 0.05).set("max_distance", 64);
         o.logits_fn = docs_example_logits(scale, 0.05f, 64);  // decay as the kernel sees it (float)
       }},
  };
}

}  // namespace tessera::test
