// MLA kernel family on Hopper (sm_90a), the producer warpgroup: walks the
// CTA's work queue and gathers, for each item, the Q tile (q_nope | q_pe rows
// of 64 fused rows) and then each 64-key KV tile (ckv | kpe rows through the
// page table) with cp.async copies that arrive on the buffers' mbarriers
// when they land (cp.async.mbarrier.arrive.noinc), so the producer never
// waits for its own copies, only for free buffers. 16-bit tiles land in the
// 128-byte-swizzled wgmma layout of MlaSm90Storage; fp8 rows land as they
// are (576 bytes a row) for the consumers to widen, except in the 16-row
// form, whose producer copies them into a ring of raw half tiles for the
// widener warpgroups (widener.cuh). Page ids are read a tile ahead, while the
// producer waits for a free stage.
#pragma once
#include "tessera/device/arch/cp_async.cuh"
#include "tessera/device/arch/fp8.cuh"
#include "tessera/device/arch/grid_dependency.cuh"
#include "tessera/device/arch/mbarrier.cuh"
#include "tessera/device/kernels/common/work_queue.cuh"
#include "tessera/device/kernels/mla/mainloop.cuh"
#include "tessera/device/kernels/prefill_sm90/pipeline.cuh"

namespace tessera {

#if defined(__CUDACC__) || defined(__CUDACC_RTC__)

// The Q buffer and the KV stages: full barriers count the producer's 128
// threads (one noinc arrival each, when its copies landed), empty barriers
// the 256 consumer threads.
struct MlaSm90Pipeline {
  u64 q_full, q_empty;
  u64 kv_full[kMlaSm90Stages], kv_empty[kMlaSm90Stages];
  // fill_threads: the threads that arrive on a full stage (the producer's,
  // or over fp8 caches on the 16-row form both wideners').
  __device__ __forceinline__ void init(int consumer_threads, int fill_threads = 128) {
    mbarrier_init(smem_addr(&q_full), 128);
    mbarrier_init(smem_addr(&q_empty), consumer_threads);
    for (int s = 0; s < kMlaSm90Stages; ++s) {
      mbarrier_init(smem_addr(&kv_full[s]), fill_threads);
      mbarrier_init(smem_addr(&kv_empty[s]), consumer_threads);
    }
  }
};

// The 16-row form over fp8 caches: the raw half-tile slots' barriers. full
// counts the producer's 128 threads (one noinc arrival each, when its copies
// landed), empty the 128 of the widener that takes the slot's half.
struct MlaSm90RawRing {
  u64 full[kMlaSm90NarrowRawSlots], empty[kMlaSm90NarrowRawSlots];
  __device__ __forceinline__ void init() {
    for (int s = 0; s < kMlaSm90NarrowRawSlots; ++s) {
      mbarrier_init(smem_addr(&full[s]), 128);
      mbarrier_init(smem_addr(&empty[s]), 128);
    }
  }
};

// Copies 64 rows into a swizzled tile of nine [64][64] blocks at shared
// address dst: row r's features 0..511 from nope + offs(r).nope (blocks 0..7),
// 512..575 from pe + offs(r).pe (block 8). Thread t of the warpgroup copies
// 16-byte chunk t % 8 of rows t / 8 + 16 i; chunk c of row r sits at chunk
// c ^ (r % 8) of the row's 128 bytes in each block.
// The element offsets of the rows thread t copies (rows t / 8 + 16 i).
struct MlaSm90Rows {
  MlaRowOffset at[kMlaSm90Rows / 16];
};
template <int ROWS = kMlaSm90Rows, typename Offsets>
__device__ __forceinline__ MlaSm90Rows mla_sm90_rows(int tid, Offsets offs) {
  MlaSm90Rows r;
#pragma unroll
  for (int i = 0; i < ROWS / 16; ++i) r.at[i] = offs(tid / 8 + 16 * i);
  return r;
}

// Copies ROWS rows (64, or a 16-row Q tile) into a swizzled tile of nine
// [ROWS][64] blocks at shared address dst: row r's features 0..511 from
// nope + rows(r).nope (blocks 0..7), 512..575 from pe + rows(r).pe (block
// 8); a row with nope < 0 is zero-filled. Thread t of the warpgroup copies
// 16-byte chunk t % 8 of its rows; chunk c of row r sits at chunk c ^ (r %
// 8) of the row's 128 bytes in each block.
template <int ROWS = kMlaSm90Rows, typename T>
__device__ __forceinline__ void mla_sm90_load_tile(u32 dst, const T* nope, const T* pe, int tid, const MlaSm90Rows& rows) {
  constexpr u32 BLOCK = ROWS * 128;
  const int cc = tid % 8;
#pragma unroll
  for (int i = 0; i < ROWS / 16; ++i) {
    const int row = tid / 8 + 16 * i;
    const MlaRowOffset off = rows.at[i];
    const bool ok = off.nope >= 0;
    // One address a row, its chunks at immediate offsets from it (a select
    // per chunk took more instructions than the copies themselves).
    const T* src_nope = nope + (ok ? off.nope : 0) + cc * 8;
    const T* src_pe = pe + (ok ? off.pe : 0) + cc * 8;
    const u32 base = dst + static_cast<u32>(row) * 128 + static_cast<u32>((cc ^ (row & 7)) << 4);
#pragma unroll
    for (int b = 0; b < kMlaDimCkv / 64; ++b) cp_async_16_or_zeros(base + b * BLOCK, src_nope + b * 64, ok);
    cp_async_16_or_zeros(base + (kMlaDimCkv / 64) * BLOCK, src_pe, ok);
  }
}

// The shared address of the first stage the producer fills: the 16-bit tiles,
// or the raw fp8 rows.
__device__ __forceinline__ u32 mla_sm90_stages(MlaSm90Storage<false>& s) { return smem_addr(&s.kv[0][0][0]); }
__device__ __forceinline__ u32 mla_sm90_stages(MlaSm90Storage<true>& s) { return smem_addr(&s.raw[0][0]); }
template <int CONSUMERS>
__device__ __forceinline__ u32 mla_sm90_stages(MlaSm90NarrowStorageN<CONSUMERS>& s) { return smem_addr(&s.kv[0][0][0]); }

// A KV position's slot in its page (shifts for power-of-two pages).
__device__ __forceinline__ int mla_sm90_slot(const MlaParams& p, int pos) {
  return pos - (p.page_shift >= 0 ? (pos >> p.page_shift) << p.page_shift : pos / p.page_size * p.page_size);
}

// The fp8 path: tile rows' page ids, two per lane (rows lane and lane + 32;
// -1: the row is past the chunk or its id is bad, zero-filled), every warp
// holding all 64 and handing them out with shuffles.
struct MlaSm90Pages {
  int id[2];
};

// Copies 64 fp8 rows into a raw stage at shared address dst (row r at r *
// 576: ckv's 512 bytes, then kpe's 64). Warp w copies ckv rows w, w + 4, ...
// one 16-byte chunk a lane (a row's 512 bytes per instruction), and all 128
// threads copy the kpe chunks (four a row).
template <typename DKV>
__device__ __forceinline__ void mla_sm90_load_raw(u32 dst, const MlaParams& p, const DKV* ckv, const DKV* kpe, int tid,
                                                  const MlaSm90Pages& pages, int start) {
  const int lane = tid % 32, warp = tid / 32;
  auto page_of = [&](int row) { return __shfl_sync(0xffffffffu, pages.id[row >> 5], row & 31); };
  auto src_row = [&](int row, int page, i64 page_stride, i64 token_stride) {
    return page * page_stride + mla_sm90_slot(p, start + row) * token_stride;
  };
#pragma unroll 4
  for (int i = 0; i < kMlaSm90Keys / 4; ++i) {
    const int row = warp + 4 * i, page = page_of(row);
    const bool ok = page >= 0;
    cp_async_16(dst + static_cast<u32>(row * kMlaDimQK + lane * 16),
                ok ? ckv + src_row(row, page, p.ckv_page_stride, p.ckv_token_stride) + lane * 16 : ckv, ok);
  }
#pragma unroll
  for (int j = 0; j < 2; ++j) {
    const int row = tid / 4 + 32 * j, c = tid % 4, page = page_of(row);
    const bool ok = page >= 0;
    cp_async_16(dst + static_cast<u32>(row * kMlaDimQK + kMlaDimCkv + c * 16),
                ok ? kpe + src_row(row, page, p.kpe_page_stride, p.kpe_token_stride) + c * 16 : kpe, ok);
  }
}

// The 16-row form over fp8 caches: the producer copies each half tile's raw
// rows (32 x 576 bytes) into a slot of MlaSm90NarrowFp8Storage::raw, and
// a widener warpgroup widens them into the 16-bit stage. Thread t of
// either copies / widens rows t / 8 + 16 j of the half (j = 0, 1; at[2 h +
// j] of the tile's MlaSm90Rows), ckv bytes 16 (t % 8) + 128 k of each and,
// for t % 8 < 4, kpe bytes 16 (t % 8). A piece widens into two adjacent
// 16-byte chunks of one [64][64] block of the stage; a quarter warp reads
// one row's 128 bytes.
template <typename DKV>
__device__ __forceinline__ void mla_sm90_copy_raw_half(u32 raw, const DKV* ckv, const DKV* kpe, int tid,
                                                       const MlaSm90Rows& rows, int half) {
  const int cc = tid % 8;
#pragma unroll
  for (int j = 0; j < 2; ++j) {
    const int row = tid / 8 + 16 * j;
    const MlaRowOffset off = rows.at[2 * half + j];
    const bool ok = off.nope >= 0;  // else zeros: a masked key never meets a stale slot's NaN
    const DKV* src = ckv + (ok ? off.nope : 0) + cc * 16;
    const u32 dst = raw + static_cast<u32>(row * kMlaDimQK + cc * 16);
#pragma unroll
    for (int k = 0; k < kMlaDimCkv / 128; ++k) cp_async_16_or_zeros(dst + 128 * k, src + 128 * k, ok);
    if (cc < kMlaDimKpe / 16) cp_async_16_or_zeros(dst + kMlaDimCkv, kpe + (ok ? off.pe : 0) + cc * 16, ok);
  }
}

template <typename T, typename DKV>
__device__ __forceinline__ void mla_sm90_widen_raw_half(u32 stage, u32 raw, int tid, int half, float pe_scale) {
  constexpr u32 BLOCK = kMlaSm90Keys * 128;
  const int cc = tid % 8;
  auto put = [&](u32 row_base, int row, int block, int chunk, uint4 x, bool scale) {
    u32 w[8];
    fp8x4_to_16x2<DKV, T>(x.x, w[0], w[1]);
    fp8x4_to_16x2<DKV, T>(x.y, w[2], w[3]);
    fp8x4_to_16x2<DKV, T>(x.z, w[4], w[5]);
    fp8x4_to_16x2<DKV, T>(x.w, w[6], w[7]);
    if (scale) {
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        float lo, hi;
        unpack2(w[i], lo, hi, T{});
        w[i] = pack2(lo * pe_scale, hi * pe_scale, T{});
      }
    }
    // A quarter warp is one row's eight pieces: threads 0-3 store the
    // even chunk first and threads 4-7 the odd one (the other block), so
    // each store instruction's eight chunks are distinct, no bank conflict.
    const u32 base = row_base + static_cast<u32>(block) * BLOCK;
    const u32 even = base + (static_cast<u32>(chunk ^ (row & 7)) << 4);
    const u32 odd = base + (static_cast<u32>((chunk + 1) ^ (row & 7)) << 4);
    const uint4 lo = make_uint4(w[0], w[1], w[2], w[3]), hi = make_uint4(w[4], w[5], w[6], w[7]);
    const bool odd_first = cc >= 4;
    st_shared_16(odd_first ? odd : even, odd_first ? hi : lo);
    st_shared_16(odd_first ? even : odd, odd_first ? lo : hi);
  };
#pragma unroll
  for (int j = 0; j < 2; ++j) {
    const int raw_row = tid / 8 + 16 * j, row = kMlaSm90NarrowRawRows * half + raw_row;
    const u32 src = raw + static_cast<u32>(raw_row * kMlaDimQK + cc * 16);
    const u32 row_base = stage + static_cast<u32>(row) * 128;
#pragma unroll
    for (int k = 0; k < kMlaDimCkv / 128; ++k)
      put(row_base, row, 2 * k + cc / 4, 2 * (cc % 4), ld_shared_16(src + 128 * k), false);
    if (cc < kMlaDimKpe / 16)
      put(row_base, row, kMlaDimCkv / 64, 2 * cc, ld_shared_16(src + kMlaDimCkv), pe_scale != 1.f);
  }
}

