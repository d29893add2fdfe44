// tessera._C.BatchPrefill: the tensor-core batch prefill (paged, ragged and
// BSR KV; FA2 and Hopper templates) over a workspace the Python wrapper owns.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/unique_ptr.h>

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <tuple>

#include "binding_util.hpp"
#include "tensor_convert.hpp"
#include "tessera/api/prefill.hpp"
#include "tessera/api/prefill_pair.hpp"
#include "tessera/formats/bsr.hpp"
#include "tessera/runtime/cuda.hpp"
#include "tessera/runtime/kernel_catalog.hpp"

namespace nb = nanobind;
using namespace nb::literals;

namespace tessera::python {

namespace {

// One BatchPrefill run's arguments, converted and kept alive until launched:
// paged plans hold PagedRunArgs (q, the cache, o, lse), ragged ones q, k, v,
// o, lse; both the mask, the scale tensors and the position-encoding extras
// that args.opt points at.
struct StagedRun {
  explicit StagedRun(const BatchPrefill& w) : wrapper(&w) {}
  const BatchPrefill* wrapper;
  std::unique_ptr<PagedRunArgs> paged;
  Arg q, k, v, o, lse, mask, merge_lse;
  std::unique_ptr<ScaleArgs> scales;
  std::unique_ptr<PosEncodingExtras> extras;
  PrefillRunArgs args;

  void finish(nb::handle packed_custom_mask, RunOptions opt, bool pdl, double k_scale, double v_scale,
              nb::handle k_scale_tensor, nb::handle v_scale_tensor, int pos_encoding, double rope_scale,
              double rope_theta, nb::handle alibi_slopes) {
    mask = to_optional_arg("packed_custom_mask", packed_custom_mask);
    scales = std::make_unique<ScaleArgs>(k_scale_tensor, v_scale_tensor);
    extras = std::make_unique<PosEncodingExtras>(pos_encoding, rope_scale, rope_theta, alibi_slopes);
    opt.pdl = pdl;
    scales->apply(opt, k_scale, v_scale);
    opt.extras = extras->get();
    args.q = q.view;
    args.o = o.view;
    args.lse = lse.view;
    args.packed_custom_mask = mask.view;
    args.opt = opt;
  }
  // The wrapper's own run (GIL released by the caller).
  void launch(cudaStream_t stream) const {
    const TensorView* m = args.packed_custom_mask.defined() ? &args.packed_custom_mask : nullptr;
    if (args.kv) {
      if (m) wrapper->run(args.q, *args.kv, *m, args.o, args.lse, stream, args.opt);
      else wrapper->run(args.q, *args.kv, args.o, args.lse, stream, args.opt);
    } else if (m) {
      wrapper->run_ragged(args.q, args.k, args.v, *m, args.o, args.lse, stream, args.opt);
    } else {
      wrapper->run_ragged(args.q, args.k, args.v, args.o, args.lse, stream, args.opt);
    }
  }
};

// BatchPrefill over a borrowed workspace, like PyBatchDecode. One object
// serves one KV source kind per plan: plan_paged / plan_bsr pair with run(),
// plan_ragged with run_ragged() (the C++ side rejects a mismatch by name).
class PyBatchPrefill {
 public:
  PyBatchPrefill(const std::string& q_dtype, const std::string& kv_dtype, const std::string& o_dtype, int head_dim,
                 int num_qo_heads, int num_kv_heads, int page_size, const std::string& layout, bool causal,
                 int64_t max_batch, int64_t max_total_q, int64_t max_pages, uintptr_t ws_ptr, size_t ws_bytes,
                 uintptr_t host_ptr, size_t host_bytes, int device, int cta_q, int max_sms, int backend,
                 bool custom_mask, int window_left, double logits_soft_cap, int pos_encoding, const TileArg& tile,
                 int cluster, bool split_kv, int fixed_chunk, int64_t max_fixed_chunks, int head_dim_vo,
                 const PrefixArg& shared_prefix, bool fp8_mma, int group_heads)
      : ws_(reinterpret_cast<void*>(ws_ptr), ws_bytes, reinterpret_cast<void*>(host_ptr), host_bytes, device),
        pre_(spec(q_dtype, kv_dtype, o_dtype, head_dim, causal, custom_mask, window_left, logits_soft_cap,
                  pos_encoding, head_dim_vo),
             task(num_qo_heads, num_kv_heads, page_size, layout, max_batch, max_total_q, max_pages, max_fixed_chunks),
             ws_,
             prefill_options(cta_q, max_sms, backend, tile, cluster, split_kv, fixed_chunk, shared_prefix, fp8_mma,
                             group_heads)),
        layout_(parse_kv_layout(layout.c_str())), pos_encoding_(pos_encoding),
        kv_dtype_(parse_dtype("kv_dtype", kv_dtype)) {}

