// Prefill (Hopper template), consumer warpgroups: each owns 64 rows of the
// CTA's query tile and runs, per work item, the FA3 schedule over the KV
// tiles the producer streams in:
//
//   S_0 = Q K_0^T; softmax_0
//   for t = 1 .. n-1:  issue S_t = Q K_t^T and O += P_{t-1} V_{t-1};
//                      wait S_t; release K_t; softmax_t (P_t, new maxima)
//                      wait O; release V_{t-1}; rescale O if a maximum moved
//   O += P_{n-1} V_{n-1}
//
// so each tile's softmax runs while the tensor cores work on the previous
// tile's P V. The softmax's row sums come from the tensor cores too (P times
// a tile of ones, issued with the next S; wgmma_row_sums), which takes one
// FADD per element off the consumers' ALU path. At long sequences the
// kernel runs at the H100's power cap (bench/power_probe.py), so work taken
// off the consumers counts more than overlap. The two consumer warpgroups
// run their steps independently: a
// warpgroup's 64 x 128 x 16 wgmmas take ~130 cycles each whether or not the
// other warpgroup's run beside them, so the tensor cores only fill when both
// issue at once, and a ping-pong turn (one warpgroup's GEMMs at a time) would
// cap the step at twice one warpgroup's GEMM time (it measured 2.7-6.7%
// slower). The step is one warpgroup's GEMMs plus its softmax and waits, so
// those are what to shorten: the next K and V barriers are probed during the
// softmax (each wait cost ~170 cycles even when the tile had landed). The
// epilogue is shared with the FA2 template.
#pragma once
#include "tessera/device/arch/grid_dependency.cuh"
#include "tessera/device/arch/warp.cuh"
#include "tessera/device/arch/warpgroup.cuh"
#include "tessera/device/arch/cluster.cuh"
#include "tessera/device/kernels/common/cooperative_merge.cuh"
#include "tessera/device/kernels/prefill_sm90/mma.cuh"
#include "tessera/device/kernels/prefill_sm90/pipeline.cuh"
#include "tessera/device/kernels/common/tiles.cuh"

namespace tessera {

#if defined(__CUDACC__) || defined(__CUDACC_RTC__)

// kRunScale: the softmax and output scales are read when the kernel runs
// (read_run_scales: an fp8 cache's k_scale / v_scale tensors folded in).
// FP8_MMA (fp8 caches of DKV, PrefillOptions::fp8_mma): both GEMMs on fp8
// tensor cores. Each item's Q tile is quantized to two e4m3 tiles, q's
// rounding and the rounding's residual (S takes both: q keeps about 7
// significant bits, where one e4m3 tile's 4 put the logits' error above
// the P V rounding's), one factor per warp's 16 rows (folded into their
// softmax scale); P is packed as e4m3 scaled by 2^8 (small weights keep
// their bits; d and the output scale take the 2^-8 back); K and V^T come as
// fp8 stages from the producer.
template <typename Variant, typename T, typename DO, int HEAD_DIM, int CTA_Q, int CTA_KV, typename Rings, int CLUSTER,
          bool kRunScale, typename DKV, bool FP8_MMA, typename Params>
struct Sm90Consumer {
  static constexpr int CONSUMERS = CTA_Q / 64, THREADS = 128 * CONSUMERS;
  static constexpr int NT_S = CTA_KV / 8, NT_O = HEAD_DIM / 8;
  using Traits = VariantTraits<Variant, Params>;
  // Softmax row sums on the tensor cores (P times ones, wgmma_row_sums,
  // those of P_{t-1} issued just ahead of S_t) instead of one FADD per
  // element, for fp16 P only: they sum the rounded weights, and bf16's
  // 8-bit mantissa put LSE ~1e-3 off (fp8 P's 4 bits: 2.5e-2 off, for 1-3%
  // of the fp8 kernel's time). Not at head dim 256, whose 128 O registers
  // per thread leave no room (spills).
  static constexpr bool kTcSums = Variant::use_softmax && HEAD_DIM <= 128 && is_fp16<T> && !FP8_MMA;
  static constexpr int kPExp2 = FP8_MMA ? 8 : 0;  // P's scale, 2^kPExp2
  // Row maxima kept until a tile's exceeds them by 2^8 (prefill_softmax_step),
  // so O's rescale leaves the path from P_{t-1} V_{t-1} to P_t; fp8 P keeps
  // exact maxima.
  static constexpr int kMaxSlack = FP8_MMA ? 0 : kSoftmaxMaxSlack;

