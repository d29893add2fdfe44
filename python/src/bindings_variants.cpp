// tessera._C, part two: variant specs (built-ins and user code), the generic
// AttentionWrapper with extras passed by name, the standalone RoPE ops, and
// JIT cost measurements for the variants benchmark. Conventions as in
// bindings.cpp (explicit outputs, integer stream handles, errors mapped to
// ValueError / TypeError by the module's translator).
#include <nanobind/nanobind.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <chrono>
#include <filesystem>
#include <memory>
#include <tuple>
#include <utility>
#include <vector>

#include "binding_util.hpp"
#include "tessera/api/attention_wrapper.hpp"
#include "tessera/api/rope.hpp"
#include "tessera/api/rope_quantize.hpp"
#include "tessera/runtime/cuda.hpp"
#include "tessera/runtime/jit.hpp"
#include "tessera/runtime/prefill_catalog.hpp"
#include "tessera/runtime/variant_params.hpp"

namespace nb = nanobind;
using namespace nb::literals;

namespace tessera::python {
namespace {

using Extras = std::vector<std::pair<std::string, std::string>>;  // (name, dtype name)
// A variant as Python sees it: (name, code, use_softmax, causal, scalars,
// tensors, window_left, headers, struct_name); a built-in names its headers
// and struct, a user variant carries its code.
using SpecTuple =
    std::tuple<std::string, std::string, bool, bool, Extras, Extras, int, std::vector<std::string>, std::string>;

std::vector<ExtraParam> to_params(const char* what, const Extras& e) {
  std::vector<ExtraParam> out;
  for (const auto& [name, dtype] : e) out.push_back({name, parse_dtype(what, dtype)});
  return out;
}

Extras from_params(const std::vector<ExtraParam>& p) {
  Extras out;
  for (const ExtraParam& e : p) out.emplace_back(e.name, dtype_name(e.dtype));
  return out;
}

SpecTuple from_variant(const VariantSpec& v) {
  return {v.name, v.code, v.use_softmax, v.causal, from_params(v.scalars), from_params(v.tensors), v.window_left,
          v.headers, v.struct_name};
}

AttentionSpec to_spec(const SpecTuple& t, const std::string& q_dtype, const std::string& kv_dtype,
                      const std::string& o_dtype, int head_dim) {
  AttentionSpec s;
  s.variant = VariantSpec{std::get<0>(t), std::get<1>(t), to_params("variant.scalars", std::get<4>(t)),
                          to_params("variant.tensors", std::get<5>(t)), std::get<2>(t), std::get<3>(t)};
  s.variant.window_left = std::get<6>(t);
  s.variant.headers = std::get<7>(t);
  s.variant.struct_name = std::get<8>(t);
  if (s.variant.window_left < -1)
    throw InvalidArgument("window_left: expected -1 (no window) or >= 0, got " + std::to_string(s.variant.window_left));
  s.q_dtype = parse_dtype("q_dtype", q_dtype);
  s.kv_dtype = parse_dtype("kv_dtype", kv_dtype);
  s.o_dtype = parse_dtype("o_dtype", o_dtype);
  s.head_dim = head_dim;
  validate_spec(s);
  return s;
}

// The built-in variants by name, with the parameters that apply to each.
SpecTuple builtin_variant(const std::string& kind, bool causal, bool interleave, double cap, int window_left) {
  if (kind == "standard") return from_variant(variants::standard());
  if (kind == "causal") return from_variant(variants::causal());
  if (kind == "custom_mask") return from_variant(variants::custom_mask());
  if (kind == "soft_cap") return from_variant(variants::soft_cap(static_cast<float>(cap), causal));
  if (kind == "sliding_window") return from_variant(variants::sliding_window(window_left, causal));
  if (kind == "alibi") return from_variant(variants::alibi(causal));
  if (kind == "flash_sigmoid") return from_variant(variants::flash_sigmoid(causal));
  if (kind == "attention_sink") return from_variant(variants::attention_sink());
  if (kind == "rope") return from_variant(variants::rope(interleave, causal));
  throw InvalidArgument("kind: expected standard, causal, custom_mask, soft_cap, sliding_window, alibi, flash_sigmoid, "
                        "attention_sink or rope, got '" + kind + "'");
}

// run()'s extras: name -> int, float or tensor. The Args keep the tensors'
// producers alive for the call.
struct RunExtras {
  std::vector<Arg> tensors;
  VariantArgs args;
};

RunExtras to_run_extras(const nb::dict& extras) {
  RunExtras r;
  r.tensors.reserve(extras.size());
  for (auto [key, value] : extras) {
    const std::string name = nb::cast<std::string>(key);
    if (PyBool_Check(value.ptr()))
      throw TypeMismatch(name + ": expected an int, a float or a tensor, got a bool");
    if (PyLong_Check(value.ptr())) {
      r.args.set(name, nb::cast<int64_t>(value));
    } else if (PyFloat_Check(value.ptr())) {
      r.args.set(name, nb::cast<double>(value));
    } else {
      r.tensors.push_back(to_arg(name.c_str(), value));
      r.args.set(name, r.tensors.back().view);
    }
  }
  return r;
}

AttentionKind parse_kind(const std::string& k) {
  if (k == "auto") return AttentionKind::kAuto;
  if (k == "decode") return AttentionKind::kDecode;
  if (k == "prefill") return AttentionKind::kPrefill;
  throw InvalidArgument("kind: expected 'auto', 'decode' or 'prefill', got '" + k + "'");
}

AttentionWrapperOptions wrapper_options(const std::string& kind, int backend, bool use_tensor_cores) {
  AttentionWrapperOptions o;
  o.kind = parse_kind(kind);
  if (backend < 0 || backend > 2) throw InvalidArgument("backend: expected 0 (auto), 1 (fa2) or 2 (fa3), got " + std::to_string(backend));
  o.prefill.backend = static_cast<PrefillBackend>(backend);
  o.decode.use_tensor_cores = use_tensor_cores;
  return o;
}

TaskInfo task_info(int num_qo_heads, int num_kv_heads, int page_size, const std::string& layout, int64_t max_batch,
                   int64_t max_total_q, int64_t max_pages) {
  TaskInfo t{num_qo_heads, num_kv_heads, page_size, parse_kv_layout(layout.c_str()), max_batch, max_pages};
  t.max_total_q = max_total_q;
  return t;
}

class PyAttentionWrapper {
 public:
  PyAttentionWrapper(const SpecTuple& variant, const std::string& q_dtype, const std::string& kv_dtype,
                     const std::string& o_dtype, int head_dim, int num_qo_heads, int num_kv_heads, int page_size,
                     const std::string& layout, int64_t max_batch, int64_t max_total_q, int64_t max_pages,
                     uintptr_t ws_ptr, size_t ws_bytes, uintptr_t host_ptr, size_t host_bytes, int device,
                     const std::string& kind, int backend, bool use_tensor_cores)
      : ws_(reinterpret_cast<void*>(ws_ptr), ws_bytes, reinterpret_cast<void*>(host_ptr), host_bytes, device),
        w_(to_spec(variant, q_dtype, kv_dtype, o_dtype, head_dim),
           task_info(num_qo_heads, num_kv_heads, page_size, layout, max_batch, max_total_q, max_pages), ws_,
           wrapper_options(kind, backend, use_tensor_cores)),
        layout_(parse_kv_layout(layout.c_str())) {}

