// The parallel schedule (plan/schedule.cuh) as one block computes it: every
// decision is a block-wide reduction or scan over the query tiles, whose
// tables live in shared memory (plan/tables.cuh). Evaluating a chunk size
// costs one pass over the tiles, two scans and a binary search per CTA.
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
// Four reductions in one pass (max, sum, sum, max), as evaluate() needs
// them; quad: 4 x 33 shared slots, apart from red.
__device__ __forceinline__ void block_reduce4(i64 (&v)[4], i64* quad) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  for (int o = 16; o > 0; o >>= 1) {
    v[0] = Max{}(v[0], __shfl_xor_sync(0xffffffffu, v[0], o));
    v[1] += __shfl_xor_sync(0xffffffffu, v[1], o);
    v[2] += __shfl_xor_sync(0xffffffffu, v[2], o);
    v[3] = Max{}(v[3], __shfl_xor_sync(0xffffffffu, v[3], o));
  }
  __syncwarp();
  if (lane == 0)
    for (int i = 0; i < 4; ++i) quad[33 * i + warp] = v[i];
  __syncthreads();
  if (warp < 4) {  // warp i folds value i
    const bool sum = warp == 1 || warp == 2;
    i64 x = lane < warps ? quad[33 * warp + lane] : (sum ? Sum::kIdentity : Max::kIdentity);
    for (int o = 16; o > 0; o >>= 1) {
      const i64 y = __shfl_xor_sync(0xffffffffu, x, o);
      x = sum ? x + y : Max{}(x, y);
    }
    if (lane == 0) quad[33 * warp + 32] = x;
  }
  __syncthreads();
  for (int i = 0; i < 4; ++i) v[i] = quad[33 * i + 32];
}
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

// This thread's contiguous run of n elements (scans keep element order).
struct Segment {
  int lo, hi;
};
__device__ __forceinline__ Segment segment(int n) {
  const int per = (n + blockDim.x - 1) / blockDim.x;
  const int lo = min(n, static_cast<int>(threadIdx.x) * per);
  return {lo, min(n, lo + per)};
}

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

// What the schedule at one chunk size gives (every thread holds it); the
// tables' per-tile prefixes and CTA boundaries are this L's afterwards.
struct Evaluation {
  i64 makespan, slots, splits, worst, chunks, cost;
};

__device__ Evaluation evaluate(const DevicePlanParams& p, const Tables& t, int n, int L, const Costs& costs) {
  const Segment seg = segment(n);
  i64 cost = 0, chunks = 0, slots = 0, splits = 0, worst = 0;
  for (int i = seg.lo; i < seg.hi; ++i) {
    const ChunkShape s = chunk_shape(t.len[i], L, p.chunk_align);
    cost += tile_cost(costs, t.len[i], s);
    chunks += s.n;
    if (s.n > 1) {
      slots += s.n;
      splits += 1;
      worst = imax(worst, static_cast<i64>(t.rows[i]) * s.n);
    }
  }
  Evaluation e{};
  i64 c = block_exclusive_scan(cost, t.red, e.cost);
  i64 k = block_exclusive_scan(chunks, t.red, e.chunks);
  for (int i = seg.lo; i < seg.hi; ++i) {
    const ChunkShape s = chunk_shape(t.len[i], L, p.chunk_align);
    t.before[i] = c;
    t.chunk0[i] = static_cast<int>(k);
    t.mid2[i] = last_midpoint2(costs, c, t.len[i], s);
    c += tile_cost(costs, t.len[i], s);
    k += s.n;
  }
  __syncthreads();
  for (int x = threadIdx.x; x <= p.ctas; x += blockDim.x) {
    i64 first = e.chunks, before = e.cost;  // CTA ctas, or a share past every chunk's midpoint
    if (x == 0) {
      first = 0;
      before = 0;
    } else if (x < p.ctas) {
      const i64 t2 = cta_threshold2(e.cost, x, p.ctas);
      int lo = 0, hi = n;  // the first tile whose last chunk reaches t2
      while (lo < hi) {
        const int mid = (lo + hi) / 2;
        if (t.mid2[mid] >= t2) hi = mid;
        else lo = mid + 1;
      }
      if (lo < n) {
        const ChunkShape s = chunk_shape(t.len[lo], L, p.chunk_align);
        const int j = first_chunk_from(costs, t.before[lo], s, t2);
        first = t.chunk0[lo] + j;
        before = cost_before_chunk(costs, t.before[lo], s, j);
      }
    }
    t.cta_first[x] = static_cast<int>(first);
    t.cta_before[x] = before;
  }
  __syncthreads();
  i64 longest = 0;
  for (int x = threadIdx.x; x < p.ctas; x += blockDim.x) longest = imax(longest, t.cta_before[x + 1] - t.cta_before[x]);
  i64 v[4] = {longest, slots, splits, worst};
  block_reduce4(v, t.quad);
  e.makespan = v[0];
  e.slots = v[1];
  e.splits = v[2];
  e.worst = v[3];
  return e;
}

// Chunks of the tiles at chunk size len, as the host planner's one-wave refinement counts them.
__device__ __forceinline__ i64 chunks_at(const Tables& t, int n, i64 len, i64* red) {
  i64 c = 0;
  for (int i = threadIdx.x; i < n; i += blockDim.x) c += imax(1, (t.len[i] + len - 1) / len);
  return block_reduce(c, red, Sum{});
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
