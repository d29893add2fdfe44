// Prefill shared-memory tiles: the two layouts (ldmatrix rows for the FA2
// template, 128-byte-swizzled blocks for wgmma) and the cp.async loaders that
// gather Q and KV rows from any KV source into them (paper §3.2.1: only the
// row addresses differ between ragged, paged and BSR KV).
#pragma once
#include "tessera/device/arch/cp_async.cuh"
#include "tessera/device/arch/numeric.cuh"

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

// Copies one KV tile (K and V rows share their address) into swizzled shared
// memory. Fully unrolled: thread t always copies chunk t % CH of rows
// t / CH + i * (THREADS / CH), so each row's address (a page-table lookup for
// paged KV) is resolved once for K and V together.
template <int HEAD_DIM, int ROWS, int THREADS, template <int, int> class Layout, typename T, typename RowOffset>
__device__ __forceinline__ void load_kv_tile(T* k_smem, T* v_smem, const T* k_base, const T* v_base,
                                             RowOffset row_offset) {
  constexpr int CH = HEAD_DIM / 8;
  static_assert(THREADS % CH == 0 && ROWS * CH % THREADS == 0, "whole rows per pass");
  constexpr int ROWS_PER_PASS = THREADS / CH, PASSES = ROWS / ROWS_PER_PASS;
  const int ch = threadIdx.x % CH, row0 = threadIdx.x / CH;
#pragma unroll
  for (int i = 0; i < PASSES; ++i) {
    const int row = row0 + i * ROWS_PER_PASS;
    const i64 off = row_offset(row);
    const bool ok = off >= 0;
    const int dst = Layout<HEAD_DIM, ROWS>::at(row, ch);
    cp_async_16(k_smem + dst, ok ? k_base + off + ch * 8 : k_base, ok);
    cp_async_16(v_smem + dst, ok ? v_base + off + ch * 8 : v_base, ok);
  }
}

// Applies an element-wise transform in place to a swizzled tile (only for
// variants that override the slot; see VariantTraits).
template <int HEAD_DIM, int ROWS, int THREADS, template <int, int> class Layout, typename T, typename Fn>
__device__ __forceinline__ void transform_tile(T* smem, Fn fn) {
  for (int i = threadIdx.x; i < ROWS * HEAD_DIM; i += THREADS) {
    const int row = i / HEAD_DIM, col = i % HEAD_DIM;
    T* e = smem + Layout<HEAD_DIM, ROWS>::at(row, col / 8) + col % 8;
    *e = from_float<T>(fn(row, col, to_float(*e)));
  }
}

#endif

}  // namespace tessera
