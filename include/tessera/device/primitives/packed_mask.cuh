// FlashInfer's packed custom mask, read 32 bits at a time: request b's
// [qo_len, kv_len] booleans, row-major, 8 per byte in little bit order,
// starting at byte mask_indptr[b] of one buffer. Used by the custom-mask
// variant (one word per 32 keys of a row, device/variants/custom_mask.cuh) and by the pass
// that trims fully masked KV tiles off the work items (page/mask_trim.cuh).
#pragma once
#include "tessera/device/arch/numeric.cuh"

namespace tessera {

#if defined(__CUDACC__) || defined(__CUDACC_RTC__)

struct PackedMaskWords {
  const unsigned* words;  // the buffer from its 4-byte aligned start
  i64 first_bit;          // the request's bit 0, counted from words
  i64 full_words;         // words wholly inside the buffer
  unsigned tail;          // the word the buffer's end cuts, its missing bytes zero (0: none)

  // bytes: the buffer's size; offset: the request's first byte in it. The
  // cut word is read here once, byte by byte, so word() stays one load and
  // a select (a byte loop there made the per-tile mask loads 5-18% slower).
  __device__ __forceinline__ PackedMaskWords(const u8* mask, i64 bytes, i64 offset) {
    const unsigned long long a = reinterpret_cast<unsigned long long>(mask);
    words = reinterpret_cast<const unsigned*>(a & ~3ull);
    first_bit = 8 * (static_cast<i64>(a & 3) + offset);
    const i64 end = static_cast<i64>(a & 3) + bytes;  // in bytes from words
    full_words = end >> 2;
    tail = 0u;
    const u8* last = reinterpret_cast<const u8*>(words + full_words);
    for (int i = 0; i < static_cast<int>(end & 3); ++i) tail |= static_cast<unsigned>(__ldg(last + i)) << (8 * i);
  }

  // Aligned word w of the buffer; past its end, zero. Nothing past the
  // buffer is read.
  __device__ __forceinline__ unsigned word(i64 w) const {
    return w < full_words ? __ldg(words + w) : w == full_words ? tail : 0u;
  }

  // Bits bit .. bit + 31 of the request (bit j of the result is bit + j):
  // two aligned words funnel-shifted. The caller ignores bits past the end
  // of its row.
  __device__ __forceinline__ unsigned bits32(i64 bit) const {
    bit += first_bit;
    const i64 w = bit >> 5;
    return __funnelshift_r(word(w), word(w + 1), static_cast<unsigned>(bit & 31));
  }
};

#endif

}  // namespace tessera
