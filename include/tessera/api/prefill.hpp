// Batch prefill on tensor cores (FA2 template) over any KV source: ragged
// contiguous KV, a paged cache (any page size), or a BSR matrix with any
// (Br, Bc), including Bc = 1. One kernel family serves all three: only the
// row addresses of the KV tiles differ (paper §3.2.1).
//
//   BatchPrefill pre(spec, task, workspace);
//   pre.plan_paged(qo_indptr, kv_indptr, kv_indices, kv_last_page_len, stream);  // once per step
//   pre.run(q, kv_storage, o, lse, stream);                                     // every layer
//
// Same contract as BatchDecode: plan() schedules (query tile x KV chunk) work
// items with Algorithm 1 into fixed workspace sections; run() allocates
// nothing, never synchronizes, and launches a fixed persistent grid that also
// merges split tiles, so it can be captured in a CUDA graph. The query tile
// (16/32/64/128 fused rows) is chosen at the first plan from the average query
// length x group size and then kept, so captured graphs stay valid.
//
// Custom masks (FlashInfer's custom_mask / packed_custom_mask): construct with
// spec.variant = variants::custom_mask(), then use the plan and run overloads
// that take the mask (see formats/custom_mask.hpp for the packed format):
//
//   PackedMask m = pack_custom_mask(flat_bool_mask, qo_lens, kv_lens);        // or your own bytes
//   pre.plan_ragged(qo_indptr, kv_indptr, m.indptr, stream);                   // byte offsets, host
//   pre.run_ragged(q, k, v, packed_custom_mask, o, lse, stream);              // the bytes, uint8 on the GPU
//
// plan() checks mask_indptr against the lengths and stages it with the
// schedule; run() reads the bits from the caller's device tensor (like q, its
// address is baked into a captured graph). A custom-mask BatchPrefill needs a
// mask at every plan and run; other variants reject one. The schedule is not
// clipped causally unless PrefillOptions::causal_schedule is set (only valid
// when every mask is causal or stricter, as tree-attention masks are).
// Rows that see no key get o = 0 and lse = -inf. No BSR with custom masks.
#pragma once
#include <cuda_runtime_api.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <span>
#include <utility>

#include "tessera/api/attention.hpp"
#include "tessera/api/device_batch.hpp"
#include "tessera/formats/bsr.hpp"
#include "tessera/api/page_ids.hpp"
#include "tessera/api/shared_prefix.hpp"
#include "tessera/abi/prefill_params.cuh"
#include "tessera/abi/variant_extra.cuh"
#include "tessera/runtime/planner.hpp"
#include "tessera/runtime/prefill_catalog.hpp"
#include "tessera/runtime/variant_params.hpp"

