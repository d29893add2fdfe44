// Multi-head latent attention (DeepSeek-style MLA with absorbed weights) over
// a paged latent cache: FlashInfer's BatchMLAPagedAttentionWrapper in C++.
//
//   q_nope [total_q, H, 512]   q_pe [total_q, H, 64]     (the queries, split)
//   ckv_cache [pages, page_size, 512]   kpe_cache [pages, page_size, 64]
//   o [total_q, H, 512]        lse [total_q, H] float32 (base 2), optional
//
// Attention of H query heads over one latent KV head: K = concat(ckv, kpe),
// V = ckv, q = concat(q_nope, q_pe). Each request has 1.. queries (decode,
// speculative / MTP verification, or absorbed prefill), causal among its new
// tokens when the task says so (bottom-right aligned).
//
//   BatchMLA mla(task, workspace);
//   mla.plan(qo_indptr, kv_indptr, kv_indices, kv_lens, stream);   // once per step
//   mla.run(q_nope, q_pe, ckv_cache, kpe_cache, o, lse, stream);   // every layer
//
// Same contract as BatchPrefill: plan() runs the load-balanced scheduler
// (query tiles of fused (query, head) rows x KV chunks; split-KV for long
// contexts) into fixed workspace sections with one async upload; run()
// launches one persistent kernel on a fixed grid that also merges split
// tiles (deterministically: partial states merged in chunk order by the last
// writer), allocates nothing and never synchronizes, so it can be captured
// in a CUDA graph and replayed after each new plan(). The query tile is
// chosen at the first plan and then kept.
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>
#include <span>
#include <vector>

#include "tessera/api/page_ids.hpp"
#include "tessera/api/workspace.hpp"
#include "tessera/core/dtype.hpp"
#include "tessera/core/tensor.hpp"
#include "tessera/runtime/jit.hpp"
#include "tessera/runtime/mla_catalog.hpp"
#include "tessera/runtime/planner.hpp"

namespace tessera {

struct MLATask {
  int num_heads = 128;     // query heads H (16 per GPU at tensor-parallel 8)
  int head_dim_ckv = 512;  // latent features (the kernel takes 512)
  int head_dim_kpe = 64;   // RoPE features (the kernel takes 64)
  int page_size = 64;
  DType q_dtype = DType::kFloat16;   // q_nope, q_pe and o: float16 or bfloat16
  // ckv / kpe caches: q_dtype, or fp8 (kFloat8E4M3 / kFloat8E5M2, the Hopper
  // kernel only; dequantized by MLARunOptions::ckv_scale / kpe_scale)
  DType kv_dtype = DType::kFloat16;
  bool causal = false;
  // Workspace bounds; 0 = take them from the first plan().
  int64_t max_batch = 0, max_total_q = 0, max_pages = 0;
};
// Throws InvalidArgument / TypeMismatch naming the field (no GPU needed).
void validate_mla_task(const MLATask& task);

// Kernel template: kFA2 the mma.sync kernel (sm_80 and up; query tiles of
// 16, 32 or 64 rows), kFA3 the Hopper kernel (sm_90a: wgmma, warp-
// specialized, 64- and 16-row tiles, either over fp8 caches too), kAuto
// the Hopper kernel on sm_90 (the mma.sync kernel for a pinned 32-row
// tile), else FA2.
enum class MlaBackend { kAuto, kFA2, kFA3 };

struct MLAOptions {
  PlannerOptions planner;  // fixed_chunk is not taken (InvalidArgument)
  int max_sms = 0;         // use at most this many SMs (0: all)
  int cta_q = 0;           // query tile 16, 32 or 64 (0: chosen at the first plan; fp8 caches: 16 or 64)
  MlaBackend backend = MlaBackend::kAuto;
};

struct MLARunOptions {
  double sm_scale = -1.0;  // < 0: 1 / sqrt(head_dim_ckv + head_dim_kpe)
  bool pdl = false;        // programmatic dependent launch (sm_90+), as RunOptions::pdl
  // fp8 caches: per-tensor dequantization scales (value = stored x scale),
  // FlashInfer's ckv_scale / kpe_scale; 1 for 16-bit caches.
  double ckv_scale = 1.0, kpe_scale = 1.0;
};

class BatchMLA {
 public:
  BatchMLA(MLATask task, Workspace& workspace, MLAOptions opt = {});

