// Attention-state merge kernels (paper §2.2): pairwise (merge_state and its
// in-place form) and many-to-one (merge_states, fixed or ragged counts).
//
// A merge reads each value once and does a few flops per element, so these
// kernels are written to keep HBM busy (layout: abi/merge_params.cuh):
//  * a row (one token and head) lives in one warp, 16 bytes per lane access;
//  * every load a thread needs (values and LSEs of all its rows, or of a block
//    of states) is issued, raw, before any result is used: the values never
//    wait for the LSEs, so a thread pays one memory round trip, not two (a
//    branch on the weights between the two loads serializes them);
//  * the weights are computed once per row and lane in fp32 with exp2 (LSEs
//    are base 2), then applied to the vectors.
// Reduction order over states is the state order: deterministic, no atomics.
// An empty state (LSE -inf) weighs 0 and its values, even NaN, are never used.
#pragma once
#include "tessera/abi/merge_params.cuh"
#include "tessera/device/arch/grid_dependency.cuh"
#include "tessera/device/arch/vector_io.cuh"
#include "tessera/device/primitives/attention_state.cuh"

namespace tessera {

#if defined(__CUDACC__) || defined(__CUDACC_RTC__)

template <typename T>
struct MergeVec { static constexpr int N = 16 / static_cast<int>(sizeof(T)); };

// A lane's place in the layout: its first row (rows of later steps follow
// `rows_per_warp` apart), whether it leads its row (writes the LSE), and the
// first element of its first vector (its next ones lie lanes * N further).
struct MergeLane {
  int row, rows_per_warp, feat, stride;
  bool leader;
};

// lanes: lanes per row (a power of two <= 32, so shifts and masks stand in
// for divisions on the way to the first load); steps: rows per thread.
template <int N>
__device__ __forceinline__ MergeLane merge_lane(int lanes, int steps) {
  MergeLane l;
  const int lane = static_cast<int>(threadIdx.x) & 31;
  const int warp = static_cast<int>(blockIdx.x) * (kMergeThreads / 32) + static_cast<int>(threadIdx.x) / 32;
  const int log2_lanes = __ffs(lanes) - 1;
  l.rows_per_warp = 32 >> log2_lanes;
  l.row = warp * l.rows_per_warp * steps + (lane >> log2_lanes);
  l.feat = (lane & (lanes - 1)) * N;
  l.stride = lanes * N;
  l.leader = (lane & (lanes - 1)) == 0;
  return l;
}

// Element offset of (state, head) in a state set, or of (row, head) in an output.
__device__ __forceinline__ i64 value_offset(i64 state, int head, i64 stride_state, i64 stride_head) {
  return state * stride_state + head * stride_head;
}

// Element offset of row r = token * heads + head in a set whose token stride
// is heads times its head stride: no (token, head) needed. The host admits
// such flat sets only with head strides in [0, 2^31), so one unsigned
// 32 x 32 -> 64-bit multiply forms it.
__device__ __forceinline__ i64 flat_offset(int r, i64 stride_head) {
  return static_cast<i64>(static_cast<u64>(static_cast<u32>(r)) * static_cast<u32>(stride_head));
}

// Rows of merge_pair, C vectors per lane, STEPS rows per thread. FLAT (flat
// state sets, abi/merge_params.cuh): every address is its row index times a
// stride, so a thread's loads wait on no division (only a mask needs the
// token).
template <typename T, typename TO, int C, int STEPS, bool FLAT>
__device__ __forceinline__ void merge_pair_rows(const MergePairParams& p, int lanes) {
  constexpr int N = MergeVec<T>::N;
  const MergeLane l = merge_lane<N>(lanes, STEPS);
  const int rows = p.num_rows * p.num_heads;
  const T* va_base = static_cast<const T*>(p.a.v) + l.feat;
  const T* vb_base = static_cast<const T*>(p.b.v) + l.feat;
  int row[STEPS], tok[STEPS], head[STEPS];
  bool live[STEPS];
#pragma unroll
  for (int s = 0; s < STEPS; ++s) {
    row[s] = l.row + s * l.rows_per_warp;
    live[s] = row[s] < rows;
    tok[s] = live[s] && (!FLAT || p.mask != nullptr) ? fast_divide(row[s], p.heads) : 0;
    head[s] = row[s] - tok[s] * p.num_heads;
  }
  // Launched behind the kernel that wrote the states (programmatic dependent
  // launch): the addresses above while it ends; its results from here on.
  grid_dependency_wait();
  grid_dependency_launch_dependents();
#pragma unroll
  for (int s = 0; s < STEPS; ++s) {
    // A masked-out row is neither read nor written (the only load a value
    // waits for; without a mask nothing does).
    if (p.mask != nullptr && live[s]) live[s] = p.mask[tok[s]] != 0;
  }
  const auto at = [&](int s, i64 stride_state, i64 stride_head) {
    return FLAT ? flat_offset(row[s], stride_head) : value_offset(tok[s], head[s], stride_state, stride_head);
  };
  // Every load first, raw.
  uint4 ra[STEPS][C], rb[STEPS][C];
  float sa[STEPS], sb[STEPS];
#pragma unroll
  for (int s = 0; s < STEPS; ++s) {
    if (!live[s]) continue;
    const T* pa = va_base + at(s, p.a.v_stride_state, p.a.v_stride_head);
    const T* pb = vb_base + at(s, p.b.v_stride_state, p.b.v_stride_head);
#pragma unroll
    for (int c = 0; c < C; ++c) {
      ra[s][c] = load16(pa + c * l.stride);
      rb[s][c] = load16(pb + c * l.stride);
    }
    sa[s] = p.a.s[at(s, p.a.s_stride_state, p.a.s_stride_head)];
    sb[s] = p.b.s[at(s, p.b.s_stride_state, p.b.s_stride_head)];
  }
  float out[STEPS][C][N], lse[STEPS];
#pragma unroll
  for (int s = 0; s < STEPS; ++s) {
    const MergeWeights w = merge_weights(live[s] ? sa[s] : neg_inf(), live[s] ? sb[s] : neg_inf());
    lse[s] = w.lse;
#pragma unroll
    for (int c = 0; c < C; ++c) {
      float a[N], b[N];
      unpack_vec<N, T>(ra[s][c], a);
      unpack_vec<N, T>(rb[s][c], b);
#pragma unroll
      for (int i = 0; i < N; ++i) out[s][c][i] = merge_value(a[i], w.wa, b[i], w.wb);
    }
  }
  // In place (out == a), lanes of a row read the LSE the leader overwrites:
  // every read of the warp happens before any write.
  __syncwarp();
  TO* vo_base = static_cast<TO*>(p.out.v) + l.feat;
#pragma unroll
  for (int s = 0; s < STEPS; ++s) {
    if (!live[s]) continue;
    TO* po = vo_base + at(s, p.out.v_stride_state, p.out.v_stride_head);
#pragma unroll
    for (int c = 0; c < C; ++c) store_vec<N>(po + c * l.stride, out[s][c]);
    if (p.out.s != nullptr && l.leader)
      p.out.s[at(s, p.out.s_stride_state, p.out.s_stride_head)] = lse[s];
  }
}

// TO: the output's element type (T's, or a 16-bit type for fp32 states: a
// cascade's last merge writes the caller's output). C: vectors per lane
// (merge_per_lane), a template argument so that each kernel holds only the
// registers of its own layout. FLAT: flat state sets only
// (abi/merge_params.cuh), checked by the host.
template <typename T, typename TO = T, int C = 1, bool FLAT = false>
__device__ __forceinline__ void merge_pair(const MergePairParams& p) {
  merge_pair_rows<T, TO, C, 1, FLAT>(p, static_cast<unsigned>(p.head_dim) / (MergeVec<T>::N * C));  // merge_pair_steps
}

// States merged per block of loads in merge_many: B * C vectors in flight per lane.
constexpr int kMergeBlock = 4;

// One row of merge_many, C vectors per lane: one pass over the row's states
// in blocks of kMergeBlock whose loads are issued together, folded into a
// running maximum (online softmax, base 2).
template <typename T, int C>
__device__ __forceinline__ void merge_many_rows(const MergeManyParams& p, int lanes) {
  constexpr int N = MergeVec<T>::N, B = kMergeBlock;
  const MergeLane l = merge_lane<N>(lanes, 1);
  if (l.row >= p.num_rows * p.num_heads) return;  // no warp-wide step follows
  const int tok = fast_divide(l.row, p.heads), head = l.row - tok * p.num_heads;
  grid_dependency_wait();  // as merge_pair_rows
  grid_dependency_launch_dependents();
  const int first = p.indptr ? p.indptr[tok] : tok * p.states_per_row;
  const int count = p.indptr ? p.indptr[tok + 1] - first : p.states_per_row;
  const T* v = static_cast<const T*>(p.in.v) + head * p.in.v_stride_head + l.feat;
  const float* s = p.in.s + head * p.in.s_stride_head;
  float acc[C][N];
#pragma unroll
  for (int c = 0; c < C; ++c)
#pragma unroll
    for (int i = 0; i < N; ++i) acc[c][i] = 0.f;
  float m = neg_inf(), denom = 0.f;
  for (int j0 = 0; j0 < count; j0 += B) {
    uint4 raw[B][C];
    float lj[B];
#pragma unroll
    for (int j = 0; j < B; ++j) {
      const bool in = j0 + j < count;
      const i64 st = first + j0 + j;
#pragma unroll
      for (int c = 0; c < C; ++c) raw[j][c] = in ? load16(v + st * p.in.v_stride_state + c * l.stride) : make_uint4(0, 0, 0, 0);
      lj[j] = in ? s[st * p.in.s_stride_state] : neg_inf();
    }
    float m_new = m;
#pragma unroll
    for (int j = 0; j < B; ++j) m_new = fmaxf(m_new, lj[j]);
    if (m_new == neg_inf()) continue;  // every state so far is empty
    const float rescale = fast_exp2(m - m_new);  // 0 while m is -inf (acc, denom are 0 then)
    denom *= rescale;
#pragma unroll
    for (int c = 0; c < C; ++c)
#pragma unroll
      for (int i = 0; i < N; ++i) acc[c][i] *= rescale;
#pragma unroll
    for (int j = 0; j < B; ++j) {
      const float w = fast_exp2(lj[j] - m_new);  // -inf (empty or past the end) -> 0
      denom += w;
#pragma unroll
      for (int c = 0; c < C; ++c) {
        float x[N];
        unpack_vec<N, T>(raw[j][c], x);
#pragma unroll
        for (int i = 0; i < N; ++i) acc[c][i] += w > 0.f ? w * x[i] : 0.f;  // 0 * NaN would leak
      }
    }
    m = m_new;
  }
  const float inv = denom > 0.f ? fast_rcp(denom) : 0.f;  // denom >= 1: the largest weight is 1
  T* o = static_cast<T*>(p.out.v) + value_offset(tok, head, p.out.v_stride_state, p.out.v_stride_head) + l.feat;
#pragma unroll
  for (int c = 0; c < C; ++c) {
#pragma unroll
    for (int i = 0; i < N; ++i) acc[c][i] *= inv;
    store_vec<N>(o + c * l.stride, acc[c]);
  }
  if (p.out.s != nullptr && l.leader)
    p.out.s[value_offset(tok, head, p.out.s_stride_state, p.out.s_stride_head)] =
        denom > 0.f ? m + fast_log2(denom) : neg_inf();
}

template <typename T, int C = 1>
__device__ __forceinline__ void merge_many(const MergeManyParams& p) {
  merge_many_rows<T, C>(p, static_cast<unsigned>(p.head_dim) / (MergeVec<T>::N * C));
}

#endif

}  // namespace tessera
