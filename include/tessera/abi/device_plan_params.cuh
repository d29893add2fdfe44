// Parameter block of the device planner (device/kernels/plan/): the step's
// lengths are read from the caller's device buffers and the work queues are
// written into the workspace sections the attention kernels read, so a CUDA
// graph holding the planner and every layer's run() serves any batch up to
// the bounds. Plain data, host-includable.
#pragma once
#include "tessera/abi/decode_params.cuh"
#include "tessera/abi/prefill_params.cuh"

namespace tessera {

constexpr int kDevicePlanThreads = 512;  // one block plans the whole step
constexpr int kDevicePlanMaxTiles = 4096;  // shared-memory tables: 36 bytes per query tile, 36 per work item

// What a failed input check records (DevicePlanParams::error, mapped pinned
// memory: flag, code, request, value). The plan is then empty.
enum DevicePlanError : int {
  kPlanOk = 0,
  kPlanBatchSize = 1,     // batch_size outside [0, max_batch]
  kPlanKvIndptr = 2,      // kv_indptr[0] != 0 or decreasing at `request`
  kPlanMaxPages = 3,      // kv_indptr[batch] above max_pages (ragged: max_kv_tokens)
  kPlanLastPageLen = 4,   // kv_last_page_len[request] outside [1, page_size] for a non-empty request
  kPlanQoIndptr = 5,      // qo_indptr[0] != 0 or decreasing at `request`
  kPlanMaxTotalQ = 6,     // qo_indptr[batch] above max_total_q
  kPlanMaxTiles = 7,      // more query tiles than the workspace's tables hold
  kPlanMaxItems = 8,      // more work items than the workspace holds (fixed chunks beyond its bound)
  kPlanLevelRows = 9,     // a cascade level's qo_indptr[batch] differs from level 0's
};

struct DevicePlanParams {
  // Inputs (the caller's buffers; fixed addresses, new contents each step).
  const int* batch_size;        // [1]
  const int* qo_indptr;         // [max_batch + 1]; null: one query per request (decode)
  const int* kv_indptr;         // [max_batch + 1]: pages (paged) or tokens (ragged)
  const int* kv_last_page_len;  // [max_batch]; null: ragged KV (kv_indptr counts tokens)
  int max_batch, max_pages, max_total_q, page_size;

  // Query tiles: decode (qo_indptr null, items DecodeWorkItem) has one tile
  // of one row per request; prefill tiles are cta_q fused rows of `group`
  // heads per query, causal ones visiting only their visible KV prefix.
  int decode, group, cta_q, causal, max_tiles;

  // Planner options in the planner's integer units (1/16 KV token).
  int ctas;
  int split_kv, fixed_chunk, min_chunk, chunk_align, window_left;
  int unsplit_max_kv, unsplit_min_tiles;
  int serpentine;  // PlannerOptions::serpentine
  i64 item_cost;   // per work item: alpha * rows of a tile, x16
  i64 token_cost;  // per KV token: beta, x16
  i64 merge_cost;  // per row and chunk of a split tile's merge, x16 (0: off)
  i64 max_slots, max_split_tiles;  // workspace capacity (0: no cap)

  // Outputs (workspace sections).
  int max_items;                      // the items section's capacity
  int* work_indptr;                   // [ctas + 1]
  void* items;                        // DecodeWorkItem or PrefillWorkItem [max_items]
  PrefillWorkItem* first_items;       // [ctas] (prefill)
  int* stats;                         // [4]: chunk size, partial slots, split tiles, items
  // Cascades: level 0 marks the step's query rows in row_mask ([max_total_q]:
  // 1 below qo_indptr[batch], 0 beyond); each further level checks that its
  // qo_indptr ends where level 0's does (rows_indptr[*rows_batch]). Null: none.
  unsigned char* row_mask;
  const int* rows_batch;
  const int* rows_indptr;
  int* error;                         // [4] mapped pinned: flag, code, request, value
};

}  // namespace tessera