namespace tessera {

// Which kernel template runs prefill: auto = the Hopper (wgmma) template on
// sm_90 where it supports the head dim and query tile, else FA2 (mma.sync).
enum class PrefillBackend { kAuto, kFA2, kFA3 };

enum class HeadGrouping { kAuto, kOff, kOn };

// HeadGrouping::kAuto groups KV heads from this mean KV length a request of
// the first plan: below it, the coarser balance of many heads' tiles over
// more CTAs costs more than the idle SMs (docs/performance.md, head groups).
constexpr int64_t kGroupHeadsMinKv = 4096;

struct PrefillOptions {
  PrefillBackend backend = PrefillBackend::kAuto;
  PlannerOptions planner;
  int max_sms = 0;   // use at most this many SMs (0: all)
  // 0: chosen by the heuristic at the first plan; else 16, 32, 64, 128, or 8
  // (fp8 caches, or 16-bit ones of q's dtype: the keys as the mma's rows).
  int cta_q = 0;
  // Let the planner skip KV beyond what a query tile can see. Defaults to on
  // for the built-in causal variant; a custom variant whose mask is causal
  // (or stricter) may set it too.
  bool causal_schedule = false;
  // Plan the KV heads together in groups (see head_groups()) so the grid
  // fills every SM: one plan per head leaves 4 of an H100's or H200's 132
  // idle with 8, 16 or 32 heads. Auto groups them where the first plan is
  // long prompts on the Hopper kernel's 128-row tiles (a mean KV length of at
  // least kGroupHeadsMinKv) and the plan runs on the host; per head
  // otherwise, where the finer split of one head's tiles over fewer CTAs
  // balances better. Fixed at the first plan, like the tile.
  HeadGrouping group_heads = HeadGrouping::kAuto;
  // Hopper kernel on contiguous (ragged) KV: CTA pairs (a cluster of 2) take
  // 256-row query tiles, 128 rows each, and receive every K / V tile in one
  // TMA multicast, so L2 serves each tile once per pair (less energy per FLOP
  // under the power cap). 0: auto (off: on the H100 pairs measured 0.95x at
  // 1k and +-3% at 8k-16k), 1: off, 2: on where the kernel and KV source
  // allow it. Fixed at the first plan(), like the tile.
  int cluster = 0;
  // Custom masks: before each run, a pass over the mask trims every work
  // item's KV range to the tiles holding a key that one of its queries sees
  // (page/mask_trim.cuh), so fully masked tiles at either end of a row block are
  // neither loaded nor computed (causal-like, banded and document masks).
  // Same outputs, bit for bit.
  bool trim_masked_tiles = true;
  // Tile override for experts and tile sweeps (see PrefillTile; all 0: the
  // heuristic's). It must suit every query tile the first plan may choose:
  // pin cta_q (and backend) to set a warp layout. Checked at construction.
  PrefillTile tile;
  // fp8 caches on the Hopper kernel: run both GEMMs on fp8 tensor cores
  // (twice the 16-bit rate) instead of widening K / V to q's type. The
  // kernel splits q into two e4m3 terms (its rounding and the rounding's
  // residual, about 7 significant bits; one scale per 16 rows of a query
  // tile) and rounds the softmax weights P to e4m3, so outputs are less
  // exact than the default path's (docs/performance.md states speed and
  // error). Needs head dim 128, a variant that leaves K / V rows as they
  // are and the Hopper kernel (sm_90a; backend auto or fa3); InvalidArgument
  // naming fp8_mma otherwise.
  bool fp8_mma = false;
  // Automatic shared prefixes (api/shared_prefix.hpp): plan_paged() from
  // host page ids (or plan_bsr) splits every step into a unique level on
  // this wrapper's kernel and a shared level merged into o, groups of
  // adjacent requests that share full pages reading them once (causal: each
  // member shares only pages before its first query). Needs task.max_batch,
  // max_total_q and max_pages; takes the tail of the workspace
  // (workspace_size() counts it); the other plan forms raise InvalidArgument
  // naming shared_prefix.
  AutoSharedPrefix shared_prefix;
};

class PrefillPair;
namespace detail {
class SharedPrefixLevel;
}

class BatchPrefill {
 public:
  BatchPrefill(AttentionSpec spec, TaskInfo task, Workspace& workspace, PrefillOptions opt = {});
  ~BatchPrefill();
  BatchPrefill(BatchPrefill&&) noexcept;
  BatchPrefill& operator=(BatchPrefill&&) noexcept;

  using Sizes = WorkspaceSizes;
  // Workspace for the bounds in `task` (max_batch, max_total_q, max_pages > 0)
  // on a GPU with num_sms multiprocessors, whatever query tile is chosen:
  // the ideal size, with partial states for the planner's worst case.
  static Sizes workspace_size(const AttentionSpec& spec, const TaskInfo& task, int num_sms, const PrefillOptions& opt = {});
  // The smallest workspace accepted for the same bounds (FlashInfer callers
  // bring fixed buffers, e.g. 16 MB): no partial states. Between the two, the
  // first plan gives the partial states whatever rows fit and the planner
  // splits less KV to stay within them (PlannerOptions::max_slots): same
  // results, less load balance on long-KV batches.
  static Sizes min_workspace_size(const AttentionSpec& spec, const TaskInfo& task, int num_sms,
                                  const PrefillOptions& opt = {});
  // The split-KV scratch (merge counters and partial states) that a run uses
  // only while it runs: BatchPrefills whose runs never overlap (one stream,
  // e.g. the levels of a CascadeAttention) may share one region of
  // scratch_size() bytes (at least min_scratch_size(): fewer partial rows, as
  // above), given by use_shared_scratch() before the first plan; their
  // workspaces then need only workspace_size_shared().
  static size_t scratch_size(const AttentionSpec& spec, const TaskInfo& task, int num_sms, const PrefillOptions& opt = {});
  static size_t min_scratch_size(const AttentionSpec& spec, const TaskInfo& task, int num_sms,
                                 const PrefillOptions& opt = {});
  static Sizes workspace_size_shared(const AttentionSpec& spec, const TaskInfo& task, int num_sms,
                                     const PrefillOptions& opt = {});
  void use_shared_scratch(void* device_ptr, size_t bytes);

