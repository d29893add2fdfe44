// Parameter block of the paged-KV append kernel (plain data, host-includable).
#pragma once
#include "tessera/abi/types.cuh"

namespace tessera {

// Appended token i (row i of append_k / append_v, [nnz, H, D]) belongs to
// request batch_indices[i] at position positions[i]; it is written to storage
// page kv_indices[kv_indptr[b] + pos / page_size], slot pos % page_size,
// addressed with the same strides as device::PagedKV (so NHD, HND and
// interleaved K/V are all just strides). The page table describes the cache
// *after* the append (FlashInfer's convention): the positions must already be
// inside each request's length.
struct AppendKVParams {
  const void* append_k;
  const void* append_v;
  i64 k_stride_n, k_stride_h;  // of append_k, in elements (last dim contiguous)
  i64 v_stride_n, v_stride_h;  // of append_v
  void* k;
  void* v;
  i64 page_stride, head_stride, token_stride;
  const int* batch_indices;     // [nnz]
  const int* positions;         // [nnz]
  const int* kv_indices;        // [num_indices]
  const int* kv_indptr;         // [batch + 1]
  const int* kv_last_page_len;  // [batch]
  i64 nnz;
  int batch;
  int num_indices;
  int num_pages;  // pages in the storage
  int page_size;
  int num_heads;
  int head_dim;
  // Quantizing appends (16-bit rows into an fp8 cache): every K (V) value is
  // divided by k_scale (v_scale), times *k_scale_ptr (*v_scale_ptr) when
  // non-null (a 1-element float32 device tensor), and rounded to fp8 with
  // saturation. Raw copies ignore them.
  float k_scale, v_scale;
  const float* k_scale_ptr;
  const float* v_scale_ptr;
};

}  // namespace tessera
