// Python binding of BatchMLA (multi-head latent attention; api/mla.hpp), the
// native side of tessera.mla.BatchMLAPagedAttentionWrapper.
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>

#include "binding_util.hpp"
#include "tessera/api/mla.hpp"
#include "tessera/runtime/cuda.hpp"

namespace nb = nanobind;
using namespace nb::literals;

namespace tessera::python {

namespace {

MLATask mla_task(const std::string& q_dtype, const std::string& kv_dtype, int num_heads, int head_dim_ckv,
                 int head_dim_kpe, int page_size, bool causal, int64_t max_batch, int64_t max_total_q,
                 int64_t max_pages) {
  MLATask t;
  t.q_dtype = parse_dtype("q_data_type", q_dtype);
  t.kv_dtype = parse_dtype("kv_data_type", kv_dtype);
  t.num_heads = num_heads;
  t.head_dim_ckv = head_dim_ckv;
  t.head_dim_kpe = head_dim_kpe;
  t.page_size = page_size;
  t.causal = causal;
  t.max_batch = max_batch;
  t.max_total_q = max_total_q;
  t.max_pages = max_pages;
  return t;
}

MlaBackend mla_backend(const std::string& backend) {
  if (backend == "auto") return MlaBackend::kAuto;
  if (backend == "fa2") return MlaBackend::kFA2;
  if (backend == "fa3") return MlaBackend::kFA3;
  throw InvalidArgument("backend: expected 'auto', 'fa2' or 'fa3', got '" + backend + "'");
}

MLAOptions mla_options(int cta_q, int max_sms, bool split_kv, const std::string& backend) {
  MLAOptions o;
  o.backend = mla_backend(backend);
  o.cta_q = cta_q;
  o.max_sms = max_sms;
  o.planner.split_kv = split_kv;
  return o;
}

class PyBatchMLA {
 public:
  PyBatchMLA(const std::string& q_dtype, const std::string& kv_dtype, int num_heads, int head_dim_ckv,
             int head_dim_kpe, int page_size, bool causal, int64_t max_batch, int64_t max_total_q, int64_t max_pages,
             uintptr_t ws_ptr, size_t ws_bytes, uintptr_t host_ptr, size_t host_bytes, int device, int cta_q,
             int max_sms, bool split_kv, const std::string& backend)
      : ws_(reinterpret_cast<void*>(ws_ptr), ws_bytes, reinterpret_cast<void*>(host_ptr), host_bytes, device),
        mla_(mla_task(q_dtype, kv_dtype, num_heads, head_dim_ckv, head_dim_kpe, page_size, causal, max_batch,
                      max_total_q, max_pages),
             ws_, mla_options(cta_q, max_sms, split_kv, backend)) {}

  template <bool Min>
  static std::tuple<size_t, size_t> sizes(const std::string& q_dtype, const std::string& kv_dtype, int num_heads,
                                          int head_dim_ckv, int head_dim_kpe, int page_size, bool causal,
                                          int64_t max_batch, int64_t max_total_q, int64_t max_pages, int num_sms,
                                          int device, int cta_q, int max_sms, bool split_kv,
                                          const std::string& backend) {
    const MLATask t = mla_task(q_dtype, kv_dtype, num_heads, head_dim_ckv, head_dim_kpe, page_size, causal, max_batch,
                               max_total_q, max_pages);
    if (num_sms <= 0) {
      if (!cuda::gpu_available()) throw CudaError("workspace_size: num_sms not given and " + cuda::no_gpu_reason());
      num_sms = cuda::device_info(device).sm_count;
    }
    const auto s = (Min ? BatchMLA::min_workspace_size : BatchMLA::workspace_size)(
        t, num_sms, mla_options(cta_q, max_sms, split_kv, backend));
    return {s.device_bytes, s.host_bytes};
  }

  // Host int32 arrays; kv_indices host too.
  void plan(nb::handle qo_indptr, nb::handle kv_indptr, nb::handle kv_indices, nb::handle kv_len_arr,
            uintptr_t stream) {
    Arg qo = to_arg("qo_indptr", qo_indptr), ip = to_arg("kv_indptr", kv_indptr), ix = to_arg("kv_indices", kv_indices);
    Arg ln = to_arg("kv_len_arr", kv_len_arr);
    const auto qo_s = host_ints("qo_indptr", qo), ip_s = host_ints("kv_indptr", ip), ix_s = host_ints("kv_indices", ix);
    const auto ln_s = host_ints("kv_len_arr", ln);
    nb::gil_scoped_release release;
    mla_.plan(qo_s, ip_s, ix_s, ln_s, to_stream(stream));
  }
  // Page ids on the GPU: count int32 at ids_ptr on CUDA device `device`.
  void plan_device(nb::handle qo_indptr, nb::handle kv_indptr, uintptr_t ids_ptr, int64_t count, int device,
                   nb::handle kv_len_arr, uintptr_t stream) {
    Arg qo = to_arg("qo_indptr", qo_indptr), ip = to_arg("kv_indptr", kv_indptr), ln = to_arg("kv_len_arr", kv_len_arr);
    const auto qo_s = host_ints("qo_indptr", qo), ip_s = host_ints("kv_indptr", ip), ln_s = host_ints("kv_len_arr", ln);
    const TensorView ids = device_ids_view(ids_ptr, count, device);
    nb::gil_scoped_release release;
    mla_.plan(qo_s, ip_s, ids, ln_s, to_stream(stream));
  }