  template <bool Min>
  static std::tuple<size_t, size_t> sizes(const SpecTuple& variant, const std::string& q_dtype,
                                                   const std::string& kv_dtype, const std::string& o_dtype,
                                                   int head_dim, int num_qo_heads, int num_kv_heads, int page_size,
                                                   const std::string& layout, int64_t max_batch, int64_t max_total_q,
                                                   int64_t max_pages, int num_sms, int device, const std::string& kind,
                                                   int backend, bool use_tensor_cores) {
    if (num_sms <= 0) {
      if (!cuda::gpu_available()) throw CudaError("workspace_size: num_sms not given and " + cuda::no_gpu_reason());
      num_sms = cuda::device_info(device).sm_count;
    }
    const auto s = (Min ? AttentionWrapper::min_workspace_size : AttentionWrapper::workspace_size)(
        to_spec(variant, q_dtype, kv_dtype, o_dtype, head_dim),
        task_info(num_qo_heads, num_kv_heads, page_size, layout, max_batch, max_total_q, max_pages), num_sms,
        wrapper_options(kind, backend, use_tensor_cores));
    return {s.device_bytes, s.host_bytes};
  }

  void plan_paged(nb::handle qo_indptr, nb::handle kv_indptr, nb::handle kv_indices, nb::handle kv_last_page_len,
                  uintptr_t stream, nb::handle mask_indptr) {
    const PagedPlanArgs a(qo_indptr, kv_indptr, kv_indices, kv_last_page_len, mask_indptr);
    nb::gil_scoped_release release;
    w_.plan(a.qo_s, a.ip_s, a.idx_s, a.last_s, to_stream(stream), a.mask_s);
  }

