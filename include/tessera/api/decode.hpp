// Batch decode over a paged KV cache (or a BSR matrix with Br = 1): the
// load-balanced planner plus the persistent split-KV kernel with fused merge.
//
//   BatchDecode dec(spec, task, workspace);
//   dec.plan(kv_indptr, kv_indices, kv_last_page_len, stream);   // once per step
//   dec.run(q, kv, o, lse, stream);                              // every layer
//
// plan() runs Algorithm 1 on the host, writes the per-CTA work queues into
// fixed sections of the workspace with one async copy, and reuses them for
// every run() until the next plan(). run() allocates nothing and never
// synchronizes, and its grid never changes, so run() can be captured in a CUDA
// graph and replayed after plan() is called again with new lengths.
// Workspace bounds (max batch, max pages) come from the task, or else from the
// first plan(); a later plan beyond them is an error.
//
// The step runs on one of two kernels. The tensor-core path decodes as a
// prefill whose requests each have one query: head-group fusion packs a
// request's group of query heads into rows of one query tile, so every K/V
// tile read feeds the whole group through mma. The CUDA-core kernel computes
// per-head dot products. DecodeOptions::use_tensor_cores is FlashInfer's
// option of the same name and, as there, a hint: false lets the wrapper pick
// (the tensor cores on sm_90 for built-in variants with q_dtype == kv_dtype,
// where they were faster at every measured batch, length and group size; the
// CUDA cores otherwise), true asks for the tensor cores. cuda_cores, or any
// CUDA-core tuning option, asks for the CUDA-core kernel. The contract
// (bounds, graph capture, errors) is the same on both paths. On the tensor
// cores a group of at most 8 heads runs on 8-row tiles of the FA2 template
// (the keys as the mma's rows) where the variant leaves K / V rows as
// stored, else on the Hopper kernel (sm_90) or the FA2 template's 16-row
// tiles. An fp8 KV cache (kv_dtype float8_e4m3fn / float8_e5m2) runs on the
// tensor cores on sm_90 and with use_tensor_cores (the FA2 template, which
// widens K / V fragments in registers; tc_cta_q 64 runs the Hopper kernel),
// else on the CUDA-core kernel, which widens it in registers too; scale
// tensors (RunOptions) work on either.
// Head dim 512 (and unequal head dims) runs on the tensor-core path whatever
// use_tensor_cores says: a warp of the CUDA-core kernel holds a row of at
// most 256 16-bit features. What only the CUDA-core kernel does (fp8 caches,
// q_dtype != kv_dtype, a user variant without use_tensor_cores, cuda_cores
// or its tuning options) is refused there with an InvalidArgument naming
// head_dim.
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "tessera/api/attention.hpp"
#include "tessera/api/device_batch.hpp"
#include "tessera/api/page_ids.hpp"
#include "tessera/api/prefill.hpp"
#include "tessera/api/shared_prefix.hpp"
#include "tessera/formats/bsr.hpp"
#include "tessera/runtime/planner.hpp"

