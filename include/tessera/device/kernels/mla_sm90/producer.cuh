// MLA kernel family on Hopper (sm_90a), the producer warpgroup: walks the
// CTA's work queue and gathers, for each item, the Q tile (q_nope | q_pe rows
// of 64 fused rows) and then each 64-key KV tile (ckv | kpe rows through the
// page table) into the 128-byte-swizzled wgmma layout of
// MlaSm90SharedStorage, with cp.async copies that arrive on the buffers'
// mbarriers when they land (cp.async.mbarrier.arrive.noinc), so the producer
// never waits for its own copies, only for free buffers.
#pragma once
#include "tessera/device/arch/cp_async.cuh"
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
  __device__ __forceinline__ void init() {
    mbarrier_init(smem_addr(&q_full), 128);
    mbarrier_init(smem_addr(&q_empty), kMlaSm90Threads - 128);
    for (int s = 0; s < kMlaSm90Stages; ++s) {
      mbarrier_init(smem_addr(&kv_full[s]), 128);
      mbarrier_init(smem_addr(&kv_empty[s]), kMlaSm90Threads - 128);
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
template <typename Offsets>
__device__ __forceinline__ MlaSm90Rows mla_sm90_rows(int tid, Offsets offs) {
  MlaSm90Rows r;
#pragma unroll
  for (int i = 0; i < kMlaSm90Rows / 16; ++i) r.at[i] = offs(tid / 8 + 16 * i);
  return r;
}

// Copies 64 rows into a swizzled tile of nine [64][64] blocks at shared
// address dst: row r's features 0..511 from nope + rows(r).nope (blocks
// 0..7), 512..575 from pe + rows(r).pe (block 8); a row with nope < 0 is
// zero-filled. Thread t of the warpgroup copies 16-byte chunk t % 8 of its
// rows; chunk c of row r sits at chunk c ^ (r % 8) of the row's 128 bytes
// in each block.
template <typename T>
__device__ __forceinline__ void mla_sm90_load_tile(u32 dst, const T* nope, const T* pe, int tid, const MlaSm90Rows& rows) {
  constexpr u32 BLOCK = kMlaSm90Rows * 128;
  const int cc = tid % 8;
#pragma unroll
  for (int i = 0; i < kMlaSm90Rows / 16; ++i) {
    const int row = tid / 8 + 16 * i;
    const MlaRowOffset off = rows.at[i];
    const bool ok = off.nope >= 0;
    const u32 base = dst + static_cast<u32>(row) * 128 + static_cast<u32>((cc ^ (row & 7)) << 4);
#pragma unroll
    for (int b = 0; b < kMlaDimCkv / 64; ++b) cp_async_16(base + b * BLOCK, ok ? nope + off.nope + b * 64 + cc * 8 : nope, ok);
    cp_async_16(base + (kMlaDimCkv / 64) * BLOCK, ok ? pe + off.pe + cc * 8 : pe, ok);
  }
}

template <typename T>
struct MlaSm90Producer {
  const MlaParams& p;
  MlaSm90Pipeline& pipe;
  MlaSm90SharedStorage& sm;

  __device__ __forceinline__ void run() {
    const int tid = threadIdx.x;  // 0..127
    const T* q_nope = static_cast<const T*>(p.q_nope);
    const T* q_pe = static_cast<const T*>(p.q_pe);
    const T* ckv = static_cast<const T*>(p.ckv);
    const T* kpe = static_cast<const T*>(p.kpe);
    const int H = p.group;
    const u32 q_addr = smem_addr(&sm.q[0][0]), kv_addr = smem_addr(&sm.kv[0][0][0]);
    constexpr u32 STAGE_BYTES = sizeof(sm.kv[0]);
    WorkQueue<PrefillWorkItem, QueueLoad::kFirst, MlaParams> queue(p, blockIdx.x);
    RingPos<1> q_pos;
    RingPos<kMlaSm90Stages> kv_pos;
    grid_dependency_wait();  // q and the caches may be the previous kernel's outputs
    for (int wi = queue.begin; wi < queue.end; ++wi) {
      const PrefillWorkItem w = queue.take(wi);
      const int n_tiles = (w.kv_end - w.kv_start + kMlaSm90Keys - 1) / kMlaSm90Keys;
      if (n_tiles <= 0) continue;  // the consumers write the empty rows without Q
      const int row0 = w.q_tile * kMlaSm90Rows, qo_start = w.qo_begin, qo_len = w.qo_len;
      const MlaSm90Rows q_rows = mla_sm90_rows(tid, [&](int r) -> MlaRowOffset {
        const int f = row0 + r, qo = f / H, h = f - qo * H;
        if (qo >= qo_len) return {-1, -1};  // zeros: never stored
        return {(qo_start + qo) * p.q_nope_stride_n + h * p.q_nope_stride_h,
                (qo_start + qo) * p.q_pe_stride_n + h * p.q_pe_stride_h};
      });
      // A tile's rows: their page ids are loaded a tile ahead, while the
      // producer waits for a free stage.
      auto kv_rows = [&](int t) {
        const int start = w.kv_start + t * kMlaSm90Keys;
        return mla_sm90_rows(tid, [&](int r) -> MlaRowOffset {
          const int pos = start + r;
          if (pos >= w.kv_end) return {-1, -1};  // zeros past the chunk (masked), never an unused slot's NaN
          const int page_idx = p.page_shift >= 0 ? pos >> p.page_shift : pos / p.page_size;
          const int slot = pos - page_idx * p.page_size;
          const int page = mla_page_id(p, w.kv_begin + page_idx);
          if (page < 0) return {-1, -1};
          return {page * p.ckv_page_stride + slot * p.ckv_token_stride,
                  page * p.kpe_page_stride + slot * p.kpe_token_stride};
        });
      };
      MlaSm90Rows rows = kv_rows(0);
      mbarrier_wait(smem_addr(&pipe.q_empty), q_pos.phase() ^ 1);
      mla_sm90_load_tile(q_addr, q_nope, q_pe, tid, q_rows);
      cp_async_arrive_noinc(smem_addr(&pipe.q_full));
      q_pos = q_pos.next();
      for (int t = 0; t < n_tiles; ++t, kv_pos = kv_pos.next()) {
        const int s = kv_pos.index();
        mbarrier_wait(smem_addr(&pipe.kv_empty[s]), kv_pos.phase() ^ 1);
        mla_sm90_load_tile(kv_addr + s * STAGE_BYTES, ckv, kpe, tid, rows);
        cp_async_arrive_noinc(smem_addr(&pipe.kv_full[s]));
        if (t + 1 < n_tiles) rows = kv_rows(t + 1);
      }
    }
    grid_dependency_launch_dependents();
    cp_async_wait_all();  // no thread exits with copies in flight
  }
};

#endif

}  // namespace tessera
