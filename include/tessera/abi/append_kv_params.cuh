// Parameter block of the paged-KV append kernel (plain data, host-includable).
#pragma once
#include "tessera/abi/types.cuh"

namespace tessera {

// Appended token i (row i of append_k [nnz, H, head_dim] and append_v [nnz,
// H, v_head_dim]) belongs to request batch_indices[i] at position
// positions[i]; it is written to storage page kv_indices[kv_indptr[b] + pos /
// page_size], slot pos % page_size, addressed with the strides of
// device::PagedKV (so NHD, HND and interleaved K/V are all just strides; V
// has strides of its own, K's unless its head dim differs). The page table
// describes the cache *after* the append (FlashInfer's convention): the
// positions must already be inside each request's length.
struct AppendKVParams {
  const void* append_k;
  const void* append_v;
  i64 k_stride_n, k_stride_h;  // of append_k, in elements (last dim contiguous)
  i64 v_stride_n, v_stride_h;  // of append_v
  void* k;
  void* v;
  i64 page_stride, head_stride, token_stride;        // of k
  i64 v_page_stride, v_head_stride, v_token_stride;  // of v
  const int* batch_indices;     // [nnz]
  const int* positions;         // [nnz]
  const int* kv_indices;        // [num_indices]
  const int* kv_indptr;         // [batch + 1]
  const int* kv_last_page_len;  // [batch]
  i64 nnz;
  // How far the tables may be read: the requests whose entries exist and the
  // kv_indices entries that exist (the buffers' capacity, which may exceed
  // the current batch: the values in the tables decide the rest).
  int batch;
  int num_indices;
  int num_pages;  // pages in the storage
  int page_size;
  int num_heads;
  int head_dim;    // K's
  int v_head_dim;  // V's (head_dim but for DeepSeek-style 192 / 128)
  // Quantizing appends (16-bit rows into an fp8 cache): every K (V) value is
  // divided by k_scale (v_scale), times *k_scale_ptr (*v_scale_ptr) when
  // non-null (a 1-element float32 device tensor), and rounded to fp8 with
  // saturation. Raw copies ignore them.
  float k_scale, v_scale;
  const float* k_scale_ptr;
  const float* v_scale_ptr;
};

}  // namespace tessera