namespace tessera {

struct DecodeOptions {
  PlannerOptions planner;
  int max_sms = 0;      // use at most this many SMs (0: all), e.g. to overlap other streams (paper Appendix E)
  // Tuning of the CUDA-core kernel (must stay 0 with use_tensor_cores):
  int ctas_per_sm = 0;  // 0: from the tile configuration and the kernel's occupancy
  int tile = 0;         // KV tokens per pipeline stage (0: heuristic)
  int stages = 0;       // pipeline depth (0: heuristic)
  int heads_per_thread = 0;  // at most this many of a group's query heads per thread, 1..4 (0: heuristic, 4)
  // Run on the tensor-core prefill kernel (see the file comment). Needs
  // q_dtype == kv_dtype; planner and max_sms apply as on the CUDA-core path.
  // false: the wrapper picks the kernel (see the file comment).
  bool use_tensor_cores = false;
  // Run on the CUDA-core kernel whatever the wrapper would pick (implied by a
  // non-zero ctas_per_sm, tile, stages or heads_per_thread; excludes
  // use_tensor_cores).
  bool cuda_cores = false;
  // On the tensor cores: the prefill kernel's query tile (0: 8 rows, the
  // keys as the mma's rows, where the group has at most 8 heads and the
  // variant leaves K / V rows as stored; else 16 for fp8 caches and the
  // prefill heuristic's for 16-bit ones: 64 on sm_90; else 8 (fp8 caches,
  // or 16-bit ones of q's dtype), 16, 32, 64 or 128 fused rows, 64 / 128
  // run the Hopper kernel on sm_90).
  int tc_cta_q = 0;
  // Automatic shared prefixes (api/shared_prefix.hpp): plan() from host page
  // ids splits every step into a unique level on this wrapper's kernel and a
  // shared level merged into o, groups of adjacent requests that share full
  // pages reading them once. Needs task.max_batch and max_pages; takes the
  // tail of the workspace (workspace_size() counts it).
  AutoSharedPrefix shared_prefix;
};

namespace detail {
class SharedPrefixLevel;
}

class BatchDecode {
 public:
  BatchDecode(AttentionSpec spec, TaskInfo task, Workspace& workspace, DecodeOptions opt = {});
  ~BatchDecode();
  BatchDecode(BatchDecode&&) noexcept;
  BatchDecode& operator=(BatchDecode&&) noexcept;

  using Sizes = WorkspaceSizes;
  // Workspace needed for these bounds (task.max_batch, task.max_pages > 0)
  // on a GPU with `num_sms` multiprocessors; with use_tensor_cores, the
  // prefill wrapper's (BatchPrefill::workspace_size, max_total_q = max_batch).
  // That is the ideal size (partial states for the planner's worst case);
  // min_workspace_size() is the smallest accepted, without partial states.
  // Between the two, the first plan gives the partial states the rows that
  // fit and the planner splits less KV to stay within them (see
  // BatchPrefill::min_workspace_size).
  static Sizes workspace_size(const AttentionSpec& spec, const TaskInfo& task, int num_sms, const DecodeOptions& opt = {});
  static Sizes min_workspace_size(const AttentionSpec& spec, const TaskInfo& task, int num_sms,
                                  const DecodeOptions& opt = {});

  void plan(std::span<const int32_t> kv_indptr, std::span<const int32_t> kv_indices,
            std::span<const int32_t> kv_last_page_len, cudaStream_t stream = nullptr);
  // Page ids that stay on the GPU (api/page_ids.hpp): kv_indices is a 1-D
  // int32 CUDA tensor on the workspace's device with at least
  // kv_indptr[batch] entries. plan() copies them on `stream` without reading
  // them; the kernels check them, and a bad id is raised by the next plan()
  // or run().
  void plan(std::span<const int32_t> kv_indptr, const TensorView& kv_indices,
            std::span<const int32_t> kv_last_page_len, cudaStream_t stream = nullptr);
  // A BSR matrix with Br = 1: block row i is request i, column blocks are its
  // pages (Bc = page size), last_block_len its last page's fill.
  void plan(const BSRMatrix& bsr, cudaStream_t stream = nullptr);
  // Planning on the GPU (api/device_batch.hpp): enqueues the device planner
  // on `stream`; it reads the step from `batch` (qo_indptr undefined: one
  // query per request) when it runs. Needs the bounds task.max_batch and
  // task.max_pages. run() then takes q and o of max_batch rows; rows past
  // the step's batch are left as they are. The first run() after it never
  // starts early (RunOptions::pdl), since it reads the planner's queues.
  // A host plan() afterwards plans on the host again.
  void plan_on_device(const DeviceBatch& batch, cudaStream_t stream = nullptr);

  // q [batch, Hq, D]; o like q; lse [batch, Hq] float32 or undefined.
  void run(const TensorView& q, const PagedKVStorage& kv, const TensorView& o, const TensorView& lse,
           cudaStream_t stream = nullptr, const RunOptions& opt = {}) const;

