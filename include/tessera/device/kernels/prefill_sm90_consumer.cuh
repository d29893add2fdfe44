// Prefill (Hopper template), consumer warpgroups: each owns 64 rows of the
// CTA's query tile and runs, per work item, the FA3 schedule over the KV
// tiles the producer streams in:
//
//   S_0 = Q K_0^T; softmax_0
//   for t = 1 .. n-1:  issue S_t = Q K_t^T and O += P_{t-1} V_{t-1};
//                      wait S_t; release K_t; softmax_t (P_t, new maxima)
//                      wait O; release V_{t-1}; rescale O if a maximum rose
//   O += P_{n-1} V_{n-1}
//
// so each tile's softmax runs while the tensor cores work on the previous
// tile's P V. The pipeline runs across work items too: the first tile of the
// next item is issued with the last P V of the current one, and the current
// item's epilogue runs once that P V is done, so short items (short
// sequences, chunked prefill) do not pay a serial first tile and drain each.
// With two consumer warpgroups, named barriers can make them take turns
// issuing GEMMs (ping-pong, TESSERA_SM90_PINGPONG). The epilogue is shared
// with the FA2 template.
#pragma once
#include "tessera/device/arch/warpgroup.cuh"
#include "tessera/device/kernels/prefill_epilogue.cuh"
#include "tessera/device/kernels/prefill_sm90_mma.cuh"
#include "tessera/device/kernels/prefill_sm90_pipeline.cuh"
#include "tessera/device/kernels/prefill_tiles.cuh"

// Switches for experiments (TESSERA_SM90_DEFINES at JIT time).
#ifndef TESSERA_SM90_PINGPONG
#define TESSERA_SM90_PINGPONG 1
#endif

namespace tessera {

#if defined(__CUDACC__) || defined(__CUDACC_RTC__)

template <typename Variant, typename T, typename DO, int HEAD_DIM, int CTA_Q, int CTA_KV, int STAGES, typename Params>
struct Sm90Consumer {
  static constexpr int CONSUMERS = CTA_Q / 64, THREADS = 128 * CONSUMERS;
  static constexpr int NT_S = CTA_KV / 8, NT_O = HEAD_DIM / 8;
  using Traits = VariantTraits<Variant, Params>;
  using State = PrefillState<1, NT_O>;

  // A work item as the consumers need it.
  struct Item {
    PrefillWorkItem w;
    int qo_start, qo_len, kv_len, n_tiles;
  };
  // The rows this thread owns in an item, and the warp's facts for skipping
  // masks on interior tiles (warp-uniform).
  struct Rows {
    RowInfo<1> info;
    int causal_shift, warp_min_qo;
    bool warp_rows_valid;
  };

  const Params& p;
  Sm90Pipeline<STAGES>& pipe;
  T* q_smem;  // [2][CTA_Q * HEAD_DIM]
  T* k_smem;  // [STAGES][CTA_KV * HEAD_DIM]
  T* v_smem;
  int wg;         // consumer warpgroup: rows wg * 64 .. wg * 64 + 63 of the query tile
  int tid;        // 0 .. THREADS - 1 over all consumers
  int warp_row0;  // first tile row of this warp

  __device__ __forceinline__ Sm90Consumer(const Params& p_, Sm90Pipeline<STAGES>& pipe_, T* q, T* k, T* v)
      : p(p_), pipe(pipe_), q_smem(q), k_smem(k), v_smem(v), wg(threadIdx.x / 128 - 1), tid(threadIdx.x - 128),
        warp_row0(wg * 64 + (threadIdx.x / 32 % 4) * 16) {}

  // Ping-pong: wait for this warpgroup's turn to issue GEMMs / hand it over.
  static constexpr bool kPingPong = CONSUMERS == 2 && TESSERA_SM90_PINGPONG;
  __device__ __forceinline__ void take_turn() const {
    if constexpr (kPingPong) named_barrier_sync(kSm90PingPongBar + wg, 256);
  }
  __device__ __forceinline__ void pass_turn() const {
    if constexpr (kPingPong) named_barrier_arrive(kSm90PingPongBar + (1 - wg), 256);
  }

  __device__ __forceinline__ Item load_item(int wi) const {
    Item it;
    it.w = p.work_items[wi];
    it.qo_start = p.qo_indptr[it.w.request];
    it.qo_len = p.qo_indptr[it.w.request + 1] - it.qo_start;
    it.kv_len = device::kv_len(p.kv, it.w.request);
    it.n_tiles = (it.w.kv_end - it.w.kv_start + CTA_KV - 1) / CTA_KV;
    return it;
  }

  __device__ __forceinline__ Rows rows_of(const Item& it) const {
    const int kv_head = blockIdx.y, g = threadIdx.x % 32 / 4, row0 = it.w.q_tile * CTA_Q;
    Rows r;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int f = row0 + warp_row0 + g + 8 * h;
      r.info.qo_idx[0][h] = f / p.group;
      r.info.head[0][h] = kv_head * p.group + f % p.group;
      r.info.valid[0][h] = r.info.qo_idx[0][h] < it.qo_len;
    }
    r.causal_shift = it.kv_len - it.qo_len;
    r.warp_rows_valid = (row0 + warp_row0 + 15) / p.group < it.qo_len;
    r.warp_min_qo = (row0 + warp_row0) / p.group;
    return r;
  }

