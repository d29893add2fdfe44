// MLA kernel family on Hopper (sm_90a), the consumer warpgroup of the 16-row
// form (query tiles of at most 16 fused rows: H x q_len <= 16, the decode
// step of tensor-parallel serving). With the rows as the wgmmas' N, no
// padded row is multiplied (the 64-row form multiplies four times the work
// at H = 16, about as long as the tile's load):
//
//   S^T = K Q^T         wgmma m64n16k16 x 36, K (the stage) and Q both K-major
//   column maxima of the 64 keys: shuffles over a warp's 16, then the four
//   warps' through shared memory (double-buffered by tile parity);
//   P^T = exp2(S^T * scale - m) into the P tile, [16 rows][64 keys] K-major;
//   O^T += V^T P^T      wgmma m64n16k16 x 32, V^T the stage read MN-major
//                       (as stored), eight 64-feature blocks of O^T
//
// so O^T (512 x 16 fp32) is 64 registers a thread and one warpgroup holds
// it. Each stage goes back as soon as its P V is done. A thread's S^T values
// are keys 16w + g (+ 8) of columns 8j + 2q (+ 1) (warp w, lane 4g + q); its
// O^T values features 16w + g (+ 8) of each block, same columns.
#pragma once
#include "tessera/device/arch/warpgroup.cuh"
#include "tessera/device/kernels/common/cooperative_merge.cuh"
#include "tessera/device/kernels/mla/kernel.cuh"
#include "tessera/device/kernels/mla_sm90/producer.cuh"
#include "tessera/device/kernels/mla_sm90/widener.cuh"
#include "tessera/device/kernels/prefill_sm90/mma.cuh"

namespace tessera {

#if defined(__CUDACC__) || defined(__CUDACC_RTC__)

// Named barriers of consumer c: these + kMlaNarrowBars * c; then the
// consumers' split-KV merge barrier (MlaSm90NarrowConsumer::MERGE_BAR).
constexpr int kMlaNarrowMaxBar = 1;  // a tile's column maxima (then the sums at the end)
constexpr int kMlaNarrowPBar = 2;    // the P tile complete
constexpr int kMlaNarrowBars = 2;

// Scratch of the consumer beside the pipeline (static shared memory).
struct MlaSm90NarrowExchange {
  float max[2][4][kMlaSm90NarrowRows];  // by tile parity, per warp: column maxima over its 16 keys
  float sum[4][kMlaSm90NarrowRows];     // per warp: the item's column sums over its keys
  int is_last;
};

// CONSUMERS: 1, or 2 for the pair form (32-row query tiles); consumer c
// computes rows 16c.. of the tile.
template <typename T, typename DO, bool CAUSAL, int CONSUMERS = 1>
struct MlaSm90NarrowConsumer {
  static constexpr int ROWS = kMlaSm90NarrowRows;                  // this consumer's rows
  static constexpr int TILE_ROWS = CONSUMERS * ROWS;               // the query tile's
  static constexpr int THREADS = CONSUMERS * 128;                  // the consumers'
  static constexpr int BLOCKS_O = kMlaDimCkv / 64;                 // O^T's 64-feature blocks
  static constexpr u32 KV_BLOCK = kMlaSm90Keys * 128;              // a stage's [64 keys][64 features] block
  static constexpr u32 Q_BLOCK = TILE_ROWS * 128;                  // Q's [tile rows][64 features] block
  static constexpr u32 STAGE_BYTES = kMlaSm90Blocks * KV_BLOCK;
  static constexpr int MERGE_BAR = kMlaNarrowMaxBar + kMlaNarrowBars * CONSUMERS;

