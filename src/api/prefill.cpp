#include "tessera/api/prefill.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <tuple>

#include "checks.hpp"
#include "prefill_candidates.hpp"
#include "shared_prefix_level.hpp"
#include "tessera/abi/mask_trim_params.cuh"
#include "tessera/abi/variant_extra.cuh"
#include "tessera/formats/custom_mask.hpp"
#include "tessera/runtime/tensor_map.hpp"
#include "tessera/runtime/variant_params.hpp"

namespace tessera {

using detail::str;

BatchPrefill::BatchPrefill(AttentionSpec spec, TaskInfo task, Workspace& workspace, PrefillOptions opt)
    : spec_(std::move(spec)), task_(task), ws_(&workspace), opt_(opt) {
  validate_task(task_, spec_);
  if (opt_.cluster < 0 || opt_.cluster > 2)
    throw InvalidArgument("cluster: expected 0 (auto), 1 (off) or 2 (CTA pairs), got " + str(opt_.cluster));
  if (opt_.cta_q) config_ = catalog::prefill_config(spec_, opt_.cta_q);  // validates cta_q
  else (void)catalog::prefill_config(spec_, 64);                          // validates dtypes
  detail::each_candidate(spec_, opt_, [](const PrefillConfig&) {});      // validates the tile override
  if (variants::is_causal(spec_.variant)) opt_.causal_schedule = true;
  // Custom masks keep the full schedule: a masked-out tile only costs time,
  // a skipped visible one would be wrong (causal_schedule is the caller's
  // call). Each run then trims the items by the mask it brings (trim_items).
  custom_mask_ = spec_.variant.custom_mask;
  if (opt_.shared_prefix.enabled) {  // the shared level takes the workspace's tail; this wrapper the rest
    prefix_ = detail::SharedPrefixLevel::for_prefill(spec_, task_, opt_, workspace);
    ws_ = &prefix_->own();
  }
}

BatchPrefill::~BatchPrefill() = default;
BatchPrefill::BatchPrefill(BatchPrefill&&) noexcept = default;
BatchPrefill& BatchPrefill::operator=(BatchPrefill&&) noexcept = default;

const SharedPrefixStats* BatchPrefill::shared_prefix_stats() const { return prefix_ ? &prefix_->stats() : nullptr; }

void BatchPrefill::use_shared_scratch(void* device_ptr, size_t bytes) {
  if (kernel_) throw InvalidArgument("scratch: use_shared_scratch must come before the first plan()");
  if (prefix_) detail::SharedPrefixLevel::refuse("the wrapper's scratch lives in its own workspace");
  if (device_ptr == nullptr || reinterpret_cast<uintptr_t>(device_ptr) % 256 != 0)
    throw InvalidArgument("scratch: expected a device buffer aligned to 256 bytes");
  shared_scratch_ = static_cast<char*>(device_ptr);
  shared_scratch_bytes_ = bytes;
}

char* BatchPrefill::scratch_base() const {
  return shared_scratch_ ? shared_scratch_ : static_cast<char*>(ws_->device_ptr()) + layout_.scratch;
}

// A custom-mask wrapper needs the mask at every plan and run; any other
// variant would silently ignore one, so it is refused.
void BatchPrefill::check_mask_given(bool given, const char* name, const char* how) const {
  if (custom_mask_ && !given)
    throw InvalidArgument(std::string(name) + ": the custom_mask variant needs one; call the " + how +
                          " overload that takes " + name);
  if (!custom_mask_ && given)
    throw InvalidArgument(std::string(name) + ": given, but the variant is " + spec_.variant.name +
                          "; construct BatchPrefill with variants::custom_mask() to use a custom mask");
}

void BatchPrefill::paged_lengths(std::span<const int32_t> kv_indptr, const PageIds& kv_indices,
                                 std::span<const int32_t> kv_last_page_len) {
  plan_t0_ = std::chrono::steady_clock::now();
  page_errors_.raise_pending("kv_indices");
  if (kv_indptr.empty()) throw InvalidArgument("kv_indptr: expected batch + 1 elements, got 0");
  checked_max_page_ = detail::check_page_ids(kv_indptr, kv_indices, kv_last_page_len, task_.page_size, kv_lens_);
}

void BatchPrefill::ragged_lengths(std::span<const int32_t> kv_indptr) {
  plan_t0_ = std::chrono::steady_clock::now();
  validate_indptr("kv_indptr", kv_indptr);
  kv_lens_.resize(kv_indptr.empty() ? 0 : kv_indptr.size() - 1);
  for (size_t i = 0; i < kv_lens_.size(); ++i) kv_lens_[i] = kv_indptr[i + 1] - kv_indptr[i];
}

void BatchPrefill::plan_paged(std::span<const int32_t> qo_indptr, std::span<const int32_t> kv_indptr,
                              std::span<const int32_t> kv_indices, std::span<const int32_t> kv_last_page_len,
                              cudaStream_t stream) {
  check_mask_given(false, "mask_indptr", "plan_paged");
  if (prefix_) {  // the unique level here, the shared one planned by prefix_ when it changed
    const auto t0 = std::chrono::steady_clock::now();
    batch_ = -1;  // a failed plan leaves nothing to run
    const PrefixLevel& u = prefix_->plan(kv_indptr, kv_indices, kv_last_page_len, qo_indptr, stream);
    const PageIds ids = PageIds::from_host(u.kv_indices);
    paged_lengths(u.kv_indptr, ids, u.kv_last_page_len);
    plan_common(Source::kPaged, u.qo_indptr, u.kv_indptr, ids, u.kv_last_page_len, kv_lens_, {}, stream);
    plan_us_ = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
    return;
  }
  const PageIds ids = PageIds::from_host(kv_indices);
  paged_lengths(kv_indptr, ids, kv_last_page_len);
  plan_common(Source::kPaged, qo_indptr, kv_indptr, ids, kv_last_page_len, kv_lens_, {}, stream);
}

void BatchPrefill::plan_paged(std::span<const int32_t> qo_indptr, std::span<const int32_t> kv_indptr,
                              const TensorView& kv_indices, std::span<const int32_t> kv_last_page_len,
                              cudaStream_t stream) {
  check_mask_given(false, "mask_indptr", "plan_paged");
  if (prefix_) detail::SharedPrefixLevel::refuse("reads the page ids on the host; expected plan_paged with host kv_indices");
  const PageIds ids = detail::device_page_ids(kv_indices, kv_indptr, ws_->device());
  paged_lengths(kv_indptr, ids, kv_last_page_len);
  plan_common(Source::kPaged, qo_indptr, kv_indptr, ids, kv_last_page_len, kv_lens_, {}, stream);
}

void BatchPrefill::plan_paged(std::span<const int32_t> qo_indptr, std::span<const int32_t> kv_indptr,
                              std::span<const int32_t> kv_indices, std::span<const int32_t> kv_last_page_len,
                              std::span<const int32_t> mask_indptr, cudaStream_t stream) {
  check_mask_given(true, "mask_indptr", "plan_paged");
  const PageIds ids = PageIds::from_host(kv_indices);
  paged_lengths(kv_indptr, ids, kv_last_page_len);
  plan_common(Source::kPaged, qo_indptr, kv_indptr, ids, kv_last_page_len, kv_lens_, mask_indptr, stream);
}

void BatchPrefill::plan_ragged(std::span<const int32_t> qo_indptr, std::span<const int32_t> kv_indptr, cudaStream_t stream) {
  check_mask_given(false, "mask_indptr", "plan_ragged");
  if (prefix_) detail::SharedPrefixLevel::refuse("finds shared pages in a page table; expected plan_paged");
  ragged_lengths(kv_indptr);
  plan_common(Source::kRagged, qo_indptr, kv_indptr, PageIds{}, {}, kv_lens_, {}, stream);
}

void BatchPrefill::plan_ragged(std::span<const int32_t> qo_indptr, std::span<const int32_t> kv_indptr,
                               std::span<const int32_t> mask_indptr, cudaStream_t stream) {
  check_mask_given(true, "mask_indptr", "plan_ragged");
  ragged_lengths(kv_indptr);
  plan_common(Source::kRagged, qo_indptr, kv_indptr, {}, {}, kv_lens_, mask_indptr, stream);
}

void BatchPrefill::plan_bsr(const BSRMatrix& bsr, cudaStream_t stream) {
  if (custom_mask_)
    throw InvalidArgument("bsr: the custom_mask variant takes no BSR plan (the BSR matrix is the mask); "
                          "use plan_paged or plan_ragged with mask_indptr");
  if (bsr.block_cols() != task_.page_size)
    throw InvalidArgument("bsr: expected Bc = task.page_size (" + str(task_.page_size) + "), got " + str(bsr.block_cols()));
  // Block row r is a request of Br queries whose pages are its column blocks.
  // Consecutive block rows with the same column blocks become one request of
  // k * Br queries, so a KV tile loaded once feeds up to a whole query tile
  // (small Br would otherwise reload the same KV per block row). Only for the
  // position-independent standard variant: positions inside a request (qo_idx,
  // causal alignment) would change.
  const bool merge = spec_.variant == variants::standard();
  const auto ip = bsr.indptr();
  const auto ix = bsr.indices();
  const int64_t R = bsr.num_block_rows();
  auto last_of = [&](int64_t r) {
    const bool empty = ip[r + 1] == ip[r];
    return empty ? 0 : (bsr.has_last_block_len() ? bsr.last_block_len()[r] : bsr.block_cols());
  };
  auto same = [&](int64_t a, int64_t b) {
    return ip[a + 1] - ip[a] == ip[b + 1] - ip[b] && last_of(a) == last_of(b) &&
           std::equal(ix.begin() + ip[a], ix.begin() + ip[a + 1], ix.begin() + ip[b]);
  };
  std::vector<int32_t> qo{0}, kv_indptr{0}, indices, last;
  for (int64_t r = 0; r < R;) {
    int64_t e = r + 1;
    while (merge && e < R && same(r, e)) ++e;
    qo.push_back(static_cast<int32_t>(e * bsr.block_rows()));
    indices.insert(indices.end(), ix.begin() + ip[r], ix.begin() + ip[r + 1]);
    kv_indptr.push_back(static_cast<int32_t>(indices.size()));
    last.push_back(last_of(r));
    r = e;
  }
  plan_paged(qo, kv_indptr, indices, last, stream);
}

void BatchPrefill::plan_common(Source src, std::span<const int32_t> qo_indptr, std::span<const int32_t> kv_indptr,
                               const PageIds& kv_indices, std::span<const int32_t> kv_last_page_len,
                               std::span<const int32_t> kv_lens, std::span<const int32_t> mask_indptr,
                               cudaStream_t stream) {
  const auto t0 = plan_t0_;  // set by paged_lengths / ragged_lengths, which every plan() calls first
  if (qo_indptr.empty()) throw InvalidArgument("qo_indptr: expected batch + 1 elements, got 0");
  validate_indptr("qo_indptr", qo_indptr);
  const int64_t batch = static_cast<int64_t>(qo_indptr.size()) - 1;
  if (static_cast<int64_t>(kv_lens.size()) != batch)
    throw InvalidArgument("kv_indptr: expected " + str(batch + 1) + " elements (like qo_indptr), got " + str(kv_lens.size() + 1));
  const int64_t total_q = qo_indptr.back();
  qo_lens_.resize(batch);
  for (int64_t i = 0; i < batch; ++i) qo_lens_[i] = qo_indptr[i + 1] - qo_indptr[i];
  if (custom_mask_) validate_mask_indptr(mask_indptr, qo_lens_, kv_lens);  // before any GPU work

  cuda::DeviceGuard guard(ws_->device());  // the upload and its event belong to the workspace's device
  if (!kernel_) {
    int64_t total_kv = 0;
    for (const int32_t l : kv_lens) total_kv += l;
    configure(src, batch, total_q, total_kv, kv_indices.count, stream);
  }
  if (batch > task_.max_batch)
    throw InvalidArgument("qo_indptr: batch size " + str(batch) + " exceeds the workspace bound max_batch=" + str(task_.max_batch));
  if (total_q > task_.max_total_q)
    throw InvalidArgument("qo_indptr: total query length " + str(total_q) + " exceeds the workspace bound max_total_q=" +
                          str(task_.max_total_q));
  if (kv_indices.count > task_.max_pages)
    throw InvalidArgument("kv_indices: " + str(kv_indices.count) + " pages exceed the workspace bound max_pages=" +
                          str(task_.max_pages));

  const int group = kernel_group(), heads_per_group = kernel_heads() / head_groups_;
  int plan_cta_q = 0, plan_ctas = 0;
  int64_t slot_cap = 0, split_cap = 0;
  const PlannerOptions popt = planner_options(plan_cta_q, plan_ctas, slot_cap, split_cap);
  if (heads_per_group == 1) {
    planner_.plan_prefill(qo_lens_, kv_lens, group, plan_cta_q, opt_.causal_schedule, plan_ctas, popt, plan_);
  } else {  // a request per (request b, head h of the group): index b * heads_per_group + h
    group_qo_lens_.resize(batch * heads_per_group);
    group_kv_lens_.resize(batch * heads_per_group);
    for (int64_t i = 0; i < batch; ++i)
      for (int h = 0; h < heads_per_group; ++h) {
        group_qo_lens_[i * heads_per_group + h] = qo_lens_[i];
        group_kv_lens_[i * heads_per_group + h] = kv_lens[i];
      }
    planner_.plan_prefill(group_qo_lens_, group_kv_lens_, group, plan_cta_q, opt_.causal_schedule, plan_ctas,
                          popt, plan_);
  }

  // Fixed chunks keep their L whatever the workspace holds (batch invariance).
  if (popt.fixed_chunk > 0 &&
      (plan_.num_split > split_cap || plan_.num_slots > slot_cap ||
       static_cast<int64_t>(plan_.items.size()) > layout_.max_items))
    throw InvalidArgument("fixed_chunk: " + str(plan_.items.size()) + " chunks of at most " + str(plan_.chunk_size) +
                          " keys (" + str(plan_.num_slots) + " partial states) exceed the workspace, which holds " +
                          str(slot_cap) + " partial states; expected a larger fixed_chunk, TaskInfo::max_fixed_chunks "
                          "or workspace (workspace_size())");
  // Each item carries its request's bounds (the kernels then need no
  // dependent loads of the indptr arrays before their first copies).
  for (PrefillWorkItem& item : plan_.items) {
    const int64_t b = item.request / heads_per_group;
    item.qo_begin = qo_indptr[b];
    item.qo_len = qo_lens_[b];
    item.kv_begin = kv_indptr[b];
    item.kv_len = kv_lens[b];
  }

  ws_->stage_begin();
  char* host = static_cast<char*>(ws_->host_ptr());
  std::memcpy(host + layout_.qo_indptr, qo_indptr.data(), sizeof(int32_t) * (batch + 1));
  std::memcpy(host + layout_.kv_indptr, kv_indptr.data(), sizeof(int32_t) * (batch + 1));
  if (!kv_last_page_len.empty()) std::memcpy(host + layout_.last, kv_last_page_len.data(), sizeof(int32_t) * batch);
  if (custom_mask_) std::memcpy(host + layout_.mask_indptr, mask_indptr.data(), sizeof(int32_t) * (batch + 1));
  std::memcpy(host + layout_.work_indptr, plan_.work_indptr.data(), sizeof(int32_t) * plan_.work_indptr.size());
  std::memcpy(host + layout_.items, plan_.items.data(), sizeof(PrefillWorkItem) * plan_.items.size());
  auto* first = reinterpret_cast<PrefillWorkItem*>(host + layout_.first_items);
  for (size_t x = 0; x + 1 < plan_.work_indptr.size(); ++x) {
    const int32_t i = plan_.work_indptr[x];
    first[x] = i < plan_.work_indptr[x + 1] ? plan_.items[i] : PrefillWorkItem{};
  }
  detail::upload_with_page_ids(*ws_, layout_.indices, kv_indices, stream);

  if (src == Source::kPaged) (void)page_errors_.device_ptr();  // allocated here, not in run()
  source_kind_ = src;
  device_.active = false;
  device_.planner_ahead = false;
  batch_ = batch;
  total_q_ = total_q;
  total_kv_ = src == Source::kRagged ? kv_indptr.back() : 0;
  mask_bytes_ = custom_mask_ ? mask_indptr.back() : 0;
  max_page_index_ = kv_indices.count == 0 ? -1 : checked_max_page_;  // from paged_lengths()
  plan_us_ = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
}

void BatchPrefill::run(const TensorView& q, const PagedKVStorage& kv, const TensorView& o, const TensorView& lse,
                       cudaStream_t stream, const RunOptions& opt) const {
  if (!prefix_) {
    run_paged(q, kv, nullptr, o, lse, stream, opt);
    return;
  }
  // The unique level into o and the LSE the shared level's epilogue merges with (the caller's
  // outputs checked before either launches).
  detail::SharedPrefixLevel::check_run(opt);
  detail::check_q_o_lse(spec_, q, o, lse, task_.num_qo_heads, total_q_);
  run_paged(q, kv, nullptr, o, prefix_->unique_lse(q.shape.empty() ? 0 : q.shape[0]), stream, opt);
  prefix_->merge(q, kv, o, lse, stream, opt);
}

void BatchPrefill::run(const TensorView& q, const PagedKVStorage& kv, const TensorView& packed_custom_mask,
                       const TensorView& o, const TensorView& lse, cudaStream_t stream, const RunOptions& opt) const {
  run_paged(q, kv, &packed_custom_mask, o, lse, stream, opt);
}

void BatchPrefill::run_ragged(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& o,
                              const TensorView& lse, cudaStream_t stream, const RunOptions& opt) const {
  run_ragged_impl(q, k, v, nullptr, o, lse, stream, opt);
}

void BatchPrefill::run_ragged(const TensorView& q, const TensorView& k, const TensorView& v,
                              const TensorView& packed_custom_mask, const TensorView& o, const TensorView& lse,
                              cudaStream_t stream, const RunOptions& opt) const {
  run_ragged_impl(q, k, v, &packed_custom_mask, o, lse, stream, opt);
}

// The bits the kernel reads: uint8, 1-D, contiguous, on q's GPU, covering
// every request's bytes of the last plan.
void BatchPrefill::check_mask_tensor(const TensorView* mask, const TensorView& q) const {
  if (mask == nullptr) return;
  check_dtype("packed_custom_mask", *mask, DType::kUInt8);
  check_dim("packed_custom_mask", *mask, 1);
  check_contiguous("packed_custom_mask", *mask);
  if (mask->numel() < mask_bytes_)
    throw InvalidArgument("packed_custom_mask: expected at least mask_indptr[batch] = " + str(mask_bytes_) +
                          " bytes (the last plan's), got " + str(mask->numel()));
  if (mask->numel() > 0) check_same_device("q", q, "packed_custom_mask", *mask);
}

void BatchPrefill::run_paged(const TensorView& q, const PagedKVStorage& kv, const TensorView* mask, const TensorView& o,
                             const TensorView& lse, cudaStream_t stream, const RunOptions& opt) const {
  launch(q, o, lse, paged_run_view(q, kv, mask, o, lse), mask, stream, opt);
}

device::PagedKV BatchPrefill::paged_run_view(const TensorView& q, const PagedKVStorage& kv, const TensorView* mask,
                                             const TensorView& o, const TensorView& lse) const {
  check_mask_given(mask != nullptr, "packed_custom_mask", "run");
  if (batch_ < 0) throw InvalidArgument("run: expected plan() to be called first");
  if (source_kind_ != Source::kPaged) throw InvalidArgument("run: the last plan was ragged; call run_ragged()");
  page_errors_.raise_pending("kv_indices");
  device_.errors.raise_pending();
  detail::check_q_o_lse(spec_, q, o, lse, task_.num_qo_heads, total_q_);
  detail::check_workspace_device(q.device, ws_->device());
  detail::check_paged_storage(kv, spec_, task_, max_page_index_, q.device);
  check_mask_tensor(mask, q);
  const char* dev = static_cast<const char*>(ws_->device_ptr());
  // A plan on the GPU left the page table in the caller's buffers.
  const bool on_device = device_.active;
  device::PagedKV view{kv.k().data, kv.v().data,
                       on_device ? device_.kv_indptr : reinterpret_cast<const int*>(dev + layout_.kv_indptr),
                       on_device ? device_.kv_indices : reinterpret_cast<const int*>(dev + layout_.indices),
                       on_device ? device_.kv_last_page_len : reinterpret_cast<const int*>(dev + layout_.last),
                       kv.page_stride(), kv.head_stride(), kv.token_stride(), kv.page_size(), kv.num_kv_heads(), 0};
  // The kernels check every page id, whether or not plan() read them: a
  // captured graph keeps these parameters across plans of either kind.
  view.num_pages = static_cast<int>(std::min<int64_t>(kv.num_pages(), INT32_MAX));
  view.page_error = page_errors_.device_ptr();
  view.v_page_stride = kv.v_page_stride();
  view.v_head_stride = kv.v_head_stride();
  view.v_token_stride = kv.v_token_stride();
  return view;
}

void BatchPrefill::run_ragged_impl(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView* mask,
                                   const TensorView& o, const TensorView& lse, cudaStream_t stream,
                                   const RunOptions& opt) const {
  launch(q, o, lse, ragged_run_view(q, k, v, mask, o, lse), mask, stream, opt);
}

device::PagedKV BatchPrefill::ragged_run_view(const TensorView& q, const TensorView& k, const TensorView& v,
                                              const TensorView* mask, const TensorView& o, const TensorView& lse) const {
  check_mask_given(mask != nullptr, "packed_custom_mask", "run_ragged");
  if (batch_ < 0) throw InvalidArgument("run: expected plan() to be called first");
  if (source_kind_ != Source::kRagged) throw InvalidArgument("run_ragged: the last plan was paged; call run()");
  detail::check_q_o_lse(spec_, q, o, lse, task_.num_qo_heads, total_q_);
  detail::check_workspace_device(q.device, ws_->device());
  device_.errors.raise_pending();
  if (device_.active) {  // a plan on the GPU: any step within max_kv_tokens (total_kv_) rows
    for (auto [name, t, dim] : {std::tuple{"k", &k, spec_.head_dim}, std::tuple{"v", &v, spec_.vo_dim()}}) {
      check_dim(name, *t, 3);
      if (t->size(0) < total_kv_ || t->size(1) != task_.num_kv_heads || t->size(2) != dim)
        throw InvalidArgument(std::string(name) + ": expected shape [>= " + str(total_kv_) + " (max_kv_tokens), " +
                              str(task_.num_kv_heads) + ", " + str(dim) + "], got " + t->shape_str());
    }
  } else {
    check_shape("k", k, {total_kv_, task_.num_kv_heads, spec_.head_dim});
    check_shape("v", v, {total_kv_, task_.num_kv_heads, spec_.vo_dim()});
  }
  check_dtype("k", k, spec_.kv_dtype);
  check_dtype("v", v, spec_.kv_dtype);
  // Equal dims read V at K's strides; unequal ones at V's own (PagedKV::v_*).
  if (spec_.dims_equal() && (k.stride(0) != v.stride(0) || k.stride(1) != v.stride(1)))
    throw InvalidArgument("v: expected the same strides as k");
  detail::check_cuda_vectors("k", k);
  detail::check_cuda_vectors("v", v);
  check_same_device("q", q, "k", k);
  check_same_device("q", q, "v", v);
  check_mask_tensor(mask, q);
  const char* dev = static_cast<const char*>(ws_->device_ptr());
  // A plan on the GPU left the token offsets in the caller's buffer.
  const int* kv_indptr = device_.active ? device_.kv_indptr : reinterpret_cast<const int*>(dev + layout_.kv_indptr);
  device::PagedKV view{k.data, v.data, kv_indptr, nullptr, nullptr, 0, k.stride(1), k.stride(0), 1, task_.num_kv_heads, 0};
  view.v_head_stride = v.stride(1);
  view.v_token_stride = v.stride(0);
  return view;
}

void BatchPrefill::pack_run(const TensorView& q, const TensorView& o, const TensorView& lse, const device::PagedKV& kv,
                            const TensorView* mask, const RunOptions& opt, PrefillParams<NoExtra>& p,
                            ParamBlock& block) const {
  const char* dev = static_cast<const char*>(ws_->device_ptr());
  p = {};
  p.q = q.data;
  p.o = o.data;
  p.lse = detail::has(lse) ? static_cast<float*>(lse.data) : nullptr;
  p.merge_lse = detail::merge_lse_arg(opt, o, lse);
  p.defer_grid_wait = opt.pdl_defer_wait ? 1 : 0;
  p.q_stride_n = q.stride(0);
  p.q_stride_h = q.stride(1);
  p.o_stride_n = o.stride(0);
  p.o_stride_h = o.stride(1);
  p.qo_indptr = device_.active && device_.qo_indptr ? device_.qo_indptr : reinterpret_cast<const int*>(dev + layout_.qo_indptr);
  p.kv = kv;
  p.work_indptr = reinterpret_cast<const int*>(dev + layout_.work_indptr);
  p.work_items = reinterpret_cast<const PrefillWorkItem*>(dev + layout_.items);
  p.first_items = reinterpret_cast<const PrefillWorkItem*>(dev + layout_.first_items);
  p.partial_o = reinterpret_cast<float*>(scratch_base() + layout_.partial_o);
  p.partial_lse = reinterpret_cast<float*>(scratch_base() + layout_.partial_lse);
  p.counters = reinterpret_cast<int*>(scratch_base() + layout_.counters);
  p.merge_words = reinterpret_cast<u64*>(scratch_base() + layout_.merge_words);
  p.num_qo_heads = task_.num_qo_heads;
  p.group = kernel_group();
  p.heads_per_group = kernel_heads() / head_groups_;
  p.page_shift = detail::page_shift(kv.page_size);
  const detail::KernelScales scales =
      detail::resolve_run_scales(opt, spec_.head_dim, q.device,
                                 is_fp8(spec_.kv_dtype) ? nullptr : "the tensor-core prefill kernels with a 16-bit KV cache",
                                 true);
  p.sm_scale = scales.sm_scale;
  p.o_scale = scales.o_scale;
  p.kv_scales = scales.tensors;  // read by the fp8 instantiations only
  p.custom_mask = mask ? static_cast<const u8*>(mask->data) : nullptr;
  p.custom_mask_bytes = mask ? mask->numel() : 0;
  p.mask_indptr = custom_mask_ ? reinterpret_cast<const int*>(dev + layout_.mask_indptr) : nullptr;
  // Custom masks: the kernel reads the items trimmed to their visible tiles.
  if (trims(mask)) {
    p.work_items = reinterpret_cast<const PrefillWorkItem*>(dev + layout_.trimmed_items);
    p.first_items = reinterpret_cast<const PrefillWorkItem*>(dev + layout_.trimmed_first);
  }
  pack_params(block, ParamsKind::kPrefill, &p, spec_.variant, opt.extras, q.device);  // p and the variant's extras
}

// Tensor maps for the Hopper producer's TMA loads (encoded per run on the
// host: pointers may change between runs; no device work). Contiguous K and
// V; Q where the group divides the query tile and queries fill their tiles
// on average (decode's one-token queries would load mostly unused rows:
// cp.async copies only the valid ones).
Sm90TensorMaps BatchPrefill::tensor_maps(const TensorView& q, const device::PagedKV& kv) const {
  Sm90TensorMaps maps{};
  if (kv.indices == nullptr && !is_fp8(spec_.kv_dtype)) {  // fp8 tiles are staged and widened by cp.async copies
    const int64_t tokens = kv.indptr ? total_kv_ : kv.single_len;
    maps.kv_on = tma::encode_kv_tiles(maps.k, kv.k, tokens, kv.num_kv_heads, spec_.head_dim, kv.token_stride,
                                      kv.head_stride, config_.cta_kv) &&
                 tma::encode_kv_tiles(maps.v, kv.v, tokens, kv.num_kv_heads, spec_.head_dim, kv.token_stride,
                                      kv.head_stride, config_.cta_kv);
  }
  const int group = task_.num_qo_heads / task_.num_kv_heads;
  // (A plan on the GPU leaves the lengths unknown here: cp.async.)
  const bool q_fill = !device_.active && total_q_ >= batch_ * (config_.cta_q / group);
  if (q_fill && config_.cta_q % group == 0)
    maps.q_on = tma::encode_q_tiles(maps.q, q.data, total_q_, task_.num_kv_heads, group, spec_.head_dim, q.stride(0),
                                    q.stride(1), config_.cta_q);
  return maps;
}

void BatchPrefill::launch(const TensorView& q, const TensorView& o, const TensorView& lse, const device::PagedKV& kv,
                          const TensorView* mask, cudaStream_t stream, const RunOptions& opt) const {
  PrefillParams<NoExtra> p;
  ParamBlock block;
  pack_run(q, o, lse, kv, mask, opt, p, block);
  const bool trim = trims(mask);
  cuda::DeviceGuard guard(ws_->device());
  // The trimmed items come from a kernel on this stream; the attention kernel
  // reads its first item before its grid-dependency wait, so it must not
  // start early behind that kernel (the trim pass itself may).
  if (trim) trim_items(*mask, stream, opt.pdl);
  // Nor behind the device planner, whose queues it reads.
  const bool pdl = opt.pdl && !trim && !device_.take_planner_ahead();
  const dim3 grid(ctas_per_group_, head_groups_), threads(config_.threads);
  if (config_.hopper) {
    Sm90TensorMaps maps = tensor_maps(q, kv);
    kernel_->launch(grid, threads, config_.smem_bytes, stream, block.data(), &maps, pdl);
  } else {
    kernel_->launch(grid, threads, config_.smem_bytes, stream, block.data(), pdl);
    // Head dim 512: the same plan over V's and O's next 256 features (same
    // strides). Same softmax, so LSE is rewritten with the same bits; one
    // stream, so the split scratch (counters zero after each merge) is reused.
    for (int part = 1; part < config_.vo_split; ++part) {
      const int64_t features = int64_t{part} * config_.head_dim_vo;
      p.kv.v = static_cast<const char*>(kv.v) + features * static_cast<int64_t>(dtype_size(spec_.kv_dtype));
      p.o = static_cast<char*>(o.data) + features * static_cast<int64_t>(dtype_size(spec_.o_dtype));
      pack_params(block, ParamsKind::kPrefill, &p, spec_.variant, opt.extras, q.device);
      kernel_->launch(grid, threads, config_.smem_bytes, stream, block.data(), pdl);
    }
  }
  detail::check_launch("BatchPrefill::run");
}

// One block per item (a fixed grid: a captured graph replays it for any plan;
// the kernel reads the item count from work_indptr). Called from launch(),
// whose device guard is in place.
void BatchPrefill::trim_items(const TensorView& mask, cudaStream_t stream, bool pdl) const {
  char* dev = static_cast<char*>(ws_->device_ptr());
  MaskTrimParams t{};
  t.items = reinterpret_cast<const PrefillWorkItem*>(dev + layout_.items);
  t.first_items = reinterpret_cast<const PrefillWorkItem*>(dev + layout_.first_items);
  t.trimmed_items = reinterpret_cast<PrefillWorkItem*>(dev + layout_.trimmed_items);
  t.trimmed_first = reinterpret_cast<PrefillWorkItem*>(dev + layout_.trimmed_first);
  t.work_indptr = reinterpret_cast<const int*>(dev + layout_.work_indptr);
  t.queues = ctas_per_group_ / config_.cluster;
  t.tile_rows = config_.cta_q * config_.cluster;
  t.group = kernel_group();
  t.heads_per_group = kernel_heads() / head_groups_;
  t.cta_kv = config_.cta_kv;
  t.custom_mask = static_cast<const u8*>(mask.data);
  t.mask_indptr = reinterpret_cast<const int*>(dev + layout_.mask_indptr);
  t.custom_mask_bytes = mask.numel();
  trim_kernel_->launch(dim3(trim_blocks_), dim3(kMaskTrimThreads), 0, stream, &t, pdl);
  detail::check_launch("BatchPrefill::run (custom-mask trim)");
}

}  // namespace tessera