  // Softmax step of tile t of `it` on S held in s (returns whether a row
  // maximum of the warp rose).
  template <typename St>
  __device__ __forceinline__ bool softmax(const Item& it, const Rows& r, int t, St& st, float (&s)[1][NT_S][4],
                                          float (&scale)[1][2]) const {
    const Variant variant(p, it.w.request, it.qo_len, it.kv_len);
    const int tile_start = it.w.kv_start + t * CTA_KV, tile_last = tile_start + CTA_KV - 1;
    const bool masked = Traits::logits_mask || !r.warp_rows_valid || tile_last >= it.w.kv_end ||
                        (Variant::causal && tile_last > r.warp_min_qo + r.causal_shift);
    return prefill_softmax_step<Variant>(p, variant, st, r.info, s, tile_start + (threadIdx.x % 4) * 2, it.w.kv_end,
                                         it.w.request, blockIdx.y, masked, r.causal_shift, scale);
  }

  // Writes a finished item from its state (output or partial; the last
  // chunk of a split tile merges them).
  __device__ __forceinline__ void finish(const Item& it, State& st) const {
    __shared__ int s_is_last;
    const Variant variant(p, it.w.request, it.qo_len, it.kv_len);
    const Rows r = rows_of(it);
    prefill_sum_quads(st);
    prefill_store_rows<Variant, DO, HEAD_DIM, CTA_Q>(p, variant, st, r.info, it.w, it.qo_start, it.w.request,
                                                     blockIdx.y, warp_row0);
    if (it.w.partial_slot >= 0)
      prefill_merge_split<Variant, DO, HEAD_DIM, CTA_Q>(p, variant, it.w, it.qo_start, it.qo_len, it.w.q_tile * CTA_Q,
                                                        it.w.request, blockIdx.y, tid, THREADS, &s_is_last,
                                                        [] { named_barrier_sync(kSm90ConsumersBar, THREADS); });
  }

  // Waits for the Q tile of `it` in buffer `qb`, applies the variant's query
  // transform to this warpgroup's rows, and returns their descriptor.
  __device__ __forceinline__ u64 take_q(const Item& it, const Sm90Barriers<STAGES>& bars, RingPos<2> qb,
                                        u64 q_desc0) const {
    T* q_tile = q_smem + qb.index() * (CTA_Q * HEAD_DIM);
    mbarrier_wait(bars.q_full(qb.index()), qb.phase());
    if constexpr (Traits::query_transform) {
      const Variant variant(p, it.w.request, it.qo_len, it.kv_len);
      const int row0 = it.w.q_tile * CTA_Q, kv_head = blockIdx.y;
      transform_rows<HEAD_DIM, CTA_Q, Swizzle128>(q_tile, wg * 64, wg * 64 + 64, threadIdx.x % 128, 128,
                                                  [&](int r, int col, float x) {
                                                    const int f = row0 + r;
                                                    return variant.QueryTransform(p, x, it.w.request, f / p.group,
                                                                                  kv_head * p.group + f % p.group, col);
                                                  });
      fence_proxy_async();
      named_barrier_sync(kSm90QueryBar + wg, 128);
    }
    return desc_at(q_desc0, qb.index() * (CTA_Q * HEAD_DIM * 2) + wg * (64 * 128));
  }