  // custom_mask: FlashInfer's custom mask, which replaces causal (a causal
  // part belongs in the mask itself). window_left / logits_soft_cap /
  // pos_encoding: FlashInfer's plan() options (-1 / 0 / 0: off), applied
  // on top of a custom mask when both are given. head_dim_vo: v's and o's head dim (0: head_dim's).
  static AttentionSpec spec(const std::string& q_dtype, const std::string& kv_dtype, const std::string& o_dtype,
                            int head_dim, bool causal, bool custom_mask, int window_left, double logits_soft_cap,
                            int pos_encoding, int head_dim_vo) {
    if (causal && custom_mask)
      throw InvalidArgument("causal: expected False with a custom mask (put the causal part into the mask)");
    AttentionSpec s = decode_spec(q_dtype, kv_dtype, o_dtype, head_dim);
    s.head_dim_vo = head_dim_vo;
    s.variant = variants::from_plan_options(causal, window_left, static_cast<float>(logits_soft_cap),
                                            to_pos_encoding(pos_encoding), custom_mask);
    return s;
  }
  static TaskInfo task(int num_qo_heads, int num_kv_heads, int page_size, const std::string& layout, int64_t max_batch,
                       int64_t max_total_q, int64_t max_pages, int64_t max_fixed_chunks = 0) {
    return prefill_task(num_qo_heads, num_kv_heads, page_size, layout, max_batch, max_total_q, max_pages,
                        max_fixed_chunks);
  }

  template <bool Min>
  static std::tuple<size_t, size_t> sizes(const std::string& q_dtype, const std::string& kv_dtype,
                                                   const std::string& o_dtype, int head_dim, int num_qo_heads,
                                                   int num_kv_heads, int page_size, const std::string& layout,
                                                   bool causal, int64_t max_batch, int64_t max_total_q,
                                                   int64_t max_pages, int num_sms, int device, int cta_q, int max_sms,
                                                   int backend, bool custom_mask, int window_left,
                                                   double logits_soft_cap, int pos_encoding, const TileArg& tile,
                                                   int cluster, bool split_kv, int fixed_chunk,
                                                   int64_t max_fixed_chunks, int head_dim_vo,
                                                   const PrefixArg& shared_prefix, bool fp8_mma, int group_heads) {
    const TaskInfo t =
        task(num_qo_heads, num_kv_heads, page_size, layout, max_batch, max_total_q, max_pages, max_fixed_chunks);
    if (num_sms <= 0) {
      if (!cuda::gpu_available()) throw CudaError("workspace_size: num_sms not given and " + cuda::no_gpu_reason());
      num_sms = cuda::device_info(device).sm_count;
    }
    const AttentionSpec sp = spec(q_dtype, kv_dtype, o_dtype, head_dim, causal, custom_mask, window_left,
                                  logits_soft_cap, pos_encoding, head_dim_vo);
    // BatchPrefill::workspace_size skips tile sizes other than cta_q, so an
    // invalid one would size nothing; reject it as the constructor would.
    if (cta_q) (void)catalog::prefill_config(sp, cta_q);
    const auto s = (Min ? BatchPrefill::min_workspace_size : BatchPrefill::workspace_size)(
        sp, t, num_sms,
        prefill_options(cta_q, max_sms, backend, tile, cluster, split_kv, fixed_chunk, shared_prefix, fp8_mma,
                        group_heads));
    return {s.device_bytes, s.host_bytes};
  }

  // mask_indptr (None: no custom mask): host int32 byte offsets of each
  // request's packed mask bits.
  void plan_paged(nb::handle qo_indptr, nb::handle kv_indptr, nb::handle kv_indices, nb::handle kv_last_page_len,
                  uintptr_t stream, nb::handle mask_indptr) {
    const PagedPlanArgs a(qo_indptr, kv_indptr, kv_indices, kv_last_page_len, mask_indptr);
    nb::gil_scoped_release release;
    if (!mask_indptr.is_none()) pre_.plan_paged(a.qo_s, a.ip_s, a.idx_s, a.last_s, a.mask_s, to_stream(stream));
    else pre_.plan_paged(a.qo_s, a.ip_s, a.idx_s, a.last_s, to_stream(stream));
  }

