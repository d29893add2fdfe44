// Prefill shared-memory tiles: the two layouts (ldmatrix rows for the FA2
// template, 128-byte-swizzled blocks for wgmma) and the cp.async loaders that
// gather Q and KV rows from any KV source into them (paper §3.2.1: only the
// row addresses differ between ragged, paged and BSR KV).
#pragma once
#include "tessera/device/arch/cp_async.cuh"
#include "tessera/device/arch/numeric.cuh"
#include "tessera/device/primitives/kv_view.cuh"

namespace tessera {

#if defined(__CUDACC__) || defined(__CUDACC_RTC__)

// Shared-memory tile layouts: element index of (row, 16-byte chunk) in a
// tile of ROWS rows x HEAD_DIM 16-bit columns.
//
// RowSwizzle (FA2 template, ldmatrix): rows of HEAD_DIM elements, the chunk
// XORed with row % 8, so the 8 rows one ldmatrix reads, and the chunks one
// row's copies write, fall in different banks.
template <int HEAD_DIM, int ROWS>
struct RowSwizzle {
  static __device__ __forceinline__ int at(int row, int chunk) { return row * HEAD_DIM + ((chunk ^ (row & 7)) << 3); }
};
// Swizzle128 (Hopper template, wgmma descriptors): HEAD_DIM / 64 column
// blocks of [ROWS][64], 128-byte rows, chunk XORed with row % 8: the
// canonical 128-byte-swizzled operand layout (see arch/wgmma.cuh).
template <int HEAD_DIM, int ROWS>
struct Swizzle128 {
  static __device__ __forceinline__ int at(int row, int chunk) {
    return (chunk >> 3) * (ROWS * 64) + row * 64 + (((chunk & 7) ^ (row & 7)) << 3);
  }
};
template <int HEAD_DIM>
__device__ __forceinline__ int swz(int row, int chunk) {
  return RowSwizzle<HEAD_DIM, 0>::at(row, chunk);
}

// Copies a [rows][HEAD_DIM] tile whose row r lives at src_offset(r) (or is
// zero-filled when src_offset(r) < 0) into swizzled shared memory.
template <int HEAD_DIM, int ROWS, int THREADS, template <int, int> class Layout, typename T, typename RowOffset>
__device__ __forceinline__ void load_tile(T* smem, const T* base, RowOffset row_offset) {
  constexpr int CH = HEAD_DIM / 8;
#pragma unroll
  for (int c = threadIdx.x; c < ROWS * CH; c += THREADS) {
    const int row = c / CH, ch = c % CH;
    const i64 off = row_offset(row);
    cp_async_16(smem + Layout<HEAD_DIM, ROWS>::at(row, ch), off >= 0 ? base + off + ch * 8 : base, off >= 0);
  }
}

// Loads the KV tiles of one work item, in order (tile 0, 1, 2, ...), into
// swizzled shared memory; K and V rows share their address. Thread t always
// copies chunk t % CH of rows t / CH + i * (THREADS / CH) (fully unrolled).
// Contiguous sources (ragged, single) are affine in the position: one 64-bit
// multiply per tile. Paged and BSR sources need a page-table read per row:
// tile t's copies also bring the page ids of tile t + 1 into `ids` (one
// cp.async per row, double-buffered, 2 * ROWS ints of shared memory), so
// that read's latency hides behind a tile of compute instead of stalling the
// next copies, without holding registers (page size 1 otherwise cost ~20%).
// Contract: load(t + 1) follows the completion of load(t)'s copies and a
// barrier (every pipeline step has both); tile 0 reads the table directly.
template <int HEAD_DIM, int ROWS, int THREADS, template <int, int> class Layout, typename T>
struct KVTileLoader {
  static constexpr int CH = HEAD_DIM / 8, ROWS_PER_PASS = THREADS / CH, PASSES = ROWS / ROWS_PER_PASS;
  static_assert(THREADS % CH == 0 && ROWS * CH % THREADS == 0, "whole rows per pass");
  const device::PagedKV& kv;
  int* ids;  // [2][ROWS] page ids of the next tile's rows
  int page_base, kv_start, kv_end, head, shift;
  bool affine;

