// Prefill shared-memory tiles: the two layouts (ldmatrix rows for the FA2
// template, 128-byte-swizzled blocks for wgmma) and the cp.async loaders that
// gather Q and KV rows from any KV source into them (paper §3.2.1: only the
// row addresses differ between ragged, paged and BSR KV).
#pragma once
#include "tessera/device/arch/cp_async.cuh"
#include "tessera/device/arch/fp8.cuh"
#include "tessera/device/arch/numeric.cuh"
#include "tessera/device/arch/vector_io.cuh"
#include "tessera/device/primitives/kv_view.cuh"
#include "tessera/device/primitives/variant_traits.cuh"

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
// Fp8RowSwizzle (FA2 template, fp8 staging): byte offset of 16-byte chunk
// `chunk` (16 features) of row `row` in rows of HEAD_DIM fp8 bytes, the
// chunk XORed with row % 8 (128 bytes a row and more) or, at head dim 64
// (two rows per 128 bytes), with (row / 2) % 4: the 8 rows a warp's K
// fragment loads read at one chunk, and the rows 2c + {0, 1, 8, 9} its V
// fragment loads read, fall in different banks. Head dim 192's last four
// chunks XOR with row % 4 (staying among themselves).
template <int HEAD_DIM>
struct Fp8RowSwizzle {
  static constexpr int CH = HEAD_DIM / 16;
  static __device__ __forceinline__ int x(int row, int chunk) {
    if (CH >= 8 && chunk < (CH & ~7)) return row & 7;
    return CH == 4 ? (row >> 1) & 3 : row & 3;
  }
  static __device__ __forceinline__ int at(int row, int chunk) { return row * HEAD_DIM + ((chunk ^ x(row, chunk)) << 4); }
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

// Whether a tile layout is RowSwizzle (KVTileLoader's unequal-dims copies
// compute its addresses themselves).
template <template <int, int> class Layout>
struct IsRowSwizzle {
  static constexpr bool value = false;
};
template <>
struct IsRowSwizzle<RowSwizzle> {
  static constexpr bool value = true;
};

// Loads the KV tiles of one work item, in order (tile 0, 1, 2, ...), into
// swizzled shared memory. K rows have HEAD_DIM_K features, V rows
// HEAD_DIM_V.
//
// Equal dims: K and V rows share their address (one layout, K's strides).
// Thread t always copies chunk t % CH of rows t / CH + i * (THREADS / CH)
// (fully unrolled). Contiguous sources (ragged, single) are affine in the
// position: one 64-bit multiply per tile. Paged and BSR sources resolve each
// row once, not once per copying thread: during tile t's load, thread r <
// ROWS resolves row r of tile t + 1 (page id, page / head / slot arithmetic)
// into a shared table of element offsets, and tile t + 1's copies read their
// rows' offsets from it (two per 16-byte load; the 16 threads of a row used
// to repeat the arithmetic, ~15% of an issue-bound loop's instructions). The
// page ids that resolution needs arrive earlier still: tile t's copies
// bring those of tile t + STAGES (one cp.async per row, a ring of STAGES
// buffers), so no thread waits on the page table, and a pipeline of STAGES
// stages keeps STAGES - 1 tiles in flight.
//
// Unequal dims (SPLIT: 192 / 128, or 512 / 256 reading half of V's rows):
// V has strides of its own (PagedKV::v_*), so the table holds a K and a V
// offset per row. A 192-feature row (24 chunks) does not split into whole
// rows per pass of 128 threads, so rows are cut into 64-feature groups
// instead: thread t copies chunk t % 8 of every group of rows t / 8 + i *
// (THREADS / 8). The rows a thread copies are 8k apart, so their swizzle
// (row % 8) is the thread's own and every copy's shared address is the
// thread's base plus a constant; the global ones are its row offset plus a
// constant. Same pipeline contract and page-id prefetch as above.
//
// fp8 T (equal dims only): the same copies bring 16-byte chunks of 16 fp8
// values into Fp8RowSwizzle rows (the k_smem / v_smem given to load), which
// the FA2 mainloop reads and widens in registers; for variants that
// transform K / V in shared memory, each thread instead widens exactly the
// chunks it copied (dequantize) into the 16-bit swizzled tile the mainloop
// reads, after waiting for its copies, so the pipeline's barrier after the
// wait also publishes the widened rows.
//
// Contract (a pipeline of STAGES stages): load(t + 1) follows a barrier
// after load(t) was issued, and the completion of load(t + 2 - STAGES)'s
// copies (what a pipeline step waits for anyway); tiles 0 .. STAGES - 1
// resolve their rows from the page table directly.
template <int HEAD_DIM_K, int HEAD_DIM_V, int ROWS, int THREADS, template <int, int> class Layout, typename T,
          int STAGES = 2>
struct KVTileLoader {
  static constexpr bool SPLIT = HEAD_DIM_K != HEAD_DIM_V;
  static constexpr bool FP8 = is_fp8<T>;
  static constexpr int EPC = 16 / static_cast<int>(sizeof(T));  // elements per 16-byte copy
  // Equal dims: rows per pass of the whole-row copies. SPLIT: 8 threads a row.
  static constexpr int CH = HEAD_DIM_K / EPC, ROWS_PER_PASS = SPLIT ? THREADS / 8 : THREADS / CH;
  static constexpr int PASSES = ROWS >= ROWS_PER_PASS ? ROWS / ROWS_PER_PASS : 1;
  static constexpr int TABLE_ROWS = (SPLIT ? 4 : 2) * ROWS;  // [2][ROWS] offsets (K's), then V's when SPLIT
  static_assert(SPLIT || (THREADS % CH == 0 && ROWS * CH % THREADS == 0), "whole rows per pass");
  static_assert(!SPLIT || (THREADS % 64 == 0 && (ROWS % ROWS_PER_PASS == 0 || ROWS_PER_PASS % ROWS == 0) &&
                           HEAD_DIM_K % 64 == 0 && HEAD_DIM_V % 64 == 0 && IsRowSwizzle<Layout>::value),
                "unequal dims: 64-feature groups of RowSwizzle rows, rows 8k apart per thread");
  static_assert(sizeof(T) == 2 || (FP8 && !SPLIT), "16-bit K / V, or fp8 with equal head dims");
  const device::PagedKV& kv;
  int* ids;    // [STAGES][ROWS] page ids of tile u's rows in buffer u % STAGES (load(t) fills tile t + STAGES's)
  i64* offs;   // [2][ROWS] element offsets of tile u's rows in buffer u % 2 (load(t) fills tile t + 1's), -1 past kv_end;
               // SPLIT: then V's [2][ROWS]
  int page_base, kv_start, kv_end, head, shift;
  bool affine;

