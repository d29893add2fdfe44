// Split tiles of many chunks, merged by the CTAs that computed them.
//
// A tile cut in n chunks (a few long requests spread over every SM) has n
// CTAs that finish together. Left to its last writer, the merge reads n
// partial rows for each of the tile's rows on one SM, a pass of CTA threads
// x VEC features at a time, each pass n / 8 dependent round trips: longer
// than the attention itself for one request of 32k keys. Here the tile's
// rows are cut into slices of one pass, and every chunk's CTA whose queue
// ends with the tile takes slices once all n chunks are in. A slice is
// merged by merge_split_rows, exactly as the last writer merges, so the
// bits do not depend on which CTA merged it.
//
// State: one 64-bit word per split tile (Params::merge_words, zero between
// runs): chunks in (bits 0-15), slices taken (16-31), slices done (32-47).
// A slice is taken by compare-and-swap only while every chunk is in and
// slices remain; the CTA that finishes the last slice zeroes the word, and
// from then on nothing in the launch changes it (it reads as no chunk in),
// so the next run starts from zero. The last chunk to count in never waits:
// it takes slices until none is left. Another CTA waits for the tile only
// when its queue ends with it, and only for a bounded time, after which it
// leaves the slices to the others: a grid that is not all resident at once
// cannot hang on it.
#pragma once
#include "tessera/device/kernels/common/epilogue.cuh"

namespace tessera {

#if defined(__CUDACC__) || defined(__CUDACC_RTC__)

// Fewest chunks of a tile merged cooperatively. A tile cut in two stays with
// its last writer (the 16-row form merges it from registers); from three on,
// even when a pass is one round trip, the passes split over the chunks' CTAs
// end sooner than one CTA running them all.
constexpr int kCooperativeMergeMinChunks = 3;

struct MergeWord {
  static constexpr u64 kChunk = 1ull, kTaken = 1ull << 16, kDone = 1ull << 32;
  __device__ __forceinline__ static int chunks(u64 w) { return static_cast<int>(w & 0xffffu); }
  __device__ __forceinline__ static int taken(u64 w) { return static_cast<int>((w >> 16) & 0xffffu); }
  __device__ __forceinline__ static int done(u64 w) { return static_cast<int>((w >> 32) & 0xffffu); }
  __device__ __forceinline__ static u64 load(const u64* word) { return *reinterpret_cast<const volatile u64*>(word); }
};

// The next slice of a tile whose chunks are all in, or -1 (not all in, none
// left, or the tile already merged).
__device__ __forceinline__ int take_merge_slice(u64* word, int num_chunks, int slices) {
  u64 cur = MergeWord::load(word);
  for (;;) {
    if (MergeWord::chunks(cur) != num_chunks || MergeWord::taken(cur) >= slices) return -1;
    const u64 prev = atomicCAS(word, cur, cur + MergeWord::kTaken);
    if (prev == cur) return MergeWord::taken(cur);
    cur = prev;
  }
}

// Polls of a CTA waiting for its last tile's other chunks (~0.5 us each):
// far beyond the skew of chunks that start together, short of a hang.
constexpr int kMergeWaitPolls = 4096;

// After every thread of the group (tid in [0, NTHREADS)) stored its partial
// rows of a split tile: counts the chunk in and merges. A tile of at least
// kCooperativeMergeMinChunks chunks is merged in slices by whichever of its
// CTAs take them (waiting for the tile first when queue_ends_here); a
// smaller one by its last writer, all rows (prefill_merge_split's
// contract). One call of merge_split_rows serves both, so the kernel holds
// one copy of the merge's registers. sync() is a barrier over the group;
// slot a shared int.
template <typename Variant, typename DO, int HEAD_DIM, int CTA_Q, int NTHREADS, int VEC, typename Params,
          typename Sync>
__device__ __forceinline__ void merge_split_tile(const Params& p, const Variant& variant, const PrefillWorkItem& w,
                                                 int qo_start, int qo_len, int row0, int b, int tid, int* slot,
                                                 Sync sync, bool queue_ends_here) {
  constexpr int SLICE_ROWS = NTHREADS * VEC / HEAD_DIM, SLICES = CTA_Q / SLICE_ROWS;
  static_assert(SLICE_ROWS >= 1 && CTA_Q % SLICE_ROWS == 0, "whole passes of whole rows");
  const bool cooperative = w.num_chunks >= kCooperativeMergeMinChunks;
  u64* const word = p.merge_words + w.counter;  // one head group, no clusters (MLA's launch)
  int* const counter = p.counters + w.counter;
  if (!cooperative) {
    if (!split_chunk_is_last(counter, w.num_chunks, tid, slot, sync)) return;
  } else {
    __threadfence();  // this chunk's partial rows, before it counts in
    sync();
    if (tid == 0) {
      atomicAdd(word, MergeWord::kChunk);
      for (int i = 0; queue_ends_here && i < kMergeWaitPolls; ++i) {
        const int in = MergeWord::chunks(MergeWord::load(word));
        if (in == w.num_chunks || in == 0) break;  // all in, or already merged and zeroed
        __nanosleep(256);
      }
    }
  }
  for (;;) {
    int row_begin = 0, row_end = CTA_Q;
    if (cooperative) {
      if (tid == 0) *slot = take_merge_slice(word, w.num_chunks, SLICES);
      sync();
      const int s = *slot;
      sync();  // every thread has read it before the next take
      if (s < 0) return;
      __threadfence();  // the other chunks' partial rows
      row_begin = s * SLICE_ROWS;
      row_end = row_begin + SLICE_ROWS;
    }
    merge_split_rows<Variant, DO, HEAD_DIM, CTA_Q, 1, VEC>(p, variant, w, qo_start, qo_len, row0, b, 0, tid, NTHREADS,
                                                           0, row_begin, row_end);
    if (!cooperative) {
      if (tid == 0) *counter = 0;
      return;
    }
    if (tid == 0 && MergeWord::done(atomicAdd(word, MergeWord::kDone)) == SLICES - 1) atomicExch(word, 0ull);
  }
}

#endif

}  // namespace tessera
