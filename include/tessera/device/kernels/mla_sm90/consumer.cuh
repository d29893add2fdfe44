// MLA kernel family on Hopper (sm_90a), the two consumer warpgroups. Both
// hold all 64 rows of the query tile; warpgroup w computes S for keys
// 32w..32w+31 of each KV tile and accumulates O's latent columns
// 256w..256w+255 (64 x 256 fp32: 128 registers a thread, so O never needs
// more than two warpgroups and nothing is computed twice):
//
//   S_w = Q K[32w..]^T        wgmma m64n32k16 x 36, both operands in shared memory
//   row maxima of both halves exchanged through shared memory (barrier A);
//   P_w = exp2(S_w * scale - m), kept as A fragments and written into the
//   P tile for the other warpgroup (barrier B);
//   O_w += P_w V[32w.., cols_w]          (A from registers, issued before
//                                         P_w goes out to the P tile)
//        + P_{1-w} V[32(1-w).., cols_w]   (A from the P tile)
//
// V is the K tile's first 512 features, read MN-major, so one stage serves
// both GEMMs. Per tile: S_t, softmax, P_t V_t, and the stage goes back at
// once: with two stages of 72 KB beside the 72 KB Q tile (all that fits),
// the producer's next load must start as early as possible. (Issuing S_{t+1}
// during the softmax when its tile had landed measured 5-9% slower: P_t V_t
// then queues behind it on the tensor cores and the stage goes back later.)
// Barrier A also orders the P tile's reuse: both warpgroups have waited for
// the previous P V before either writes the next P.
//
// fp8 caches: the consumers first widen the tile's raw fp8 rows into the
// 16-bit working tile (exact: every e4m3 / e5m2 value is an fp16 and a bf16
// value; kpe then times pe_scale) and give the raw stage back at once, so
// the producer's loads run two fp8 tiles ahead of the math.
#pragma once
#include "tessera/device/arch/fp8.cuh"
#include "tessera/device/arch/ldmatrix.cuh"
#include "tessera/device/arch/warpgroup.cuh"
#include "tessera/device/kernels/common/cooperative_merge.cuh"
#include "tessera/device/kernels/mla/kernel.cuh"
#include "tessera/device/kernels/mla_sm90/producer.cuh"
#include "tessera/device/kernels/prefill_sm90/mma.cuh"

namespace tessera {

#if defined(__CUDACC__) || defined(__CUDACC_RTC__)

// Named barriers of the consumer warpgroups (256 threads).
constexpr int kMlaMaxBar = 1;    // row maxima of a tile (then row sums at the end)
constexpr int kMlaPBar = 2;      // the P tile complete
constexpr int kMlaMergeBar = 3;  // split-KV merge
constexpr int kMlaWidenBar = 4;  // fp8: the working tile free, then widened

// Widens a raw stage of 64 fp8 rows (576 bytes each) into the swizzled 16-bit
// working tile at shared address dst, kpe (block 8) times pe_scale. The 256
// consumer threads in quarter warps: quarter q takes rows 2q and 2q + 1,
// lane i of it 16 features (16 * (i % 4) ..) of row 2q + i / 4 in each of
// the nine 64-feature blocks: its reads cover 128 distinct bytes and its
// 16-byte stores eight distinct chunk slots (the swizzle), so neither side
// has bank conflicts.
template <typename T, typename DKV>
__device__ __forceinline__ void mla_sm90_widen(u32 dst, u32 raw, int tid, float pe_scale) {
  const int sub = tid % 8, row = 2 * (tid / 8) + sub / 4, k = sub % 4;
  const u32 src = raw + static_cast<u32>(row * kMlaDimQK + 16 * k);
  const u32 out = dst + static_cast<u32>(row * 128);
  const u32 c0 = static_cast<u32>((2 * k) ^ (row & 7)) << 4, c1 = static_cast<u32>((2 * k + 1) ^ (row & 7)) << 4;
#pragma unroll 3
  for (int b = 0; b < kMlaSm90Blocks; ++b) {
    const uint4 x = ld_shared_16(src + b * 64);
    u32 w[8];
    fp8x4_to_16x2<DKV, T>(x.x, w[0], w[1]);
    fp8x4_to_16x2<DKV, T>(x.y, w[2], w[3]);
    fp8x4_to_16x2<DKV, T>(x.z, w[4], w[5]);
    fp8x4_to_16x2<DKV, T>(x.w, w[6], w[7]);
    if (b == kMlaSm90Blocks - 1 && pe_scale != 1.f) {
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        float lo, hi;
        unpack2(w[i], lo, hi, T{});
        w[i] = pack2(lo * pe_scale, hi * pe_scale, T{});
      }
    }
    const u32 block = out + b * (kMlaSm90Keys * 128);
    st_shared_16(block + c0, make_uint4(w[0], w[1], w[2], w[3]));
    st_shared_16(block + c1, make_uint4(w[4], w[5], w[6], w[7]));
  }
}