  const MlaParams& p;
  MlaSm90Pipeline& pipe;
  MlaSm90NarrowStorageN<CONSUMERS>& sm;
  MlaSm90NarrowExchange& ex;  // this consumer's
  int* is_last;               // the consumers' shared flag of a split tile's merge
  int cid;                    // which consumer

#if TESSERA_HAS_WGMMA
  // S^T = K Q^T over the stage at k_desc.
  __device__ __forceinline__ static void issue_s(float (&s)[8], u64 k_desc, u64 q_desc) {
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kMlaDimQK / 16; ++kk)
      wgmma_ss(s, desc_at(k_desc, (kk / 4) * KV_BLOCK + (kk % 4) * 32), desc_at(q_desc, (kk / 4) * Q_BLOCK + (kk % 4) * 32),
               kk > 0, T{}, WgmmaN<16>{});
    wgmma_commit();
  }
  // O^T += V^T P^T over the tile's 64 keys; v_desc: the stage, MN-major.
  __device__ __forceinline__ static void issue_pv(float (&o)[BLOCKS_O][8], u64 v_desc, u64 p_desc) {
    wgmma_fence();
#pragma unroll
    for (int blk = 0; blk < BLOCKS_O; ++blk)
#pragma unroll
      for (int kk = 0; kk < kMlaSm90Keys / 16; ++kk)
        wgmma_ss_ta(o[blk], desc_at(v_desc, blk * KV_BLOCK + kk * 16 * 128), desc_at(p_desc, kk * 32), 1, T{},
                    WgmmaN<16>{});
    wgmma_commit();
  }
#endif

  __device__ __forceinline__ void run() {
#if TESSERA_HAS_WGMMA
    cid = CONSUMERS == 1 ? 0 : warp_uniform(cid);  // what derives from it stays in uniform registers
    const int tid = threadIdx.x - 128 - 128 * cid, warp = tid / 32, lane = tid % 32, g = lane / 4, quad = lane % 4;
    const int H = p.group, max_bar = kMlaNarrowMaxBar + kMlaNarrowBars * cid, p_bar = kMlaNarrowPBar + kMlaNarrowBars * cid;
    const u64 q_desc = wgmma_desc(smem_addr(&sm.q[0][0]) + static_cast<u32>(cid * ROWS * 128), 16, 1024);
    const u64 k_desc0 = wgmma_desc(smem_addr(&sm.kv[0][0][0]), 16, 1024);
    const u64 v_desc0 = wgmma_desc(smem_addr(&sm.kv[0][0][0]), KV_BLOCK, 1024);
    const u64 p_desc = wgmma_desc(smem_addr(&sm.p[cid][0]), 16, 1024);
    T* const p_tile = reinterpret_cast<T*>(&sm.p[cid][0]);
    RingPos<1> q_pos;
    RingPos<kMlaSm90Stages> kv_pos;
    WorkQueue<PrefillWorkItem, QueueLoad::kAhead, MlaParams> queue(p, blockIdx.x);
    grid_dependency_wait();  // before any write of o, lse or partial states
    grid_dependency_launch_dependents();
    const float scale_log2 = p.sm_scale * kLog2e;
    int parity = 0;  // of the column-maxima buffer, over every tile of the CTA
    for (int wi = queue.begin; wi < queue.end; ++wi) {
      PrefillWorkItem w = queue.take(wi);
      w.kv_start = warp_uniform(w.kv_start);
      w.kv_end = warp_uniform(w.kv_end);
      const int qo_len = w.qo_len, row0 = w.q_tile * TILE_ROWS + ROWS * cid;
      const int n_tiles = (w.kv_end - w.kv_start + kMlaSm90Keys - 1) / kMlaSm90Keys;
      const int causal_shift = w.kv_len - qo_len;
      // The thread's four columns: c = 2j + e, column 8j + 2 quad + e.
      int col[4], qo[4];
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        col[c] = 8 * (c / 2) + 2 * quad + c % 2;
        qo[c] = (row0 + col[c]) / H;
      }

      float o[BLOCKS_O][8];
#pragma unroll
      for (int b = 0; b < BLOCKS_O; ++b)
#pragma unroll
        for (int i = 0; i < 8; ++i) o[b][i] = 0.f;
      float m[4], d[4];
#pragma unroll
      for (int c = 0; c < 4; ++c) m[c] = neg_inf(), d[c] = 0.f;
      if (n_tiles > 0) {
        mbarrier_wait(smem_addr(&pipe.q_full), q_pos.phase());
        for (int t = 0; t < n_tiles; ++t, kv_pos = kv_pos.next(), parity ^= 1) {
          const int stage = kv_pos.index();
          mbarrier_wait(smem_addr(&pipe.kv_full[stage]), kv_pos.phase());
          float s[8];
          issue_s(s, desc_at(k_desc0, stage * STAGE_BYTES), q_desc);
          wgmma_wait<0>();
          wgmma_keep(s);
          if (t == n_tiles - 1) mbarrier_arrive(smem_addr(&pipe.q_empty));

          // Mask: keys past the chunk, and (causal) past a column's diagonal.
          const int tile0 = w.kv_start + t * kMlaSm90Keys, key0 = tile0 + 16 * warp + g;
          if (tile0 + kMlaSm90Keys > w.kv_end || (CAUSAL && tile0 + kMlaSm90Keys - 1 > row0 / H + causal_shift)) {
#pragma unroll
            for (int i = 0; i < 8; ++i) {
              const int c = 2 * (i / 4) + i % 2, pos = key0 + 8 * ((i / 2) % 2);
              bool keep = pos < w.kv_end;
              if constexpr (CAUSAL) keep = keep && pos <= qo[c] + causal_shift;
              if (!keep) s[i] = neg_inf();
            }
          }
          // Column maxima: the thread's two keys, the warp's 16 (lanes of one
          // quad position), then the four warps'.
          float mx[4];
#pragma unroll
          for (int c = 0; c < 4; ++c) {
            const int i = 4 * (c / 2) + c % 2;
            float x = fmaxf(s[i], s[i + 2]);
            x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 4));
            x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 8));
            x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 16));
            mx[c] = x;
            if (g == 0) ex.max[parity][warp][col[c]] = x;
          }
          named_barrier_sync(max_bar, 128);
          float factor[4], m_safe[4];
