// MLA kernel family (DeepSeek-style multi-head latent attention, absorbed
// weights), persistent kernel on mma.sync (sm_80; runs on sm_90 too).
//
// H query heads over one latent KV head: a query tile is CTA_Q fused rows
// f = query * H + head of one request (head-group fusion with group = H), a
// work item such a tile against a KV chunk, planned by the prefill planner
// (Planner::plan_prefill: split-KV for long contexts, causal clipping of the
// new tokens). Per item: the Q tile (q_nope | q_pe rows) into shared memory,
// KV tiles (ckv | kpe rows, gathered through the page table) pipelined with
// cp.async, each tile one mla_compute_tile (mla/mainloop.cuh) for every
// warp, then the row groups' sums combined and the rows written: normalized
// into o / lse for an unsplit tile, else as a partial state merged in chunk
// order by the tile's CTAs (common/cooperative_merge.cuh: deterministic, no
// atomics on values).
#pragma once
#include "tessera/device/arch/grid_dependency.cuh"
#include "tessera/device/kernels/common/cooperative_merge.cuh"
#include "tessera/device/kernels/mla/mainloop.cuh"

namespace tessera {

#if defined(__CUDACC__) || defined(__CUDACC_RTC__)

// The merge's variant: plain softmax, no transforms.
struct MlaVariant : VariantBase {
  using VariantBase::VariantBase;
};

// T: q / ckv / kpe element type (fp16 or bf16); DO: o's. CTA_Q: 16, 32 or
// 64 fused rows (MlaConfigFor picks the rest). CAUSAL: bottom-right aligned
// causal mask among a request's new tokens.
template <typename T, typename DO, int CTA_Q, bool CAUSAL>
__device__ __forceinline__ void batch_mla(const MlaParams& p) {
  using Shape = typename MlaConfigFor<CTA_Q>::Shape;
  using Smem = MlaSharedStorage<Shape>;
  static_assert(sizeof(T) == 2 && sizeof(DO) == 2, "16-bit q, caches and o");
  constexpr int THREADS = Shape::THREADS, CTA_KV = Shape::CTA_KV, STAGES = Shape::STAGES;
  extern __shared__ uint4 smem_raw[];
  Smem& sm = *reinterpret_cast<Smem*>(smem_raw);
  __shared__ int s_is_last;
  const u32 q_addr = smem_addr(sm.q), kv_addr = smem_addr(sm.kv[0]), p_addr = smem_addr(sm.p);
  constexpr u32 STAGE_BYTES = static_cast<u32>(sizeof(sm.kv[0]));
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int wq = warp / Shape::WARPS_D, wd = warp % Shape::WARPS_D;
  const int g = lane / 4, quad = lane % 4;
  const T* q_nope = static_cast<const T*>(p.q_nope);
  const T* q_pe = static_cast<const T*>(p.q_pe);
  const T* ckv = static_cast<const T*>(p.ckv);
  const T* kpe = static_cast<const T*>(p.kpe);
  const int H = p.group;

  WorkQueue<PrefillWorkItem, QueueLoad::kFirst, MlaParams> queue(p, blockIdx.x);
  // The plan's workspace is complete; q, the caches and the outputs may
  // still be the previous kernel's (programmatic dependent launch).
  grid_dependency_wait();
  const float scale_log2 = p.sm_scale * kLog2e;
  for (int wi = queue.begin; wi < queue.end; ++wi) {
    const PrefillWorkItem w = queue.take(wi);
    const int b = w.request, qo_start = w.qo_begin, qo_len = w.qo_len, kv_len = w.kv_len;
    const int row0 = w.q_tile * CTA_Q;

    // Q tile: fused row f -> (query f / H, head f % H); rows past the
    // request's queries are zeros (never stored).
    mla_load_rows<CTA_Q, THREADS>(q_addr, q_nope, q_pe, [&](int r) -> MlaRowOffset {
      const int f = row0 + r, qo = f / H, h = f - qo * H;
      if (qo >= qo_len) return {-1, -1};
      return {(qo_start + qo) * p.q_nope_stride_n + h * p.q_nope_stride_h,
              (qo_start + qo) * p.q_pe_stride_n + h * p.q_pe_stride_h};
    });
    cp_async_commit();
    const int n_tiles = (w.kv_end - w.kv_start + CTA_KV - 1) / CTA_KV;
    auto load_kv = [&](int t, int stage) {
      const int start = w.kv_start + t * CTA_KV;
      mla_load_rows<CTA_KV, THREADS>(kv_addr + stage * STAGE_BYTES, ckv, kpe, [&](int r) -> MlaRowOffset {
        const int pos = start + r;
        if (pos >= w.kv_end) return {-1, -1};  // past the chunk: zeros (masked), never NaN from unused slots
        const int page_idx = p.page_shift >= 0 ? pos >> p.page_shift : pos / p.page_size;
        const int slot = pos - page_idx * p.page_size;
        const int page = mla_page_id(p, w.kv_begin + page_idx);
        if (page < 0) return {-1, -1};
        return {page * p.ckv_page_stride + slot * p.ckv_token_stride,
                page * p.kpe_page_stride + slot * p.kpe_token_stride};
      });
    };
#pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) {
      if (s < n_tiles) load_kv(s, s);
      cp_async_commit();
    }

    int qo[2];
    bool valid[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      qo[r] = (row0 + wq * 16 + g + 8 * r) / H;
      valid[r] = qo[r] < qo_len;
    }
    const int causal_shift = kv_len - qo_len;
    const int warp_min_qo = (row0 + wq * 16) / H;
    MlaWarpState<Shape> st;
    st.init();
    for (int t = 0; t < n_tiles; ++t) {
      cp_async_wait<STAGES - 2>();  // tile t (and Q) landed
      __syncthreads();
      const int nt = t + STAGES - 1;
      if (nt < n_tiles) load_kv(nt, nt % STAGES);
      cp_async_commit();
      const int tile_start = w.kv_start + t * CTA_KV, tile_last = tile_start + CTA_KV - 1;
      const bool masked = tile_last >= w.kv_end || (CAUSAL && tile_last > warp_min_qo + causal_shift);
      mla_compute_tile<Shape, T, CAUSAL>(st, q_addr, kv_addr + (t % STAGES) * STAGE_BYTES, sm.p, p_addr, sm.red,
                                         tile_start, w.kv_end, qo, causal_shift, masked, scale_log2, wq, wd);
    }
    cp_async_wait<0>();
    __syncthreads();  // pipeline drained; every warp done with the row maxima

    // Row sums: the quads' quarters, then the row group's warps in order.
    float d[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float x = st.d[r];
      x += __shfl_xor_sync(0xffffffffu, x, 1);
      x += __shfl_xor_sync(0xffffffffu, x, 2);
      if (quad == 0) sm.red[wd][wq * 16 + g + 8 * r] = x;
    }
    __syncthreads();
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int row = wq * 16 + g + 8 * r;
      d[r] = sm.red[0][row];
#pragma unroll
      for (int k = 1; k < Shape::WARPS_D; ++k) d[r] += sm.red[k][row];
    }

