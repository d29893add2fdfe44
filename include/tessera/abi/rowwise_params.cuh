// Parameter block of the row-wise (query tile 1, CUDA cores) attention kernel.
// Plain data: the host fills the very same struct and passes it by value.
#pragma once
#include "tessera/abi/kv_view.cuh"

namespace tessera {

template <typename Extra>
struct RowwiseParams {
  const void* q;        // [total_q, num_qo_heads, head_dim]
  void* o;              // [total_q, num_qo_heads, head_dim]
  float* lse;           // [total_q, num_qo_heads] base-2 LSE, or null
  i64 q_stride_n, q_stride_h;
  i64 o_stride_n, o_stride_h;
  const int* qo_indptr;  // [batch + 1]; null: one request of total_q rows
  device::PagedKV kv;
  int batch_size;
  int num_qo_heads;
  int total_q;
  float sm_scale;
  // Output scale (FlashInfer's v_scale: V's dequantization scale): O is
  // multiplied by it where the epilogue normalizes rows, before the
  // variant's OutputTransform; LSE is unchanged.
  float o_scale = 1.f;
  device::KVScaleTensors kv_scales;  // fp8 caches' scales as device tensors (null: none)
  Extra extra;  // the variant's own scalars / tensor pointers; keep last
};

}  // namespace tessera
