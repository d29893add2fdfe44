// Rotary position embedding as a standalone op (FlashInfer's apply_rope,
// apply_rope_pos_ids, their Llama 3.1 forms and
// apply_rope_pos_ids_cos_sin_cache), with the same math as the fused RoPE
// variants (device/primitives/rope.cuh), e.g. to compare fused and unfused
// pipelines.
//
//   q [nnz, num_q_heads, head_dim], k [nnz, num_k_heads, head_dim]: fp16 or
//   bf16 (one dtype), head_dim 64 / 128 / 256, last dim contiguous
//   q_rope, k_rope: like q and k (they may be q and k: in place); k may have
//     zero heads (rotates q alone, e.g. a KV cache's rows)
//   apply_rope_pos_ids: pos_ids int32 [nnz], the position of each row
//   apply_rope: indptr int32 [batch + 1] over the rows and offsets int32
//     [batch]: row n of request b sits at offsets[b] + n - indptr[b]
//   apply_rope_pos_ids_cos_sin_cache: cos_sin_cache float32 [max_pos,
//     rotary_dim] (last dim contiguous), row p holding cos of pair j's angle
//     at position p in column j and its sin in column rotary_dim / 2 + j;
//     rotary_dim (a multiple of 16, <= head_dim) is its width
//
// CUDA tensors: one kernel launch on `stream` (no allocation, no sync); a
// position outside the cos/sin cache gives NaN in the rotated features there
// (the positions are not read back). Host tensors: computed on the CPU
// (float64 math, rounded to the dtype); positions outside the cache throw.
#pragma once
#include <cuda_runtime_api.h>

#include "tessera/core/tensor.hpp"

namespace tessera {

struct RopeOptions {
  int rotary_dim = -1;  // rotate the first rotary_dim features (a multiple of 16), < 0: all
  bool interleave = false;  // pairs (2j, 2j + 1); else (j, j + rotary_dim / 2)
  double rope_scale = 1.0;  // positions are divided by it (Llama 3.1: low frequencies only)
  double rope_theta = 1e4;
  // Llama 3.1 frequency scaling (FlashInfer's apply_llama31_rope): pairs of
  // wavelength below old_context_len / high_freq_factor keep their
  // frequency, those above old_context_len / low_freq_factor have it divided
  // by rope_scale, and those between blend the two linearly in
  // old_context_len / wavelength. Needs 0 < low_freq_factor <
  // high_freq_factor and old_context_len > 0.
  bool llama31 = false;
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  double old_context_len = 8192.0;
};

void apply_rope_pos_ids(const TensorView& q, const TensorView& k, const TensorView& q_rope, const TensorView& k_rope,
                        const TensorView& pos_ids, const RopeOptions& opt = {}, cudaStream_t stream = nullptr);
void apply_rope(const TensorView& q, const TensorView& k, const TensorView& q_rope, const TensorView& k_rope,
                const TensorView& indptr, const TensorView& offsets, const RopeOptions& opt = {},
                cudaStream_t stream = nullptr);
void apply_rope_pos_ids_cos_sin_cache(const TensorView& q, const TensorView& k, const TensorView& q_rope,
                                      const TensorView& k_rope, const TensorView& cos_sin_cache,
                                      const TensorView& pos_ids, bool interleave = false,
                                      cudaStream_t stream = nullptr);

}  // namespace tessera
