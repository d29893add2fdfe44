#include "shared_prefix_level.hpp"

#include <algorithm>

#include "checks.hpp"
#include "tessera/runtime/cuda.hpp"

namespace tessera::detail {

namespace {

constexpr size_t kAlign = 256;
size_t aligned(size_t x) { return (x + kAlign - 1) / kAlign * kAlign; }

// The shared level's query tile: the tensor-core decode kernel's, whose CTAs
// (two per SM on sm_90) take the SMs as the unique level's leave them, so a
// step without groups costs little more than a launch. 128-row tiles gained
// only at some group sizes (bench/shared_prefix_graph.py, arm auto-64).
constexpr int kSharedLevelCtaQ = 64;

// Splitting a request's keys into levels and merging the states is exact
// only for variants blind to key and query positions: standard, causal
// (whose cut the detection makes) and the soft cap.
bool splits_exactly(const VariantSpec& v) {
  if (v == variants::standard() || v == variants::causal()) return true;
  return v.use_softmax && v.window_left < 0 && !v.custom_mask && v.scalars.empty() && v.tensors.empty() &&
         v.headers == std::vector<std::string>{"tessera/device/variants/soft_cap.cuh"};
}

// The shared level has no mask: every shared key precedes its queries.
VariantSpec without_causal(const VariantSpec& v) {
  if (v == variants::causal()) return variants::standard();
  VariantSpec u = v;
  u.causal = false;
  if (u.name.rfind("Causal_", 0) == 0) u.name = u.name.substr(7);
  return u;
}

AttentionSpec level_spec(const AttentionSpec& spec) {
  AttentionSpec s = spec;
  s.variant = without_causal(spec.variant);
  return s;
}

TaskInfo level_task(const TaskInfo& task, int64_t rows) {
  TaskInfo t = task;
  t.max_total_q = rows;  // groups <= requests <= max_batch; shared pages <= max_pages
  t.max_fixed_chunks = 0;
  return t;
}

PrefillOptions level_options(const PlannerOptions& planner, int max_sms) {
  PrefillOptions p;
  p.planner = planner;
  p.planner.window_left = -1;
  p.max_sms = max_sms;
  p.cta_q = kSharedLevelCtaQ;
  return p;
}

size_t lse_bytes(const TaskInfo& task, int64_t rows) {
  return aligned(sizeof(float) * static_cast<size_t>(rows) * task.num_qo_heads);
}

}  // namespace

void SharedPrefixLevel::refuse(const std::string& what) {
  throw InvalidArgument("shared_prefix: " + what);
}

void SharedPrefixLevel::check(const AttentionSpec& spec, const TaskInfo& task, int64_t rows,
                              const AutoSharedPrefix& opt, const PlannerOptions& planner) {
  if (opt.min_shared_tokens < 1)
    throw InvalidArgument("shared_prefix: expected min_shared_tokens >= 1, got " + str(opt.min_shared_tokens));
  if (opt.min_members < 2)
    throw InvalidArgument("shared_prefix: expected min_members >= 2, got " + str(opt.min_members));
  if (opt.min_saved_tokens < 0)
    throw InvalidArgument("shared_prefix: expected min_saved_tokens >= 0, got " + str(opt.min_saved_tokens));
  if (is_fp8(spec.kv_dtype) || spec.q_dtype != spec.kv_dtype || spec.o_dtype != spec.q_dtype)
    refuse("expected q, kv and o of one 16-bit dtype (the levels read 16-bit caches and merge in o's), got " +
           spec.str());
  if (!spec.dims_equal()) refuse("expected head_dim_qk == head_dim_vo, got " + spec.str());
  if (!splits_exactly(spec.variant))
    refuse("the variant " + spec.variant.name +
           " depends on positions or masks that span both levels; expected standard, causal or soft cap");
  if (planner.fixed_chunk > 0)
    refuse("fixed_chunk " + str(planner.fixed_chunk) + " (batch-invariant chunks) is not implemented on the levels");
  if (task.max_batch < 1 || task.max_pages < 1 || rows < 1)
    refuse("needs the task's bounds at construction (they size the shared level): expected max_batch, max_pages "
           "(and max_total_q for prefill) >= 1, got " + str(task.max_batch) + ", " + str(task.max_pages) + ", " +
           str(rows));
}

WorkspaceSizes SharedPrefixLevel::sizes(const AttentionSpec& spec, const TaskInfo& task, int64_t rows, int num_sms,
                                        const PlannerOptions& planner, int max_sms, bool minimum) {
  const AttentionSpec s = level_spec(spec);
  const TaskInfo t = level_task(task, rows);
  const PrefillOptions p = level_options(planner, max_sms);
  const WorkspaceSizes w = minimum ? BatchPrefill::min_workspace_size(s, t, num_sms, p)
                                   : BatchPrefill::workspace_size(s, t, num_sms, p);
  // kAlign of slack each: the slices start at aligned offsets.
  return {kAlign + lse_bytes(task, rows) + aligned(w.device_bytes), kAlign + aligned(w.host_bytes)};
}

WorkspaceSizes SharedPrefixLevel::add(WorkspaceSizes own, WorkspaceSizes level) {
  return {aligned(own.device_bytes) + level.device_bytes, aligned(own.host_bytes) + level.host_bytes};
}

SharedPrefixLevel::SharedPrefixLevel(const AttentionSpec& spec, const TaskInfo& task, int64_t rows,
                                     const AutoSharedPrefix& opt, const PlannerOptions& planner, int max_sms,
                                     Workspace& workspace, WorkspaceSizes own_min)
    : task_(task), rows_(rows) {
  device_ = workspace.device();
  const int sms = cuda::device_info(device_).sm_count;
  const WorkspaceSizes ideal = sizes(spec, task, rows, sms, planner, max_sms, false);
  const WorkspaceSizes least = sizes(spec, task, rows, sms, planner, max_sms, true);
  const size_t dev = workspace.device_bytes(), host = workspace.host_bytes();
  const WorkspaceSizes need = add(own_min, least);
  if (dev < need.device_bytes || host < need.host_bytes)
    throw InvalidArgument("workspace: expected at least " + str(need.device_bytes) + " device and " +
                          str(need.host_bytes) + " pinned host bytes with shared_prefix (the wrapper's minimum and "
                          "its shared level's), got " + str(dev) + " and " + str(host));
  const size_t level_dev = dev >= add(own_min, ideal).device_bytes ? ideal.device_bytes : least.device_bytes;
  const size_t dev_at = (dev - level_dev) / kAlign * kAlign, host_at = (host - least.host_bytes) / kAlign * kAlign;
  char* d = static_cast<char*>(workspace.device_ptr());
  char* h = static_cast<char*>(workspace.host_ptr());
  own_ = std::make_unique<Workspace>(d, dev_at, h, host_at, device_);
  lse_ = reinterpret_cast<float*>(d + dev_at);
  const size_t level_at = dev_at + lse_bytes(task, rows);
  slice_ = std::make_unique<Workspace>(d + level_at, dev - level_at, h + host_at, host - host_at, device_);
  level_ = std::make_unique<BatchPrefill>(level_spec(spec), level_task(task, rows), *slice_,
                                          level_options(planner, max_sms));
  find_.min_shared_pages = (opt.min_shared_tokens + task.page_size - 1) / task.page_size;
  find_.min_members = opt.min_members;
  find_.min_saved_pages = (opt.min_saved_tokens + task.page_size - 1) / task.page_size;
  find_.causal = variants::is_causal(spec.variant);
  find_.keep_order = true;
  find_.always_levels = true;
}

namespace {
PrefillOptions without_prefix(PrefillOptions opt) {
  opt.shared_prefix = {};
  return opt;
}
}  // namespace

std::unique_ptr<SharedPrefixLevel> SharedPrefixLevel::for_prefill(const AttentionSpec& spec, const TaskInfo& task,
                                                                  const PrefillOptions& opt, Workspace& workspace) {
  check(spec, task, task.max_total_q, opt.shared_prefix, opt.planner);
  const int sms = cuda::device_info(workspace.device()).sm_count;
  const WorkspaceSizes own_min = BatchPrefill::min_workspace_size(spec, task, sms, without_prefix(opt));
  return std::make_unique<SharedPrefixLevel>(spec, task, task.max_total_q, opt.shared_prefix, opt.planner,
                                             opt.max_sms, workspace, own_min);
}

WorkspaceSizes SharedPrefixLevel::prefill_sizes(const AttentionSpec& spec, const TaskInfo& task, int num_sms,
                                                const PrefillOptions& opt, bool minimum) {
  check(spec, task, task.max_total_q, opt.shared_prefix, opt.planner);
  const PrefillOptions own = without_prefix(opt);
  return add(minimum ? BatchPrefill::min_workspace_size(spec, task, num_sms, own)
                     : BatchPrefill::workspace_size(spec, task, num_sms, own),
             sizes(spec, task, task.max_total_q, num_sms, opt.planner, opt.max_sms, minimum));
}

SharedPrefixLevel::~SharedPrefixLevel() = default;

const PrefixLevel& SharedPrefixLevel::plan(std::span<const int32_t> kv_indptr, std::span<const int32_t> kv_indices,
                                           std::span<const int32_t> kv_last_page_len,
                                           std::span<const int32_t> qo_indptr, cudaStream_t stream) {
  // The bounds first, named as the owner's plan names them.
  const int64_t batch = kv_indptr.empty() ? 0 : static_cast<int64_t>(kv_indptr.size()) - 1;
  if (batch > task_.max_batch)
    throw InvalidArgument("kv_indptr: batch size " + str(batch) + " exceeds the workspace bound max_batch=" +
                          str(task_.max_batch));
  if (static_cast<int64_t>(kv_indices.size()) > task_.max_pages)
    throw InvalidArgument("kv_indices: " + str(static_cast<int64_t>(kv_indices.size())) +
                          " pages exceed the workspace bound max_pages=" + str(task_.max_pages));
  if (!qo_indptr.empty() && qo_indptr.back() > rows_)
    throw InvalidArgument("qo_indptr: " + str(qo_indptr.back()) + " query rows exceed the workspace bound max_total_q=" +
                          str(rows_));
  find_shared_prefixes(kv_indptr, kv_indices, kv_last_page_len, task_.page_size, qo_indptr, find_, split_);
  stats_ = {};
  stats_.groups_found = static_cast<int32_t>(split_.groups.size());
  if (split_.grouped) {
    stats_.groups = stats_.groups_found;
    for (const SharedPrefixGroup& g : split_.groups) stats_.requests_in_groups += g.size;
    stats_.saved_pages = split_.saved_pages;
  }
  stats_.detect_us = split_.host_us;
  // Re-planned only when the shared level changed: its groups last as long
  // as their requests, while the unique level changes every step.
  const PrefixLevel& s = split_.shared;
  const bool unchanged = planned_ && s.qo_indptr == last_.qo_indptr && s.kv_indptr == last_.kv_indptr &&
                         s.kv_indices == last_.kv_indices && s.kv_last_page_len == last_.kv_last_page_len;
  if (!unchanged) {
    planned_ = false;  // a failed plan leaves nothing to reuse
    level_->plan_paged(s.qo_indptr, s.kv_indptr, s.kv_indices, s.kv_last_page_len, stream);
    last_ = s;  // copies into last_'s buffers (no allocation once they have grown)
    planned_ = true;
    stats_.replanned = true;
  }
  return split_.unique;
}

void SharedPrefixLevel::check_run(const RunOptions& opt) {
  if (has(opt.merge_lse))
    throw InvalidArgument("merge_lse: expected undefined with shared_prefix (the wrapper merges its own levels)");
  if (has(opt.k_scale_tensor) || has(opt.v_scale_tensor))
    throw InvalidArgument(std::string(has(opt.k_scale_tensor) ? "k_scale_tensor" : "v_scale_tensor") +
                          ": expected undefined with shared_prefix (the shared level's tensor-core kernel takes "
                          "float scales)");
}

TensorView SharedPrefixLevel::unique_lse(int64_t rows) const {
  if (rows > rows_)
    throw InvalidArgument("q: expected at most " + str(rows_) + " rows (the workspace bound), got " + str(rows));
  return TensorView(lse_, DType::kFloat32, Device{DeviceType::kCUDA, device_}, {rows, task_.num_qo_heads});
}

void SharedPrefixLevel::merge(const TensorView& q, const PagedKVStorage& kv, const TensorView& o,
                              const TensorView& lse, cudaStream_t stream, const RunOptions& opt) const {
  RunOptions merged = opt;
  merged.merge_lse = unique_lse(q.shape.empty() ? 0 : q.shape[0]);
  // Right behind the unique level's launch, which reads q, K and V and
  // writes only o and this LSE.
  merged.pdl_defer_wait = opt.pdl;
  level_->run(q, kv, o, lse, stream, merged);
}

}  // namespace tessera::detail
