// tessera._C: the low-level Python bindings over the C++ API.
//
// Every function takes all tensors explicitly, outputs included (the Python
// package allocates them with the caller's framework), plus an integer CUDA
// stream handle (0 = the legacy default stream). Nothing here allocates
// device memory, so the public Python layer decides about framework, device
// and dtype of every result. Optional tensors are passed as None.
//
// C++ exceptions map to Python as follows:
//   tessera::InvalidArgument -> ValueError
//   tessera::TypeMismatch    -> TypeError
//   tessera::CompileError    -> RuntimeError("CompileError: ...")
//   tessera::CudaError       -> RuntimeError("CudaError: ...")
#include <chrono>
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <cstdint>
#include <span>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "binding_util.hpp"
#include "tensor_convert.hpp"
#include "tessera/api/append_kv.hpp"
#include "tessera/api/attention.hpp"
#include "tessera/api/decode.hpp"
#include "tessera/api/merge.hpp"
#include "tessera/api/prefill.hpp"
#include "tessera/core/error.hpp"
#include "tessera/formats/bsr.hpp"
#include "tessera/formats/paged_kv.hpp"
#include "tessera/formats/ragged.hpp"
#include "tessera/runtime/cuda.hpp"
#include "tessera/runtime/jit.hpp"
#include "tessera/runtime/kernel_catalog.hpp"

namespace nb = nanobind;
using namespace nb::literals;

