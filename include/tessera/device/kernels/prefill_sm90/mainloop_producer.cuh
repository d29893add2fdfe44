// Prefill (Hopper template), producer warpgroup: walks the CTA's work items
// in the consumers' order and streams the fused Q tile (one or two buffers)
// and each KV tile (K and V rings of stages, K a tile ahead) into
// 128-byte-swizzled shared memory. Contiguous K / V and Q tiles the TMA can
// describe come by the TMA (one thread each, tensor maps from the host);
// everything else by cp.async gathers, so one loader serves ragged, paged
// (any page size) and BSR KV alike (paper §3.2.1): each thread's copies
// signal the stage's "full" barrier on landing (cp.async.mbarrier.arrive), so
// the producer never waits on its own copies, only on "empty" stages.
// fp8 K / V (DKV e4m3 / e5m2): the copies land in a ring of STAGING staging
// tiles and each thread widens the chunks it copied into the 16-bit stage
// (q's type) STAGING - 1 tiles later, so later tiles' copies are in flight
// while it widens; the thread then signals the stage itself. With fp8
// tensor cores (FP8_MMA) K's copies land straight in its fp8 stage (the
// wgmma reads the cache's rows), and only V is staged: each thread
// transposes its share into the fp8 V^T stage (transpose_v).
// Paged KV: while the warpgroup issues a tile, each thread resolves one row
// of the next tile (page-table load, page / head / slot arithmetic) into a
// ring of shared tables of element offsets; a copy then costs one
// shared load and an add. (Resolving every row per copy, K and V alike, made
// paged KV ~60% slower than contiguous: the producer competes with the
// consumers for issue slots.)
#pragma once
#include "tessera/device/arch/grid_dependency.cuh"
#include "tessera/device/arch/cluster.cuh"
#include "tessera/device/arch/ldmatrix.cuh"
#include "tessera/device/arch/tma.cuh"
#include "tessera/device/arch/warpgroup.cuh"
#include "tessera/device/kernels/common/work_queue.cuh"
#include "tessera/device/kernels/prefill_sm90/pipeline.cuh"
#include "tessera/device/kernels/common/tiles.cuh"
#include "tessera/device/primitives/variant_traits.cuh"

namespace tessera {

#if defined(__CUDACC__) || defined(__CUDACC_RTC__)

// Tag for the producer's issue(): a K tile (true) or a V tile (false).
template <bool B>
struct IsKey {
  static constexpr bool value = B;
};

// T: the 16-bit type of the shared tiles (the MMA's); DKV: the cache's
// element type (T, or fp8 widened to T, or with FP8_MMA kept as fp8).
template <typename Variant, typename T, typename DKV, int HEAD_DIM, int CTA_Q, int CTA_KV, typename Rings, int CLUSTER,
          int STAGING, bool FP8_MMA, typename Params>
struct Sm90Producer {
  // Thread t copies 16-byte chunks t % LPR (+ 16, + 32, ...: CPT of them) of
  // rows t / LPR + i * RPP. At most 16 threads share a row, so a thread's
  // rows are a multiple of 8 apart and keep one swizzle phase; at head_dim
  // 256 a thread's second chunk (ch + 16) sits two column blocks further.
  // K / V rows of an fp8 cache are half as many chunks (KV_LPR per row).
  static constexpr bool kFp8 = is_fp8<DKV>;
  static constexpr int THREADS = 128, CH = HEAD_DIM / 8;
  static constexpr int LPR = CH < 16 ? CH : 16, CPT = CH / LPR;
  static constexpr int RPP = THREADS / LPR;  // rows per pass
  static constexpr int KV_CH = HEAD_DIM * static_cast<int>(sizeof(DKV)) / 16;
  static constexpr int KV_LPR = KV_CH < 16 ? KV_CH : 16, KV_RPP = THREADS / KV_LPR;
  static constexpr int Q_PASSES = CTA_Q / RPP, KV_PASSES = CTA_KV / KV_RPP;
  static_assert(CH % LPR == 0 && KV_CH % KV_LPR == 0, "whole chunks per thread");
  static_assert(CTA_Q % RPP == 0 && CTA_KV % KV_RPP == 0 && RPP % 8 == 0, "whole rows per pass, one swizzle phase per thread");
  static_assert(KV_PASSES % 2 == 0, "a thread reads its rows' offsets two at a time");
  static_assert(sizeof(T) == 2 && (sizeof(DKV) == 2 || kFp8), "16-bit tiles of a 16-bit or fp8 cache");
  static_assert(!kFp8 || KV_CH == KV_LPR, "fp8: one chunk per row and pass");
  static_assert(kFp8 ? STAGING >= 2 && STAGING <= 4 : STAGING == 0, "fp8: a ring of 2 to 4 staging tiles");
  static_assert(!FP8_MMA || (kFp8 && HEAD_DIM == 128 && CTA_KV == 128 && CLUSTER == 1),
                "fp8 tensor cores: an fp8 cache, head dim 128, 128-key tiles, single CTAs");
  static constexpr int kStageBytes = CTA_KV * HEAD_DIM;  // an fp8 staging tile
  static constexpr u32 kKvTileBytes = CTA_KV * HEAD_DIM * (FP8_MMA ? 1 : 2);  // a K or V stage
  using Traits = VariantTraits<Variant, Params>;
  using QLayout = Swizzle128<HEAD_DIM, CTA_Q>;
  using KVLayout = Swizzle128<HEAD_DIM, CTA_KV>;

