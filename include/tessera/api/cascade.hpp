// Composable formats (paper §3.1.2, Figure 3): one attention over a paged KV
// cache split into levels, each a block-sparse view of the same page pool,
// whose partial results merge through the attention state (O, LSE).
//
// Parallel generation and prefix caching give many requests the same first
// pages. Flat, every request's CTAs read those pages again. As levels, the
// shared pages form one "request" whose query rows are all the queries that
// share them (a BSR block of Br = their count): one query tile reads each
// shared KV tile once, on the tensor cores. The unique suffixes form the last
// level, one request per request as usual. Levels: 0 = the outermost prefix
// (e.g. a system prompt all requests share), ..., L-1 = each request's own pages.
//
//   std::vector<AttentionSpec> specs = {plain, plain, causal};   // one per level
//   CascadeAttention cascade(specs, task, workspace);            // task bounds > 0
//   cascade.plan(levels, stream);                                // once per step
//   cascade.run(q, kv, o, lse, stream);                          // every layer
//
// Level i groups the query rows by qo_indptr (each level covers all rows, in
// the same order: its last entry is the step's total query length) and
// gives each group its pages (kv_indptr / kv_indices / kv_last_page_len, as
// BatchPrefill::plan_paged takes them). A group with no pages at some level
// contributes nothing there (LSE -inf). Only the last level should be causal:
// the shared pages precede every query row, so no row may be masked there.
//
// Each level is a BatchPrefill in its own fixed slice of the workspace, so
// run() is a fixed sequence of launches (level 0 into o / lse, then each
// further level into a scratch state merged into o / lse in place): it
// allocates nothing and can be captured in a CUDA graph like a single level.
//
// Shared prefixes need not be listed by hand: find_shared_prefixes
// (formats/shared_prefix.hpp) finds them in a flat page table, and
// cascade_levels() below turns its split into the two levels.
#pragma once
#include <array>
#include <memory>
#include <span>
#include <vector>

#include "tessera/api/prefill.hpp"
#include "tessera/formats/shared_prefix.hpp"

namespace tessera {

// One level of a step: host arrays, as for BatchPrefill::plan_paged.
struct CascadeLevel {
  std::span<const int32_t> qo_indptr;         // [groups + 1], last = the step's total query rows
  std::span<const int32_t> kv_indptr;         // [groups + 1] (in pages)
  std::span<const int32_t> kv_indices;        // [kv_indptr[groups]]
  std::span<const int32_t> kv_last_page_len;  // [groups]
  // Or the page ids on the GPU (api/page_ids.hpp; kv_indices then unused): a
  // 1-D int32 CUDA tensor on the workspace's device with at least
  // kv_indptr[groups] entries, copied by plan() without being read.
  const TensorView* kv_indices_device = nullptr;
};

// The two levels of a shared-prefix split (find_shared_prefixes with
// split.split true; InvalidArgument naming `split` otherwise): {shared,
// unique}, spans into `split`, which must stay alive and unchanged until
// plan() returns. Plan them on a two-level CascadeAttention whose level 0
// has no mask and whose level 1 is causal for a causal prefill (detected
// with SharedPrefixOptions::causal). Its query rows are in split.order:
// unless split.identity_order, gather q's rows by split.row_order before
// run() and scatter o / lse back to those rows.
std::array<CascadeLevel, 2> cascade_levels(const SharedPrefixSplit& split);

class CascadeAttention {
 public:
  // level_specs: one AttentionSpec per level (same dtypes and head dim). The
  // task's bounds (max_batch: groups or requests per level, max_total_q,
  // max_pages: page ids per level) must be >= 1: they size every level's slice.
  CascadeAttention(std::vector<AttentionSpec> level_specs, TaskInfo task, Workspace& workspace, PrefillOptions opt = {});
  ~CascadeAttention();
  CascadeAttention(CascadeAttention&&) noexcept;
  CascadeAttention& operator=(CascadeAttention&&) noexcept;

  using Sizes = WorkspaceSizes;
  // The ideal workspace, and the smallest accepted: between the two the
  // levels' shared split-KV scratch gets what fits, so the levels split less
  // KV (see BatchPrefill::min_workspace_size).
  static Sizes workspace_size(const std::vector<AttentionSpec>& level_specs, const TaskInfo& task, int num_sms,
                              const PrefillOptions& opt = {});
  static Sizes min_workspace_size(const std::vector<AttentionSpec>& level_specs, const TaskInfo& task, int num_sms,
                                  const PrefillOptions& opt = {});

  // levels.size() == num_levels(). Validates every level before planning any.
  void plan(std::span<const CascadeLevel> levels, cudaStream_t stream = nullptr);

  // The levels planned on the GPU (api/device_batch.hpp): one DeviceBatch
  // per level in device buffers sized for the task's bounds (qo_indptr
  // grouping the query rows, kv_indptr / kv_indices / kv_last_page_len as
  // plan_paged_on_device takes them), read when each level's planner runs:
  // one CUDA graph of plan_on_device() and every layer's run() serves any
  // step within the bounds. Level 0's planner marks the step's query rows
  // (its qo_indptr[batch]) for the merges; a level whose qo_indptr ends
  // elsewhere is recorded and left unplanned, and the next plan or run on
  // the host raises it (InvalidArgument naming the level). run() then takes
  // q, o and lse of max_total_q rows; rows past the step's are left as they are.
  void plan_on_device(std::span<const DeviceBatch> levels, cudaStream_t stream = nullptr);

  // q [rows, Hq, D] with the plan's total_q <= rows <= task.max_total_q
  // (rows beyond total_q are left as they are: capture a CUDA graph with
  // tensors of the largest step and replay it after any re-plan); kv the page
  // pool all levels index; o like q; lse [rows, Hq] float32 (base 2) or undefined.
  void run(const TensorView& q, const PagedKVStorage& kv, const TensorView& o, const TensorView& lse,
           cudaStream_t stream = nullptr, const RunOptions& opt = {}) const;

  int num_levels() const { return static_cast<int>(levels_.size()); }
  const BatchPrefill& level(int i) const;
  double last_plan_us() const { return plan_us_; }

 private:
  struct Level;
  std::vector<std::unique_ptr<Level>> levels_;
  TaskInfo task_;
  Workspace* ws_ = nullptr;
  AttentionSpec spec0_;  // level 0's (every level has its dtypes and head dim)
  size_t state_o_ = 0, scratch_o_ = 0, scratch_lse_ = 0, own_lse_ = 0;  // byte offsets in the workspace
  std::unique_ptr<Workspace> row_mask_;  // its slice: 1 per planned query row, 0 beyond
  std::vector<int32_t> kv_lens_;  // plan()'s scratch for the page-table checks
  int64_t total_q_ = -1;
  double plan_us_ = 0;
};

}  // namespace tessera
