// Parameter block of the standalone RoPE kernels (apply_rope,
// apply_rope_pos_ids). Plain data shared by host and device.
#pragma once
#include "tessera/abi/types.cuh"

namespace tessera {

// Rows n of q [nnz, num_q_heads, head_dim] and k [nnz, num_k_heads,
// head_dim] (last dim contiguous) are rotated at position pos_ids[n] or, with
// pos_ids null, offsets[b] + n - indptr[b] for the request b holding row n;
// the results go to q_out / k_out (which may be q / k themselves). Features
// at and beyond rotary_dim are copied unchanged.
struct RopeParams {
  const void* q;
  const void* k;
  void* q_out;
  void* k_out;
  i64 q_stride_n, q_stride_h, k_stride_n, k_stride_h;
  i64 qo_stride_n, qo_stride_h, ko_stride_n, ko_stride_h;
  const int* pos_ids;  // [nnz], or null
  const int* indptr;   // [batch + 1] (pos_ids null)
  const int* offsets;  // [batch] (pos_ids null)
  i64 nnz;
  int batch;
  int num_q_heads, num_k_heads;
  int rotary_dim;  // a multiple of 16, <= head_dim
  float rope_scale, rope_theta;
};

}  // namespace tessera