  __device__ __forceinline__ KVTileLoader(const device::PagedKV& kv_, int* ids_, i64* offs_, int page_base_,
                                          int kv_start_, int kv_end_, int head_, int shift_)
      : kv(kv_), ids(ids_), offs(offs_), page_base(page_base_), kv_start(kv_start_), kv_end(kv_end_), head(head_),
        shift(shift_), affine(kv_.indices == nullptr) {}

  __device__ __forceinline__ int page_of(int pos) const { return shift >= 0 ? pos >> shift : pos / kv.page_size; }
  __device__ __forceinline__ i64 row_offset(int page, int pos, int page_idx) const {
    return static_cast<i64>(page) * kv.page_stride + head * kv.head_stride + (pos - page_idx * kv.page_size) * kv.token_stride;
  }
  __device__ __forceinline__ i64 v_row_offset(int page, int pos, int page_idx) const {
    return static_cast<i64>(page) * kv.v_page_stride + head * kv.v_head_stride +
           (pos - page_idx * kv.page_size) * kv.v_token_stride;
  }
  // Where row r sits in a table: a thread's PASSES rows are adjacent.
  __device__ __forceinline__ static int table_slot(int r) { return (r % ROWS_PER_PASS) * PASSES + r / ROWS_PER_PASS; }

  __device__ __forceinline__ void load(int tile, T* k_smem, T* v_smem) {
    if constexpr (SPLIT)
      load_split(tile, k_smem, v_smem);
    else
      load_shared_rows(tile, k_smem, v_smem);
  }

