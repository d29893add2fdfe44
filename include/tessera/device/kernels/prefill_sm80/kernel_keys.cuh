// Prefill (FA2 template), 8-row query tiles (decode: a request's group of
// at most 8 query heads) with the keys as the mma's rows, warp-specialized:
// a producer warpgroup streams the K / V tiles as stored (fp8 or 16-bit)
// into a ring of STAGES stages and WARPS_KV math warps run the keys-as-rows
// tile (mainloop_keys.cuh), each on its KV_PER_WARP keys of a tile.
//
// Why a producer: with every warp copying its share of a tile and a CTA
// barrier per tile, the load pipeline alone (the math removed) read the
// cache at 86-88% of the HBM rate, the math alone taking a third of the
// step. Threads that wait only for free stages keep the copies flowing
// while the math warps compute; they need to be a warpgroup, as fewer keep
// too few copies in flight (abi/shared_memory.cuh).
//
// Pipeline: a stage's "full" mbarrier counts the producer's threads (each
// one's cp.async.mbarrier.arrive fires when its copies landed), "empty" the
// math threads (each arrives after its last read of the stage). Ring
// positions run on across work items. Paged rows: while its copies of tile
// t fly, producer thread r resolves row r of tile t + 1 (page / head / slot
// arithmetic on the page id it loaded a tile before) into a shared table
// the next tile's copies read.
// KV_HEADS > 1: a CTA reads that many adjacent KV heads (the plan's head j
// is heads KV_HEADS j ..), whose query rows side by side fill the 8-row
// tile; each stage holds every head's K rows, then every head's V rows, and
// each math warp takes one head (its keys of a tile; the other heads'
// columns of S^T masked), so the producer copies a token's heads as one
// row: with NHD pages, 256 contiguous bytes of fp8 at head dim 128.
// The producer walks the work queue on its own, so the next item's tiles
// land while the math warps end this one (KV-warp merge, state move,
// epilogue) in a scratch of their own; they load each item's Q tile there.
#pragma once
#include "tessera/device/arch/grid_dependency.cuh"
#include "tessera/device/arch/mbarrier.cuh"
#include "tessera/device/arch/warpgroup.cuh"
#include "tessera/device/kernels/common/cooperative_merge.cuh"
#include "tessera/device/kernels/prefill_sm80/mainloop_keys.cuh"

namespace tessera {

#if defined(__CUDACC__) || defined(__CUDACC_RTC__)

// Named barriers of the math warps and of the producer (0 is __syncthreads).
constexpr int kKeysMathBar = 1, kKeysProducerBar = 2;
constexpr int kKeysProducerThreads = kFa2KeysProducerThreads;  // abi/shared_memory.cuh

// The producer's copies of one KV tile (NT threads). Thread l copies
// 16-byte chunk l % CH of rows l / CH + i * RPP: fp8 rows into
// Fp8RowSwizzle stages, 16-bit ones into RowSwizzle stages (the layouts the
// two keys-as-rows tiles read).
template <int HEAD_DIM, int CTA_KV, typename DKV, int NT, int KV_HEADS>
struct KeysTileProducer {
  // A copy row: one token's KV_HEADS head rows, CH1 chunks each.
  static constexpr int CH1 = HEAD_DIM * static_cast<int>(sizeof(DKV)) / 16, CH = KV_HEADS * CH1;
  static constexpr int RPP = NT / CH, PASSES = CTA_KV / RPP;
  static constexpr u32 HEAD_TILE_BYTES = CTA_KV * HEAD_DIM * sizeof(DKV);  // one head's K (or V) rows of a stage
  static_assert(NT % CH == 0 && CTA_KV % RPP == 0, "whole rows per pass");
  const device::PagedKV& kv;
  i64* offs;  // [2][CTA_KV] element offsets of a tile's rows (-1: zero-fill), by tile parity
  int page_base, kv_start, kv_end, head, shift, tid;  // head: the first of the CTA's; tid: the thread's index

