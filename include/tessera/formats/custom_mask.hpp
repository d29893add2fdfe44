// Custom attention masks in FlashInfer's packed format. Request b has a
// boolean mask of shape [qo_len_b, kv_len_b] (row-major, true = the query
// sees the key). Packed, each request's flattened mask becomes
// ceil(qo_len_b * kv_len_b / 8) bytes with little bit order (numpy
// packbits(bitorder="little")): position i = q * kv_len_b + k is bit i % 8 of
// byte i / 8. The requests' bytes are concatenated and mask_indptr [batch + 1]
// holds the byte offset of each. Kernels trust mask_indptr to address the
// bits, so the host checks it against the lengths before anything launches.
#pragma once
#include <cstdint>
#include <span>
#include <vector>

namespace tessera {

// Bytes of one request's packed mask.
inline int64_t packed_mask_bytes(int64_t qo_len, int64_t kv_len) { return (qo_len * kv_len + 7) / 8; }

// mask_indptr for these lengths (int32: throws InvalidArgument naming
// mask_indptr when the total reaches 2^31 bytes).
std::vector<int32_t> mask_indptr_for(std::span<const int32_t> qo_lens, std::span<const int32_t> kv_lens);

// Validates mask_indptr against the request lengths: batch + 1 entries,
// starting at 0, non-decreasing, request b spanning exactly
// packed_mask_bytes(qo_lens[b], kv_lens[b]) bytes. Throws InvalidArgument
// naming mask_indptr.
void validate_mask_indptr(std::span<const int32_t> mask_indptr, std::span<const int32_t> qo_lens,
                          std::span<const int32_t> kv_lens);

struct PackedMask {
  std::vector<uint8_t> bits;     // every request's packed bytes, concatenated
  std::vector<int32_t> indptr;   // mask_indptr [batch + 1]
};

// Packs FlashInfer's flat custom_mask (one byte per position, nonzero =
// visible; requests' row-major blocks concatenated). Throws InvalidArgument
// naming custom_mask when its size is not the sum of qo_len * kv_len.
PackedMask pack_custom_mask(std::span<const uint8_t> mask, std::span<const int32_t> qo_lens,
                            std::span<const int32_t> kv_lens);

// The inverse: the flat 0/1 mask (as reference::Options::custom_mask takes
// it) from packed bytes and a mask_indptr valid for these lengths.
std::vector<uint8_t> unpack_custom_mask(std::span<const uint8_t> packed, std::span<const int32_t> mask_indptr,
                                        std::span<const int32_t> qo_lens, std::span<const int32_t> kv_lens);

}  // namespace tessera