// Scratch of the consumers beside the pipeline (static shared memory).
struct MlaSm90Exchange {
  float max[2][kMlaSm90Rows];  // per warpgroup: a tile's row maxima over its keys
  float sum[2][kMlaSm90Rows];  // per warpgroup: the item's row sums over its keys
  int is_last;
};

template <typename T, typename DKV, typename DO, bool CAUSAL>
struct MlaSm90Consumer {
  static constexpr bool kFp8 = is_fp8<DKV>;
  static constexpr int NT_S = 32 / 8;                  // S n-tiles of a warpgroup (32 keys)
  static constexpr int O_REGS = kMlaDimCkv / 2 / 2;    // 64 x 256 fp32 over 128 threads
  static constexpr u32 BLOCK = kMlaSm90Rows * 128;     // one [64][64] column block
  static constexpr u32 STAGE_BYTES = kMlaSm90Blocks * BLOCK;

  const MlaParams& p;
  MlaSm90Pipeline& pipe;
  MlaSm90Storage<kFp8>& sm;
  MlaSm90Exchange& ex;

#if TESSERA_HAS_WGMMA
  // S = Q K^T over this warpgroup's 32 keys of the stage at k_desc (its first row).
  __device__ __forceinline__ static void issue_s(float (&s)[NT_S * 4], u64 q_desc, u64 k_desc) {
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kMlaDimQK / 16; ++kk) {
      const u32 off = (kk / 4) * BLOCK + (kk % 4) * 32;
      wgmma_ss(s, desc_at(q_desc, off), desc_at(k_desc, off), kk > 0, T{}, WgmmaN<32>{});
    }
    wgmma_commit();
  }
  // O += P V over the tile's 64 keys in two steps: this warpgroup's 32
  // from registers (issued before its P goes out to the P tile), then the
  // other's from the P tile. v_desc: the stage's V at this warpgroup's first
  // column block.
  __device__ __forceinline__ static void issue_pv_own(float (&o)[O_REGS], const u32 (&pa)[2][4], u64 v_desc, int wg) {
    wgmma_fence();
    const u32 own = static_cast<u32>(wg) * 32 * 128;
#pragma unroll
    for (int j = 0; j < 2; ++j) wgmma_rs_tb(o, pa[j], desc_at(v_desc, own + j * 16 * 128), 1, T{}, WgmmaN<256>{});
    wgmma_commit();
  }
  // The same accumulator and shape as issue_pv_own's, so no fence between.
  __device__ __forceinline__ static void issue_pv_other(float (&o)[O_REGS], u64 p_desc, u64 v_desc, int wg) {
    const u32 other = static_cast<u32>(1 - wg) * 32 * 128;
#pragma unroll
    for (int j = 0; j < 2; ++j)
      wgmma_ss_tb(o, desc_at(p_desc, (1 - wg) * 64 + j * 32), desc_at(v_desc, other + j * 16 * 128), 1, T{},
                  WgmmaN<256>{});
    wgmma_commit();
  }
