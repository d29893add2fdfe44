// tessera._C.CascadeAttention: composable formats (levels of one paged KV
// cache merged through the attention state), behind the Python
// MultiLevelCascadeAttentionWrapper (tessera/cascade.py); and
// tessera._C.find_shared_prefixes, which finds such levels in a flat page
// table (the wrappers' shared_prefix="auto", tessera/_auto_prefix.py).
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>

#include <cstdint>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "binding_util.hpp"
#include "tessera/api/cascade.hpp"
#include "tessera/formats/shared_prefix.hpp"
#include "tessera/runtime/cuda.hpp"

namespace nb = nanobind;
using namespace nb::literals;

namespace tessera::python {
namespace {

// One spec per level: the plan options (soft-cap) on every level, causal
// only on the last (the shared pages precede every query row).
std::vector<AttentionSpec> level_specs(const std::string& q_dtype, const std::string& kv_dtype,
                                       const std::string& o_dtype, int head_dim, int num_levels, bool causal,
                                       double logits_soft_cap) {
  if (num_levels < 1) throw InvalidArgument("num_levels: expected >= 1, got " + std::to_string(num_levels));
  AttentionSpec s;
  s.q_dtype = parse_dtype("q_dtype", q_dtype);
  s.kv_dtype = parse_dtype("kv_dtype", kv_dtype);
  s.o_dtype = parse_dtype("o_dtype", o_dtype);
  s.head_dim = head_dim;
  std::vector<AttentionSpec> specs(num_levels, s);
  for (int i = 0; i < num_levels; ++i)
    specs[i].variant = variants::from_plan_options(causal && i == num_levels - 1, -1, static_cast<float>(logits_soft_cap));
  return specs;
}

class PyCascade {
 public:
  PyCascade(const std::string& q_dtype, const std::string& kv_dtype, const std::string& o_dtype, int head_dim,
            int num_qo_heads, int num_kv_heads, int page_size, const std::string& layout, int num_levels, bool causal,
            int64_t max_batch, int64_t max_total_q, int64_t max_pages, uintptr_t ws_ptr, size_t ws_bytes,
            uintptr_t host_ptr, size_t host_bytes, int device, int backend, double logits_soft_cap)
      : ws_(reinterpret_cast<void*>(ws_ptr), ws_bytes, reinterpret_cast<void*>(host_ptr), host_bytes, device),
        cascade_(level_specs(q_dtype, kv_dtype, o_dtype, head_dim, num_levels, causal, logits_soft_cap),
                 prefill_task(num_qo_heads, num_kv_heads, page_size, layout, max_batch, max_total_q, max_pages), ws_,
                 prefill_options(0, 0, backend)),
        layout_(parse_kv_layout(layout.c_str())), kv_dtype_(parse_dtype("kv_dtype", kv_dtype)) {}

  template <bool Min>
  static std::tuple<size_t, size_t> sizes(const std::string& q_dtype, const std::string& kv_dtype,
                                                   const std::string& o_dtype, int head_dim, int num_qo_heads,
                                                   int num_kv_heads, int page_size, const std::string& layout,
                                                   int num_levels, bool causal, int64_t max_batch, int64_t max_total_q,
                                                   int64_t max_pages, int num_sms, int device, int backend,
                                                   double logits_soft_cap) {
    if (num_sms <= 0) {
      if (!cuda::gpu_available()) throw CudaError("workspace_size: num_sms not given and " + cuda::no_gpu_reason());
      num_sms = cuda::device_info(device).sm_count;
    }
    const auto s = (Min ? CascadeAttention::min_workspace_size : CascadeAttention::workspace_size)(
        level_specs(q_dtype, kv_dtype, o_dtype, head_dim, num_levels, causal, logits_soft_cap),
        prefill_task(num_qo_heads, num_kv_heads, page_size, layout, max_batch, max_total_q, max_pages), num_sms,
        prefill_options(0, 0, backend));
    return {s.device_bytes, s.host_bytes};
  }

