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

template <typename Variant, typename Shape, typename T, int HEAD_DIM, typename Params>
__device__ __forceinline__ void prefill_compute_tile_sm90(const Params& p, const Variant& variant,
                                                          PrefillState<1, Shape::NT_O>& st, const RowInfo<1>& rows,
                                                          u32 q_smem, u32 k_smem, u32 v_smem, int tile_start, int kv_end,
                                                          int b, int kv_head, bool masked, int causal_shift) {
#if TESSERA_HAS_WGMMA
  constexpr int NT_S = Shape::KV_ROWS / 8, NT_O = Shape::NT_O;
  static_assert(Shape::MT == 1 && Shape::KV_PER_WARP == Shape::KV_ROWS, "warpgroup tiles: 16 rows per warp, whole KV tile");
  constexpr u32 BLOCK_Q = Shape::Q_ROWS * 128, BLOCK_KV = Shape::KV_ROWS * 128;  // bytes per 64-column block
  const int wg = threadIdx.x / 128, quad = threadIdx.x % 4;

  float s[1][NT_S][4];
  float(&sf)[NT_S * 4] = reinterpret_cast<float(&)[NT_S * 4]>(s[0]);
#pragma unroll
  for (int i = 0; i < NT_S * 4; ++i) sf[i] = 0.f;
  wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < HEAD_DIM / 16; ++kk) {
    // k-step kk: 16 columns = 32 bytes into column block kk / 4.
    const u32 q_addr = q_smem + (kk / 4) * BLOCK_Q + wg * (64 * 128) + (kk % 4) * 32;
    const u32 k_addr = k_smem + (kk / 4) * BLOCK_KV + (kk % 4) * 32;
    wgmma_ss(sf, wgmma_desc(q_addr, 16, 1024), wgmma_desc(k_addr, 16, 1024), 1, T{}, WgmmaN<Shape::KV_ROWS>{});
  }
  wgmma_commit();
  wgmma_wait<0>();
  wgmma_keep(sf);

  prefill_softmax_tile<Variant>(p, variant, st, rows, s, tile_start + quad * 2, kv_end, b, kv_head, masked, causal_shift);

  // P as A fragments, all packed before the fence: registers an in-flight
  // wgmma reads must not be written until it completes.
  u32 a[NT_S / 2][4];
#pragma unroll
  for (int j = 0; j < NT_S / 2; ++j) {
    a[j][0] = pack2(s[0][2 * j][0], s[0][2 * j][1], T{});
    a[j][1] = pack2(s[0][2 * j][2], s[0][2 * j][3], T{});
    a[j][2] = pack2(s[0][2 * j + 1][0], s[0][2 * j + 1][1], T{});
    a[j][3] = pack2(s[0][2 * j + 1][2], s[0][2 * j + 1][3], T{});
  }
  float(&of)[NT_O * 4] = reinterpret_cast<float(&)[NT_O * 4]>(st.o[0]);
  wgmma_fence();
#pragma unroll
  for (int j = 0; j < NT_S / 2; ++j) {
    // k-step j: 16 tokens (two 8-row groups, SBO apart); the 64-feature
    // column blocks of V are BLOCK_KV apart (LBO, V is MN-major).
    wgmma_rs_tb(of, a[j], wgmma_desc(v_smem + j * (16 * 128), BLOCK_KV, 1024), 1, T{}, WgmmaN<HEAD_DIM>{});
  }
  wgmma_commit();
  wgmma_wait<0>();
  wgmma_keep(of);
#else
  __trap();  // Hopper kernels are only built for sm_90a
#endif
}

#endif

}  // namespace tessera
