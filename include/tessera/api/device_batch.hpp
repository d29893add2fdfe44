// A step described in device memory, for planning on the GPU.
//
// plan_on_device() (BatchDecode), plan_paged_on_device() and
// plan_ragged_on_device() (BatchPrefill) enqueue the device planner
// (runtime/device_planner.hpp) instead of planning on the host: when it
// runs, it reads the step's batch size and lengths from these buffers and
// writes the work queues into the workspace. Nothing is read or copied by
// the host, so one CUDA graph holding the planner and every layer's run()
// serves any batch up to the wrapper's bounds: each step the caller writes
// the lengths and page ids into the same buffers (or computes them on the
// GPU) and replays.
//
// The buffers are int32, 1-D, contiguous, on the workspace's device, sized
// for the bounds (TaskInfo max_batch, max_pages, max_total_q), and must
// stay allocated while runs planned from them may execute. Only their
// first entries count: batch_size[0] requests, kv_indptr[0 .. batch],
// kv_last_page_len[0 .. batch - 1], kv_indices[0 .. kv_indptr[batch] - 1].
// Ragged KV (plan_ragged_on_device) has neither page ids nor last-page
// lengths: kv_indptr counts tokens, rows of the k and v that run_ragged()
// takes, and kv_indptr[batch] must stay within the plan's max_kv_tokens.
// A bad value (a batch size above max_batch, a decreasing indptr, a
// last-page length outside [1, page_size]) is recorded and leaves an empty
// plan; the next plan or run on the host raises it (InvalidArgument), as
// a bad page id is raised (api/page_ids.hpp).
#pragma once
#include <cstddef>
#include <cstdint>

#include "tessera/api/page_ids.hpp"
#include "tessera/core/tensor.hpp"

namespace tessera {

struct DeviceBatch {
  TensorView batch_size;        // [1]: requests this step, 0 .. max_batch
  TensorView qo_indptr;         // [max_batch + 1]; prefill only (decode: one query per request; leave undefined)
  TensorView kv_indptr;         // [max_batch + 1]: pages (ragged KV: tokens) per request, as a prefix
  TensorView kv_indices;        // [max_pages]: page ids; ragged KV: undefined
  TensorView kv_last_page_len;  // [max_batch]; ragged KV: undefined
};

namespace jit {
class LoadedKernel;
}

namespace detail {
// A wrapper's state for planning on the GPU: the caller's buffers the
// kernels read instead of the workspace's staged copies, the planner, and
// whether the next run() follows the planner (it then launches without
// PDL: the attention kernels read their first work items before waiting).
struct DeviceSteps {
  const int32_t* qo_indptr = nullptr;
  const int32_t* kv_indptr = nullptr;
  const int32_t* kv_indices = nullptr;
  const int32_t* kv_last_page_len = nullptr;
  bool active = false;  // the last plan was on the GPU
  mutable bool planner_ahead = false;
  const jit::LoadedKernel* planner = nullptr;
  size_t smem_bytes = 0;
  mutable DevicePlanErrors errors;
  bool take_planner_ahead() const {
    const bool ahead = planner_ahead;
    planner_ahead = false;
    return ahead;
  }
};
// A cascade level's rows (CascadeAttention::plan_on_device): level 0's
// planner writes `mask` (the step's query rows, for the merges); each
// further level's checks that its qo_indptr ends at level 0's total.
struct LevelRows {
  unsigned char* mask = nullptr;
  const int32_t* batch_size = nullptr;  // level 0's buffers (further levels)
  const int32_t* qo_indptr = nullptr;
};
// Checks the buffers (int32, 1-D, contiguous, on `device`, long enough for
// the bounds; qo_indptr only where with_qo, kv_indices and kv_last_page_len
// only where paged, else undefined) and records their pointers in `steps`.
void take_device_batch(DeviceSteps& steps, const DeviceBatch& batch, int64_t max_batch, int64_t max_pages,
                       bool with_qo, bool paged, int device);
}  // namespace detail

}  // namespace tessera
