// Attention-state merge kernels (paper §2.2): pairwise (merge_state and its
// in-place form) and many-to-one (merge_states, fixed or ragged counts).
// Thread mapping: each (row, head) pair is handled by head_dim / VEC threads,
// each owning VEC consecutive features (one 16-byte access). The reduction
// order over states is the state order: deterministic, no atomics.
#pragma once
#include "tessera/device/arch/vector_io.cuh"
#include "tessera/abi/merge_params.cuh"
#include "tessera/device/primitives/attention_state.cuh"

namespace tessera {

#if defined(__CUDACC__) || defined(__CUDACC_RTC__)

constexpr int kMergeThreads = 128;

template <typename T>
struct MergeVec { static constexpr int N = 16 / static_cast<int>(sizeof(T)); };

template <typename T>
__device__ __forceinline__ bool merge_coords(int head_dim, int num_pairs, int& pair, int& feat) {
  const int threads_per_pair = head_dim / MergeVec<T>::N;
  const int pairs_per_block = kMergeThreads / threads_per_pair;
  pair = blockIdx.x * pairs_per_block + threadIdx.x / threads_per_pair;
  feat = (threadIdx.x % threads_per_pair) * MergeVec<T>::N;
  return pair < num_pairs;
}

// TO: the output's element type (T's, or a 16-bit type for fp32 states: a
// cascade's last merge writes the caller's output).
template <typename T, typename TO = T>
__device__ __forceinline__ void merge_pair(const MergePairParams& p) {
  constexpr int N = MergeVec<T>::N;
  int pair, feat;
  if (!merge_coords<T>(p.head_dim, p.num_rows * p.num_heads, pair, feat)) return;
  const int row = pair / p.num_heads, head = pair % p.num_heads;
  if (p.mask != nullptr && p.mask[row] == 0) return;
  const float sa = p.a.s[row * p.a.s_stride_state + head * p.a.s_stride_head];
  const float sb = p.b.s[row * p.b.s_stride_state + head * p.b.s_stride_head];
  const MergeWeights w = merge_weights(sa, sb);
  float va[N], vb[N], out[N];
  load_vec<N>(static_cast<const T*>(p.a.v) + row * p.a.v_stride_state + head * p.a.v_stride_head + feat, va);
  load_vec<N>(static_cast<const T*>(p.b.v) + row * p.b.v_stride_state + head * p.b.v_stride_head + feat, vb);
#pragma unroll
  for (int i = 0; i < N; ++i) out[i] = merge_value(va[i], w.wa, vb[i], w.wb);
  // Everything is read before anything is written: in-place (out == a) is safe
  // because each thread only touches its own features.
  store_vec<N>(static_cast<TO*>(p.out.v) + row * p.out.v_stride_state + head * p.out.v_stride_head + feat, out);
  if (p.out.s != nullptr && feat == 0) p.out.s[row * p.out.s_stride_state + head * p.out.s_stride_head] = w.lse;
}

template <typename T>
__device__ __forceinline__ void merge_many(const MergeManyParams& p) {
  constexpr int N = MergeVec<T>::N;
  int pair, feat;
  if (!merge_coords<T>(p.head_dim, p.num_rows * p.num_heads, pair, feat)) return;
  const int row = pair / p.num_heads, head = pair % p.num_heads;
  const int first = p.indptr ? p.indptr[row] : row * p.states_per_row;
  const int count = p.indptr ? p.indptr[row + 1] - first : p.states_per_row;
  const float* s = p.in.s + head * p.in.s_stride_head;
  // Two passes over the scales: the max, then the weights relative to it.
  float m = neg_inf();
  for (int j = 0; j < count; ++j) m = fmaxf(m, s[(i64)(first + j) * p.in.s_stride_state]);
  float acc[N];
#pragma unroll
  for (int i = 0; i < N; ++i) acc[i] = 0.f;
  float denom = 0.f;
  if (m != neg_inf()) {
    for (int j = 0; j < count; ++j) {
      const float w = exp2f(s[(i64)(first + j) * p.in.s_stride_state] - m);
      if (w == 0.f) continue;  // empty state: its values are never read
      float v[N];
      load_vec<N>(static_cast<const T*>(p.in.v) + (i64)(first + j) * p.in.v_stride_state + head * p.in.v_stride_head + feat, v);
#pragma unroll
      for (int i = 0; i < N; ++i) acc[i] += w * v[i];
      denom += w;
    }
  }
  const float inv = denom > 0.f ? 1.f / denom : 0.f;
#pragma unroll
  for (int i = 0; i < N; ++i) acc[i] *= inv;
  store_vec<N>(static_cast<T*>(p.out.v) + row * p.out.v_stride_state + head * p.out.v_stride_head + feat, acc);
  if (p.out.s != nullptr && feat == 0)
    p.out.s[row * p.out.s_stride_state + head * p.out.s_stride_head] = denom > 0.f ? m + log2f(denom) : neg_inf();
}

#endif

}  // namespace tessera