namespace tessera::python {
namespace {

VariantSpec parse_variant(const std::string& s) {
  if (s == "standard") return variants::standard();
  if (s == "causal") return variants::causal();
  throw InvalidArgument("variant: expected 'standard' or 'causal', got '" + s + "'");
}

// One translator for the whole hierarchy, most-derived classes first.
void translate(const std::exception_ptr& p, void*) {
  try {
    std::rethrow_exception(p);
  } catch (const InvalidArgument& e) {
    PyErr_SetString(PyExc_ValueError, e.what());
  } catch (const TypeMismatch& e) {
    PyErr_SetString(PyExc_TypeError, e.what());
  } catch (const CompileError& e) {
    PyErr_SetString(PyExc_RuntimeError, (std::string("CompileError: ") + e.what()).c_str());
  } catch (const CudaError& e) {
    PyErr_SetString(PyExc_RuntimeError, (std::string("CudaError: ") + e.what()).c_str());
  } catch (const Error& e) {
    PyErr_SetString(PyExc_RuntimeError, (std::string("TesseraError: ") + e.what()).c_str());
  }
  // Anything else propagates to nanobind's default translators.
}

// ---------------------------------------------------------------- merges
void py_merge_state(nb::handle v_a, nb::handle s_a, nb::handle v_b, nb::handle s_b, nb::handle v_out,
                    nb::handle s_out, uintptr_t stream, bool pdl) {
  Arg va = to_arg("v_a", v_a), sa = to_arg("s_a", s_a), vb = to_arg("v_b", v_b), sb = to_arg("s_b", s_b);
  Arg vo = to_arg("v_out", v_out, true), so = to_optional_arg("s_out", s_out, true);
  nb::gil_scoped_release release;
  merge_state(va.view, sa.view, vb.view, sb.view, vo.view, so.view, to_stream(stream), pdl);
}

void py_merge_state_in_place(nb::handle v, nb::handle s, nb::handle v_other, nb::handle s_other, nb::handle mask,
                             uintptr_t stream, bool pdl) {
  Arg va = to_arg("v", v, true), sa = to_arg("s", s, true);
  Arg vb = to_arg("v_other", v_other), sb = to_arg("s_other", s_other), m = to_optional_arg("mask", mask);
  nb::gil_scoped_release release;
  merge_state_in_place(va.view, sa.view, vb.view, sb.view, m.view, to_stream(stream), pdl);
}

void py_merge_states(nb::handle v, nb::handle s, nb::handle v_out, nb::handle s_out, uintptr_t stream,
                     bool pdl) {
  Arg va = to_arg("v", v), sa = to_arg("s", s);
  Arg vo = to_arg("v_out", v_out, true), so = to_optional_arg("s_out", s_out, true);
  nb::gil_scoped_release release;
  merge_states(va.view, sa.view, vo.view, so.view, to_stream(stream), pdl);
}

void py_merge_states_ragged(nb::handle v, nb::handle s, nb::handle indptr, nb::handle v_out, nb::handle s_out,
                            uintptr_t stream, bool pdl) {
  Arg va = to_arg("v", v), sa = to_arg("s", s), ip = to_arg("indptr", indptr);
  Arg vo = to_arg("v_out", v_out, true), so = to_optional_arg("s_out", s_out, true);
  nb::gil_scoped_release release;
  merge_states_ragged(va.view, sa.view, ip.view, vo.view, so.view, to_stream(stream), pdl);
}

// ---------------------------------------------------------------- attention
void py_single_decode(nb::handle q, nb::handle k, nb::handle v, nb::handle o, nb::handle lse,
                      const std::string& kv_layout, const std::string& variant, const std::string& q_dtype,
                      const std::string& kv_dtype, const std::string& o_dtype, int head_dim, double sm_scale,
                      uintptr_t stream, int window_left, double logits_soft_cap, int pos_encoding,
                      double rope_scale, double rope_theta, double v_scale, double k_scale, nb::handle k_scale_tensor,
                      nb::handle v_scale_tensor, nb::handle alibi_slopes) {
  AttentionSpec spec;
  spec.variant = variants::from_plan_options(parse_variant(variant).causal, window_left,
                                             static_cast<float>(logits_soft_cap), to_pos_encoding(pos_encoding));
  spec.q_dtype = parse_dtype("q_dtype", q_dtype);
  spec.kv_dtype = parse_dtype("kv_dtype", kv_dtype);
  spec.o_dtype = parse_dtype("o_dtype", o_dtype);
  spec.head_dim = head_dim;
  const KVLayout layout = parse_kv_layout(kv_layout.c_str());
  Arg qa = to_arg("q", q), ka = to_arg("k", k), va = to_arg("v", v);
  retag_fp8(ka, spec.kv_dtype);
  retag_fp8(va, spec.kv_dtype);
  Arg oa = to_arg("o", o, true), la = to_optional_arg("lse", lse, true);
  RunOptions opt;
  opt.sm_scale = sm_scale;
  const ScaleArgs scales(k_scale_tensor, v_scale_tensor);
  scales.apply(opt, k_scale, v_scale);
  const PosEncodingExtras extras(pos_encoding, rope_scale, rope_theta, alibi_slopes);
  opt.extras = extras.get();
  nb::gil_scoped_release release;
  single_decode(spec, qa.view, ka.view, va.view, layout, oa.view, la.view, to_stream(stream), opt);
}

// ---------------------------------------------------------------- paged KV cache
void py_append_paged_kv_cache(nb::handle append_key, nb::handle append_value, nb::handle batch_indices,
                              nb::handle positions, nb::handle k, nb::handle v, nb::handle kv_indices,
                              nb::handle kv_indptr, nb::handle kv_last_page_len, const std::string& kv_layout,
                              uintptr_t stream, const std::string& cache_dtype, const std::string& append_dtype,
                              double k_scale, double v_scale, nb::handle k_scale_tensor, nb::handle v_scale_tensor,
                              int64_t max_batch, int64_t max_indices) {
  const KVLayout layout = parse_kv_layout(kv_layout.c_str());
  Arg ak = to_arg("append_key", append_key), av = to_arg("append_value", append_value);
  Arg bi = to_arg("batch_indices", batch_indices), pos = to_arg("positions", positions);
  Arg ka = to_arg(v.is_none() ? "kv" : "k", k, true), va = to_optional_arg("v", v, true);
  Arg idx = to_arg("kv_indices", kv_indices), ptr = to_arg("kv_indptr", kv_indptr);
  Arg last = to_arg("kv_last_page_len", kv_last_page_len);
  // fp8 tensors come as uint8 views with their dtype named (retag_fp8).
  if (!cache_dtype.empty()) {
    retag_fp8(ka, parse_dtype("cache_dtype", cache_dtype));
    retag_fp8(va, parse_dtype("cache_dtype", cache_dtype));
  }
  if (!append_dtype.empty()) {
    retag_fp8(ak, parse_dtype("append_dtype", append_dtype));
    retag_fp8(av, parse_dtype("append_dtype", append_dtype));
  }
  const PagedKVStorage storage = to_storage(ka, va, !v.is_none(), layout);
  AppendOptions opt;
  opt.k_scale = k_scale;
  opt.v_scale = v_scale;
  Arg kt = to_optional_arg("k_scale", k_scale_tensor), vt = to_optional_arg("v_scale", v_scale_tensor);
  opt.k_scale_tensor = kt.view;
  opt.v_scale_tensor = vt.view;
  opt.max_batch = max_batch;
  opt.max_indices = max_indices;
  nb::gil_scoped_release release;
  append_paged_kv_cache(ak.view, av.view, bi.view, pos.view, storage, idx.view, ptr.view, last.view,
                        to_stream(stream), opt);
}


// BatchDecode over a borrowed workspace (the Python wrapper owns both buffers
// and keeps them alive as long as this object).
class PyBatchDecode {
 public:
  PyBatchDecode(const std::string& q_dtype, const std::string& kv_dtype, const std::string& o_dtype, int head_dim,
                int num_qo_heads, int num_kv_heads, int page_size, const std::string& layout, int64_t max_batch,
                int64_t max_pages, uintptr_t ws_ptr, size_t ws_bytes, uintptr_t host_ptr, size_t host_bytes,
                int device, bool split_kv, int max_sms, bool use_tensor_cores, int window_left, double logits_soft_cap,
                int pos_encoding, int tc_cta_q, bool cuda_cores, int fixed_chunk, int heads_per_thread,
                const PrefixArg& shared_prefix)
      : ws_(reinterpret_cast<void*>(ws_ptr), ws_bytes, reinterpret_cast<void*>(host_ptr), host_bytes, device),
        dec_(decode_spec(q_dtype, kv_dtype, o_dtype, head_dim, window_left, logits_soft_cap, pos_encoding),
             TaskInfo{num_qo_heads, num_kv_heads, page_size, parse_kv_layout(layout.c_str()), max_batch, max_pages}, ws_,
             options(split_kv, max_sms, use_tensor_cores, tc_cta_q, cuda_cores, fixed_chunk, heads_per_thread,
                     shared_prefix)),
        layout_(parse_kv_layout(layout.c_str())), pos_encoding_(pos_encoding),
        kv_dtype_(parse_dtype("kv_dtype", kv_dtype)) {}

