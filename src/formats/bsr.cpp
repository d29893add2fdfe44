// Block-sparse row matrices and the page-table -> BSR mapping (paper §3.1:
// every KV-cache format is a BSR matrix with the right block shape).
#include "tessera/formats/bsr.hpp"

#include <limits>
#include <string>

#include "tessera/core/error.hpp"

namespace tessera {

namespace {

std::string str(int64_t x) { return std::to_string(x); }

}  // namespace

BSRMatrix::BSRMatrix(int64_t M, int64_t N, int32_t Br, int32_t Bc, std::vector<int32_t> indptr,
                     std::vector<int32_t> indices, std::vector<int32_t> last_block_len)
    : M_(M),
      N_(N),
      Br_(Br),
      Bc_(Bc),
      indptr_(std::move(indptr)),
      indices_(std::move(indices)),
      last_block_len_(std::move(last_block_len)) {
  if (Br_ < 1) throw InvalidArgument("Br: expected >= 1, got " + str(Br_));
  if (Bc_ < 1) throw InvalidArgument("Bc: expected >= 1, got " + str(Bc_));
  if (M_ < 0 || M_ % Br_ != 0)
    throw InvalidArgument("M: expected a non-negative multiple of Br=" + str(Br_) + ", got " + str(M_));
  if (N_ < 0 || N_ % Bc_ != 0)
    throw InvalidArgument("N: expected a non-negative multiple of Bc=" + str(Bc_) + ", got " + str(N_));
  const int64_t block_rows = M_ / Br_, block_cols = N_ / Bc_;
  if (static_cast<int64_t>(indptr_.size()) != block_rows + 1)
    throw InvalidArgument("indptr: expected " + str(block_rows + 1) + " entries (M/Br + 1), got " +
                          str(static_cast<int64_t>(indptr_.size())));
  validate_indptr("indptr", indptr_);
  if (static_cast<int64_t>(indices_.size()) != indptr_.back())
    throw InvalidArgument("indices: expected " + str(indptr_.back()) + " entries (indptr.back()), got " +
                          str(static_cast<int64_t>(indices_.size())));
  for (size_t i = 0; i < indices_.size(); ++i) {
    if (indices_[i] < 0 || indices_[i] >= block_cols)
      throw InvalidArgument("indices: expected values in [0, " + str(block_cols) + ") (N/Bc), got indices[" +
                            str(static_cast<int64_t>(i)) + "]=" + str(indices_[i]));
  }
  if (last_block_len_.empty()) return;
  if (static_cast<int64_t>(last_block_len_.size()) != block_rows)
    throw InvalidArgument("last_block_len: expected " + str(block_rows) + " entries (M/Br) or none, got " +
                          str(static_cast<int64_t>(last_block_len_.size())));
  for (int64_t r = 0; r < block_rows; ++r) {
    // Same rule as PageTable::last_page_len: an empty row's value is ignored.
    const int32_t lo = indptr_[r + 1] > indptr_[r] ? 1 : 0;
    if (last_block_len_[r] < lo || last_block_len_[r] > Bc_)
      throw InvalidArgument("last_block_len: expected values in [" + str(lo) + ", " + str(Bc_) +
                            "] (Bc), got last_block_len[" + str(r) + "]=" + str(last_block_len_[r]));
  }
}

int64_t BSRMatrix::row_kv_len(int64_t r) const {
  if (r < 0 || r >= num_block_rows())
    throw InvalidArgument("r: expected a block row in [0, " + str(num_block_rows()) + "), got " + str(r));
  const int64_t blocks = indptr_[r + 1] - indptr_[r];
  if (blocks == 0) return 0;
  const int64_t last = has_last_block_len() ? last_block_len_[r] : Bc_;
  return (blocks - 1) * Bc_ + last;
}

BSRMatrix page_table_to_bsr(const PageTable& table, const RaggedIndex& qo) {
  if (qo.num_sequences() != table.num_requests())
    throw InvalidArgument("qo: expected " + str(table.num_requests()) + " sequences (the page table's requests), got " +
                          str(qo.num_sequences()));
  const int64_t M = qo.total();
  const int32_t page_size = table.page_size();
  std::vector<int32_t> indptr{0}, indices, last_block_len;
  indptr.reserve(M + 1);
  last_block_len.reserve(M);
  int64_t nnz = 0;
  for (int64_t req = 0; req < table.num_requests(); ++req) {
    const auto pages = table.indices().subspan(table.indptr()[req], table.num_pages(req));
    for (int32_t row = 0; row < qo.length(req); ++row) {
      nnz += static_cast<int64_t>(pages.size());
      if (nnz > std::numeric_limits<int32_t>::max())
        throw InvalidArgument("qo: expected the BSR expansion (query rows x pages) to stay below 2^31 blocks, got more at request " +
                              str(req));
      indices.insert(indices.end(), pages.begin(), pages.end());
      indptr.push_back(static_cast<int32_t>(nnz));
      last_block_len.push_back(table.last_page_len()[req]);
    }
  }
  return BSRMatrix(M, table.num_pages_total() * page_size, 1, page_size, std::move(indptr), std::move(indices),
                   std::move(last_block_len));
}

}  // namespace tessera