  // Workspace for the task's bounds (max_batch, max_total_q, max_pages >= 1)
  // on a GPU of num_sms multiprocessors, whatever query tile the first plan
  // picks: the ideal size (every partial state of split-KV), and the smallest
  // accepted (none: a smaller workspace only means less split-KV).
  static WorkspaceSizes workspace_size(const MLATask& task, int num_sms, const MLAOptions& opt = {});
  static WorkspaceSizes min_workspace_size(const MLATask& task, int num_sms, const MLAOptions& opt = {});

  // qo_indptr [batch + 1] (queries), kv_indptr [batch + 1] (pages),
  // kv_indices [kv_indptr[batch]] page ids, kv_lens [batch] tokens (FlashInfer's
  // kv_len_arr): request i's kv_lens[i] tokens fill its pages in order,
  // ceil(kv_lens[i] / page_size) of them.
  void plan(std::span<const int32_t> qo_indptr, std::span<const int32_t> kv_indptr,
            std::span<const int32_t> kv_indices, std::span<const int32_t> kv_lens, cudaStream_t stream = nullptr);
  // Page ids on the GPU (a 1-D int32 CUDA tensor, at least kv_indptr[batch]
  // entries): copied on the stream, checked by the kernel (api/page_ids.hpp).
  void plan(std::span<const int32_t> qo_indptr, std::span<const int32_t> kv_indptr, const TensorView& kv_indices,
            std::span<const int32_t> kv_lens, cudaStream_t stream = nullptr);

  void run(const TensorView& q_nope, const TensorView& q_pe, const TensorView& ckv_cache, const TensorView& kpe_cache,
           const TensorView& o, const TensorView& lse, cudaStream_t stream = nullptr,
           const MLARunOptions& opt = {}) const;

  const MLATask& task() const { return task_; }
  const MlaKernelConfig& config() const { return config_; }
  const PrefillPlan& last_plan() const { return plan_; }
  int ctas() const { return ctas_; }
  int64_t planned_total_q() const { return total_q_; }
  const jit::KernelSource& kernel_source() const { return source_; }

  // The workspace sections for a grid of `ctas` CTAs and cta_q-row tiles
  // (public for tests). device_bytes: the partial states get the whole
  // query tiles that fit; InvalidArgument naming the workspace below the minimum.
  struct Layout {
    size_t work_indptr = 0, items = 0, first_items = 0, indices = 0, staged = 0;
    size_t scratch = 0, counters = 0, merge_words = 0, partial_lse = 0, partial_o = 0, total = 0;
    size_t ideal_total = 0, min_total = 0;
    int64_t max_items = 0, max_split_tiles = 0, max_slot_rows = 0;
  };
  static Layout layout_for(const MLATask& task, int ctas, int cta_q, size_t device_bytes = SIZE_MAX);

 private:
  void plan_common(std::span<const int32_t> qo_indptr, std::span<const int32_t> kv_indptr, const PageIds& ids,
                   std::span<const int32_t> kv_lens, cudaStream_t stream);

  MLATask task_;
  Workspace* ws_;
  MLAOptions opt_;
  MlaKernelConfig config_;
  jit::KernelSource source_;
  const jit::LoadedKernel* kernel_ = nullptr;
  int ctas_ = 0;
  Layout layout_;
  Planner planner_;
  PrefillPlan plan_;
  std::vector<int32_t> qo_lens_;
  int64_t batch_ = -1, total_q_ = 0, max_page_index_ = -1;
  mutable PageIdErrors page_errors_;
};

}  // namespace tessera