  const Params& p;
  Sm90Pipeline<Rings>& pipe;
  T* q_smem;  // [Q_BUFS][CTA_Q * HEAD_DIM]
  T* k_smem;  // [K_STAGES][CTA_KV * HEAD_DIM]
  T* v_smem;  // [V_STAGES][CTA_KV * HEAD_DIM]
  u32 staging;    // fp8: shared address of [STAGING][kStageBytes], row-major (unused otherwise)
  i64* row_offs;  // [4][CTA_KV] shared: byte offsets of a tile's rows (paged KV)
  int tid, ch, row0;  // Q's copy mapping
  int kv_ch, kv_row0;  // K / V's (the same for 16-bit caches)
  int rank;  // in the cluster (CLUSTER > 1): with the item index, which CTA_Q rows of each item are this CTA's

  __device__ __forceinline__ Sm90Producer(const Params& p_, Sm90Pipeline<Rings>& pipe_, T* q, T* k, T* v, u8* stage8,
                                          i64* offs)
      : p(p_), pipe(pipe_), q_smem(q), k_smem(k), v_smem(v), staging(smem_addr(stage8)), row_offs(offs), tid(threadIdx.x % THREADS),
        ch(tid % LPR), row0(tid / LPR), kv_ch(tid % KV_LPR), kv_row0(tid / KV_LPR),
        rank(CLUSTER > 1 ? cluster_rank() : 0) {}

  // Byte offset of row `tid` of the tile starting at `start` (paged KV:
  // page, head and slot resolved; 0 past `end` and for a page id that failed
  // its check, so every table entry is a valid address: such a row reads
  // page 0, and the failed check is raised by the wrapper). The caller stores
  // it into the shared table only after issuing a tile's copies, so the
  // page-table load hides behind them.
  __device__ __forceinline__ i64 row_offset(int page_base, int start, int end, int kv_head, int shift) const {
    const int pos = start + tid;
    if (tid >= CTA_KV || pos >= end) return 0;
    const int idx = shift >= 0 ? pos >> shift : pos / p.kv.page_size;
    const int slot = pos - idx * p.kv.page_size;
    const int page = device::page_id(p.kv, page_base + idx);
    if (page < 0) return 0;
    return (static_cast<i64>(page) * p.kv.page_stride + kv_head * p.kv.head_stride +
            static_cast<i64>(slot) * p.kv.token_stride) *
           static_cast<i64>(sizeof(DKV));
  }
  // Where row r's offset sits in a table: the rows one thread copies
  // (r = kv_row0 + i * KV_RPP) are adjacent, so it reads two per 16-byte load.
  __device__ __forceinline__ static int table_slot(int r) { return (r % KV_RPP) * KV_PASSES + r / KV_RPP; }

