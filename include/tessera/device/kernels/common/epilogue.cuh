// Prefill epilogue, shared by the FA2 and Hopper templates: a finished query
// tile's rows go to the output (unsplit tile) or to the workspace as a
// partial state, and a split tile's partials are merged in chunk order, by
// rows (merge_split_rows; who merges which rows: common/cooperative_merge.cuh;
// deterministic, no atomics on values). Split tiles' slots
// and counters come from the plan of the CTA's head group, which every group
// (blockIdx.y) shares: they are indexed slot * groups + group. A CTA pair
// (CLUSTER = 2, prefill_sm90/kernel.cuh) shares slots of 2 * CTA_Q rows, rank r
// holding rows r * CTA_Q ..., and each rank merges its own rows (counter
// index * CLUSTER + rank). With PrefillParams::merge_lse both paths merge the
// finished rows into the state o already holds instead of overwriting it.
#pragma once
#include "tessera/device/arch/memory_order.cuh"
#include "tessera/device/arch/vector_io.cuh"
#include "tessera/device/arch/warp.cuh"
#include "tessera/device/primitives/attention_state.cuh"
#include "tessera/device/kernels/common/work_queue.cuh"
#include "tessera/device/kernels/common/softmax.cuh"

namespace tessera {

#if defined(__CUDACC__) || defined(__CUDACC_RTC__)

// 1 / d and log2(d) of a finished row's softmax sum. d >= 1 whenever the row
// saw a key (its maximum contributes exp2(0)), so the MUFU approximations
// (2 ulp) are as good as IEEE division and the accurate log2f, which cost ~40
// instructions per row with their range checks and slow paths.
__device__ __forceinline__ float row_inverse(float d) { return __fdividef(1.f, d); }
__device__ __forceinline__ float row_log2(float d) { return __log2f(d); }

// PrefillParams::merge_lse, or null for params without one (MLA's).
template <typename P, typename = void>
struct MergeLseOf {
  __device__ __forceinline__ static const float* get(const P&) { return nullptr; }
};
template <typename P>
struct MergeLseOf<P, decltype((void)(static_cast<const P*>(nullptr)->merge_lse), void())> {
  __device__ __forceinline__ static const float* get(const P& p) { return p.merge_lse; }
};

// How a finished row combines with the state o already holds (merge_lse):
// weights of this attention's row and of the prior one (merge_weights; a
// plain sum without softmax), and the LSE to write.
struct RowMerge {
  float w_new, w_old, lse;
};

// The same with the prior LSE already loaded (merging: whether there is one).
template <bool SOFTMAX>
__device__ __forceinline__ RowMerge row_merge_with(bool merging, float prior_lse, float lse) {
  if (!merging) return {1.f, 0.f, lse};
  if constexpr (!SOFTMAX) {
    return {1.f, 1.f, lse};
  } else {
    const MergeWeights m = merge_weights(lse, prior_lse);
    return {m.wa, m.wb, m.lse};
  }
}

template <bool SOFTMAX>
__device__ __forceinline__ RowMerge row_merge(const float* merge_lse, i64 idx, float lse) {
  return row_merge_with<SOFTMAX>(merge_lse != nullptr, merge_lse != nullptr ? merge_lse[idx] : 0.f, lse);
}

// Merges a finished row's values (this lane's pairs: vals[2n + c] is column
// n * 8 + c of `at`) into the prior values there, w_new : w_old. Out of
// line: only a composable level merging into o takes it, and the plain
// stores keep their registers.
template <typename DO, int NT_O>
__device__ __noinline__ void merge_store_row(DO* at, const float* vals, float w_new, float w_old) {
#pragma unroll
  for (int n = 0; n < NT_O; ++n) {
    float old[2];
    load_vec<2>(at + n * 8, old);
    const float merged[2] = {merge_value(vals[2 * n], w_new, old[0], w_old),
                             merge_value(vals[2 * n + 1], w_new, old[1], w_old)};
    store_vec<2>(at + n * 8, merged);
  }
}

// Full row sums: each quad lane summed a quarter of the columns.
template <int MT, int NT_O>
__device__ __forceinline__ void prefill_sum_quads(PrefillState<MT, NT_O>& st) {
#pragma unroll
  for (int t = 0; t < MT; ++t)
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      st.d[t][r] += __shfl_xor_sync(0xffffffffu, st.d[t][r], 1);
      st.d[t][r] += __shfl_xor_sync(0xffffffffu, st.d[t][r], 2);
    }
}

