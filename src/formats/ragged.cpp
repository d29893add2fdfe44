// Ragged index validation. Kernels trust indptr blindly (it drives every
// address they compute), so the host checks it fully before anything launches.
#include "tessera/formats/ragged.hpp"

#include <limits>
#include <string>

#include "tessera/core/error.hpp"

namespace tessera {

void validate_indptr(const char* name, std::span<const int32_t> indptr, int64_t total) {
  const std::string n(name);
  if (indptr.empty())
    throw InvalidArgument(n + ": expected at least 1 entry (indptr[0] = 0), got an empty array");
  if (indptr[0] != 0)
    throw InvalidArgument(n + ": expected " + n + "[0] == 0, got " + n + "[0]=" + std::to_string(indptr[0]));
  for (size_t i = 0; i + 1 < indptr.size(); ++i) {
    if (indptr[i] > indptr[i + 1])
      throw InvalidArgument(n + ": expected non-decreasing values, got " + n + "[" + std::to_string(i) +
                            "]=" + std::to_string(indptr[i]) + " > " + n + "[" + std::to_string(i + 1) +
                            "]=" + std::to_string(indptr[i + 1]));
  }
  if (total >= 0 && indptr.back() != total)
    throw InvalidArgument(n + ": expected last value == " + std::to_string(total) + " (the total length), got " +
                          n + "[" + std::to_string(indptr.size() - 1) + "]=" + std::to_string(indptr.back()));
}

RaggedIndex::RaggedIndex(std::vector<int32_t> indptr, int64_t total, const char* name)
    : indptr_(std::move(indptr)) {
  validate_indptr(name, indptr_, total);
}

RaggedIndex RaggedIndex::from_lengths(std::span<const int32_t> lengths) {
  std::vector<int32_t> indptr(lengths.size() + 1, 0);
  int64_t running = 0;
  for (size_t i = 0; i < lengths.size(); ++i) {
    if (lengths[i] < 0)
      throw InvalidArgument("lengths: expected non-negative values, got lengths[" + std::to_string(i) +
                            "]=" + std::to_string(lengths[i]));
    running += lengths[i];
    // indptr is int32 on the device; a sum past 2^31-1 cannot be indexed.
    if (running > std::numeric_limits<int32_t>::max())
      throw InvalidArgument("lengths: expected a total below 2^31, got a running sum of " +
                            std::to_string(running) + " at lengths[" + std::to_string(i) + "]");
    indptr[i + 1] = static_cast<int32_t>(running);
  }
  return RaggedIndex(std::move(indptr));
}

}  // namespace tessera