#endif

  __device__ __forceinline__ void run() {
#if TESSERA_HAS_WGMMA
    // warp_uniform: the descriptors derived from wg then live in uniform registers.
    const int wg = warp_uniform(threadIdx.x / 128 - 1), tid = threadIdx.x - 128;
    const int lane = threadIdx.x % 32, g = lane / 4, quad = lane % 4;
    const int warp_row0 = (threadIdx.x / 32 % 4) * 16;
    const int H = p.group;
    const u64 q_desc = wgmma_desc(smem_addr(&sm.q[0][0]), 16, 1024);
    const u64 k_desc0 = desc_at(wgmma_desc(smem_addr(&sm.kv[0][0][0]), 16, 1024), wg * 32 * 128);
    const u64 v_desc0 = desc_at(wgmma_desc(smem_addr(&sm.kv[0][0][0]), kMlaSm90Keys * 128, 1024), wg * 4 * BLOCK);
    const u64 p_desc = wgmma_desc(smem_addr(sm.p), 16, 1024);
    const u32 p_addr = smem_addr(sm.p);
    RingPos<1> q_pos;
    RingPos<kMlaSm90Stages> kv_pos;
    WorkQueue<PrefillWorkItem, QueueLoad::kAhead, MlaParams> queue(p, blockIdx.x);
    grid_dependency_wait();  // before any write of o, lse or partial states
    grid_dependency_launch_dependents();
    const float scale_log2 = p.sm_scale * kLog2e;
    for (int wi = queue.begin; wi < queue.end; ++wi) {
      PrefillWorkItem w = queue.take(wi);
      w.kv_start = warp_uniform(w.kv_start);
      w.kv_end = warp_uniform(w.kv_end);
      const int b = w.request, qo_start = w.qo_begin, qo_len = w.qo_len, kv_len = w.kv_len;
      const int row0 = w.q_tile * kMlaSm90Rows;
      const int n_tiles = (w.kv_end - w.kv_start + kMlaSm90Keys - 1) / kMlaSm90Keys;
      int qo[2];
#pragma unroll
      for (int r = 0; r < 2; ++r) qo[r] = (row0 + warp_row0 + g + 8 * r) / H;
      const int causal_shift = kv_len - qo_len;
      const int warp_min_qo = (row0 + warp_row0) / H;

      float o[O_REGS];
#pragma unroll
      for (int i = 0; i < O_REGS; ++i) o[i] = 0.f;
      float m[2] = {neg_inf(), neg_inf()}, d[2] = {0.f, 0.f};
      if (n_tiles > 0) {
        mbarrier_wait(smem_addr(&pipe.q_full), q_pos.phase());
        float s[NT_S * 4];
        u32 pa[2][4];
        for (int t = 0; t < n_tiles; ++t, kv_pos = kv_pos.next()) {
          const int stage = kv_pos.index();
          mbarrier_wait(smem_addr(&pipe.kv_full[stage]), kv_pos.phase());
          int tile = stage;  // the 16-bit tile's buffer: the stage, or (fp8) the working tile
          if constexpr (kFp8) {
            tile = 0;
            named_barrier_sync(kMlaWidenBar, 256);  // both warpgroups' P V of the last tile are done
            mla_sm90_widen<T, DKV>(smem_addr(&sm.kv[0][0][0]), mla_sm90_stages(sm) + stage * (kMlaSm90Keys * kMlaDimQK),
                                   tid, p.pe_scale);
            mbarrier_arrive(smem_addr(&pipe.kv_empty[stage]));
            fence_proxy_async();  // generic stores -> the wgmmas' async proxy
            named_barrier_sync(kMlaWidenBar, 256);
          }
          issue_s(s, q_desc, desc_at(k_desc0, tile * STAGE_BYTES));
          wgmma_wait<0>();
          wgmma_keep(s);
          if (t == n_tiles - 1) mbarrier_arrive(smem_addr(&pipe.q_empty));

          // Mask: keys past the chunk, and (causal) past a row's diagonal.
          const int key0 = w.kv_start + t * kMlaSm90Keys + wg * 32;
          const int tile_last = w.kv_start + t * kMlaSm90Keys + kMlaSm90Keys - 1;
          if (tile_last >= w.kv_end || (CAUSAL && tile_last > warp_min_qo + causal_shift)) {
#pragma unroll
            for (int n = 0; n < NT_S; ++n)
#pragma unroll
              for (int e = 0; e < 4; ++e) {
                const int pos = key0 + n * 8 + quad * 2 + (e & 1);
                bool keep = pos < w.kv_end;
                if constexpr (CAUSAL) keep = keep && pos <= qo[e / 2] + causal_shift;
                if (!keep) s[n * 4 + e] = neg_inf();
              }
          }
          // Row maxima over both warpgroups' keys.
          float mx[2];
#pragma unroll
          for (int r = 0; r < 2; ++r) {
            float x = neg_inf();
#pragma unroll
            for (int n = 0; n < NT_S; ++n) x = fmaxf(x, fmaxf(s[n * 4 + 2 * r], s[n * 4 + 2 * r + 1]));
            x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
            x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
            mx[r] = x;
            if (quad == 0) ex.max[wg][warp_row0 + g + 8 * r] = x;
          }
          named_barrier_sync(kMlaMaxBar, 256);
          // A row's reference maximum moves only when the tile's exceeds it
          // by more than kSoftmaxMaxSlack (base 2; prefill_softmax_step), so
          // after a row's first tile O is rarely rescaled: 128 multiplies a
          // thread, between the softmax and P V, with the tensor cores idle.
          constexpr float kMaxSlack = kSoftmaxMaxSlack;
          float factor[2];
          bool up_any = false;
#pragma unroll
          for (int r = 0; r < 2; ++r) {
            const float x = fmaxf(mx[r], ex.max[1 - wg][warp_row0 + g + 8 * r]) * scale_log2;  // sm_scale > 0
            const bool up = x > m[r] + kMaxSlack;  // -inf + slack is -inf: the first finite logits move it
            up_any |= up;
            const float m_new = up ? x : m[r];
            const float m_safe = m_new == neg_inf() ? 0.f : m_new;  // all masked so far: weights 0, not NaN
            factor[r] = up ? fast_exp2(m[r] - m_safe) : 1.f;
            m[r] = m_new;
            float sum = 0.f;
#pragma unroll
            for (int n = 0; n < NT_S; ++n)
#pragma unroll
              for (int c = 0; c < 2; ++c) {
                float& v = s[n * 4 + 2 * r + c];
                v = fast_exp2(fmaf(v, scale_log2, -m_safe));
                sum += v;
              }
            d[r] = d[r] * factor[r] + sum;
          }
          if (__any_sync(0xffffffffu, up_any)) {  // factors of exactly 1 elsewhere: the same bits
#pragma unroll
            for (int j = 0; j < O_REGS / 4; ++j) {
              o[4 * j] *= factor[0];
              o[4 * j + 1] *= factor[0];
              o[4 * j + 2] *= factor[1];
              o[4 * j + 3] *= factor[1];
            }
          }
          pack_p<32, T>(pa, reinterpret_cast<const float(&)[NT_S][4]>(s));
          const u64 v_desc = desc_at(v_desc0, tile * STAGE_BYTES);
          issue_pv_own(o, pa, v_desc, wg);  // the tensor cores start while P goes out
          // This warpgroup's P into its half of the P tile (swizzled as an
          // A operand: 16-byte chunk c of row r at chunk c ^ (r % 8)). pa[j]
          // holds four 8 x 8 fragments, (keys 16 j, rows 0..7), (16 j, 8..15),
          // (16 j + 8, 0..7), (16 j + 8, 8..15): one stmatrix each.
#pragma unroll
          for (int j = 0; j < NT_S / 2; ++j) {
            const int m = lane / 8, row = warp_row0 + (m % 2) * 8 + lane % 8;
            const u32 chunk = static_cast<u32>(wg * 4 + 2 * j + m / 2) ^ static_cast<u32>(row & 7);
            stmatrix_x4(p_addr + row * 128 + (chunk << 4), pa[j]);
          }
          fence_proxy_async();  // generic stores -> the wgmmas' async proxy
          named_barrier_sync(kMlaPBar, 256);
          issue_pv_other(o, p_desc, v_desc, wg);
          // The stage goes back as soon as P V is done, so the producer's next
          // load is in flight while this warpgroup waits for the next tile.
          wgmma_wait<0>();
          wgmma_keep(o);
          wgmma_keep(pa);
          if constexpr (!kFp8) mbarrier_arrive(smem_addr(&pipe.kv_empty[stage]));
        }
        q_pos = q_pos.next();
      }
      epilogue(w, b, qo_start, qo_len, row0, qo, o, m, d, wg, tid, warp_row0, g, quad, wi + 1 == queue.end);
    }
#else
    __trap();  // Hopper kernels are only built for sm_90a
#endif
  }

  // Row sums of both warpgroups, then the rows (o, lse) or a partial state
  // and, for a split tile, its merge (merge_split_tile).
  __device__ __forceinline__ void epilogue(const PrefillWorkItem& w, int b, int qo_start, int qo_len, int row0,
                                           const int (&qo)[2], const float (&o)[O_REGS], const float (&m)[2],
                                           float (&d)[2], int wg, int tid, int warp_row0, int g, int quad,
                                           bool queue_ends_here) {
    const int H = p.group;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      d[r] += __shfl_xor_sync(0xffffffffu, d[r], 1);
      d[r] += __shfl_xor_sync(0xffffffffu, d[r], 2);
    }
    named_barrier_sync(kMlaMaxBar, 256);  // both warpgroups done reading the previous item's sums