// Writes this thread's rows of a finished tile (d already quad-summed):
// normalized output + LSE for an unsplit tile, else the partial state into
// the workspace slot. warp_row0: the warp's first row within the query tile.
template <typename Variant, typename DO, int HEAD_DIM, int CTA_Q, int CLUSTER = 1, int MT, int NT_O, typename Params>
__device__ __forceinline__ void prefill_store_rows(const Params& p, const Variant& variant,
                                                   const PrefillState<MT, NT_O>& st, const RowInfo<MT>& rows,
                                                   const PrefillWorkItem& w, int qo_start, int b, int kv_head,
                                                   int warp_row0, float o_scale, int rank = 0) {
  const int g = (threadIdx.x % 32) / 4, quad = threadIdx.x % 4;
#pragma unroll
  for (int t = 0; t < MT; ++t)
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      if (!rows.valid[t][r]) continue;
      const int qo = rows.qo_idx[t][r], head = rows.head[t][r];
      const bool empty = st.d[t][r] == 0.f;
      // Normalization and output scale in one factor (a multiply per row).
      const float inv = (Variant::use_softmax ? (empty ? 0.f : row_inverse(st.d[t][r])) : 1.f) * o_scale;
      const float lse = Variant::use_softmax ? (empty ? neg_inf() : st.m[t][r] + row_log2(st.d[t][r])) : 0.f;
      const int tile_row = warp_row0 + t * 16 + g + 8 * r;
      if (w.partial_slot < 0) {
        DO* dst = static_cast<DO*>(p.o) + (qo_start + qo) * p.o_stride_n + head * p.o_stride_h;
        const i64 lse_idx = static_cast<i64>(qo_start + qo) * p.num_qo_heads + head;
        // Merging into o (merge_lse): a row that saw no key here keeps o.
        const RowMerge mg = row_merge<Variant::use_softmax>(MergeLseOf<Params>::get(p), lse_idx, lse);
        if (mg.w_new == 0.f) {
          if (quad == 0 && p.lse != nullptr) p.lse[lse_idx] = mg.lse;
          continue;
        }
        // Column n * 8 + quad * 2 + c of the row, transformed.
        auto out_value = [&](int n, int c) {
          return variant.OutputTransform(p, st.o[t][n][2 * r + c] * inv, b, qo, head, n * 8 + quad * 2 + c);
        };
        auto out_pair = [&](auto n) { return pack_pair<DO>(out_value(n, 0), out_value(n, 1)); };  // 16-bit DO only
        if (mg.w_old > 0.f) {  // a prior state to merge with
          float vals[2 * NT_O];
#pragma unroll
          for (int n = 0; n < NT_O; ++n) {
            vals[2 * n] = out_value(n, 0);
            vals[2 * n + 1] = out_value(n, 1);
          }
          merge_store_row<DO, NT_O>(dst + quad * 2, vals, mg.w_new, mg.w_old);
        } else if constexpr (sizeof(DO) == 4) {  // fp32 outputs (a cascade's levels): 8-byte pairs
#pragma unroll
          for (int n = 0; n < NT_O; ++n)
            *reinterpret_cast<float2*>(dst + n * 8 + quad * 2) = make_float2(out_value(n, 0), out_value(n, 1));
        } else if constexpr (NT_O % 4 == 0) {
          // A quad holds 2 columns of each 8-column chunk of the row; after a
          // transpose within the quad each lane holds whole chunk 4k + quad,
          // so a row goes out in 16-byte stores of 64 contiguous bytes per
          // quad (4-byte stores half-filled every sector and took 4x the
          // store instructions). The quad's lanes share the row, so all four
          // reach here together.
#pragma unroll
          for (int k = 0; k < NT_O / 4; ++k) {
            u32 chunk[4] = {out_pair(4 * k), out_pair(4 * k + 1), out_pair(4 * k + 2), out_pair(4 * k + 3)};
            quad_transpose(chunk);
            *reinterpret_cast<uint4*>(dst + (4 * k + quad) * 8) = make_uint4(chunk[0], chunk[1], chunk[2], chunk[3]);
          }
        } else {
#pragma unroll
          for (int n = 0; n < NT_O; ++n) *reinterpret_cast<u32*>(dst + n * 8 + quad * 2) = out_pair(n);
        }
        if (quad == 0 && p.lse != nullptr) p.lse[lse_idx] = mg.lse;
      } else {
        const i64 base = ((static_cast<i64>(w.partial_slot) * gridDim.y + blockIdx.y) * CLUSTER + rank) * CTA_Q + tile_row;
        float* dst = p.partial_o + base * HEAD_DIM;
#pragma unroll
        for (int n = 0; n < NT_O; ++n)
          *reinterpret_cast<float2*>(dst + n * 8 + quad * 2) =
              make_float2(st.o[t][n][2 * r] * inv, st.o[t][n][2 * r + 1] * inv);
        if (quad == 0) p.partial_lse[base] = lse;
      }
    }
}