  // The CUDA-core path's schedule and tile; with use_tensor_cores see
  // tensor_core_prefill()->last_plan() and ->config() instead.
  const DecodePlan& last_plan() const { return plan_; }
  const DecodeConfig& config() const { return config_; }
  double last_plan_us() const { return plan_us_; }  // host time of the last plan()
  int ctas_per_head() const { return tc_ ? tc_->ctas_per_group() : ctas_per_head_; }
  const jit::KernelSource& kernel_source() const { return tc_ ? tc_->kernel_source() : source_; }
  // Whether plan()/run() use the tensor-core path: use_tensor_cores, or the
  // wrapper's pick for this spec on `device` (see the file comment).
  static bool runs_on_tensor_cores(const AttentionSpec& spec, const DecodeOptions& opt, int device);
  // The prefill wrapper that runs decode on tensor cores, else nullptr.
  const BatchPrefill* tensor_core_prefill() const { return tc_.get(); }
  // With DecodeOptions::shared_prefix: what the last plan() found; else nullptr.
  const SharedPrefixStats* shared_prefix_stats() const;

  // The CUDA-core path's workspace sections for ctas_per_head CTAs per KV
  // head (what the first plan lays out; public for tests). The partial states
  // get the slots (each num_qo_heads rows) that fit device_bytes, at most
  // ideal_slots; InvalidArgument naming the workspace and its minimum when
  // even none fit.
  struct Layout {
    size_t kv_indptr = 0, indices = 0, last = 0, work_indptr = 0, items = 0, staged = 0;
    size_t counters = 0, partial_lse = 0, partial_o = 0, total = 0;
    size_t ideal_total = 0, min_total = 0;  // with every partial slot, with none
    int64_t max_slots = 0, ideal_slots = 0, max_items = 0;
  };
  static Layout layout_for(const AttentionSpec& spec, const TaskInfo& task, int ctas_per_head, int fixed_chunk,
                           size_t device_bytes = SIZE_MAX);

 private:
  static Sizes sizes(const AttentionSpec& spec, const TaskInfo& task, int num_sms, const DecodeOptions& opt,
                     bool minimum);
  void plan_ids(std::span<const int32_t> kv_indptr, const PageIds& kv_indices, const TensorView* device_indices,
                std::span<const int32_t> kv_last_page_len, cudaStream_t stream);
  void configure(int64_t batch, int64_t n_indices, cudaStream_t stream);
  PlannerOptions planner_options() const;
  void plan_tensor_cores(std::span<const int32_t> kv_indptr, const PageIds& kv_indices,
                         const TensorView* device_indices, std::span<const int32_t> kv_last_page_len,
                         cudaStream_t stream);
  void run_level(const TensorView& q, const PagedKVStorage& kv, const TensorView& o, const TensorView& lse,
                 cudaStream_t stream, const RunOptions& opt) const;

  AttentionSpec spec_;
  TaskInfo task_;
  Workspace* ws_;
  DecodeOptions opt_;
  DecodeConfig config_;
  jit::KernelSource source_;
  const jit::LoadedKernel* kernel_ = nullptr;
  int ctas_per_head_ = 0;
  Layout layout_;
  Planner planner_;
  DecodePlan plan_;
  std::vector<int32_t> kv_lens_;
  double plan_us_ = 0;
  int64_t batch_ = -1, max_page_index_ = -1;
  mutable PageIdErrors page_errors_;  // where the kernels record a bad page id
  // plan_on_device(): the caller's buffers the kernels read, the planner,
  // and whether the next run() follows it (it then launches without PDL).
  detail::DeviceSteps device_;
  // shared_prefix: the shared level, which also holds this wrapper's slice
  // of the workspace (ws_ points there; declared before tc_, which uses it).
  std::unique_ptr<detail::SharedPrefixLevel> prefix_;
  // use_tensor_cores: the prefill wrapper on the same workspace, and the
  // [0, 1, ..., batch] query indptr it is planned with.
  std::unique_ptr<BatchPrefill> tc_;
  std::vector<int32_t> tc_qo_indptr_;
};

}  // namespace tessera