  // A thread resolves rows tid + k * NT of a tile, in two steps: fetch
  // loads their page-table entries a tile ahead, publish turns them into
  // the table's offsets, so no copy waits on a page-table load.
  static constexpr int ROWS = (CTA_KV + NT - 1) / NT;
  __device__ __forceinline__ void fetch(int tile, int (&entries)[ROWS]) const {
#pragma unroll
    for (int k = 0; k < ROWS; ++k) {
      const int r = tid + k * NT, pos = kv_start + tile * CTA_KV + r;
      entries[k] = r < CTA_KV && pos < kv_end ? device::kv_table_entry(kv, page_base, pos, shift) : 0;
    }
  }
  __device__ __forceinline__ void publish(int tile, const int (&entries)[ROWS]) {
#pragma unroll
    for (int k = 0; k < ROWS; ++k) {
      const int r = tid + k * NT, pos = kv_start + tile * CTA_KV + r;
      if (r < CTA_KV)
        offs[(tile & 1) * CTA_KV + r] =
            pos < kv_end ? device::kv_token_offset_from(kv, page_base, pos, head, shift, entries[k]) : -1;
    }
  }
  // Tile `tile`'s copies into stage (k_dst, v_dst: shared addresses); its
  // rows resolved and published to the producer (its named barrier) before.
  // Each copy asks the L2 for its whole 128-byte line (cp.async's L2::128B
  // prefetch size), as every line of a row is read: unhinted copies leave
  // the DRAM to serve sectors as the requests come, and 256-byte blocks cost
  // L2 throughput where shared pages hit in L2 (docs/performance.md,
  // "Decode on tensor cores").
  __device__ __forceinline__ void copy(int tile, u32 k_dst, u32 v_dst) const {
    const int ch = tid % CH, sub = ch / CH1, c1 = ch % CH1, row0 = tid / CH;
    const i64* mine = offs + (tile & 1) * CTA_KV;
    const i64 sub_bytes = sub * kv.head_stride * static_cast<i64>(sizeof(DKV)) + c1 * 16;
    const char* k_chunk = static_cast<const char*>(kv.k) + sub_bytes;
    const char* v_chunk = static_cast<const char*>(kv.v) + sub_bytes;
    k_dst += sub * HEAD_TILE_BYTES;
    v_dst += sub * HEAD_TILE_BYTES;
#pragma unroll
    for (int i = 0; i < PASSES; ++i) {
      const int row = row0 + i * RPP;
      const i64 off = mine[row];
      const i64 bytes = off * static_cast<i64>(sizeof(DKV));
      u32 dst;
      if constexpr (is_fp8<DKV>)
        dst = static_cast<u32>(Fp8RowSwizzle<HEAD_DIM>::at(row, c1));
      else
        dst = static_cast<u32>(RowSwizzle<HEAD_DIM, CTA_KV>::at(row, c1)) * 2u;
      cp_async_16_or_zeros<true>(k_dst + dst, k_chunk + bytes, off >= 0);
      cp_async_16_or_zeros<true>(v_dst + dst, v_chunk + bytes, off >= 0);
    }
  }
};

// Merges the math warps' states (keys-as-rows layout, the same in every
// warp: lane by lane) into warp 0's, in warp order, through `scratch`
// (element-major slots, one per warp after the first: conflict-free). A
// row's m is its maximum over the warp's keys, d the lane's share of its sum.
template <typename Variant, int HEAD_DIM, int WARPS_KV>
__device__ __forceinline__ void merge_keys_warps(KeysAsRowsState<HEAD_DIM>& ks, float* scratch, int warp,
                                                 int math_threads) {
  constexpr int FT = KeysAsRowsState<HEAD_DIM>::FT, N = FT * 4 + 4;  // floats a lane
  const int lane = threadIdx.x % 32;
  if (warp > 0) {
    float* slot = scratch + (warp - 1) * 32 * N + lane;
#pragma unroll
    for (int f = 0; f < FT; ++f)
#pragma unroll
      for (int e = 0; e < 4; ++e) slot[(4 * f + e) * 32] = ks.o[f][e];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      slot[(4 * FT + r) * 32] = ks.m[r];
      slot[(4 * FT + 2 + r) * 32] = ks.d[r];
    }
  }
  named_barrier_sync(kKeysMathBar, math_threads);
  if (warp != 0) return;
  for (int k = 1; k < WARPS_KV; ++k) {
    const float* slot = scratch + (k - 1) * 32 * N + lane;
#pragma unroll
    for (int r = 0; r < 2; ++r) {  // row 2c + r: o[f][r] and o[f][r + 2]
      float f0 = 1.f, f1 = 1.f;
      if (Variant::use_softmax) {
        OnlineSoftmax acc;
        acc.m = ks.m[r];
        acc.d = ks.d[r];
        const float2 f = acc.merge(slot[(4 * FT + r) * 32], slot[(4 * FT + 2 + r) * 32]);
        ks.m[r] = acc.m;
        ks.d[r] = acc.d;
        f0 = f.x, f1 = f.y;
      }
#pragma unroll
      for (int f = 0; f < FT; ++f) {
        ks.o[f][r] = ks.o[f][r] * f0 + slot[(4 * f + r) * 32] * f1;
        ks.o[f][r + 2] = ks.o[f][r + 2] * f0 + slot[(4 * f + r + 2) * 32] * f1;
      }
    }
  }
  __syncwarp();  // the slots are read before keys_to_row_state reuses the scratch
}

