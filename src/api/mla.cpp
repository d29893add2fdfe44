// BatchMLA: plan / run of the MLA kernel family (device/kernels/mla/).
#include "tessera/api/mla.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "checks.hpp"
#include "tessera/abi/mla_params.cuh"
#include "tessera/formats/ragged.hpp"

namespace tessera {

using detail::str;

void validate_mla_task(const MLATask& t) {
  if (t.num_heads < 1) throw InvalidArgument("num_heads: expected >= 1, got " + str(t.num_heads));
  if (t.head_dim_ckv != kMlaDimCkv)
    throw InvalidArgument("head_dim_ckv: the MLA kernel takes 512 (DeepSeek's kv_lora_rank), got " + str(t.head_dim_ckv));
  if (t.head_dim_kpe != kMlaDimKpe)
    throw InvalidArgument("head_dim_kpe: the MLA kernel takes 64 (DeepSeek's qk_rope_head_dim), got " + str(t.head_dim_kpe));
  if (t.page_size < 1) throw InvalidArgument("page_size: expected >= 1, got " + str(t.page_size));
  auto half = [](DType d) { return d == DType::kFloat16 || d == DType::kBFloat16; };
  if (!half(t.q_dtype))
    throw TypeMismatch(std::string("q_data_type: expected float16 or bfloat16, got ") + dtype_name(t.q_dtype));
  if (t.kv_dtype != t.q_dtype && !is_fp8(t.kv_dtype))
    throw TypeMismatch(std::string("kv_data_type: expected q's dtype (") + dtype_name(t.q_dtype) +
                       ") or fp8 (float8_e4m3fn, float8_e5m2), got " + dtype_name(t.kv_dtype));
  if (t.max_batch < 0 || t.max_total_q < 0 || t.max_pages < 0)
    throw InvalidArgument("max_batch, max_total_q, max_pages: expected >= 0 (0: from the first plan)");
}

static void validate_options(const MLAOptions& opt) {
  if (opt.cta_q) (void)catalog::mla_config(opt.cta_q);
  if (opt.backend != MlaBackend::kAuto && opt.backend != MlaBackend::kFA2 && opt.backend != MlaBackend::kFA3)
    throw InvalidArgument("backend: expected kAuto, kFA2 or kFA3, got " + str(static_cast<int>(opt.backend)));
  if (opt.max_sms < 0) throw InvalidArgument("max_sms: expected >= 0 (0: all), got " + str(opt.max_sms));
  if (opt.planner.fixed_chunk != 0)
    throw InvalidArgument("planner.fixed_chunk: the MLA wrapper plans load-balanced chunks only; expected 0, got " +
                          str(opt.planner.fixed_chunk));
}

// fp8 caches are read by the Hopper kernel only (it widens them on chip).
static void check_fp8_backend(const MLATask& t, const MLAOptions& opt) {
  if (is_fp8(t.kv_dtype) && (opt.backend == MlaBackend::kFA2 ||
                             (opt.cta_q != 0 && opt.cta_q != kMlaSm90Rows && opt.cta_q != kMlaSm90NarrowRows)))
    throw TypeMismatch(std::string("kv_data_type: ") + dtype_name(t.kv_dtype) +
                       " latent caches need the Hopper kernel (backend fa3 or auto on sm_90, 16- or 64-row tiles)");
}

BatchMLA::BatchMLA(MLATask task, Workspace& workspace, MLAOptions opt) : task_(task), ws_(&workspace), opt_(opt) {
  validate_mla_task(task_);
  validate_options(opt_);
  check_fp8_backend(task_, opt_);
  config_ = catalog::mla_config(opt_.cta_q ? opt_.cta_q : 16);
}

BatchMLA::Layout BatchMLA::layout_for(const MLATask& task, int ctas, int cta_q, size_t device_bytes) {
  const int64_t tiles = prefill_max_tiles(task.max_total_q, task.max_batch, task.num_heads, cta_q);
  Layout l;
  l.max_items = prefill_max_items(tiles, ctas);
  l.max_split_tiles = max_split_tiles(ctas);
  WorkspaceLayout w;
  l.work_indptr = w.add(sizeof(int32_t) * (ctas + 1));
  l.items = w.add(sizeof(PrefillWorkItem) * l.max_items);
  l.first_items = w.add(sizeof(PrefillWorkItem) * ctas);
  l.indices = w.add(sizeof(int32_t) * std::max<int64_t>(task.max_pages, 1));  // last: a plan uploads only its ids
  l.staged = w.total();
  l.scratch = w.add(0);
  auto lay_out = [&](int64_t rows) {
    WorkspaceLayout s;
    l.max_slot_rows = rows;
    l.counters = l.scratch + s.add(sizeof(int32_t) * l.max_split_tiles);
    l.merge_words = l.scratch + s.add(sizeof(uint64_t) * l.max_split_tiles);
    l.partial_lse = l.scratch + s.add(sizeof(float) * rows);
    l.partial_o = l.scratch + s.add(sizeof(float) * rows * kMlaDimCkv);
    return l.total = l.scratch + s.total();
  };
  const int64_t ideal_tiles = max_split_slots(ctas);
  l.min_total = lay_out(0);
  l.ideal_total = lay_out(ideal_tiles * cta_q);
  if (device_bytes < l.min_total)
    throw InvalidArgument("workspace: expected at least " + str(l.min_total) + " device bytes (the minimum for these "
                          "bounds; " + str(l.ideal_total) + " hold every partial state of split-KV), got " +
                          str(device_bytes));
  lay_out(detail::largest_fitting(ideal_tiles, [&](int64_t k) { return lay_out(k * cta_q) <= device_bytes; }) * cta_q);
  return l;
}

static WorkspaceSizes mla_sizes(const MLATask& task, int num_sms, const MLAOptions& opt, bool ideal) {
  validate_mla_task(task);
  validate_options(opt);
  if (task.max_batch < 1 || task.max_total_q < 1 || task.max_pages < 1)
    throw InvalidArgument("task: expected max_batch, max_total_q and max_pages >= 1 to size the workspace");
  if (num_sms < 1) throw InvalidArgument("num_sms: expected >= 1, got " + str(num_sms));
  const int ctas = opt.max_sms > 0 ? std::min(opt.max_sms, num_sms) : num_sms;  // one CTA per SM
  WorkspaceSizes s;
  for (int q : {16, 32, 64}) {
    if (opt.cta_q && q != opt.cta_q) continue;
    const BatchMLA::Layout l = BatchMLA::layout_for(task, ctas, q);
    s.device_bytes = std::max(s.device_bytes, ideal ? l.ideal_total : l.min_total);
    s.host_bytes = std::max(s.host_bytes, l.staged);
  }
  return s;
}

WorkspaceSizes BatchMLA::workspace_size(const MLATask& task, int num_sms, const MLAOptions& opt) {
  return mla_sizes(task, num_sms, opt, true);
}
WorkspaceSizes BatchMLA::min_workspace_size(const MLATask& task, int num_sms, const MLAOptions& opt) {
  return mla_sizes(task, num_sms, opt, false);
}

// The page table against the lengths: kv_indptr [batch + 1] non-decreasing
// from 0, request i holding exactly ceil(kv_lens[i] / page_size) pages.
static void check_mla_lengths(std::span<const int32_t> qo_indptr, std::span<const int32_t> kv_indptr,
                              std::span<const int32_t> kv_lens, int page_size) {
  if (qo_indptr.empty()) throw InvalidArgument("qo_indptr: expected batch + 1 elements, got 0");
  validate_indptr("qo_indptr", qo_indptr);
  const int64_t batch = static_cast<int64_t>(qo_indptr.size()) - 1;
  if (static_cast<int64_t>(kv_indptr.size()) != batch + 1)
    throw InvalidArgument("kv_indptr: expected " + str(batch + 1) + " elements (like qo_indptr), got " +
                          str(kv_indptr.size()));
  validate_indptr("kv_indptr", kv_indptr);
  if (static_cast<int64_t>(kv_lens.size()) != batch)
    throw InvalidArgument("kv_len_arr: expected " + str(batch) + " lengths (one per request), got " + str(kv_lens.size()));
  for (int64_t i = 0; i < batch; ++i) {
    const int64_t len = kv_lens[i], pages = kv_indptr[i + 1] - kv_indptr[i];
    if (len < 0) throw InvalidArgument("kv_len_arr: expected lengths >= 0, got kv_len_arr[" + str(i) + "]=" + str(len));
    if (pages != (len + page_size - 1) / page_size)
      throw InvalidArgument("kv_indptr: request " + str(i) + " has " + str(pages) + " pages for " + str(len) +
                            " tokens (kv_len_arr) of page_size " + str(page_size) + "; expected " +
                            str((len + page_size - 1) / page_size));
  }
}

void BatchMLA::plan(std::span<const int32_t> qo_indptr, std::span<const int32_t> kv_indptr,
                    std::span<const int32_t> kv_indices, std::span<const int32_t> kv_lens, cudaStream_t stream) {
  page_errors_.raise_pending("kv_indices");
  check_mla_lengths(qo_indptr, kv_indptr, kv_lens, task_.page_size);
  if (static_cast<int64_t>(kv_indices.size()) != kv_indptr.back())
    throw InvalidArgument("kv_indices: expected kv_indptr[batch] = " + str(kv_indptr.back()) + " page ids, got " +
                          str(kv_indices.size()));
  int32_t hi = -1;
  for (size_t k = 0; k < kv_indices.size(); ++k) {
    if (kv_indices[k] < 0)
      throw InvalidArgument("kv_indices: expected page ids >= 0, got kv_indices[" + str(k) + "]=" + str(kv_indices[k]));
    hi = std::max(hi, kv_indices[k]);
  }
  plan_common(qo_indptr, kv_indptr, PageIds::from_host(kv_indices), kv_lens, stream);
  max_page_index_ = hi;
}

void BatchMLA::plan(std::span<const int32_t> qo_indptr, std::span<const int32_t> kv_indptr,
                    const TensorView& kv_indices, std::span<const int32_t> kv_lens, cudaStream_t stream) {
  page_errors_.raise_pending("kv_indices");
  check_mla_lengths(qo_indptr, kv_indptr, kv_lens, task_.page_size);
  const PageIds ids = detail::device_page_ids(kv_indices, kv_indptr, ws_->device());
  plan_common(qo_indptr, kv_indptr, ids, kv_lens, stream);
  max_page_index_ = -1;  // the kernel checks them
}

void BatchMLA::plan_common(std::span<const int32_t> qo_indptr, std::span<const int32_t> kv_indptr, const PageIds& ids,
                           std::span<const int32_t> kv_lens, cudaStream_t stream) {
  const int64_t batch = static_cast<int64_t>(qo_indptr.size()) - 1, total_q = qo_indptr.back();
  const int H = task_.num_heads;
  qo_lens_.resize(batch);
  for (int64_t i = 0; i < batch; ++i) qo_lens_[i] = qo_indptr[i + 1] - qo_indptr[i];
  if (kernel_) {  // bounds of the first plan's sections, checked before any GPU work
    if (batch > task_.max_batch)
      throw InvalidArgument("qo_indptr: batch size " + str(batch) + " exceeds the workspace bound max_batch=" +
                            str(task_.max_batch));
    if (total_q > task_.max_total_q)
      throw InvalidArgument("qo_indptr: total query length " + str(total_q) +
                            " exceeds the workspace bound max_total_q=" + str(task_.max_total_q));
    if (ids.count > task_.max_pages)
      throw InvalidArgument("kv_indices: " + str(ids.count) + " pages exceed the workspace bound max_pages=" +
                            str(task_.max_pages));
  }
  cuda::DeviceGuard guard(ws_->device());
  if (!kernel_) {  // first plan: template, tile, kernel, grid and sections
    const bool sm90 = jit::Arch::of_device(ws_->device()).major == 9;
    if (opt_.backend == MlaBackend::kFA3 && !sm90)
      throw InvalidArgument("backend: fa3 needs an sm_90 GPU (Hopper); use fa2 or auto");
    const bool hopper = opt_.backend == MlaBackend::kFA3 || (opt_.backend == MlaBackend::kAuto && sm90);
    if (is_fp8(task_.kv_dtype) && !hopper)
      throw TypeMismatch(std::string("kv_data_type: ") + dtype_name(task_.kv_dtype) +
                         " latent caches need the Hopper kernel, an sm_90 GPU");
    const double avg_rows = batch ? double(total_q) * H / batch : 1.0;
    if (hopper) {
      // 16-row tiles (one consumer, the transposed GEMMs) where a request's
      // rows fit one, 32-row ones (two such consumers on every KV tile,
      // 16-bit caches) where they fit those: no padded rows multiplied.
      // Longer requests take more tiles, which stays correct for later plans.
      const int q = opt_.cta_q                                               ? opt_.cta_q
                    : avg_rows <= kMlaSm90NarrowRows                         ? kMlaSm90NarrowRows
                    : avg_rows <= kMlaSm90PairRows && !is_fp8(task_.kv_dtype) ? kMlaSm90PairRows
                                                                              : kMlaSm90Rows;
      config_ = catalog::mla_sm90_config(q, is_fp8(task_.kv_dtype));
      source_ = catalog::batch_mla_sm90(task_.q_dtype, task_.kv_dtype, task_.causal, q);
    } else {
      const int cta_q = opt_.cta_q ? opt_.cta_q : catalog::choose_mla_cta_q(avg_rows);
      config_ = catalog::mla_config(cta_q);
      source_ = catalog::batch_mla(task_.q_dtype, cta_q, task_.causal);
    }
    const int cta_q = config_.cta_q;
    const auto pk = detail::load_persistent(source_, ws_->device(), config_.threads, config_.smem_bytes, 1, 1,
                                            opt_.max_sms, "BatchMLA::plan");
    kernel_ = pk.kernel;
    ctas_ = pk.ctas_per_head;
    if (task_.max_batch == 0) task_.max_batch = std::max<int64_t>(batch, 1);
    if (task_.max_total_q == 0) task_.max_total_q = std::max<int64_t>(total_q, 1);
    if (task_.max_pages == 0) task_.max_pages = std::max<int64_t>(ids.count, 1);
    if (batch > task_.max_batch || total_q > task_.max_total_q || ids.count > task_.max_pages)
      throw InvalidArgument("qo_indptr: the step exceeds the task's bounds (max_batch " + str(task_.max_batch) +
                            ", max_total_q " + str(task_.max_total_q) + ", max_pages " + str(task_.max_pages) + ")");
    layout_ = layout_for(task_, ctas_, cta_q, ws_->device_bytes());
    detail::check_workspace_size(*ws_, layout_.total, layout_.staged);
    (void)page_errors_.device_ptr();  // allocated here, not in run()
    char* dev = static_cast<char*>(ws_->device_ptr());
    // Merge counters and words start at zero; runs leave them at zero.
    TESSERA_CUDA_CHECK(cudaMemsetAsync(dev + layout_.counters, 0, sizeof(int32_t) * layout_.max_split_tiles, stream));
    TESSERA_CUDA_CHECK(
        cudaMemsetAsync(dev + layout_.merge_words, 0, sizeof(uint64_t) * layout_.max_split_tiles, stream));
  }

  PlannerOptions popt = opt_.planner;
  popt.chunk_align = std::max(popt.chunk_align, config_.cta_kv);  // chunks end on KV tile boundaries
  if (popt.unsplit_max_kv < 0) popt.unsplit_max_kv = 0;
  popt.unsplit_min_tiles = std::max(1, ctas_);
  const int64_t slot_cap = layout_.max_slot_rows / config_.cta_q;
  popt.max_slots = popt.max_slots > 0 ? std::min(popt.max_slots, slot_cap) : slot_cap;
  popt.max_split_tiles =
      popt.max_split_tiles > 0 ? std::min(popt.max_split_tiles, layout_.max_split_tiles) : layout_.max_split_tiles;
  if (slot_cap == 0) popt.split_kv = false;
  planner_.plan_prefill(qo_lens_, kv_lens, H, config_.cta_q, task_.causal, ctas_, popt, plan_);
  for (PrefillWorkItem& item : plan_.items) {
    const int64_t b = item.request;
    item.qo_begin = qo_indptr[b];
    item.qo_len = qo_lens_[b];
    item.kv_begin = kv_indptr[b];
    item.kv_len = kv_lens[b];
  }

  ws_->stage_begin();
  char* host = static_cast<char*>(ws_->host_ptr());
  std::memcpy(host + layout_.work_indptr, plan_.work_indptr.data(), sizeof(int32_t) * plan_.work_indptr.size());
  std::memcpy(host + layout_.items, plan_.items.data(), sizeof(PrefillWorkItem) * plan_.items.size());
  auto* first = reinterpret_cast<PrefillWorkItem*>(host + layout_.first_items);
  for (size_t x = 0; x + 1 < plan_.work_indptr.size(); ++x) {
    const int32_t i = plan_.work_indptr[x];
    first[x] = i < plan_.work_indptr[x + 1] ? plan_.items[i] : PrefillWorkItem{};
  }
  detail::upload_with_page_ids(*ws_, layout_.indices, ids, stream);
  batch_ = batch;
  total_q_ = total_q;
}

void BatchMLA::run(const TensorView& q_nope, const TensorView& q_pe, const TensorView& ckv_cache,
                   const TensorView& kpe_cache, const TensorView& o, const TensorView& lse, cudaStream_t stream,
                   const MLARunOptions& opt) const {
  if (batch_ < 0) throw InvalidArgument("run: expected plan() to be called first");
  page_errors_.raise_pending("kv_indices");
  const int64_t H = task_.num_heads, T = total_q_;
  const DType dt = task_.q_dtype;
  // Shapes and dtypes first, then devices and alignment.
  check_shape("q_nope", q_nope, {T, H, kMlaDimCkv});
  check_shape("q_pe", q_pe, {T, H, kMlaDimKpe});
  check_dim("ckv_cache", ckv_cache, 3);
  const int64_t pages = ckv_cache.size(0);
  check_shape("ckv_cache", ckv_cache, {pages, task_.page_size, kMlaDimCkv});
  check_shape("kpe_cache", kpe_cache, {pages, task_.page_size, kMlaDimKpe});
  check_shape("o", o, {T, H, kMlaDimCkv});
  if (detail::has(lse)) {
    check_shape("lse", lse, {T, H});
    check_dtype("lse", lse, DType::kFloat32);
    check_contiguous("lse", lse);
  }
  check_dtype("q_nope", q_nope, dt);
  check_dtype("q_pe", q_pe, dt);
  check_dtype("ckv_cache", ckv_cache, task_.kv_dtype);
  check_dtype("kpe_cache", kpe_cache, task_.kv_dtype);
  check_dtype("o", o, dt);
  if (max_page_index_ >= pages)
    throw InvalidArgument("kv_indices: the plan names page " + str(max_page_index_) + ", but ckv_cache holds " +
                          str(pages) + " pages");
  for (auto [name, t] : {std::pair{"q_nope", &q_nope}, {"q_pe", &q_pe}, {"ckv_cache", &ckv_cache},
                         {"kpe_cache", &kpe_cache}, {"o", &o}}) {
    detail::check_cuda_vectors(name, *t);
    check_same_device("q_nope", q_nope, name, *t);
  }
  if (detail::has(lse)) check_same_device("q_nope", q_nope, "lse", lse);
  if (o.stride(2) != 1 || o.stride(1) % 8 || o.stride(0) % 8) throw InvalidArgument("o: expected 16-byte aligned rows");
  detail::check_workspace_device(q_nope.device, ws_->device());
  const double scale = opt.sm_scale < 0 ? 1.0 / std::sqrt(double(kMlaDimCkv + kMlaDimKpe)) : opt.sm_scale;
  if (!(scale > 0) || !std::isfinite(scale))
    throw InvalidArgument("sm_scale: expected a finite value > 0, got " + std::to_string(opt.sm_scale));
  for (auto [name, v] : {std::pair{"ckv_scale", opt.ckv_scale}, {"kpe_scale", opt.kpe_scale}}) {
    if (!(v > 0) || !std::isfinite(v))
      throw InvalidArgument(std::string(name) + ": expected a finite value > 0, got " + std::to_string(v));
    if (!is_fp8(task_.kv_dtype) && v != 1.0)
      throw InvalidArgument(std::string(name) + ": dequantization scales are for fp8 caches; expected 1 for " +
                            dtype_name(task_.kv_dtype) + " caches, got " + std::to_string(v));
  }

  const char* dev = static_cast<const char*>(ws_->device_ptr());
  MlaParams p{};
  p.q_nope = q_nope.data;
  p.q_pe = q_pe.data;
  p.q_nope_stride_n = q_nope.stride(0);
  p.q_nope_stride_h = q_nope.stride(1);
  p.q_pe_stride_n = q_pe.stride(0);
  p.q_pe_stride_h = q_pe.stride(1);
  p.o = o.data;
  p.lse = detail::has(lse) ? static_cast<float*>(lse.data) : nullptr;
  p.o_stride_n = o.stride(0);
  p.o_stride_h = o.stride(1);
  p.ckv = ckv_cache.data;
  p.kpe = kpe_cache.data;
  p.ckv_page_stride = ckv_cache.stride(0);
  p.ckv_token_stride = ckv_cache.stride(1);
  p.kpe_page_stride = kpe_cache.stride(0);
  p.kpe_token_stride = kpe_cache.stride(1);
  p.kv_indices = reinterpret_cast<const int*>(dev + layout_.indices);
  p.page_size = task_.page_size;
  p.page_shift = detail::page_shift(task_.page_size);
  p.num_pages = static_cast<int>(std::min<int64_t>(pages, INT32_MAX));
  p.page_error = page_errors_.device_ptr();
  p.work_indptr = reinterpret_cast<const int*>(dev + layout_.work_indptr);
  p.work_items = reinterpret_cast<const PrefillWorkItem*>(dev + layout_.items);
  p.first_items = reinterpret_cast<const PrefillWorkItem*>(dev + layout_.first_items);
  p.partial_o = reinterpret_cast<float*>(const_cast<char*>(dev) + layout_.partial_o);
  p.partial_lse = reinterpret_cast<float*>(const_cast<char*>(dev) + layout_.partial_lse);
  p.counters = reinterpret_cast<int*>(const_cast<char*>(dev) + layout_.counters);
  p.merge_words = reinterpret_cast<u64*>(const_cast<char*>(dev) + layout_.merge_words);
  p.num_qo_heads = task_.num_heads;
  p.group = task_.num_heads;
  p.heads_per_group = 1;
  // ckv's scale multiplies both q.k's latent part and V: folded into the
  // softmax and output scales; kpe's relative to it scales the widened kpe.
  p.sm_scale = static_cast<float>(scale * opt.ckv_scale);
  p.o_scale = static_cast<float>(opt.ckv_scale);
  p.pe_scale = static_cast<float>(opt.kpe_scale / opt.ckv_scale);
  cuda::DeviceGuard guard(ws_->device());
  kernel_->launch(dim3(ctas_), dim3(config_.threads), config_.smem_bytes, stream, &p, opt.pdl);
  detail::check_launch("BatchMLA::run");
}

}  // namespace tessera
