// Prefill (FA2 template), persistent kernel: CTA (x, kv_head) runs its queue
// of work items (query tile x KV chunk, from the planner); per item it loads
// the fused query tile, pipelines KV tiles through shared memory, merges the
// KV-split warps, and writes the output (unsplit tile) or a partial state,
// the last finisher of a split tile merging its partials in chunk order
// (same contract as batch decode: deterministic, no atomics on values).
#pragma once
#include "tessera/device/kernels/prefill_mainloop_sm90.cuh"

namespace tessera {

#if defined(__CUDACC__) || defined(__CUDACC_RTC__)

// Shared-memory layout of each template: ldmatrix rows (FA2) or wgmma blocks.
template <bool HOPPER> struct PrefillLayouts {
  template <int D, int R> using Layout = RowSwizzle<D, R>;
};
template <> struct PrefillLayouts<true> {
  template <int D, int R> using Layout = Swizzle128<D, R>;
};

// HOPPER: wgmma mainloop (sm_90a; warpgroups of 64 rows, WARPS_KV == 1),
// else the FA2 mma.sync mainloop. Everything else is shared.
template <typename Variant, typename DQ, typename DKV, typename DO, int HEAD_DIM, int CTA_Q, int CTA_KV, int WARPS_Q,
          int WARPS_KV, int STAGES, bool HOPPER, typename Params>
__device__ __forceinline__ void batch_prefill(const Params& p) {
  using Shape = PrefillShape<HEAD_DIM, CTA_Q, CTA_KV, WARPS_Q, WARPS_KV, STAGES>;
  using Traits = VariantTraits<Variant, Params>;
  static_assert(sizeof(DQ) == 2 && sizeof(DKV) == 2 && sizeof(DO) == 2, "16-bit q, kv and o");
  static_assert(WARPS_KV == 1 || WARPS_KV * CTA_Q * (HEAD_DIM + 2) * 4 <= STAGES * 2 * Shape::KV_ELEMS * 2,
                "the KV-warp merge scratch must fit in the KV pipeline buffers");
  constexpr int MT = Shape::MT, NT_O = Shape::NT_O;
  static_assert(!HOPPER || (WARPS_KV == 1 && WARPS_Q % 4 == 0), "Hopper tiles are whole warpgroups along the query tile");
  extern __shared__ uint4 smem_raw[];
  // wgmma's swizzle pattern repeats every 1024 bytes: blocks start aligned
  // (the host adds 1024 bytes of slack to the dynamic shared memory).
  constexpr size_t kAlign = HOPPER ? 1024 : 16;
  DKV* q_smem = reinterpret_cast<DKV*>((reinterpret_cast<size_t>(smem_raw) + kAlign - 1) & ~(kAlign - 1));
  // q is stored as DKV: the mma needs one operand type
  DKV* kv_smem = q_smem + Shape::Q_ELEMS;
  __shared__ int s_is_last;
  __shared__ int s_page_ids[2 * CTA_KV];  // KVTileLoader's next-tile page ids

  const int kv_head = blockIdx.y;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int wq = warp % WARPS_Q, wk = warp / WARPS_Q;
  const int g = lane / 4, quad = lane % 4;

  for (int wi = p.work_indptr[blockIdx.x]; wi < p.work_indptr[blockIdx.x + 1]; ++wi) {
    const PrefillWorkItem w = p.work_items[wi];
    const int b = w.request;
    const int qo_start = p.qo_indptr[b], qo_len = p.qo_indptr[b + 1] - qo_start;
    const int kv_len = device::kv_len(p.kv, b);
    const int page_base = p.kv.indptr ? p.kv.indptr[b] : 0;
    const int row0 = w.q_tile * CTA_Q;  // first fused row of the tile
    Variant variant(p, b, qo_len, kv_len);

    // Q tile: fused row f -> (query qo = f / group, head = kv_head * group + f % group).
    load_tile<HEAD_DIM, CTA_Q, Shape::THREADS, PrefillLayouts<HOPPER>::template Layout>(q_smem, static_cast<const DKV*>(p.q), [&](int r) -> i64 {
      const int f = row0 + r, qo = f / p.group;
      if (qo >= qo_len) return -1;
      return (qo_start + qo) * p.q_stride_n + (kv_head * p.group + f % p.group) * p.q_stride_h;
    });
    cp_async_commit();
    const int n_tiles = (w.kv_end - w.kv_start + CTA_KV - 1) / CTA_KV;
    KVTileLoader<HEAD_DIM, CTA_KV, Shape::THREADS, PrefillLayouts<HOPPER>::template Layout, DKV> kv_loader(
        p.kv, s_page_ids, page_base, w.kv_start, w.kv_end, kv_head, p.page_shift);
    auto load_kv = [&](int tile, int stage) {
      kv_loader.load(tile, kv_smem + (2 * stage) * Shape::KV_ELEMS, kv_smem + (2 * stage + 1) * Shape::KV_ELEMS);
    };
#pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) {
      if (s > 0 && !kv_loader.affine) {  // tile s needs the page ids tile s - 1 brought (loader contract)
        cp_async_wait<0>();
        __syncthreads();
      }
      if (s < n_tiles) load_kv(s, s);
      cp_async_commit();
    }

    RowInfo<MT> rows;
#pragma unroll
    for (int t = 0; t < MT; ++t)
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int f = row0 + wq * Shape::WARP_ROWS + t * 16 + g + 8 * r;
        rows.qo_idx[t][r] = f / p.group;
        rows.head[t][r] = kv_head * p.group + f % p.group;
        rows.valid[t][r] = rows.qo_idx[t][r] < qo_len;
      }
    if constexpr (Traits::query_transform) {
      cp_async_wait<STAGES - 1>();  // the Q group is complete
      __syncthreads();
      transform_tile<HEAD_DIM, CTA_Q, Shape::THREADS, PrefillLayouts<HOPPER>::template Layout>(q_smem, [&](int r, int col, float x) {
        const int f = row0 + r;
        return variant.QueryTransform(p, x, b, f / p.group, kv_head * p.group + f % p.group, col);
      });
    }