template <typename Variant, typename DQ, typename DKV, typename DO, int HEAD_DIM, int CTA_KV, int WARPS_KV,
          int STAGES, int KV_HEADS, typename Params>
__device__ __forceinline__ void batch_prefill_keys(const Params& p, int queues) {
  constexpr int CTA_Q = 8;
  constexpr bool kFp8 = is_fp8<DKV>;
  constexpr Fa2KvTiles kTiles = kFp8 ? Fa2KvTiles::kFp8 : Fa2KvTiles::k16Bit;
  // Shape: the CTA's math warps; HeadShape: the warps of one head (their keys a warp).
  using Shape = PrefillShape<HEAD_DIM, HEAD_DIM, CTA_Q, CTA_KV, 1, WARPS_KV, STAGES, kTiles>;
  constexpr int HEAD_WARPS = WARPS_KV / KV_HEADS;
  static_assert(WARPS_KV % KV_HEADS == 0 && (KV_HEADS == 1 || kFp8), "whole warps a head; two heads: fp8 caches");
  using HeadShape = PrefillShape<HEAD_DIM, HEAD_DIM, CTA_Q, CTA_KV, 1, HEAD_WARPS, STAGES, kTiles>;
  using Producer = KeysTileProducer<HEAD_DIM, CTA_KV, DKV, kKeysProducerThreads, KV_HEADS>;
  using Traits = VariantTraits<Variant, Params>;
  using T16 = typename Fp8Operand<DQ, DKV>::type;
  constexpr int MATH_THREADS = Shape::THREADS;
  constexpr int SCRATCH = fa2_keys_scratch_bytes(HEAD_DIM, WARPS_KV);
  constexpr int KV_BYTES = static_cast<int>(sizeof(DKV)), STAGE_BYTES = KV_HEADS * Shape::STAGE_ELEMS * KV_BYTES;
  constexpr int K_BYTES = KV_HEADS * Shape::K_ELEMS * KV_BYTES;  // a stage's K rows (V's follow)
  static_assert(sizeof(DQ) == 2 && (kFp8 || sizeof(DKV) == 2) && (sizeof(DO) == 2 || sizeof(DO) == 4),
                "8-row tiles: 16-bit q, an fp8 or 16-bit cache, 16- or 32-bit o");
  static_assert(!(Traits::key_transform || Traits::value_transform), "8-row tiles read K / V rows as stored");
  static_assert(STAGES >= 2 && SCRATCH % 16 == 0, "a ring of at least two stages; 16-byte aligned stages");
  static_assert(SCRATCH + STAGES * STAGE_BYTES ==
                    fa2_keys_smem_bytes(HEAD_DIM, CTA_KV, WARPS_KV, STAGES, KV_BYTES, KV_HEADS),
                "the host sizes the launch with the same function");
  // [scratch: the Q tile, then the KV-warp merge and the state move][STAGES K / V stages]
  extern __shared__ uint4 smem_raw[];
  T16* q_smem = reinterpret_cast<T16*>(smem_raw);
  float* scratch = reinterpret_cast<float*>(smem_raw);
  const u32 q_addr = smem_addr(q_smem), stage_addr = smem_addr(smem_raw) + SCRATCH;
  __shared__ int s_is_last;
  __shared__ __align__(16) i64 s_row_offs[2 * CTA_KV];
  __shared__ __align__(8) u64 s_bars[2 * STAGES];  // full[STAGES], then empty[STAGES]
  const u32 bars = smem_addr(s_bars);
  auto full = [&](int s) { return bars + 8 * s; };
  auto empty = [&](int s) { return bars + 8 * (STAGES + s); };
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;

  if (threadIdx.x == 0)
    for (int s = 0; s < STAGES; ++s) {
      mbarrier_init(full(s), kKeysProducerThreads);
      mbarrier_init(empty(s), MATH_THREADS);
    }
  const int column = queue_of_cta(queues);
  WorkQueue<PrefillWorkItem, QueueLoad::kFirst, Params> queue(p, column);
  // The first item's first page-table entries load before the wait below,
  // so its first copies can go right after it: the page ids are the plan's
  // (a device plan's first run never starts early). The item comes from the
  // parameters, not queue.first(): a reference to the queue's copy here
  // moved the whole parameter block to local memory.
  int first_entries[Producer::ROWS];
  if (warp >= WARPS_KV && queue.begin < queue.end) {
    const PrefillWorkItem w = p.first_items[column];
    Producer{p.kv, s_row_offs, w.kv_begin, w.kv_start, w.kv_end, item_kv_head(p, w) * KV_HEADS, p.page_shift,
             static_cast<int>(threadIdx.x) - MATH_THREADS}
        .fetch(0, first_entries);
  }
  // The plan's workspace is complete; q, K, V, the scale tensors and the
  // outputs may still be the previous kernel's (programmatic dependent launch).
  grid_dependency_wait();
  __syncthreads();  // barriers initialized
  // Both roles walk the queue; ring counts the tiles streamed so far (stage
  // ring % STAGES, phase (ring / STAGES) & 1) and runs on across items, so
  // the producer fills the next item's stages while the math warps end this
  // one.
  unsigned ring = 0;
  if (warp >= WARPS_KV) {
    for (int wi = queue.begin; wi < queue.end; ++wi) {
      const PrefillWorkItem w = queue.take(wi);
      const int n_tiles = (w.kv_end - w.kv_start + CTA_KV - 1) / CTA_KV;
      Producer prod{p.kv, s_row_offs, w.kv_begin, w.kv_start, w.kv_end, item_kv_head(p, w) * KV_HEADS, p.page_shift,
                    static_cast<int>(threadIdx.x) - MATH_THREADS};
      // The table's rows of tile 0 may be read by the previous item's last
      // copies until the barrier that ended them.
      int entries[Producer::ROWS];
      if (wi == queue.begin) {
#pragma unroll
        for (int k = 0; k < Producer::ROWS; ++k) entries[k] = first_entries[k];
      } else {
        prod.fetch(0, entries);
      }
      if (n_tiles > 0) prod.publish(0, entries);
      prod.fetch(1, entries);
      named_barrier_sync(kKeysProducerBar, kKeysProducerThreads);
      for (int t = 0; t < n_tiles; ++t, ++ring) {
        const int s = static_cast<int>(ring % STAGES);
        mbarrier_wait(empty(s), ((ring / STAGES) & 1) ^ 1);  // a fresh barrier grants the first round
        const u32 k_dst = stage_addr + s * STAGE_BYTES;
        prod.copy(t, k_dst, k_dst + K_BYTES);
        cp_async_arrive_noinc(full(s));
        // Tile t + 1's entries were loaded a tile ago; tile t + 2's load
        // now, in flight behind the copies and the next stage's wait.
        if (t + 1 < n_tiles) prod.publish(t + 1, entries);
        prod.fetch(t + 2, entries);
        named_barrier_sync(kKeysProducerBar, kKeysProducerThreads);
      }
    }
  } else {
    // fp8: the scale tensors fold into the softmax and output scales (16-bit
    // caches take the parameters, as the FA2 kernel does).
    const device::RunScales run = kFp8 ? device::read_run_scales(p) : device::RunScales{p.sm_scale, p.o_scale};
    for (int wi = queue.begin; wi < queue.end; ++wi) {
      const PrefillWorkItem w = queue.take(wi);
      const int b = item_request(p, w), kv_head = item_kv_head(p, w);
      const int qo_len = w.qo_len, kv_len = w.kv_len, row0 = w.q_tile * CTA_Q;
      const int n_tiles = (w.kv_end - w.kv_start + CTA_KV - 1) / CTA_KV;
      Variant variant(p, b, qo_len, kv_len);
      // Q tile: fused row f -> (query f / group, head kv_head * group + f % group).
      load_tile<HEAD_DIM, CTA_Q, MATH_THREADS, RowSwizzle>(q_smem, static_cast<const T16*>(p.q), [&](int r) -> i64 {
        const int f = row0 + r, qo = f / p.group;
        if (qo >= qo_len) return -1;
        return (w.qo_begin + qo) * p.q_stride_n + (kv_head * p.group + f % p.group) * p.q_stride_h;
      });
      cp_async_commit();
      cp_async_wait<0>();
      named_barrier_sync(kKeysMathBar, MATH_THREADS);
      if constexpr (Traits::query_transform) {
        transform_q_tile<Variant, HEAD_DIM, CTA_Q, RowSwizzle>(variant, p, q_smem, threadIdx.x, MATH_THREADS, 0, CTA_Q,
                                                             b, row0, p.group, kv_head, qo_len);
        named_barrier_sync(kKeysMathBar, MATH_THREADS);
      }
      KeysAsRowsState<HEAD_DIM> keys;
      keys.init();
      if constexpr (kFp8)
        keys.load_q(q_addr);
      else
        keys.load_q_16(q_addr);
      // The Q tile shares the scratch, which the merge below overwrites:
      // every warp has its fragments first.
      named_barrier_sync(kKeysMathBar, MATH_THREADS);
      // The math's rows: 2c, 2c + 1 of the tile. Interior tiles skip the
      // mask even past the valid rows (zero-filled Q rows: finite logits,
      // never stored).
      const RowInfo<1> key_rows = keys_as_rows_rows(row0, p.group, kv_head, qo_len);
      // This warp's head of the CTA's and its keys of a tile; `own`: which
      // of its columns 2c, 2c + 1 (fused rows) are that head's query rows.
      const int head_sub = warp / HEAD_WARPS, wk = warp % HEAD_WARPS, warp_kv_head = kv_head * KV_HEADS + head_sub;
      unsigned own = 3u;
      if constexpr (KV_HEADS > 1) {
        const int head_group = p.group / KV_HEADS;
        own = 0u;
#pragma unroll
        for (int r = 0; r < 2; ++r)
          if ((row0 + 2 * (lane % 4) + r) % p.group / head_group == head_sub) own |= 1u << r;
      }
      const u32 head_tile = head_sub * (Shape::K_ELEMS * KV_BYTES);
      const int causal_shift = kv_len - qo_len, min_qo = row0 / p.group, max_qo = (row0 + CTA_Q - 1) / p.group;
      for (int t = 0; t < n_tiles; ++t, ++ring) {
        const int s = static_cast<int>(ring % STAGES);
        const int tile_start = w.kv_start + t * CTA_KV;
        const bool masked = tile_needs_mask<Variant, Params>(tile_start, tile_start + CTA_KV - 1, w.kv_end, true,
                                                             min_qo, max_qo, causal_shift);
        mbarrier_wait(full(s), (ring / STAGES) & 1);
        const u32 k_addr = stage_addr + s * STAGE_BYTES + head_tile, v_addr = k_addr + K_BYTES;
        if constexpr (kFp8)
          keys_as_rows_tile_fp8<Variant, HeadShape, T16, DKV, HEAD_DIM>(p, variant, keys, key_rows, k_addr, v_addr,
                                                                        tile_start, w.kv_end, b, warp_kv_head, wk,
                                                                        masked, causal_shift, run.sm_scale, own);
        else
          keys_as_rows_tile_16<Variant, HeadShape, T16, HEAD_DIM>(p, variant, keys, key_rows, k_addr, v_addr,
                                                                  tile_start, w.kv_end, b, warp_kv_head, wk, masked,
                                                                  causal_shift, run.sm_scale);
        mbarrier_arrive(empty(s));
      }
      if constexpr (WARPS_KV > 1) merge_keys_warps<Variant, HEAD_DIM, WARPS_KV>(keys, scratch, warp, MATH_THREADS);
      if (warp == 0) {
        // The epilogue's rows: g (g + 8 lies past the tile), in the 16-row
        // kernels' layout.
        RowInfo<1> rows;
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          const int f = row0 + lane / 4 + 8 * r;
          rows.qo_idx[0][r] = f / p.group;
          rows.head[0][r] = kv_head * p.group + f % p.group;
          rows.valid[0][r] = r == 0 && rows.qo_idx[0][r] < qo_len;
        }
        PrefillState<1, Shape::NT_O> st;
        keys_to_row_state<kFp8>(keys, st, scratch);
        prefill_sum_quads(st);
        prefill_store_rows<Variant, DO, HEAD_DIM, CTA_Q>(p, variant, st, rows, w, w.qo_begin, b, kv_head, 0,
                                                         run.o_scale);
      }
      if (w.partial_slot >= 0)
        merge_split_tile<Variant, DO, HEAD_DIM, CTA_Q, MATH_THREADS>(
            p, variant, w, w.qo_begin, qo_len, row0, b, kv_head, threadIdx.x, &s_is_last,
            [] { named_barrier_sync(kKeysMathBar, MATH_THREADS); }, wi == queue.end - 1);
      named_barrier_sync(kKeysMathBar, MATH_THREADS);  // the scratch (next: the Q tile) is free again
    }
  }
  grid_dependency_launch_dependents();
}

#endif

}  // namespace tessera