  // fp8: widens the chunks this thread copied from the staging tiles into
  // the 16-bit (H: q's type) K / V tiles in Layout. Call after this thread's
  // copies of the tile completed (cp_async_wait) and before the barrier that
  // hands the tiles to the mainloop. Rows past kv_end were zero-filled: they
  // widen to zeros, as the 16-bit loads leave them.
  template <typename H>
  __device__ __forceinline__ void dequantize(const T* k_stage, const T* v_stage, H* k_smem, H* v_smem) const {
    static_assert(FP8 && sizeof(H) == 2, "fp8 staging into 16-bit tiles");
    const int ch = threadIdx.x % CH, row0 = threadIdx.x / CH;
    auto widen = [&](const T* stage, H* tile, int row) {
      const uint4 x = *reinterpret_cast<const uint4*>(reinterpret_cast<const u8*>(stage) + Fp8RowSwizzle<HEAD_DIM_K>::at(row, ch));
      uint4 a, b;  // features 16 ch .. + 7 and 16 ch + 8 .. + 15
      fp8x4_to_16x2<T, H>(x.x, a.x, a.y);
      fp8x4_to_16x2<T, H>(x.y, a.z, a.w);
      fp8x4_to_16x2<T, H>(x.z, b.x, b.y);
      fp8x4_to_16x2<T, H>(x.w, b.z, b.w);
      *reinterpret_cast<uint4*>(tile + Layout<HEAD_DIM_K, ROWS>::at(row, 2 * ch)) = a;
      *reinterpret_cast<uint4*>(tile + Layout<HEAD_DIM_K, ROWS>::at(row, 2 * ch + 1)) = b;
    };
#pragma unroll
    for (int i = 0; i < PASSES; ++i) {
      const int row = row0 + i * ROWS_PER_PASS;
      widen(k_stage, k_smem, row);
      widen(v_stage, v_smem, row);
    }
  }