  // Page ids that stay on the GPU (as PyBatchDecode::plan_device).
  void plan_paged_device(nb::handle qo_indptr, nb::handle kv_indptr, uintptr_t ids_ptr, int64_t count, int device,
                         nb::handle kv_last_page_len, uintptr_t stream) {
    const DevicePlanArgs a(qo_indptr, kv_indptr, ids_ptr, count, device, kv_last_page_len);
    nb::gil_scoped_release release;
    pre_.plan_paged(a.qo_s, a.ip_s, a.ids, a.last_s, to_stream(stream));
  }

  // Planning on the GPU (as PyBatchDecode::plan_on_device); qo_indptr None:
  // one query per request.
  void plan_paged_on_device(nb::handle batch_size, nb::handle qo_indptr, nb::handle kv_indptr,
                            nb::handle kv_indices, nb::handle kv_last_page_len, uintptr_t stream) {
    const DeviceBatchArgs a(batch_size, qo_indptr, kv_indptr, kv_indices, kv_last_page_len);
    nb::gil_scoped_release release;
    pre_.plan_paged_on_device(a.batch, to_stream(stream));
  }

  // Ragged KV planned on the GPU: kv_indptr counts tokens, bounded by max_kv_tokens.
  void plan_ragged_on_device(nb::handle batch_size, nb::handle qo_indptr, nb::handle kv_indptr, int64_t max_kv_tokens,
                             uintptr_t stream) {
    const DeviceBatchArgs a(batch_size, qo_indptr, kv_indptr, nb::none(), nb::none());
    nb::gil_scoped_release release;
    pre_.plan_ragged_on_device(a.batch, max_kv_tokens, to_stream(stream));
  }

  void plan_ragged(nb::handle qo_indptr, nb::handle kv_indptr, uintptr_t stream, nb::handle mask_indptr) {
    Arg qo = to_arg("qo_indptr", qo_indptr), ip = to_arg("kv_indptr", kv_indptr);
    Arg mip = to_optional_arg("mask_indptr", mask_indptr);
    const auto qo_s = host_ints("qo_indptr", qo), ip_s = host_ints("kv_indptr", ip);
    const bool masked = !mask_indptr.is_none();
    const auto mip_s = masked ? host_ints("mask_indptr", mip) : std::span<const int32_t>();
    nb::gil_scoped_release release;
    if (masked) pre_.plan_ragged(qo_s, ip_s, mip_s, to_stream(stream));
    else pre_.plan_ragged(qo_s, ip_s, to_stream(stream));
  }

  // Every block row holds R queries and full column blocks of C tokens
  // (FlashInfer's BSR has no partial last block).
  void plan_bsr(nb::handle indptr, nb::handle indices, int64_t M, int64_t N, int R, int C, uintptr_t stream) {
    Arg ip = to_arg("indptr", indptr), idx = to_arg("indices", indices);
    const auto ip_s = host_ints("indptr", ip), idx_s = host_ints("indices", idx);
    nb::gil_scoped_release release;
    const BSRMatrix bsr(M, N, R, C, {ip_s.begin(), ip_s.end()}, {idx_s.begin(), idx_s.end()});
    pre_.plan_bsr(bsr, to_stream(stream));
  }

  // packed_custom_mask (None: no custom mask): the uint8 CUDA tensor of packed bits.
  void run(nb::handle q, nb::handle k, nb::handle v, nb::handle o, nb::handle lse, double sm_scale, uintptr_t stream,
           nb::handle packed_custom_mask, bool pdl, double rope_scale, double rope_theta, double v_scale,
           nb::handle alibi_slopes, double k_scale, nb::handle k_scale_tensor, nb::handle v_scale_tensor,
           nb::handle merge_lse) {
    const auto s = stage_run(q, k, v, o, lse, sm_scale, packed_custom_mask, pdl, rope_scale, rope_theta, v_scale,
                             alibi_slopes, k_scale, k_scale_tensor, v_scale_tensor);
    s->merge_lse = to_optional_arg("merge_lse", merge_lse);
    s->args.opt.merge_lse = s->merge_lse.view;
    nb::gil_scoped_release release;
    s->launch(to_stream(stream));
  }

