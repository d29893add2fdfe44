// Parameter block of the fused RoPE + fp8 quantize (+ paged append) kernel
// (FlashInfer's rope_quantize_fp8 and rope_quantize_fp8_append_paged_kv_cache).
// Plain data shared by host and device.
#pragma once
#include "tessera/abi/types.cuh"

namespace tessera {

// Where one kind of K / V row goes: row (i, h) starts at element
//   ptr + row_offset(i) + h * stride_h
// with row_offset(i) = i * stride_n without a page table, or, with one,
// page * page_stride + slot * token_stride for token i's cache slot.
struct RopeQuantizeDst {
  void* ptr;
  i64 stride_n, stride_h;
  i64 page_stride, token_stride;
};

// Token i (row i of every input, [nnz, heads, dim], last dim contiguous)
// turns its first rope_dim features (q_rope, k_rope) by the angle of
// cos_sin_cache[pos_ids[i]] (cos of pair j in column j, sin in column
// rope_dim / 2 + j; pairs (j, j + rope_dim / 2) or, interleaved, (2j, 2j+1)),
// in float32 with one rounding per operation (x cos - y sin, x cos + y sin);
// every value (rotated or not) is then multiplied by its quant scale (q:
// quant_scale_q; k, v: quant_scale_kv) and rounded to fp8 (nearest even,
// saturating; NaN stays NaN). A position outside [0, cache_rows) rotates to
// NaN. q goes to q_rope_out / q_nope_out; k_rope, k_nope and v to their
// destinations.
//
// Paged form (kv_indptr non-null): token i belongs to request b =
// batch_indices[i] at cache position positions[i]; its slot is page
// kv_indices[kv_indptr[b] + positions[i] / page_size], slot positions[i] %
// page_size. A token with b < 0 (padding) is skipped entirely (q too, as
// FlashInfer); one whose request, page or page index the table and storage
// do not cover writes q but not K / V.
struct RopeQuantizeParams {
  const void* q_rope;
  const void* k_rope;
  const void* q_nope;
  const void* k_nope;
  const void* v;  // null: no V (rope_quantize_fp8, MLA)
  i64 q_rope_stride_n, q_rope_stride_h, k_rope_stride_n, k_rope_stride_h;
  i64 q_nope_stride_n, q_nope_stride_h, k_nope_stride_n, k_nope_stride_h;
  i64 v_stride_n, v_stride_h;
  void* q_rope_out;
  void* q_nope_out;
  i64 q_rope_out_stride_n, q_rope_out_stride_h, q_nope_out_stride_n, q_nope_out_stride_h;
  RopeQuantizeDst k_rope_dst, k_nope_dst, v_dst;
  const float* cos_sin_cache;  // float32 [cache_rows, rope_dim], rows cache_stride apart
  i64 cache_stride, cache_rows;
  const int* pos_ids;  // [nnz]
  // Page table (all null / 0 without a cache).
  const int* batch_indices;  // [nnz]
  const int* positions;      // [nnz]
  const int* kv_indices;     // [num_indices]
  const int* kv_indptr;      // [batch + 1], or null: unpaged
  int batch, num_indices, num_pages, page_size;
  i64 nnz;
  int num_qo_heads, num_kv_heads;
  int rope_dim;     // a multiple of 16
  int no_rope_dim;  // a multiple of 8 (may be 0)
  float quant_scale_q, quant_scale_kv;
};

}  // namespace tessera
