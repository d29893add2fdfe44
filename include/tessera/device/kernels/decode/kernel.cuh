// Batch decode, persistent kernel: CTA (x, h) runs the work items the planner
// queued for column x, for KV head h; each item streams a KV chunk (see
// decode/mainloop.cuh), merges its token groups, then either writes the output
// (unsplit request: split-K writethrough) or a partial state. The CTA that
// finishes a split request's last chunk merges all of its partial states in
// chunk order (fused contraction): values are reduced in a fixed order with no
// atomics; one atomic counter per (request, KV head) only elects the merger.
#pragma once
#include "tessera/device/arch/grid_dependency.cuh"
#include "tessera/device/kernels/common/work_queue.cuh"
#include "tessera/device/kernels/decode/mainloop.cuh"

namespace tessera {

#if defined(__CUDACC__) || defined(__CUDACC_RTC__)

template <typename Variant, typename Shape, typename DO, typename Params>
__device__ __forceinline__ void decode_store_output(const Params& p, const Variant& variant, int b, int qo_head, int feat0,
                                                    const float (&o)[Shape::VEC], float lse, bool write_lse) {
  float out[Shape::VEC];
#pragma unroll
  for (int i = 0; i < Shape::VEC; ++i) out[i] = variant.OutputTransform(p, o[i], b, 0, qo_head, feat0 + i);
  static_assert(sizeof(DO) == 2, "outputs are fp16 or bf16");
  store_vec<Shape::VEC>(static_cast<DO*>(p.o) + b * p.o_stride_n + qo_head * p.o_stride_h + feat0, out);
  if (write_lse && p.lse != nullptr) p.lse[static_cast<i64>(b) * p.num_qo_heads + qo_head] = lse;
}

// Merges the partial states of a split request (chunks first_slot ..
// first_slot + num_chunks) for the GROUP heads of KV head h, in chunk order.
template <typename Variant, typename Shape, int GROUP, typename DO, typename Params>
__device__ __forceinline__ void decode_merge_partials(const Params& p, const Variant& variant, const DecodeWorkItem& w,
                                                      int h) {
  constexpr int VEC = Shape::VEC, TX = Shape::TX;
  for (int idx = threadIdx.x; idx < GROUP * TX; idx += Shape::THREADS) {
    const int qo_head = h * GROUP + idx / TX, feat0 = (idx % TX) * VEC;
    // A long request can have ~100 chunks: merged in blocks whose loads
    // are in flight together (merge_chunk_states).
    float acc[VEC];
    // As many loads in flight per block as at 8 features (fp16 rows); fp8's
    // 16-feature vectors take half the chunks per block in the same registers.
    const float lse = merge_chunk_states<VEC, Variant::use_softmax, 64 / VEC>(
        w.num_chunks,
        [&](int c) { return __ldcg(p.partial_lse + static_cast<i64>(w.first_slot + c) * p.num_qo_heads + qo_head); },
        [&](int c, int i) {
          const i64 slot = w.first_slot + c;
          return __ldcg(reinterpret_cast<const float4*>(p.partial_o + (slot * p.num_qo_heads + qo_head) * (TX * VEC) + feat0) + i);
        },
        acc);
    decode_store_output<Variant, Shape, DO>(p, variant, w.request, qo_head, feat0, acc, lse, feat0 == 0);
  }
}

template <typename Variant, typename DQ, typename DKV, typename DO, int HEAD_DIM, int GROUP, int MIN_THREADS, int TILE,
          int STAGES, int MAX_HPT = 4, typename Params>
__device__ __forceinline__ void batch_decode(const Params& p) {
  using Shape = DecodeShape<DKV, HEAD_DIM, GROUP, MIN_THREADS, TILE, STAGES, MAX_HPT>;
  constexpr int HPT = Shape::HPT, VEC = Shape::VEC, TX = Shape::TX, TY = Shape::TY, TZ = Shape::TZ;
  static_assert(TZ * GROUP * (2 + HEAD_DIM) * 4 <= Shape::SMEM_BYTES, "merge scratch must fit the pipeline buffers");
  extern __shared__ uint4 smem_raw[];
  DKV* smem = reinterpret_cast<DKV*>(smem_raw);
  __shared__ int s_is_last;

  const int h = blockIdx.y;
  const int x = threadIdx.x % TX, y = (threadIdx.x / TX) % TY, z = threadIdx.x / (TX * TY);
  const int feat0 = x * VEC;
  const int qo_head0 = h * GROUP + y * HPT;

  WorkQueue<DecodeWorkItem, QueueLoad::kPlain, Params> queue(p, blockIdx.x);
  // The plan's workspace is complete; q, K, V, the outputs and the scale
  // tensors may still be the previous kernel's (programmatic dependent launch).
  grid_dependency_wait();
  const device::RunScales scales = is_fp8<DKV> ? device::read_run_scales(p) : device::RunScales{p.sm_scale, p.o_scale};
  for (int wi = queue.begin; wi < queue.end; ++wi) {
    const DecodeWorkItem w = queue.take(wi);
    const int b = w.request;
    const int kv_len = device::kv_len(p.kv, b);
    const int page_base = p.kv.indptr ? p.kv.indptr[b] : 0;
    Variant variant(p, b, 1, kv_len);

    // Prologue: start the first STAGES-1 tiles before touching q.
    const int n_tiles = (w.kv_end - w.kv_start + TILE - 1) / TILE;
#pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) {
      if (s < n_tiles)
        decode_load_tile<Shape>(smem + (2 * s) * Shape::TILE_ELEMS, smem + (2 * s + 1) * Shape::TILE_ELEMS, p.kv,
                                page_base, w.kv_start + s * TILE, w.kv_end, h, p.page_shift);
      cp_async_commit();
    }

    float q[HPT][VEC];
#pragma unroll
    for (int j = 0; j < HPT; ++j) {
      const DQ* q_row = static_cast<const DQ*>(p.q) + b * p.q_stride_n + (qo_head0 + j) * p.q_stride_h;
      load_vec<VEC>(q_row + feat0, q[j]);
      transform_query_vec<Variant, HEAD_DIM>(variant, p, q[j], q_row, feat0, b, 0, qo_head0 + j);
    }
    DecodeState<Shape> st;
    st.init();

    for (int t = 0; t < n_tiles; ++t) {
      cp_async_wait<STAGES - 2>();
      __syncthreads();  // tile t visible to all; everyone is done with tile t-1's stage
      const int nt = t + STAGES - 1, ns = nt % STAGES;
      if (nt < n_tiles)
        decode_load_tile<Shape>(smem + (2 * ns) * Shape::TILE_ELEMS, smem + (2 * ns + 1) * Shape::TILE_ELEMS, p.kv,
                                page_base, w.kv_start + nt * TILE, w.kv_end, h, p.page_shift);
      cp_async_commit();
      const int cs = t % STAGES;
      decode_compute_tile<Variant, Shape>(p, variant, st, scales.sm_scale, q, smem + (2 * cs) * Shape::TILE_ELEMS,
                                          smem + (2 * cs + 1) * Shape::TILE_ELEMS, w.kv_start + t * TILE, w.kv_end, b,
                                          h, qo_head0, x, z);
    }
    cp_async_wait<0>();
    __syncthreads();  // pipeline drained: shared memory is free for the merge

    // Merge the TZ token groups in z order (reusing pipeline shared memory).
    float* red_m = reinterpret_cast<float*>(smem_raw);
    float* red_d = red_m + TZ * GROUP;
    float* red_o = red_d + TZ * GROUP;
#pragma unroll
    for (int j = 0; j < HPT; ++j) {
      const int g = y * HPT + j;
      if (x == 0) { red_m[z * GROUP + g] = st.m[j]; red_d[z * GROUP + g] = st.d[j]; }
#pragma unroll
      for (int i = 0; i < VEC; ++i) red_o[(z * GROUP + g) * HEAD_DIM + feat0 + i] = st.o[j][i];
    }
    __syncthreads();
    if (z == 0) {
#pragma unroll
      for (int j = 0; j < HPT; ++j) {
        const int g = y * HPT + j;
        OnlineSoftmax acc;
        acc.init();
        float o[VEC];
#pragma unroll
        for (int i = 0; i < VEC; ++i) o[i] = 0.f;
        for (int zz = 0; zz < TZ; ++zz) {
          const float* src = red_o + (zz * GROUP + g) * HEAD_DIM + feat0;
          if (Variant::use_softmax) {
            const float2 f = acc.merge(red_m[zz * GROUP + g], red_d[zz * GROUP + g]);
#pragma unroll
            for (int i = 0; i < VEC; ++i) o[i] = o[i] * f.x + src[i] * f.y;
          } else {
#pragma unroll
            for (int i = 0; i < VEC; ++i) o[i] += src[i];
          }
        }
        // Normalization and output scale in one factor (a multiply per row).
        const float inv =
            (Variant::use_softmax ? (acc.empty() ? 0.f : 1.f / acc.d) : 1.f) * (is_fp8<DKV> ? scales.o_scale : p.o_scale);
#pragma unroll
        for (int i = 0; i < VEC; ++i) o[i] *= inv;
        const float lse = Variant::use_softmax ? acc.lse() : 0.f;
        const int qo_head = qo_head0 + j;
        if (w.partial_slot < 0) {
          decode_store_output<Variant, Shape, DO>(p, variant, b, qo_head, feat0, o, lse, x == 0);
        } else {
          float* dst = p.partial_o + (static_cast<i64>(w.partial_slot) * p.num_qo_heads + qo_head) * HEAD_DIM + feat0;
#pragma unroll
          for (int i = 0; i < VEC / 4; ++i) reinterpret_cast<float4*>(dst)[i] = make_float4(o[4 * i], o[4 * i + 1], o[4 * i + 2], o[4 * i + 3]);
          if (x == 0) p.partial_lse[static_cast<i64>(w.partial_slot) * p.num_qo_heads + qo_head] = lse;
        }
      }
    }
    if (w.partial_slot >= 0) {
      // Publish this chunk, then let the last finisher merge the request.
      __threadfence();
      __syncthreads();
      if (threadIdx.x == 0) {
        const int done = atomicAdd(p.counters + b * p.kv.num_kv_heads + h, 1);
        s_is_last = done == w.num_chunks - 1;
      }
      __syncthreads();
      if (s_is_last) {
        __threadfence();
        decode_merge_partials<Variant, Shape, GROUP, DO>(p, variant, w, h);
        if (threadIdx.x == 0) p.counters[b * p.kv.num_kv_heads + h] = 0;  // ready for the next run
      }
    }
    __syncthreads();  // shared memory is reused by the next item
  }
  grid_dependency_launch_dependents();
}

#endif

}  // namespace tessera
