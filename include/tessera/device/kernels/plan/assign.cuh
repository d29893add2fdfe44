// The host planner's assignment (Algorithm 1 lines 5-13, runtime/planner.cpp)
// in one block: chunks sorted longest first (prefill: requests by their
// longest chunk first, each request's chunks longest first, the last
// kTailRuns * ctas chunks longest first across requests; serpentine runs
// reversed), then each chunk to the cheapest CTA, ties to the lowest index.
// A CTA's entry packs (cost << 20 | CTA) as the host heap's entries do, so
// the warp-wide minimum below is the heap's minimum and the queues are the
// host planner's, item for item.
#pragma once
#include "tessera/device/kernels/plan/block_schedule.cuh"

namespace tessera {

#if defined(__CUDACC__) || defined(__CUDACC_RTC__)
namespace plan {

constexpr int kCtaBits = 20;  // as Planner::kCtaBits
constexpr u64 kCtaMask = (u64{1} << kCtaBits) - 1;

// Chunk j of tile i (chunk0 at chunk size L): its tile and length.
__device__ __forceinline__ int chunk_tile(const Tables& t, int n, int j) { return last_at_most(t.chunk0, n, j); }
__device__ __forceinline__ int chunk_keys(const Tables& t, int i, int k) {
  const ChunkShape s = tile_shape(t, i);
  return k < s.n - 1 ? s.step : last_chunk_keys(t.len[i], s);
}

// Sort keys: (request rank, request) then (length descending, chunk id), padded to sort_n with the largest.
__device__ void chunk_sort_keys(const DevicePlanParams& p, const Tables& t, int batch, int n, int chunks) {
  if (!p.decode) {  // a request's rank: its longest chunk (the first of a split tile)
#pragma unroll 1
    for (int b = threadIdx.x; b < batch; b += blockDim.x) {
      int r = 0;
#pragma unroll 1
      for (int i = t.tile0[b]; i < t.tile0[b + 1]; ++i) {
        const ChunkShape s = tile_shape(t, i);
        r = max(r, s.n == 1 ? t.len[i] : s.step);
      }
      t.req_rank[b] = r;
    }
    __syncthreads();
  }
#pragma unroll 1
  for (int j = threadIdx.x; j < t.sort_n; j += blockDim.x) {
    if (j >= chunks) {
      t.major[j] = t.minor[j] = ~u64{0};
      continue;
    }
    const int i = chunk_tile(t, n, j), len = chunk_keys(t, i, j - t.chunk0[i]);
    t.minor[j] = static_cast<u64>(static_cast<unsigned>(0x7fffffff - len)) << 32 | static_cast<unsigned>(j);
    const int b = t.req[i];
    t.major[j] = p.decode ? 0 : static_cast<u64>(static_cast<unsigned>(0x7fffffff - t.req_rank[b])) << 32 |
                                    static_cast<unsigned>(b);
  }
  __syncthreads();
}

// The chunks' minor keys in ascending (major, minor) order into t.order:
// by rank (each key counts the smaller ones: one pass, no barrier per
// stage) up to 1024 chunks, else a bitonic sort over sort_n entries.
__device__ void sort_chunks(const Tables& t, int chunks) {
  if (chunks <= 1024) {
#pragma unroll 1
    for (int i = threadIdx.x; i < chunks; i += blockDim.x) {
      const u64 a0 = t.major[i], a1 = t.minor[i];
      int r = 0;
#pragma unroll 4
      for (int j = 0; j < chunks; ++j) {
        const u64 b0 = t.major[j], b1 = t.minor[j];
        r += b0 < a0 || (b0 == a0 && b1 < a1);
      }
      t.order[r] = a1;
    }
    __syncthreads();
    return;
  }
  const int n = t.sort_n;
#pragma unroll 1
  for (int k = 2; k <= n; k <<= 1)
#pragma unroll 1
    for (int j = k >> 1; j > 0; j >>= 1) {
#pragma unroll 1
      for (int i = threadIdx.x; i < n; i += blockDim.x) {
        const int x = i ^ j;
        if (x <= i) continue;
        const bool up = (i & k) == 0;
        const u64 a0 = t.major[i], a1 = t.minor[i], b0 = t.major[x], b1 = t.minor[x];
        const bool greater = a0 > b0 || (a0 == b0 && a1 > b1);
        if (greater == up) {
          t.major[i] = b0;
          t.minor[i] = b1;
          t.major[x] = a0;
          t.minor[x] = a1;
        }
      }
      __syncthreads();
    }
#pragma unroll 1
  for (int i = threadIdx.x; i < chunks; i += blockDim.x) t.order[i] = t.minor[i];
  __syncthreads();
}

// Prefill: the last kTailRuns * ctas chunks of the order by their minor
// keys alone (length descending, chunk id: unique), as the host planner
// re-sorts them; by rank, through major[], free once sort_chunks is done.
__device__ void sort_tail(const DevicePlanParams& p, const Tables& t, int chunks) {
  if (p.decode) return;  // decode's order is line 5's already
  const int lo = chunks - static_cast<int>(imin(chunks, static_cast<i64>(kTailRuns) * p.ctas));
#pragma unroll 1
  for (int i = lo + threadIdx.x; i < chunks; i += blockDim.x) t.major[i] = t.order[i];
  __syncthreads();
#pragma unroll 1
  for (int i = lo + threadIdx.x; i < chunks; i += blockDim.x) {
    const u64 a = t.major[i];
    int r = 0;
#pragma unroll 4
    for (int j = lo; j < chunks; ++j) r += t.major[j] < a;
    t.order[lo + r] = a;
  }
  __syncthreads();
}

// Position k of the assignment order in the sorted keys (serpentine: odd
// runs of ctas chunks reversed).
__device__ __forceinline__ int sorted_at(const DevicePlanParams& p, int chunks, int k) {
  if (!p.serpentine) return k;
  const int run = k / p.ctas;
  if (run % 2 == 0) return k;
  const int lo = run * p.ctas, hi = min(chunks, lo + p.ctas);
  return hi - 1 - (k - lo);
}

// Assignment-order chunk k: its id and cost.
struct Pick {
  int chunk;
  u64 cost;
};
__device__ __forceinline__ Pick pick_at(const DevicePlanParams& p, const Tables& t, int chunks, int k) {
  const u64 key = t.order[sorted_at(p, chunks, k)];
  const unsigned len = 0x7fffffffu - static_cast<unsigned>(key >> 32);
  return {static_cast<int>(key & 0xffffffffu), static_cast<u64>(p.item_cost) + static_cast<u64>(p.token_cost) * len};
}

// Warp 0 assigns chunks fast .. chunks - 1: lane l holds the entries of
// CTAs l, l + 32, ... (K of them) in registers; each step takes the
// minimum entry (two 32-bit warp reductions: high word, then low word among
// the lanes holding it), and that CTA's lane adds the chunk. The next 32
// chunks are read once per 32 steps and passed by shuffles.
template <int K>
__device__ __noinline__ void greedy_steps(const DevicePlanParams& p, const Tables& t, int chunks, int fast) {
  const int lane = threadIdx.x, m = p.ctas;
  u64 e[K];
  int count[K];
#pragma unroll
  for (int i = 0; i < K; ++i) {
    const int c = lane + 32 * i;
    e[i] = c < m ? (c < fast ? pick_at(p, t, chunks, c).cost << kCtaBits : 0) | static_cast<u64>(c) : ~u64{0};
    count[i] = c < fast ? 1 : 0;
  }
  auto lane_min = [&] {
    u64 x = e[0];
#pragma unroll
    for (int i = 1; i < K; ++i) x = min(x, e[i]);
    return x;
  };
  u64 mine = lane_min();
#pragma unroll 1
  for (int base = fast; base < chunks; base += 32) {
    Pick ahead{0, 0};
    if (base + lane < chunks) ahead = pick_at(p, t, chunks, base + lane);
    const int steps = min(32, chunks - base);
#pragma unroll 1
    for (int s = 0; s < steps; ++s) {
      const int w = __shfl_sync(0xffffffffu, ahead.chunk, s);
      const u64 cost = __shfl_sync(0xffffffffu, ahead.cost, s);
      const unsigned hi = __reduce_min_sync(0xffffffffu, static_cast<unsigned>(mine >> 32));
      const unsigned lo = __reduce_min_sync(
          0xffffffffu, static_cast<unsigned>(mine >> 32) == hi ? static_cast<unsigned>(mine) : 0xffffffffu);
      const int c = static_cast<int>(lo & kCtaMask);
      // Branch-free: every lane runs the update, predicated on holding CTA
      // c (a divergent branch per step cost more than the update itself).
      const bool holder = (c & 31) == lane;
      const int slot = c >> 5;
      int rank = 0;
#pragma unroll
      for (int i = 0; i < K; ++i) {
        const bool hit = holder && i == slot;
        rank = hit ? count[i] : rank;
        count[i] += hit ? 1 : 0;
        e[i] += hit ? cost << kCtaBits : 0;
      }
      if (holder) {
        t.owner[w] = c;
        t.rank[w] = rank;
      }
      mine = lane_min();
    }
  }
  i64 longest = 0;  // the busiest CTA's cost
#pragma unroll
  for (int i = 0; i < K; ++i)
    if (lane + 32 * i < m) {
      t.cta_count[lane + 32 * i] = count[i];
      longest = imax(longest, static_cast<i64>(e[i] >> kCtaBits));
    }
  longest = warp_reduce(longest, Max{});
  if (lane == 0) t.scalars[0] = longest;
}

// Each chunk to the cheapest CTA: owner, rank within the CTA, the CTAs'
// chunk counts; returns the largest CTA cost (every thread). The first
// chunks (while each adds a cost) go to CTAs 0, 1, ... as the host's heap
// would give them; warp 0 assigns the rest.
__device__ i64 assign_chunks(const DevicePlanParams& p, const Tables& t, int chunks) {
  const int m = p.ctas;
  i64 fast = min(chunks, m);
#pragma unroll 1
  for (int k = threadIdx.x; k < min(chunks, m); k += blockDim.x)
    if (pick_at(p, t, chunks, k).cost == 0) fast = min(fast, static_cast<i64>(k));
  fast = block_reduce(fast, t.red, Min{});
#pragma unroll 1
  for (int k = threadIdx.x; k < fast; k += blockDim.x) {
    const int w = pick_at(p, t, chunks, k).chunk;
    t.owner[w] = k;
    t.rank[w] = 0;
  }
  if (threadIdx.x < 32) {
    const int f = static_cast<int>(fast);
    if (m <= 32) greedy_steps<1>(p, t, chunks, f);
    else if (m <= 64) greedy_steps<2>(p, t, chunks, f);
    else if (m <= 128) greedy_steps<4>(p, t, chunks, f);
    else if (m <= 256) greedy_steps<8>(p, t, chunks, f);
    else greedy_steps<32>(p, t, chunks, f);
  }
  __syncthreads();
  return t.scalars[0];
}

}  // namespace plan
#endif

}  // namespace tessera