  // Shared-memory bytes from a thread's chunk ch to its chunk ch + 16 in a
  // tile of `rows` rows (two 64-column blocks on).
  __device__ __forceinline__ static constexpr u32 chunk_step(int rows) { return 2 * rows * 128; }

  // One K or V tile: rows at or past `end` are zero-filled. The thread's rows
  // are RPP apart (a multiple of 8), so they share the swizzle phase: its
  // shared-memory destination just steps by RPP rows, and for contiguous KV
  // so does the source. A few instructions per 16-byte copy keep the
  // producer from competing with the consumers for issue slots (a generic
  // address computation per row took ~35 and starved them).
  // dst: the tile's shared address. fp8: the same copies into a row-major
  // staging tile, kv_ch * 16 bytes into each row, or with SWIZZLED into an
  // fp8 wgmma stage (rows of HEAD_DIM = 128 bytes, 128-byte swizzle).
  template <bool SWIZZLED = false>
  __device__ __forceinline__ void copy_tile(u32 dst, const DKV* base, const i64* offs, i64 affine_base, int start,
                                            int end) const {
    const device::PagedKV& kv = p.kv;
    constexpr int kChunkElems = 16 / sizeof(DKV);
    u32 dst_addr = dst + (SWIZZLED ? kv_row0 * 128 + ((kv_ch ^ (kv_row0 & 7)) << 4)
                                   : kFp8 ? kv_row0 * HEAD_DIM + kv_ch * 16 : KVLayout::at(kv_row0, kv_ch) * 2);
    constexpr u32 kDstStep = kFp8 ? KV_RPP * HEAD_DIM : KV_RPP * 64 * sizeof(T);
    const int valid = end - start - kv_row0;  // rows i * KV_RPP < valid are in range
    if (kv.indices == nullptr) {
      const DKV* src = base + affine_base + static_cast<i64>(kv_row0) * kv.token_stride + kv_ch * kChunkElems;
      const i64 step = static_cast<i64>(KV_RPP) * kv.token_stride;
#pragma unroll
      for (int i = 0; i < KV_PASSES; ++i, src += step, dst_addr += kDstStep) {
        const bool ok = i * KV_RPP < valid;
#pragma unroll
        for (int j = 0; j < KV_CH / KV_LPR; ++j)
          cp_async_16(dst_addr + j * chunk_step(CTA_KV), ok ? src + j * 128 : base, ok);
      }
    } else {
      const char* chunk_base = reinterpret_cast<const char*>(base + kv_ch * kChunkElems);
      const longlong2* mine = reinterpret_cast<const longlong2*>(offs + kv_row0 * KV_PASSES);
#pragma unroll
      for (int i = 0; i < KV_PASSES; i += 2, dst_addr += 2 * kDstStep) {
        const longlong2 o = mine[i / 2];
#pragma unroll
        for (int j = 0; j < KV_CH / KV_LPR; ++j) {
          cp_async_16(dst_addr + j * chunk_step(CTA_KV), chunk_base + o.x + j * 256, i * KV_RPP < valid);
          cp_async_16(dst_addr + kDstStep + j * chunk_step(CTA_KV), chunk_base + o.y + j * 256, (i + 1) * KV_RPP < valid);
        }
      }
    }
  }

