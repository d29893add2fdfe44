// Appends new K/V tokens to a paged KV cache (FlashInfer's
// append_paged_kv_cache). Rows of the cache's dtype are a pure copy: values
// move as raw 16-byte vectors, so the cache holds exactly the bits of the
// appended rows. 16-bit rows into an fp8 cache are quantized on the way:
// divided by the scale, rounded to nearest even with saturation (arch/fp8.cuh).
//
// Thread mapping: one thread per 16-byte vector of the cache of one (token,
// head) row, both K and V (past V's width, when V is narrower, K only); a
// grid-stride loop covers any nnz with a bounded grid. Neighbouring threads
// write neighbouring vectors of the same row, so both the reads and the
// writes of a warp are contiguous runs of head_dim elements.
//
// Device-side guard: the host cannot validate GPU index tensors without a
// synchronizing copy (which would also break CUDA-graph capture), so a token
// whose request index, position or page index is outside what the page table
// and storage describe is skipped instead of written out of bounds. The
// tables are read up to p.batch / p.num_indices, the capacity of the
// caller's buffers rather than the batch of the call that set them up: a
// captured graph replayed after larger tables were written into the same
// buffers follows the new tables.
#pragma once
#include "tessera/device/arch/vector_io.cuh"
#include "tessera/abi/append_kv_params.cuh"

namespace tessera {

#if defined(__CUDACC__) || defined(__CUDACC_RTC__)

constexpr int kAppendThreads = 256;

// Token (b, pos)'s storage page and slot; false when the page table or the
// storage does not cover it.
__device__ __forceinline__ bool append_slot(const AppendKVParams& p, int b, int pos, int& page, int& slot) {
  if (b < 0 || b >= p.batch || pos < 0) return false;
  const int page_in_req = pos / p.page_size;
  slot = pos - page_in_req * p.page_size;
  // 64-bit sums, so corrupt table entries cannot overflow.
  const i64 first = p.kv_indptr[b], next = p.kv_indptr[b + 1], j = first + page_in_req;
  if (first < 0 || j >= next || j >= p.num_indices) return false;
  if (j == next - 1 && slot >= p.kv_last_page_len[b]) return false;  // past the request's length
  page = p.kv_indices[j];
  return page >= 0 && page < p.num_pages;
}

// Calls copy(i, h, c, k_dst, v_dst) for every 16-byte vector, from element c,
// of row i's head h: k_dst / v_dst are the storage element offsets of element
// c of the K / V row, or -1 past that row's width (V is narrower than K for
// head dims 192 / 128; of equal widths every call writes both).
template <int kVec, typename Copy>
__device__ __forceinline__ void append_for_each_vector(const AppendKVParams& p, Copy copy) {
  const int k_vecs = p.head_dim / kVec, v_vecs = p.v_head_dim / kVec;
  const int vecs_per_head = k_vecs > v_vecs ? k_vecs : v_vecs;
  const i64 vecs_per_token = static_cast<i64>(p.num_heads) * vecs_per_head;
  const i64 total = p.nnz * vecs_per_token;
  const i64 step = static_cast<i64>(gridDim.x) * blockDim.x;
  for (i64 t = static_cast<i64>(blockIdx.x) * blockDim.x + threadIdx.x; t < total; t += step) {
    const i64 i = t / vecs_per_token;
    const int rem = static_cast<int>(t - i * vecs_per_token);
    const int h = rem / vecs_per_head;
    const int vec = rem - h * vecs_per_head, c = vec * kVec;
    int page, slot;
    if (!append_slot(p, p.batch_indices[i], p.positions[i], page, slot)) continue;
    const i64 k_dst = vec < k_vecs ? page * p.page_stride + slot * p.token_stride + h * p.head_stride + c : -1;
    const i64 v_dst = vec < v_vecs ? page * p.v_page_stride + slot * p.v_token_stride + h * p.v_head_stride + c : -1;
    copy(i, h, c, k_dst, v_dst);
  }
}

// 16 values of a 16-bit row divided by `scale`, as 16 fp8 bytes.
template <typename TIn, typename TCache>
__device__ __forceinline__ uint4 quantize16(const TIn* src, float scale) {
  float x[16];
  load_vec<16>(src, x);
  u32 w[4];
#pragma unroll
  for (int j = 0; j < 4; ++j)
    w[j] = float_to_fp8x2<TCache>(x[4 * j] / scale, x[4 * j + 1] / scale) |
           (float_to_fp8x2<TCache>(x[4 * j + 2] / scale, x[4 * j + 3] / scale) << 16);
  return make_uint4(w[0], w[1], w[2], w[3]);
}

// 16-bit rows (TIn) into an fp8 cache (TCache).
template <typename TIn, typename TCache>
__device__ __forceinline__ void append_paged_kv_quantize(const AppendKVParams& p) {
  static_assert(sizeof(TIn) == 2 && is_fp8<TCache>, "16-bit rows into an fp8 cache");
  const float k_scale = p.k_scale_ptr ? p.k_scale * __ldg(p.k_scale_ptr) : p.k_scale;
  const float v_scale = p.v_scale_ptr ? p.v_scale * __ldg(p.v_scale_ptr) : p.v_scale;
  append_for_each_vector<16>(p, [&](i64 i, int h, int c, i64 k_dst, i64 v_dst) {
    if (k_dst >= 0) {
      const TIn* k = static_cast<const TIn*>(p.append_k) + i * p.k_stride_n + h * p.k_stride_h + c;
      *reinterpret_cast<uint4*>(static_cast<TCache*>(p.k) + k_dst) = quantize16<TIn, TCache>(k, k_scale);
    }
    if (v_dst >= 0) {
      const TIn* v = static_cast<const TIn*>(p.append_v) + i * p.v_stride_n + h * p.v_stride_h + c;
      *reinterpret_cast<uint4*>(static_cast<TCache*>(p.v) + v_dst) = quantize16<TIn, TCache>(v, v_scale);
    }
  });
}

// Rows of the cache's own dtype: raw 16-byte copies.
template <typename T>
__device__ __forceinline__ void append_paged_kv(const AppendKVParams& p) {
  append_for_each_vector<16 / static_cast<int>(sizeof(T))>(p, [&](i64 i, int h, int c, i64 k_dst, i64 v_dst) {
    if (k_dst >= 0)
      *reinterpret_cast<uint4*>(static_cast<T*>(p.k) + k_dst) =
          *reinterpret_cast<const uint4*>(static_cast<const T*>(p.append_k) + i * p.k_stride_n + h * p.k_stride_h + c);
    if (v_dst >= 0)
      *reinterpret_cast<uint4*>(static_cast<T*>(p.v) + v_dst) =
          *reinterpret_cast<const uint4*>(static_cast<const T*>(p.append_v) + i * p.v_stride_n + h * p.v_stride_h + c);
  });
}

#endif

}  // namespace tessera