  __device__ __forceinline__ void run() {
#if TESSERA_HAS_WGMMA
    if (wg == 1) pass_turn();  // warpgroup 0 goes first
    const Sm90Barriers<STAGES> bars(pipe);
    // Descriptors of the first Q buffer and the first K and V stages; the
    // loop offsets them (desc_at).
    const u64 q_desc0 = wgmma_desc(smem_addr(q_smem), 16, 1024);
    const u64 k_desc0 = wgmma_desc(smem_addr(k_smem), 16, 1024);
    const u64 v_desc0 = wgmma_desc(smem_addr(v_smem), CTA_KV * 128, 1024);
    auto k_at = [&](RingPos<STAGES> pos) { return desc_at(k_desc0, pos.index() * (CTA_KV * HEAD_DIM * 2)); };
    auto v_at = [&](RingPos<STAGES> pos) { return desc_at(v_desc0, pos.index() * (CTA_KV * HEAD_DIM * 2)); };

    // Items in queue order; those without KV tiles (empty requests) are
    // written at once (o = 0, lse = -inf) and skipped.
    int wi = p.work_indptr[blockIdx.x];
    const int wi_end = p.work_indptr[blockIdx.x + 1];
    auto next_item = [&](Item& it) {
      while (wi < wi_end) {
        it = load_item(wi++);
        if (it.n_tiles > 0) return true;
        State empty;
        empty.init();
        finish(it, empty);
      }
      return false;
    };

    Item cur;
    if (next_item(cur)) {
      State st;
      st.init();
      Rows rows = rows_of(cur);
      float s[NT_S][4];
      float(&sf)[NT_S * 4] = reinterpret_cast<float(&)[NT_S * 4]>(s);
      float(&s2)[1][NT_S][4] = reinterpret_cast<float(&)[1][NT_S][4]>(s);
      float(&of)[NT_O * 4] = reinterpret_cast<float(&)[NT_O * 4]>(st.o[0]);
      u32 pa[CTA_KV / 16][4];
      float scale[1][2];
      RingPos<2> qb;
      RingPos<STAGES> kpos;
      u64 q_desc = take_q(cur, bars, qb, q_desc0);

      // The very first tile: S, softmax (O is still zero: nothing to rescale).
      mbarrier_wait(bars.k_full(kpos.index()), kpos.phase());
      wgmma_qk<CTA_KV, HEAD_DIM, CTA_Q * 128, T>(sf, q_desc, k_at(kpos));
      wgmma_commit();
      wgmma_wait<0>();
      wgmma_keep(sf);
      mbarrier_arrive(bars.k_empty(kpos.index()));
      if (cur.n_tiles == 1) mbarrier_arrive(bars.q_empty(qb.index()));
      softmax(cur, rows, 0, st, s2, scale);
      pack_p<CTA_KV, T>(pa, s);

      for (int t = 1;; ++t) {
        // Tile t of cur, or tile 0 of the next item.
        const bool boundary = t == cur.n_tiles;
        Item nxt;
        if (boundary) {
          if (!next_item(nxt)) break;
          qb = qb.next();
          q_desc = take_q(nxt, bars, qb, q_desc0);
        }
        const RingPos<STAGES> prev = kpos;
        kpos = kpos.next();
        mbarrier_wait(bars.k_full(kpos.index()), kpos.phase());
        take_turn();
        wgmma_qk<CTA_KV, HEAD_DIM, CTA_Q * 128, T>(sf, q_desc, k_at(kpos));
        wgmma_commit();
        mbarrier_wait(bars.v_full(prev.index()), prev.phase());
        wgmma_pv<CTA_KV, HEAD_DIM, T>(of, pa, v_at(prev));
        wgmma_commit();
        pass_turn();
        wgmma_wait<1>();  // S (the older group) is done
        wgmma_keep(sf);
        mbarrier_arrive(bars.k_empty(kpos.index()));
        if (boundary ? nxt.n_tiles == 1 : t == cur.n_tiles - 1) mbarrier_arrive(bars.q_empty(qb.index()));
        if (!boundary) {
          const bool raised = softmax(cur, rows, t, st, s2, scale);
          wgmma_keep(sf);  // the softmax stays above the wait, overlapping P_{t-1} V_{t-1}
          wgmma_keep(scale);
          wgmma_keep(st.d);
          // Wait for O += P_{t-1} V_{t-1}: O may then be rescaled and pa
          // rewritten. The wait sits in both arms of the (warp-uniform)
          // branch so that ptxas, which schedules freely within a basic
          // block, cannot sink the softmax below it (it did: SASS).
          if (raised) {
            wgmma_wait<0>();
            wgmma_keep(of);
            prefill_rescale_o(st, scale);
          } else {
            wgmma_wait<0>();
            wgmma_keep(of);
          }
        } else {
          // The next item's first tile on fresh statistics, then the
          // current item's epilogue once its last P V is done.
          const Rows next_rows = rows_of(nxt);
          RowStats<1> fresh;
          fresh.init();
          softmax(nxt, next_rows, 0, fresh, s2, scale);
          wgmma_keep(sf);
          wgmma_keep(fresh.d);
          if (fresh.m[0][0] == fresh.m[0][0]) {  // always (a branch, as above)
            wgmma_wait<0>();
            wgmma_keep(of);
          } else {
            wgmma_wait<0>();
            wgmma_keep(of);
          }
          finish(cur, st);
          st.init();
#pragma unroll
          for (int h = 0; h < 2; ++h) st.m[0][h] = fresh.m[0][h], st.d[0][h] = fresh.d[0][h];
          cur = nxt;
          rows = next_rows;
          t = 0;
        }
        // With the wait inside a branch, ptxas keeps the registers the P V
        // wgmma reads untouched until here (SASS: no early wait).
        pack_p<CTA_KV, T>(pa, s);
        mbarrier_arrive(bars.v_empty(prev.index()));  // last: an early arrive dragged the wait up
      }
      mbarrier_wait(bars.v_full(kpos.index()), kpos.phase());
      wgmma_pv<CTA_KV, HEAD_DIM, T>(of, pa, v_at(kpos));
      wgmma_commit();
      wgmma_wait<0>();
      wgmma_keep(of);
      wgmma_keep(pa);
      mbarrier_arrive(bars.v_empty(kpos.index()));
      finish(cur, st);
    }
    if (wg == 0) take_turn();  // balances warpgroup 1's last hand-over
#else
    __trap();  // Hopper kernels are only built for sm_90a
#endif
  }
};

#endif

}  // namespace tessera