    MlaVariant variant(p, b, qo_len, kv_len);
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      if (!valid[r]) continue;
      const int tile_row = wq * 16 + g + 8 * r, f = row0 + tile_row, head = f - qo[r] * H;
      const bool empty = d[r] == 0.f;
      const float inv = (empty ? 0.f : row_inverse(d[r])) * p.o_scale;
      const float lse = empty ? neg_inf() : st.m[r] + row_log2(d[r]);
      const int col = wd * Shape::D_PER_WARP + quad * 2;
      if (w.partial_slot < 0) {
        DO* dst = static_cast<DO*>(p.o) + (qo_start + qo[r]) * p.o_stride_n + head * p.o_stride_h + col;
#pragma unroll
        for (int n = 0; n < Shape::NT_O; ++n)
          *reinterpret_cast<u32*>(dst + n * 8) = pack_pair<DO>(st.o[n][2 * r] * inv, st.o[n][2 * r + 1] * inv);
        if (wd == 0 && quad == 0 && p.lse != nullptr)
          p.lse[static_cast<i64>(qo_start + qo[r]) * p.num_qo_heads + head] = lse;
      } else {
        const i64 base = (static_cast<i64>(w.partial_slot) * gridDim.y + blockIdx.y) * CTA_Q + tile_row;
        float* dst = p.partial_o + base * kMlaDimCkv + col;
#pragma unroll
        for (int n = 0; n < Shape::NT_O; ++n)
          *reinterpret_cast<float2*>(dst + n * 8) = make_float2(st.o[n][2 * r] * inv, st.o[n][2 * r + 1] * inv);
        if (wd == 0 && quad == 0) p.partial_lse[base] = lse;
      }
    }
    if (w.partial_slot >= 0)
      merge_split_tile<MlaVariant, DO, kMlaDimCkv, CTA_Q, THREADS>(p, variant, w, qo_start, qo_len, row0, b, 0,
                                                                   threadIdx.x, &s_is_last, [] { __syncthreads(); },
                                                                   wi == queue.end - 1);
    __syncthreads();  // shared memory is reused by the next item
  }
  grid_dependency_launch_dependents();
}

#endif

}  // namespace tessera
