// Packed custom masks: indptr construction and validation, packing and
// unpacking (little bit order, as FlashInfer's kernels read the bits).
#include "tessera/formats/custom_mask.hpp"

#include <limits>
#include <string>

#include "tessera/core/error.hpp"
#include "tessera/formats/ragged.hpp"

namespace tessera {

namespace {

std::string str(int64_t v) { return std::to_string(v); }

void check_lengths(std::span<const int32_t> qo_lens, std::span<const int32_t> kv_lens) {
  if (qo_lens.size() != kv_lens.size())
    throw InvalidArgument("kv_lens: expected " + str(qo_lens.size()) + " requests like qo_lens, got " +
                          str(kv_lens.size()));
  for (size_t b = 0; b < qo_lens.size(); ++b)
    if (qo_lens[b] < 0 || kv_lens[b] < 0)
      throw InvalidArgument("lengths: expected non-negative query and KV lengths, got request " + str(b) + " with " +
                            str(qo_lens[b]) + " queries and " + str(kv_lens[b]) + " keys");
}

}  // namespace

std::vector<int32_t> mask_indptr_for(std::span<const int32_t> qo_lens, std::span<const int32_t> kv_lens) {
  check_lengths(qo_lens, kv_lens);
  std::vector<int32_t> indptr(qo_lens.size() + 1, 0);
  int64_t total = 0;
  for (size_t b = 0; b < qo_lens.size(); ++b) {
    total += packed_mask_bytes(qo_lens[b], kv_lens[b]);
    if (total > std::numeric_limits<int32_t>::max())
      throw InvalidArgument("mask_indptr: the packed masks need " + str(total) +
                            " bytes up to request " + str(b) + ", beyond int32 offsets (2^31 - 1)");
    indptr[b + 1] = static_cast<int32_t>(total);
  }
  return indptr;
}

void validate_mask_indptr(std::span<const int32_t> mask_indptr, std::span<const int32_t> qo_lens,
                          std::span<const int32_t> kv_lens) {
  check_lengths(qo_lens, kv_lens);
  const size_t batch = qo_lens.size();
  if (mask_indptr.size() != batch + 1)
    throw InvalidArgument("mask_indptr: expected batch + 1 = " + str(batch + 1) + " entries, got " +
                          str(mask_indptr.size()));
  validate_indptr("mask_indptr", mask_indptr);
  for (size_t b = 0; b < batch; ++b) {
    const int64_t want = packed_mask_bytes(qo_lens[b], kv_lens[b]);
    const int64_t got = int64_t{mask_indptr[b + 1]} - mask_indptr[b];
    if (got != want)
      throw InvalidArgument("mask_indptr: request " + str(b) + " (" + str(qo_lens[b]) + " queries x " +
                            str(kv_lens[b]) + " keys) needs ceil(" + str(int64_t{qo_lens[b]} * kv_lens[b]) +
                            " / 8) = " + str(want) + " bytes, got mask_indptr[" + str(b + 1) + "] - mask_indptr[" +
                            str(b) + "] = " + str(got));
  }
}

PackedMask pack_custom_mask(std::span<const uint8_t> mask, std::span<const int32_t> qo_lens,
                            std::span<const int32_t> kv_lens) {
  PackedMask out;
  out.indptr = mask_indptr_for(qo_lens, kv_lens);
  int64_t need = 0;
  for (size_t b = 0; b < qo_lens.size(); ++b) need += int64_t{qo_lens[b]} * kv_lens[b];
  if (static_cast<int64_t>(mask.size()) != need)
    throw InvalidArgument("custom_mask: expected " + str(need) + " entries (sum of qo_len * kv_len), got " +
                          str(mask.size()));
  out.bits.assign(static_cast<size_t>(out.indptr.back()), 0);
  int64_t src = 0;
  for (size_t b = 0; b < qo_lens.size(); ++b) {
    uint8_t* dst = out.bits.data() + out.indptr[b];
    const int64_t n = int64_t{qo_lens[b]} * kv_lens[b];  // each request starts on a byte boundary
    for (int64_t i = 0; i < n; ++i)
      if (mask[src + i]) dst[i >> 3] |= static_cast<uint8_t>(1u << (i & 7));
    src += n;
  }
  return out;
}

std::vector<uint8_t> unpack_custom_mask(std::span<const uint8_t> packed, std::span<const int32_t> mask_indptr,
                                        std::span<const int32_t> qo_lens, std::span<const int32_t> kv_lens) {
  validate_mask_indptr(mask_indptr, qo_lens, kv_lens);
  if (static_cast<int64_t>(packed.size()) < mask_indptr.back())
    throw InvalidArgument("packed_custom_mask: expected at least mask_indptr[batch] = " + str(mask_indptr.back()) +
                          " bytes, got " + str(packed.size()));
  std::vector<uint8_t> out;
  for (size_t b = 0; b < qo_lens.size(); ++b) {
    const uint8_t* src = packed.data() + mask_indptr[b];
    const int64_t n = int64_t{qo_lens[b]} * kv_lens[b];
    for (int64_t i = 0; i < n; ++i) out.push_back((src[i >> 3] >> (i & 7)) & 1);
  }
  return out;
}

}  // namespace tessera