// Storage: MlaSm90Storage<kFp8> with 64-row Q tiles; with Q_ROWS = 16
// MlaSm90NarrowStorage (16-bit caches) or MlaSm90NarrowFp8Storage (fp8
// caches, copied raw for the wideners); with Q_ROWS = 32 MlaSm90PairStorage.
template <typename T, typename DKV, typename Storage = MlaSm90Storage<is_fp8<DKV>>, int Q_ROWS = kMlaSm90Rows>
struct MlaSm90Producer {
  static constexpr bool kFp8 = is_fp8<DKV>;
  // fp8 rows copied into a ring of raw half tiles, for the widener warpgroups.
  static constexpr bool kWiden = kFp8 && Q_ROWS == kMlaSm90NarrowRows;
  static_assert(!kWiden || sizeof(Storage) == sizeof(MlaSm90NarrowFp8Storage), "the raw ring's storage");
  const MlaParams& p;
  MlaSm90Pipeline& pipe;
  Storage& sm;
  MlaSm90RawRing* ring = nullptr;  // kWiden: the raw slots' barriers

  __device__ __forceinline__ void run() {
    const int tid = threadIdx.x;  // 0..127
    const T* q_nope = static_cast<const T*>(p.q_nope);
    const T* q_pe = static_cast<const T*>(p.q_pe);
    const DKV* ckv = static_cast<const DKV*>(p.ckv);
    const DKV* kpe = static_cast<const DKV*>(p.kpe);
    const int H = p.group;
    const u32 q_addr = smem_addr(&sm.q[0][0]), kv_addr = mla_sm90_stages(sm);
    constexpr u32 STAGE_BYTES = kFp8 && !kWiden ? kMlaSm90Keys * kMlaDimQK : sizeof(sm.kv[0]);
    WorkQueue<PrefillWorkItem, QueueLoad::kFirst, MlaParams> queue(p, blockIdx.x);
    RingPos<1> q_pos;
    RingPos<kMlaSm90Stages> kv_pos;
    RingPos<kMlaSm90NarrowRawSlots> raw_pos;  // kWiden
    grid_dependency_wait();  // q and the caches may be the previous kernel's outputs
    for (int wi = queue.begin; wi < queue.end; ++wi) {
      const PrefillWorkItem w = queue.take(wi);
      const int n_tiles = (w.kv_end - w.kv_start + kMlaSm90Keys - 1) / kMlaSm90Keys;
      if (n_tiles <= 0) continue;  // the consumers write the empty rows without Q
      const int row0 = w.q_tile * Q_ROWS, qo_start = w.qo_begin, qo_len = w.qo_len;
      const MlaSm90Rows q_rows = mla_sm90_rows<Q_ROWS>(tid, [&](int r) -> MlaRowOffset {
        const int f = row0 + r, qo = f / H, h = f - qo * H;
        if (qo >= qo_len) return {-1, -1};  // zeros: never stored
        return {(qo_start + qo) * p.q_nope_stride_n + h * p.q_nope_stride_h,
                (qo_start + qo) * p.q_pe_stride_n + h * p.q_pe_stride_h};
      });
      // A tile's rows: their page ids are loaded a tile ahead, while the
      // producer waits for a free stage.
      auto page_index = [&](int pos) {
        return w.kv_begin + (p.page_shift >= 0 ? pos >> p.page_shift : pos / p.page_size);
      };
      auto page_of_pos = [&](int pos) {
        if (pos >= w.kv_end) return -1;  // zeros past the chunk (masked), never an unused slot's NaN
        return mla_page_id(p, page_index(pos));
      };
      // The thread's rows tid / 8 + 16 i: all their page ids in flight
      // together, then checked (one round trip a tile, not one a row).
      auto kv_rows = [&](int t) {
        constexpr int N = kMlaSm90Keys / 16;
        const int start = w.kv_start + t * kMlaSm90Keys + tid / 8;
        int id[N];
#pragma unroll
        for (int i = 0; i < N; ++i) id[i] = start + 16 * i < w.kv_end ? p.kv_indices[page_index(start + 16 * i)] : -1;
        MlaSm90Rows r;
#pragma unroll
        for (int i = 0; i < N; ++i) {
          const int pos = start + 16 * i;
          const int page = pos < w.kv_end ? mla_check_page_id(p, id[i]) : -1;
          const int slot = mla_sm90_slot(p, pos);
          r.at[i] = page < 0 ? MlaRowOffset{-1, -1}
                             : MlaRowOffset{page * p.ckv_page_stride + slot * p.ckv_token_stride,
                                            page * p.kpe_page_stride + slot * p.kpe_token_stride};
        }
        return r;
      };
      auto kv_pages = [&](int t) {
        const int start = w.kv_start + t * kMlaSm90Keys, lane = tid % 32;
        return MlaSm90Pages{{page_of_pos(start + lane), page_of_pos(start + lane + 32)}};
      };
      auto ahead = [&](int t) {
        if constexpr (kFp8 && !kWiden) return kv_pages(t);
        else return kv_rows(t);
      };
      auto rows = ahead(0);
      mbarrier_wait(smem_addr(&pipe.q_empty), q_pos.phase() ^ 1);
      mla_sm90_load_tile<Q_ROWS>(q_addr, q_nope, q_pe, tid, q_rows);
      cp_async_arrive_noinc(smem_addr(&pipe.q_full));
      q_pos = q_pos.next();
      if constexpr (kWiden) {
        copy_raw_tiles(n_tiles, ckv, kpe, tid, rows, kv_rows, raw_pos);
      } else {
        for (int t = 0; t < n_tiles; ++t, kv_pos = kv_pos.next()) {
          const int s = kv_pos.index();
          mbarrier_wait(smem_addr(&pipe.kv_empty[s]), kv_pos.phase() ^ 1);
          if constexpr (kFp8)
            mla_sm90_load_raw(kv_addr + s * STAGE_BYTES, p, ckv, kpe, tid, rows, w.kv_start + t * kMlaSm90Keys);
          else
            mla_sm90_load_tile(kv_addr + s * STAGE_BYTES, ckv, kpe, tid, rows);
          cp_async_arrive_noinc(smem_addr(&pipe.kv_full[s]));
          if (t + 1 < n_tiles) rows = ahead(t + 1);
        }
      }
    }
    grid_dependency_launch_dependents();
    cp_async_wait_all();  // no thread exits with copies in flight
  }

  // An item's KV tiles over fp8 caches (the 16-row form): each half tile
  // into the next free raw slot, arriving on its full barrier when the
  // copies land. The producer never waits for its copies, only for free
  // slots; the wideners take the proxy fences, so none waits for copies in
  // flight. rows: the offsets of tile 0.
  template <typename Rows>
  __device__ __forceinline__ void copy_raw_tiles(int n_tiles, const DKV* ckv, const DKV* kpe, int tid,
                                                 MlaSm90Rows rows, Rows& kv_rows,
                                                 RingPos<kMlaSm90NarrowRawSlots>& raw_pos) {
    for (int t = 0; t < n_tiles; ++t) {
#pragma unroll
      for (int half = 0; half < 2; ++half, raw_pos = raw_pos.next()) {
        const int slot = raw_pos.index();
        mbarrier_wait(smem_addr(&ring->empty[slot]), raw_pos.phase() ^ 1);
        mla_sm90_copy_raw_half(smem_addr(&sm.raw[slot][0]), ckv, kpe, tid, rows, half);
        cp_async_arrive_noinc(smem_addr(&ring->full[slot]));
      }
      if (t + 1 < n_tiles) rows = kv_rows(t + 1);
    }
  }
};

#endif

}  // namespace tessera
