// FlashInfer's packed custom mask: a bit per (query, key) of each request.
// Reads PrefillParams::custom_mask / mask_indptr, so prefill only. The
// constructor resolves the request's first byte once per work item; the bit
// index is 64-bit because qo_len * kv_len may pass 2^31. LogitsMaskBits reads
// 32 bits at once (PackedMaskWords, also used by the pass that trims fully
// masked KV tiles off the work items).
#pragma once
#include "tessera/device/primitives/packed_mask.cuh"
#include "tessera/device/primitives/variant.cuh"

namespace tessera::variants {

struct CustomMaskAttention : VariantBase {
  const u8* mask;         // this request's packed bits
  PackedMaskWords words;  // the same bits, 32 at a time
  template <typename Params>
  __device__ __forceinline__ CustomMaskAttention(const Params& p, int batch_idx, int qo_len_, int kv_len_)
      : VariantBase(p, batch_idx, qo_len_, kv_len_), mask(p.custom_mask + p.mask_indptr[batch_idx]),
        words(p.custom_mask, p.custom_mask_bytes, p.mask_indptr[batch_idx]) {}
  template <typename Params>
  __device__ __forceinline__ bool LogitsMask(const Params&, int, int qo_idx, int kv_idx, int, int) const {
    const long long bit = static_cast<long long>(qo_idx) * kv_len + kv_idx;
    return (mask[bit >> 3] >> (bit & 7)) & 1;
  }
  template <typename Params>
  __device__ __forceinline__ unsigned LogitsMaskBits(const Params&, int, int qo_idx, int kv_idx, int, int) const {
    return words.bits32(static_cast<long long>(qo_idx) * kv_len + kv_idx);
  }
};

}  // namespace tessera::variants