 private:
  // Equal dims: V's rows at K's offsets.
  __device__ __forceinline__ void load_shared_rows(int tile, T* k_smem, T* v_smem) {
    const int ch = threadIdx.x % CH, row0 = threadIdx.x / CH;
    const int start = kv_start + tile * ROWS;
    const T* k_base = static_cast<const T*>(kv.k);
    const T* v_base = static_cast<const T*>(kv.v);
    // Shared addresses as 32-bit offsets from the tile bases: one generic ->
    // shared conversion per tile, not one per copy.
    const u32 k_dst = smem_addr(k_smem), v_dst = smem_addr(v_smem);
    auto dst = [&](int i) {
      if constexpr (FP8)  // the staging rows
        return static_cast<u32>(Fp8RowSwizzle<HEAD_DIM_K>::at(row0 + i * ROWS_PER_PASS, ch));
      else
        return static_cast<u32>(Layout<HEAD_DIM_K, ROWS>::at(row0 + i * ROWS_PER_PASS, ch)) * 2u;
    };
    if (affine) {
      // Contiguous rows: this thread's rows are ROWS_PER_PASS apart, so its
      // addresses step by a constant (one 64-bit add per row instead of a
      // 64-bit multiply and a select). A row past kv_end keeps its address:
      // its copy reads no bytes (source size 0) and zero-fills.
      const i64 first = device::kv_token_offset(kv, page_base, start, head, shift) + row0 * kv.token_stride + ch * EPC;
      const i64 step = ROWS_PER_PASS * kv.token_stride;
      const int rows_left = kv_end - start - row0;
#pragma unroll
      for (int i = 0; i < PASSES; ++i) {
        const bool ok = i * ROWS_PER_PASS < rows_left;
        cp_async_16(k_dst + dst(i), k_base + first + i * step, ok);
        cp_async_16(v_dst + dst(i), v_base + first + i * step, ok);
      }
      return;
    }
    i64 off[PASSES];
    if (tile == 0) {
#pragma unroll
      for (int i = 0; i < PASSES; ++i) {
        const int pos = start + row0 + i * ROWS_PER_PASS;
        const int page_idx = page_of(pos);
        const int page = pos >= kv_end ? -1 : device::page_id(kv, page_base + page_idx);
        off[i] = page < 0 ? -1 : row_offset(page, pos, page_idx);
      }
    } else {
      const i64* mine = offs + (tile & 1) * ROWS + row0 * PASSES;
      if constexpr (PASSES % 2 == 0) {
#pragma unroll
        for (int i = 0; i < PASSES; i += 2) {
          const longlong2 o = reinterpret_cast<const longlong2*>(mine)[i / 2];
          off[i] = o.x;
          off[i + 1] = o.y;
        }
      } else {
#pragma unroll
        for (int i = 0; i < PASSES; ++i) off[i] = mine[i];
      }
    }
    // This thread's chunk of a row at byte offset 0: a row's copy is then one
    // 64-bit add. A row of offset -1 (past kv_end, a bad page) zero-fills
    // and reads nothing (cp_async_16_or_zeros), so its address goes unchecked.
    const char* k_chunk = reinterpret_cast<const char*>(k_base + ch * EPC);
    const char* v_chunk = reinterpret_cast<const char*>(v_base + ch * EPC);
#pragma unroll
    for (int i = 0; i < PASSES; ++i) {
      const i64 bytes = off[i] * static_cast<i64>(sizeof(T));
      cp_async_16_or_zeros(k_dst + dst(i), k_chunk + bytes, off[i] >= 0);
      cp_async_16_or_zeros(v_dst + dst(i), v_chunk + bytes, off[i] >= 0);
    }
    if (!affine) {
      for (int r = threadIdx.x; r < ROWS; r += THREADS) {
        // Row r of tile + 1 into the table (its page id: from the page table
        // for tiles below STAGES, else brought by load(tile + 1 - STAGES)).
        const int pos = start + ROWS + r, page_idx = page_of(pos);
        if (pos < kv_end) {
          const int page = device::check_page(kv, tile + 1 < STAGES ? kv.indices[page_base + page_idx]
                                                            : ids[((tile + 1) % STAGES) * ROWS + r]);
          offs[((tile + 1) & 1) * ROWS + table_slot(r)] = page < 0 ? -1 : row_offset(page, pos, page_idx);
        } else {
          offs[((tile + 1) & 1) * ROWS + table_slot(r)] = -1;
        }
        // Page id of row r of tile + STAGES, in this tile's commit group.
        const int pos2 = pos + (STAGES - 1) * ROWS;
        const bool ok = pos2 < kv_end;
        cp_async_4(ids + (tile % STAGES) * ROWS + r, ok ? kv.indices + page_base + page_of(pos2) : kv.indices, ok);
      }
    }
  }

