// Rotary position embedding as a standalone op (FlashInfer's apply_rope and
// apply_rope_pos_ids), with the same math as the fused RoPE variants
// (device/primitives/rope.cuh), e.g. to compare fused and unfused pipelines.
//
//   q [nnz, num_q_heads, head_dim], k [nnz, num_k_heads, head_dim]: fp16 or
//   bf16 (one dtype), head_dim 64 / 128 / 256, last dim contiguous
//   q_rope, k_rope: like q and k (they may be q and k: in place); k may have
//     zero heads (rotates q alone, e.g. a KV cache's rows)
//   apply_rope_pos_ids: pos_ids int32 [nnz], the position of each row
//   apply_rope: indptr int32 [batch + 1] over the rows and offsets int32
//     [batch]: row n of request b sits at offsets[b] + n - indptr[b]
//
// CUDA tensors: one kernel launch on `stream` (no allocation, no sync).
// Host tensors: computed on the CPU (float64 math, rounded to the dtype).
#pragma once
#include <cuda_runtime_api.h>

#include "tessera/core/tensor.hpp"

namespace tessera {

struct RopeOptions {
  int rotary_dim = -1;  // rotate the first rotary_dim features (a multiple of 16), < 0: all
  bool interleave = false;  // pairs (2j, 2j + 1); else (j, j + rotary_dim / 2)
  double rope_scale = 1.0;  // positions are divided by it
  double rope_theta = 1e4;
};

void apply_rope_pos_ids(const TensorView& q, const TensorView& k, const TensorView& q_rope, const TensorView& k_rope,
                        const TensorView& pos_ids, const RopeOptions& opt = {}, cudaStream_t stream = nullptr);
void apply_rope(const TensorView& q, const TensorView& k, const TensorView& q_rope, const TensorView& k_rope,
                const TensorView& indptr, const TensorView& offsets, const RopeOptions& opt = {},
                cudaStream_t stream = nullptr);

}  // namespace tessera
