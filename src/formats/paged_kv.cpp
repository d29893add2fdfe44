// Paged KV cache: page table and storage validation, and the device view.
// Storage strides are taken from the tensors themselves (not recomputed from
// the shape), so a cache whose pages are a strided slice of a larger buffer
// is addressed correctly.
#include "tessera/formats/paged_kv.hpp"

#include <algorithm>
#include <cstring>
#include <string>
#include <utility>

#include "tessera/formats/ragged.hpp"

namespace tessera {

namespace {

std::string str(int64_t x) { return std::to_string(x); }

// Smallest (at most 0) and largest (at least -1) page id. A branch-free
// select loop the compiler vectorizes; x86-64's baseline (SSE2) has no 32-bit
// integer min/max, so SSE4.1 and AVX2 clones are picked at load time (16k ids:
// 4.9 us baseline, 1.5 us SSE4.1, 1.2 us AVX2 on the CI machine).
#if defined(__GNUC__) && defined(__x86_64__) && !defined(__clang__)
__attribute__((target_clones("avx2", "sse4.1", "default")))
#endif
std::pair<int32_t, int32_t> index_range(std::span<const int32_t> ids) {
  int32_t lo = 0, hi = -1;
  for (const int32_t x : ids) {
    lo = x < lo ? x : lo;
    hi = x > hi ? x : hi;
  }
  return {lo, hi};
}

}  // namespace

const char* kv_layout_name(KVLayout l) { return l == KVLayout::kNHD ? "NHD" : "HND"; }

KVLayout parse_kv_layout(const char* s) {
  if (s != nullptr && std::strcmp(s, "NHD") == 0) return KVLayout::kNHD;
  if (s != nullptr && std::strcmp(s, "HND") == 0) return KVLayout::kHND;
  throw InvalidArgument(std::string("kv_layout: expected \"NHD\" or \"HND\", got \"") + (s ? s : "(null)") + "\"");
}

// ---------------------------------------------------------------------------
// Page table checks

namespace {

// last_page_len against the page counts; each request's KV length into kv_lens.
void page_lengths(std::span<const int32_t> indptr, std::span<const int32_t> last_page_len, int32_t page_size,
                  std::vector<int32_t>& kv_lens) {
  const int64_t requests = static_cast<int64_t>(indptr.size()) - 1;
  if (static_cast<int64_t>(last_page_len.size()) != requests)
    throw InvalidArgument("last_page_len: expected " + str(requests) + " entries (one per request), got " +
                          str(static_cast<int64_t>(last_page_len.size())));
  kv_lens.resize(requests);
  for (int64_t r = 0; r < requests; ++r) {
    const int32_t len = last_page_len[r], pages = indptr[r + 1] - indptr[r];
    // A request with pages needs a non-empty last page; for one without pages
    // the value is ignored, but callers pass either 0 or page_size for it.
    const int32_t min_len = pages > 0 ? 1 : 0;
    if (len < min_len || len > page_size)
      throw InvalidArgument("last_page_len: expected values in [" + str(min_len) + ", " + str(page_size) +
                            "] (page_size), got last_page_len[" + str(r) + "]=" + str(len) + " for a request with " +
                            str(pages) + " pages");
    const int64_t kv = pages == 0 ? 0 : static_cast<int64_t>(pages - 1) * page_size + len;
    if (kv > INT32_MAX)
      throw InvalidArgument("indptr: request " + str(r) + " holds " + str(kv) + " tokens, more than 2^31 - 1");
    kv_lens[r] = static_cast<int32_t>(kv);
  }
}

}  // namespace

int32_t check_page_table(std::span<const int32_t> indptr, std::span<const int32_t> indices,
                         std::span<const int32_t> last_page_len, int32_t page_size, std::vector<int32_t>& kv_lens) {
  if (page_size < 1) throw InvalidArgument("page_size: expected >= 1, got " + str(page_size));
  validate_indptr("indptr", indptr);
  if (static_cast<int64_t>(indices.size()) != indptr.back())
    throw InvalidArgument("indices: expected " + str(indptr.back()) + " entries (indptr.back()), got " +
                          str(static_cast<int64_t>(indices.size())));
  const auto [lo, hi] = index_range(indices);
  if (lo < 0) {
    const size_t i = static_cast<size_t>(std::find_if(indices.begin(), indices.end(), [](int32_t x) { return x < 0; }) -
                                         indices.begin());
    throw InvalidArgument("indices: expected values >= 0 (page ids), got indices[" + str(static_cast<int64_t>(i)) +
                          "]=" + str(indices[i]));
  }
  page_lengths(indptr, last_page_len, page_size, kv_lens);
  return hi;
}

void check_page_lengths(std::span<const int32_t> indptr, int64_t num_indices, std::span<const int32_t> last_page_len,
                        int32_t page_size, std::vector<int32_t>& kv_lens) {
  if (page_size < 1) throw InvalidArgument("page_size: expected >= 1, got " + str(page_size));
  validate_indptr("indptr", indptr);
  if (num_indices < indptr.back())
    throw InvalidArgument("indices: expected at least " + str(indptr.back()) + " entries (indptr.back()), got " +
                          str(num_indices));
  page_lengths(indptr, last_page_len, page_size, kv_lens);
}

// ---------------------------------------------------------------------------
// PageTable

PageTable::PageTable(std::vector<int32_t> indptr, std::vector<int32_t> indices,
                     std::vector<int32_t> last_page_len, int32_t page_size, int64_t num_pages)
    : indptr_(std::move(indptr)),
      indices_(std::move(indices)),
      last_page_len_(std::move(last_page_len)),
      page_size_(page_size),
      num_pages_(num_pages) {
  if (num_pages_ < 0) throw InvalidArgument("num_pages: expected >= 0, got " + str(num_pages_));
  std::vector<int32_t> lens;
  const int32_t max_index = check_page_table(indptr_, indices_, last_page_len_, page_size_, lens);
  if (max_index >= num_pages_) {
    const size_t i = static_cast<size_t>(
        std::find_if(indices_.begin(), indices_.end(), [&](int32_t x) { return x >= num_pages_; }) - indices_.begin());
    throw InvalidArgument("indices: expected values in [0, " + str(num_pages_) + ") (num_pages), got indices[" +
                          str(static_cast<int64_t>(i)) + "]=" + str(indices_[i]));
  }
}

int64_t PageTable::kv_len(int64_t req) const {
  if (req < 0 || req >= num_requests())
    throw InvalidArgument("req: expected a request index in [0, " + str(num_requests()) + "), got " + str(req));
  const int32_t pages = num_pages(req);
  return pages == 0 ? 0 : static_cast<int64_t>(pages - 1) * page_size_ + last_page_len_[req];
}

// ---------------------------------------------------------------------------
// PagedKVStorage

namespace {

void check_storage_tensor(const char* name, const TensorView& t, int64_t ndim) {
  check_dtype_in(name, t, {DType::kFloat16, DType::kBFloat16, DType::kFloat8E4M3, DType::kFloat8E5M2});
  check_dim(name, t, ndim);
  check_last_dim_contiguous(name, t);
}

}  // namespace

PagedKVStorage::PagedKVStorage(TensorView k, TensorView v, KVLayout layout) {
  check_storage_tensor("k", k, 4);
  check_storage_tensor("v", v, 4);
  // V may be narrower than K (head_dim_qk 192, head_dim_vo 128); every other
  // dim is K's.
  const bool same_dim = v.size(3) == k.size(3);
  if (!same_dim && !(k.size(3) == 192 && v.size(3) == 128))
    throw InvalidArgument("v: expected the shape of k " + k.shape_str() + " (or head_dim 128 with k's 192), got " +
                          v.shape_str());
  for (int64_t i = 0; i < 3; ++i)
    if (v.size(i) != k.size(i))
      throw InvalidArgument("v: expected the shape of k " + k.shape_str() + " but for the last dim, got " + v.shape_str());
  if (v.dtype != k.dtype)
    throw TypeMismatch(std::string("v: expected the dtype of k (") + dtype_name(k.dtype) + "), got " +
                       dtype_name(v.dtype));
  check_same_device("k", k, "v", v);
  // Kernels address K and V of one head_dim with one set of strides
  // (device::PagedKV); a V of another head_dim has strides of its own.
  for (int64_t i = 0; same_dim && i < 4; ++i) {
    if (k.size(i) > 1 && v.stride(i) != k.stride(i))
      throw InvalidArgument("v: expected the strides of k, got stride " + str(v.stride(i)) + " vs " +
                            str(k.stride(i)) + " in dim " + str(i));
  }
  init(layout, k, 0);
  if (!same_dim) {
    const int64_t token_dim = layout == KVLayout::kNHD ? 1 : 2, head_dim_idx = layout == KVLayout::kNHD ? 2 : 1;
    v_head_dim_ = static_cast<int32_t>(v.size(3));
    v_page_stride_ = v.stride(0);
    v_token_stride_ = v.stride(token_dim);
    v_head_stride_ = v.stride(head_dim_idx);
  }
  k_ = std::move(k);
  v_ = std::move(v);
}

PagedKVStorage::PagedKVStorage(TensorView kv, KVLayout layout) {
  check_storage_tensor("kv", kv, 5);
  if (kv.size(1) != 2)
    throw InvalidArgument("kv: expected size 2 in dim 1 (K, V) of an interleaved cache, got shape " + kv.shape_str());
  init(layout, kv, 1);
  // K and V become ordinary 4-D views of the pages, V offset by one dim-1 step,
  // so users of k()/v() never need to know the cache was interleaved.
  std::vector<int64_t> shape{kv.size(0), kv.size(2), kv.size(3), kv.size(4)};
  std::vector<int64_t> strides{kv.stride(0), kv.stride(2), kv.stride(3), kv.stride(4)};
  char* base = static_cast<char*>(kv.data);
  const int64_t v_offset_bytes = kv.stride(1) * static_cast<int64_t>(dtype_size(kv.dtype));
  k_ = TensorView(base, kv.dtype, kv.device, shape, strides);
  v_ = TensorView(base == nullptr ? nullptr : base + v_offset_bytes, kv.dtype, kv.device, shape, strides);
}

void PagedKVStorage::init(KVLayout layout, const TensorView& shape_src, int64_t page_dim_offset) {
  // Dims after the page dim (and the K/V dim, if interleaved): NHD is
  // [page_size, H, D], HND is [H, page_size, D].
  const int64_t a = 1 + page_dim_offset, b = 2 + page_dim_offset, d = 3 + page_dim_offset;
  const int64_t token_dim = layout == KVLayout::kNHD ? a : b;
  const int64_t head_dim_idx = layout == KVLayout::kNHD ? b : a;
  const int64_t head_dim = shape_src.size(d);
  const char* name = page_dim_offset == 0 ? "k" : "kv";
  if (head_dim != 64 && head_dim != 128 && head_dim != 192 && head_dim != 256 && head_dim != 512)
    throw InvalidArgument(std::string(name) + ": expected head_dim (last dim) in {64, 128, 192, 256, 512}, got " +
                          str(head_dim) + " in shape " + shape_src.shape_str());
  if (head_dim == 192 && page_dim_offset != 0)  // 192 is head_dim_qk only: V is 128 wide, another tensor
    throw InvalidArgument("kv: expected head_dim (last dim) in {64, 128, 256, 512} for an interleaved cache (192 is "
                          "head_dim_qk, with a separate 128-wide V), got shape " + shape_src.shape_str());
  if (shape_src.size(token_dim) < 1)
    throw InvalidArgument(std::string(name) + ": expected page_size >= 1 (dim " + str(token_dim) + " for " +
                          kv_layout_name(layout) + "), got shape " + shape_src.shape_str());
  if (shape_src.size(head_dim_idx) < 1)
    throw InvalidArgument(std::string(name) + ": expected num_kv_heads >= 1 (dim " + str(head_dim_idx) + " for " +
                          kv_layout_name(layout) + "), got shape " + shape_src.shape_str());
  layout_ = layout;
  num_pages_ = shape_src.size(0);
  page_size_ = static_cast<int32_t>(shape_src.size(token_dim));
  num_kv_heads_ = static_cast<int32_t>(shape_src.size(head_dim_idx));
  head_dim_ = v_head_dim_ = static_cast<int32_t>(head_dim);
  page_stride_ = v_page_stride_ = shape_src.stride(0);
  token_stride_ = v_token_stride_ = shape_src.stride(token_dim);
  head_stride_ = v_head_stride_ = shape_src.stride(head_dim_idx);
}

// ---------------------------------------------------------------------------
// PagedKVCache

PagedKVCache::PagedKVCache(PagedKVStorage s, PageTable t) : storage(std::move(s)), table(std::move(t)) {
  if (table.page_size() != storage.page_size())
    throw InvalidArgument("table: expected page_size " + str(storage.page_size()) + " (the storage's), got " +
                          str(table.page_size()));
  // The table's indices are already checked against its own page count;
  // that count must not exceed what the storage holds.
  if (table.num_pages_total() > storage.num_pages())
    throw InvalidArgument("table: expected num_pages <= " + str(storage.num_pages()) +
                          " (pages in storage), got " + str(table.num_pages_total()));
}

device::PagedKV PagedKVCache::device_view(const int32_t* d_indptr, const int32_t* d_indices,
                                          const int32_t* d_last_page_len) const {
  device::PagedKV view{};
  view.k = storage.k().data;
  view.v = storage.v().data;
  view.indptr = d_indptr;
  view.indices = d_indices;
  view.last_page_len = d_last_page_len;
  view.page_stride = storage.page_stride();
  view.head_stride = storage.head_stride();
  view.token_stride = storage.token_stride();
  view.v_page_stride = storage.v_page_stride();
  view.v_head_stride = storage.v_head_stride();
  view.v_token_stride = storage.v_token_stride();
  view.page_size = storage.page_size();
  view.num_kv_heads = storage.num_kv_heads();
  return view;
}

}  // namespace tessera
