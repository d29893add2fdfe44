// Ragged tensors: rows of variable-length sequences packed without padding,
// addressed through an index pointer array (indptr[i]..indptr[i+1] are the
// rows of sequence i). Queries, outputs and ragged (contiguous) KV use this.
#pragma once
#include <cstdint>
#include <span>
#include <vector>

namespace tessera {

// Validates an indptr array: indptr[0] == 0, non-decreasing, and, when
// `total` >= 0, indptr.back() == total. Throws InvalidArgument naming `name`.
void validate_indptr(const char* name, std::span<const int32_t> indptr, int64_t total = -1);

// A host-side ragged index: the indptr of a ragged tensor, validated.
class RaggedIndex {
 public:
  RaggedIndex() = default;
  // `name` is used in error messages; `total` (if >= 0) must equal indptr.back().
  explicit RaggedIndex(std::vector<int32_t> indptr, int64_t total = -1, const char* name = "indptr");
  static RaggedIndex from_lengths(std::span<const int32_t> lengths);

  int64_t num_sequences() const { return indptr_.empty() ? 0 : static_cast<int64_t>(indptr_.size()) - 1; }
  int64_t total() const { return indptr_.empty() ? 0 : indptr_.back(); }
  int32_t begin(int64_t i) const { return indptr_[i]; }
  int32_t length(int64_t i) const { return indptr_[i + 1] - indptr_[i]; }
  std::span<const int32_t> indptr() const { return indptr_; }

 private:
  std::vector<int32_t> indptr_{0};
};

}  // namespace tessera
