// Paged KV cache (vLLM/FlashInfer page tables). Each request owns a list of
// pages; every page holds `page_size` tokens of all KV heads. The last page of
// request i holds last_page_len[i] valid tokens, so
//   kv_len(i) = (num_pages(i) - 1) * page_size + last_page_len(i)   (0 if no pages).
// Storage layouts follow FlashInfer:
//   NHD: a page is [page_size, num_kv_heads, head_dim]
//   HND: a page is [num_kv_heads, page_size, head_dim]
// K and V are either two tensors [num_pages, <page>] or one interleaved tensor
// [num_pages, 2, <page>] (K at index 0, V at index 1). Two tensors may differ
// in head_dim (DeepSeek-style 192 / 128: head_dim is K's, v_head_dim V's);
// V then has strides of its own.
#pragma once
#include <cstdint>
#include <span>
#include <vector>

#include "tessera/core/tensor.hpp"
#include "tessera/abi/kv_view.cuh"

namespace tessera {

enum class KVLayout : uint8_t { kNHD, kHND };
const char* kv_layout_name(KVLayout l);
KVLayout parse_kv_layout(const char* s);  // "NHD" / "HND", else InvalidArgument

// The page table alone (host arrays), validated on construction.
class PageTable {
 public:
  PageTable() = default;
  // num_pages: the number of pages the cache holds (indices must be below it).
  PageTable(std::vector<int32_t> indptr, std::vector<int32_t> indices,
            std::vector<int32_t> last_page_len, int32_t page_size, int64_t num_pages);

  int32_t page_size() const { return page_size_; }
  int64_t num_requests() const { return static_cast<int64_t>(indptr_.size()) - 1; }
  int64_t num_pages_total() const { return num_pages_; }
  int32_t num_pages(int64_t req) const { return indptr_[req + 1] - indptr_[req]; }
  int64_t kv_len(int64_t req) const;
  // Storage page and slot of token `pos` of request `req`.
  int32_t page_of(int64_t req, int64_t pos) const { return indices_[indptr_[req] + pos / page_size_]; }
  int32_t slot_of(int64_t pos) const { return static_cast<int32_t>(pos % page_size_); }

  std::span<const int32_t> indptr() const { return indptr_; }
  std::span<const int32_t> indices() const { return indices_; }
  std::span<const int32_t> last_page_len() const { return last_page_len_; }

 private:
  std::vector<int32_t> indptr_{0}, indices_, last_page_len_;
  int32_t page_size_ = 1;
  int64_t num_pages_ = 0;
};

// Checks a page table the caller keeps (nothing is copied): indptr
// non-decreasing from 0, one index per page, indices >= 0, last_page_len in
// range; writes each request's KV length to kv_lens and returns the largest
// page index (-1 for none). plan() calls this once per generation step, so it
// is one branch-free pass over the indices; errors name the offending entry
// as PageTable's constructor does (which calls it).
int32_t check_page_table(std::span<const int32_t> indptr, std::span<const int32_t> indices,
                         std::span<const int32_t> last_page_len, int32_t page_size, std::vector<int32_t>& kv_lens);
// The same checks without the ids themselves, for page ids that stay on the
// GPU (see api/page_ids.hpp): num_indices entries are given (at least
// indptr.back(); a longer device buffer is fine).
void check_page_lengths(std::span<const int32_t> indptr, int64_t num_indices, std::span<const int32_t> last_page_len,
                        int32_t page_size, std::vector<int32_t>& kv_lens);

// The KV storage tensors plus their layout; validated on construction.
class PagedKVStorage {
 public:
  PagedKVStorage() = default;
  // Separate K and V: each [num_pages, page_size, H, D] (NHD) or [num_pages, H, page_size, D] (HND).
  PagedKVStorage(TensorView k, TensorView v, KVLayout layout);
  // Interleaved: [num_pages, 2, page_size, H, D] (NHD) or [num_pages, 2, H, page_size, D] (HND).
  PagedKVStorage(TensorView kv, KVLayout layout);

  KVLayout layout() const { return layout_; }
  int64_t num_pages() const { return num_pages_; }
  int32_t page_size() const { return page_size_; }
  int32_t num_kv_heads() const { return num_kv_heads_; }
  int32_t head_dim() const { return head_dim_; }      // K's (and q's)
  int32_t v_head_dim() const { return v_head_dim_; }  // V's (and the output's); head_dim() but for 192 / 128
  DType dtype() const { return k_.dtype; }
  Device device() const { return k_.device; }
  const TensorView& k() const { return k_; }
  const TensorView& v() const { return v_; }

  // Element offsets (from k().data / v().data) of (page, head, slot, 0).
  int64_t page_stride() const { return page_stride_; }
  int64_t head_stride() const { return head_stride_; }
  int64_t token_stride() const { return token_stride_; }
  int64_t offset(int64_t page, int64_t head, int64_t slot) const {
    return page * page_stride_ + head * head_stride_ + slot * token_stride_;
  }
  // V's strides: K's, except where V's head_dim differs (its own tensor).
  int64_t v_page_stride() const { return v_page_stride_; }
  int64_t v_head_stride() const { return v_head_stride_; }
  int64_t v_token_stride() const { return v_token_stride_; }
  int64_t v_offset(int64_t page, int64_t head, int64_t slot) const {
    return page * v_page_stride_ + head * v_head_stride_ + slot * v_token_stride_;
  }

 private:
  void init(KVLayout layout, const TensorView& shape_src, int64_t page_dim_offset);
  TensorView k_, v_;
  KVLayout layout_ = KVLayout::kNHD;
  int64_t num_pages_ = 0, page_stride_ = 0, head_stride_ = 0, token_stride_ = 0;
  int64_t v_page_stride_ = 0, v_head_stride_ = 0, v_token_stride_ = 0;
  int32_t page_size_ = 0, num_kv_heads_ = 0, head_dim_ = 0, v_head_dim_ = 0;
};

// A complete paged KV cache: storage + table, checked against each other.
struct PagedKVCache {
  PagedKVStorage storage;
  PageTable table;
  PagedKVCache(PagedKVStorage s, PageTable t);
  // Device view for kernels; the table arrays must already be on the device
  // (pointers given by the caller; they mirror `table`).
  device::PagedKV device_view(const int32_t* d_indptr, const int32_t* d_indices,
                              const int32_t* d_last_page_len) const;
};

}  // namespace tessera
