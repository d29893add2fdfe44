// Parameter block of the pass that trims fully masked KV tiles off a
// custom-mask plan's work items (page/mask_trim.cuh). Plain data, host-includable.
#pragma once
#include "tessera/abi/prefill_params.cuh"

namespace tessera {

constexpr int kMaskTrimThreads = 256;  // a block per work item

struct MaskTrimParams {
  // The plan's items and each queue's first item (as PrefillParams sees them)
  // in; their trimmed copies out, at the same indices.
  const PrefillWorkItem* items;
  const PrefillWorkItem* first_items;
  PrefillWorkItem* trimmed_items;
  PrefillWorkItem* trimmed_first;
  const int* work_indptr;  // [queues + 1]: the plan has work_indptr[queues] items
  int queues;
  int tile_rows;        // fused rows of a work item's query tile (CTA_Q x CTAs per cluster)
  int group;            // fused rows per query (query heads per KV head)
  int heads_per_group;  // as PrefillParams (an item's request field is b * heads_per_group + h)
  int cta_kv;           // KV tile of the attention kernel: items are trimmed by whole tiles
  const u8* custom_mask;
  const int* mask_indptr;  // [batch + 1] byte offsets
  i64 custom_mask_bytes;
};

}  // namespace tessera