  // Per level (lists of equal length): host int32 qo_indptr, kv_indptr (pages),
  // kv_indices, kv_last_page_len. A level's kv_indices may instead be a
  // (ptr, count, device) tuple: page ids that stay on the GPU
  // (tessera._wrapper_util.DeviceIds, see device_ids_view).
  void plan(nb::list qo_indptr, nb::list kv_indptr, nb::list kv_indices, nb::list kv_last_page_len, uintptr_t stream) {
    const size_t n = nb::len(qo_indptr);
    if (nb::len(kv_indptr) != n || nb::len(kv_indices) != n || nb::len(kv_last_page_len) != n)
      throw InvalidArgument("plan: expected one qo_indptr, kv_indptr, kv_indices and kv_last_page_len per level");
    std::vector<PagedPlanArgs> args;
    args.reserve(n);  // the spans below point into these
    std::vector<TensorView> device_ids(n);  // and the levels into these
    std::vector<CascadeLevel> levels;
    for (size_t i = 0; i < n; ++i) {
      const nb::handle ids = kv_indices[i];
      const bool on_device = nb::isinstance<nb::tuple>(ids);
      if (on_device) {
        const nb::tuple t = nb::borrow<nb::tuple>(ids);
        if (nb::len(t) < 3) throw InvalidArgument("kv_indices: expected a host array or a (ptr, count, device) tuple");
        device_ids[i] = device_ids_view(nb::cast<uintptr_t>(t[0]), nb::cast<int64_t>(t[1]), nb::cast<int>(t[2]));
      }
      args.emplace_back(qo_indptr[i], kv_indptr[i], on_device ? nb::handle(kv_indptr[i]) : ids, kv_last_page_len[i],
                        nb::none());
      levels.push_back({args.back().qo_s, args.back().ip_s, on_device ? std::span<const int32_t>() : args.back().idx_s,
                        args.back().last_s, on_device ? &device_ids[i] : nullptr});
    }
    nb::gil_scoped_release release;
    cascade_.plan(levels, to_stream(stream));
  }

  // Planning on the GPU: per level, int32 CUDA tensors batch_size [1],
  // qo_indptr and kv_indptr [max_batch + 1], kv_indices [max_pages],
  // kv_last_page_len [max_batch] (CascadeAttention::plan_on_device).
  void plan_on_device(nb::list batch_size, nb::list qo_indptr, nb::list kv_indptr, nb::list kv_indices,
                      nb::list kv_last_page_len, uintptr_t stream) {
    const size_t n = nb::len(qo_indptr);
    if (nb::len(batch_size) != n || nb::len(kv_indptr) != n || nb::len(kv_indices) != n ||
        nb::len(kv_last_page_len) != n)
      throw InvalidArgument("plan_on_device: expected one batch_size, qo_indptr, kv_indptr, kv_indices and "
                            "kv_last_page_len per level");
    std::vector<std::unique_ptr<DeviceBatchArgs>> args;  // keep the tensors alive while planning
    std::vector<DeviceBatch> levels;
    for (size_t i = 0; i < n; ++i) {
      args.push_back(std::make_unique<DeviceBatchArgs>(batch_size[i], qo_indptr[i], kv_indptr[i], kv_indices[i],
                                                       kv_last_page_len[i]));
      levels.push_back(args.back()->batch);
    }
    nb::gil_scoped_release release;
    cascade_.plan_on_device(levels, to_stream(stream));
  }

  // k_scale / v_scale (floats) and k_scale_tensor / v_scale_tensor (1-element
  // float32 CUDA tensors, None: none): an fp8 cache's dequantization scales,
  // applied by every level (a merge of states scaled alike is scaled alike).
  void run(nb::handle q, nb::handle k, nb::handle v, nb::handle o, nb::handle lse, double sm_scale, uintptr_t stream,
           double k_scale, double v_scale, nb::handle k_scale_tensor, nb::handle v_scale_tensor) {
    PagedRunArgs a(q, k, v, o, lse, sm_scale, layout_, v_scale, kv_dtype_);
    const ScaleArgs scales(k_scale_tensor, v_scale_tensor);
    scales.apply(a.opt, k_scale, v_scale);
    nb::gil_scoped_release release;
    cascade_.run(a.q.view, a.storage, a.o.view, a.lse.view, to_stream(stream), a.opt);
  }

