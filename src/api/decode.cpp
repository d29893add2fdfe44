#include "tessera/api/decode.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <numeric>

#include "checks.hpp"
#include "shared_prefix_level.hpp"
#include "tessera/abi/variant_extra.cuh"
#include "tessera/runtime/variant_params.hpp"

namespace tessera {

using detail::str;

namespace {

// tc_cta_q tunes the tensor-core path only, with the prefill wrapper's query tiles.
void check_tc_cta_q(const DecodeOptions& opt) {
  const int q = opt.tc_cta_q;
  if (q != 0 && !opt.use_tensor_cores)
    throw InvalidArgument("tc_cta_q: tunes the tensor-core path; expected 0 without use_tensor_cores, got " + str(q));
  if (q != 0 && q != 8 && q != 16 && q != 32 && q != 64 && q != 128)
    throw InvalidArgument("tc_cta_q: expected 0 (heuristic), 8 (fp8 caches), 16, 32, 64 or 128, got " + str(q));
}

// use_tensor_cores: decode as a prefill whose requests each have one query,
// so the total query length is at most the batch size.
TaskInfo tensor_core_task(TaskInfo task) {
  task.max_total_q = task.max_batch;
  return task;
}

bool cuda_core_tuning(const DecodeOptions& opt) {
  return opt.cuda_cores || opt.ctas_per_sm != 0 || opt.tile != 0 || opt.stages != 0 || opt.heads_per_thread != 0;
}

// Head dims only the tensor-core path takes (512; unequal dims): a warp of
// the CUDA-core kernel holds a row of at most 256 16-bit features. Such a
// spec runs on the tensor cores whatever use_tensor_cores says (the flag is
// a hint), and what only the CUDA-core kernel does is refused naming head_dim.
bool needs_tensor_cores(const AttentionSpec& spec) { return spec.head_dim > 256 || !spec.dims_equal(); }

void check_tensor_core_only(const AttentionSpec& spec, const DecodeOptions& opt) {
  if (!needs_tensor_cores(spec)) return;
  const std::string dims = spec.dims_equal() ? "head_dim: " + str(spec.head_dim)
                                             : "head_dim: " + str(spec.head_dim) + " / " + str(spec.vo_dim());
  const std::string why = dims + " runs on the tensor-core path only (the CUDA-core decode kernel takes head_dim 64, "
                                 "128 or 256)";
  if (opt.cuda_cores || cuda_core_tuning(opt))
    throw InvalidArgument(why + "; expected cuda_cores false and no CUDA-core tuning (ctas_per_sm, tile, stages, "
                                "heads_per_thread)");
  if (is_fp8(spec.kv_dtype))
    throw InvalidArgument(why + ", which reads fp8 caches at head_dim 64, 128 or 256 only; got kv_dtype " +
                          dtype_name(spec.kv_dtype));
  if (spec.q_dtype != spec.kv_dtype)
    throw InvalidArgument(why + ", which needs q_dtype == kv_dtype; got " + dtype_name(spec.q_dtype) + " and " +
                          dtype_name(spec.kv_dtype));
  if (!opt.use_tensor_cores && spec.variant.headers.empty())
    throw InvalidArgument(why + "; a user variant runs on the CUDA-core kernel unless use_tensor_cores is set");
}

// Whether the wrapper may pick the tensor cores: built-in variants (a user's
// variant is compiled for the kernel it asked for) with equal q and KV
// dtypes or an fp8 cache.
bool tensor_cores_eligible(const AttentionSpec& spec, const DecodeOptions& opt) {
  return !opt.use_tensor_cores && !cuda_core_tuning(opt) &&
         (spec.q_dtype == spec.kv_dtype || is_fp8(spec.kv_dtype)) && !spec.variant.headers.empty();
}

// The flags agree, and a spec left to the wrapper is one the CUDA-core kernel
// takes too, so it is refused (e.g. a custom mask) on every device alike.
void check_kernel_choice(const AttentionSpec& spec, const TaskInfo& task, const DecodeOptions& opt) {
  if (opt.use_tensor_cores && opt.cuda_cores)
    throw InvalidArgument("cuda_cores: expected false with use_tensor_cores (they ask for different kernels)");
  validate_spec(spec);
  check_tensor_core_only(spec, opt);
  if (!opt.use_tensor_cores && !needs_tensor_cores(spec))
    (void)catalog::decode_config(spec, task.num_qo_heads / task.num_kv_heads, opt.tile, opt.stages, opt.heads_per_thread);
}

PrefillOptions tensor_core_options(const AttentionSpec& spec, const TaskInfo& task, const DecodeOptions& opt) {
  // fp8 caches run there too (the FA2 template widens K / V to q's type).
  if (!is_fp8(spec.kv_dtype) && spec.q_dtype != spec.kv_dtype)
    throw TypeMismatch(std::string("q_dtype: use_tensor_cores runs decode on the tensor-core prefill kernel, which "
                                   "needs q_dtype == kv_dtype or an fp8 kv_dtype (") +
                       dtype_name(spec.kv_dtype) + "), got " + dtype_name(spec.q_dtype));
  for (auto [name, v] : {std::pair{"ctas_per_sm", opt.ctas_per_sm}, {"tile", opt.tile}, {"stages", opt.stages},
                         {"heads_per_thread", opt.heads_per_thread}})
    if (v != 0)
      throw InvalidArgument(std::string(name) + ": tunes the CUDA-core decode kernel; expected 0 with use_tensor_cores, got " +
                            str(v));
  if (opt.tc_cta_q == 8 && !catalog::keys_as_rows_supported(spec))
    throw InvalidArgument("tc_cta_q: 8-row tiles take fp8 or 16-bit caches whose variant leaves K / V rows as "
                          "stored, got kv_dtype " +
                          std::string(dtype_name(spec.kv_dtype)) + ", variant " + spec.variant.name +
                          "; expected 0, 16, 32, 64 or 128");
  PrefillOptions p;
  p.planner = opt.planner;
  p.max_sms = opt.max_sms;
  p.group_heads = HeadGrouping::kOff;  // plan() runs every step: one plan for every head keeps it short
  p.cta_q = opt.tc_cta_q;
  // A group of at most 8 heads runs on 8-row tiles with the keys as the
  // mma's rows (the FA2 template's warp-specialized form): 2x padding of a
  // 4-head group where the Hopper kernel's 64-row tile has 16x, and as fast
  // on long steps (H100 decode grid: 0.99-1.07x the Hopper tile's speed,
  // short and uneven steps gaining most), with an eighth of its partial
  // states in the workspace. fp8 caches take the FA2 template at
  // any group (it widens K / V in registers; the Hopper kernel's producer
  // widens them through a 16-bit copy in shared memory: GQA 32/8 128 x 4096,
  // 418 vs 481 us), on 16-row tiles past 8 heads. Otherwise 0: the prefill
  // heuristic's (64 rows on sm_90, the Hopper kernel).
  const bool fp8_fa2 = p.cta_q == 0 && is_fp8(spec.kv_dtype);
  if (p.cta_q == 0 && task.num_qo_heads / task.num_kv_heads <= 8 && catalog::keys_as_rows_supported(spec))
    p.cta_q = 8;
  else if (fp8_fa2)
    p.cta_q = 16;
  // Short decode steps stay unsplit (PlannerOptions::unsplit_max_kv; measured
  // on the Hopper kernel: the CUDA-core kernel gained from splitting at every
  // batch-16 length, bench/results/decode-short-steps-*). fp8's FA2 tiles
  // split them: on 16-row tiles four CTAs an SM each streaming one 1024-key
  // tile alone took 46 us at GQA 16 x 1024, split 26 us.
  if (p.planner.unsplit_max_kv < 0) p.planner.unsplit_max_kv = fp8_fa2 ? 0 : 1024;
  return p;
}


}  // namespace

BatchDecode::Layout BatchDecode::layout_for(const AttentionSpec& spec, const TaskInfo& task, int ctas_per_head,
                                            int fixed_chunk, size_t device_bytes) {
  // Fixed chunks (PlannerOptions::fixed_chunk) may need more items and
  // partial states than a plan of its own choosing: the workspace holds both.
  const int64_t fixed = fixed_chunk_bound(task.max_pages * task.page_size, task.max_batch, fixed_chunk);
  const int64_t items = std::max(decode_max_items(task.max_batch, ctas_per_head), fixed);
  Layout l;
  l.ideal_slots = std::max(decode_max_slots(ctas_per_head), fixed);
  WorkspaceLayout w;
  // Staged sections (copied from the pinned buffer each plan), then device-only ones.
  l.kv_indptr = w.add(sizeof(int32_t) * (task.max_batch + 1));
  l.last = w.add(sizeof(int32_t) * task.max_batch);
  l.work_indptr = w.add(sizeof(int32_t) * (ctas_per_head + 1));
  l.items = w.add(sizeof(DecodeWorkItem) * items);
  l.max_items = items;
  // Last, so a plan uploads only the ids it has (and none when they stay on the GPU).
  l.indices = w.add(sizeof(int32_t) * std::max<int64_t>(task.max_pages, 1));
  l.staged = w.total();
  l.counters = w.add(sizeof(int32_t) * task.max_batch * task.num_kv_heads);
  const WorkspaceLayout head = w;
  auto lay_out = [&](int64_t slots) {  // the partial states last, `slots` of them
    WorkspaceLayout p = head;
    l.max_slots = slots;
    l.partial_lse = p.add(sizeof(float) * slots * task.num_qo_heads);
    l.partial_o = p.add(sizeof(float) * slots * task.num_qo_heads * spec.vo_dim());
    return l.total = p.total();
  };
  l.min_total = lay_out(0);
  l.ideal_total = lay_out(l.ideal_slots);
  if (device_bytes < l.min_total)
    throw InvalidArgument("workspace: expected at least " + str(l.min_total) + " device bytes (the minimum for these "
                          "bounds; " + str(l.ideal_total) + " hold every partial state of split-KV), got " +
                          str(device_bytes));
  lay_out(detail::largest_fitting(l.ideal_slots, [&](int64_t k) { return lay_out(k) <= device_bytes; }));
  return l;
}

BatchDecode::Sizes BatchDecode::workspace_size(const AttentionSpec& spec, const TaskInfo& task, int num_sms,
                                               const DecodeOptions& opt) {
  return sizes(spec, task, num_sms, opt, false);
}

BatchDecode::Sizes BatchDecode::min_workspace_size(const AttentionSpec& spec, const TaskInfo& task, int num_sms,
                                                   const DecodeOptions& opt) {
  return sizes(spec, task, num_sms, opt, true);
}

// The ideal or the minimal size, for whichever kernel the options may run.
BatchDecode::Sizes BatchDecode::sizes(const AttentionSpec& spec, const TaskInfo& task, int num_sms,
                                      const DecodeOptions& opt, bool minimum) {
  validate_task(task, spec);
  check_tc_cta_q(opt);
  check_kernel_choice(spec, task, opt);
  if (task.max_batch < 1 || task.max_pages < 1)
    throw InvalidArgument("task: expected max_batch >= 1 and max_pages >= 1 to size the workspace");
  if (opt.shared_prefix.enabled) {  // this wrapper's part, then the shared level's
    using detail::SharedPrefixLevel;
    SharedPrefixLevel::check(spec, task, task.max_batch, opt.shared_prefix, opt.planner);
    DecodeOptions own = opt;
    own.shared_prefix = {};
    return SharedPrefixLevel::add(
        sizes(spec, task, num_sms, own, minimum),
        SharedPrefixLevel::sizes(spec, task, task.max_batch, num_sms, opt.planner, opt.max_sms, minimum));
  }
  if (opt.use_tensor_cores || needs_tensor_cores(spec)) {
    const TaskInfo t = tensor_core_task(task);
    const PrefillOptions p = tensor_core_options(spec, task, opt);
    return minimum ? BatchPrefill::min_workspace_size(spec, t, num_sms, p)
                   : BatchPrefill::workspace_size(spec, t, num_sms, p);
  }
  if (tensor_cores_eligible(spec, opt)) {  // the kernel is picked on the device: room for either
    DecodeOptions tc = opt, cc = opt;
    tc.use_tensor_cores = true;
    cc.cuda_cores = true;
    const Sizes a = sizes(spec, task, num_sms, tc, minimum), b = sizes(spec, task, num_sms, cc, minimum);
    return {std::max(a.device_bytes, b.device_bytes), std::max(a.host_bytes, b.host_bytes)};
  }
  const DecodeConfig c =
      catalog::decode_config(spec, task.num_qo_heads / task.num_kv_heads, opt.tile, opt.stages, opt.heads_per_thread);
  const int per_sm = opt.ctas_per_sm > 0 ? opt.ctas_per_sm : c.ctas_per_sm;  // occupancy only lowers it
  const Layout l = layout_for(spec, task, detail::ctas_per_head(task.num_kv_heads, num_sms, per_sm, opt.max_sms),
                              opt.planner.fixed_chunk);
  return {minimum ? l.min_total : l.ideal_total, l.staged};
}

bool BatchDecode::runs_on_tensor_cores(const AttentionSpec& spec, const DecodeOptions& opt, int device) {
  if (opt.use_tensor_cores || needs_tensor_cores(spec)) return true;
  if (!tensor_cores_eligible(spec, opt) || !cuda::gpu_available()) return false;
  return cuda::device_info(device).major == 9;  // measured on sm_90 only (docs/performance.md)
}

BatchDecode::BatchDecode(AttentionSpec spec, TaskInfo task, Workspace& workspace, DecodeOptions opt)
    : spec_(std::move(spec)), task_(task), ws_(&workspace), opt_(opt) {
  validate_task(task_, spec_);
  check_tc_cta_q(opt_);
  if (opt_.max_sms < 0) throw InvalidArgument("max_sms: expected >= 0, got " + str(opt_.max_sms));
  if (opt_.ctas_per_sm < 0) throw InvalidArgument("ctas_per_sm: expected >= 0, got " + str(opt_.ctas_per_sm));
  opt_.planner.window_left = spec_.variant.window_left;  // keys left of a declared window are never loaded
  check_kernel_choice(spec_, task_, opt_);
  if (opt_.shared_prefix.enabled) {  // the shared level takes the workspace's tail; this wrapper the rest
    detail::SharedPrefixLevel::check(spec_, task_, task_.max_batch, opt_.shared_prefix, opt_.planner);
    DecodeOptions own = opt_;
    own.shared_prefix = {};
    const Sizes own_min = min_workspace_size(spec_, task_, cuda::device_info(workspace.device()).sm_count, own);
    prefix_ = std::make_unique<detail::SharedPrefixLevel>(spec_, task_, task_.max_batch, opt_.shared_prefix,
                                                          opt_.planner, opt_.max_sms, workspace, own_min);
    ws_ = &prefix_->own();
  }
  if (runs_on_tensor_cores(spec_, opt_, ws_->device())) {  // the prefill wrapper owns kernel, schedule, sections
    DecodeOptions tc = opt_;
    tc.use_tensor_cores = true;
    tc_ = std::make_unique<BatchPrefill>(spec_, tensor_core_task(task_), *ws_, tensor_core_options(spec_, task_, tc));
    return;
  }
  const int group = task_.num_qo_heads / task_.num_kv_heads;
  config_ = catalog::decode_config(spec_, group, opt_.tile, opt_.stages, opt_.heads_per_thread);
  source_ = catalog::batch_decode(spec_, group, opt_.tile, opt_.stages, opt_.heads_per_thread);
}

void BatchDecode::plan(const BSRMatrix& bsr, cudaStream_t stream) {
  if (bsr.block_rows() != 1)
    throw InvalidArgument("bsr: expected Br = 1 for decode (one block row per request), got Br = " + str(bsr.block_rows()));
  if (bsr.block_cols() != task_.page_size)
    throw InvalidArgument("bsr: expected Bc = page_size (" + str(task_.page_size) + "), got " + str(bsr.block_cols()));
  std::vector<int32_t> last(bsr.num_block_rows());
  for (int64_t r = 0; r < bsr.num_block_rows(); ++r) {
    const bool empty = bsr.indptr()[r + 1] == bsr.indptr()[r];
    last[r] = empty ? 0 : (bsr.has_last_block_len() ? bsr.last_block_len()[r] : bsr.block_cols());
  }
  plan(bsr.indptr(), bsr.indices(), last, stream);
}

BatchDecode::~BatchDecode() = default;
BatchDecode::BatchDecode(BatchDecode&&) noexcept = default;
BatchDecode& BatchDecode::operator=(BatchDecode&&) noexcept = default;

const SharedPrefixStats* BatchDecode::shared_prefix_stats() const { return prefix_ ? &prefix_->stats() : nullptr; }

void BatchDecode::plan(std::span<const int32_t> kv_indptr, std::span<const int32_t> kv_indices,
                       std::span<const int32_t> kv_last_page_len, cudaStream_t stream) {
  if (!prefix_) {
    plan_ids(kv_indptr, PageIds::from_host(kv_indices), nullptr, kv_last_page_len, stream);
    return;
  }
  const auto t0 = std::chrono::steady_clock::now();
  batch_ = -1;  // a failed plan leaves nothing to run
  const PrefixLevel& unique = prefix_->plan(kv_indptr, kv_indices, kv_last_page_len, {}, stream);
  plan_ids(unique.kv_indptr, PageIds::from_host(unique.kv_indices), nullptr, unique.kv_last_page_len, stream);
  plan_us_ = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
}

void BatchDecode::plan(std::span<const int32_t> kv_indptr, const TensorView& kv_indices,
                       std::span<const int32_t> kv_last_page_len, cudaStream_t stream) {
  if (prefix_) detail::SharedPrefixLevel::refuse("reads the page ids on the host; expected plan() with host kv_indices");
  plan_ids(kv_indptr, detail::device_page_ids(kv_indices, kv_indptr, ws_->device()), &kv_indices, kv_last_page_len,
           stream);
}

// The first plan (CUDA-core path): load the kernel, fix the grid and the
// workspace sections (batch and n_indices: the first plan's, for bounds the
// task leaves open).
void BatchDecode::configure(int64_t batch, int64_t n_indices, cudaStream_t stream) {
  const int cap = opt_.ctas_per_sm > 0 ? opt_.ctas_per_sm : config_.ctas_per_sm;
  const auto pk = detail::load_persistent(source_, ws_->device(), config_.threads, config_.smem_bytes, cap,
                                          task_.num_kv_heads, opt_.max_sms, "BatchDecode::plan");
  kernel_ = pk.kernel;
  ctas_per_head_ = pk.ctas_per_head;
  if (task_.max_batch == 0) task_.max_batch = std::max<int64_t>(batch, 1);
  if (task_.max_pages == 0) task_.max_pages = std::max<int64_t>(n_indices, 1);
  // The partial states get the slots the workspace holds.
  layout_ = layout_for(spec_, task_, ctas_per_head_, opt_.planner.fixed_chunk, ws_->device_bytes());
  detail::check_workspace_size(*ws_, layout_.total, layout_.staged);
  // Merge counters start at zero; every run leaves them at zero.
  TESSERA_CUDA_CHECK(cudaMemsetAsync(static_cast<char*>(ws_->device_ptr()) + layout_.counters, 0,
                                     sizeof(int32_t) * task_.max_batch * task_.num_kv_heads, stream));
  (void)page_errors_.device_ptr();  // allocated here, not in run()
}

PlannerOptions BatchDecode::planner_options() const {
  // A workspace below workspace_size() holds fewer partial slots: the
  // planner splits less to fit (a cap of 0 means none, hence split_kv off).
  // Counters are per (request, KV head): split requests always fit them.
  PlannerOptions popt = opt_.planner;
  popt.max_slots = popt.max_slots > 0 ? std::min(popt.max_slots, layout_.max_slots) : layout_.max_slots;
  if (layout_.max_slots == 0 && popt.fixed_chunk <= 0) popt.split_kv = false;
  return popt;
}

void BatchDecode::plan_ids(std::span<const int32_t> kv_indptr, const PageIds& kv_indices,
                           const TensorView* device_indices, std::span<const int32_t> kv_last_page_len,
                           cudaStream_t stream) {
  const auto t0 = std::chrono::steady_clock::now();
  if (kv_indptr.empty()) throw InvalidArgument("kv_indptr: expected batch + 1 elements, got 0");
  if (tc_) {
    plan_tensor_cores(kv_indptr, kv_indices, device_indices, kv_last_page_len, stream);
    plan_us_ = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
    return;
  }
  page_errors_.raise_pending("kv_indices");
  const int64_t batch = static_cast<int64_t>(kv_indptr.size()) - 1;
  // Validates monotonicity, sizes, index signs and last_page_len ranges; the
  // storage size is checked against the largest index at run() (device ids:
  // by the kernels).
  const int32_t max_index = detail::check_page_ids(kv_indptr, kv_indices, kv_last_page_len, task_.page_size, kv_lens_);
  const int64_t n_indices = kv_indices.count;

  cuda::DeviceGuard guard(ws_->device());  // the upload and its event belong to the workspace's device
  if (!kernel_) configure(batch, n_indices, stream);
  if (batch > task_.max_batch)
    throw InvalidArgument("kv_indptr: batch size " + str(batch) + " exceeds the workspace bound max_batch=" +
                          str(task_.max_batch) + " fixed at the first plan()");
  if (n_indices > task_.max_pages)
    throw InvalidArgument("kv_indices: " + str(n_indices) + " pages exceed the workspace bound max_pages=" +
                          str(task_.max_pages) + " fixed at the first plan()");

  const PlannerOptions popt = planner_options();
  planner_.plan_decode(kv_lens_, ctas_per_head_, popt, plan_);
  // Fixed chunks keep their L whatever the workspace holds (batch invariance).
  if (popt.fixed_chunk > 0 && plan_.num_slots > layout_.max_slots)
    throw InvalidArgument("fixed_chunk: " + str(plan_.items.size()) + " chunks of at most " + str(plan_.chunk_size) +
                          " keys (" + str(plan_.num_slots) + " partial states) exceed the workspace, which holds " +
                          str(layout_.max_slots) + " partial states; expected a larger fixed_chunk or workspace "
                          "(workspace_size())");

  ws_->stage_begin();
  char* host = static_cast<char*>(ws_->host_ptr());
  std::memcpy(host + layout_.kv_indptr, kv_indptr.data(), sizeof(int32_t) * (batch + 1));
  std::memcpy(host + layout_.last, kv_last_page_len.data(), sizeof(int32_t) * batch);
  std::memcpy(host + layout_.work_indptr, plan_.work_indptr.data(), sizeof(int32_t) * plan_.work_indptr.size());
  std::memcpy(host + layout_.items, plan_.items.data(), sizeof(DecodeWorkItem) * plan_.items.size());
  detail::upload_with_page_ids(*ws_, layout_.indices, kv_indices, stream);
  batch_ = batch;
  max_page_index_ = max_index;
  device_.active = false;
  device_.planner_ahead = false;
  plan_us_ = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
}

// Request i is query row i: qo_indptr = [0, 1, ..., batch]. The prefill
// wrapper validates the page table, fixes its bounds (max_total_q = max_batch)
// and loads its kernel at the first plan, exactly as the CUDA-core path does.
void BatchDecode::plan_tensor_cores(std::span<const int32_t> kv_indptr, const PageIds& kv_indices,
                                    const TensorView* device_indices, std::span<const int32_t> kv_last_page_len,
                                    cudaStream_t stream) {
  const int64_t batch = static_cast<int64_t>(kv_indptr.size()) - 1;
  const int64_t n_indices = kv_indices.count;
  // The prefill wrapper checks these bounds too, but names qo_indptr.
  if (task_.max_batch && batch > task_.max_batch)
    throw InvalidArgument("kv_indptr: batch size " + str(batch) + " exceeds the workspace bound max_batch=" +
                          str(task_.max_batch) + " fixed at the first plan()");
  if (task_.max_pages && n_indices > task_.max_pages)
    throw InvalidArgument("kv_indices: " + str(n_indices) + " pages exceed the workspace bound max_pages=" +
                          str(task_.max_pages) + " fixed at the first plan()");
  tc_qo_indptr_.resize(batch + 1);  // grows to max_batch + 1 once, then reused
  std::iota(tc_qo_indptr_.begin(), tc_qo_indptr_.end(), 0);
  if (device_indices) tc_->plan_paged(tc_qo_indptr_, kv_indptr, *device_indices, kv_last_page_len, stream);
  else tc_->plan_paged(tc_qo_indptr_, kv_indptr, kv_indices.host, kv_last_page_len, stream);
  if (!task_.max_batch) task_.max_batch = std::max<int64_t>(batch, 1);  // as the prefill wrapper fixed them
  if (!task_.max_pages) task_.max_pages = std::max<int64_t>(n_indices, 1);
  batch_ = batch;
}

void BatchDecode::run(const TensorView& q, const PagedKVStorage& kv, const TensorView& o, const TensorView& lse,
                      cudaStream_t stream, const RunOptions& opt) const {
  if (batch_ < 0) throw InvalidArgument("run: expected plan() to be called first");
  if (!prefix_) {
    run_level(q, kv, o, lse, stream, opt);
    return;
  }
  // The unique level into o and the LSE the shared level's epilogue merges with (the caller's
  // outputs checked before either launches).
  detail::SharedPrefixLevel::check_run(opt);
  detail::check_q_o_lse(spec_, q, o, lse, task_.num_qo_heads, batch_);
  run_level(q, kv, o, prefix_->unique_lse(q.shape.empty() ? 0 : q.shape[0]), stream, opt);
  prefix_->merge(q, kv, o, lse, stream, opt);
}

void BatchDecode::run_level(const TensorView& q, const PagedKVStorage& kv, const TensorView& o, const TensorView& lse,
                            cudaStream_t stream, const RunOptions& opt) const {
  if (tc_) {  // q [batch, Hq, D] is the prefill's [total_q, Hq, D]: same checks, same graph-capturable launch
    tc_->run(q, kv, o, lse, stream, opt);
    return;
  }
  page_errors_.raise_pending("kv_indices");
  device_.errors.raise_pending();
  detail::check_q_o_lse(spec_, q, o, lse, task_.num_qo_heads, batch_);
  detail::check_paged_storage(kv, spec_, task_, max_page_index_, q.device);
  detail::check_workspace_device(q.device, ws_->device());

  char* dev = static_cast<char*>(ws_->device_ptr());
  DecodeParams<NoExtra> p{};
  p.q = q.data;
  p.o = o.data;
  p.lse = detail::has(lse) ? static_cast<float*>(lse.data) : nullptr;
  p.q_stride_n = q.stride(0);
  p.q_stride_h = q.stride(1);
  p.o_stride_n = o.stride(0);
  p.o_stride_h = o.stride(1);
  // A plan on the GPU left the page table in the caller's buffers.
  const bool on_device = device_.active;
  p.kv = {kv.k().data, kv.v().data,
          on_device ? device_.kv_indptr : reinterpret_cast<const int*>(dev + layout_.kv_indptr),
          on_device ? device_.kv_indices : reinterpret_cast<const int*>(dev + layout_.indices),
          on_device ? device_.kv_last_page_len : reinterpret_cast<const int*>(dev + layout_.last),
          kv.page_stride(), kv.head_stride(), kv.token_stride(), kv.page_size(), kv.num_kv_heads(), 0,
          // Every page id is checked on the GPU, whether or not plan() read
          // them: a captured graph keeps these across plans of either kind.
          static_cast<int>(std::min<int64_t>(kv.num_pages(), INT32_MAX)), page_errors_.device_ptr()};
  p.work_indptr = reinterpret_cast<const int*>(dev + layout_.work_indptr);
  p.work_items = reinterpret_cast<const DecodeWorkItem*>(dev + layout_.items);
  p.partial_o = reinterpret_cast<float*>(dev + layout_.partial_o);
  p.partial_lse = reinterpret_cast<float*>(dev + layout_.partial_lse);
  p.counters = reinterpret_cast<int*>(dev + layout_.counters);
  p.num_qo_heads = task_.num_qo_heads;
  p.page_shift = detail::page_shift(task_.page_size);
  // The 16-bit kernels read their scales from the parameter block only (no
  // register held across the loop for them): a 16-bit cache takes float scales.
  const detail::KernelScales scales = detail::resolve_run_scales(
      opt, spec_.head_dim, q.device, is_fp8(spec_.kv_dtype) ? nullptr : "a 16-bit KV cache on CUDA cores");
  p.sm_scale = scales.sm_scale;
  p.o_scale = scales.o_scale;
  p.kv_scales = scales.tensors;
  ParamBlock block;  // p followed by the variant's extras
  pack_params(block, ParamsKind::kDecode, &p, spec_.variant, opt.extras, q.device);
  cuda::DeviceGuard guard(ws_->device());
  // The grid is the same every step (persistent CTAs): graph-capturable.
  const bool pdl = opt.pdl && !device_.take_planner_ahead();  // the planner's queues are read before the wait
  kernel_->launch(dim3(ctas_per_head_, task_.num_kv_heads), dim3(config_.threads), config_.smem_bytes, stream,
                  block.data(), pdl);
  detail::check_launch("BatchDecode::run");
}

}  // namespace tessera
