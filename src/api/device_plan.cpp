// Planning on the GPU for the batch wrappers (api/device_batch.hpp): the
// buffers' checks and the planner's launch with each wrapper's options.
#include <string>

#include "checks.hpp"
#include "shared_prefix_level.hpp"
#include "tessera/api/decode.hpp"
#include "tessera/api/prefill.hpp"
#include "tessera/runtime/device_planner.hpp"

namespace tessera {

using detail::str;

namespace detail {

void take_device_batch(DeviceSteps& steps, const DeviceBatch& b, int64_t max_batch, int64_t max_pages, bool with_qo,
                       bool paged, int device) {
  const Device dev{DeviceType::kCUDA, device};
  auto take = [&](const char* name, const TensorView& t, int64_t count) {
    if (!has(t)) throw InvalidArgument(std::string(name) + ": expected an int32 CUDA tensor for planning on the GPU");
    check_dim(name, t, 1);
    check_dtype(name, t, DType::kInt32);
    check_contiguous(name, t);
    check_device(name, t, dev);
    if (t.size(0) < count)
      throw InvalidArgument(std::string(name) + ": expected at least " + str(count) +
                            " entries (the workspace bounds), got " + str(t.size(0)));
    return static_cast<const int32_t*>(t.data);
  };
  if (!with_qo && has(b.qo_indptr))
    throw InvalidArgument("qo_indptr: decode has one query per request; expected it undefined");
  if (!paged && has(b.kv_indices))
    throw InvalidArgument("kv_indices: ragged KV has no page table; expected it undefined");
  if (!paged && has(b.kv_last_page_len))
    throw InvalidArgument("kv_last_page_len: ragged KV has no pages; expected it undefined");
  (void)take("batch_size", b.batch_size, 1);
  steps.qo_indptr = with_qo ? take("qo_indptr", b.qo_indptr, max_batch + 1) : nullptr;
  steps.kv_indptr = take("kv_indptr", b.kv_indptr, max_batch + 1);
  steps.kv_indices = paged ? take("kv_indices", b.kv_indices, max_pages) : nullptr;
  steps.kv_last_page_len = paged ? take("kv_last_page_len", b.kv_last_page_len, max_batch) : nullptr;
}

namespace {

// The planner's launch for the bounds and outputs in p (inputs from `steps`).
void launch_planner(DeviceSteps& steps, DevicePlanParams& p, const DeviceBatch& b, int device, cudaStream_t stream) {
  p.batch_size = static_cast<const int*>(b.batch_size.data);
  p.qo_indptr = steps.qo_indptr;
  p.kv_indptr = steps.kv_indptr;
  p.kv_last_page_len = steps.kv_last_page_len;
  p.error = steps.errors.device_ptr();
  const size_t smem = device_plan_smem_bytes(p);
  if (!steps.planner || smem > steps.smem_bytes) {
    steps.planner = &device_planner_kernel(device, smem);
    steps.smem_bytes = smem;
  }
  launch_device_planner(*steps.planner, p, smem, stream);
  check_launch("device planner");
  steps.active = true;
  steps.planner_ahead = true;
}

}  // namespace
}  // namespace detail

void BatchPrefill::plan_paged_on_device(const DeviceBatch& b, cudaStream_t stream) {
  plan_on_device(Source::kPaged, b, 0, stream);
}

void BatchPrefill::plan_ragged_on_device(const DeviceBatch& b, int64_t max_kv_tokens, cudaStream_t stream) {
  if (max_kv_tokens < 1 || max_kv_tokens > INT32_MAX)
    throw InvalidArgument("max_kv_tokens: expected a bound in [1, 2^31 - 1] on kv_indptr[batch] (the rows of k and v "
                          "that runs read), got " + str(max_kv_tokens));
  plan_on_device(Source::kRagged, b, max_kv_tokens, stream);
}

void BatchPrefill::plan_on_device(Source src, const DeviceBatch& b, int64_t max_kv_tokens, cudaStream_t stream,
                                  const detail::LevelRows& rows) {
  const bool paged = src == Source::kPaged;
  const char* name = paged ? "plan_paged_on_device" : "plan_ragged_on_device";
  if (prefix_) detail::SharedPrefixLevel::refuse("reads the page ids on the host; expected plan_paged");
  if (custom_mask_)
    throw InvalidArgument(std::string(name) + ": the custom_mask variant plans on the host (its mask_indptr); use " +
                          (paged ? "plan_paged" : "plan_ragged"));
  page_errors_.raise_pending("kv_indices");
  device_.errors.raise_pending();
  if (task_.max_batch < 1 || task_.max_total_q < 1 || (paged && task_.max_pages < 1))
    throw InvalidArgument(std::string("task: planning on the GPU needs the bounds max_batch, max_total_q") +
                          (paged ? " and max_pages" : "") + " (> 0), got " + str(task_.max_batch) + ", " +
                          str(task_.max_total_q) + (paged ? ", " + str(task_.max_pages) : ""));
  const bool one_query = !detail::has(b.qo_indptr);
  const int64_t max_q = one_query ? task_.max_batch : task_.max_total_q;
  if (one_query && task_.max_total_q < task_.max_batch)
    throw InvalidArgument("task: one query per request needs max_total_q >= max_batch, got " + str(task_.max_total_q));
  detail::take_device_batch(device_, b, task_.max_batch, task_.max_pages, !one_query, paged, ws_->device());
  cuda::DeviceGuard guard(ws_->device());
  if (!kernel_) configure(src, task_.max_batch, max_q, 0, paged ? task_.max_pages : 1, stream);
  if (head_groups_ != kernel_heads())
    throw InvalidArgument("group_heads: planning on the GPU plans every KV head alike, but this wrapper groups them (" +
                          std::string(opt_.group_heads == HeadGrouping::kOn ? "HeadGrouping::kOn"
                                                                            : "chosen by its first plan, of long prompts") +
                          "); expected PrefillOptions::group_heads HeadGrouping::kOff, or the first plan on the GPU");
  int plan_cta_q = 0, plan_ctas = 0;
  int64_t slot_cap = 0, split_cap = 0;
  const PlannerOptions popt = planner_options(plan_cta_q, plan_ctas, slot_cap, split_cap);
  const int group = kernel_group();
  DevicePlanParams p = device_plan_config(popt, plan_ctas, static_cast<double>(plan_cta_q));
  p.max_batch = static_cast<int>(task_.max_batch);
  p.max_pages = static_cast<int>(paged ? std::min<int64_t>(task_.max_pages, INT32_MAX) : max_kv_tokens);
  p.max_total_q = static_cast<int>(max_q);
  p.page_size = task_.page_size;
  p.decode = 0;
  p.group = group;
  p.cta_q = plan_cta_q;
  p.causal = opt_.causal_schedule ? 1 : 0;
  p.max_tiles = static_cast<int>(std::min<int64_t>(prefill_max_tiles(max_q, task_.max_batch, group, plan_cta_q), INT32_MAX));
  p.max_items = static_cast<int>(std::min<int64_t>(layout_.max_items, INT32_MAX));
  char* dev = static_cast<char*>(ws_->device_ptr());
  p.work_indptr = reinterpret_cast<int*>(dev + layout_.work_indptr);
  p.items = dev + layout_.items;
  p.first_items = reinterpret_cast<PrefillWorkItem*>(dev + layout_.first_items);
  p.row_mask = rows.mask;
  p.rows_batch = rows.batch_size;
  p.rows_indptr = rows.qo_indptr;
  detail::launch_planner(device_, p, b, ws_->device(), stream);
  if (paged) (void)page_errors_.device_ptr();  // allocated here, not in run()
  plan_ = {};
  source_kind_ = src;
  batch_ = task_.max_batch;
  total_q_ = max_q;
  total_kv_ = paged ? 0 : max_kv_tokens;  // ragged: the rows run() reads at most (k and v hold at least these)
  mask_bytes_ = 0;
  max_page_index_ = -1;  // the kernels check every id
  plan_us_ = 0;
}

void BatchDecode::plan_on_device(const DeviceBatch& b, cudaStream_t stream) {
  if (prefix_) detail::SharedPrefixLevel::refuse("reads the page ids on the host; expected plan() with host kv_indices");
  if (task_.max_batch < 1 || task_.max_pages < 1)
    throw InvalidArgument("task: planning on the GPU needs the bounds max_batch and max_pages (> 0), got " +
                          str(task_.max_batch) + ", " + str(task_.max_pages));
  if (tc_) {
    if (detail::has(b.qo_indptr))
      throw InvalidArgument("qo_indptr: decode has one query per request; expected it undefined");
    tc_->plan_paged_on_device(b, stream);
    batch_ = task_.max_batch;
    return;
  }
  page_errors_.raise_pending("kv_indices");
  device_.errors.raise_pending();
  detail::take_device_batch(device_, b, task_.max_batch, task_.max_pages, false, true, ws_->device());
  cuda::DeviceGuard guard(ws_->device());
  if (!kernel_) configure(task_.max_batch, task_.max_pages, stream);
  DevicePlanParams p = device_plan_config(planner_options(), ctas_per_head_, 1.0);
  p.max_batch = static_cast<int>(task_.max_batch);
  p.max_pages = static_cast<int>(std::min<int64_t>(task_.max_pages, INT32_MAX));
  p.max_total_q = p.max_batch;
  p.page_size = task_.page_size;
  p.decode = 1;
  p.group = 1;
  p.cta_q = 1;
  p.max_tiles = p.max_batch;
  p.max_items = static_cast<int>(std::min<int64_t>(layout_.max_items, INT32_MAX));
  char* dev = static_cast<char*>(ws_->device_ptr());
  p.work_indptr = reinterpret_cast<int*>(dev + layout_.work_indptr);
  p.items = dev + layout_.items;
  detail::launch_planner(device_, p, b, ws_->device(), stream);
  plan_ = {};
  batch_ = task_.max_batch;
  max_page_index_ = -1;  // the kernels check every id
  plan_us_ = 0;
}

}  // namespace tessera