  // Page ids that stay on the GPU (see device_ids_view).
  void plan_paged_device(nb::handle qo_indptr, nb::handle kv_indptr, uintptr_t ids_ptr, int64_t count, int device,
                         nb::handle kv_last_page_len, uintptr_t stream) {
    const DevicePlanArgs a(qo_indptr, kv_indptr, ids_ptr, count, device, kv_last_page_len);
    nb::gil_scoped_release release;
    w_.plan(a.qo_s, a.ip_s, a.ids, a.last_s, to_stream(stream));
  }

  void plan_ragged(nb::handle qo_indptr, nb::handle kv_indptr, uintptr_t stream, nb::handle mask_indptr) {
    Arg qo = to_arg("qo_indptr", qo_indptr), ip = to_arg("kv_indptr", kv_indptr);
    Arg mip = to_optional_arg("mask_indptr", mask_indptr);
    const auto mask = mask_indptr.is_none() ? std::span<const int32_t>() : host_ints("mask_indptr", mip);
    const auto qo_s = host_ints("qo_indptr", qo), ip_s = host_ints("kv_indptr", ip);
    nb::gil_scoped_release release;
    w_.plan_ragged(qo_s, ip_s, to_stream(stream), mask);
  }

  void plan_bsr(nb::handle indptr, nb::handle indices, int64_t M, int64_t N, int R, int C, uintptr_t stream) {
    Arg ip = to_arg("indptr", indptr), idx = to_arg("indices", indices);
    const auto ip_s = host_ints("indptr", ip), idx_s = host_ints("indices", idx);
    nb::gil_scoped_release release;
    w_.plan_bsr(BSRMatrix(M, N, R, C, {ip_s.begin(), ip_s.end()}, {idx_s.begin(), idx_s.end()}), to_stream(stream));
  }

  void run(nb::handle q, nb::handle k, nb::handle v, nb::handle o, nb::handle lse, double sm_scale, uintptr_t stream,
           const nb::dict& extras) {
    const PagedRunArgs a(q, k, v, o, lse, sm_scale, layout_);
    RunExtras ex = to_run_extras(extras);
    nb::gil_scoped_release release;
    w_.run(a.q.view, a.storage, a.o.view, a.lse.view, ex.args, to_stream(stream), a.opt);
  }

  void run_ragged(nb::handle q, nb::handle k, nb::handle v, nb::handle o, nb::handle lse, double sm_scale,
                  uintptr_t stream, const nb::dict& extras) {
    Arg qa = to_arg("q", q), ka = to_arg("k", k), va = to_arg("v", v);
    Arg oa = to_arg("o", o, true), la = to_optional_arg("lse", lse, true);
    RunExtras ex = to_run_extras(extras);
    RunOptions opt;
    opt.sm_scale = sm_scale;
    nb::gil_scoped_release release;
    w_.run_ragged(qa.view, ka.view, va.view, oa.view, la.view, ex.args, to_stream(stream), opt);
  }

  std::string kind() const {
    switch (w_.kind()) {
      case AttentionKind::kDecode: return "decode";
      case AttentionKind::kPrefill: return "prefill";
      default: return "auto";
    }
  }

