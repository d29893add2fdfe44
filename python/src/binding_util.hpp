// Helpers shared by the binding files (bindings.cpp, bindings_variants.cpp).
#pragma once
#include <nanobind/nanobind.h>

#include <cstdint>
#include <span>
#include <string>
#include <tuple>

#include "tensor_convert.hpp"
#include "tessera/core/dtype.hpp"
#include "tessera/core/error.hpp"
#include "tessera/api/attention.hpp"
#include "tessera/api/device_batch.hpp"
#include "tessera/runtime/kernel_catalog.hpp"
#include "tessera/runtime/variant_params.hpp"
#include "tessera/api/prefill.hpp"
#include "tessera/formats/paged_kv.hpp"

namespace tessera::python {

// workspace_size and min_workspace_size of a wrapper class (same arguments,
// `ideal` and `minimum` the two instantiations of its static sizer).
template <typename Class, typename Fn, typename... Args>
void def_workspace_sizes(Class& cls, Fn ideal, Fn minimum, const Args&... args) {
  cls.def_static("workspace_size", ideal, args...,
                 "(device_bytes, host_bytes) for these bounds: the ideal size, with partial states for every "
                 "split-KV plan; num_sms 0 asks the device.");
  cls.def_static("min_workspace_size", minimum, args...,
                 "(device_bytes, host_bytes): the smallest workspace these bounds accept (no partial states; "
                 "below workspace_size the plans split less KV to fit); num_sms 0 asks the device.");
}

inline DType parse_dtype(const char* what, const std::string& s) {
  for (DType t : {DType::kFloat16, DType::kBFloat16, DType::kFloat32, DType::kInt32, DType::kUInt8, DType::kBool,
                  DType::kFloat8E4M3, DType::kFloat8E5M2})
    if (s == dtype_name(t)) return t;
  throw TypeMismatch(std::string(what) + ": expected a dtype name (float16, bfloat16, float32, float8_e4m3fn, ...), got '" +
                     s + "'");
}

// fp8 tensors cross from Python as uint8 views of their bits, with the dtype
// named beside them (the Python layer does this, as DLPack exporters differ
// on fp8, and serving engines keep fp8 caches as uint8 tensors anyway): a
// uint8 view becomes `want` when that is an fp8 type.
inline void retag_fp8(Arg& a, DType want) {
  if (is_fp8(want) && a.view.dtype == DType::kUInt8) a.view.dtype = want;
}

// run()'s KV dequantization scales (RunOptions): floats, and optional
// 1-element float32 CUDA tensors (None: none) that the kernel reads at run time.
struct ScaleArgs {
  Arg k_tensor, v_tensor;
  ScaleArgs(nanobind::handle k, nanobind::handle v)
      : k_tensor(to_optional_arg("k_scale", k)), v_tensor(to_optional_arg("v_scale", v)) {}
  void apply(RunOptions& opt, double k_scale, double v_scale) const {
    opt.k_scale = k_scale;
    opt.v_scale = v_scale;
    opt.k_scale_tensor = k_tensor.view;
    opt.v_scale_tensor = v_tensor.view;
  }
};

// k: [pages, ...] (4-D, with v) or the interleaved [pages, 2, ...] (5-D, v None).
inline PagedKVStorage to_storage(const Arg& k, const Arg& v, bool has_v, KVLayout layout) {
  return has_v ? PagedKVStorage(k.view, v.view, layout) : PagedKVStorage(k.view, layout);
}

// A host int32 vector argument of plan() as a span over the caller's buffer
// (kept alive by the Arg).
inline std::span<const int32_t> host_ints(const char* name, const Arg& a) {
  check_dim(name, a.view, 1);
  check_dtype(name, a.view, DType::kInt32);
  check_device(name, a.view, Device{});
  check_contiguous(name, a.view);
  return {static_cast<const int32_t*>(a.view.data), static_cast<size_t>(a.view.size(0))};
}

// Page ids on the GPU as the Python wrappers pass them
// (tessera._wrapper_util.DeviceIds): `count` contiguous int32 at ptr on CUDA
// device `device`. Raw integers, not a DLPack export: with torch's
// __dlpack__ (and a slice) a plan() took ~35 us more on the H100 host than
// with host ids. The C++ plan() checks the device against the workspace's.
inline TensorView device_ids_view(uintptr_t ptr, int64_t count, int device) {
  return TensorView(reinterpret_cast<void*>(ptr), DType::kInt32, Device{DeviceType::kCUDA, device}, {count});
}

// plan()'s arguments of a paged step whose page ids stay on the GPU: host
// int32 qo_indptr (None for decode: empty span), kv_indptr and
// kv_last_page_len, and the ids (device_ids_view).
struct DevicePlanArgs {
  Arg qo, ip, last;
  std::span<const int32_t> qo_s, ip_s, last_s;
  TensorView ids;
  DevicePlanArgs(nanobind::handle qo_indptr, nanobind::handle kv_indptr, uintptr_t ids_ptr, int64_t count, int device,
                 nanobind::handle kv_last_page_len)
      : qo(to_optional_arg("qo_indptr", qo_indptr)), ip(to_arg("kv_indptr", kv_indptr)),
        last(to_arg("kv_last_page_len", kv_last_page_len)), ids(device_ids_view(ids_ptr, count, device)) {
    if (!qo_indptr.is_none()) qo_s = host_ints("qo_indptr", qo);
    ip_s = host_ints("kv_indptr", ip);
    last_s = host_ints("kv_last_page_len", last);
  }
};

// plan_on_device()'s buffers (api/device_batch.hpp): int32 1-D contiguous
// CUDA tensors on the workspace's device, sized for the wrapper's bounds,
// converted without reading them (the C++ side checks dtype, shape, device
// and lengths, naming the argument). qo_indptr None: one query per request
// (decode), an undefined view; kv_indices and kv_last_page_len None
// (ragged KV) likewise. The Args keep the callers' tensors alive while the
// views are in use.
struct DeviceBatchArgs {
  Arg bs, qo, ip, idx, last;
  DeviceBatch batch;
  DeviceBatchArgs(nanobind::handle batch_size, nanobind::handle qo_indptr, nanobind::handle kv_indptr,
                  nanobind::handle kv_indices, nanobind::handle kv_last_page_len)
      : bs(to_arg("batch_size", batch_size)), qo(to_optional_arg("qo_indptr", qo_indptr)),
        ip(to_arg("kv_indptr", kv_indptr)), idx(to_optional_arg("kv_indices", kv_indices)),
        last(to_optional_arg("kv_last_page_len", kv_last_page_len)),
        batch{bs.view, qo.view, ip.view, idx.view, last.view} {}
};

// plan()'s host int32 arrays of a paged step, converted once; the Args keep
// the callers' buffers alive while the spans are in use. mask_indptr may be
// None (empty span).
struct PagedPlanArgs {
  Arg qo, ip, idx, last, mip;
  std::span<const int32_t> qo_s, ip_s, idx_s, last_s, mask_s;
  PagedPlanArgs(nanobind::handle qo_indptr, nanobind::handle kv_indptr, nanobind::handle kv_indices,
                nanobind::handle kv_last_page_len, nanobind::handle mask_indptr)
      : qo(to_arg("qo_indptr", qo_indptr)), ip(to_arg("kv_indptr", kv_indptr)), idx(to_arg("kv_indices", kv_indices)),
        last(to_arg("kv_last_page_len", kv_last_page_len)), mip(to_optional_arg("mask_indptr", mask_indptr)) {
    qo_s = host_ints("qo_indptr", qo);
    ip_s = host_ints("kv_indptr", ip);
    idx_s = host_ints("kv_indices", idx);
    last_s = host_ints("kv_last_page_len", last);
    if (!mask_indptr.is_none()) mask_s = host_ints("mask_indptr", mip);
  }
};

// run()'s tensors of a paged step, converted once: q, the cache as k / v
// (or one interleaved tensor when v is None), o, lse (None: undefined), and
// the softmax scale.
// kv_dtype: the spec's (an fp8 cache may come as uint8 views, retag_fp8).
struct PagedRunArgs {
  Arg q, k, v, o, lse;
  PagedKVStorage storage;
  RunOptions opt;
  PagedRunArgs(nanobind::handle q_, nanobind::handle k_, nanobind::handle v_, nanobind::handle o_,
               nanobind::handle lse_, double sm_scale, KVLayout layout, double v_scale = 1.0,
               DType kv_dtype = DType::kFloat16)
      : q(to_arg("q", q_)), k(to_arg(v_.is_none() ? "kv" : "k", k_)), v(to_optional_arg("v", v_)),
        o(to_arg("o", o_, true)), lse(to_optional_arg("lse", lse_, true)),
        storage((retag_fp8(k, kv_dtype), retag_fp8(v, kv_dtype), to_storage(k, v, !v_.is_none(), layout))) {
    opt.sm_scale = sm_scale;
    opt.v_scale = v_scale;
  }
};

// FlashInfer's pos_encoding_mode as the bindings take it: 0 NONE,
// 1 ROPE_LLAMA, 2 ALIBI.
inline variants::PosEncoding to_pos_encoding(int code) {
  if (code < 0 || code > 2)
    throw InvalidArgument("pos_encoding: expected 0 (NONE), 1 (ROPE_LLAMA) or 2 (ALIBI), got " + std::to_string(code));
  return static_cast<variants::PosEncoding>(code);
}

// run()'s extras of the positional encoding: rope_scale / rope_theta for
// ROPE_LLAMA, the alibi_slopes tensor (float32 [num_qo_heads] on the GPU)
// for ALIBI, none otherwise.
struct PosEncodingExtras {
  VariantArgs args;
  Arg slopes;
  bool any;
  PosEncodingExtras(int code, double rope_scale, double rope_theta, nanobind::handle alibi_slopes)
      : slopes(to_optional_arg("alibi_slopes", alibi_slopes)), any(code != 0) {
    const variants::PosEncoding pos = to_pos_encoding(code);
    if (pos == variants::PosEncoding::kRopeLlama) {
      args.set("rope_scale", rope_scale);
      args.set("rope_theta", rope_theta);
    } else if (pos == variants::PosEncoding::kAlibi) {
      if (alibi_slopes.is_none()) throw InvalidArgument("alibi_slopes: expected a float32 tensor with ALIBI, got None");
      args.set("alibi_slopes", slopes.view);
    }
  }
  const VariantArgs* get() const { return any ? &args : nullptr; }
};

// A prefill-family task (bounds as the workspace needs them).
inline TaskInfo prefill_task(int num_qo_heads, int num_kv_heads, int page_size, const std::string& layout,
                             int64_t max_batch, int64_t max_total_q, int64_t max_pages,
                             int64_t max_fixed_chunks = 0) {
  TaskInfo t{num_qo_heads, num_kv_heads, page_size, parse_kv_layout(layout.c_str()), max_batch, max_pages};
  t.max_total_q = max_total_q;
  t.max_fixed_chunks = max_fixed_chunks;
  return t;
}

// backend: 0 auto, 1 fa2, 2 fa3 (the Python wrappers map FlashInfer's names).
// tile: (cta_kv, warps_q, warps_kv, stages), PrefillTile's fields (0: heuristic).
using TileArg = std::tuple<int, int, int, int>;

// split_kv / fixed_chunk: the planner's (PlannerOptions; fixed_chunk in keys, 0: off).
// The shared_prefix knobs of the wrappers' bindings: (min_shared_tokens,
// min_members, min_saved_tokens); the first > 0 turns the option on, a
// negative other keeps AutoSharedPrefix's default.
using PrefixArg = std::tuple<int, int, int64_t>;
inline AutoSharedPrefix auto_shared_prefix(const PrefixArg& a) {
  AutoSharedPrefix p;
  const auto [tokens, members, saved] = a;
  if (tokens <= 0) return p;
  p.enabled = true;
  p.min_shared_tokens = tokens;
  if (members >= 0) p.min_members = members;
  if (saved >= 0) p.min_saved_tokens = saved;
  return p;
}

inline PrefillOptions prefill_options(int cta_q, int max_sms, int backend, const TileArg& tile = {}, int cluster = 0,
                                      bool split_kv = true, int fixed_chunk = 0, const PrefixArg& shared_prefix = {},
                                      bool fp8_mma = false, int group_heads = 0) {
  PrefillOptions opt;
  if (group_heads < 0 || group_heads > 2)
    throw InvalidArgument("group_heads: expected 0 (auto), 1 (off: one plan per KV head) or 2 (on), got " +
                          std::to_string(group_heads));
  opt.group_heads = static_cast<HeadGrouping>(group_heads);
  opt.fp8_mma = fp8_mma;
  opt.shared_prefix = auto_shared_prefix(shared_prefix);
  opt.planner.split_kv = split_kv;
  opt.planner.fixed_chunk = fixed_chunk;
  opt.cta_q = cta_q;
  opt.max_sms = max_sms;
  opt.cluster = cluster;
  opt.tile = {std::get<0>(tile), std::get<1>(tile), std::get<2>(tile), std::get<3>(tile)};
  if (backend < 0 || backend > 2)
    throw InvalidArgument("backend: expected 0 (auto), 1 (fa2) or 2 (fa3), got " + std::to_string(backend));
  opt.backend = static_cast<PrefillBackend>(backend);
  return opt;
}

// A wrapper's shared_prefix_stats(): None without the option, else a dict.
inline nanobind::object shared_prefix_stats_dict(const SharedPrefixStats* st) {
  if (st == nullptr) return nanobind::none();
  nanobind::dict d;
  d["split"] = true;
  d["groups"] = st->groups;
  d["requests_in_groups"] = st->requests_in_groups;
  d["saved_pages"] = st->saved_pages;
  d["groups_found"] = st->groups_found;
  d["detect_us"] = st->detect_us;
  d["replanned"] = st->replanned;
  return d;
}

// window_left / logits_soft_cap / pos_encoding: FlashInfer's plan() options
// (-1 / 0 / 0: off; pos_encoding as to_pos_encoding reads it).
inline AttentionSpec decode_spec(const std::string& q_dtype, const std::string& kv_dtype, const std::string& o_dtype,
                          int head_dim, int window_left = -1, double logits_soft_cap = 0.0, int pos_encoding = 0) {
  AttentionSpec spec;
  spec.variant = variants::from_plan_options(false, window_left, static_cast<float>(logits_soft_cap),
                                             to_pos_encoding(pos_encoding));
  spec.q_dtype = parse_dtype("q_dtype", q_dtype);
  spec.kv_dtype = parse_dtype("kv_dtype", kv_dtype);
  spec.o_dtype = parse_dtype("o_dtype", o_dtype);
  spec.head_dim = head_dim;
  return spec;
}

// Defined in bindings_prefill.cpp: BatchPrefill (tensor-core batch prefill).
void bind_prefill(nanobind::module_& m);
// Defined in bindings_cascade.cpp: CascadeAttention (composable formats).
void bind_cascade(nanobind::module_& m);
// Defined in bindings_mla.cpp: BatchMLA (multi-head latent attention).
void bind_mla(nanobind::module_& m);
// Defined in bindings_cpu.cpp: CPU attention (the library's CPU path) and the float64 reference.
void bind_cpu(nanobind::module_& m);

// Defined in bindings_variants.cpp: variant specs, AttentionWrapper, RoPE ops, JIT cost.
void bind_variants(nanobind::module_& m);

}  // namespace tessera::python