#pragma unroll
          for (int c = 0; c < 4; ++c) {
            float x = mx[c];
#pragma unroll
            for (int v = 0; v < 4; ++v) x = fmaxf(x, ex.max[parity][v][col[c]]);
            const float m_new = fmaxf(m[c], x * scale_log2);  // sm_scale > 0: the maximum commutes with it
            m_safe[c] = m_new == neg_inf() ? 0.f : m_new;     // all masked so far: weights 0, not NaN
            factor[c] = fast_exp2(m[c] - m_safe[c]);
            m[c] = m_new;
          }
#pragma unroll
          for (int i = 0; i < 8; ++i) {
            const int c = 2 * (i / 4) + i % 2;
            s[i] = fast_exp2(fmaf(s[i], scale_log2, -m_safe[c]));
          }
#pragma unroll
          for (int c = 0; c < 4; ++c) {
            const int i = 4 * (c / 2) + c % 2;
            d[c] = d[c] * factor[c] + s[i] + s[i + 2];
          }
#pragma unroll
          for (int b = 0; b < BLOCKS_O; ++b)
#pragma unroll
            for (int i = 0; i < 8; ++i) o[b][i] *= factor[2 * (i / 4) + i % 2];
          // P^T into the P tile: element (column n, key k) at n * 128 + chunk
          // (k / 8) ^ (n % 8), the K-major swizzle. The last tile's P V is
          // done (waited below), so the tile is free.
#pragma unroll
          for (int i = 0; i < 8; ++i) {
            const int n = col[2 * (i / 4) + i % 2], k = 16 * warp + g + 8 * ((i / 2) % 2);
            p_tile[n * 64 + (((k / 8) ^ (n % 8)) * 8) + k % 8] = from_float<T>(s[i]);
          }
          fence_proxy_async();  // generic stores -> the wgmmas' async proxy
          named_barrier_sync(p_bar, 128);
          issue_pv(o, desc_at(v_desc0, stage * STAGE_BYTES), p_desc);
          wgmma_wait<0>();
          wgmma_keep(o);
          mbarrier_arrive(smem_addr(&pipe.kv_empty[stage]));
        }
        q_pos = q_pos.next();
      }
      epilogue(w, row0, qo, col, o, m, d, tid, warp, g, max_bar, wi + 1 == queue.end);
    }
#else
    __trap();  // Hopper kernels are only built for sm_90a