#pragma unroll
    for (int r = 0; r < 2; ++r)
      if (quad == 0) ex.sum[wg][warp_row0 + g + 8 * r] = d[r];
    named_barrier_sync(kMlaMaxBar, 256);
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int tile_row = warp_row0 + g + 8 * r;
      const float dr = ex.sum[0][tile_row] + ex.sum[1][tile_row];
      if (qo[r] >= qo_len) continue;
      const int head = row0 + tile_row - qo[r] * H;
      const bool empty = dr == 0.f;
      const float inv = (empty ? 0.f : row_inverse(dr)) * p.o_scale;
      const float lse = empty ? neg_inf() : m[r] + row_log2(dr);
      const int col = wg * (kMlaDimCkv / 2) + quad * 2;
      if (w.partial_slot < 0) {
        DO* dst = static_cast<DO*>(p.o) + (qo_start + qo[r]) * p.o_stride_n + head * p.o_stride_h + col;
#pragma unroll
        for (int n = 0; n < O_REGS / 4; ++n)
          *reinterpret_cast<u32*>(dst + n * 8) = pack_pair<DO>(o[4 * n + 2 * r] * inv, o[4 * n + 2 * r + 1] * inv);
        if (wg == 0 && quad == 0 && p.lse != nullptr)
          p.lse[static_cast<i64>(qo_start + qo[r]) * p.num_qo_heads + head] = lse;
      } else {
        const i64 base = static_cast<i64>(w.partial_slot) * kMlaSm90Rows + tile_row;
        float* dst = p.partial_o + base * kMlaDimCkv + col;
#pragma unroll
        for (int n = 0; n < O_REGS / 4; ++n)
          *reinterpret_cast<float2*>(dst + n * 8) = make_float2(o[4 * n + 2 * r] * inv, o[4 * n + 2 * r + 1] * inv);
        if (wg == 0 && quad == 0) p.partial_lse[base] = lse;
      }
    }
    if (w.partial_slot >= 0) {
      MlaVariant variant(p, b, qo_len, w.kv_len);
      auto sync = [] { named_barrier_sync(kMlaMergeBar, 256); };
      merge_split_tile<MlaVariant, DO, kMlaDimCkv, kMlaSm90Rows, 256, 8>(p, variant, w, qo_start, qo_len, row0, b, 0,
                                                                         tid, &ex.is_last, sync, queue_ends_here);
    }
  }
};

#endif

}  // namespace tessera