    // Per-warp facts for skipping masks on interior tiles (warp-uniform).
    const int causal_shift = kv_len - qo_len;
    const int warp_row0 = row0 + wq * Shape::WARP_ROWS;
    const bool warp_rows_valid = (warp_row0 + Shape::WARP_ROWS - 1) / p.group < qo_len;
    const int warp_min_qo = warp_row0 / p.group;

    PrefillState<MT, NT_O> st;
    st.init();
    auto masked_tile = [&](int t) {
      const int tile_last = w.kv_start + t * CTA_KV + CTA_KV - 1;
      return Traits::logits_mask || !warp_rows_valid || tile_last >= w.kv_end ||
             (Variant::causal && tile_last > warp_min_qo + causal_shift);
    };
    constexpr bool kOverlap = HOPPER && STAGES >= 3 && !Traits::key_transform && !Traits::value_transform;
    if constexpr (kOverlap) {
      prefill_kv_loop_sm90<Variant, Shape, DKV, HEAD_DIM, STAGES>(
          p, variant, st, rows, smem_addr(q_smem), smem_addr(kv_smem), n_tiles, w.kv_start, w.kv_end, b, kv_head,
          causal_shift, load_kv, masked_tile);
    }
    for (int t = 0; t < (kOverlap ? 0 : n_tiles); ++t) {
      // Tile t's copies are done. Deeper pipelines over paged KV wait for all:
      // the next load needs the page ids that tile t + STAGES - 2 brought.
      if (STAGES > 2 && !kv_loader.affine)
        cp_async_wait<0>();
      else
        cp_async_wait<STAGES - 2>();
      if constexpr (HOPPER) fence_proxy_async();  // cp.async wrote what wgmma reads
      __syncthreads();
      const int nt = t + STAGES - 1, ns = nt % STAGES;
      if (nt < n_tiles) load_kv(nt, ns);
      cp_async_commit();
      DKV* k_tile = kv_smem + (2 * (t % STAGES)) * Shape::KV_ELEMS;
      DKV* v_tile = k_tile + Shape::KV_ELEMS;
      const int tile_start = w.kv_start + t * CTA_KV;
      if constexpr (Traits::key_transform || Traits::value_transform) {
        if constexpr (Traits::key_transform)
          transform_tile<HEAD_DIM, CTA_KV, Shape::THREADS, PrefillLayouts<HOPPER>::template Layout>(k_tile, [&](int r, int col, float x) {
            return variant.KeyTransform(p, x, b, tile_start + r, kv_head, col);
          });
        if constexpr (Traits::value_transform)
          transform_tile<HEAD_DIM, CTA_KV, Shape::THREADS, PrefillLayouts<HOPPER>::template Layout>(v_tile, [&](int r, int col, float x) {
            return variant.ValueTransform(p, x, b, tile_start + r, kv_head, col);
          });
        if constexpr (HOPPER) fence_proxy_async();
        __syncthreads();
      }
      const bool masked = masked_tile(t);
      if constexpr (HOPPER)
        prefill_compute_tile_sm90<Variant, Shape, DKV, HEAD_DIM>(p, variant, st, rows, smem_addr(q_smem), smem_addr(k_tile),
                                                                 smem_addr(v_tile), tile_start, w.kv_end, b, kv_head,
                                                                 masked, causal_shift);
      else
        prefill_compute_tile<Variant, Shape, DKV, HEAD_DIM>(p, variant, st, rows, smem_addr(q_smem), smem_addr(k_tile),
                                                            smem_addr(v_tile), tile_start, w.kv_end, b, kv_head, wq, wk,
                                                            masked, causal_shift);
    }
    cp_async_wait<0>();
    __syncthreads();  // pipeline drained: shared memory is free