#endif
  }

  // Column sums over the four warps, then the rows (o, lse) or a partial
  // state and, for a split tile, its merge: from registers for a tile cut in
  // two, else merge_split_tile.
  __device__ __forceinline__ void epilogue(const PrefillWorkItem& w, int row0, const int (&qo)[4], const int (&col)[4],
                                           const float (&o)[BLOCKS_O][8], const float (&m)[4], float (&d)[4], int tid,
                                           int warp, int g, int max_bar, bool queue_ends_here) {
    const int H = p.group, qo_start = w.qo_begin, qo_len = w.qo_len;
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      d[c] += __shfl_xor_sync(0xffffffffu, d[c], 4);
      d[c] += __shfl_xor_sync(0xffffffffu, d[c], 8);
      d[c] += __shfl_xor_sync(0xffffffffu, d[c], 16);
    }
    named_barrier_sync(max_bar, 128);  // every thread done reading the previous item's sums
#pragma unroll
    for (int c = 0; c < 4; ++c)
      if (g == 0) ex.sum[warp][col[c]] = d[c];
    named_barrier_sync(max_bar, 128);
    float inv[4], lse[4];
    int head[4];
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      const float dc = ex.sum[0][col[c]] + ex.sum[1][col[c]] + ex.sum[2][col[c]] + ex.sum[3][col[c]];
      const bool empty = dc == 0.f;
      inv[c] = (empty ? 0.f : row_inverse(dc)) * p.o_scale;
      lse[c] = empty ? neg_inf() : m[c] + row_log2(dc);
      head[c] = row0 + col[c] - qo[c] * H;
    }
    // Features 64 blk + 16 warp + g (+ 8) of the thread's columns.
    const int feat0 = 16 * warp + g;
    if (w.partial_slot < 0) {
      store_rows(w, qo, head, o, inv, lse, feat0, warp == 0 && g == 0);
      return;
    }
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const int c = 2 * (i / 4) + i % 2;
      const i64 base = static_cast<i64>(w.partial_slot) * TILE_ROWS + ROWS * cid + col[c];
      float* dst = p.partial_o + base * kMlaDimCkv + feat0 + 8 * ((i / 2) % 2);
