// Block-sparse row (BSR) matrices: the one format every KV cache maps to.
// The attention matrix has M query rows and N KV columns, tiled into blocks of
// (Br, Bc). Block row r (query rows [r*Br, (r+1)*Br)) attends to the column
// blocks indices[indptr[r] .. indptr[r+1]), in that order; column block c
// covers KV rows [c*Bc, (c+1)*Bc). An optional last_block_len[r] (1..Bc) says
// how many columns of the last block of row r are valid, which is exactly what
// a page table with partially filled last pages needs.
#pragma once
#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "tessera/formats/paged_kv.hpp"
#include "tessera/formats/ragged.hpp"

namespace tessera {

class BSRMatrix {
 public:
  BSRMatrix() = default;
  // M, N: matrix size in rows/columns; must be multiples of Br/Bc.
  BSRMatrix(int64_t M, int64_t N, int32_t Br, int32_t Bc, std::vector<int32_t> indptr,
            std::vector<int32_t> indices, std::vector<int32_t> last_block_len = {});

  int64_t rows() const { return M_; }
  int64_t cols() const { return N_; }
  int32_t block_rows() const { return Br_; }
  int32_t block_cols() const { return Bc_; }
  int64_t num_block_rows() const { return M_ / Br_; }
  int64_t num_block_cols() const { return N_ / Bc_; }
  int64_t nnz_blocks() const { return static_cast<int64_t>(indices_.size()); }
  // Number of valid KV columns that block row r sees.
  int64_t row_kv_len(int64_t r) const;
  std::span<const int32_t> indptr() const { return indptr_; }
  std::span<const int32_t> indices() const { return indices_; }
  std::span<const int32_t> last_block_len() const { return last_block_len_; }
  bool has_last_block_len() const { return !last_block_len_.empty(); }

 private:
  int64_t M_ = 0, N_ = 0;
  int32_t Br_ = 1, Bc_ = 1;
  std::vector<int32_t> indptr_{0}, indices_, last_block_len_;
};

// A page table as a BSR matrix. Query rows come from the ragged qo index
// (one block row per query row: Br = 1, so rows of different requests never
// share a block); Bc = page_size; column block p is storage page p
// (N = num_pages * page_size); last_block_len carries last_page_len.
BSRMatrix page_table_to_bsr(const PageTable& table, const RaggedIndex& qo);

}  // namespace tessera