  // The workspace sections of a grid of ctas_per_group x groups CTAs with
  // cta_q-row query tiles (what the first plan lays out; public for tests).
  struct Layout {
    size_t qo_indptr = 0, kv_indptr = 0, indices = 0, last = 0, mask_indptr = 0, work_indptr = 0, items = 0;
    size_t first_items = 0, staged = 0;
    size_t trimmed_items = 0, trimmed_first = 0;  // custom masks: the items trim_masked_items() narrowed
    size_t counters = 0, merge_words = 0, partial_lse = 0, partial_o = 0;  // relative to the scratch base
    size_t scratch = 0, scratch_bytes = 0, total = 0;      // the scratch's offset in the workspace, its size
    size_t ideal_scratch_bytes = 0, min_scratch_bytes = 0;  // with every partial row, with none
    int64_t max_items = 0, max_split_tiles = 0, max_slot_rows = 0;  // what the sections hold (per head group)
    int64_t ideal_slot_rows = 0;  // max_slot_rows of an unconstrained workspace
  };
  // device_bytes: the workspace's size; the partial states get the rows (whole
  // query tiles per group) that fit, at most ideal_slot_rows. shared_scratch:
  // the size of a shared scratch region (use_shared_scratch), which then holds
  // the split-KV sections instead of the workspace's tail. InvalidArgument
  // (naming the workspace or scratch and the minimum) when even no partial
  // rows do not fit.
  static Layout layout_for(const AttentionSpec& spec, const TaskInfo& task, int ctas_per_group, int groups, int cta_q,
                           int fixed_chunk, size_t device_bytes = SIZE_MAX, const size_t* shared_scratch = nullptr);

  // Paged KV: kv_indptr counts pages.
  void plan_paged(std::span<const int32_t> qo_indptr, std::span<const int32_t> kv_indptr,
                  std::span<const int32_t> kv_indices, std::span<const int32_t> kv_last_page_len,
                  cudaStream_t stream = nullptr);
  // Paged KV whose page ids stay on the GPU (api/page_ids.hpp): kv_indices is
  // a 1-D int32 CUDA tensor on the workspace's device with at least
  // kv_indptr[batch] entries. plan() copies them on `stream` without reading
  // them; the kernels check them, and a bad id is raised by the next plan()
  // or run().
  void plan_paged(std::span<const int32_t> qo_indptr, std::span<const int32_t> kv_indptr,
                  const TensorView& kv_indices, std::span<const int32_t> kv_last_page_len,
                  cudaStream_t stream = nullptr);
  // Ragged KV: kv_indptr counts tokens of one [total_kv, Hkv, D] tensor.
  void plan_ragged(std::span<const int32_t> qo_indptr, std::span<const int32_t> kv_indptr, cudaStream_t stream = nullptr);
  // Custom mask (variants::custom_mask()): as above, plus mask_indptr
  // [batch + 1], the byte offset of each request's packed bits in the tensor
  // run() takes: request i spans ceil(qo_len_i * kv_len_i / 8) bytes.
  void plan_paged(std::span<const int32_t> qo_indptr, std::span<const int32_t> kv_indptr,
                  std::span<const int32_t> kv_indices, std::span<const int32_t> kv_last_page_len,
                  std::span<const int32_t> mask_indptr, cudaStream_t stream = nullptr);
  void plan_ragged(std::span<const int32_t> qo_indptr, std::span<const int32_t> kv_indptr,
                   std::span<const int32_t> mask_indptr, cudaStream_t stream = nullptr);
  // Block-sparse: q has bsr.rows() rows; block row r (Br rows) attends to its
  // column blocks (Bc tokens each) of a [bsr.cols(), Hkv, D] KV, viewed by
  // run() as pages of Bc tokens. Requires task.page_size == Bc.
  void plan_bsr(const BSRMatrix& bsr, cudaStream_t stream = nullptr);
  // Paged KV planned on the GPU (api/device_batch.hpp): enqueues the device
  // planner on `stream`; it reads the step from `batch` when it runs
  // (qo_indptr undefined: one query per request, as decode). Needs the
  // bounds task.max_batch, max_total_q and max_pages; not for custom masks
  // or grouped heads. run() then takes q and o of max_total_q rows (max_batch
  // with one query per request); rows past the step's queries are left as
  // they are. The first run() after it never starts early (RunOptions::pdl).
  // A host plan afterwards plans on the host again.
  void plan_paged_on_device(const DeviceBatch& batch, cudaStream_t stream = nullptr);
  // Ragged KV planned on the GPU: as above, batch.kv_indptr counting tokens
  // and kv_indices / kv_last_page_len undefined (needs the bounds max_batch
  // and max_total_q). max_kv_tokens bounds kv_indptr[batch] (a step beyond
  // it is recorded and left unplanned); run_ragged() then takes k and v of
  // at least max_kv_tokens rows.
  void plan_ragged_on_device(const DeviceBatch& batch, int64_t max_kv_tokens, cudaStream_t stream = nullptr);

