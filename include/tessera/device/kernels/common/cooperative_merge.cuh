// Split tiles of many chunks, merged by the CTAs that computed them; the
// one merge of every persistent kernel that splits query tiles over keys
// (FA2 and Hopper prefill, MLA).
//
// A tile cut in n chunks has n CTAs that finish at about the same time when
// the plan spreads a few tiles over every SM (a long request, a cascade's
// shared level). Left to its last writer, the merge reads n partial rows for
// each of the tile's rows on one SM, a pass of CTA threads x VEC features at
// a time, each pass a dependent round trip or more: for a 64-row tile of 4
// chunks eight passes after the chunk itself, longer than its attention.
// Here the tile's rows are cut into slices of one pass, and every chunk's
// CTA whose queue ends with the tile merges a share of them once all n
// chunks are in.
// A slice is merged by merge_split_rows, exactly as the last writer merges,
// so the bits do not depend on which CTA merged it.
//
// State: one 64-bit word per split tile (Params::merge_words, zero between
// runs; indexed as the tile's counter): chunks in (bits 0-15), slices taken
// (16-31), slices done (32-47), chunks out (48-63: chunks whose CTA will
// not merge in arrival order).
// Each chunk's CTA splits the tile's slices with the others: a share of
// `run` slices (ceil(slices / chunks)). When every chunk's CTA waits for
// the tile (its queue ends with it, so it counted in without an out), the
// k-th to count in merges the k-th share, known from its count-in alone,
// so from the last chunk's count the merge costs its CTAs no atomic but the
// one that records the slices done. Otherwise (a chunk's CTA has items
// after it, or gave up waiting) the shares are taken by fetch-and-add, a
// share at a time, and the add that takes a CTA's next share also records
// the slices it finished (a compare-and-swap lost to a neighbour costs a
// round trip, and the tile's CTAs reach it together); a take that finds no
// slice left changed only the taken bits. Either way, the CTA whose add
// completes the last slice zeroes the word, and a take that lands after
// that (it finds no chunk in) subtracts its own add again, so the next run
// starts from zero. The last chunk to count in never waits. Another CTA
// waits for the tile only when its queue ends with it, and only for a
// bounded time, after which it counts itself out, unless the last chunk
// came in meanwhile, and leaves its share to the others: a grid that is
// not all resident at once cannot hang on it.
#pragma once
#include "tessera/device/arch/memory_order.cuh"
#include "tessera/device/kernels/common/epilogue.cuh"

