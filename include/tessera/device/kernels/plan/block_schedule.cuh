// The device planner's block-wide and warp-wide steps over the query
// tiles, whose tables live in shared memory (plan/tables.cuh): reductions,
// scans, a chunk size's pass over the tiles, the one-wave chunk count.
#pragma once
#include "tessera/abi/device_plan_params.cuh"
#include "tessera/device/kernels/plan/schedule.cuh"
#include "tessera/device/kernels/plan/tables.cuh"

namespace tessera {

#if defined(__CUDACC__) || defined(__CUDACC_RTC__)
namespace plan {

// Block-wide reductions and scans (every thread calls them, every thread
// gets the result). red: 33 shared slots, reused call after call: warp w's
// partial in red[w], the result in red[32]. A call's writes to red[w] come
// after its warp's reads of the previous call (__syncwarp), and warp 0
// reads the partials before the barrier that ends the call.
template <typename Op>
__device__ __forceinline__ i64 block_reduce(i64 v, i64* red, Op op) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  for (int o = 16; o > 0; o >>= 1) v = op(v, __shfl_xor_sync(0xffffffffu, v, o));
  __syncwarp();
  if (lane == 0) red[warp] = v;
  __syncthreads();
  if (warp == 0) {
    i64 x = lane < warps ? red[lane] : Op::kIdentity;
    for (int o = 16; o > 0; o >>= 1) x = op(x, __shfl_xor_sync(0xffffffffu, x, o));
    if (lane == 0) red[32] = x;
  }
  __syncthreads();
  return red[32];
}
struct Sum {
  static constexpr i64 kIdentity = 0;
  __device__ i64 operator()(i64 a, i64 b) const { return a + b; }
};
struct Max {
  static constexpr i64 kIdentity = -0x7fffffffffffffffLL - 1;
  __device__ i64 operator()(i64 a, i64 b) const { return a > b ? a : b; }
};
struct Min {
  static constexpr i64 kIdentity = 0x7fffffffffffffffLL;
  __device__ i64 operator()(i64 a, i64 b) const { return a < b ? a : b; }
};
// Exclusive prefix of the threads' values in thread order; total: the sum.
__device__ __forceinline__ i64 block_exclusive_scan(i64 v, i64* red, i64& total) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  i64 x = v;
  for (int o = 1; o < 32; o <<= 1) {
    const i64 y = __shfl_up_sync(0xffffffffu, x, o);
    if (lane >= o) x += y;
  }
  __syncwarp();
  if (lane == 31) red[warp] = x;
  __syncthreads();
  if (warp == 0) {  // the warps' exclusive prefixes in place, the total in red[32]
    const i64 mine = lane < warps ? red[lane] : 0;
    i64 y = mine;
    for (int o = 1; o < 32; o <<= 1) {
      const i64 z = __shfl_up_sync(0xffffffffu, y, o);
      if (lane >= o) y += z;
    }
    if (lane < warps) red[lane] = y - mine;
    if (lane == 31) red[32] = y;
  }
  __syncthreads();
  total = red[32];
  return red[warp] + x - v;
}

// Warp-wide versions: the chunk-size decision runs in warp 0 alone, whose
// steps then need shuffles only, no block barrier.
template <typename Op>
__device__ __forceinline__ i64 warp_reduce(i64 v, Op op) {
  for (int o = 16; o > 0; o >>= 1) v = op(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
__device__ __forceinline__ i64 warp_exclusive_scan(i64 v, i64& total) {
  const int lane = threadIdx.x % 32;
  i64 x = v;
  for (int o = 1; o < 32; o <<= 1) {
    const i64 y = __shfl_up_sync(0xffffffffu, x, o);
    if (lane >= o) x += y;
  }
  total = __shfl_sync(0xffffffffu, x, 31);
  return x - v;
}

// This thread's contiguous run of n elements among `threads` (scans keep
// element order): the block's, or warp 0's.
struct Segment {
  int lo, hi;
};
__device__ __forceinline__ Segment segment(int n, int threads, int rank) {
  const int per = (n + threads - 1) / threads;
  const int lo = min(n, rank * per);
  return {lo, min(n, lo + per)};
}
__device__ __forceinline__ Segment segment(int n) { return segment(n, kDevicePlanThreads, threadIdx.x); }
__device__ __forceinline__ Segment lane_segment(int n) { return segment(n, 32, threadIdx.x % 32); }

// Binary search: the last index i in [0, n) with a[i] <= x (a ascending, a[0] <= x).
__device__ __forceinline__ int last_at_most(const int* a, int n, i64 x) {
  int lo = 0, hi = n - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (a[mid] <= x) lo = mid;
    else hi = mid - 1;
  }
  return lo;
}

// Chunk size L over the tiles (warp 0 only): each tile's first chunk
// (chunk0, with the total in chunk0[n]) and chunk length (step), and the
// totals of an Evaluation but its makespan.
__device__ __noinline__ Evaluation tile_pass(const DevicePlanParams& p, const Tables& t, int n, int L) {
  const Segment seg = lane_segment(n);
  i64 chunks = 0, slots = 0, splits = 0, worst = 0;
#pragma unroll 1
  for (int i = seg.lo; i < seg.hi; ++i) {
    const ChunkShape s = chunk_shape(t.len[i], L, p.chunk_align);
    t.chunk0[i] = s.n;  // the count until the scan below
    t.step[i] = s.step;
    chunks += s.n;
    if (s.n > 1) {
      slots += s.n;
      splits += 1;
      worst = imax(worst, static_cast<i64>(t.rows[i]) * s.n);
    }
  }
  Evaluation e{};
  i64 k = warp_exclusive_scan(chunks, e.chunks);
#pragma unroll 1
  for (int i = seg.lo; i < seg.hi; ++i) {
    const int c = t.chunk0[i];
    t.chunk0[i] = static_cast<int>(k);
    k += c;
  }
  if (threadIdx.x == 0) t.chunk0[n] = static_cast<int>(e.chunks);
  e.slots = warp_reduce(slots, Sum{});
  e.splits = warp_reduce(splits, Sum{});
  e.worst = warp_reduce(worst, Max{});
  return e;
}

// Tile i's chunks at the chunk size of the last tile_pass.
__device__ __forceinline__ ChunkShape tile_shape(const Tables& t, int i) {
  return {t.chunk0[i + 1] - t.chunk0[i], t.step[i]};
}

// Chunks of the tiles at chunk size len, as the one-wave refinement counts
// them (every thread calls it, every thread gets the count).
__device__ __forceinline__ i64 chunks_at(const Tables& t, int n, i64 len) {
  const unsigned l = static_cast<unsigned>(len);  // 32-bit divisions: len and every tile's keys are below 2^31
  i64 c = 0;
#pragma unroll 1
  for (int i = threadIdx.x; i < n; i += blockDim.x) c += max(1u, (static_cast<unsigned>(t.len[i]) + l - 1) / l);
  return block_reduce(c, t.red, Sum{});
}

// Records the first failed check (flag last, as PageIdErrors reads it).
__device__ __forceinline__ void record_error(const DevicePlanParams& p, int* claim, int code, int request, int value) {
  if (atomicCAS(claim, 0, 1) != 0) return;
  volatile int* e = p.error;
  e[1] = code;
  e[2] = request;
  e[3] = value;
  __threadfence_system();
  e[0] = 1;
}

}  // namespace plan
#endif

}  // namespace tessera