  void run(nb::handle q_nope, nb::handle q_pe, nb::handle ckv, nb::handle kpe, nb::handle o, nb::handle lse,
           double sm_scale, uintptr_t stream, bool pdl, double ckv_scale, double kpe_scale) {
    Arg qn = to_arg("q_nope", q_nope), qp = to_arg("q_pe", q_pe), c = to_arg("ckv_cache", ckv),
        k = to_arg("kpe_cache", kpe), oa = to_arg("out", o, true), la = to_optional_arg("lse", lse, true);
    MLARunOptions opt;
    opt.sm_scale = sm_scale;
    opt.pdl = pdl;
    opt.ckv_scale = ckv_scale;
    opt.kpe_scale = kpe_scale;
    nb::gil_scoped_release release;
    mla_.run(qn.view, qp.view, c.view, k.view, oa.view, la.view, to_stream(stream), opt);
  }

  int cta_q() const { return mla_.ctas() ? mla_.config().cta_q : 0; }
  bool hopper() const { return mla_.ctas() && mla_.config().hopper; }
  int ctas() const { return mla_.ctas(); }
  int num_split() const { return mla_.last_plan().num_split; }

 private:
  Workspace ws_;  // before mla_, which keeps a pointer to it
  BatchMLA mla_;
};

}  // namespace

void bind_mla(nb::module_& m) {
  nb::class_<PyBatchMLA> c(m, "BatchMLA", "Multi-head latent attention over a paged latent cache: plan per step, run per layer.");
  def_workspace_sizes(c, &PyBatchMLA::sizes<false>, &PyBatchMLA::sizes<true>, "q_dtype"_a, "kv_dtype"_a,
                      "num_heads"_a, "head_dim_ckv"_a, "head_dim_kpe"_a, "page_size"_a, "causal"_a, "max_batch"_a,
                      "max_total_q"_a, "max_pages"_a, "num_sms"_a = 0, "device"_a = 0, "cta_q"_a = 0, "max_sms"_a = 0,
                      "split_kv"_a = true, "backend"_a = "auto");
  c.def(nb::init<const std::string&, const std::string&, int, int, int, int, bool, int64_t, int64_t, int64_t, uintptr_t,
                 size_t, uintptr_t, size_t, int, int, int, bool, const std::string&>(),
        "q_dtype"_a, "kv_dtype"_a, "num_heads"_a, "head_dim_ckv"_a, "head_dim_kpe"_a, "page_size"_a, "causal"_a,
        "max_batch"_a, "max_total_q"_a, "max_pages"_a, "workspace_ptr"_a, "workspace_bytes"_a, "host_ptr"_a,
        "host_bytes"_a, "device"_a, "cta_q"_a = 0, "max_sms"_a = 0, "split_kv"_a = true, "backend"_a = "auto",
        "Borrows a device workspace (256-byte aligned) and a pinned host buffer; the caller keeps both alive.")
      .def("plan", &PyBatchMLA::plan, "qo_indptr"_a, "kv_indptr"_a, "kv_indices"_a, "kv_len_arr"_a, "stream"_a = 0,
           "Plans a step from host int32 arrays (kv_indptr in pages, kv_len_arr in tokens).")
      .def("plan_device", &PyBatchMLA::plan_device, "qo_indptr"_a, "kv_indptr"_a, "ids_ptr"_a, "count"_a, "device"_a,
           "kv_len_arr"_a, "stream"_a = 0, "Plans a step whose page ids stay on the GPU.")
      .def("run", &PyBatchMLA::run, "q_nope"_a, "q_pe"_a, "ckv_cache"_a, "kpe_cache"_a, "out"_a, "lse"_a.none(),
           "sm_scale"_a = -1.0, "stream"_a = 0, "pdl"_a = false, "ckv_scale"_a = 1.0, "kpe_scale"_a = 1.0,
           "q_nope [T, H, 512], q_pe [T, H, 64], ckv_cache [pages, page, 512], kpe_cache [pages, page, 64] -> out, lse.")
      .def_prop_ro("cta_q", &PyBatchMLA::cta_q, "Fused rows per query tile (0 before the first plan).")
      .def_prop_ro("hopper", &PyBatchMLA::hopper, "Whether the first plan chose the Hopper (sm_90a) kernel.")
      .def_prop_ro("ctas", &PyBatchMLA::ctas, "Persistent CTAs (0 before the first plan).")
      .def_prop_ro("num_split", &PyBatchMLA::num_split, "Split query tiles of the last plan.");
}

}  // namespace tessera::python