  // fp8: widens this thread's chunks of a landed staging tile (shared
  // address `stage`) into the 16-bit tile at `tile` (Swizzle128). Each 16
  // fp8 values become 16-bit chunks 2c and 2c + 1 of the row; threads with
  // c & 4 store the odd one first, so each store instruction of a quarter
  // warp hits eight distinct bank groups. A thread's rows are KV_RPP apart
  // (a multiple of 8: one swizzle phase), so both its source and its
  // destinations step by constants. Rows past the chunk's end were
  // zero-filled and widen to zeros. 32-bit shared addresses keep the
  // producer within its registers.
  template <typename S = DKV>  // a template, so 16-bit caches never instantiate the conversions
  __device__ __forceinline__ void widen_tile(u32 stage, u32 tile) const {
    if constexpr (is_fp8<S>) {
      const bool odd_first = (kv_ch & 4) != 0;
      const u32 src = stage + kv_row0 * HEAD_DIM + kv_ch * 16;
      const u32 even = tile + KVLayout::at(kv_row0, 2 * kv_ch) * 2, odd = tile + KVLayout::at(kv_row0, 2 * kv_ch + 1) * 2;
      const u32 first = odd_first ? odd : even, second = odd_first ? even : odd;
#pragma unroll
      for (int i = 0; i < KV_PASSES; ++i) {
        uint4 x = ld_shared_16(src + i * KV_RPP * HEAD_DIM);
        if (odd_first) {  // features 16 c + 8 .. + 15 first
          const u32 t0 = x.x, t1 = x.y;
          x.x = x.z, x.y = x.w, x.z = t0, x.w = t1;
        }
        uint4 a, b;
        fp8x4_to_16x2<S, T>(x.x, a.x, a.y);
        fp8x4_to_16x2<S, T>(x.y, a.z, a.w);
        fp8x4_to_16x2<S, T>(x.z, b.x, b.y);
        fp8x4_to_16x2<S, T>(x.w, b.z, b.w);
        st_shared_16(first + i * KV_RPP * 128, a);
        st_shared_16(second + i * KV_RPP * 128, b);
      }
    }
  }

  // FP8_MMA: V's landed staging tile (128 keys x 128 fp8 features, staged
  // like K: 128-byte rows, chunk c at c ^ (key % 8)) as the V^T stage the
  // P V wgmma reads: row f holds feature f of the 128 keys, 16-byte chunk c
  // (keys 16c .. 16c + 15) at chunk c ^ (f % 8), its keys in P's packing
  // order (pack_p_fp8): byte 4i + e of a chunk holds key 2i + (e & 1) + 8 (e
  // >> 1). One step of a warp moves 16 keys x 32 features: ldmatrix.trans
  // gives lane (g, i) keys 2i, 2i + 1 (and 8 + 2i, 9 + 2i) of features 2g,
  // 2g + 1 of each 16-feature block as 16-bit pairs; two byte permutes make
  // them the words of features 2g and 2g + 1, and stmatrix writes them as
  // rows of V^T (even and odd features, one matrix each). Rows past the
  // chunk's end were zero-filled and stay zeros. A thread reads rows other
  // threads copied: the caller waits for the warpgroup's copies first, and
  // no copy refills the staging tile before every thread is done with it
  // (a warpgroup barrier per KV tile).
  __device__ __forceinline__ void transpose_v(u32 stage, u32 tile) const {
    if constexpr (FP8_MMA) {
      const int lane = tid % 32, warp = tid / 32;
      const int m = lane / 8, r = lane % 8;  // the matrix and row this lane addresses
      // ldmatrix: matrix m = keys 8 (m & 1) .. + 7 of the group, feature block (m >> 1) of the pair.
      // stmatrix: matrix m = features of block (m >> 1), even (m & 1 = 0) or odd, row r.
#pragma unroll
      for (int s = 0; s < 8; ++s) {
        const int unit = warp * 8 + s;  // 32 units: 8 key groups x 4 pairs of feature blocks
        const int c = unit % 8, fb = 2 * (unit / 8) + (m >> 1);
        const int key = 16 * c + 8 * (m & 1) + r;
        u32 in[4], out[4];
        ldmatrix_x4_trans(in, stage + key * 128 + ((fb ^ (key & 7)) << 4));
        out[0] = byte_perm(in[0], in[1], 0x6420);  // block 2p, even features
        out[1] = byte_perm(in[0], in[1], 0x7531);  // block 2p, odd
        out[2] = byte_perm(in[2], in[3], 0x6420);  // block 2p + 1, even
        out[3] = byte_perm(in[2], in[3], 0x7531);
        const int f = 16 * (2 * (unit / 8) + (m >> 1)) + 2 * r + (m & 1);
        stmatrix_x4(tile + f * 128 + ((c ^ (f & 7)) << 4), out);
      }
    }
  }

  // Contiguous K / V go through the TMA (one thread, two instructions per
  // tile) unless the variant transforms keys or values in shared memory.
  static constexpr bool kTmaCapable = !kFp8 && !Traits::key_transform && !Traits::value_transform;
  __device__ __forceinline__ static bool uses_tma(const Sm90TensorMaps& tma) { return kTmaCapable && tma.kv_on != 0; }

