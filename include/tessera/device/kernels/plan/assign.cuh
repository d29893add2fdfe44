// The host planner's assignment (Algorithm 1 lines 5-13, runtime/planner.cpp)
// in one block: chunks sorted longest first (prefill: requests by their
// longest chunk first, each request's chunks longest first; serpentine runs
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
__device__ __forceinline__ int chunk_keys(const Tables& t, int L, int align, int i, int k) {
  const ChunkShape s = chunk_shape(t.len[i], L, align);
  return k < s.n - 1 ? s.step : last_chunk_keys(t.len[i], s);
}

// Sort keys: (request rank, request) then (length descending, chunk id), padded to sort_n with the largest.
__device__ void chunk_sort_keys(const DevicePlanParams& p, const Tables& t, int batch, int n, int chunks, int L) {
  if (!p.decode) {  // a request's rank: its longest chunk (the first of a split tile)
    for (int b = threadIdx.x; b < batch; b += blockDim.x) {
      int r = 0;
      for (int i = t.tile0[b]; i < t.tile0[b + 1]; ++i) {
        const ChunkShape s = chunk_shape(t.len[i], L, p.chunk_align);
        r = max(r, s.n == 1 ? t.len[i] : s.step);
      }
      t.req_rank[b] = r;
    }
    __syncthreads();
  }
  for (int j = threadIdx.x; j < t.sort_n; j += blockDim.x) {
    if (j >= chunks) {
      t.major[j] = t.minor[j] = ~u64{0};
      continue;
    }
    const int i = chunk_tile(t, n, j), len = chunk_keys(t, L, p.chunk_align, i, j - t.chunk0[i]);
    t.minor[j] = static_cast<u64>(static_cast<unsigned>(0x7fffffff - len)) << 32 | static_cast<unsigned>(j);
    const int b = t.req[i];
    t.major[j] = p.decode ? 0 : static_cast<u64>(static_cast<unsigned>(0x7fffffff - t.req_rank[b])) << 32 |
                                    static_cast<unsigned>(b);
  }
  __syncthreads();
}

// Bitonic sort of (major, minor) ascending over sort_n entries.
__device__ void sort_chunks(const Tables& t) {
  const int n = t.sort_n;
  for (int k = 2; k <= n; k <<= 1)
    for (int j = k >> 1; j > 0; j >>= 1) {
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

// Each chunk to the cheapest CTA: owner, rank within the CTA, the CTAs'
// chunk counts. The first chunks (while each adds a cost) go to CTAs 0, 1,
// ... as the host's heap would give them; warp 0 assigns the rest.
__device__ void assign_chunks(const DevicePlanParams& p, const Tables& t, int chunks) {
  const int m = p.ctas;
  const u64 item = static_cast<u64>(p.item_cost), token = static_cast<u64>(p.token_cost);
  auto chunk_at = [&](int k) { return static_cast<int>(t.minor[sorted_at(p, chunks, k)] & 0xffffffffu); };
  auto cost_at = [&](int k) {
    const unsigned len = 0x7fffffffu - static_cast<unsigned>(t.minor[sorted_at(p, chunks, k)] >> 32);
    return item + token * len;
  };
  i64 fast = min(chunks, m);
  for (int k = threadIdx.x; k < min(chunks, m); k += blockDim.x)
    if (cost_at(k) == 0) fast = min(fast, static_cast<i64>(k));
  fast = block_reduce(fast, t.red, Min{});
  for (int c = threadIdx.x; c < m; c += blockDim.x) {
    const bool taken = c < fast;
    t.cta_cost[c] = (taken ? cost_at(c) << kCtaBits : 0) | static_cast<u64>(c);
    t.cta_count[c] = taken ? 1 : 0;
    if (taken) {
      t.owner[chunk_at(c)] = c;
      t.rank[chunk_at(c)] = 0;
    }
  }
  __syncthreads();
  if (threadIdx.x < 32 && fast < chunks) {
    const int lane = threadIdx.x;
    auto lane_min = [&] {
      u64 e = ~u64{0};
      for (int c = lane; c < m; c += 32) e = min(e, t.cta_cost[c]);
      return e;
    };
    u64 mine = lane_min();
    for (int k = static_cast<int>(fast); k < chunks; ++k) {
      u64 e = mine;
      for (int o = 16; o > 0; o >>= 1) e = min(e, __shfl_xor_sync(0xffffffffu, e, o));
      const int c = static_cast<int>(e & kCtaMask);
      if (c % 32 == lane) {
        const int w = chunk_at(k);
        t.owner[w] = c;
        t.rank[w] = t.cta_count[c]++;
        t.cta_cost[c] = e + (cost_at(k) << kCtaBits);
        mine = lane_min();
      }
    }
  }
  __syncthreads();
}

}  // namespace plan
#endif

}  // namespace tessera
