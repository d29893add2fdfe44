// Prefill (Hopper template), mainloop step: the same KV tiles as the FA2
// template (gathered by cp.async from any KV source, paper §3.2.1), stored in
// the 128-byte-swizzled layout wgmma reads through descriptors. Each
// warpgroup owns 64 query rows: S = Q K^T is one wgmma chain with both
// operands in shared memory, the softmax runs on the accumulators (their
// per-warp layout is the mma.sync one, so prefill_softmax_tile is shared),
// and O += P V takes P straight from registers with V read MN-major.
#pragma once
#include "tessera/device/arch/wgmma.cuh"
#include "tessera/device/kernels/prefill_mainloop.cuh"

namespace tessera {

#if defined(__CUDACC__) || defined(__CUDACC_RTC__)

#if TESSERA_HAS_WGMMA
// S (+)= Q K^T for the warpgroup's 64 rows over one KV tile (async: the
// caller commits and waits).
template <typename Shape, typename T, int HEAD_DIM>
__device__ __forceinline__ void sm90_issue_qk(float (&sf)[Shape::KV_ROWS / 2], u32 q_smem, u32 k_smem) {
  constexpr u32 BLOCK_Q = Shape::Q_ROWS * 128, BLOCK_KV = Shape::KV_ROWS * 128;  // bytes per 64-column block
  const int wg = threadIdx.x / 128;
  wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < HEAD_DIM / 16; ++kk) {
    // k-step kk: 16 columns = 32 bytes into column block kk / 4.
    const u32 q_addr = q_smem + (kk / 4) * BLOCK_Q + wg * (64 * 128) + (kk % 4) * 32;
    const u32 k_addr = k_smem + (kk / 4) * BLOCK_KV + (kk % 4) * 32;
    wgmma_ss(sf, wgmma_desc(q_addr, 16, 1024), wgmma_desc(k_addr, 16, 1024), kk > 0, T{}, WgmmaN<Shape::KV_ROWS>{});
  }
}

// O += P V with P (the softmaxed S tile) packed from registers (async).
template <typename Shape, typename T, int HEAD_DIM>
__device__ __forceinline__ void sm90_issue_pv(float (&of)[HEAD_DIM / 2], const float (&s)[Shape::KV_ROWS / 8][4],
                                              u32 v_smem) {
  constexpr int NT_S = Shape::KV_ROWS / 8;
  constexpr u32 BLOCK_KV = Shape::KV_ROWS * 128;
  // P as A fragments, all packed before the fence: registers an in-flight
  // wgmma reads must not be written until it completes.
  u32 a[NT_S / 2][4];
#pragma unroll
  for (int j = 0; j < NT_S / 2; ++j) {
    a[j][0] = pack2(s[2 * j][0], s[2 * j][1], T{});
    a[j][1] = pack2(s[2 * j][2], s[2 * j][3], T{});
    a[j][2] = pack2(s[2 * j + 1][0], s[2 * j + 1][1], T{});
    a[j][3] = pack2(s[2 * j + 1][2], s[2 * j + 1][3], T{});
  }
  wgmma_fence();
#pragma unroll
  for (int j = 0; j < NT_S / 2; ++j) {
    // k-step j: 16 tokens (two 8-row groups, SBO apart); the 64-feature
    // column blocks of V are BLOCK_KV apart (LBO, V is MN-major).
    wgmma_rs_tb(of, a[j], wgmma_desc(v_smem + j * (16 * 128), BLOCK_KV, 1024), 1, T{}, WgmmaN<HEAD_DIM>{});
  }
}
#endif

// One KV tile, serially: S = QK^T, softmax, O += PV (2-stage pipelines and
// variants that transform K or V in shared memory).
template <typename Variant, typename Shape, typename T, int HEAD_DIM, typename Params>
__device__ __forceinline__ void prefill_compute_tile_sm90(const Params& p, const Variant& variant,
                                                          PrefillState<1, Shape::NT_O>& st, const RowInfo<1>& rows,
                                                          u32 q_smem, u32 k_smem, u32 v_smem, int tile_start, int kv_end,
                                                          int b, int kv_head, bool masked, int causal_shift) {
#if TESSERA_HAS_WGMMA
  constexpr int NT_S = Shape::KV_ROWS / 8, NT_O = Shape::NT_O;
  static_assert(Shape::MT == 1 && Shape::KV_PER_WARP == Shape::KV_ROWS, "warpgroup tiles: 16 rows per warp, whole KV tile");
  const int quad = threadIdx.x % 4;
  float s[1][NT_S][4];
  float(&sf)[NT_S * 4] = reinterpret_cast<float(&)[NT_S * 4]>(s[0]);
  sm90_issue_qk<Shape, T, HEAD_DIM>(sf, q_smem, k_smem);
  wgmma_commit();
  wgmma_wait<0>();
  wgmma_keep(sf);
  prefill_softmax_tile<Variant>(p, variant, st, rows, s, tile_start + quad * 2, kv_end, b, kv_head, masked, causal_shift);
  float(&of)[NT_O * 4] = reinterpret_cast<float(&)[NT_O * 4]>(st.o[0]);
  sm90_issue_pv<Shape, T, HEAD_DIM>(of, s[0], v_smem);
  wgmma_commit();
  wgmma_wait<0>();
  wgmma_keep(of);
#else
  __trap();  // Hopper kernels are only built for sm_90a
#endif
}