  void run_ragged(nb::handle q, nb::handle k, nb::handle v, nb::handle o, nb::handle lse, double sm_scale,
                  uintptr_t stream, nb::handle packed_custom_mask, bool pdl, double rope_scale, double rope_theta,
                  double v_scale, nb::handle alibi_slopes, double k_scale, nb::handle k_scale_tensor,
                  nb::handle v_scale_tensor) {
    const auto s = stage_run_ragged(q, k, v, o, lse, sm_scale, packed_custom_mask, pdl, rope_scale, rope_theta,
                                    v_scale, alibi_slopes, k_scale, k_scale_tensor, v_scale_tensor);
    nb::gil_scoped_release release;
    s->launch(to_stream(stream));
  }

  // A run's converted arguments, launched now (run, run_ragged) or later
  // beside another wrapper's (PrefillPair).
  std::unique_ptr<StagedRun> stage_run(nb::handle q, nb::handle k, nb::handle v, nb::handle o, nb::handle lse,
                                       double sm_scale, nb::handle packed_custom_mask, bool pdl, double rope_scale,
                                       double rope_theta, double v_scale, nb::handle alibi_slopes, double k_scale,
                                       nb::handle k_scale_tensor, nb::handle v_scale_tensor) {
    auto s = std::make_unique<StagedRun>(pre_);
    s->paged = std::make_unique<PagedRunArgs>(q, k, v, o, lse, sm_scale, layout_, v_scale, kv_dtype_);
    s->q = s->paged->q;
    s->o = s->paged->o;
    s->lse = s->paged->lse;
    s->args.kv = &s->paged->storage;
    s->finish(packed_custom_mask, s->paged->opt, pdl, k_scale, v_scale, k_scale_tensor, v_scale_tensor,
              pos_encoding_, rope_scale, rope_theta, alibi_slopes);
    return s;
  }

  std::unique_ptr<StagedRun> stage_run_ragged(nb::handle q, nb::handle k, nb::handle v, nb::handle o, nb::handle lse,
                                              double sm_scale, nb::handle packed_custom_mask, bool pdl,
                                              double rope_scale, double rope_theta, double v_scale,
                                              nb::handle alibi_slopes, double k_scale, nb::handle k_scale_tensor,
                                              nb::handle v_scale_tensor) {
    auto s = std::make_unique<StagedRun>(pre_);
    s->q = to_arg("q", q);
    s->k = to_arg("k", k);
    s->v = to_arg("v", v);
    retag_fp8(s->k, kv_dtype_);
    retag_fp8(s->v, kv_dtype_);
    s->o = to_arg("o", o, true);
    s->lse = to_optional_arg("lse", lse, true);
    s->args.k = s->k.view;
    s->args.v = s->v.view;
    RunOptions opt;
    opt.sm_scale = sm_scale;
    s->finish(packed_custom_mask, opt, pdl, k_scale, v_scale, k_scale_tensor, v_scale_tensor, pos_encoding_,
              rope_scale, rope_theta, alibi_slopes);
    return s;
  }

  const BatchPrefill& native() const { return pre_; }

  double last_plan_us() const { return pre_.last_plan_us(); }
  nb::object shared_prefix_stats() const { return shared_prefix_stats_dict(pre_.shared_prefix_stats()); }
  // The query tile is only fixed by the first plan (ctas_per_head is 0 before).
  int cta_q() const { return pre_.ctas_per_group() ? pre_.config().cta_q : 0; }
  int kv_heads_per_cta() const { return pre_.ctas_per_group() ? pre_.config().kv_heads : 0; }
  int ctas_per_head() const { return pre_.ctas_per_group(); }
  int head_groups() const { return pre_.ctas_per_group() ? pre_.head_groups() : 0; }
  int cluster() const { return pre_.ctas_per_group() ? pre_.cluster() : 0; }
  bool hopper() const { return pre_.ctas_per_group() && pre_.config().hopper; }

