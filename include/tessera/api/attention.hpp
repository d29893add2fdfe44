// Attention entry points of the C++ API.
//
//  * BatchAttention: the plan/run wrapper. plan() takes per-request lengths and
//    the page table (host arrays) once per step and stages them into the
//    workspace's fixed sections; run() launches on a stream with no
//    allocation and no host synchronization, so it can be captured in a CUDA
//    graph. This kernel is the row-wise CUDA-core kernel (query tile
//    1); later kernels plug in behind the same contract.
//  * single_decode: one request, contiguous KV, no workspace.
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>
#include <span>

#include "tessera/api/workspace.hpp"
#include "tessera/core/tensor.hpp"
#include "tessera/formats/paged_kv.hpp"
#include "tessera/runtime/jit.hpp"
#include "tessera/runtime/kernel_catalog.hpp"

namespace tessera {

// What the wrapper is used for, fixed at construction.
struct TaskInfo {
  int num_qo_heads = 32;
  int num_kv_heads = 32;
  int page_size = 16;
  KVLayout layout = KVLayout::kNHD;
  // Workspace bounds (paper Appendix D.3): the largest batch and the largest
  // number of page-table entries (kv_indices) any plan() may bring.
  // 0 = take them from the first plan().
  int64_t max_batch = 0;
  int64_t max_pages = 0;
  // Prefill only: the largest total query length (sum over requests).
  int64_t max_total_q = 0;
  // Prefill with PlannerOptions::fixed_chunk: the most (query tile, KV chunk)
  // pieces per KV head a plan may bring, which sizes the work items and
  // partial states. 0: one query tile per request over every key
  // (fixed_chunk_bound); a request with several query tiles may need more.
  int64_t max_fixed_chunks = 0;
};
void validate_task(const TaskInfo& task, const AttentionSpec& spec);

// The lengths of one step, as host arrays.
struct PagedPlanInput {
  std::span<const int32_t> qo_indptr;         // [batch + 1]
  std::span<const int32_t> kv_indptr;         // [batch + 1] (in pages)
  std::span<const int32_t> kv_indices;        // [kv_indptr[batch]]
  std::span<const int32_t> kv_last_page_len;  // [batch]
};

class VariantArgs;

struct RunOptions {
  double sm_scale = -1.0;  // < 0: 1/sqrt(head_dim)
  // K's dequantization scale (FlashInfer's k_scale, e.g. of an fp8 cache):
  // multiplies the softmax scale on the host, so it costs the kernel
  // nothing. Positive, finite.
  double k_scale = 1.0;
  // Multiplies the output (FlashInfer's v_scale, V's dequantization scale),
  // inside the kernels' epilogue; LSE is unchanged. Finite.
  double v_scale = 1.0;
  // The same scales as 1-element float32 CUDA tensors on q's device, read by
  // the kernel at run time (times k_scale / v_scale): a captured CUDA graph
  // replays with whatever values they hold then, without re-capture. The
  // CUDA-core decode kernels read them (BatchDecode without tensor cores,
  // single_decode, BatchAttention); the tensor-core kernels refuse them
  // (InvalidArgument naming k_scale_tensor / v_scale_tensor). Undefined: none.
  TensorView k_scale_tensor, v_scale_tensor;
  // Variant transforms (Query/Key/ValueTransform) see K and V as stored; the
  // scales apply to the logits (LogitsTransform sees q.k * sm_scale * k_scale)
  // and to the output before OutputTransform.
  // Values of the variant's extra scalars and tensors, by name (null: none;
  // a variant that declares extras needs them). Read during run() only.
  const VariantArgs* extras = nullptr;
  // Programmatic dependent launch (FlashInfer's enable_pdl; sm_90+, ignored
  // before): the kernel may start, and set itself up, while the kernel before
  // it on the stream (e.g. the append of this step's K / V) still runs; it
  // waits for that kernel before reading q, K, V or writing outputs. Batch
  // decode and prefill wrappers take it; graph capture keeps it.
  bool pdl = false;
  // With pdl: the kernel before this run on the stream is another level of
  // the same attention (it writes o and merge_lse and nothing this run
  // reads but those), so the Hopper prefill kernel reads q, K and V and
  // computes before waiting for it and waits only before writing its rows;
  // the shared-prefix cascade runs its shared level this way behind the
  // unique one. Other kernels wait at their start as with pdl alone. Safe
  // behind Tessera's kernels: none lets the next one start before what
  // wrote q, K and V ahead of it has finished (each signals after its own
  // wait, or after starting behind one that did). Needs pdl and merge_lse
  // (InvalidArgument naming pdl_defer_wait).
  bool pdl_defer_wait = false;
  // Merge into o instead of overwriting it (the tensor-core kernels only:
  // BatchPrefill, BatchDecode with tensor cores): o already holds an
  // attention state of the same rows whose base-2 LSE is merge_lse, float32
  // [rows, Hq] like lse, on q's device, not overlapping lse. o gets the merge
  // of that state with this run's, lse (when given) the merged LSE; rows that
  // see no key in this run keep o bit for bit. A composable level joins a
  // state this way without a merge kernel or a state buffer. Undefined:
  // overwrite (other kernels refuse a defined one, InvalidArgument).
  TensorView merge_lse;
};

class BatchAttention {
 public:
  BatchAttention(AttentionSpec spec, TaskInfo task, Workspace& workspace);

  // Device and pinned-host bytes the workspace needs for these bounds.
  static size_t workspace_bytes(int64_t max_batch, int64_t max_pages);

  // Validates the lengths and page table, stages them into the workspace and
  // uploads them on `stream`. Loads (JIT-compiling if needed) the kernel on
  // the first call.
  void plan(const PagedPlanInput& in, cudaStream_t stream = nullptr);

  // q [total_q, Hq, D]; o like q (o_dtype); lse [total_q, Hq] float32 or an
  // undefined view. The KV storage must match the task (heads, page size,
  // layout) and hold every page the plan names.
  void run(const TensorView& q, const PagedKVStorage& kv, const TensorView& o, const TensorView& lse,
           cudaStream_t stream = nullptr, const RunOptions& opt = {}) const;

  const AttentionSpec& spec() const { return spec_; }
  const TaskInfo& task() const { return task_; }
  int64_t planned_batch() const { return batch_; }
  int64_t planned_total_q() const { return total_q_; }
  const jit::KernelSource& kernel_source() const { return source_; }

 private:
  AttentionSpec spec_;
  TaskInfo task_;
  Workspace* ws_;
  jit::KernelSource source_;
  const jit::LoadedKernel* kernel_ = nullptr;
  // Fixed sections (byte offsets into the workspace), set at the first plan.
  size_t off_qo_indptr_ = 0, off_kv_indptr_ = 0, off_last_ = 0, off_indices_ = 0, ws_bytes_ = 0;
  int64_t batch_ = -1, total_q_ = 0, max_page_index_ = -1;
};

// One request, contiguous KV: q [Hq, D]; k, v [kv_len, Hkv, D] (NHD) or
// [Hkv, kv_len, D] (HND); o [Hq, D]; lse [Hq] float32 or undefined.
void single_decode(const AttentionSpec& spec, const TensorView& q, const TensorView& k, const TensorView& v,
                   KVLayout layout, const TensorView& o, const TensorView& lse, cudaStream_t stream = nullptr,
                   const RunOptions& opt = {});

}  // namespace tessera
