// Writing new K/V tokens into a paged KV cache (FlashInfer's
// append_paged_kv_cache).
//
//   append_key, append_value  [nnz, num_kv_heads, head_dim], the storage's dtype
//   batch_indices, positions  int32 [nnz]: token i belongs to request
//                             batch_indices[i] at position positions[i]
//   kv_indices, kv_indptr, kv_last_page_len   int32 page table of the cache
//                             *after* the append (so every position is inside
//                             its request's length)
//
// Token i goes to page kv_indices[kv_indptr[b] + pos / page_size], slot
// pos % page_size, of both K and V storage (any layout PagedKVStorage
// accepts: NHD, HND, separate or interleaved). Values are copied bit for bit.
//
// CUDA tensors: one kernel launch on `stream`, no synchronization and no
// allocation (capturable in a CUDA graph). The index tensors stay on the GPU
// and are not validated on the host; a token whose request, position or page
// index the page table and storage do not cover is skipped on the device
// rather than written out of bounds.
// Host tensors: plain loops on the CPU, with every index validated first
// (InvalidArgument naming "batch_indices", "positions" or "kv_indices"), so
// nothing is written when any index is bad.
#pragma once
#include <cuda_runtime_api.h>

#include "tessera/core/tensor.hpp"
#include "tessera/formats/paged_kv.hpp"

namespace tessera {

void append_paged_kv_cache(const TensorView& append_key, const TensorView& append_value,
                           const TensorView& batch_indices, const TensorView& positions, const PagedKVStorage& kv,
                           const TensorView& kv_indices, const TensorView& kv_indptr,
                           const TensorView& kv_last_page_len, cudaStream_t stream = nullptr);

}  // namespace tessera