namespace tessera {

#if defined(__CUDACC__) || defined(__CUDACC_RTC__)

// Fewest chunks of a tile merged cooperatively (the 16-row MLA form merges a
// tile cut in two from registers, before this). Even when a pass is one
// round trip, the passes split over the chunks' CTAs end sooner than one CTA
// running them all: a 64-row tile cut in two is eight passes for its last
// writer, four for each chunk's CTA in arrival order.
constexpr int kCooperativeMergeMinChunks = 2;

struct MergeWord {
  static constexpr u64 kChunk = 1ull, kTaken = 1ull << 16, kDone = 1ull << 32, kOut = 1ull << 48;
  __device__ __forceinline__ static int chunks(u64 w) { return static_cast<int>(w & 0xffffu); }
  __device__ __forceinline__ static int taken(u64 w) { return static_cast<int>((w >> 16) & 0xffffu); }
  __device__ __forceinline__ static int done(u64 w) { return static_cast<int>((w >> 32) & 0xffffu); }
  __device__ __forceinline__ static int out(u64 w) { return static_cast<int>(w >> 48); }
  __device__ __forceinline__ static u64 load(const u64* word) { return *reinterpret_cast<const volatile u64*>(word); }
};

// Polls of a CTA waiting for its last tile's other chunks (each an L2 round
// trip, ~0.5 us): far beyond the skew of chunks that start together, short
// of a hang.
constexpr int kMergeWaitPollsBound = 4096;

// Thread 0's side of a tile's word: `cur` is the word as it last saw it.
struct MergeTaker {
  u64* word;
  u64 cur;
  int num_chunks, slices, run;  // run: slices a share holds
  int arrival;                  // chunks in before this one
  // Counts this chunk in; out: its CTA will not wait for the tile.
  __device__ __forceinline__ void count_in(bool out) {
    const u64 add = MergeWord::kChunk + (out ? MergeWord::kOut : 0ull);
    const u64 prev = atomicAdd(word, add);
    arrival = MergeWord::chunks(prev);
    cur = prev + add;
  }
  // Polls (a CTA whose queue ends with the tile) until every chunk is in, or
  // the tile was merged and its word zeroed, or the polls run out; then it
  // counts itself out while a chunk is still missing.
  __device__ __forceinline__ void wait_all_in() {
    for (int i = 0;; ++i) {
      const int in = MergeWord::chunks(cur);
      if (in == num_chunks || in == 0) return;
      if (i < kMergeWaitPollsBound) {
        cur = MergeWord::load(word);
        continue;
      }
      const u64 prev = atomicCAS(word, cur, cur + MergeWord::kOut);
      if (prev == cur) return;  // out: chunks(cur) stays short of num_chunks here
      cur = prev;
    }
  }
  // The first slice of this CTA's next share (*count slices), or -1 (not all
  // in, none left, or the tile already merged). done: slices this CTA
  // finished since its last take, which the same atomic records.
  __device__ __forceinline__ int take(int done, int* count) {
    // Whether every chunk was in when this CTA last looked; holding
    // unfinished slices (done > 0), it still is.
    if (MergeWord::chunks(cur) != num_chunks) return -1;
    if (MergeWord::out(cur) == 0) {  // shares in arrival order
      if (done == 0) {
        const int first = arrival * run;
        if (first >= slices) return -1;
        *count = min(run, slices - first);
        return first;
      }
      if (MergeWord::done(atomicAdd(word, static_cast<u64>(done) * MergeWord::kDone)) + done == slices)
        atomicExch(word, 0ull);
      return -1;
    }
    const bool ask = MergeWord::taken(cur) < slices;
    const u64 add = static_cast<u64>(done) * MergeWord::kDone + (ask ? static_cast<u64>(run) * MergeWord::kTaken : 0ull);
    if (add == 0ull) return -1;
    const u64 prev = atomicAdd(word, add);
    cur = prev + add;
    if (MergeWord::chunks(prev) != num_chunks) {  // landed after the tile was merged and zeroed
      atomicAdd(word, 0ull - add);
      return -1;
    }
    if (done > 0 && MergeWord::done(cur) == slices) {  // this add finished the tile
      atomicExch(word, 0ull);
      return -1;
    }
    const int first = MergeWord::taken(prev);
    if (!ask || first >= slices) return -1;
    *count = min(run, slices - first);
    return first;
  }
};

// Rows a slice holds: the largest divisor of CTA_Q up to R, the rows one
// pass of the group's threads covers (clamped to 1..CTA_Q).
template <int CTA_Q, int R>
struct MergeSliceRows {
  static constexpr int value = CTA_Q % R == 0 ? R : MergeSliceRows<CTA_Q, R - 1>::value;
};
template <int CTA_Q>
struct MergeSliceRows<CTA_Q, 1> {
  static constexpr int value = 1;
};

// After every thread of the group (tid in [0, NTHREADS)) stored its partial
// rows of a split tile: counts the chunk in and merges. A tile of at least
// kCooperativeMergeMinChunks chunks and more than one slice is merged in
// slices by whichever of its CTAs take them (waiting for the tile first when
// queue_ends_here); another by its last writer, all rows. One call of
// merge_split_rows serves both, so the kernel holds one copy of the merge's
// registers. The tile's counter and word are those of its head group
// (blockIdx.y) and, in a CTA pair (CLUSTER = 2), of its rank's rows. sync()
// is a barrier over the group; slot a shared int (a take's first slice and
// count, for the group).
template <typename Variant, typename DO, int HEAD_DIM, int CTA_Q, int NTHREADS, int VEC = 8, int CLUSTER = 1,
          typename Params, typename Sync>
__device__ __forceinline__ void merge_split_tile(const Params& p, const Variant& variant, const PrefillWorkItem& w,
                                                 int qo_start, int qo_len, int row0, int b, int kv_head, int tid,
                                                 int* slot, Sync sync, bool queue_ends_here, int rank = 0) {
  constexpr int PASS_ROWS = NTHREADS * VEC / HEAD_DIM;
  constexpr int SLICE_ROWS =
      MergeSliceRows<CTA_Q, PASS_ROWS < 1 ? 1 : (PASS_ROWS > CTA_Q ? CTA_Q : PASS_ROWS)>::value;
  constexpr int SLICES = CTA_Q / SLICE_ROWS;
  const bool cooperative = SLICES > 1 && w.num_chunks >= kCooperativeMergeMinChunks;
  const i64 index = (static_cast<i64>(w.counter) * gridDim.y + blockIdx.y) * CLUSTER + rank;
  u64* const word = p.merge_words + index;
  int* const counter = p.counters + index;
  // Thread 0 fences alone (arch/memory_order.cuh): after the barrier that
  // follows the group's stores, before the chunk counts in; after its first
  // slice, before the barrier behind which the group reads the other
  // chunks' rows.
  MergeTaker taker{word, 0ull, w.num_chunks, SLICES, (SLICES + w.num_chunks - 1) / w.num_chunks, 0};
  if (!cooperative) {
    if (!split_chunk_is_last(counter, w.num_chunks, tid, slot, sync)) return;
  } else {
    sync();
    if (tid == 0) {
      fence_acq_rel_gpu();
      taker.count_in(!queue_ends_here);
      if (queue_ends_here) taker.wait_all_in();
    }
  }
  for (int done = 0;;) {
    int row_begin = 0, row_end = CTA_Q;
    if (cooperative) {
      if (tid == 0) {
        int count = 0;
        const int first = taker.take(done, &count);
        if (first >= 0 && done == 0) fence_acq_rel_gpu();
        *slot = first < 0 ? -1 : first | count << 16;
      }
      sync();
      const int taken = *slot;
      sync();  // every thread has read it before the next take
      if (taken < 0) return;
      const int first = taken & 0xffff;
      done = taken >> 16;
      row_begin = first * SLICE_ROWS;
      row_end = row_begin + done * SLICE_ROWS;
    }
    merge_split_rows<Variant, DO, HEAD_DIM, CTA_Q, CLUSTER, VEC>(p, variant, w, qo_start, qo_len, row0, b, kv_head,
                                                                 tid, NTHREADS, rank, row_begin, row_end);
    if (!cooperative) {
      if (tid == 0) *counter = 0;
      return;
    }
  }
}

#endif

}  // namespace tessera
