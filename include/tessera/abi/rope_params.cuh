// Parameter block of the standalone RoPE kernels (apply_rope,
// apply_rope_pos_ids, their Llama 3.1 forms and the cos/sin cache form).
// Plain data shared by host and device.
#pragma once
#include "tessera/abi/types.cuh"

namespace tessera {

// Where a standalone RoPE kernel takes pair j's angle from (a template
// argument of the kernel, part of its name).
enum class RopeMode : int {
  kLinear = 0,       // pos * rope_theta^(-2j / rotary_dim) / rope_scale
  kLlama31 = 1,      // the same frequency smoothed as Llama 3.1 (smooth_a, smooth_b)
  kCosSinCache = 2,  // cos_sin_cache[pos][j] and [pos][rotary_dim / 2 + j]
};

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
  // kLlama31: pair j's base frequency f (turns per position) becomes
  // f * ((1 - s) / rope_scale + s), s = clamp(f * smooth_a + smooth_b, 0, 1).
  float smooth_a, smooth_b;
  // kCosSinCache: float32 [cache_rows, rotary_dim] rows cache_stride apart;
  // a position outside [0, cache_rows) gives NaN features (not read).
  const float* cos_sin_cache;
  i64 cache_stride;
  i64 cache_rows;
};

}  // namespace tessera