  // shared_prefix: (min_shared_tokens > 0 turns DecodeOptions::shared_prefix on, min_members, min_saved_tokens).
  static DecodeOptions options(bool split_kv, int max_sms, bool use_tensor_cores, int tc_cta_q, bool cuda_cores,
                               int fixed_chunk, int heads_per_thread, const PrefixArg& shared_prefix) {
    DecodeOptions opt;
    opt.shared_prefix = auto_shared_prefix(shared_prefix);
    opt.heads_per_thread = heads_per_thread;
    opt.planner.fixed_chunk = fixed_chunk;
    opt.cuda_cores = cuda_cores;
    opt.planner.split_kv = split_kv;
    opt.max_sms = max_sms;
    opt.use_tensor_cores = use_tensor_cores;
    opt.tc_cta_q = tc_cta_q;
    return opt;
  }

  template <bool Min>
  static std::tuple<size_t, size_t> sizes(const std::string& q_dtype, const std::string& kv_dtype,
                                                   const std::string& o_dtype, int head_dim, int num_qo_heads,
                                                   int num_kv_heads, int page_size, const std::string& layout,
                                                   int64_t max_batch, int64_t max_pages, int num_sms, int device,
                                                   bool split_kv, int max_sms, bool use_tensor_cores, int window_left,
                                                   double logits_soft_cap, int pos_encoding, int tc_cta_q,
                                                   bool cuda_cores, int fixed_chunk, int heads_per_thread,
                                                   const PrefixArg& shared_prefix) {
    const TaskInfo task{num_qo_heads, num_kv_heads, page_size, parse_kv_layout(layout.c_str()), max_batch, max_pages};
    if (num_sms <= 0) {
      if (!cuda::gpu_available()) throw CudaError("workspace_size: num_sms not given and " + cuda::no_gpu_reason());
      num_sms = cuda::device_info(device).sm_count;
    }
    const auto s = (Min ? BatchDecode::min_workspace_size : BatchDecode::workspace_size)(
        decode_spec(q_dtype, kv_dtype, o_dtype, head_dim, window_left, logits_soft_cap, pos_encoding), task, num_sms,
        options(split_kv, max_sms, use_tensor_cores, tc_cta_q, cuda_cores, fixed_chunk, heads_per_thread,
                shared_prefix));
    return {s.device_bytes, s.host_bytes};
  }

