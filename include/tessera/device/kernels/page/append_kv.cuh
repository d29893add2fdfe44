// Appends new K/V tokens to a paged KV cache (FlashInfer's
// append_paged_kv_cache). A pure copy: values move as raw 16-byte vectors, so
// the cache holds exactly the bits of the appended rows.
//
// Thread mapping: one thread per 16-byte vector of one (token, head) row, both
// K and V; a grid-stride loop covers any nnz with a bounded grid. Neighbouring
// threads copy neighbouring vectors of the same row, so both the reads and the
// writes of a warp are contiguous runs of head_dim elements.
//
// Device-side guard: the host cannot validate GPU index tensors without a
// synchronizing copy (which would also break CUDA-graph capture), so a token
// whose request index, position or page index is outside what the page table
// and storage describe is skipped instead of written out of bounds.
#pragma once
#include "tessera/device/arch/numeric.cuh"
#include "tessera/abi/append_kv_params.cuh"

namespace tessera {

#if defined(__CUDACC__) || defined(__CUDACC_RTC__)

constexpr int kAppendThreads = 256;

// The storage element offset of token (b, pos), or -1 when the page table or
// the storage does not cover it.
__device__ __forceinline__ i64 append_slot_offset(const AppendKVParams& p, int b, int pos) {
  if (b < 0 || b >= p.batch || pos < 0) return -1;
  const int first = p.kv_indptr[b], pages = p.kv_indptr[b + 1] - first;
  const int page_in_req = pos / p.page_size, slot = pos - page_in_req * p.page_size;
  if (page_in_req >= pages) return -1;
  if (page_in_req == pages - 1 && slot >= p.kv_last_page_len[b]) return -1;  // past the request's length
  const int j = first + page_in_req;
  if (first < 0 || j >= p.num_indices) return -1;
  const int page = p.kv_indices[j];
  if (page < 0 || page >= p.num_pages) return -1;
  return page * p.page_stride + slot * p.token_stride;
}

template <typename T>
__device__ __forceinline__ void append_paged_kv(const AppendKVParams& p) {
  constexpr int kVec = 16 / static_cast<int>(sizeof(T));
  const int vecs_per_head = p.head_dim / kVec;
  const i64 vecs_per_token = static_cast<i64>(p.num_heads) * vecs_per_head;
  const i64 total = p.nnz * vecs_per_token;
  const i64 step = static_cast<i64>(gridDim.x) * blockDim.x;
  for (i64 t = static_cast<i64>(blockIdx.x) * blockDim.x + threadIdx.x; t < total; t += step) {
    const i64 i = t / vecs_per_token;
    const int rem = static_cast<int>(t - i * vecs_per_token);
    const int h = rem / vecs_per_head;
    const int c = (rem - h * vecs_per_head) * kVec;
    const i64 base = append_slot_offset(p, p.batch_indices[i], p.positions[i]);
    if (base < 0) continue;
    const i64 dst = base + h * p.head_stride + c;
    const uint4 kv = *reinterpret_cast<const uint4*>(static_cast<const T*>(p.append_k) + i * p.k_stride_n +
                                                     h * p.k_stride_h + c);
    const uint4 vv = *reinterpret_cast<const uint4*>(static_cast<const T*>(p.append_v) + i * p.v_stride_n +
                                                     h * p.v_stride_h + c);
    *reinterpret_cast<uint4*>(static_cast<T*>(p.k) + dst) = kv;
    *reinterpret_cast<uint4*>(static_cast<T*>(p.v) + dst) = vv;
  }
}

#endif

}  // namespace tessera