  const Params& p;
  Sm90Pipeline<Rings>& pipe;
  T* q_smem;  // [Q_BUFS][CTA_Q * HEAD_DIM]
  T* k_smem;  // [K_STAGES][CTA_KV * HEAD_DIM]
  T* v_smem;  // [V_STAGES][CTA_KV * HEAD_DIM]
  u32 q8;     // FP8_MMA: the quantized Q tiles' shared address (Q_hi, then Q_lo: CTA_Q rows of HEAD_DIM bytes each)
  int wg;         // consumer warpgroup: rows wg * 64 .. wg * 64 + 63 of the query tile
  int tid;        // 0 .. THREADS - 1 over all consumers
  int warp_row0;  // first tile row of this warp
  int rank;       // in the cluster (its half of each item's 2 * CTA_Q rows alternates)
  u32 peer_bars;  // CLUSTER > 1: the peer CTA's pipeline barriers (cluster window)

  __device__ __forceinline__ Sm90Consumer(const Params& p_, Sm90Pipeline<Rings>& pipe_, T* q, T* k, T* v, u8* q8_)
      : p(p_), pipe(pipe_), q_smem(q), k_smem(k), v_smem(v), q8(smem_addr(q8_)), wg(threadIdx.x / 128 - 1),
        tid(threadIdx.x - 128),
        warp_row0(wg * 64 + (threadIdx.x / 32 % 4) * 16), rank(CLUSTER > 1 ? cluster_rank() : 0),
        peer_bars(CLUSTER > 1 ? cluster_map(smem_addr(&pipe_), 1 - rank) : 0) {}

  // Done reading a K or V stage (`bar` its empty barrier): alone, every
  // thread arrives; in a pair both CTAs' producers copy into it, so one lane
  // per warp tells this CTA's barrier and the peer's.
  __device__ __forceinline__ void release_kv(u32 bar, const Sm90Barriers<Rings>& bars) const {
    if constexpr (CLUSTER == 1) {
      mbarrier_arrive(bar);
    } else {
      __syncwarp();
      if (threadIdx.x % 32 == 0) {
        mbarrier_arrive(bar);
        mbarrier_arrive_cluster(peer_bars + (bar - bars.base));
      }
    }
  }

