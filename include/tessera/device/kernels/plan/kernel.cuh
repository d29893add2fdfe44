// The device planner: one block reads a step's lengths from the caller's
// device buffers and writes the host planner's work queues (chunk size by
// plan/schedule.cuh's rule, assignment by plan/assign.cuh) into the
// workspace sections the attention kernels read, so planning needs no host
// round trip and a CUDA graph can hold it.
// Bad lengths are recorded (DevicePlanError) and leave an empty plan.
// One block runs the whole plan once per step, mostly one warp at a time:
// its time goes to instruction fetch and dependent latency, not
// throughput. So the planner's loops stay rolled (#pragma unroll 1), its
// arithmetic 32-bit where the values allow, and each tile's chunk shape is
// computed once per chunk size (tile_pass) and read back after.
#pragma once
#include "tessera/device/kernels/plan/assign.cuh"

namespace tessera {

#if defined(__CUDACC__) || defined(__CUDACC_RTC__)
namespace plan {
__device__ __forceinline__ void prefetch_l1(const int* at) { asm volatile("prefetch.L1 [%0];" ::"l"(at)); }

// Request b's KV length (its table row checked by plan_step first).
__device__ __forceinline__ int request_kv_len(const DevicePlanParams& p, int b) {
  const bool paged = p.kv_last_page_len != nullptr;
  return kv_length(p.kv_indptr[b], p.kv_indptr[b + 1], paged ? p.kv_last_page_len[b] : 0, p.page_size, paged);
}
__device__ __forceinline__ int request_qo_begin(const DevicePlanParams& p, int b) {
  return p.qo_indptr ? p.qo_indptr[b] : b;
}
__device__ __forceinline__ int request_qo_len(const DevicePlanParams& p, int b) {
  return p.qo_indptr ? p.qo_indptr[b + 1] - p.qo_indptr[b] : 1;
}

// Checks the batch's rows (thread-strided); returns whether any failed.
__device__ bool check_inputs(const DevicePlanParams& p, int batch, int* claim) {
  bool bad = false;
#pragma unroll 1
  for (int b = threadIdx.x; b < batch; b += blockDim.x) {
    const int k0 = p.kv_indptr[b], k1 = p.kv_indptr[b + 1];
    if ((b == 0 && k0 != 0) || k1 < k0) {
      record_error(p, claim, kPlanKvIndptr, b, b == 0 && k0 != 0 ? k0 : k1);
      bad = true;
    } else if (p.kv_last_page_len && k1 > k0 &&
               (p.kv_last_page_len[b] < 1 || p.kv_last_page_len[b] > p.page_size)) {
      record_error(p, claim, kPlanLastPageLen, b, p.kv_last_page_len[b]);
      bad = true;
    }
    if (p.qo_indptr) {
      const int q0 = p.qo_indptr[b], q1 = p.qo_indptr[b + 1];
      if ((b == 0 && q0 != 0) || q1 < q0) {
        record_error(p, claim, kPlanQoIndptr, b, b == 0 && q0 != 0 ? q0 : q1);
        bad = true;
      }
    }
  }
  if (threadIdx.x == 0 && batch > 0) {
    if (p.kv_indptr[batch] > p.max_pages) {
      record_error(p, claim, kPlanMaxPages, batch, p.kv_indptr[batch]);
      bad = true;
    }
    if (p.qo_indptr && p.qo_indptr[batch] > p.max_total_q) {
      record_error(p, claim, kPlanMaxTotalQ, batch, p.qo_indptr[batch]);
      bad = true;
    }
  }
  if (threadIdx.x == 0 && p.rows_indptr) {  // a cascade level covers level 0's rows
    const int b0 = *p.rows_batch, rows = batch > 0 ? p.qo_indptr[batch] : 0;
    if (b0 < 0 || b0 > p.max_batch || rows != p.rows_indptr[b0]) {
      record_error(p, claim, kPlanLevelRows, batch, rows);
      bad = true;
    }
  }
  return __syncthreads_or(bad);
}

// Fills the tile tables; returns the tile count (-1: more than max_tiles).
__device__ int build_tiles(const DevicePlanParams& p, const Tables& t, int batch) {
  if (p.decode) {
#pragma unroll 1
    for (int b = threadIdx.x; b < batch; b += blockDim.x) {
      TileSpan s{0, request_kv_len(p, b), 1};
      if (p.window_left >= 0) clip_to_window(s, decode_window_start(s.len, p.window_left), p.chunk_align);
      t.req[b] = b;
      t.q_tile[b] = 0;
      t.begin[b] = s.begin;
      t.len[b] = s.len;
      t.rows[b] = 1;
    }
    return batch;
  }
  // Prefill: tiles per request, their prefix (tile0), then each tile. One
  // query per request in one tile (decode on tensor cores): tile b is
  // request b, no prefix to scan.
  const bool one_tile = !p.qo_indptr && p.group <= p.cta_q;
  i64 n = batch;
  if (one_tile) {
    if (n > p.max_tiles) return -1;
  } else {
    const Segment seg = segment(batch);
    i64 mine = 0;
#pragma unroll 1
    for (int b = seg.lo; b < seg.hi; ++b) mine += div_up(static_cast<i64>(request_qo_len(p, b)) * p.group, p.cta_q);
    i64 at = block_exclusive_scan(mine, t.red, n);
    if (n > p.max_tiles) return -1;
#pragma unroll 1
    for (int b = seg.lo; b < seg.hi; ++b) {
      t.tile0[b] = static_cast<int>(at);
      at += div_up(static_cast<i64>(request_qo_len(p, b)) * p.group, p.cta_q);
    }
    if (threadIdx.x == 0) t.tile0[batch] = static_cast<int>(n);
  }
#pragma unroll 1
  for (int b = threadIdx.x; one_tile && b <= batch; b += blockDim.x) t.tile0[b] = b;
  __syncthreads();
#pragma unroll 1
  for (int i = threadIdx.x; i < n; i += blockDim.x) {
    const int b = one_tile ? i : last_at_most(t.tile0, batch, i), q_tile = i - t.tile0[b];
    const int qo_len = request_qo_len(p, b), kv_len = request_kv_len(p, b);
    TileSpan s = prefill_tile(q_tile, qo_len, kv_len, p.group, p.cta_q, p.causal != 0);
    if (p.window_left >= 0)
      clip_to_window(s, prefill_window_start(q_tile, qo_len, kv_len, p.group, p.cta_q, p.window_left), p.chunk_align);
    t.req[i] = b;
    t.q_tile[i] = q_tile;
    t.begin[i] = s.begin;
    t.len[i] = s.len;
    t.rows[i] = s.rows;
  }
  return static_cast<int>(n);
}

// The chunk size by the rule the host planner uses (plan/schedule.cuh),
// each candidate judged by its greedy assignment on the shared tables
// (every thread calls it; the tables then hold the chosen size's chunks and
// assignment).
struct BlockEvaluator {
  const DevicePlanParams& p;
  const Tables& t;
  int batch, n;
  __device__ __noinline__ Evaluation evaluate(int L) {
    if (threadIdx.x < 32) {
      const Evaluation e = tile_pass(p, t, n, L);
      if (threadIdx.x == 0) {
        t.scalars[1] = e.chunks;
        t.scalars[2] = e.slots;
        t.scalars[3] = e.splits;
        t.scalars[4] = e.worst;
      }
    }
    __syncthreads();
    Evaluation e{0, t.scalars[2], t.scalars[3], t.scalars[4], t.scalars[1]};
    const int chunks = static_cast<int>(imin(e.chunks, p.max_items));  // past the bound plan_step reports it
    chunk_sort_keys(p, t, batch, n, chunks);
    sort_chunks(t, chunks);
    sort_tail(p, t, chunks);
    e.makespan = assign_chunks(p, t, chunks);
    return e;
  }
  __device__ i64 chunks_at(i64 len) { return plan::chunks_at(t, n, len); }
};
__device__ int choose_chunk_size(const DevicePlanParams& p, const Tables& t, int batch, int n) {
  i64 total = 0, longest = 1;
#pragma unroll 1
  for (int i = threadIdx.x; i < n; i += blockDim.x) {
    total += t.len[i];
    longest = imax(longest, t.len[i]);
  }
  total = block_reduce(total, t.red, Sum{});
  longest = block_reduce(longest, t.red, Max{});
  BlockEvaluator ev{p, t, batch, n};
  return choose_chunk_size(p, n, total, longest, ev);
}

// Each split tile's first partial slot and merge counter, packed into mid2
// (slot << 32 | counter; -1: not split), which evaluate() no longer needs.
// Warp 0 only.
struct SplitTotals {
  i64 slots, splits;
};
__device__ SplitTotals number_split_tiles(const Tables& t, int n) {
  const Segment seg = lane_segment(n);
  i64 slots = 0, splits = 0;
#pragma unroll 1
  for (int i = seg.lo; i < seg.hi; ++i) {
    const ChunkShape s = tile_shape(t, i);
    if (s.n > 1) {
      slots += s.n;
      splits += 1;
    }
  }
  SplitTotals total{};
  i64 slot = warp_exclusive_scan(slots, total.slots);
  i64 counter = warp_exclusive_scan(splits, total.splits);
#pragma unroll 1
  for (int i = seg.lo; i < seg.hi; ++i) {
    const ChunkShape s = tile_shape(t, i);
    t.mid2[i] = s.n > 1 ? (slot << 32 | counter) : -1;
    if (s.n > 1) {
      slot += s.n;
      counter += 1;
    }
  }
  return total;
}

// Chunk j of the plan as a prefill work item (decode takes its first fields).
__device__ __noinline__ PrefillWorkItem chunk_item(const DevicePlanParams& p, const Tables& t, int n, int j) {
  const int i = last_at_most(t.chunk0, n, j), k = j - t.chunk0[i];
  const ChunkShape s = tile_shape(t, i);
  const i64 split = t.mid2[i];
  const int b = t.req[i];
  PrefillWorkItem w;
  w.request = b;
  w.q_tile = t.q_tile[i];
  w.kv_start = t.begin[i] + k * s.step;
  w.kv_end = t.begin[i] + static_cast<int>(imin(t.len[i], static_cast<i64>(k + 1) * s.step));
  w.first_slot = split < 0 ? -1 : static_cast<int>(split >> 32);
  w.partial_slot = split < 0 ? -1 : w.first_slot + k;
  w.num_chunks = s.n;
  w.counter = split < 0 ? -1 : static_cast<int>(split & 0xffffffff);
  w.qo_begin = request_qo_begin(p, b);
  w.qo_len = request_qo_len(p, b);
  w.kv_begin = p.kv_indptr[b];
  w.kv_len = request_kv_len(p, b);
  return w;
}

__device__ void plan_step(const DevicePlanParams& p, char* smem) {
  const Tables t = tables_at(smem, tables_layout(p.max_tiles, p.max_batch, p.ctas, p.max_items));
  int* claim = t.misc;
  if (threadIdx.x == 0) claim[0] = 0;
  __syncthreads();
  // The step's lengths move into L1 while batch_size loads (one line per
  // 32 entries), so the checks and tiles below wait for one load, not three.
#pragma unroll 1
  for (int i = threadIdx.x * 32; i <= p.max_batch; i += kDevicePlanThreads * 32) {
    prefetch_l1(p.kv_indptr + i);
    if (p.qo_indptr) prefetch_l1(p.qo_indptr + i);
    if (p.kv_last_page_len && i < p.max_batch) prefetch_l1(p.kv_last_page_len + i);
  }
  int batch = *p.batch_size;
  if (batch < 0 || batch > p.max_batch) {
    if (threadIdx.x == 0) record_error(p, claim, kPlanBatchSize, -1, batch);
    batch = 0;
  }
  if (check_inputs(p, batch, claim)) batch = 0;
  int n = build_tiles(p, t, batch);
  if (n < 0) {
    if (threadIdx.x == 0) record_error(p, claim, kPlanMaxTiles, -1, p.max_tiles);
    n = 0;
  }
  __syncthreads();
  // The chunk size; the tables then hold its chunks and greedy assignment.
  const int L = choose_chunk_size(p, t, batch, n);
  if (threadIdx.x < 32) {
    const SplitTotals split = number_split_tiles(t, n);
    if (threadIdx.x == 0) {
      t.scalars[5] = split.slots;
      t.scalars[6] = split.splits;
    }
  }
  __syncthreads();
  const SplitTotals split{t.scalars[5], t.scalars[6]};
  int chunks = static_cast<int>(t.scalars[1]);
  if (t.scalars[1] > p.max_items) {  // beyond the workspace's bound: an empty plan
    if (threadIdx.x == 0) record_error(p, claim, kPlanMaxItems, -1, chunks);
    chunks = 0;
  }
  // Queues: each CTA's chunks in assignment order, CTA after CTA.
  const Segment seg = segment(p.ctas);
  i64 mine = 0, total = 0;
#pragma unroll 1
  for (int c = seg.lo; c < seg.hi; ++c) mine += t.cta_count[c];
  i64 at = block_exclusive_scan(mine, t.red, total);
#pragma unroll 1
  for (int c = seg.lo; c < seg.hi; ++c) {
    t.cta_first[c] = static_cast<int>(at);
    at += t.cta_count[c];
  }
  if (threadIdx.x == 0) t.cta_first[p.ctas] = chunks;
  __syncthreads();
#pragma unroll 1
  for (int w = threadIdx.x; w < chunks; w += blockDim.x) t.queue[t.cta_first[t.owner[w]] + t.rank[w]] = w;
  __syncthreads();
#pragma unroll 1
  for (int x = threadIdx.x; x <= p.ctas; x += blockDim.x) p.work_indptr[x] = chunks ? t.cta_first[x] : 0;
#pragma unroll 1
  for (int q = threadIdx.x; q < chunks; q += blockDim.x) {
    const PrefillWorkItem w = chunk_item(p, t, n, t.queue[q]);
    if (p.decode) {
      static_cast<DecodeWorkItem*>(p.items)[q] = {w.request, w.kv_start, w.kv_end, w.partial_slot, w.first_slot,
                                                   w.num_chunks};
    } else {
      static_cast<PrefillWorkItem*>(p.items)[q] = w;
    }
  }
  if (p.first_items)
#pragma unroll 1
    for (int x = threadIdx.x; x < p.ctas; x += blockDim.x) {
      const int q = t.cta_first[x];
      p.first_items[x] = chunks && q < t.cta_first[x + 1] ? chunk_item(p, t, n, t.queue[q]) : PrefillWorkItem{};
    }
  if (threadIdx.x == 0 && p.stats) {
    p.stats[0] = L;
    p.stats[1] = chunks ? static_cast<int>(split.slots) : 0;
    p.stats[2] = chunks ? static_cast<int>(split.splits) : 0;
    p.stats[3] = chunks;
  }
  // A cascade's merges change only the step's rows (none for an empty plan).
  if (p.row_mask) {
    const int rows = chunks ? (p.qo_indptr ? p.qo_indptr[batch] : batch) : 0;
#pragma unroll 1
    for (int r = threadIdx.x; r < p.max_total_q; r += blockDim.x) p.row_mask[r] = r < rows;
  }
}

}  // namespace plan
#endif

}  // namespace tessera