// The whole KV loop of a work item with softmax overlapped with the tensor
// cores (STAGES >= 3): while the warpgroup runs the softmax of tile t, the
// wgmma of S_{t+1} = Q K_{t+1}^T is in flight. Per iteration: wait for O's
// previous update and tile t+1's copies, one barrier, start copies of tile
// t + STAGES - 1 into the stage tile t - 1 used, issue S_{t+1}, softmax S_t,
// issue O += P_t V_t, wait for S_{t+1}. load(tile, stage) issues one tile's
// cp.async copies; masked(tile) says whether its logits need masks.
template <typename Variant, typename Shape, typename T, int HEAD_DIM, int STAGES, typename Params, typename Load,
          typename Masked>
__device__ __forceinline__ void prefill_kv_loop_sm90(const Params& p, const Variant& variant,
                                                     PrefillState<1, Shape::NT_O>& st, const RowInfo<1>& rows,
                                                     u32 q_smem, u32 kv_smem, int n_tiles, int kv_start, int kv_end,
                                                     int b, int kv_head, int causal_shift, Load load, Masked masked) {
#if TESSERA_HAS_WGMMA
  static_assert(STAGES >= 3, "S_{t+1} is computed while tile t is in use");
  constexpr int NT_S = Shape::KV_ROWS / 8, NT_O = Shape::NT_O;
  constexpr u32 KV_BYTES = Shape::KV_ELEMS * 2;
  const int quad = threadIdx.x % 4;
  auto k_at = [&](int t) { return kv_smem + (t % STAGES) * 2 * KV_BYTES; };
  float s[1][NT_S][4], s_next[NT_S * 4];
  float(&sf)[NT_S * 4] = reinterpret_cast<float(&)[NT_S * 4]>(s[0]);
  float(&of)[NT_O * 4] = reinterpret_cast<float(&)[NT_O * 4]>(st.o[0]);

  cp_async_wait<0>();  // Q and the first STAGES - 1 tiles
  fence_proxy_async();
  __syncthreads();
  if (n_tiles > 0) {
    sm90_issue_qk<Shape, T, HEAD_DIM>(sf, q_smem, k_at(0));
    wgmma_commit();
    wgmma_wait<0>();
    wgmma_keep(sf);
  }
  for (int t = 0; t < n_tiles; ++t) {
    wgmma_wait<0>();  // O += P_{t-1} V_{t-1} done: its stage may be refilled (unconditional: see below)
    if (t > 0) {
      cp_async_wait<0>();  // tile t + 1 landed
      fence_proxy_async();
      __syncthreads();
    }
    if (t + STAGES - 1 < n_tiles) load(t + STAGES - 1, (t + STAGES - 1) % STAGES);
    cp_async_commit();
    // Issued unconditionally (on the last tile it reads a stale stage and is
    // discarded): a wgmma under a branch makes ptxas serialize the pipeline.
    sm90_issue_qk<Shape, T, HEAD_DIM>(s_next, q_smem, k_at(t + 1));
    wgmma_commit();
    const int tile_start = kv_start + t * Shape::KV_ROWS;
    prefill_softmax_tile<Variant>(p, variant, st, rows, s, tile_start + quad * 2, kv_end, b, kv_head, masked(t),
                                  causal_shift);
    sm90_issue_pv<Shape, T, HEAD_DIM>(of, s[0], k_at(t) + KV_BYTES);
    wgmma_commit();
    wgmma_wait<1>();  // S_{t+1} (the older group) is complete
    wgmma_keep(s_next);
#pragma unroll
    for (int i = 0; i < NT_S * 4; ++i) sf[i] = s_next[i];
  }
  wgmma_wait<0>();
  wgmma_keep(of);
#else
  __trap();  // Hopper kernels are only built for sm_90a
#endif
}

#endif

}  // namespace tessera