    // Full row sums (each quad lane summed a quarter of the columns).
#pragma unroll
    for (int t = 0; t < MT; ++t)
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        st.d[t][r] += __shfl_xor_sync(0xffffffffu, st.d[t][r], 1);
        st.d[t][r] += __shfl_xor_sync(0xffffffffu, st.d[t][r], 2);
      }
    // Merge the KV-split warps into warp column wk == 0, in wk order.
    if constexpr (WARPS_KV > 1) {
      float* scratch = reinterpret_cast<float*>(kv_smem);  // [WARPS_KV][CTA_Q][HEAD_DIM + 2]
      constexpr int LD = HEAD_DIM + 2;
      auto at = [&](int k, int row) { return scratch + (k * CTA_Q + row) * LD; };
#pragma unroll
      for (int t = 0; t < MT; ++t)
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          float* dst = at(wk, wq * Shape::WARP_ROWS + t * 16 + g + 8 * r);
#pragma unroll
          for (int n = 0; n < NT_O; ++n) {
            dst[n * 8 + quad * 2] = st.o[t][n][2 * r];
            dst[n * 8 + quad * 2 + 1] = st.o[t][n][2 * r + 1];
          }
          if (quad == 0) { dst[HEAD_DIM] = st.m[t][r]; dst[HEAD_DIM + 1] = st.d[t][r]; }
        }
      __syncthreads();
      if (wk == 0) {
#pragma unroll
        for (int t = 0; t < MT; ++t)
#pragma unroll
          for (int r = 0; r < 2; ++r) {
            OnlineSoftmax acc;
            acc.m = st.m[t][r];
            acc.d = st.d[t][r];
            for (int k = 1; k < WARPS_KV; ++k) {
              const float* src = at(k, wq * Shape::WARP_ROWS + t * 16 + g + 8 * r);
              if (Variant::use_softmax) {
                const float2 f = acc.merge(src[HEAD_DIM], src[HEAD_DIM + 1]);
#pragma unroll
                for (int n = 0; n < NT_O; ++n) {
                  st.o[t][n][2 * r] = st.o[t][n][2 * r] * f.x + src[n * 8 + quad * 2] * f.y;
                  st.o[t][n][2 * r + 1] = st.o[t][n][2 * r + 1] * f.x + src[n * 8 + quad * 2 + 1] * f.y;
                }
              } else {
#pragma unroll
                for (int n = 0; n < NT_O; ++n) {
                  st.o[t][n][2 * r] += src[n * 8 + quad * 2];
                  st.o[t][n][2 * r + 1] += src[n * 8 + quad * 2 + 1];
                }
              }
            }
            st.m[t][r] = acc.m;
            st.d[t][r] = acc.d;
          }
      }
    }

    if (wk == 0) {
#pragma unroll
      for (int t = 0; t < MT; ++t)
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          if (!rows.valid[t][r]) continue;
          const int qo = rows.qo_idx[t][r], head = rows.head[t][r];
          const bool empty = st.d[t][r] == 0.f;
          const float inv = Variant::use_softmax ? (empty ? 0.f : 1.f / st.d[t][r]) : 1.f;
          const float lse = Variant::use_softmax ? (empty ? neg_inf() : st.m[t][r] + log2f(st.d[t][r])) : 0.f;
          const int tile_row = wq * Shape::WARP_ROWS + t * 16 + g + 8 * r;
          if (w.partial_slot < 0) {
            DO* dst = static_cast<DO*>(p.o) + (qo_start + qo) * p.o_stride_n + head * p.o_stride_h;
#pragma unroll
            for (int n = 0; n < NT_O; ++n) {
              const int col = n * 8 + quad * 2;
              float pair[2] = {variant.OutputTransform(p, st.o[t][n][2 * r] * inv, b, qo, head, col),
                               variant.OutputTransform(p, st.o[t][n][2 * r + 1] * inv, b, qo, head, col + 1)};
              store_vec<2>(dst + col, pair);
            }
            if (quad == 0 && p.lse != nullptr) p.lse[static_cast<i64>(qo_start + qo) * p.num_qo_heads + head] = lse;
          } else {
            const i64 base = (static_cast<i64>(w.partial_slot) * p.kv.num_kv_heads + kv_head) * CTA_Q + tile_row;
            float* dst = p.partial_o + base * HEAD_DIM;
#pragma unroll
            for (int n = 0; n < NT_O; ++n)
              *reinterpret_cast<float2*>(dst + n * 8 + quad * 2) =
                  make_float2(st.o[t][n][2 * r] * inv, st.o[t][n][2 * r + 1] * inv);
            if (quad == 0) p.partial_lse[base] = lse;
          }
        }
    }

    if (w.partial_slot >= 0) {
      __threadfence();
      __syncthreads();
      if (threadIdx.x == 0) {
        const int done = atomicAdd(p.counters + w.counter * p.kv.num_kv_heads + kv_head, 1);
        s_is_last = done == w.num_chunks - 1;
      }
      __syncthreads();
      if (s_is_last) {
        __threadfence();
        // Merge the tile's chunks, in chunk order, 4 features per thread.
        for (int idx = threadIdx.x; idx < CTA_Q * (HEAD_DIM / 4); idx += Shape::THREADS) {
          const int tile_row = idx / (HEAD_DIM / 4), col = (idx % (HEAD_DIM / 4)) * 4;
          const int f = row0 + tile_row, qo = f / p.group, head = kv_head * p.group + f % p.group;
          if (qo >= qo_len) continue;
          auto slot_base = [&](int c) {
            return (static_cast<i64>(w.first_slot + c) * p.kv.num_kv_heads + kv_head) * CTA_Q + tile_row;
          };
          // Unrolled, branch-free: many chunk loads in flight (empty chunks
          // hold finite zeros with lse = -inf, i.e. weight 0).
          float m = neg_inf();
          if (Variant::use_softmax) {
#pragma unroll 8
            for (int c = 0; c < w.num_chunks; ++c) m = fmaxf(m, __ldcg(p.partial_lse + slot_base(c)));
          }
          const float m_safe = m == neg_inf() ? 0.f : m;
          float acc[4] = {0.f, 0.f, 0.f, 0.f}, denom = 0.f;
#pragma unroll 4
          for (int c = 0; c < w.num_chunks; ++c) {
            const float wgt = Variant::use_softmax ? fast_exp2(__ldcg(p.partial_lse + slot_base(c)) - m_safe) : 1.f;
            const float4 v = __ldcg(reinterpret_cast<const float4*>(p.partial_o + slot_base(c) * HEAD_DIM + col));
            acc[0] += wgt * v.x; acc[1] += wgt * v.y; acc[2] += wgt * v.z; acc[3] += wgt * v.w;
            denom += wgt;
          }
          const float inv = Variant::use_softmax ? (denom > 0.f ? 1.f / denom : 0.f) : 1.f;
          float out[4];
#pragma unroll
          for (int i = 0; i < 4; ++i) out[i] = variant.OutputTransform(p, acc[i] * inv, b, qo, head, col + i);
          store_vec<4>(static_cast<DO*>(p.o) + (qo_start + qo) * p.o_stride_n + head * p.o_stride_h + col, out);
          if (col == 0 && p.lse != nullptr)
            p.lse[static_cast<i64>(qo_start + qo) * p.num_qo_heads + head] =
                Variant::use_softmax ? (denom > 0.f ? m + log2f(denom) : neg_inf()) : 0.f;
        }
        if (threadIdx.x == 0) p.counters[w.counter * p.kv.num_kv_heads + kv_head] = 0;
      }
    }
    __syncthreads();  // shared memory is reused by the next item
  }
}

#endif

}  // namespace tessera
