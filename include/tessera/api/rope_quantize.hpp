// The fused decode-step cache write for fp8 caches (FlashInfer's
// rope_quantize_fp8, mla_rope_quantize_fp8 and
// rope_quantize_fp8_append_paged_kv_cache): RoPE on the rotary parts of q
// and k, every q / k / v value quantized to fp8, k / v written to their
// outputs or straight into a paged fp8 cache, in one kernel launch.
//
//   q_rope  [nnz, num_qo_heads, rope_dim]    fp16 or bf16
//   k_rope  [nnz, num_kv_heads, rope_dim], or [nnz, rope_dim] (MLA: one head)
//   q_nope  [nnz, num_qo_heads, no_rope_dim] (undefined: no_rope_dim 0)
//   k_nope  like k_rope with no_rope_dim features (undefined: 0)
//   v       [nnz, num_kv_heads, rope_dim + no_rope_dim] (paged GQA / MHA form)
//   cos_sin_cache  float32 [max_pos, rope_dim]: row p holds cos of pair j's
//           angle at position p in column j, its sin in column rope_dim/2 + j
//   pos_ids int32 [nnz]: the RoPE position of each row
//   rope_dim a multiple of 16, no_rope_dim a multiple of 16 (or 0); one
//   16-bit dtype for every input; every output one fp8 dtype (float8_e4m3fn
//   or float8_e5m2) of its input's shape; last dims contiguous.
//
// Math (FlashInfer's convention): pairs (j, j + rope_dim / 2), or (2j, 2j+1)
// with interleave (FlashInfer's is_neox = !interleave); the pair's first
// feature becomes x cos - y sin, the second x cos + y sin, in float32 with
// one rounding per operation; every value, rotated or not, is multiplied by
// quant_scale_q (q) or quant_scale_kv (k, v) and rounded to fp8 (nearest
// even, saturating to +-448 / +-57344; NaN stays NaN): the same bits on the
// GPU and the CPU (float_to_fp8).
//
// Paged form: token i belongs to request batch_indices[i] at cache position
// positions[i] and goes to page kv_indices[kv_indptr[b] + positions[i] /
// page_size], slot positions[i] % page_size (FlashInfer has no
// kv_last_page_len here). GQA / MHA: k_rope fills features [0, rope_dim) of
// the K row, k_nope [rope_dim, head_dim), v the V row; the storage is fp8
// with head_dim = rope_dim + no_rope_dim (NHD / HND, separate or
// interleaved). MLA: k_rope goes to kpe_cache [num_pages, page_size,
// rope_dim], k_nope to ckv_cache [num_pages, page_size, no_rope_dim]. A
// token with batch_indices[i] < 0 is padding and nothing of it is written
// (its q outputs included), as in FlashInfer.
//
// CUDA tensors: one kernel launch on `stream`, no allocation, no
// synchronization (capturable). The index tensors stay on the GPU: a position
// outside the cos/sin cache rotates to NaN, and a token whose request, page
// or page index the table and storage do not cover has its K / V skipped.
// The kernel follows the tables' current values, within the views' lengths
// or RopeQuantizeOptions::max_batch / max_indices (as AppendOptions'; a
// graph captured with views of preallocated tables follows the larger tables
// written into the same buffers before a replay).
// Host tensors: plain loops; every index is checked first (InvalidArgument
// naming pos_ids, batch_indices, positions or kv_indices) and nothing is
// written when one is bad.
#pragma once
#include <cuda_runtime_api.h>

#include "tessera/core/tensor.hpp"
#include "tessera/formats/paged_kv.hpp"

namespace tessera {

struct RopeQuantizeOptions {
  bool interleave = false;     // pairs (2j, 2j + 1); FlashInfer's is_neox == !interleave
  double quant_scale_q = 1.0;  // q values are multiplied by it before rounding
  double quant_scale_kv = 1.0; // k and v values are multiplied by it
  // Paged forms on CUDA (0: the views' own lengths): the requests b whose
  // kv_indptr[b], kv_indptr[b + 1] the kernel may read, and the kv_indices
  // entries it may read, when the caller's buffers extend past the views.
  // They must not exceed the allocations (unchecked); at least the views'
  // lengths and at most 2^31 - 1, else InvalidArgument naming the option.
  // The CPU path validates and reads the views only.
  int64_t max_batch = 0, max_indices = 0;
};

// k_rope_out / k_nope_out: like k_rope / k_nope, fp8.
void rope_quantize_fp8(const TensorView& q_rope, const TensorView& k_rope, const TensorView& q_nope,
                       const TensorView& k_nope, const TensorView& cos_sin_cache, const TensorView& pos_ids,
                       const TensorView& q_rope_out, const TensorView& k_rope_out, const TensorView& q_nope_out,
                       const TensorView& k_nope_out, const RopeQuantizeOptions& opt = {},
                       cudaStream_t stream = nullptr);

// GQA / MHA: k_rope, k_nope, v 3-D; kv an fp8 storage of head_dim rope_dim + no_rope_dim.
void rope_quantize_fp8_append_paged_kv_cache(const TensorView& q_rope, const TensorView& k_rope,
                                             const TensorView& q_nope, const TensorView& k_nope, const TensorView& v,
                                             const TensorView& cos_sin_cache, const TensorView& pos_ids,
                                             const PagedKVStorage& kv, const TensorView& kv_indices,
                                             const TensorView& kv_indptr, const TensorView& batch_indices,
                                             const TensorView& positions, const TensorView& q_rope_out,
                                             const TensorView& q_nope_out, const RopeQuantizeOptions& opt = {},
                                             cudaStream_t stream = nullptr);

// MLA: k_rope [nnz, rope_dim], k_nope [nnz, no_rope_dim]; ckv_cache / kpe_cache fp8 [num_pages, page_size, dim].
void rope_quantize_fp8_append_paged_mla_cache(const TensorView& q_rope, const TensorView& k_rope,
                                              const TensorView& q_nope, const TensorView& k_nope,
                                              const TensorView& cos_sin_cache, const TensorView& pos_ids,
                                              const TensorView& ckv_cache, const TensorView& kpe_cache,
                                              const TensorView& kv_indices, const TensorView& kv_indptr,
                                              const TensorView& batch_indices, const TensorView& positions,
                                              const TensorView& q_rope_out, const TensorView& q_nope_out,
                                              const RopeQuantizeOptions& opt = {}, cudaStream_t stream = nullptr);

}  // namespace tessera