  // FP8_MMA: this warp's 16 rows of the 16-bit Q tile as e4m3 in the fp8 Q
  // tiles (128-byte rows, 128-byte swizzle: Q_hi, the rounding of q, and
  // Q_lo, of its residual), scaled so that the largest |q|
  // of the warp's valid rows maps to 448 (at most x 16384, which fp16 holds:
  // smaller values would be subnormal in e4m3 anyway); returns the factor
  // (q = q8 x factor). Lane l converts half l % 2 of row l / 2. fp16 q is
  // scaled and converted as f16x2 pairs (two instructions a pair); the
  // maximum is an integer maximum of the 16-bit magnitudes, whose bit order
  // is their order as numbers.
  __device__ __forceinline__ float quantize_q(const T* q_tile, int lane, bool row_valid) const {
    constexpr int CH = HEAD_DIM / 16;  // 16-bit chunks in half a row
    const int r = warp_row0 + lane / 2, h = lane % 2;
    const u32 src = smem_addr(q_tile);
    uint4 x[CH];
    u32 m2 = 0;
#pragma unroll
    for (int i = 0; i < CH; ++i) {
      x[i] = ld_shared_16(src + Swizzle128<HEAD_DIM, CTA_Q>::at(r, h * CH + i) * 2);
      const u32 w[4] = {x[i].x, x[i].y, x[i].z, x[i].w};
#pragma unroll
      for (int j = 0; j < 4; ++j) asm("max.u16x2 %0, %0, %1;" : "+r"(m2) : "r"(w[j] & 0x7fff7fffu));
    }
    float lo, hi;
    unpack2(m2, lo, hi, T{});
    // A NaN (the largest bit patterns) must not set the scale of the warp's other rows.
    float amax = row_valid ? fminf(fmaxf(lo, hi), 65504.f) : 0.f;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    float inv = amax > 0.f ? fminf(448.f / amax, 16384.f) : 1.f;
    u32 inv2 = 0;
    if constexpr (is_fp16<T>) {
      inv2 = pack2(inv, inv, T{});
      unpack2(inv2, inv, lo, T{});  // the factor is the rounded scale's inverse
    }
#pragma unroll
    for (int k = 0; k < CH / 2; ++k) {
      const u32 w[8] = {x[2 * k].x,     x[2 * k].y,     x[2 * k].z,     x[2 * k].w,
                        x[2 * k + 1].x, x[2 * k + 1].y, x[2 * k + 1].z, x[2 * k + 1].w};
      u32 hi[4], lo[4];
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        u32 pair_hi[2], pair_lo[2];
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          if constexpr (is_fp16<T>) {  // t - back is exact in f16 (back: t rounded to 4 significant bits)
            u32 t, back, res;
            u16 b, c;
            asm("mul.rn.f16x2 %0, %1, %2;" : "=r"(t) : "r"(w[2 * j + e]), "r"(inv2));
            asm("cvt.rn.satfinite.e4m3x2.f16x2 %0, %1;" : "=h"(b) : "r"(t));
            asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(back) : "h"(b));
            asm("sub.rn.f16x2 %0, %1, %2;" : "=r"(res) : "r"(t), "r"(back));
            asm("cvt.rn.satfinite.e4m3x2.f16x2 %0, %1;" : "=h"(c) : "r"(res));
            pair_hi[e] = b;
            pair_lo[e] = c;
          } else {
            float a, c;
            unpack2(w[2 * j + e], a, c, T{});
            a *= inv;
            c *= inv;
            pair_hi[e] = float_to_fp8x2<fp8_e4m3_t>(a, c);
            float back[4];
            fp8x4_to_float<fp8_e4m3_t>(pair_hi[e], back);
            pair_lo[e] = float_to_fp8x2<fp8_e4m3_t>(a - back[0], c - back[1]);
          }
        }
        hi[j] = pair_hi[0] | (pair_hi[1] << 16);
        lo[j] = pair_lo[0] | (pair_lo[1] << 16);
      }
      const int c8 = h * (CH / 2) + k;  // 16-byte chunk of the 128-byte row
      const u32 at = q8 + r * 128 + ((c8 ^ (r & 7)) << 4);
      st_shared_16(at, make_uint4(hi[0], hi[1], hi[2], hi[3]));
      st_shared_16(at + CTA_Q * HEAD_DIM, make_uint4(lo[0], lo[1], lo[2], lo[3]));
    }
    return 1.f / inv;
  }

  __device__ __forceinline__ void run() {
#if TESSERA_HAS_WGMMA
    using Gemms = Sm90Gemms<FP8_MMA, T, DKV, HEAD_DIM, CTA_KV, CTA_Q * 128>;
    __shared__ int s_is_last;
    const int lane = threadIdx.x % 32, g = lane / 4, quad = lane % 4;
    u64 ones_desc = 0;
    if constexpr (kTcSums) {  // only kernels that use it allocate it
      __shared__ __align__(1024) u16 s_ones[512];  // B operand of the row sums: a kilobyte of 1.0
      const u16 one = from_float<T>(1.f).bits;
      for (int i = tid; i < 512; i += THREADS) s_ones[i] = one;
      fence_proxy_async();  // generic stores -> the wgmmas' async proxy
      named_barrier_sync(kSm90ConsumersBar, THREADS);
      ones_desc = wgmma_desc(smem_addr(s_ones), 16, 1024);
    }
    const Sm90Barriers<Rings> bars(pipe);
    // Descriptors of the first Q buffer and the first K and V stages; the
    // loop offsets them (desc_at).
    const u64 q_desc0 = wgmma_desc(smem_addr(q_smem), 16, 1024);
    const u64 k_desc0 = wgmma_desc(smem_addr(k_smem), 16, 1024);
    const u64 v_desc0 = Gemms::v_desc(smem_addr(v_smem));
    RingPos<Rings::Q_BUFS> q_pos;
    RingPos<Rings::K_STAGES> kv_pos;  // K ring; V uses the same count in its own ring
    using VPos = RingPos<Rings::V_STAGES>;
    // Work items come a step ahead (the next from work_items during this
    // item's tiles; the first beside work_indptr) and carry their request's
    // bounds, so an item starts without dependent global loads (they cost
    // 0.7-2.7k cycles per item).
    // A cluster's CTAs share one work queue.
    WorkQueue<PrefillWorkItem, QueueLoad::kAhead, Params> queue(p, static_cast<int>(blockIdx.x / CLUSTER));
    const int wi0 = queue.begin, wi_end = queue.end;
    // Before any read of the variant's tensors or write of o, lse, partial
    // states; behind another level of this attention, before each epilogue.
    if (!p.defer_grid_wait) grid_dependency_wait();
    const device::RunScales run =
        kRunScale ? device::read_run_scales(p) : device::RunScales{p.sm_scale, p.o_scale};
    // Every thread signals (some runtimes want all of a CTA's threads); the
    // producer's signal, after its last copy, is the one that counts.
    grid_dependency_launch_dependents();
    for (int wi = wi0; wi < wi_end; ++wi) {
      PrefillWorkItem w = queue.take(wi);
      // Equal in every lane already; broadcasting makes ptxas see it, so the
      // tile loop's control and ring positions are warp-uniform.
      w.kv_start = warp_uniform(w.kv_start);
      w.kv_end = warp_uniform(w.kv_end);
      const int b = item_request(p, w), kv_head = item_kv_head(p, w);
      const int qo_start = w.qo_begin, qo_len = w.qo_len, kv_len = w.kv_len;
      // A pair's CTAs swap halves every item, so neither always gets the
      // half that sees one KV tile more (causal): the rings absorb the
      // difference instead of one CTA waiting for the other every item.
      const int half = CLUSTER > 1 ? rank ^ ((wi - wi0) & 1) : 0;
      const int row0 = (w.q_tile * CLUSTER + half) * CTA_Q;  // first fused row of this CTA's tile
      const int n_tiles = (w.kv_end - w.kv_start + CTA_KV - 1) / CTA_KV;
      // Tiles this warpgroup computes. In a pair: none without a valid row,
      // and under a causal mask none past its last row's diagonal (the lower
      // half's last tile). Skipped tiles are only waited for and released:
      // their P would be 0 and O unchanged, bit for bit. (Alone, the planner
      // leaves no such tiles worth the registers: at head dim 256 the check
      // made ptxas spill.)
      int n_comp = n_tiles;
      if constexpr (CLUSTER > 1) {
        const int first_qo = (row0 + wg * 64) / p.group, last_qo = min((row0 + wg * 64 + 63) / p.group, qo_len - 1);
        if (first_qo >= qo_len) {
          n_comp = 0;
        } else if constexpr (Variant::causal) {
          const int seen = diagonal_key(last_qo, qo_len, kv_len) + 1 - w.kv_start;  // keys of the chunk it may see
          n_comp = seen <= 0 ? 0 : min(n_tiles, (seen + CTA_KV - 1) / CTA_KV);
        }
        n_comp = warp_uniform(n_comp);
      }
      Variant variant(p, b, qo_len, kv_len);

      RowInfo<1> rows;
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int f = row0 + warp_row0 + g + 8 * r;
        rows.qo_idx[0][r] = f / p.group;
        rows.head[0][r] = kv_head * p.group + f % p.group;
        rows.valid[0][r] = rows.qo_idx[0][r] < qo_len;
      }
      // Per-warp facts for skipping masks on interior tiles (warp-uniform).
      const int causal_shift = kv_len - qo_len;
      const bool warp_rows_valid = (row0 + warp_row0 + 15) / p.group < qo_len;
      const int warp_min_qo = (row0 + warp_row0) / p.group, warp_max_qo = (row0 + warp_row0 + 15) / p.group;
      auto masked = [&](int t) {
        const int first = w.kv_start + t * CTA_KV;
        return tile_needs_mask<Variant, Params, MaskBits<Variant, Params, 1, NT_S>::kUsed>(
            first, first + CTA_KV - 1, w.kv_end, warp_rows_valid, warp_min_qo, warp_max_qo, causal_shift);
      };

      PrefillState<1, NT_O> st;
      st.init();
      float dsum[4] = {0.f, 0.f, 0.f, 0.f};  // kTcSums: rows g (dsum[0]) and g + 8 (dsum[2])
      if (n_tiles > 0) {
        const int qb = q_pos.index();
        T* q_tile = q_smem + qb * (CTA_Q * HEAD_DIM);
        mbarrier_wait(bars.q_full(qb), q_pos.phase());
        if constexpr (Traits::query_transform) {
          transform_q_tile<Variant, HEAD_DIM, CTA_Q, Swizzle128>(variant, p, q_tile, threadIdx.x % 128, 128, wg * 64,
                                                                 wg * 64 + 64, b, row0, p.group, kv_head, qo_len);
          fence_proxy_async();
          named_barrier_sync(kSm90QueryBar + wg, 128);
        }
        // fp8: the quantized tile is this item's Q, so the 16-bit buffer
        // goes back to the producer at once.
        float item_sm_scale = run.sm_scale;
        if constexpr (FP8_MMA) {
          item_sm_scale *= quantize_q(q_tile, lane, (row0 + warp_row0 + lane / 2) / p.group < qo_len);
          fence_proxy_async();
          named_barrier_sync(kSm90QueryBar + wg, 128);
          mbarrier_arrive(bars.q_empty(qb));
        }
        auto uni = [](u64 d) { return (d >> 32 << 32) | static_cast<u32>(warp_uniform(static_cast<int>(d))); };
        const u64 q_desc = FP8_MMA ? uni(wgmma_desc(q8 + wg * (64 * 128), 16, 1024))
                                   : uni(desc_at(q_desc0, qb * (CTA_Q * HEAD_DIM * 2) + wg * (64 * 128)));
        auto k_at = [&](int stage) { return uni(desc_at(k_desc0, stage * Gemms::kKvTileBytes)); };
        auto v_at = [&](int stage) { return uni(desc_at(v_desc0, stage * Gemms::kKvTileBytes)); };
        float s[NT_S][4];
        float(&sf)[NT_S * 4] = reinterpret_cast<float(&)[NT_S * 4]>(s);
        float(&of)[NT_O * 4] = reinterpret_cast<float(&)[NT_O * 4]>(st.o[0]);
        float(&s2)[1][NT_S][4] = reinterpret_cast<float(&)[1][NT_S][4]>(s);
        typename Gemms::PFrag pa;
        float scale[1][2];
        MaskBits<Variant, Params, 1, NT_S> mask_bits;  // LogitsMaskBits variants: a tile's words

        RingPos<Rings::K_STAGES> cur = kv_pos;
        if (n_comp > 0) {
          // Tile 0: S, softmax (O is still zero: nothing to rescale).
          mbarrier_wait(bars.k_full(cur.index()), cur.phase());
          Gemms::qk(sf, q_desc, k_at(cur.index()));
          wgmma_commit();
          mask_bits.load(p, variant, rows, w.kv_start + quad * 2, b, kv_head);  // in flight with S
          wgmma_wait<0>();
          wgmma_keep(sf);
          release_kv(bars.k_empty(cur.index()), bars);
          if (!FP8_MMA && n_comp == 1) mbarrier_arrive(bars.q_empty(qb));
          prefill_softmax_step<Variant, !kTcSums, kRunScale, kPExp2, kMaxSlack>(
              p, variant, st, rows, s2, w.kv_start + quad * 2, w.kv_end, b, kv_head, masked(0), causal_shift, scale,
              &mask_bits, item_sm_scale);
          Gemms::pack(pa, s);

          bool k_ready = false, v_ready = false;  // probes of the next step's barriers
          for (int t = 1; t < n_comp; ++t) {
            const VPos prev{cur.count};
            cur = cur.next();
            if (!k_ready) mbarrier_wait(bars.k_full(cur.index()), cur.phase());
            // Row sums of P_{t-1} (kTcSums) ride in S_t's group: done when S_t
            // is, so a raised maximum rescales them right after the softmax.
            // (Issued with P V instead, they lengthened the step's last wait:
            // 1k-4k 2-7% slower.)
            if constexpr (kTcSums) {
              wgmma_fence();
              wgmma_row_sums<CTA_KV, T>(dsum, pa, ones_desc);
            }
            Gemms::qk(sf, q_desc, k_at(cur.index()));
            wgmma_commit();
            if (!v_ready) mbarrier_wait(bars.v_full(prev.index()), prev.phase());
            Gemms::pv(of, pa, v_at(prev.index()));
            wgmma_commit();
            mask_bits.load(p, variant, rows, w.kv_start + t * CTA_KV + quad * 2, b, kv_head);  // in flight with S_t
            wgmma_wait<1>();  // S_t (the older group) is done, and the row sums of P_{t-1}
            wgmma_keep(sf);
            wgmma_keep(dsum);
            release_kv(bars.k_empty(cur.index()), bars);
            if (!FP8_MMA && t == n_comp - 1) mbarrier_arrive(bars.q_empty(qb));
            const bool raised = prefill_softmax_step<Variant, !kTcSums, kRunScale, kPExp2, kMaxSlack>(
                p, variant, st, rows, s2, w.kv_start + t * CTA_KV + quad * 2, w.kv_end, b, kv_head, masked(t),
                causal_shift, scale, &mask_bits, item_sm_scale);
            if constexpr (kTcSums) {
              if (raised) {  // rows g and g + 8 (dsum[1] and [3] are unused copies)
                dsum[0] *= scale[0][0];
                dsum[2] *= scale[0][1];
              }
            }
            wgmma_keep(sf);  // the softmax stays above the wait, overlapping P_{t-1} V_{t-1}
            wgmma_keep(scale);
            wgmma_keep(st.d);
            const RingPos<Rings::K_STAGES> next_k = cur.next();  // K_{t+1}
            const VPos next_v{cur.count};                          // V_t
            k_ready = __all_sync(0xffffffffu, mbarrier_test(bars.k_full(next_k.index()), next_k.phase()));
            v_ready = __all_sync(0xffffffffu, mbarrier_test(bars.v_full(next_v.index()), next_v.phase()));
            // Wait for O += P_{t-1} V_{t-1}: O may then be rescaled, pa
            // rewritten and V released. The wait sits in both arms of the
            // (warp-uniform) branch so that ptxas, which schedules freely
            // within a basic block, cannot sink the softmax below it.
            if (raised) {
              wgmma_wait<0>();
              wgmma_keep(of);
              prefill_rescale_o(st, scale);
            } else {
              wgmma_wait<0>();
              wgmma_keep(of);
            }
            // With the wait inside the branch, ptxas keeps the registers the
            // P V wgmma reads untouched until here (SASS: no early wait).
            Gemms::pack(pa, s);
            // V's release comes last: ptxas hoists a wait together with a
            // shared-memory arrive that follows it, and an early release here
            // dragged the wait above the softmax.
            release_kv(bars.v_empty(prev.index()), bars);
          }
          const VPos last{cur.count};
          mbarrier_wait(bars.v_full(last.index()), last.phase());
          Gemms::pv(of, pa, v_at(last.index()));
          if constexpr (kTcSums) wgmma_row_sums<CTA_KV, T>(dsum, pa, ones_desc);  // P_{n-1}'s
          wgmma_commit();
          wgmma_wait<0>();
          wgmma_keep(of);
          wgmma_keep(dsum);
          wgmma_keep(pa);
          release_kv(bars.v_empty(last.index()), bars);
          cur = cur.next();
        } else if (!FP8_MMA) {
          mbarrier_arrive(bars.q_empty(qb));
        }
        for (int t = n_comp; t < n_tiles; ++t, cur = cur.next()) {  // skipped tiles: landed, then released
          mbarrier_wait(bars.k_full(cur.index()), cur.phase());
          release_kv(bars.k_empty(cur.index()), bars);
          const VPos v{cur.count};
          mbarrier_wait(bars.v_full(v.index()), v.phase());
          release_kv(bars.v_empty(v.index()), bars);
        }
        kv_pos = cur;
        q_pos = q_pos.next();
      }

      if constexpr (kTcSums) {
        st.d[0][0] = dsum[0];  // whole rows already
        st.d[0][1] = dsum[2];
      } else {
        prefill_sum_quads(st);
      }
      constexpr float kPUnscale = 1.f / static_cast<float>(1 << kPExp2);  // O and d held P x 2^kPExp2
      if constexpr (kPExp2 != 0) {
        st.d[0][0] *= kPUnscale;
        st.d[0][1] *= kPUnscale;
      }
      if (p.defer_grid_wait) grid_dependency_wait();  // returns at once after the first
      prefill_store_rows<Variant, DO, HEAD_DIM, CTA_Q, CLUSTER>(p, variant, st, rows, w, qo_start, b, kv_head,
                                                                warp_row0, run.o_scale * kPUnscale, half);
      if (w.partial_slot >= 0)
        merge_split_tile<Variant, DO, HEAD_DIM, CTA_Q, THREADS, 8, CLUSTER>(
            p, variant, w, qo_start, qo_len, row0, b, kv_head, tid, &s_is_last,
            [] { named_barrier_sync(kSm90ConsumersBar, THREADS); }, wi == wi_end - 1, half);
    }
#else
    __trap();  // Hopper kernels are only built for sm_90a
#endif
  }
};

#endif

}  // namespace tessera