  // Unequal dims: rows row0 + i * ROWS_PER_PASS of this thread, chunk cc of
  // each 64-feature group, K and V each at their own offsets.
  __device__ __forceinline__ void load_split(int tile, T* k_smem, T* v_smem) {
    constexpr int GK = HEAD_DIM_K / 64, GV = HEAD_DIM_V / 64;  // 64-feature groups per row
    const int cc = threadIdx.x % 8, row0 = threadIdx.x / 8;
    const int start = kv_start + tile * ROWS;
    const T* k_base = static_cast<const T*>(kv.k);
    const T* v_base = static_cast<const T*>(kv.v);
    // RowSwizzle of row r, chunk 8 g + cc: r * D + 64 g + ((cc ^ r % 8) << 3),
    // and r % 8 = row0 % 8 for all of this thread's rows.
    const u32 sw = static_cast<u32>((cc ^ (row0 & 7)) << 3);
    const u32 k_dst = smem_addr(k_smem) + (row0 * HEAD_DIM_K + sw) * 2u;
    const u32 v_dst = smem_addr(v_smem) + (row0 * HEAD_DIM_V + sw) * 2u;
    auto copy_rows = [&](int i, i64 k_off, i64 v_off, bool ok) {
#pragma unroll
      for (int g = 0; g < GK; ++g)
        cp_async_16(k_dst + (i * ROWS_PER_PASS * HEAD_DIM_K + 64 * g) * 2u, ok ? k_base + k_off + 64 * g + cc * 8 : k_base, ok);
#pragma unroll
      for (int g = 0; g < GV; ++g)
        cp_async_16(v_dst + (i * ROWS_PER_PASS * HEAD_DIM_V + 64 * g) * 2u, ok ? v_base + v_off + 64 * g + cc * 8 : v_base, ok);
    };
    if (ROWS < ROWS_PER_PASS && row0 >= ROWS) {  // a KV tile of fewer rows than a pass: these threads copy nothing
    } else if (affine) {
      // Contiguous rows (request row `start`, its absolute row for ragged
      // KV): this thread's rows step by constants.
      const i64 pos = kv.indptr == nullptr ? start : page_base + start;
      const i64 k_first = (pos + row0) * kv.token_stride + head * kv.head_stride;
      const i64 v_first = (pos + row0) * kv.v_token_stride + head * kv.v_head_stride;
      const int rows_left = kv_end - start - row0;
#pragma unroll
      for (int i = 0; i < PASSES; ++i) {
        // A row past kv_end reads no bytes (zero-fill); its address stays a valid pointer.
        const bool ok = i * ROWS_PER_PASS < rows_left;
        copy_rows(i, ok ? k_first + i * ROWS_PER_PASS * kv.token_stride : 0,
                  ok ? v_first + i * ROWS_PER_PASS * kv.v_token_stride : 0, ok);
      }
    } else {
#pragma unroll
      for (int i = 0; i < PASSES; ++i) {
        const int row = row0 + i * ROWS_PER_PASS;
        i64 k_off, v_off;
        if (tile == 0) {
          const int pos = start + row, page_idx = page_of(pos);
          const int page = pos >= kv_end ? -1 : device::page_id(kv, page_base + page_idx);
          k_off = page < 0 ? -1 : row_offset(page, pos, page_idx);
          v_off = page < 0 ? -1 : v_row_offset(page, pos, page_idx);
        } else {
          k_off = offs[(tile & 1) * ROWS + row];
          v_off = offs[2 * ROWS + (tile & 1) * ROWS + row];
        }
        copy_rows(i, k_off, v_off, k_off >= 0);
      }
    }
    if (!affine) {
      for (int r = threadIdx.x; r < ROWS; r += THREADS) {
        // Row r of tile + 1 into the tables (as load_shared_rows), at index r.
        const int pos = start + ROWS + r, page_idx = page_of(pos);
        i64* k_table = offs + ((tile + 1) & 1) * ROWS;
        if (pos < kv_end) {
          const int page = device::check_page(kv, tile + 1 < STAGES ? kv.indices[page_base + page_idx]
                                                            : ids[((tile + 1) % STAGES) * ROWS + r]);
          k_table[r] = page < 0 ? -1 : row_offset(page, pos, page_idx);
          k_table[2 * ROWS + r] = page < 0 ? -1 : v_row_offset(page, pos, page_idx);
        } else {
          k_table[r] = k_table[2 * ROWS + r] = -1;
        }
        const int pos2 = pos + (STAGES - 1) * ROWS;  // row r of tile + STAGES, in this tile's commit group
        const bool ok = pos2 < kv_end;
        cp_async_4(ids + (tile % STAGES) * ROWS + r, ok ? kv.indices + page_base + page_of(pos2) : kv.indices, ok);
      }
    }
  }
};

// ---------------------------------------------------------------------------
// Q/K/V transforms of tiles in shared memory (variant slots; see
// primitives/variant.cuh). All take the thread's index and the number of
// threads sharing the work, and a range of rows, so any thread group can
// transform any rows (a warpgroup its own query rows, a producer warpgroup a
// whole KV tile). The caller synchronizes the group before (the tile has
// landed) and after (others read the result).

// Applies fn in place to rows [row_begin, row_end) of a [ROWS][HEAD_DIM] tile
// stored in Layout, one 16-byte chunk (or, for Pairing::kHalves, the chunk
// and its partner chunk) per step; thread tid of nthreads takes steps tid,
// tid + nthreads, ... (a thread's columns stay fixed when nthreads is a
// multiple of the steps per row, so per-column work hoists out of the loop).
//   fn(int row, int col, float x, float partner) -> float
// partner is element col ^ PairStride<PAIRING, HEAD_DIM> of the row, read
// before the transform (x itself for Pairing::kNone).
template <int HEAD_DIM, int ROWS, template <int, int> class Layout, Pairing PAIRING, typename T, typename Fn>
__device__ __forceinline__ void transform_tile_rows(T* smem, int tid, int nthreads, int row_begin, int row_end, Fn fn) {
  constexpr int CH = HEAD_DIM / 8;                                  // 16-byte chunks per row
  constexpr int STEPS = PAIRING == Pairing::kHalves ? CH / 2 : CH;  // per row
  const int n = (row_end - row_begin) * STEPS;
  for (int u = tid; u < n; u += nthreads) {
    const int row = row_begin + u / STEPS, c = u % STEPS;
    T* lo = smem + Layout<HEAD_DIM, ROWS>::at(row, c);
    float a[8], ra[8];
    load_vec<8>(lo, a);
    if constexpr (PAIRING == Pairing::kHalves) {
      T* hi = smem + Layout<HEAD_DIM, ROWS>::at(row, c + CH / 2);
      float h[8], rh[8];
      load_vec<8>(hi, h);
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        ra[i] = fn(row, c * 8 + i, a[i], h[i]);
        rh[i] = fn(row, HEAD_DIM / 2 + c * 8 + i, h[i], a[i]);
      }
      store_vec<8>(hi, rh);
    } else {
#pragma unroll
      for (int i = 0; i < 8; ++i) ra[i] = fn(row, c * 8 + i, a[i], a[PAIRING == Pairing::kAdjacent ? (i ^ 1) : i]);
    }
    store_vec<8>(lo, ra);
  }
}