#pragma unroll
      for (int b = 0; b < BLOCKS_O; ++b) dst[64 * b] = o[b][i] * inv[c];
    }
    if (warp == 0 && g == 0) {
#pragma unroll
      for (int c = 0; c < 4; ++c)
        p.partial_lse[static_cast<i64>(w.partial_slot) * TILE_ROWS + ROWS * cid + col[c]] = lse[c];
    }
    // The merge takes the consumers together (thread mtid of THREADS).
    const int mtid = tid + 128 * cid;
    auto sync = [] { named_barrier_sync(MERGE_BAR, THREADS); };
    // One warpgroup merging 16 rows (half the 64-row form's threads a row)
    // takes 16 features a thread: twice the loads in flight per chunk,
    // which is what bounds a merge of many chunks (a long context cut
    // across the SMs). The pair takes 8, so its slices are 4 rows, as the
    // 64-row form's: twice the slices for the chunks' CTAs to share.
    if (w.num_chunks != 2) {
      MlaVariant variant(p, w.request, qo_len, w.kv_len);
      merge_split_tile<MlaVariant, DO, kMlaDimCkv, TILE_ROWS, THREADS, 16 / CONSUMERS>(
          p, variant, w, qo_start, qo_len, w.q_tile * TILE_ROWS, w.request, 0, mtid, is_last, sync, queue_ends_here);
      return;
    }
    int* const counter = p.counters + w.counter * gridDim.y + blockIdx.y;
    if (!split_chunk_is_last(counter, w.num_chunks, mtid, is_last, sync)) return;
    merge_pair_in_registers(w, qo, col, head, o, inv, lse, feat0, warp == 0 && g == 0);
    if (mtid == 0) *counter = 0;
  }

  // o / lse of the thread's values: v[b][i] * scale[c], features 64 b +
  // feat0 (+ 8) of its columns.
  __device__ __forceinline__ void store_rows(const PrefillWorkItem& w, const int (&qo)[4], const int (&head)[4],
                                             const float (&v)[BLOCKS_O][8], const float (&scale)[4],
                                             const float (&lse)[4], int feat0, bool lse_writer) const {
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const int c = 2 * (i / 4) + i % 2;
      if (qo[c] >= w.qo_len) continue;
      DO* dst = static_cast<DO*>(p.o) + (w.qo_begin + qo[c]) * p.o_stride_n + head[c] * p.o_stride_h + feat0 +
                8 * ((i / 2) % 2);
#pragma unroll
      for (int b = 0; b < BLOCKS_O; ++b) dst[64 * b] = from_float<DO>(v[b][i] * scale[c]);
    }
    if (lse_writer && p.lse != nullptr) {
#pragma unroll
      for (int c = 0; c < 4; ++c)
        if (qo[c] < w.qo_len) p.lse[static_cast<i64>(w.qo_begin + qo[c]) * p.num_qo_heads + head[c]] = lse[c];
    }
  }

  // The merge of a tile cut in two, by the chunk that came last: its own
  // state is still in registers, so it reads only the other chunk's partial,
  // in one round trip (a thread's 64 values in flight together), where the
  // row-by-row merge re-reads both chunks a row group per round trip. The
  // sum is chunk 0's term plus chunk 1's with this chunk's values exactly as
  // it stored them, so the bits do not depend on which chunk came last.
  __device__ __forceinline__ void merge_pair_in_registers(const PrefillWorkItem& w, const int (&qo)[4],
                                                          const int (&col)[4], const int (&head)[4],
                                                          const float (&o)[BLOCKS_O][8], const float (&inv)[4],
                                                          const float (&lse)[4], int feat0, bool lse_writer) const {
    const bool mine_first = w.partial_slot == w.first_slot;
    const i64 other = mine_first ? w.first_slot + 1 : w.first_slot;
    float v[BLOCKS_O][8], lse_other[4];
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const float* src =
          p.partial_o + (other * TILE_ROWS + ROWS * cid + col[2 * (i / 4) + i % 2]) * kMlaDimCkv + feat0 + 8 * ((i / 2) % 2);
#pragma unroll
      for (int b = 0; b < BLOCKS_O; ++b) v[b][i] = __ldcg(src + 64 * b);
    }
#pragma unroll
    for (int c = 0; c < 4; ++c) lse_other[c] = __ldcg(p.partial_lse + other * TILE_ROWS + ROWS * cid + col[c]);
    float w0[4], w1[4], scale[4], out_lse[4];
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      const float l0 = mine_first ? lse[c] : lse_other[c], l1 = mine_first ? lse_other[c] : lse[c];
      const float m = fmaxf(l0, l1), m_safe = m == neg_inf() ? 0.f : m;
      w0[c] = fast_exp2(l0 - m_safe);  // 0 for an empty chunk
      w1[c] = fast_exp2(l1 - m_safe);
      const float denom = w0[c] + w1[c];
      scale[c] = denom > 0.f ? 1.f / denom : 0.f;
      out_lse[c] = denom > 0.f ? m + log2f(denom) : neg_inf();
    }
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const int c = 2 * (i / 4) + i % 2;
#pragma unroll
      for (int b = 0; b < BLOCKS_O; ++b) {
        const float mine = o[b][i] * inv[c];
        v[b][i] = mine_first ? fmaf(w1[c], v[b][i], w0[c] * mine) : fmaf(w1[c], mine, w0[c] * v[b][i]);
      }
    }
    store_rows(w, qo, head, v, scale, out_lse, feat0, lse_writer);
  }
};

// Over fp8 caches the 16-row kernel has four warpgroups, so setmaxnreg
// gives the consumer (O^T, 64 registers a thread, and its S^T) what the
// producer and the wideners do not need.
struct MlaSm90NarrowFp8Registers {
  static constexpr int PRODUCER = 56, CONSUMER = 240, WIDENER = 104;
  static_assert((PRODUCER + CONSUMER + 2 * WIDENER) * 128 <=
                    launch_registers(kMlaSm90NarrowFp8Threads, 1) * kMlaSm90NarrowFp8Threads,
                "the split must fit the CTA's launch registers");
};

