// Prefill (FA2 template), persistent kernel: CTA (x, head group) runs its queue
// of work items (query tile x KV chunk, from the planner); per item it loads
// the fused query tile, pipelines KV tiles through shared memory, merges the
// KV-split warps, and writes the output (unsplit tile) or a partial state,
// a split tile's partials merged in chunk order by its CTAs or its last
// finisher (common/cooperative_merge.cuh). The Hopper template is
// prefill_sm90/kernel.cuh.
#pragma once
#include "tessera/device/arch/grid_dependency.cuh"
#include "tessera/device/kernels/common/cooperative_merge.cuh"
#include "tessera/device/kernels/prefill_sm80/kernel_keys.cuh"
#include "tessera/device/kernels/prefill_sm80/mainloop.cuh"
#include "tessera/device/kernels/prefill_sm80/mainloop_fp8.cuh"

namespace tessera {

#if defined(__CUDACC__) || defined(__CUDACC_RTC__)

// HEAD_DIM_QK: q / k features; HEAD_DIM_VO: v / o features (see PrefillShape).
// Equal dims compile to the code they always did: V shares K's row addresses
// (KVTileLoader) and every size below folds to the same constants.
//
// fp8 DKV (e4m3 / e5m2 cache, equal head dims): the loader stages the fp8
// rows and the mainloop widens its fragments in registers to q's 16-bit
// type (the mma takes one operand type; prefill_sm80/mainloop_fp8.cuh). With
// FP8_WIDEN (variants that transform K or V tiles in shared memory), each
// thread instead widens its own copied rows into 16-bit tiles right after
// its wait, before the pipeline's barrier, and the mainloop is the 16-bit
// one. The scales come from read_run_scales
// (k_scale / v_scale tensors, else the parameters, into which the host
// folded float scales). Compile-time
// branches: 16-bit caches generate the code they always did.
template <typename Variant, typename DQ, typename DKV, typename DO, int HEAD_DIM_QK, int HEAD_DIM_VO, int CTA_Q,
          int CTA_KV, int WARPS_Q, int WARPS_KV, int STAGES, bool FP8_WIDEN = false, typename Params>
__device__ __forceinline__ void batch_prefill_rows(const Params& p, int queues) {
  constexpr bool kFp8 = is_fp8<DKV>;
  constexpr bool kFp8Registers = kFp8 && !FP8_WIDEN;  // fp8 fragments widened in registers
  constexpr Fa2KvTiles kKvTiles = !kFp8 ? Fa2KvTiles::k16Bit : FP8_WIDEN ? Fa2KvTiles::kFp8Widened : Fa2KvTiles::kFp8;
  using Shape = PrefillShape<HEAD_DIM_QK, HEAD_DIM_VO, CTA_Q, CTA_KV, WARPS_Q, WARPS_KV, STAGES, kKvTiles>;
  using Loader = KVTileLoader<HEAD_DIM_QK, HEAD_DIM_VO, CTA_KV, Shape::THREADS, RowSwizzle, DKV, STAGES>;
  using Traits = VariantTraits<Variant, Params>;
  static_assert(kFp8 || !FP8_WIDEN, "FP8_WIDEN: fp8 caches only");
  static_assert(!kFp8Registers || !(Traits::key_transform || Traits::value_transform),
                "an fp8 cache whose variant transforms K or V needs the widened tiles: the host picks them when the "
                "variant's code names KeyTransform or ValueTransform");
  // The mma's operand type: the cache's, or q's for an fp8 cache.
  using T16 = typename Fp8Operand<DQ, DKV>::type;
  static_assert(sizeof(DQ) == 2 && (sizeof(DKV) == 2 || kFp8) && (sizeof(DO) == 2 || sizeof(DO) == 4),
                "16-bit q; 16-bit or fp8 kv; 16- or 32-bit o");
  static_assert(!kFp8 || HEAD_DIM_QK == HEAD_DIM_VO, "fp8 caches: equal head dims");
  static_assert(WARPS_KV == 1 || WARPS_KV * CTA_Q * (HEAD_DIM_VO + 2) * 4 <= Shape::SMEM_BYTES,
                "the KV-warp merge scratch must fit in the tile buffers");
  static_assert(!kFp8Registers || WARPS_Q * WARPS_KV * kFp8OrderScratchFloats * 4 <= Shape::SMEM_BYTES,
                "the fp8 output reorder scratch must fit in the tile buffers");
  constexpr int MT = Shape::MT, NT_O = Shape::NT_O;
  extern __shared__ uint4 smem_raw[];
  T16* q_smem = reinterpret_cast<T16*>(smem_raw);  // q is stored as T16: the mma needs one operand type
  T16* kv_smem = q_smem + Shape::Q_ELEMS;
  // fp8: the staging stages (unused otherwise).
  DKV* kv_stage = reinterpret_cast<DKV*>(reinterpret_cast<char*>(smem_raw) + Shape::STAGING_OFFSET);
  __shared__ int s_is_last;
  // The output scale, read in the epilogue from shared memory rather than
  // the parameters: a parameter read there changes how ptxas schedules the
  // whole kernel (the mainloop measured ~3% slower at 255 registers).
  __shared__ float s_o_scale;
  __shared__ int s_page_ids[STAGES * CTA_KV];           // KVTileLoader's page ids, STAGES tiles ahead
  __shared__ __align__(16) i64 s_row_offs[Loader::TABLE_ROWS];  // KVTileLoader's row offsets, a tile ahead

  // Shared addresses of the Q tile and the KV stages, converted once.
  const u32 q_addr = smem_addr(q_smem), kv_addr = smem_addr(kv_smem), stage_addr = smem_addr(kv_stage);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int wq = warp % WARPS_Q, wk = warp / WARPS_Q;
  const int g = lane / 4, quad = lane % 4;

  WorkQueue<PrefillWorkItem, QueueLoad::kFirst, Params> queue(p, queue_of_cta(queues));
  if constexpr (!kFp8)
    if (threadIdx.x == 0) s_o_scale = p.o_scale;  // read after the first item's barriers
  // The plan's workspace is complete; q, K, V and the outputs may still be
  // the previous kernel's (programmatic dependent launch).
  grid_dependency_wait();
  // fp8: the scale tensors may be the previous kernel's too.
  float run_sm_scale = 0.f;
  if constexpr (kFp8) {
    const device::RunScales run = device::read_run_scales(p);
    run_sm_scale = run.sm_scale;
    if (threadIdx.x == 0) s_o_scale = run.o_scale;
  }
  for (int wi = queue.begin; wi < queue.end; ++wi) {
    const PrefillWorkItem w = queue.take(wi);
    const int b = item_request(p, w), kv_head = item_kv_head(p, w);
    const int qo_start = w.qo_begin, qo_len = w.qo_len, kv_len = w.kv_len, page_base = w.kv_begin;
    const int row0 = w.q_tile * CTA_Q;  // first fused row of the tile
    Variant variant(p, b, qo_len, kv_len);

    // Q tile: fused row f -> (query qo = f / group, head = kv_head * group + f % group).
    load_tile<HEAD_DIM_QK, CTA_Q, Shape::THREADS, RowSwizzle>(q_smem, static_cast<const T16*>(p.q), [&](int r) -> i64 {
      const int f = row0 + r, qo = f / p.group;
      if (qo >= qo_len) return -1;
      return (qo_start + qo) * p.q_stride_n + (kv_head * p.group + f % p.group) * p.q_stride_h;
    });
    cp_async_commit();
    const int n_tiles = (w.kv_end - w.kv_start + CTA_KV - 1) / CTA_KV;
    Loader kv_loader(p.kv, s_page_ids, s_row_offs, page_base, w.kv_start, w.kv_end, kv_head, p.page_shift);
    auto load_kv = [&](int tile, int stage) {
      if constexpr (kFp8)
        kv_loader.load(tile, kv_stage + stage * Shape::STAGE_ELEMS, kv_stage + stage * Shape::STAGE_ELEMS + Shape::K_ELEMS);
      else
        kv_loader.load(tile, kv_smem + stage * Shape::STAGE_ELEMS, kv_smem + stage * Shape::STAGE_ELEMS + Shape::K_ELEMS);
    };
#pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) {
      if (s > 0 && !kv_loader.affine) __syncthreads();  // tile s needs the row offsets tile s - 1 resolved
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
      transform_q_tile<Variant, HEAD_DIM_QK, CTA_Q, RowSwizzle>(variant, p, q_smem, threadIdx.x, Shape::THREADS, 0, CTA_Q, b,
                                                           row0, p.group, kv_head, qo_len);
    }

    // Per-warp facts for skipping masks on interior tiles (warp-uniform).
    const int causal_shift = kv_len - qo_len;
    const int warp_row0 = row0 + wq * Shape::WARP_ROWS;
    const bool warp_rows_valid = (warp_row0 + Shape::WARP_ROWS - 1) / p.group < qo_len;
    const int warp_min_qo = warp_row0 / p.group;

    PrefillState<MT, NT_O> st;
    st.init();
    const int warp_max_qo = (warp_row0 + Shape::WARP_ROWS - 1) / p.group;
    auto masked_tile = [&](int t) {
      const int first = w.kv_start + t * CTA_KV;
      return tile_needs_mask<Variant, Params, MaskBits<Variant, Params, MT, Shape::NT_S>::kUsed>(
          first, first + CTA_KV - 1, w.kv_end, warp_rows_valid, warp_min_qo, warp_max_qo, causal_shift);
    };
    for (int t = 0; t < n_tiles; ++t) {
      cp_async_wait<STAGES - 2>();  // tile t's copies (and the page ids load(t) brought) are done
      T16* k_tile = kv_smem + (t % STAGES) * Shape::STAGE_ELEMS;
      T16* v_tile = k_tile + Shape::K_ELEMS;
      if constexpr (FP8_WIDEN) {  // this thread's rows of tile t have landed: widen them before the barrier
        const DKV* k_stage = kv_stage + (t % STAGES) * Shape::STAGE_ELEMS;
        kv_loader.dequantize(k_stage, k_stage + Shape::K_ELEMS, k_tile, v_tile);
      }
      __syncthreads();
      const int nt = t + STAGES - 1, ns = nt % STAGES;
      // The next tile's copies: here, or (16-bit tiles without K / V
      // transforms) once this tile's S mma are issued.
      constexpr bool kCopiesAfterS = !kFp8 && !(Traits::key_transform || Traits::value_transform);
      auto issue_next = [&] {
        if (nt < n_tiles) load_kv(nt, ns);
        cp_async_commit();
      };
      if constexpr (!kCopiesAfterS) issue_next();
      const int tile_start = w.kv_start + t * CTA_KV;
      if constexpr (Traits::key_transform || Traits::value_transform) {
        if constexpr (Traits::key_transform)
          transform_kv_tile<Variant, true, HEAD_DIM_QK, CTA_KV, RowSwizzle>(variant, p, k_tile, threadIdx.x, Shape::THREADS, 0,
                                                                         CTA_KV, b, tile_start, w.kv_end, kv_head);
        if constexpr (Traits::value_transform)
          transform_kv_tile<Variant, false, HEAD_DIM_VO, CTA_KV, RowSwizzle>(variant, p, v_tile, threadIdx.x, Shape::THREADS, 0,
                                                                          CTA_KV, b, tile_start, w.kv_end, kv_head);
        __syncthreads();
      }
      const bool masked = masked_tile(t);
      if constexpr (kFp8Registers) {
        const u32 k_addr = stage_addr + (t % STAGES) * Shape::STAGE_ELEMS;
        prefill_compute_tile_fp8<Variant, Shape, T16, DKV, HEAD_DIM_QK>(
            p, variant, st, rows, q_addr, k_addr, k_addr + Shape::K_ELEMS, tile_start, w.kv_end, b, kv_head, wq, wk,
            masked, causal_shift, run_sm_scale);
      } else {
        const u32 k_addr = kv_addr + (t % STAGES) * Shape::STAGE_ELEMS * 2;
        auto after_s = [&] {
          if constexpr (kCopiesAfterS) issue_next();
        };
        prefill_compute_tile<Variant, Shape, T16, HEAD_DIM_QK, HEAD_DIM_VO, kFp8>(
            p, variant, st, rows, q_addr, k_addr, k_addr + Shape::K_ELEMS * 2, tile_start, w.kv_end, b, kv_head, wq,
            wk, masked, causal_shift, run_sm_scale, after_s);
      }
    }
    cp_async_wait<0>();
    __syncthreads();  // pipeline drained: shared memory is free
    if constexpr (kFp8Registers) {
      fp8_o_to_mma_order(st, reinterpret_cast<float*>(smem_raw) + warp * kFp8OrderScratchFloats);
      __syncthreads();  // the KV-warp merge below reuses the scratch
    }

    prefill_sum_quads(st);
    // Merge the KV-split warps into warp column wk == 0, in wk order.
    if constexpr (WARPS_KV > 1) {
      float* scratch = reinterpret_cast<float*>(smem_raw);  // [WARPS_KV][CTA_Q][HEAD_DIM_VO + 2]
      constexpr int LD = HEAD_DIM_VO + 2;
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
          if (quad == 0) { dst[HEAD_DIM_VO] = st.m[t][r]; dst[HEAD_DIM_VO + 1] = st.d[t][r]; }
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
                const float2 f = acc.merge(src[HEAD_DIM_VO], src[HEAD_DIM_VO + 1]);
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

    if (wk == 0)
      prefill_store_rows<Variant, DO, HEAD_DIM_VO, CTA_Q>(p, variant, st, rows, w, qo_start, b, kv_head,
                                                          wq * Shape::WARP_ROWS, s_o_scale);
    if (w.partial_slot >= 0)
      merge_split_tile<Variant, DO, HEAD_DIM_VO, CTA_Q, Shape::THREADS>(p, variant, w, qo_start, qo_len, row0, b,
                                                                        kv_head, threadIdx.x, &s_is_last,
                                                                        [] { __syncthreads(); }, wi == queue.end - 1);
    __syncthreads();  // shared memory is reused by the next item
  }
  grid_dependency_launch_dependents();
}

// The kernel's entry: 8-row query tiles (CTA_Q 8, fp8 or 16-bit caches,
// the keys as the mma's rows) run the warp-specialized form of
// prefill_sm80/kernel_keys.cuh on WARPS_KV math warps and a producer
// warpgroup, for KV_HEADS adjacent KV heads a CTA. queues: the plan's
// queues (columns); a launch of two plans passes each its own, its grid being
// as wide as the wider plan's.
template <typename Variant, typename DQ, typename DKV, typename DO, int HEAD_DIM_QK, int HEAD_DIM_VO, int CTA_Q,
          int CTA_KV, int WARPS_Q, int WARPS_KV, int STAGES, bool FP8_WIDEN = false, int KV_HEADS = 1,
          typename Params>
__device__ __forceinline__ void batch_prefill(const Params& p, int queues = -1) {
  if (queues < 0) queues = static_cast<int>(gridDim.x);
  if constexpr (CTA_Q == 8) {
    static_assert(HEAD_DIM_QK == HEAD_DIM_VO && WARPS_Q == 1 && !FP8_WIDEN, "8-row tiles: equal head dims, one warp "
                                                                            "along the rows, K / V rows as stored");
    batch_prefill_keys<Variant, DQ, DKV, DO, HEAD_DIM_QK, CTA_KV, WARPS_KV, STAGES, KV_HEADS>(p, queues);
  } else {
    static_assert(KV_HEADS == 1, "one KV head a CTA on 16-row and larger tiles");
    batch_prefill_rows<Variant, DQ, DKV, DO, HEAD_DIM_QK, HEAD_DIM_VO, CTA_Q, CTA_KV, WARPS_Q, WARPS_KV, STAGES,
                       FP8_WIDEN>(p, queues);
  }
}

#endif

}  // namespace tessera