  // Paged or BSR: kv is the page storage (for BSR: KV [N, Hkv, D] viewed as
  // [N / Bc, Bc, Hkv, D], NHD). q [total_q, Hq, D]; o like q; lse [total_q, Hq] or undefined.
  void run(const TensorView& q, const PagedKVStorage& kv, const TensorView& o, const TensorView& lse,
           cudaStream_t stream = nullptr, const RunOptions& opt = {}) const;
  // Ragged: k, v [total_kv, Hkv, D].
  void run_ragged(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& o,
                  const TensorView& lse, cudaStream_t stream = nullptr, const RunOptions& opt = {}) const;
  // Custom mask: packed_custom_mask is a 1-D contiguous uint8 CUDA tensor on
  // q's device holding at least mask_indptr[batch] bytes (of the last plan).
  void run(const TensorView& q, const PagedKVStorage& kv, const TensorView& packed_custom_mask, const TensorView& o,
           const TensorView& lse, cudaStream_t stream = nullptr, const RunOptions& opt = {}) const;
  void run_ragged(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& packed_custom_mask,
                  const TensorView& o, const TensorView& lse, cudaStream_t stream = nullptr,
                  const RunOptions& opt = {}) const;

  const PrefillPlan& last_plan() const { return plan_; }
  double last_plan_us() const { return plan_us_; }
  const PrefillConfig& config() const { return config_; }
  // Persistent grid: ctas_per_group() x head_groups() CTAs; group g runs the
  // plan over (request, head) pairs of KV heads g * H / groups ... (g + 1) * H / groups - 1.
  int ctas_per_group() const { return ctas_per_group_; }
  int head_groups() const { return head_groups_; }
  int cluster() const { return config_.cluster; }  // CTAs per cluster (2: pairs sharing K / V tiles)
  const jit::KernelSource& kernel_source() const { return source_; }
  bool uses_custom_mask() const { return custom_mask_; }
  // With PrefillOptions::shared_prefix: what the last plan found; else nullptr.
  const SharedPrefixStats* shared_prefix_stats() const;