 private:
  Workspace ws_;  // declared before w_, which keeps a pointer to it
  AttentionWrapper w_;
  KVLayout layout_;
};

RopeOptions rope_options(int rotary_dim, bool interleave, double rope_scale, double rope_theta, bool llama31,
                         double low_freq_factor, double high_freq_factor, double old_context_len) {
  RopeOptions o{rotary_dim, interleave, rope_scale, rope_theta};
  o.llama31 = llama31;
  o.low_freq_factor = low_freq_factor;
  o.high_freq_factor = high_freq_factor;
  o.old_context_len = old_context_len;
  return o;
}

void py_apply_rope_pos_ids(nb::handle q, nb::handle k, nb::handle q_rope, nb::handle k_rope, nb::handle pos_ids,
                           int rotary_dim, bool interleave, double rope_scale, double rope_theta, bool llama31,
                           double low_freq_factor, double high_freq_factor, double old_context_len, uintptr_t stream) {
  Arg qa = to_arg("q", q), ka = to_arg("k", k), qo = to_arg("q_rope", q_rope, true), ko = to_arg("k_rope", k_rope, true);
  Arg pa = to_arg("pos_ids", pos_ids);
  const RopeOptions o = rope_options(rotary_dim, interleave, rope_scale, rope_theta, llama31, low_freq_factor,
                                     high_freq_factor, old_context_len);
  nb::gil_scoped_release release;
  apply_rope_pos_ids(qa.view, ka.view, qo.view, ko.view, pa.view, o, to_stream(stream));
}

void py_apply_rope(nb::handle q, nb::handle k, nb::handle q_rope, nb::handle k_rope, nb::handle indptr,
                   nb::handle offsets, int rotary_dim, bool interleave, double rope_scale, double rope_theta,
                   bool llama31, double low_freq_factor, double high_freq_factor, double old_context_len,
                   uintptr_t stream) {
  Arg qa = to_arg("q", q), ka = to_arg("k", k), qo = to_arg("q_rope", q_rope, true), ko = to_arg("k_rope", k_rope, true);
  Arg ia = to_arg("indptr", indptr), oa = to_arg("offsets", offsets);
  const RopeOptions o = rope_options(rotary_dim, interleave, rope_scale, rope_theta, llama31, low_freq_factor,
                                     high_freq_factor, old_context_len);
  nb::gil_scoped_release release;
  apply_rope(qa.view, ka.view, qo.view, ko.view, ia.view, oa.view, o, to_stream(stream));
}

void py_apply_rope_pos_ids_cos_sin_cache(nb::handle q, nb::handle k, nb::handle q_rope, nb::handle k_rope,
                                         nb::handle cos_sin_cache, nb::handle pos_ids, bool interleave,
                                         uintptr_t stream) {
  Arg qa = to_arg("q", q), ka = to_arg("k", k), qo = to_arg("q_rope", q_rope, true), ko = to_arg("k_rope", k_rope, true);
  Arg ca = to_arg("cos_sin_cache", cos_sin_cache), pa = to_arg("pos_ids", pos_ids);
  nb::gil_scoped_release release;
  apply_rope_pos_ids_cos_sin_cache(qa.view, ka.view, qo.view, ko.view, ca.view, pa.view, interleave, to_stream(stream));
}

// rope_quantize_fp8 and its paged forms: cache0 None -> k to k_rope_out /
// k_nope_out; else (k_cache, v_cache) with v, or (ckv_cache, kpe_cache)
// without (MLA). fp8 outputs come as uint8 views, out_dtype naming them.
void py_rope_quantize_fp8(nb::handle q_rope, nb::handle k_rope, nb::handle q_nope, nb::handle k_nope, nb::handle v,
                          nb::handle cos_sin_cache, nb::handle pos_ids, nb::handle q_rope_out, nb::handle k_rope_out,
                          nb::handle q_nope_out, nb::handle k_nope_out, nb::handle cache0, nb::handle cache1,
                          nb::handle kv_indices, nb::handle kv_indptr, nb::handle batch_indices, nb::handle positions,
                          const std::string& kv_layout, const std::string& out_dtype, bool interleave,
                          double quant_scale_q, double quant_scale_kv, uintptr_t stream, int64_t max_batch,
                          int64_t max_indices) {
  const DType out = parse_dtype("quantize_dtype", out_dtype);
  Arg qr = to_arg("q_rope", q_rope), kr = to_arg("k_rope", k_rope), qn = to_optional_arg("q_nope", q_nope);
  Arg kn = to_optional_arg("k_nope", k_nope), va = to_optional_arg("v", v);
  Arg cs = to_arg("cos_sin_cache", cos_sin_cache), pi = to_arg("pos_ids", pos_ids);
  Arg qro = to_arg("q_rope_out", q_rope_out, true), qno = to_optional_arg("q_nope_out", q_nope_out, true);
  Arg kro = to_optional_arg("k_rope_out", k_rope_out, true), kno = to_optional_arg("k_nope_out", k_nope_out, true);
  const bool paged = !cache0.is_none(), mla = paged && v.is_none();
  Arg c0 = to_optional_arg(mla ? "ckv_cache" : "paged_kv_cache", cache0, true);
  Arg c1 = to_optional_arg(mla ? "kpe_cache" : "paged_kv_cache", cache1, true);
  Arg ki = to_optional_arg("kv_indices", kv_indices), kp = to_optional_arg("kv_indptr", kv_indptr);
  Arg bi = to_optional_arg("batch_indices", batch_indices), po = to_optional_arg("positions", positions);
  for (Arg* a : {&qro, &qno, &kro, &kno, &c0, &c1}) retag_fp8(*a, out);
  RopeQuantizeOptions o;
  o.interleave = interleave;
  o.quant_scale_q = quant_scale_q;
  o.quant_scale_kv = quant_scale_kv;
  o.max_batch = max_batch;
  o.max_indices = max_indices;
  const KVLayout layout = parse_kv_layout(kv_layout.c_str());
  nb::gil_scoped_release release;
  if (!paged)
    rope_quantize_fp8(qr.view, kr.view, qn.view, kn.view, cs.view, pi.view, qro.view, kro.view, qno.view, kno.view, o,
                      to_stream(stream));
  else if (mla)
    rope_quantize_fp8_append_paged_mla_cache(qr.view, kr.view, qn.view, kn.view, cs.view, pi.view, c0.view, c1.view,
                                             ki.view, kp.view, bi.view, po.view, qro.view, qno.view, o, to_stream(stream));
  else
    rope_quantize_fp8_append_paged_kv_cache(qr.view, kr.view, qn.view, kn.view, va.view, cs.view, pi.view,
                                            PagedKVStorage(c0.view, c1.view, layout), ki.view, kp.view, bi.view, po.view,
                                            qro.view, qno.view, o, to_stream(stream));
}

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

// JIT cost of a variant's kernels on the current GPU (benchmarks): for each
// family, NVRTC time into an empty cache at `dir`, then in a fresh cache (as
// a new process) the disk read and the load onto the GPU, then the mean
// in-memory lookup of the loaded kernel over `lookups` calls.
nb::list py_measure_jit(const SpecTuple& variant, const std::string& dtype, int head_dim, int group,
                        const std::vector<std::string>& families, const std::string& dir, int lookups) {
  if (!cuda::gpu_available()) throw CudaError("measure_jit: " + cuda::no_gpu_reason());
  const AttentionSpec spec = to_spec(variant, dtype, dtype, dtype, head_dim);
  std::vector<jit::KernelSource> srcs;
  for (const std::string& f : families) {
    if (f == "decode") srcs.push_back(catalog::batch_decode(spec, group));
    else if (f == "prefill") srcs.push_back(catalog::batch_prefill(spec, 128, false));
    else if (f == "prefill_sm90") srcs.push_back(catalog::batch_prefill(spec, 128, true));
    else throw InvalidArgument("families: expected decode, prefill or prefill_sm90, got '" + f + "'");
  }
  const int dev = cuda::current_device();
  const jit::Arch arch = jit::Arch::of_device(dev);
  nb::list out;
  nb::gil_scoped_release release;
  std::filesystem::remove_all(dir);
  std::vector<double> compile_ms;
  {
    jit::KernelCache cold(dir);
    for (const auto& s : srcs) compile_ms.push_back(cold.cubin(s, arch)->compile_ms);
  }
  jit::KernelCache warm(dir);
  for (size_t i = 0; i < srcs.size(); ++i) {
    auto t0 = std::chrono::steady_clock::now();
    warm.kernel(srcs[i], dev);
    const double load_ms = ms_since(t0);
    const double disk_ms = warm.cubin(srcs[i], arch)->load_ms;
    t0 = std::chrono::steady_clock::now();
    for (int r = 0; r < lookups; ++r) warm.kernel(srcs[i], dev);
    const double lookup_us = ms_since(t0) * 1e3 / std::max(lookups, 1);
    nb::gil_scoped_acquire acquire;
    nb::dict d;
    d["entry"] = srcs[i].entry;
    d["compile_ms"] = compile_ms[i];
    d["disk_read_ms"] = disk_ms;
    d["warm_load_ms"] = load_ms;
    d["lookup_us"] = lookup_us;
    out.append(d);
  }
  return out;
}

}  // namespace

void bind_variants(nb::module_& m) {
  m.def("builtin_variant", &builtin_variant, "kind"_a, "causal"_a = false, "interleave"_a = false, "cap"_a = 0.0,
        "window_left"_a = -1,
        "A built-in variant as (name, code, use_softmax, causal, scalars, tensors, window_left, headers, struct_name): "
        "code empty, headers and struct_name naming its device struct; extras as (name, dtype) pairs.");
  m.def("validate_variant", [](const SpecTuple& v) { (void)to_spec(v, "float16", "float16", "float16", 128); }, "variant"_a,
        "Checks a variant tuple (names, extras, parameter size) without compiling it.");
  m.def("alibi_slopes", &variants::alibi_slopes, "num_heads"_a, "The standard ALiBi slopes of num_heads heads.");
  nb::class_<PyAttentionWrapper> wrapper(
      m, "AttentionWrapper", "Generic plan/run attention of a variant spec (decode or prefill; paged, ragged or BSR KV).");
  def_workspace_sizes(wrapper, &PyAttentionWrapper::sizes<false>, &PyAttentionWrapper::sizes<true>, "variant"_a,
                      "q_dtype"_a, "kv_dtype"_a, "o_dtype"_a, "head_dim"_a, "num_qo_heads"_a, "num_kv_heads"_a,
                      "page_size"_a, "layout"_a, "max_batch"_a, "max_total_q"_a, "max_pages"_a, "num_sms"_a = 0,
                      "device"_a = 0, "kind"_a = "auto", "backend"_a = 0, "use_tensor_cores"_a = false);
  wrapper.def(nb::init<const SpecTuple&, const std::string&, const std::string&, const std::string&, int, int, int, int,
                    const std::string&, int64_t, int64_t, int64_t, uintptr_t, size_t, uintptr_t, size_t, int,
                    const std::string&, int, bool>(),
           "variant"_a, "q_dtype"_a, "kv_dtype"_a, "o_dtype"_a, "head_dim"_a, "num_qo_heads"_a, "num_kv_heads"_a,
           "page_size"_a, "layout"_a, "max_batch"_a, "max_total_q"_a, "max_pages"_a, "workspace_ptr"_a,
           "workspace_bytes"_a, "host_ptr"_a, "host_bytes"_a, "device"_a, "kind"_a = "auto", "backend"_a = 0,
           "use_tensor_cores"_a = false,
           "Borrows a device workspace and a pinned host buffer (the caller keeps both alive); kind auto|decode|prefill.")
      .def("plan_paged_device", &PyAttentionWrapper::plan_paged_device, "qo_indptr"_a, "kv_indptr"_a, "ids_ptr"_a,
           "count"_a, "device"_a, "kv_last_page_len"_a, "stream"_a = 0,
           "Plans a paged step whose page ids stay on the GPU: count int32 at ids_ptr on CUDA device `device`.")
      .def("plan_paged", &PyAttentionWrapper::plan_paged, "qo_indptr"_a, "kv_indptr"_a, "kv_indices"_a,
           "kv_last_page_len"_a, "stream"_a = 0, "mask_indptr"_a.none() = nb::none(),
           "Plans a paged step (decode when every request has one query and the kind allows).")
      .def("plan_ragged", &PyAttentionWrapper::plan_ragged, "qo_indptr"_a, "kv_indptr"_a, "stream"_a = 0,
           "mask_indptr"_a.none() = nb::none(), "Plans a ragged prefill step.")
      .def("plan_bsr", &PyAttentionWrapper::plan_bsr, "indptr"_a, "indices"_a, "M"_a, "N"_a, "R"_a, "C"_a, "stream"_a = 0,
           "Plans a block-sparse step (decode when R == 1 and the kind allows).")
      .def("run", &PyAttentionWrapper::run, "q"_a, "k"_a, "v"_a.none(), "o"_a, "lse"_a.none(), "sm_scale"_a = -1.0,
           "stream"_a = 0, "extras"_a = nb::dict(), "Paged or BSR run; extras: the variant's values by name.")
      .def("run_ragged", &PyAttentionWrapper::run_ragged, "q"_a, "k"_a, "v"_a, "o"_a, "lse"_a.none(),
           "sm_scale"_a = -1.0, "stream"_a = 0, "extras"_a = nb::dict(), "Ragged run; extras by name.")
      .def_prop_ro("kind", &PyAttentionWrapper::kind, "'decode' or 'prefill' once chosen, else 'auto'.");
  m.def("apply_rope_pos_ids", &py_apply_rope_pos_ids, "q"_a, "k"_a, "q_rope"_a, "k_rope"_a, "pos_ids"_a,
        "rotary_dim"_a = -1, "interleave"_a = false, "rope_scale"_a = 1.0, "rope_theta"_a = 1e4, "llama31"_a = false,
        "low_freq_factor"_a = 1.0, "high_freq_factor"_a = 4.0, "old_context_len"_a = 8192.0, "stream"_a = 0,
        "RoPE of q/k rows at pos_ids into q_rope/k_rope (may alias q/k); llama31: Llama 3.1 frequencies.");
  m.def("apply_rope", &py_apply_rope, "q"_a, "k"_a, "q_rope"_a, "k_rope"_a, "indptr"_a, "offsets"_a,
        "rotary_dim"_a = -1, "interleave"_a = false, "rope_scale"_a = 1.0, "rope_theta"_a = 1e4, "llama31"_a = false,
        "low_freq_factor"_a = 1.0, "high_freq_factor"_a = 4.0, "old_context_len"_a = 8192.0, "stream"_a = 0,
        "RoPE of ragged q/k rows (row n of request b at offsets[b] + n - indptr[b]); llama31: Llama 3.1 frequencies.");
  m.def("apply_rope_pos_ids_cos_sin_cache", &py_apply_rope_pos_ids_cos_sin_cache, "q"_a, "k"_a, "q_rope"_a, "k_rope"_a,
        "cos_sin_cache"_a, "pos_ids"_a, "interleave"_a = false, "stream"_a = 0,
        "RoPE of q/k rows at pos_ids with angles from a float32 [max_pos, rotary_dim] cos/sin cache.");
  m.def("rope_quantize_fp8", &py_rope_quantize_fp8, "q_rope"_a, "k_rope"_a, "q_nope"_a.none(), "k_nope"_a.none(),
        "v"_a.none(), "cos_sin_cache"_a, "pos_ids"_a, "q_rope_out"_a, "k_rope_out"_a.none(), "q_nope_out"_a.none(),
        "k_nope_out"_a.none(), "cache0"_a.none(), "cache1"_a.none(), "kv_indices"_a.none(), "kv_indptr"_a.none(),
        "batch_indices"_a.none(), "positions"_a.none(), "kv_layout"_a = "NHD", "out_dtype"_a = "float8_e4m3fn",
        "interleave"_a = false, "quant_scale_q"_a = 1.0, "quant_scale_kv"_a = 1.0, "stream"_a = 0,
        "max_batch"_a = 0, "max_indices"_a = 0,
        "Fused RoPE (cos/sin cache) + fp8 quantize of q/k(/v), k/v to outputs or a paged fp8 cache; max_batch / "
        "max_indices as append_paged_kv_cache's.");
  m.def("measure_jit", &py_measure_jit, "variant"_a, "dtype"_a, "head_dim"_a, "group"_a, "families"_a, "dir"_a,
        "lookups"_a = 10000, "Cold compile, warm load and lookup times of a variant's kernels on the current GPU.");
}

}  // namespace tessera::python