  double last_plan_us() const { return cascade_.last_plan_us(); }

 private:
  Workspace ws_;  // declared before cascade_, which keeps a pointer to it
  CascadeAttention cascade_;
  KVLayout layout_;
  DType kv_dtype_;  // an fp8 cache may come as uint8 views (retag_fp8)
};

using I32Array = nb::ndarray<nb::numpy, int32_t>;

// Hands a vector to numpy without a copy: the capsule owns it.
I32Array owned(std::vector<int32_t>&& data, std::initializer_list<size_t> shape) {
  auto* buf = new std::vector<int32_t>(std::move(data));
  nb::capsule owner(buf, [](void* p) noexcept { delete static_cast<std::vector<int32_t>*>(p); });
  return I32Array(buf->data(), shape, owner);
}

nb::tuple level_arrays(PrefixLevel&& l) {
  const size_t groups = l.kv_last_page_len.size(), ids = l.kv_indices.size();
  return nb::make_tuple(owned(std::move(l.qo_indptr), {groups + 1}), owned(std::move(l.kv_indptr), {groups + 1}),
                        owned(std::move(l.kv_indices), {ids}), owned(std::move(l.kv_last_page_len), {groups}));
}

// Host int32 arrays in (qo_indptr None for decode); a dict out: split,
// grouped, saved_pages, groups [G, 3] (first, size, shared_pages), identity_order,
// order, row_order, shared / unique (qo_indptr, kv_indptr, kv_indices,
// kv_last_page_len) and host_us.
nb::dict py_find_shared_prefixes(nb::handle kv_indptr, nb::handle kv_indices, nb::handle kv_last_page_len,
                                 int page_size, nb::handle qo_indptr, int min_shared_pages, int64_t min_saved_pages,
                                 bool causal, bool keep_order, bool always_levels, int min_members) {
  const Arg ip = to_arg("kv_indptr", kv_indptr), idx = to_arg("kv_indices", kv_indices),
            last = to_arg("kv_last_page_len", kv_last_page_len), qo = to_optional_arg("qo_indptr", qo_indptr);
  SharedPrefixOptions opt;
  opt.min_shared_pages = min_shared_pages;
  opt.min_saved_pages = min_saved_pages;
  opt.causal = causal;
  opt.keep_order = keep_order;
  opt.always_levels = always_levels;
  opt.min_members = min_members;
  SharedPrefixSplit sp;
  {
    const auto ip_s = host_ints("kv_indptr", ip), idx_s = host_ints("kv_indices", idx),
               last_s = host_ints("kv_last_page_len", last);
    const auto qo_s = qo_indptr.is_none() ? std::span<const int32_t>() : host_ints("qo_indptr", qo);
    nb::gil_scoped_release release;
    find_shared_prefixes(ip_s, idx_s, last_s, page_size, qo_s, opt, sp);
  }
  std::vector<int32_t> groups;
  groups.reserve(3 * sp.groups.size());
  for (const SharedPrefixGroup& g : sp.groups) groups.insert(groups.end(), {g.first, g.size, g.shared_pages});
  nb::dict d;
  d["split"] = sp.split;
  d["grouped"] = sp.grouped;
  d["saved_pages"] = sp.saved_pages;
  d["groups"] = owned(std::move(groups), {sp.groups.size(), 3});
  d["identity_order"] = sp.identity_order;
  const size_t n = sp.order.size(), rows = sp.row_order.size();
  d["order"] = owned(std::move(sp.order), {n});
  d["row_order"] = owned(std::move(sp.row_order), {rows});
  d["shared"] = level_arrays(std::move(sp.shared));
  d["unique"] = level_arrays(std::move(sp.unique));
  d["host_us"] = sp.host_us;
  return d;
}

}  // namespace

void bind_cascade(nb::module_& m) {
  m.def("find_shared_prefixes", &py_find_shared_prefixes, "kv_indptr"_a, "kv_indices"_a, "kv_last_page_len"_a,
        "page_size"_a, "qo_indptr"_a.none() = nb::none(), "min_shared_pages"_a = 1, "min_saved_pages"_a = 1,
        "causal"_a = false, "keep_order"_a = false, "always_levels"_a = false, "min_members"_a = 2,
        "Shared prefixes of a page table (host int32 arrays; qo_indptr None: decode) and, when worth it, their two "
        "cascade levels (tessera/formats/shared_prefix.hpp): a dict.");
  nb::class_<PyCascade> cascade(m, "CascadeAttention",
                                "Levels of one paged KV cache (shared prefixes, unique suffixes) merged through the "
                                "attention state: plan per step, run per layer.");
  def_workspace_sizes(cascade, &PyCascade::sizes<false>, &PyCascade::sizes<true>, "q_dtype"_a, "kv_dtype"_a,
                      "o_dtype"_a, "head_dim"_a, "num_qo_heads"_a, "num_kv_heads"_a, "page_size"_a, "layout"_a,
                      "num_levels"_a, "causal"_a, "max_batch"_a, "max_total_q"_a, "max_pages"_a, "num_sms"_a = 0,
                      "device"_a = 0, "backend"_a = 0, "logits_soft_cap"_a = 0.0);
  cascade.def(nb::init<const std::string&, const std::string&, const std::string&, int, int, int, int, const std::string&,
                    int, bool, int64_t, int64_t, int64_t, uintptr_t, size_t, uintptr_t, size_t, int, int, double>(),
           "q_dtype"_a, "kv_dtype"_a, "o_dtype"_a, "head_dim"_a, "num_qo_heads"_a, "num_kv_heads"_a, "page_size"_a,
           "layout"_a, "num_levels"_a, "causal"_a, "max_batch"_a, "max_total_q"_a, "max_pages"_a, "workspace_ptr"_a,
           "workspace_bytes"_a, "host_ptr"_a, "host_bytes"_a, "device"_a, "backend"_a = 0, "logits_soft_cap"_a = 0.0,
           "Borrows a device workspace (256-byte aligned) and a pinned host buffer; causal applies to the last level.")
      .def("plan", &PyCascade::plan, "qo_indptr"_a, "kv_indptr"_a, "kv_indices"_a, "kv_last_page_len"_a,
           "stream"_a = 0, "Plans a step: per level, host int32 arrays as BatchPrefill.plan_paged takes them.")
      .def("plan_on_device", &PyCascade::plan_on_device, "batch_size"_a, "qo_indptr"_a, "kv_indptr"_a,
           "kv_indices"_a, "kv_last_page_len"_a, "stream"_a = 0,
           "Plans a step on the GPU: per level, int32 CUDA tensors batch_size [1], qo_indptr and kv_indptr "
           "[max_batch + 1], kv_indices [max_pages], kv_last_page_len [max_batch], read when the planners run. "
           "run() then takes q, o, lse of max_total_q rows.")
      .def("run", &PyCascade::run, "q"_a, "k"_a, "v"_a.none(), "o"_a, "lse"_a.none(), "sm_scale"_a = -1.0,
           "stream"_a = 0, "k_scale"_a = 1.0, "v_scale"_a = 1.0, "k_scale_tensor"_a.none() = nb::none(),
           "v_scale_tensor"_a.none() = nb::none(),
           "Runs every level and merges them into o (and lse, base 2, when given); the scales dequantize an fp8 "
           "cache (tensors: 1-element float32 on the GPU, read at run time).")
      .def_prop_ro("last_plan_us", &PyCascade::last_plan_us);
}

}  // namespace tessera::python