 private:
  Workspace ws_;  // declared before pre_, which keeps a pointer to it
  BatchPrefill pre_;
  KVLayout layout_;
  int pos_encoding_;  // ROPE_LLAMA: run() passes rope_scale / rope_theta; ALIBI: alibi_slopes
  DType kv_dtype_;    // an fp8 cache may come as uint8 views (retag_fp8)
};

// Two PyBatchPrefills' staged runs in one launch (PrefillPair).
class PyPrefillPair {
 public:
  PyPrefillPair(const PyBatchPrefill& first, const PyBatchPrefill& second)
      : first_(&first.native()), second_(&second.native()), pair_(first.native(), second.native()) {}
  void run(const StagedRun& a, const StagedRun& b, uintptr_t stream) const {
    if (a.wrapper != first_ || b.wrapper != second_)
      throw InvalidArgument("run: expected runs staged by the pair's first and second wrappers, in that order");
    nb::gil_scoped_release release;
    pair_.run(a.args, b.args, to_stream(stream));
  }
  std::string entry() const { return pair_.kernel_source().entry; }

 private:
  const BatchPrefill* first_;
  const BatchPrefill* second_;
  PrefillPair pair_;
};

}  // namespace

void bind_prefill(nb::module_& m) {
  nb::class_<PyBatchPrefill> prefill(m, "BatchPrefill",
                                     "Tensor-core batch prefill over paged, ragged or BSR KV: plan per step, run per layer.");
  def_workspace_sizes(prefill, &PyBatchPrefill::sizes<false>, &PyBatchPrefill::sizes<true>, "q_dtype"_a, "kv_dtype"_a,
                      "o_dtype"_a, "head_dim"_a, "num_qo_heads"_a, "num_kv_heads"_a, "page_size"_a, "layout"_a,
                      "causal"_a, "max_batch"_a, "max_total_q"_a, "max_pages"_a, "num_sms"_a = 0, "device"_a = 0,
                      "cta_q"_a = 0, "max_sms"_a = 0, "backend"_a = 0, "custom_mask"_a = false, "window_left"_a = -1,
                      "logits_soft_cap"_a = 0.0, "pos_encoding"_a = 0, "tile"_a = TileArg{}, "cluster"_a = 0,
                      "split_kv"_a = true, "fixed_chunk"_a = 0, "max_fixed_chunks"_a = 0, "head_dim_vo"_a = 0,
                      "shared_prefix"_a = PrefixArg{}, "fp8_mma"_a = false, "group_heads"_a = 0);
  prefill.def(nb::init<const std::string&, const std::string&, const std::string&, int, int, int, int, const std::string&,
                    bool, int64_t, int64_t, int64_t, uintptr_t, size_t, uintptr_t, size_t, int, int, int, int, bool, int,
                    double, int, const TileArg&, int, bool, int, int64_t, int, const PrefixArg&, bool, int>(),
           "q_dtype"_a, "kv_dtype"_a, "o_dtype"_a, "head_dim"_a, "num_qo_heads"_a, "num_kv_heads"_a, "page_size"_a,
           "layout"_a, "causal"_a, "max_batch"_a, "max_total_q"_a, "max_pages"_a, "workspace_ptr"_a,
           "workspace_bytes"_a, "host_ptr"_a, "host_bytes"_a, "device"_a, "cta_q"_a = 0, "max_sms"_a = 0,
           "backend"_a = 0, "custom_mask"_a = false, "window_left"_a = -1, "logits_soft_cap"_a = 0.0,
           "pos_encoding"_a = 0, "tile"_a = TileArg{}, "cluster"_a = 0, "split_kv"_a = true, "fixed_chunk"_a = 0,
           "max_fixed_chunks"_a = 0, "head_dim_vo"_a = 0, "shared_prefix"_a = PrefixArg{}, "fp8_mma"_a = false,
           "group_heads"_a = 0,
           "Borrows a device workspace (256-byte aligned) and a pinned host buffer; the caller keeps both alive. "
           "causal selects the bottom-right causal variant; cta_q 0 lets the first plan choose the query tile; "
           "tile (cta_kv, warps_q, warps_kv, stages) overrides the heuristic's tile fields that are not 0; "
           "cluster 2 runs CTA pairs on the Hopper kernel where they apply (0 auto = off, 1 off); "
           "backend 0 auto, 1 fa2, 2 fa3 (Hopper); custom_mask selects the packed custom-mask variant "
           "(plan takes mask_indptr, run packed_custom_mask); split_kv false plans every request unsplit; "
           "fixed_chunk > 0 splits KV into chunks of that many keys, independent of the rest of the batch "
           "(max_fixed_chunks: TaskInfo's bound on their pieces per KV head); head_dim_vo: v's and o's head dim "
           "(0: head_dim; 128 with head_dim 192); shared_prefix: (min_shared_tokens, min_members, "
           "min_saved_tokens), the first > 0 turns on automatic shared prefixes (PrefillOptions::shared_prefix; a "
           "negative other keeps its default; host page ids, plan_paged only); fp8_mma: an fp8 cache's GEMMs on fp8 "
           "tensor cores (PrefillOptions::fp8_mma: q as two e4m3 terms, P as e4m3; head_dim 128, Hopper); "
           "group_heads: 0 auto (KV heads planned in groups that fill every SM for a first plan of long prompts on "
           "the Hopper kernel's 128-row tiles), 1 off (one plan per KV head), 2 on (PrefillOptions::group_heads).")
      .def("plan_paged_device", &PyBatchPrefill::plan_paged_device, "qo_indptr"_a, "kv_indptr"_a, "ids_ptr"_a,
           "count"_a, "device"_a, "kv_last_page_len"_a, "stream"_a = 0,
           "Plans a paged step whose page ids stay on the GPU (as BatchDecode.plan_device).")
      .def("plan_paged", &PyBatchPrefill::plan_paged, "qo_indptr"_a, "kv_indptr"_a, "kv_indices"_a,
           "kv_last_page_len"_a, "stream"_a = 0, "mask_indptr"_a.none() = nb::none(),
           "Plans a paged step from host int32 arrays (kv_indptr in pages; mask_indptr: byte offsets of the "
           "requests' packed masks, custom_mask objects only).")
      .def("plan_paged_on_device", &PyBatchPrefill::plan_paged_on_device, "batch_size"_a, "qo_indptr"_a.none(),
           "kv_indptr"_a, "kv_indices"_a, "kv_last_page_len"_a, "stream"_a = 0,
           "Plans a paged step on the GPU (as BatchDecode.plan_on_device): int32 CUDA tensors batch_size [1], "
           "qo_indptr [max_batch + 1] (None: one query per request), kv_indptr [max_batch + 1], kv_indices "
           "[max_pages], kv_last_page_len [max_batch]. Needs the bounds max_batch, max_total_q and max_pages; "
           "not for custom masks. run() then takes q and o of max_total_q rows (max_batch with qo_indptr None); "
           "rows past the step's queries are left as they are.")
      .def("plan_ragged_on_device", &PyBatchPrefill::plan_ragged_on_device, "batch_size"_a, "qo_indptr"_a.none(),
           "kv_indptr"_a, "max_kv_tokens"_a, "stream"_a = 0,
           "Plans a ragged step on the GPU: as plan_paged_on_device, kv_indptr counting tokens (at most "
           "max_kv_tokens); run_ragged() then takes k and v of at least max_kv_tokens rows.")
      .def("plan_ragged", &PyBatchPrefill::plan_ragged, "qo_indptr"_a, "kv_indptr"_a, "stream"_a = 0,
           "mask_indptr"_a.none() = nb::none(),
           "Plans a ragged step from host int32 arrays (kv_indptr in tokens; mask_indptr as for plan_paged).")
      .def("plan_bsr", &PyBatchPrefill::plan_bsr, "indptr"_a, "indices"_a, "M"_a, "N"_a, "R"_a, "C"_a,
           "stream"_a = 0, "Plans a block-sparse step: M x N matrix of R x C blocks (C must equal page_size).")
      .def("run", &PyBatchPrefill::run, "q"_a, "k"_a, "v"_a.none(), "o"_a, "lse"_a.none(), "sm_scale"_a = -1.0,
           "stream"_a = 0, "packed_custom_mask"_a.none() = nb::none(), "pdl"_a = false, "rope_scale"_a = 1.0,
           "rope_theta"_a = 1e4, "v_scale"_a = 1.0, "alibi_slopes"_a.none() = nb::none(), "k_scale"_a = 1.0,
           "k_scale_tensor"_a.none() = nb::none(), "v_scale_tensor"_a.none() = nb::none(),
           "merge_lse"_a.none() = nb::none(),
           "Paged or BSR run (for BSR, k/v are [N/C, C, Hkv, D] page views); sm_scale < 0: 1/sqrt(D); "
           "packed_custom_mask: uint8 CUDA bits (custom_mask objects only); pdl: programmatic dependent launch; "
           "merge_lse: float32 [rows, Hq] LSE of the state o holds, merged into instead of overwritten.")
      .def("run_ragged", &PyBatchPrefill::run_ragged, "q"_a, "k"_a, "v"_a, "o"_a, "lse"_a.none(),
           "sm_scale"_a = -1.0, "stream"_a = 0, "packed_custom_mask"_a.none() = nb::none(), "pdl"_a = false,
           "rope_scale"_a = 1.0, "rope_theta"_a = 1e4, "v_scale"_a = 1.0, "alibi_slopes"_a.none() = nb::none(),
           "k_scale"_a = 1.0, "k_scale_tensor"_a.none() = nb::none(), "v_scale_tensor"_a.none() = nb::none(),
           "Ragged run: k, v [total_kv, Hkv, D] (any row/head strides; fp8 caches may be uint8 views); "
           "packed_custom_mask, pdl and the scales as for run.")
      .def("stage_run", &PyBatchPrefill::stage_run, "q"_a, "k"_a, "v"_a.none(), "o"_a, "lse"_a.none(),
           "sm_scale"_a = -1.0, "packed_custom_mask"_a.none() = nb::none(), "pdl"_a = false, "rope_scale"_a = 1.0,
           "rope_theta"_a = 1e4, "v_scale"_a = 1.0, "alibi_slopes"_a.none() = nb::none(), "k_scale"_a = 1.0,
           "k_scale_tensor"_a.none() = nb::none(), "v_scale_tensor"_a.none() = nb::none(),
           "run()'s arguments (less the stream), converted for PrefillPair.run; launches nothing.")
      .def("stage_run_ragged", &PyBatchPrefill::stage_run_ragged, "q"_a, "k"_a, "v"_a, "o"_a, "lse"_a.none(),
           "sm_scale"_a = -1.0, "packed_custom_mask"_a.none() = nb::none(), "pdl"_a = false, "rope_scale"_a = 1.0,
           "rope_theta"_a = 1e4, "v_scale"_a = 1.0, "alibi_slopes"_a.none() = nb::none(), "k_scale"_a = 1.0,
           "k_scale_tensor"_a.none() = nb::none(), "v_scale_tensor"_a.none() = nb::none(),
           "run_ragged()'s arguments (less the stream), converted for PrefillPair.run; launches nothing.")
      .def_prop_ro("last_plan_us", &PyBatchPrefill::last_plan_us, "Host time of the last plan() in microseconds.")
      .def_prop_ro("shared_prefix_stats", &PyBatchPrefill::shared_prefix_stats,
                   "With shared_prefix: what the last plan found (a dict, as BatchDecode's), else None.")
      .def_prop_ro("cta_q", &PyBatchPrefill::cta_q, "Query rows per CTA tile (0 before the first plan).")
      .def_prop_ro("kv_heads_per_cta", &PyBatchPrefill::kv_heads_per_cta,
                   "Adjacent KV heads each CTA reads together (8-row fp8 tiles: 1 or 2; 0 before the first plan).")
      .def_prop_ro("head_groups", &PyBatchPrefill::head_groups,
                   "KV head groups of the persistent grid (the KV heads when each is its own group; 0 before plan).")
      .def_prop_ro("ctas_per_head", &PyBatchPrefill::ctas_per_head, "Persistent CTAs per head group (per KV head when each head is its own group; 0 before plan).")
      .def_prop_ro("hopper", &PyBatchPrefill::hopper,
                   "Whether the first plan chose the Hopper (wgmma) template (False before plan).")
      .def_prop_ro("cluster", &PyBatchPrefill::cluster,
                   "CTAs per cluster of the Hopper kernel (2: pairs sharing each K / V tile by TMA multicast; 0 before plan).");
  nb::class_<StagedRun>(m, "StagedPrefillRun", "A BatchPrefill run's converted arguments (stage_run, stage_run_ragged).");
  nb::class_<PyPrefillPair>(m, "PrefillPair",
                            "Two planned BatchPrefills in one persistent launch (POD-Attention).")
      .def(nb::init<const PyBatchPrefill&, const PyBatchPrefill&>(), "first"_a, "second"_a,
           nb::keep_alive<1, 2>(), nb::keep_alive<1, 3>(),
           "Both planned at least once, on one template (FA2, or the Hopper kernel with tiles of as many threads "
           "and CTAs per SM); loads the fused kernel.")
      .def("run", &PyPrefillPair::run, "first"_a, "second"_a, "stream"_a = 0,
           "Launches the two staged runs (first's, then second's queues on every CTA) on `stream`.")
      .def_prop_ro("entry", &PyPrefillPair::entry, "The fused kernel's name.");
}

}  // namespace tessera::python