// After every thread of the group (tid in [0, nthreads)) stored its partial
// rows of a split tile: counts this chunk in and says whether it was the
// tile's last, which then merges (and resets the counter). sync() is a
// barrier over the group; is_last a shared int. Thread 0 alone fences
// (arch/memory_order.cuh): after the barrier, so the group's rows are out
// before the count, and, in the last chunk, before the barrier, so the other
// chunks' rows are in before any thread reads them.
template <typename Sync>
__device__ __forceinline__ bool split_chunk_is_last(int* counter, int num_chunks, int tid, int* is_last, Sync sync) {
  sync();
  if (tid == 0) {
    fence_acq_rel_gpu();
    const bool last = atomicAdd(counter, 1) == num_chunks - 1;
    if (last) fence_acq_rel_gpu();
    *is_last = last;
  }
  sync();
  return *is_last != 0;
}

// Merges rows [row_begin, row_end) of a split tile whose chunks are all
// stored: each row's chunks in chunk order, VEC features per thread.
template <typename Variant, typename DO, int HEAD_DIM, int CTA_Q, int CLUSTER = 1, int VEC = 8, typename Params>
__device__ __forceinline__ void merge_split_rows(const Params& p, const Variant& variant, const PrefillWorkItem& w,
                                                 int qo_start, int qo_len, int row0, int b, int kv_head, int tid,
                                                 int nthreads, int rank, int row_begin, int row_end) {
  // What bounds a merge on one CTA is how many loads are in flight: VEC / 4
  // float4 per chunk and thread, 8 chunks a block. 8 features kept twice as
  // many as 4 did (a 64-row tile cut 33 ways took ~60 us to merge at 4,
  // bench/cascade.py --profile); 16 measured slower.
  static_assert(HEAD_DIM % VEC == 0 && VEC % 8 == 0, "whole float4 loads and 16-byte stores per thread");
  for (int idx = tid; idx < (row_end - row_begin) * (HEAD_DIM / VEC); idx += nthreads) {
    const int tile_row = row_begin + idx / (HEAD_DIM / VEC), col = (idx % (HEAD_DIM / VEC)) * VEC;
    const int f = row0 + tile_row, qo = f / p.group, head = kv_head * p.group + f % p.group;
    if (qo >= qo_len) continue;
    auto slot_base = [&](int c) {
      return ((static_cast<i64>(w.first_slot + c) * gridDim.y + blockIdx.y) * CLUSTER + rank) * CTA_Q + tile_row;
    };
    DO* const dst = static_cast<DO*>(p.o) + (qo_start + qo) * p.o_stride_n + head * p.o_stride_h + col;
    const i64 lse_idx = static_cast<i64>(qo_start + qo) * p.num_qo_heads + head;
    // Merging into o (merge_lse): the prior state's LSE and values load
    // beside the chunks', so a pass costs one round trip, not two.
    constexpr int kPer16 = 16 / static_cast<int>(sizeof(DO));
    const float* const merge_lse = MergeLseOf<Params>::get(p);
    float prior_lse = 0.f, old[VEC];
    if (merge_lse != nullptr) {
      prior_lse = merge_lse[lse_idx];
      load_vec<VEC>(dst, old);
    }
    float out[VEC];
    const float lse = merge_chunk_states<VEC, Variant::use_softmax>(
        w.num_chunks, [&](int c) { return __ldcg(p.partial_lse + slot_base(c)); },
        [&](int c, int i) {
          return __ldcg(reinterpret_cast<const float4*>(p.partial_o + slot_base(c) * HEAD_DIM + col) + i);
        },
        out);
#pragma unroll
    for (int i = 0; i < VEC; ++i) out[i] = variant.OutputTransform(p, out[i], b, qo, head, col + i);
    const RowMerge mg = row_merge_with<Variant::use_softmax>(merge_lse != nullptr, prior_lse, lse);
    if (col == 0 && p.lse != nullptr) p.lse[lse_idx] = mg.lse;
    if (mg.w_new == 0.f) continue;  // no key here: o keeps the prior state
#pragma unroll
    for (int i = 0; i < VEC; i += kPer16) {  // 16-byte stores
      float part[kPer16];
      if (mg.w_old > 0.f) {
#pragma unroll
        for (int j = 0; j < kPer16; ++j) part[j] = merge_value(out[i + j], mg.w_new, old[i + j], mg.w_old);
      } else {
#pragma unroll
        for (int j = 0; j < kPer16; ++j) part[j] = out[i + j];
      }
      store_vec<kPer16>(dst + i, part);
    }
  }
}

#endif

}  // namespace tessera
