// tessera._C's CPU attention: cpu_attention_ragged, the library's CPU path
// behind single_prefill / single_decode on host tensors, and
// reference_attention_ragged, the float64 test oracle.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <cstdint>
#include <utility>
#include <vector>

#include "binding_util.hpp"
#include "tensor_convert.hpp"
#include "tessera/cpu/attention.hpp"
#include "tessera/formats/ragged.hpp"
#include "tessera/reference/attention.hpp"

namespace nb = nanobind;
using namespace nb::literals;

namespace tessera::python {

namespace {

using F64Array = nb::ndarray<nb::numpy, double>;

// Hands a vector of doubles to numpy without a copy: the capsule owns the
// vector and frees it when the array is collected.
F64Array owned_array(std::vector<double>&& data, std::initializer_list<size_t> shape) {
  auto* buf = new std::vector<double>(std::move(data));
  nb::capsule owner(buf, [](void* p) noexcept { delete static_cast<std::vector<double>*>(p); });
  return F64Array(buf->data(), shape, owner);
}

// A custom mask argument (None: no mask): flat 0/1 bytes, the requests'
// [q_len, kv_len] blocks concatenated.
std::vector<uint8_t> mask_bytes(nb::handle custom_mask) {
  if (custom_mask.is_none()) return {};
  Arg m = to_arg("custom_mask", custom_mask);
  check_dim("custom_mask", m.view, 1);
  check_dtype_in("custom_mask", m.view, {DType::kUInt8, DType::kBool});
  check_device("custom_mask", m.view, Device{});
  check_contiguous("custom_mask", m.view);
  const auto* bytes = static_cast<const uint8_t*>(m.view.data);
  return {bytes, bytes + m.view.numel()};
}

// CPU attention over ragged q / KV into o (like q's shape) and lse ([rows, H]
// float32, or None), all host tensors.
void py_cpu_attention_ragged(nb::handle q, std::vector<int32_t> qo_indptr, nb::handle k, nb::handle v,
                             std::vector<int32_t> kv_indptr, nb::handle o, nb::handle lse, double sm_scale, bool causal,
                             double logits_soft_cap, nb::handle custom_mask, int window_left, bool rope,
                             double rope_scale, double rope_theta, const std::string& kv_dtype, double k_scale,
                             double v_scale, std::vector<float> alibi_slopes) {
  Arg qa = to_arg("q", q), ka = to_arg("k", k), va = to_arg("v", v);
  if (!kv_dtype.empty()) {  // fp8 K / V as uint8 views (retag_fp8)
    retag_fp8(ka, parse_dtype("kv_dtype", kv_dtype));
    retag_fp8(va, parse_dtype("kv_dtype", kv_dtype));
  }
  Arg oa = to_arg("o", o, true), la = to_optional_arg("lse", lse, true);
  const std::vector<uint8_t> mask = mask_bytes(custom_mask);
  cpu::AttentionOptions opt;
  opt.sm_scale = sm_scale;
  opt.causal = causal;
  opt.logits_soft_cap = logits_soft_cap;
  opt.window_left = window_left;
  opt.custom_mask = mask;
  opt.rope = rope;
  opt.rope_scale = rope_scale;
  opt.rope_theta = rope_theta;
  opt.k_scale = k_scale;
  opt.v_scale = v_scale;
  opt.alibi_slopes = alibi_slopes;
  nb::gil_scoped_release release;
  cpu::attention_ragged(qa.view, qo_indptr, ka.view, va.view, kv_indptr, opt, oa.view, la.view);
}

// The float64 reference over ragged q / KV: (o [rows, H, D], lse [rows, H], base 2) as numpy.
std::pair<F64Array, F64Array> py_reference_attention_ragged(nb::handle q, std::vector<int32_t> qo_indptr, nb::handle k,
                                                            nb::handle v, std::vector<int32_t> kv_indptr,
                                                            double sm_scale, bool causal, double logits_soft_cap,
                                                            nb::handle custom_mask, int window_left, bool rope,
                                                            double rope_scale, double rope_theta,
                                                            const std::string& kv_dtype, double k_scale,
                                                            double v_scale) {
  Arg qa = to_arg("q", q), ka = to_arg("k", k), va = to_arg("v", v);
  if (!kv_dtype.empty()) {
    retag_fp8(ka, parse_dtype("kv_dtype", kv_dtype));
    retag_fp8(va, parse_dtype("kv_dtype", kv_dtype));
  }
  RaggedIndex qo(std::move(qo_indptr), -1, "qo_indptr");
  RaggedIndex kv(std::move(kv_indptr), -1, "kv_indptr");
  reference::Options opt;
  opt.sm_scale = sm_scale;
  opt.causal = causal;
  opt.logits_soft_cap = logits_soft_cap;
  opt.window_left = window_left;
  if (rope) opt.rope = reference::RopeOptions{false, rope_scale, rope_theta, -1};
  opt.k_scale = k_scale;
  opt.v_scale = v_scale;
  opt.custom_mask = mask_bytes(custom_mask);  // empty: no position to mask either way
  reference::Result r;
  {
    nb::gil_scoped_release release;
    r = reference::attention_ragged(qa.view, qo, ka.view, va.view, kv, opt);
  }
  const auto rows = static_cast<size_t>(r.rows), heads = static_cast<size_t>(r.heads);
  const auto dim = static_cast<size_t>(r.head_dim);
  return {owned_array(std::move(r.o), {rows, heads, dim}), owned_array(std::move(r.lse), {rows, heads})};
}

}  // namespace

void bind_cpu(nb::module_& m) {
  m.def("cpu_attention_ragged", &py_cpu_attention_ragged, "q"_a, "qo_indptr"_a, "k"_a, "v"_a, "kv_indptr"_a, "o"_a,
        "lse"_a.none(), "sm_scale"_a = -1.0, "causal"_a = false, "logits_soft_cap"_a = 0.0,
        "custom_mask"_a.none() = nb::none(), "window_left"_a = -1, "rope"_a = false, "rope_scale"_a = 1.0,
        "rope_theta"_a = 1e4, "kv_dtype"_a = "", "k_scale"_a = 1.0, "v_scale"_a = 1.0,
        "alibi_slopes"_a = std::vector<float>{},
        "CPU attention (float accumulation) into o [rows, H, D] and lse [rows, H] float32 base 2 (or None); "
        "custom_mask as for reference_attention_ragged; kv_dtype names the fp8 type of uint8 k, v views; "
        "k_scale multiplies the softmax scale, v_scale the output; alibi_slopes: one per query head "
        "(FlashInfer's ALiBi, slope * (key index - query index), before the soft cap) or empty.");
  m.def("reference_attention_ragged", &py_reference_attention_ragged, "q"_a, "qo_indptr"_a, "k"_a, "v"_a,
        "kv_indptr"_a, "sm_scale"_a = -1.0, "causal"_a = false, "logits_soft_cap"_a = 0.0,
        "custom_mask"_a.none() = nb::none(), "window_left"_a = -1, "rope"_a = false, "rope_scale"_a = 1.0,
        "rope_theta"_a = 1e4, "kv_dtype"_a = "", "k_scale"_a = 1.0, "v_scale"_a = 1.0,
        "CPU reference attention in float64 (the tests' oracle) on K, V dequantized (stored value x k_scale / "
        "v_scale; kv_dtype names the fp8 type of uint8 views): returns (o [rows, H, D], lse [rows, H] base 2) "
        "as numpy. custom_mask: flat uint8/bool 0/1 mask, each request's row-major [q_len, kv_len] block in turn.");
}

}  // namespace tessera::python