  // The TMA path of one item's KV tiles (thread 0 only), in the same order
  // as the cp.async path below: K_0, then K_t and V_{t-1}, then V_{n-1}.
  // Rows past the chunk's end hold the next keys of the tensor (or zeros past
  // its end): the consumers mask those columns, so P is 0 there.
  __device__ __forceinline__ void tma_item(const Sm90TensorMaps& tma, const Sm90Barriers<Rings>& bars,
                                           RingPos<Rings::K_STAGES>& kv_pos, int n_tiles, int token0, int kv_head) const {
    constexpr u32 kTileBytes = CTA_KV * HEAD_DIM * sizeof(T), kBlockBytes = CTA_KV * 128;
    // In a cluster each CTA arms its own barrier for the whole tile and
    // copies its share of the 64-feature boxes (box cb from rank cb %
    // CLUSTER) into every CTA of the pair; a stage is reused only after the
    // consumers of both released it (the empty barriers count both).
    auto load = [&](const TensorMap* map, T* tile, u32 full, int t) {
      mbarrier_arrive_expect_tx(full, kTileBytes);
#pragma unroll
      for (int cb = 0; cb < HEAD_DIM / 64; ++cb) {
        if constexpr (CLUSTER > 1) {
          if (cb % CLUSTER == rank)
            tma_load_3d_multicast(smem_addr(tile) + cb * kBlockBytes, map, full, cb * 64, token0 + t * CTA_KV, kv_head,
                                  static_cast<u16>((1u << CLUSTER) - 1));
        } else {
          tma_load_3d(smem_addr(tile) + cb * kBlockBytes, map, full, cb * 64, token0 + t * CTA_KV, kv_head);
        }
      }
    };
    auto load_v = [&](RingPos<Rings::V_STAGES> pos, int t) {
      mbarrier_wait(bars.v_empty(pos.index()), pos.phase() ^ 1);
      load(&tma.v, v_smem + pos.index() * (CTA_KV * HEAD_DIM), bars.v_full(pos.index()), t);
    };
    for (int t = 0; t < n_tiles; ++t, kv_pos = kv_pos.next()) {
      mbarrier_wait(bars.k_empty(kv_pos.index()), kv_pos.phase() ^ 1);
      load(&tma.k, k_smem + kv_pos.index() * (CTA_KV * HEAD_DIM), bars.k_full(kv_pos.index()), t);
      if (t > 0) load_v(RingPos<Rings::V_STAGES>{kv_pos.count - 1}, t - 1);
    }
    load_v(RingPos<Rings::V_STAGES>{kv_pos.count - 1}, n_tiles - 1);
  }

  // Signals a landed K or V tile; variants with a key/value transform apply
  // it here first (the whole warpgroup waits for its copies, transforms the
  // tile, and makes the result visible to the tensor cores' async proxy).
  template <bool TRANSFORM, typename Fn>
  __device__ __forceinline__ void publish(u32 full, Fn transform) const {
    if constexpr (TRANSFORM) {
      cp_async_wait_all();
      named_barrier_sync(kSm90ProducerBar, THREADS);
      transform();
      fence_proxy_async();
      mbarrier_arrive(full);
    } else {
      cp_async_arrive_noinc(full);
    }
  }

  // The TMA's Q tile (one thread): the group's heads x CTA_Q / group tokens
  // from the request's first query of the tile; 64 features per box. Rows
  // past the request's queries hold the next request's (or zeros past the
  // tensor): the consumers never store those rows.
  __device__ __forceinline__ void tma_q(const TensorMap* map, T* dst, u32 full, int token, int kv_head) const {
    mbarrier_arrive_expect_tx(full, CTA_Q * HEAD_DIM * sizeof(T));
#pragma unroll
    for (int cb = 0; cb < HEAD_DIM / 64; ++cb)
      tma_load_4d(smem_addr(dst) + cb * (CTA_Q * 128), map, full, cb * 64, 0, kv_head, token);
  }