  void plan(nb::handle kv_indptr, nb::handle kv_indices, nb::handle kv_last_page_len, uintptr_t stream) {
    Arg ip = to_arg("kv_indptr", kv_indptr), idx = to_arg("kv_indices", kv_indices);
    Arg last = to_arg("kv_last_page_len", kv_last_page_len);
    const auto ip_s = host_ints("kv_indptr", ip), idx_s = host_ints("kv_indices", idx);
    const auto last_s = host_ints("kv_last_page_len", last);
    nb::gil_scoped_release release;
    dec_.plan(ip_s, idx_s, last_s, to_stream(stream));
  }

  // Page ids that stay on the GPU: `count` contiguous int32 at ids_ptr on
  // CUDA device `device` (see device_ids_view).
  void plan_device(nb::handle kv_indptr, uintptr_t ids_ptr, int64_t count, int device, nb::handle kv_last_page_len,
                   uintptr_t stream) {
    const DevicePlanArgs a(nb::none(), kv_indptr, ids_ptr, count, device, kv_last_page_len);
    nb::gil_scoped_release release;
    dec_.plan(a.ip_s, a.ids, a.last_s, to_stream(stream));
  }

  // Planning on the GPU (api/device_batch.hpp): the planner kernel reads the
  // step from these int32 CUDA tensors when it runs; nothing is read here.
  void plan_on_device(nb::handle batch_size, nb::handle kv_indptr, nb::handle kv_indices,
                      nb::handle kv_last_page_len, uintptr_t stream) {
    const DeviceBatchArgs a(batch_size, nb::none(), kv_indptr, kv_indices, kv_last_page_len);
    nb::gil_scoped_release release;
    dec_.plan_on_device(a.batch, to_stream(stream));
  }

  void run(nb::handle q, nb::handle k, nb::handle v, nb::handle o, nb::handle lse, double sm_scale, uintptr_t stream,
           bool pdl, double rope_scale, double rope_theta, double v_scale, double k_scale, nb::handle k_scale_tensor,
           nb::handle v_scale_tensor, nb::handle alibi_slopes) {
    PagedRunArgs a(q, k, v, o, lse, sm_scale, layout_, v_scale, kv_dtype_);
    a.opt.pdl = pdl;
    const ScaleArgs scales(k_scale_tensor, v_scale_tensor);
    scales.apply(a.opt, k_scale, v_scale);
    const PosEncodingExtras extras(pos_encoding_, rope_scale, rope_theta, alibi_slopes);
    a.opt.extras = extras.get();
    nb::gil_scoped_release release;
    dec_.run(a.q.view, a.storage, a.o.view, a.lse.view, to_stream(stream), a.opt);
  }

  double last_plan_us() const { return dec_.last_plan_us(); }
  // DecodeOptions::shared_prefix: what the last plan found (a dict), else None.
  nb::object shared_prefix_stats() const { return shared_prefix_stats_dict(dec_.shared_prefix_stats()); }
  int ctas_per_head() const { return dec_.ctas_per_head(); }
  // With tensor cores every request is one query tile (the tile covers the
  // group), so split tiles are split requests.
  int num_split_requests() const {
    const BatchPrefill* tc = dec_.tensor_core_prefill();
    return tc ? tc->last_plan().num_split : dec_.last_plan().num_split_requests;
  }
  bool use_tensor_cores() const { return dec_.tensor_core_prefill() != nullptr; }