  __device__ __forceinline__ KVTileLoader(const device::PagedKV& kv_, int* ids_, int page_base_, int kv_start_,
                                          int kv_end_, int head_, int shift_)
      : kv(kv_), ids(ids_), page_base(page_base_), kv_start(kv_start_), kv_end(kv_end_), head(head_), shift(shift_),
        affine(kv_.indices == nullptr) {}

  __device__ __forceinline__ int page_of(int pos) const { return shift >= 0 ? pos >> shift : pos / kv.page_size; }

  __device__ __forceinline__ void load(int tile, T* k_smem, T* v_smem) {
    const int ch = threadIdx.x % CH, row0 = threadIdx.x / CH;
    const int start = kv_start + tile * ROWS;
    const i64 affine_base = affine ? device::kv_token_offset(kv, page_base, start, head, shift) : 0;
    const int* my_ids = ids + (tile & 1) * ROWS;
    i64 off[PASSES];
#pragma unroll
    for (int i = 0; i < PASSES; ++i) {
      const int r = row0 + i * ROWS_PER_PASS, pos = start + r;
      if (pos >= kv_end) {
        off[i] = -1;
      } else if (affine) {
        off[i] = affine_base + r * kv.token_stride;
      } else {
        const int page_idx = page_of(pos);
        const int page = tile == 0 ? kv.indices[page_base + page_idx] : my_ids[r];
        off[i] = static_cast<i64>(page) * kv.page_stride + head * kv.head_stride + (pos - page_idx * kv.page_size) * kv.token_stride;
      }
    }
    const T* k_base = static_cast<const T*>(kv.k);
    const T* v_base = static_cast<const T*>(kv.v);
#pragma unroll
    for (int i = 0; i < PASSES; ++i) {
      const bool ok = off[i] >= 0;
      const int dst = Layout<HEAD_DIM, ROWS>::at(row0 + i * ROWS_PER_PASS, ch);
      cp_async_16(k_smem + dst, ok ? k_base + off[i] + ch * 8 : k_base, ok);
      cp_async_16(v_smem + dst, ok ? v_base + off[i] + ch * 8 : v_base, ok);
    }
    if (!affine) {  // page ids of tile + 1, one thread per row, in this tile's commit group
      int* next = ids + ((tile + 1) & 1) * ROWS;
      for (int r = threadIdx.x; r < ROWS; r += THREADS) {
        const int pos = start + ROWS + r;
        const bool ok = pos < kv_end;
        cp_async_4(next + r, ok ? kv.indices + page_base + page_of(pos) : kv.indices, ok);
      }
    }
  }
};

// Applies an element-wise transform in place to rows [row_begin, row_end) of
// a swizzled tile (only for variants that override the slot; see
// VariantTraits), spread over threads tid = 0..nthreads-1: the FA2 template
// uses the whole CTA, the Hopper one a warpgroup.
template <int HEAD_DIM, int ROWS, template <int, int> class Layout, typename T, typename Fn>
__device__ __forceinline__ void transform_rows(T* smem, int row_begin, int row_end, int tid, int nthreads, Fn fn) {
  for (int i = row_begin * HEAD_DIM + tid; i < row_end * HEAD_DIM; i += nthreads) {
    const int row = i / HEAD_DIM, col = i % HEAD_DIM;
    T* e = smem + Layout<HEAD_DIM, ROWS>::at(row, col / 8) + col % 8;
    *e = from_float<T>(fn(row, col, to_float(*e)));
  }
}

template <int HEAD_DIM, int ROWS, int THREADS, template <int, int> class Layout, typename T, typename Fn>
__device__ __forceinline__ void transform_tile(T* smem, Fn fn) {
  transform_rows<HEAD_DIM, ROWS, Layout>(smem, 0, ROWS, threadIdx.x, THREADS, fn);
}

#endif

}  // namespace tessera