// The whole tile, element-wise, by a CTA of THREADS threads:
//   fn(int row, int col, float x) -> float
template <int HEAD_DIM, int ROWS, int THREADS, template <int, int> class Layout, typename T, typename Fn>
__device__ __forceinline__ void transform_tile(T* smem, Fn fn) {
  transform_tile_rows<HEAD_DIM, ROWS, Layout, Pairing::kNone>(
      smem, threadIdx.x, THREADS, 0, ROWS, [&](int row, int col, float x, float) { return fn(row, col, x); });
}

// Variant's QueryTransform on rows [row_begin, row_end) of a query tile of
// fused rows (row r is fused row f = row0 + r: query f / group of request b,
// head kv_head * group + f % group); rows past qo_len are left alone.
template <typename Variant, int HEAD_DIM, int ROWS, template <int, int> class Layout, typename T, typename Params>
__device__ __forceinline__ void transform_q_tile(const Variant& variant, const Params& p, T* q_smem, int tid,
                                                 int nthreads, int row_begin, int row_end, int b, int row0, int group,
                                                 int kv_head, int qo_len) {
  const int end = min(row_end, max(row_begin, qo_len * group - row0));
  transform_tile_rows<HEAD_DIM, ROWS, Layout, Variant::pairing>(
      q_smem, tid, nthreads, row_begin, end, [&](int r, int col, float x, float partner) {
        const int f = row0 + r;
        return apply_query_transform(variant, p, x, partner, b, f / group, kv_head * group + f % group, col);
      });
}

// Variant's KeyTransform (KEY) or ValueTransform on rows [row_begin, row_end)
// of a KV tile whose row r is token tile_start + r of request b; tokens at or
// past kv_end are left alone.
template <typename Variant, bool KEY, int HEAD_DIM, int ROWS, template <int, int> class Layout, typename T,
          typename Params>
__device__ __forceinline__ void transform_kv_tile(const Variant& variant, const Params& p, T* smem, int tid,
                                                  int nthreads, int row_begin, int row_end, int b, int tile_start,
                                                  int kv_end, int kv_head) {
  const int end = min(row_end, max(row_begin, kv_end - tile_start));
  if constexpr (KEY) {
    transform_tile_rows<HEAD_DIM, ROWS, Layout, Variant::pairing>(
        smem, tid, nthreads, row_begin, end, [&](int r, int col, float x, float partner) {
          return apply_key_transform(variant, p, x, partner, b, tile_start + r, kv_head, col);
        });
  } else {
    transform_tile_rows<HEAD_DIM, ROWS, Layout, Pairing::kNone>(
        smem, tid, nthreads, row_begin, end,
        [&](int r, int col, float x, float) { return variant.ValueTransform(p, x, b, tile_start + r, kv_head, col); });
  }
}

#endif

}  // namespace tessera