  // kv_tma: the TMA loads K and V (contiguous KV, thread 0 issues them), else
  // cp.async gathers; q_tma: the TMA loads Q (thread kQIssuer, so a Q tile is
  // never queued behind thread 0's wait for a free K or V stage).
  static constexpr int kQIssuer = 32;
  __device__ __forceinline__ void run(const Sm90TensorMaps& maps, bool kv_tma, bool q_tma) {
    const Sm90TensorMaps* tma = kv_tma ? &maps : nullptr;
    const T* q_base = static_cast<const T*>(p.q);
    const DKV* k_base = static_cast<const DKV*>(p.kv.k);
    const DKV* v_base = static_cast<const DKV*>(p.kv.v);
    const bool paged = p.kv.indices != nullptr;
    const Sm90Barriers<Rings> bars(pipe);
    RingPos<Rings::Q_BUFS> q_pos;
    RingPos<Rings::K_STAGES> kv_pos;  // K ring; V uses the same count in its own ring
    u32 slot = 0;                     // fp8: the staging tile the next copies fill
    if (tma != nullptr && tid == 0) {
      tma_prefetch_map(&tma->k);
      tma_prefetch_map(&tma->v);
    }
    if (q_tma && tid == kQIssuer) tma_prefetch_map(&maps.q);
    // A cluster's CTAs share one work queue (the consumers walk it too).
    WorkQueue<PrefillWorkItem, QueueLoad::kFirst, Params> queue(p, static_cast<int>(blockIdx.x / CLUSTER));
    const int wi0 = queue.begin, wi_end = queue.end;
    const PrefillWorkItem w_first = queue.first();
    // Paged KV: the first item's first row offsets (page ids from the plan's
    // workspace) before the wait below, so its K copies can go right after.
    const i64 first_off = paged && wi0 < wi_end
                              ? row_offset(w_first.kv_begin, w_first.kv_start, w_first.kv_end, item_kv_head(p, w_first),
                                           p.page_shift)
                              : 0;
    // The plan's workspace was complete before the previous kernel started;
    // q, K and V may be that kernel's output (programmatic dependent launch),
    // unless it is another level of this attention (defer_grid_wait).
    if (!p.defer_grid_wait) grid_dependency_wait();
    for (int wi = wi0; wi < wi_end; ++wi) {
      const PrefillWorkItem w = queue.take(wi);
      const int n_tiles = (w.kv_end - w.kv_start + CTA_KV - 1) / CTA_KV;
      if (n_tiles == 0) continue;  // the consumers skip it too
      const int b = item_request(p, w), kv_head = item_kv_head(p, w);
      const int qo_start = w.qo_begin, qo_len = w.qo_len, page_base = w.kv_begin;
      const int half = CLUSTER > 1 ? rank ^ ((wi - wi0) & 1) : 0;  // as the consumers
      const int tile_row0 = (w.q_tile * CLUSTER + half) * CTA_Q;   // this CTA's first fused row
      Variant variant(p, b, qo_len, w.kv_len);

      // Q tile: fused row f -> (query f / group, head kv_head * group + f % group).
      T* q_dst = q_smem + q_pos.index() * (CTA_Q * HEAD_DIM);
      if (q_tma) {
        if (tid == kQIssuer) {
          mbarrier_wait(bars.q_empty(q_pos.index()), q_pos.phase() ^ 1);
          tma_q(&maps.q, q_dst, bars.q_full(q_pos.index()), qo_start + tile_row0 / p.group, kv_head);
        }
      } else {
        mbarrier_wait(bars.q_empty(q_pos.index()), q_pos.phase() ^ 1);
        u32 q_addr = smem_addr(q_dst + QLayout::at(row0, ch));
#pragma unroll 4
        for (int i = 0; i < Q_PASSES; ++i, q_addr += RPP * 64 * sizeof(T)) {
          const int f = tile_row0 + row0 + i * RPP, qo = f / p.group;
          const bool ok = qo < qo_len;
          const i64 off = (qo_start + qo) * p.q_stride_n + (kv_head * p.group + f % p.group) * p.q_stride_h;
#pragma unroll
          for (int j = 0; j < CPT; ++j)
            cp_async_16(q_addr + j * chunk_step(CTA_Q), ok ? q_base + off + ch * 8 + j * 128 : q_base, ok);
        }
        cp_async_arrive_noinc(bars.q_full(q_pos.index()));
      }
      q_pos = q_pos.next();

      if (tma != nullptr) {
        if (tid == 0) tma_item(*tma, bars, kv_pos, n_tiles, page_base + w.kv_start, kv_head);
        continue;
      }
      // Order: K_0, then K_t and V_{t-1} for t = 1 .. n-1, then V_{n-1}: the
      // consumers issue S_t together with P_{t-1} V_{t-1}, so they need K_t
      // before V_{t-1}. V stages are released only at the end of a consumer
      // step (after P V), so issuing K_t behind V_t made every K tile wait
      // for that release and land barely in time (ncu: consumers spinning on
      // K's full barrier ~26 times per tile, the producer parked on V's empty
      // one). K now runs a tile ahead. FP8_MMA: K_t, then V_t into a staging
      // tile, whose copies land while V_{t-1} is transposed into its stage
      // (so V_{t-1} is ready right behind K_t, as the consumers need it).
      // Paged KV: tile c's row offsets sit in table c % 4, written by the
      // whole warpgroup (one row each) during the previous step; the barrier
      // at the top of each step publishes them and tells every thread that
      // the others are done with the step before (tables c - 1 and c - 2 are
      // still read by this step's V and K copies, so the ring has 4 tables).
      if (paged && tid < CTA_KV)
        row_offs[(kv_pos.count & 3) * CTA_KV + table_slot(tid)] =
            wi == wi0 ? first_off : row_offset(page_base, w.kv_start, w.kv_end, kv_head, p.page_shift);
      // One K (IsKey<true>) or V tile at its ring position: wait for the
      // stage, copy (row offsets from table pos.count % 4), publish it.
      // fp8: the copies go to the next staging tile and the oldest of the
      // STAGING - 1 tiles still pending is widened and signalled, so that
      // many tiles' copies stay in flight while the producer widens.
      // A pending tile packed into one register (the producer runs on few):
      // bit 0 valid, 1 K, 2-3 its staging tile, 4 its stage's phase, 8.. its stage.
      struct Pending {
        u32 bits;
        int start;  // its first key (read by key / value transforms only)
        __device__ __forceinline__ bool valid() const { return bits & 1u; }
        __device__ __forceinline__ bool key() const { return bits & 2u; }
        __device__ __forceinline__ u32 slot() const { return (bits >> 2) & 3u; }
        __device__ __forceinline__ u32 phase() const { return (bits >> 4) & 1u; }
        __device__ __forceinline__ int stage() const { return static_cast<int>(bits >> 8); }
      };
      constexpr int kPending = STAGING > 1 ? STAGING - 1 : 1;
      Pending pending[kPending];  // oldest first
#pragma unroll
      for (int i = 0; i < kPending; ++i) pending[i] = Pending{0u, 0};
      // Call after cp_async_wait for d's copies.
      auto widen = [&](const Pending d) {
        const int stage = d.stage();
        const u32 tile = smem_addr(d.key() ? k_smem : v_smem) + stage * kKvTileBytes;
        mbarrier_wait(d.key() ? bars.k_empty(stage) : bars.v_empty(stage), d.phase() ^ 1);
        if constexpr (FP8_MMA) {  // V only
          named_barrier_sync(kSm90ProducerBar, THREADS);  // every thread's copies of it landed
          transpose_v(staging + d.slot() * kStageBytes, tile);
        } else {
          widen_tile(staging + d.slot() * kStageBytes, tile);
        }
        if (d.key() ? Traits::key_transform : Traits::value_transform) {
          named_barrier_sync(kSm90ProducerBar, THREADS);  // the whole tile is widened
          T* t16 = (d.key() ? k_smem : v_smem) + stage * (CTA_KV * HEAD_DIM);
          if (d.key())
            transform_kv_tile<Variant, true, HEAD_DIM, CTA_KV, Swizzle128>(variant, p, t16, tid, THREADS, 0, CTA_KV, b,
                                                                           d.start, w.kv_end, kv_head);
          else
            transform_kv_tile<Variant, false, HEAD_DIM, CTA_KV, Swizzle128>(variant, p, t16, tid, THREADS, 0, CTA_KV, b,
                                                                            d.start, w.kv_end, kv_head);
        }
        fence_proxy_async();  // generic stores -> the wgmmas' async proxy
        mbarrier_arrive(d.key() ? bars.k_full(stage) : bars.v_full(stage));
      };
      auto issue = [&](auto key, auto pos, int t) {
        constexpr bool K = decltype(key)::value;
        const int start = w.kv_start + t * CTA_KV, stage = pos.index();
        const i64 affine_base = paged ? 0 : device::kv_token_offset(p.kv, page_base, start, kv_head, p.page_shift);
        const i64* offs = row_offs + (pos.count & 3) * CTA_KV;
        if constexpr (FP8_MMA && K) {  // fp8 tensor cores read the cache's K rows as they are
          mbarrier_wait(bars.k_empty(stage), pos.phase() ^ 1);
          copy_tile<true>(smem_addr(k_smem) + stage * kKvTileBytes, k_base, offs, affine_base, start, w.kv_end);
          cp_async_arrive_noinc(bars.k_full(stage));
        } else if constexpr (kFp8) {
          copy_tile<FP8_MMA>(staging + slot * kStageBytes, K ? k_base : v_base, offs, affine_base, start, w.kv_end);
          cp_async_commit();
          if (pending[0].valid()) {
            cp_async_wait<kPending>();  // all but the copies of the tiles after it
            widen(pending[0]);
          }
#pragma unroll
          for (int i = 0; i + 1 < kPending; ++i) pending[i] = pending[i + 1];
          pending[kPending - 1] =
              Pending{1u | (K ? 2u : 0u) | (slot << 2) | (pos.phase() << 4) | (static_cast<u32>(stage) << 8), start};
          slot = slot + 1 == STAGING ? 0 : slot + 1;
        } else {
          T* tile = (K ? k_smem : v_smem) + stage * (CTA_KV * HEAD_DIM);
          mbarrier_wait(K ? bars.k_empty(stage) : bars.v_empty(stage), pos.phase() ^ 1);
          copy_tile(smem_addr(tile), K ? k_base : v_base, offs, affine_base, start, w.kv_end);
          publish<K ? Traits::key_transform : Traits::value_transform>(K ? bars.k_full(stage) : bars.v_full(stage), [&] {
            transform_kv_tile<Variant, K, HEAD_DIM, CTA_KV, Swizzle128>(variant, p, tile, tid, THREADS, 0, CTA_KV, b,
                                                                        start, w.kv_end, kv_head);
          });
        }
      };
      using VPos = RingPos<Rings::V_STAGES>;
      for (int t = 0; t < n_tiles; ++t, kv_pos = kv_pos.next()) {
        i64 next_off = 0;
        if (FP8_MMA && !paged) named_barrier_sync(kSm90ProducerBar, THREADS);  // staging tiles transposed
        if (paged) {
          named_barrier_sync(kSm90ProducerBar, THREADS);
          if (t + 1 < n_tiles)
            next_off = row_offset(page_base, w.kv_start + (t + 1) * CTA_KV, w.kv_end, kv_head, p.page_shift);
        }
        issue(IsKey<true>{}, kv_pos, t);
        if constexpr (FP8_MMA) issue(IsKey<false>{}, VPos{kv_pos.count}, t);
        else if (t > 0) issue(IsKey<false>{}, VPos{kv_pos.count - 1}, t - 1);
        if (paged && t + 1 < n_tiles && tid < CTA_KV) row_offs[((kv_pos.count + 1) & 3) * CTA_KV + table_slot(tid)] = next_off;
      }
      if constexpr (!FP8_MMA) issue(IsKey<false>{}, VPos{kv_pos.count - 1}, n_tiles - 1);
      if constexpr (kFp8) {  // the item's last tiles
        cp_async_wait<0>();
#pragma unroll
        for (int i = 0; i < kPending; ++i) {
          if (pending[i].valid()) widen(pending[i]);
          pending[i] = Pending{0u, 0};
        }
      }
    }
    cp_async_wait_all();  // no copy outlives its thread
    grid_dependency_launch_dependents();  // the next kernel may start setting up
  }
};

#endif

}  // namespace tessera