 private:
  enum class Source { kNone, kPaged, kRagged };
  // Every size the static functions report, each the largest over the
  // configurations a first plan may choose.
  struct SizeSet {
    Sizes whole, shared, min_whole;
    size_t scratch = 0, min_scratch = 0;
  };
  static SizeSet sizes(const AttentionSpec& spec, const TaskInfo& task, int num_sms, const PrefillOptions& opt);
  // Whether a first plan on configuration c may group the KV heads (kOn, or
  // kAuto on the Hopper kernel's 128-row tiles), and whether it may not.
  static bool may_group_heads(const PrefillOptions& opt, const PrefillConfig& c);
  static bool may_plan_per_head(const PrefillOptions& opt) { return opt.group_heads != HeadGrouping::kOn; }
  // The task as the plan and the kernel see it: num_kv_heads / kv_heads KV
  // heads (PrefillConfig::kv_heads: adjacent heads a CTA), each with
  // kv_heads x group query heads.
  static TaskInfo kernel_task(const TaskInfo& task, int kv_heads);
  // The configured kernel's KV heads and query heads per KV head (after
  // configure()).
  int kernel_heads() const { return task_.num_kv_heads / config_.kv_heads; }
  int kernel_group() const { return task_.num_qo_heads / kernel_heads(); }
  char* scratch_base() const;
  void plan_common(Source src, std::span<const int32_t> qo_indptr, std::span<const int32_t> kv_indptr,
                   const PageIds& kv_indices, std::span<const int32_t> kv_last_page_len,
                   std::span<const int32_t> kv_lens, std::span<const int32_t> mask_indptr, cudaStream_t stream);
  bool use_hopper(int cta_q) const;
  // total_kv: the first plan's KV tokens over all requests (0: unknown, as
  // when planning on the GPU), for HeadGrouping::kAuto.
  void configure(Source src, int64_t batch, int64_t total_q, int64_t total_kv, int64_t n_indices,
                 cudaStream_t stream);
  // rows: a cascade level's row mask or row check (device_batch.hpp).
  void plan_on_device(Source src, const DeviceBatch& batch, int64_t max_kv_tokens, cudaStream_t stream,
                      const detail::LevelRows& rows = {});
  PlannerOptions planner_options(int& plan_cta_q, int& plan_ctas, int64_t& slot_cap, int64_t& split_cap) const;
  // CTAs per cluster for the first plan's kernel (config_ already chosen).
  int choose_cluster(Source src) const;
  // Whether a mask was given where one is needed (and only there).
  void check_mask_given(bool given, const char* name, const char* how) const;
  void check_mask_tensor(const TensorView* packed_custom_mask, const TensorView& q) const;
  // Validate the KV page table / indptr and fill kv_lens_.
  void paged_lengths(std::span<const int32_t> kv_indptr, const PageIds& kv_indices,
                     std::span<const int32_t> kv_last_page_len);
  void ragged_lengths(std::span<const int32_t> kv_indptr);
  void run_paged(const TensorView& q, const PagedKVStorage& kv, const TensorView* mask, const TensorView& o,
                 const TensorView& lse, cudaStream_t stream, const RunOptions& opt) const;
  void run_ragged_impl(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView* mask,
                       const TensorView& o, const TensorView& lse, cudaStream_t stream, const RunOptions& opt) const;
  // run()'s checks, and the KV view its kernel reads.
  device::PagedKV paged_run_view(const TensorView& q, const PagedKVStorage& kv, const TensorView* mask,
                                 const TensorView& o, const TensorView& lse) const;
  device::PagedKV ragged_run_view(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView* mask,
                                  const TensorView& o, const TensorView& lse) const;
  // The kernel's parameters for a run: p, and block (p with the variant's extras).
  void pack_run(const TensorView& q, const TensorView& o, const TensorView& lse, const device::PagedKV& kv,
                const TensorView* mask, const RunOptions& opt, PrefillParams<NoExtra>& p, ParamBlock& block) const;
  bool trims(const TensorView* mask) const { return mask != nullptr && opt_.trim_masked_tiles; }
  // The Hopper kernel's TMA descriptors for a run.
  Sm90TensorMaps tensor_maps(const TensorView& q, const device::PagedKV& kv) const;
  void launch(const TensorView& q, const TensorView& o, const TensorView& lse, const device::PagedKV& kv,
              const TensorView* mask, cudaStream_t stream, const RunOptions& opt) const;
  // Custom masks: writes the plan's items trimmed to their visible KV tiles.
  void trim_items(const TensorView& mask, cudaStream_t stream, bool pdl) const;
  friend class PrefillPair;        // runs two planned wrappers in one launch
  friend class CascadeAttention;  // plans its levels on the GPU with their row checks

  AttentionSpec spec_;
  TaskInfo task_;
  // shared_prefix: the shared level, which also holds this wrapper's slice
  // of the workspace (ws_ points there).
  std::unique_ptr<detail::SharedPrefixLevel> prefix_;
  Workspace* ws_;
  PrefillOptions opt_;
  PrefillConfig config_;
  jit::KernelSource source_;
  const jit::LoadedKernel* kernel_ = nullptr;
  const jit::LoadedKernel* trim_kernel_ = nullptr;  // custom masks: trim_masked_items (loaded by the first plan)
  int trim_blocks_ = 0;
  char* shared_scratch_ = nullptr;  // use_shared_scratch(): the split-KV sections live there
  size_t shared_scratch_bytes_ = 0;
  int ctas_per_group_ = 0, head_groups_ = 0, ctas_per_sm_ = 1;
  Layout layout_;
  Planner planner_;
  PrefillPlan plan_;
  std::vector<int32_t> qo_lens_, kv_lens_;
  std::vector<int32_t> group_qo_lens_, group_kv_lens_;  // per (request, head of the group) when heads are grouped
  double plan_us_ = 0;
  Source source_kind_ = Source::kNone;
  bool custom_mask_ = false;  // spec.variant is variants::custom_mask()
  int64_t total_q_ = 0, total_kv_ = 0, batch_ = -1, max_page_index_ = -1, mask_bytes_ = 0;
  int32_t checked_max_page_ = -1;                  // largest page id paged_lengths() saw
  mutable PageIdErrors page_errors_;               // where the kernels record a bad page id (paged runs)
  detail::DeviceSteps device_;                     // plan_*_on_device(): see BatchDecode
  std::chrono::steady_clock::time_point plan_t0_;  // when the current plan() began (for last_plan_us)
};

}  // namespace tessera