 private:
  Workspace ws_;     // declared before dec_, which keeps a pointer to it
  BatchDecode dec_;
  KVLayout layout_;
  int pos_encoding_;  // ROPE_LLAMA: run() passes rope_scale / rope_theta; ALIBI: alibi_slopes
  DType kv_dtype_;    // an fp8 cache may come as uint8 views (retag_fp8)
};


// ---------------------------------------------------------------- JIT
// Compiles every built-in kernel for `arch` (no GPU needed) and reports, per
// kernel, how long NVRTC took and whether the cubin came from the disk cache.
// progress: a line on stderr at most every 10 s while it runs (a cold cache
// takes minutes on a small machine, and a silent call looks hung).
nb::list py_compile_builtin(const std::string& arch, int threads, bool progress) {
  const jit::Arch target = jit::Arch::parse(arch);
  std::vector<jit::KernelSource> srcs = catalog::builtin_kernels();
  for (auto& k : catalog::builtin_prefill_kernels()) srcs.push_back(std::move(k));
  auto& cache = jit::KernelCache::global();
  std::vector<std::shared_ptr<const jit::Cubin>> cubins;
  {
    nb::gil_scoped_release release;
    const auto t0 = std::chrono::steady_clock::now();
    double last = 0;
    cache.precompile(srcs, target, threads, [&](size_t done, size_t total) {
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (!progress || done == total || s - last < 10) return;
      last = s;
      std::fprintf(stderr, "tessera: %s kernels %zu/%zu compiled or loaded, %.0f s\n", arch.c_str(), done, total, s);
    });
    for (const auto& src : srcs) cubins.push_back(cache.cubin(src, target));  // memory hits now
  }
  nb::list out;
  for (size_t i = 0; i < srcs.size(); ++i)
    out.append(nb::make_tuple(srcs[i].entry, cubins[i]->compile_ms, cubins[i]->from_disk));
  return out;
}

}  // namespace
}  // namespace tessera::python