// The pair form: three warpgroups, so setmaxnreg moves what the producer
// does not need to the two consumers.
struct MlaSm90PairRegisters {
  static constexpr int PRODUCER = 56, CONSUMER = 224;
  static_assert((PRODUCER + 2 * CONSUMER) * 128 <= launch_registers(kMlaSm90PairThreads, 1) * kMlaSm90PairThreads,
                "the split must fit the CTA's launch registers");
};

// The 16-row kernel: a producer warpgroup (producer.cuh, 16-row Q tiles)
// and one consumer warpgroup; over fp8 caches (DKV) two wideners
// (widener.cuh) widen the producer's raw rows into the T stages, so the
// consumer is the same; the caches' scales are folded into p.sm_scale,
// p.o_scale and p.pe_scale. CONSUMERS = 2: the pair form (32-row Q tiles,
// two consumers on every stage; 16-bit caches).
template <typename T, typename DKV, typename DO, bool CAUSAL, int CONSUMERS = 1>
__device__ __forceinline__ void batch_mla_sm90_narrow(const MlaParams& p) {
  static_assert(sizeof(T) == 2 && sizeof(DO) == 2, "16-bit q and o");
  static_assert(is_fp8<DKV> || sizeof(DKV) == 2, "caches of q's type, or fp8");
  static_assert(CONSUMERS == 1 || (CONSUMERS == 2 && !is_fp8<DKV>), "one consumer, or the pair over 16-bit caches");
  extern __shared__ uint4 smem_raw[];
  __shared__ MlaSm90Pipeline pipe;
  __shared__ MlaSm90NarrowExchange ex[CONSUMERS];
  using Storage = typename MlaSm90NarrowStorageFor<is_fp8<DKV>, CONSUMERS>::type;
  auto& sm = *reinterpret_cast<Storage*>(
      (reinterpret_cast<size_t>(smem_raw) + 1023) & ~static_cast<size_t>(1023));  // wgmma's swizzle atoms
  using Consumer = MlaSm90NarrowConsumer<T, DO, CAUSAL, CONSUMERS>;
  if constexpr (is_fp8<DKV>) {
    __shared__ MlaSm90RawRing ring;
    if (threadIdx.x == 0) {
      pipe.init(128, 256);
      ring.init();
    }
    __syncthreads();
    if (threadIdx.x < 128) {
      setmaxnreg_dec<MlaSm90NarrowFp8Registers::PRODUCER>();
      MlaSm90Producer<T, DKV, Storage, kMlaSm90NarrowRows>{p, pipe, sm, &ring}.run();
    } else if (threadIdx.x < 256) {
      setmaxnreg_inc<MlaSm90NarrowFp8Registers::CONSUMER>();
      Consumer{p, pipe, sm, ex[0], &ex[0].is_last, 0}.run();
    } else {
      setmaxnreg_dec<MlaSm90NarrowFp8Registers::WIDENER>();
      MlaSm90Widener<T, DKV>{p, pipe, sm, ring, static_cast<int>(threadIdx.x / 128) - 2}.run();
    }
  } else if constexpr (CONSUMERS == 2) {
    if (threadIdx.x == 0) pipe.init(256);
    __syncthreads();
    if (threadIdx.x < 128) {
      setmaxnreg_dec<MlaSm90PairRegisters::PRODUCER>();
      MlaSm90Producer<T, DKV, Storage, kMlaSm90PairRows>{p, pipe, sm}.run();
    } else {
      setmaxnreg_inc<MlaSm90PairRegisters::CONSUMER>();
      const int c = static_cast<int>(threadIdx.x / 128) - 1;
      Consumer{p, pipe, sm, ex[c], &ex[0].is_last, c}.run();
    }
  } else {
    if (threadIdx.x == 0) pipe.init(kMlaSm90NarrowThreads - 128);
    __syncthreads();
    if (threadIdx.x < 128)
      MlaSm90Producer<T, DKV, Storage, kMlaSm90NarrowRows>{p, pipe, sm}.run();
    else
      Consumer{p, pipe, sm, ex[0], &ex[0].is_last, 0}.run();
  }
}

#endif

}  // namespace tessera
