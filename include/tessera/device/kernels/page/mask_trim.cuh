// Custom masks: trim each work item's KV range to the tiles that hold a
// visible key for some query of its tile, before the attention kernel runs.
//
// The planner cuts a custom-mask batch as if every key were visible (it sees
// lengths, not the mask, which run() brings). A causal-like, banded or
// block-diagonal (packed documents) mask then leaves many tiles whose every
// bit is 0: the kernels would load and compute them only to mask them out.
// This pass reads each item's rows of the mask once and narrows [kv_start,
// kv_end) by whole CTA_KV tiles from either end (interior holes stay), so
// both kernel templates and every KV source skip those tiles unchanged. An
// item with no visible key becomes empty: the kernels write its rows as
// O = 0, LSE = -inf (or that partial state, which the split-KV merge
// weights 0), exactly what computing its masked tiles gave. Skipping a tile
// whose keys are all masked leaves the online softmax's state bit for bit as
// computing it does, so the outputs do not change.
//
// One block per item (grid-stride over a fixed grid, so a captured graph
// replays it for any plan); the block's threads split the item's rows x
// 32-key words, then reduce the first and last visible key (min / max: no
// order dependence).
#pragma once
#include "tessera/device/arch/grid_dependency.cuh"
#include "tessera/abi/mask_trim_params.cuh"
#include "tessera/device/kernels/common/work_queue.cuh"

namespace tessera {

#if defined(__CUDACC__) || defined(__CUDACC_RTC__)

__device__ __forceinline__ PrefillWorkItem trim_item(const MaskTrimParams& p, PrefillWorkItem w, int* s_lo, int* s_hi) {
  const int qo_lo = w.q_tile * p.tile_rows / p.group;
  const int qo_hi = min(w.qo_len, (w.q_tile * p.tile_rows + p.tile_rows - 1) / p.group + 1);
  const int kv_start = w.kv_start, kv_end = w.kv_end;
  if (qo_lo >= qo_hi || kv_end <= kv_start) return w;  // nothing to read (block-uniform)
  const int b = p.heads_per_group == 1 ? w.request : w.request / p.heads_per_group;
  const PackedMaskWords bits(p.custom_mask, p.custom_mask_bytes, p.mask_indptr[b]);
  const int words = (kv_end - kv_start + 31) / 32;
  // Thread t reads words t, t + blockDim.x, ... of the rows laid end to end,
  // stepping (row, word) without a division per word.
  const int step_rows = blockDim.x / words, step_words = blockDim.x % words;
  int row = qo_lo + threadIdx.x / words, word = threadIdx.x % words;
  int lo = 0x7fffffff, hi = -1;  // first and last visible key this thread saw
#pragma unroll 4
  for (; row < qo_hi; row += step_rows, word += step_words) {
    if (word >= words) {
      word -= words;
      if (++row >= qo_hi) break;
    }
    const int key = kv_start + 32 * word;
    unsigned m = bits.bits32(static_cast<i64>(row) * w.kv_len + key);
    if (kv_end - key < 32) m &= (1u << (kv_end - key)) - 1u;  // the chunk's (and row's) end
    if (m != 0u) {
      lo = min(lo, key + __ffs(m) - 1);
      hi = max(hi, key + 31 - __clz(m));
    }
  }
  lo = __reduce_min_sync(0xffffffffu, lo);
  hi = __reduce_max_sync(0xffffffffu, hi);
  const int warp = threadIdx.x / 32, warps = blockDim.x / 32;
  if (threadIdx.x % 32 == 0) {
    s_lo[warp] = lo;
    s_hi[warp] = hi;
  }
  __syncthreads();
  lo = 0x7fffffff;
  hi = -1;
  for (int i = 0; i < warps; ++i) {
    lo = min(lo, s_lo[i]);
    hi = max(hi, s_hi[i]);
  }
  __syncthreads();  // s_lo / s_hi are reused by the block's next item
  if (hi < 0) {
    w.kv_end = w.kv_start;  // no visible key: an empty item
  } else {
    w.kv_start = kv_start + (lo - kv_start) / p.cta_kv * p.cta_kv;
    w.kv_end = min(kv_end, kv_start + ((hi - kv_start) / p.cta_kv + 1) * p.cta_kv);
  }
  return w;
}

__device__ __forceinline__ void trim_masked_items(const MaskTrimParams& p) {
  __shared__ int s_lo[kMaskTrimThreads / 32], s_hi[kMaskTrimThreads / 32];
  // The previous kernel may still read the trimmed items (programmatic
  // dependent launch) and may write the mask: wait before touching either.
  grid_dependency_wait();
  const int n_items = p.work_indptr[p.queues];
  for (int e = blockIdx.x; e < n_items + p.queues; e += gridDim.x) {
    const bool first = e >= n_items;
    const PrefillWorkItem w = trim_item(p, first ? p.first_items[e - n_items] : p.items[e], s_lo, s_hi);
    if (threadIdx.x == 0) (first ? p.trimmed_first[e - n_items] : p.trimmed_items[e]) = w;
  }
}

#endif

}  // namespace tessera