NB_MODULE(_C, m) {
  using namespace tessera::python;
  bind_variants(m);  // bindings_variants.cpp
  bind_cascade(m);   // bindings_cascade.cpp
  bind_cpu(m);       // bindings_cpu.cpp
  bind_mla(m);       // bindings_mla.cpp
  m.doc() = "Low-level bindings of the Tessera C++ API (use the `tessera` package instead).";
  nb::register_exception_translator(translate);

  m.def("merge_state", &py_merge_state, "v_a"_a, "s_a"_a, "v_b"_a, "s_b"_a, "v_out"_a, "s_out"_a.none(),
        "stream"_a = 0, "pdl"_a = false,
        "(v_out, s_out) = (v_a, s_a) (+) (v_b, s_b); base-2 LSE, s_out may be None.");
  m.def("merge_state_in_place", &py_merge_state_in_place, "v"_a, "s"_a, "v_other"_a, "s_other"_a,
        "mask"_a.none(), "stream"_a = 0, "pdl"_a = false,
        "(v, s) <- (v, s) (+) (v_other, s_other) where mask (uint8/bool) is set.");
  m.def("merge_states", &py_merge_states, "v"_a, "s"_a, "v_out"_a, "s_out"_a.none(), "stream"_a = 0, "pdl"_a = false,
        "Merges v [rows, S, H, D], s [rows, S, H] over S into v_out [rows, H, D], s_out [rows, H].");
  m.def("merge_states_ragged", &py_merge_states_ragged, "v"_a, "s"_a, "indptr"_a, "v_out"_a, "s_out"_a.none(),
        "stream"_a = 0, "pdl"_a = false,
        "Merges states indptr[i]..indptr[i+1] of v [total, H, D] into row i of v_out.");
  m.def("single_decode", &py_single_decode, "q"_a, "k"_a, "v"_a, "o"_a, "lse"_a.none(), "kv_layout"_a,
        "variant"_a, "q_dtype"_a, "kv_dtype"_a, "o_dtype"_a, "head_dim"_a, "sm_scale"_a = -1.0, "stream"_a = 0,
        "window_left"_a = -1, "logits_soft_cap"_a = 0.0, "pos_encoding"_a = 0, "rope_scale"_a = 1.0,
        "rope_theta"_a = 1e4, "v_scale"_a = 1.0, "k_scale"_a = 1.0, "k_scale_tensor"_a.none() = nb::none(),
        "v_scale_tensor"_a.none() = nb::none(), "alibi_slopes"_a.none() = nb::none(),
        "GPU decode of one request with contiguous KV; sm_scale < 0 means 1/sqrt(head_dim); window_left / "
        "logits_soft_cap as FlashInfer's (-1 / 0: off); pos_encoding: 0 NONE, 1 ROPE_LLAMA, 2 ALIBI (with "
        "alibi_slopes, float32 [num_qo_heads] on the GPU); k_scale multiplies "
        "the softmax scale, v_scale the output (in the kernel's epilogue); the *_scale_tensor (1-element float32 "
        "CUDA tensors, read by the kernel) multiply them too. An fp8 kv_dtype may come as uint8 views of k, v.");
  m.def("append_paged_kv_cache", &py_append_paged_kv_cache, "append_key"_a, "append_value"_a, "batch_indices"_a,
        "positions"_a, "k"_a, "v"_a.none(), "kv_indices"_a, "kv_indptr"_a, "kv_last_page_len"_a, "kv_layout"_a,
        "stream"_a = 0, "cache_dtype"_a = "", "append_dtype"_a = "", "k_scale"_a = 1.0, "v_scale"_a = 1.0,
        "k_scale_tensor"_a.none() = nb::none(), "v_scale_tensor"_a.none() = nb::none(), "max_batch"_a = 0,
        "max_indices"_a = 0,
        "Writes rows [nnz, H, D] into the paged cache (k, v) or interleaved k (v None); int32 index tensors. "
        "16-bit rows into an fp8 cache are quantized (divided by the scales, saturated); cache_dtype / "
        "append_dtype name the fp8 type of uint8 views ('' : as given). max_batch / max_indices (CUDA; 0: the "
        "views' lengths): requests and kv_indices entries the kernel may read, within the buffers behind the views.");
  nb::class_<PyBatchDecode> decode(m, "BatchDecode",
                                   "Batch decode over a paged KV cache: plan() once per step, run() per layer.");
  def_workspace_sizes(decode, &PyBatchDecode::sizes<false>, &PyBatchDecode::sizes<true>, "q_dtype"_a, "kv_dtype"_a,
                      "o_dtype"_a, "head_dim"_a, "num_qo_heads"_a, "num_kv_heads"_a, "page_size"_a, "layout"_a,
                      "max_batch"_a, "max_pages"_a, "num_sms"_a = 0, "device"_a = 0, "split_kv"_a = true,
                      "max_sms"_a = 0, "use_tensor_cores"_a = false, "window_left"_a = -1, "logits_soft_cap"_a = 0.0,
                      "pos_encoding"_a = 0, "tc_cta_q"_a = 0, "cuda_cores"_a = false, "fixed_chunk"_a = 0,
                      "heads_per_thread"_a = 0, "shared_prefix"_a = PrefixArg{});
  decode.def(nb::init<const std::string&, const std::string&, const std::string&, int, int, int, int, const std::string&,
                    int64_t, int64_t, uintptr_t, size_t, uintptr_t, size_t, int, bool, int, bool, int, double, int,
                    int, bool, int, int, const PrefixArg&>(),
           "q_dtype"_a, "kv_dtype"_a, "o_dtype"_a, "head_dim"_a, "num_qo_heads"_a, "num_kv_heads"_a, "page_size"_a,
           "layout"_a, "max_batch"_a, "max_pages"_a, "workspace_ptr"_a, "workspace_bytes"_a, "host_ptr"_a,
           "host_bytes"_a, "device"_a, "split_kv"_a = true, "max_sms"_a = 0, "use_tensor_cores"_a = false,
           "window_left"_a = -1, "logits_soft_cap"_a = 0.0, "pos_encoding"_a = 0, "tc_cta_q"_a = 0,
           "cuda_cores"_a = false, "fixed_chunk"_a = 0, "heads_per_thread"_a = 0, "shared_prefix"_a = PrefixArg{},
           "Borrows a device workspace (256-byte aligned) and a pinned host buffer; the caller keeps both alive. "
           "rope: pos_encoding_mode ROPE_LLAMA (run() takes rope_scale / rope_theta). use_tensor_cores runs "
           "decode on the tensor-core prefill kernel (needs q_dtype == kv_dtype or an fp8 cache); tc_cta_q its "
           "query tile (0 heuristic, 8 for fp8 caches, 16, 32, 64 or 128). Neither flag: the wrapper picks "
           "(DecodeOptions); cuda_cores: the CUDA-core kernel. fixed_chunk > 0: batch-invariant KV chunks of "
           "that many keys. heads_per_thread "
           "(1..4, 0 heuristic): the CUDA-core kernel's query heads per thread (tuning). shared_prefix "
           "(min_shared_tokens, min_members, min_saved_tokens): the first > 0 turns on automatic shared prefixes "
           "(DecodeOptions::shared_prefix; a negative other keeps its default); needs the bounds and host page ids.")
      .def("plan_device", &PyBatchDecode::plan_device, "kv_indptr"_a, "ids_ptr"_a, "count"_a, "device"_a,
           "kv_last_page_len"_a, "stream"_a = 0,
           "Plans a step whose page ids stay on the GPU: count int32 at ids_ptr on CUDA device `device`, "
           "copied on the stream; the kernels check them and the next call raises a bad one.")
      .def("plan", &PyBatchDecode::plan, "kv_indptr"_a, "kv_indices"_a, "kv_last_page_len"_a, "stream"_a = 0,
           "Plans a step from host int32 arrays; uploads the schedule on `stream`.")
      .def("plan_on_device", &PyBatchDecode::plan_on_device, "batch_size"_a, "kv_indptr"_a, "kv_indices"_a,
           "kv_last_page_len"_a, "stream"_a = 0,
           "Plans on the GPU: enqueues the device planner on `stream`, which reads the step from int32 CUDA "
           "tensors on the workspace's device (batch_size [1], kv_indptr [max_batch + 1], kv_indices "
           "[max_pages], kv_last_page_len [max_batch]; only their first entries count) when it runs; nothing "
           "is read on the host, so it can be captured in a CUDA graph with run(). Needs the bounds max_batch "
           "and max_pages; run() then takes q and o of max_batch rows (rows past the step's batch are left as "
           "they are). A bad value in the tensors is raised (ValueError) by the next plan or run.")
      .def("run", &PyBatchDecode::run, "q"_a, "k"_a, "v"_a.none(), "o"_a, "lse"_a.none(), "sm_scale"_a = -1.0,
           "stream"_a = 0, "pdl"_a = false, "rope_scale"_a = 1.0, "rope_theta"_a = 1e4, "v_scale"_a = 1.0,
           "k_scale"_a = 1.0, "k_scale_tensor"_a.none() = nb::none(), "v_scale_tensor"_a.none() = nb::none(),
           "alibi_slopes"_a.none() = nb::none(),
           "Decode attention for the planned step; sm_scale < 0 means 1/sqrt(head_dim); pdl: programmatic "
           "dependent launch (sm_90+); k_scale multiplies the softmax scale, v_scale the output (in the kernel's "
           "epilogue); the *_scale_tensor (1-element float32 CUDA tensors, read by the kernel at run time, CUDA-core "
           "kernel only) multiply them too. An fp8 kv_dtype's cache may come as uint8 views.")
      .def_prop_ro("last_plan_us", &PyBatchDecode::last_plan_us, "Host time of the last plan() in microseconds.")
      .def_prop_ro("shared_prefix_stats", &PyBatchDecode::shared_prefix_stats,
                   "With shared_prefix: what the last plan found (groups, requests_in_groups, saved_pages, "
                   "detect_us, replanned), else None.")
      .def_prop_ro("ctas_per_head", &PyBatchDecode::ctas_per_head, "Persistent CTAs per KV head (0 before plan).")
      .def_prop_ro("num_split_requests", &PyBatchDecode::num_split_requests,
                   "Requests the last plan split over several CTAs.")
      .def_prop_ro("use_tensor_cores", &PyBatchDecode::use_tensor_cores,
                   "Whether decode runs on the tensor-core prefill kernel.");
  bind_prefill(m);  // bindings_prefill.cpp
  m.def("gpu_available", &tessera::cuda::gpu_available, "True when a usable CUDA device is present.");
  m.def("no_gpu_reason", &tessera::cuda::no_gpu_reason, "Why no GPU is usable ('' when one is).");
  m.def("device_count", &tessera::cuda::device_count, "Number of usable CUDA devices (0 without a driver).");
  m.def("compile_builtin", &py_compile_builtin, "arch"_a, "threads"_a = 0, "progress"_a = true,
        "JIT-compiles every built-in kernel for arch; returns [(entry, compile_ms, from_disk)].");
  m.def("add_kernel_pack", [](const std::string& dir) { tessera::jit::KernelCache::global().add_pack(dir); },
        "dir"_a, "Adds a directory of prebuilt cubins (a kernel pack) to the JIT's lookup.");
  m.def("kernel_packs", []() { return tessera::jit::KernelCache::global().packs(); },
        "The kernel packs the JIT looks in, in order.");
  m.def("cache_dir", []() { return tessera::jit::KernelCache::global().dir(); }, "The JIT disk cache directory.");
  m.def("nvrtc_version", &tessera::jit::nvrtc_version, "Version of the NVRTC library in use.");
}
