// Writing new K/V tokens into a paged KV cache (FlashInfer's
// append_paged_kv_cache).
//
//   append_key, append_value  [nnz, num_kv_heads, head_dim] and [nnz,
//                             num_kv_heads, v_head_dim] (the storage's K and V
//                             widths: equal, or 192 / 128), the storage's
//                             dtype, or float16 / bfloat16 into an fp8
//                             storage (below)
//   batch_indices, positions  int32 [nnz]: token i belongs to request
//                             batch_indices[i] at position positions[i]
//   kv_indices, kv_indptr, kv_last_page_len   int32 page table of the cache
//                             *after* the append (so every position is inside
//                             its request's length)
//
// Token i goes to page kv_indices[kv_indptr[b] + pos / page_size], slot
// pos % page_size, of both K and V storage (any layout PagedKVStorage
// accepts: NHD, HND, separate or interleaved; a narrower V at its own
// strides). Rows of the storage's dtype
// are copied bit for bit. 16-bit rows into an fp8 storage (float8_e4m3fn,
// float8_e5m2) are quantized: each K value divided by the K scale (each V by
// the V scale; AppendOptions), rounded to nearest even and saturated to the
// format's largest finite value (448 / 57344; NaN stays NaN), the same bits
// on the GPU and the CPU (float_to_fp8).
//
// CUDA tensors: one kernel launch on `stream`, no synchronization and no
// allocation (capturable in a CUDA graph). The index tensors stay on the GPU
// and are not validated on the host; a token whose request, position or page
// index the page table and storage do not cover is skipped on the device
// rather than written out of bounds. The kernel follows the tables' current
// values, within the views' lengths, or within AppendOptions::max_batch /
// max_indices when the caller's buffers extend past the views (a CUDA graph
// captured with views of preallocated tables, replayed after larger tables
// were written into the same buffers).
// Host tensors: plain loops on the CPU, with every index validated first
// (InvalidArgument naming "batch_indices", "positions" or "kv_indices"), so
// nothing is written when any index is bad.
#pragma once
#include <cuda_runtime_api.h>

#include "tessera/core/tensor.hpp"
#include "tessera/formats/paged_kv.hpp"

namespace tessera {

// Quantizing appends only: the dequantization scales the cache is read with
// (RunOptions::k_scale / v_scale), as floats and / or 1-element float32
// tensors on the storage's device (the kernel reads these at run time, so a
// captured graph appends with their current values); a value is stored as
// x / (k_scale * *k_scale_tensor). Appends of the storage's own dtype take
// the defaults only (InvalidArgument naming the scale otherwise).
//
// max_batch, max_indices (CUDA only; 0: the views' own lengths): how far the
// kernel may read the page table past the views it is given. The entries
// kv_indptr[b], kv_indptr[b + 1] and kv_last_page_len[b] of every request b <
// max_batch, and kv_indices[j] for j < max_indices, must lie inside the
// caller's allocations (this is not checked: a device pointer carries no
// size). At least the views' lengths (kv_indptr.size(0) - 1, kv_indices.size(0))
// and at most 2^31 - 1, else InvalidArgument naming the option. The CPU path
// validates and reads the views only.
struct AppendOptions {
  double k_scale = 1.0, v_scale = 1.0;
  TensorView k_scale_tensor, v_scale_tensor;  // undefined: none
  int64_t max_batch = 0, max_indices = 0;
};

void append_paged_kv_cache(const TensorView& append_key, const TensorView& append_value,
                           const TensorView& batch_indices, const TensorView& positions, const PagedKVStorage& kv,
                           const TensorView& kv_indices, const TensorView& kv_indptr,
                           const TensorView& kv_last_page_len, cudaStream_t stream = nullptr,
                           const AppendOptions& opt = {});

}  // namespace tessera
