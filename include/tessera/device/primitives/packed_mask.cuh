// FlashInfer's packed custom mask, read 32 bits at a time: request b's
// [qo_len, kv_len] booleans, row-major, 8 per byte in little bit order,
// starting at byte mask_indptr[b] of one buffer. Used by the custom-mask
// variant (one word per 32 keys of a row, kernel_catalog.cpp) and by the pass
// that trims fully masked KV tiles off the work items (mask_trim.cuh).
#pragma once
#include "tessera/device/arch/numeric.cuh"

namespace tessera {

#if defined(__CUDACC__) || defined(__CUDACC_RTC__)

struct PackedMaskWords {
  const unsigned* words;  // the buffer from its 4-byte aligned start
  i64 first_bit;          // the request's bit 0, counted from words
  i64 last_word;          // the buffer's last word: nothing past it is read

  // bytes: the buffer's size; offset: the request's first byte in it.
  __device__ __forceinline__ PackedMaskWords(const u8* mask, i64 bytes, i64 offset) {
    const unsigned long long a = reinterpret_cast<unsigned long long>(mask);
    words = reinterpret_cast<const unsigned*>(a & ~3ull);
    first_bit = 8 * (static_cast<i64>(a & 3) + offset);
    last_word = (static_cast<i64>(a & 3) + bytes - 1) >> 2;
  }

  // Bits bit .. bit + 31 of the request (bit j of the result is bit + j):
  // two aligned words funnel-shifted, words past the buffer read as zero.
  // The caller ignores bits past the end of its row.
  __device__ __forceinline__ unsigned bits32(i64 bit) const {
    bit += first_bit;
    const i64 w = bit >> 5;
    const unsigned lo = w <= last_word ? __ldg(words + w) : 0u, hi = w + 1 <= last_word ? __ldg(words + w + 1) : 0u;
    return __funnelshift_r(lo, hi, static_cast<unsigned>(bit & 31));
  }
};

#endif

}  // namespace tessera
