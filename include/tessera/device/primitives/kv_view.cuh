// Device views of KV storage. Plain structs (no device code) so the host can
// fill them and pass them inside kernel parameter blocks.
#pragma once
#include "tessera/device/arch/numeric.cuh"

namespace tessera {
namespace device {

// A paged KV cache as kernels see it. Token `pos` of request `b` lives in
// storage page indices[indptr[b] + pos / page_size], slot pos % page_size; its
// head h vector starts at element page*page_stride + h*head_stride +
// slot*token_stride of k (or v). Strides cover NHD, HND and interleaved K/V.
// Contiguous KV of one request is the special case of a single page: when
// indptr is null there is one request whose single_len tokens all sit in
// page 0 (page_size = single_len), so no index arrays are needed.
struct PagedKV {
  const void* k;
  const void* v;
  const int* indptr;         // [batch + 1]
  const int* indices;        // [indptr[batch]]
  const int* last_page_len;  // [batch]
  i64 page_stride;
  i64 head_stride;
  i64 token_stride;
  int page_size;
  int num_kv_heads;
  int single_len;  // used only when indptr is null
};

#if defined(__CUDACC__) || defined(__CUDACC_RTC__)
__device__ __forceinline__ int kv_len(const PagedKV& kv, int b) {
  if (kv.indptr == nullptr) return kv.single_len;
  int pages = kv.indptr[b + 1] - kv.indptr[b];
  return pages == 0 ? 0 : (pages - 1) * kv.page_size + kv.last_page_len[b];
}
// Element offset of (token pos of request b, head h).
__device__ __forceinline__ i64 kv_offset(const PagedKV& kv, int b, int pos, int h) {
  if (kv.indptr == nullptr) return pos * kv.token_stride + h * kv.head_stride;
  int page = kv.indices[kv.indptr[b] + pos / kv.page_size];
  return page * kv.page_stride + h * kv.head_stride + (pos % kv.page_size) * kv.token_stride;
}
#endif

}  // namespace device
}  // namespace tessera
