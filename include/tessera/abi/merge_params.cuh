// Parameter blocks of the attention-state merge kernels (plain data).
#pragma once
#include "tessera/abi/types.cuh"

namespace tessera {

// A set of attention states: v[(state, head, feat)] at
// v + state*v_stride_state + head*v_stride_head + feat, s at
// s + state*s_stride_state + head*s_stride_head (base-2 LSE, float).
struct StateSet {
  const void* v;
  const float* s;
  i64 v_stride_state, v_stride_head;
  i64 s_stride_state, s_stride_head;
};

// Division by a divisor fixed at launch (the heads per token), as a multiply
// and a shift: a merge thread's first loads wait on its row's (token, head),
// and an integer division would put ~20 dependent instructions before them.
// Exact for 0 <= x < 2^31 and 1 <= d < 2^31: with l = ceil(log2 d) and
// mul = ceil(2^(31+l) / d) < 2^32, mul * d - 2^(31+l) < d <= 2^l, so
// floor(x * mul / 2^(31+l)) = floor(x / d) for every x < 2^31.
struct FastDivisor {
  u32 mul;
  int shift;
};

inline FastDivisor fast_divisor(int d) {
  int l = 0;
  while ((1ll << l) < d) ++l;
  const u64 shift = 31 + static_cast<u64>(l);
  return {static_cast<u32>(((1ull << shift) + static_cast<u64>(d) - 1) / static_cast<u64>(d)), static_cast<int>(shift)};
}

#if defined(__CUDACC__) || defined(__CUDACC_RTC__)
__host__ __device__
#endif
inline int fast_divide(int x, FastDivisor f) {
  return static_cast<int>((static_cast<u64>(static_cast<u32>(x)) * f.mul) >> f.shift);
}

struct StateOut {
  void* v;
  float* s;  // may be null (LSE not wanted)
  i64 v_stride_state, v_stride_head;
  i64 s_stride_state, s_stride_head;
};

// out = a (+) b, per (row, head). out may alias a (in place). When mask is
// non-null, rows with mask[row] == 0 are left as a (FlashInfer's
// merge_state_in_place mask). The host runs the flat kernel
// (merge_pair<..., FLAT = true>) when every set is flat: its row stride is
// num_heads times its head stride (values and LSEs alike), and each head
// stride lies in [0, 2^31), as for contiguous [rows, heads, head_dim] states.
struct MergePairParams {
  StateSet a, b;
  StateOut out;
  const unsigned char* mask;
  int num_rows, num_heads, head_dim;
  FastDivisor heads;  // fast_divisor(num_heads)
};

// out[row] = (+) over the states of row: states indptr[row] .. indptr[row+1]
// when indptr is non-null, else row*states_per_row .. + states_per_row.
struct MergeManyParams {
  StateSet in;
  StateOut out;
  const int* indptr;
  int states_per_row;
  int num_rows, num_heads, head_dim;
  FastDivisor heads;  // fast_divisor(num_heads)
};

// Thread layout of the merge kernels, shared by the host (grid size) and the
// kernels. A row, one (token, head) of head_dim values, is `vectors` 16-byte
// vectors held by min(vectors, 32) lanes of one warp, merge_per_lane(vectors)
// each, so a row never spans warps and its LSE is read and written inside one
// warp. A warp takes 32 / lanes rows a step; a thread of merge_pair takes
// merge_pair_steps such rows (all their loads in flight together), one of
// merge_many one row (its states' loads in flight in blocks). One row per
// thread: at 16 bytes a lane a full GPU already has more bytes in flight than
// HBM needs, and a thread's own work before its first store is what a short
// merge waits for (two rows per thread, with libm's exp2f / log2f / IEEE
// division, took 36.8 / 6.1 us at 4096 / 512 x 32 x 128 fp16 on the H100; one
// row with bare MUFU ops 36.4 / 5.6: bench/merge.py). The kernels compute the
// same numbers at run time (they cannot call these constexpr host functions
// there under nvcc).
constexpr int kMergeThreads = 256;
constexpr int kMergeMaxVectors = 128;  // per_lane <= 4
constexpr int merge_per_lane(int vectors) { return vectors > 32 ? vectors / 32 : 1; }
constexpr int merge_pair_steps(int) { return 1; }
constexpr int merge_rows_per_block(int vectors, int steps) {
  return kMergeThreads / 32 * (vectors >= 32 ? 1 : 32 / vectors) * steps;
}

}  // namespace tessera
