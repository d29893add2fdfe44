// A paged-KV append problem shared by the CPU and GPU append tests: a cache of
// shuffled pages (NHD or HND, separate or interleaved K/V), requests that
// already hold some tokens and receive more, appended rows in shuffled order
// (optionally with padded strides), and the expected cache computed by
// logical indexing (page, slot, head, feature), independently of the strides
// model the library uses. A 16-bit append into an fp8 cache expects each
// value divided by its scale and rounded by float_to_fp8.
#pragma once
#include <algorithm>
#include <numeric>
#include <optional>
#include <random>
#include <vector>

#include "tessera/api/append_kv.hpp"
#include "tessera/formats/paged_kv.hpp"
#include "test_util.hpp"

namespace tessera::test {

struct AppendCase {
  DType dt = DType::kFloat16;
  KVLayout layout = KVLayout::kNHD;
  bool interleaved = false;
  int page_size = 16;
  int64_t heads = 2, head_dim = 64;
  int64_t v_head_dim = 0;                   // V's width (0: head_dim; 128 with head_dim 192)
  std::vector<int32_t> old_lens, add_lens;  // tokens before the append, tokens appended
  int64_t spare_pages = 3;                  // pool pages no request uses
  bool padded_rows = false;                 // append rows with a padded token stride
  std::optional<DType> cache_dt;            // the cache's dtype when not dt (an fp8 cache of 16-bit rows)
  float k_scale = 1.f, v_scale = 1.f;       // what a quantizing append divides by
  float row_lo = -1.f, row_hi = 1.f;        // range of the appended values
  DType cache() const { return cache_dt.value_or(dt); }
  int64_t vdim() const { return v_head_dim ? v_head_dim : head_dim; }
};

struct AppendProblem {
  HostTensor k, v, kv;  // k, v when separate; kv when interleaved
  HostTensor key, value;
  std::vector<int32_t> batch_indices, positions, indptr{0}, indices, last;
  int64_t num_pages = 0;

  PagedKVStorage storage(const AppendCase& c) const {
    return c.interleaved ? PagedKVStorage(kv.view, c.layout) : PagedKVStorage(k.view, v.view, c.layout);
  }
  // Host views of the index arrays (they must outlive the call using them).
  static TensorView ints(const std::vector<int32_t>& x) {
    return TensorView(const_cast<int32_t*>(x.data()), DType::kInt32, Device{}, {static_cast<int64_t>(x.size())});
  }
};

inline std::vector<int64_t> page_shape(const AppendCase& c, int64_t pages, int64_t dim) {
  return c.layout == KVLayout::kNHD ? std::vector<int64_t>{pages, c.page_size, c.heads, dim}
                                    : std::vector<int64_t>{pages, c.heads, c.page_size, dim};
}

// K rows of 192 features and V rows of 128 (DeepSeek-style prefill caches),
// 4 heads; with fp8_cache, rows of `dt` quantized into `fp8_cache` with
// scales 0.25 / 0.5, which `opt` then carries.
inline AppendCase unequal_dims_case(KVLayout layout, bool padded, std::vector<int32_t> old_lens,
                                    std::vector<int32_t> add_lens, std::optional<DType> fp8_cache, DType dt,
                                    AppendOptions& opt) {
  AppendCase c;
  c.head_dim = 192;
  c.v_head_dim = 128;
  c.heads = 4;
  c.layout = layout;
  c.padded_rows = padded;
  c.old_lens = std::move(old_lens);
  c.add_lens = std::move(add_lens);
  opt = AppendOptions{};
  if (fp8_cache) {
    c.dt = dt;
    c.cache_dt = *fp8_cache;
    c.k_scale = 0.25f, c.v_scale = 0.5f;
    opt.k_scale = c.k_scale, opt.v_scale = c.v_scale;
  }
  return c;
}

inline AppendProblem make_append_problem(const AppendCase& c, uint64_t seed) {
  std::mt19937_64 rng(seed);
  AppendProblem p;
  const int64_t batch = static_cast<int64_t>(c.old_lens.size());
  int64_t used = 0;
  std::vector<int32_t> lens(batch);
  for (int64_t b = 0; b < batch; ++b) {
    lens[b] = c.old_lens[b] + c.add_lens[b];
    used += (lens[b] + c.page_size - 1) / c.page_size;
  }
  p.num_pages = used + c.spare_pages;
  std::vector<int32_t> perm(p.num_pages);
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng);
  int64_t next = 0;
  for (int64_t b = 0; b < batch; ++b) {
    const int32_t pages = (lens[b] + c.page_size - 1) / c.page_size;
    for (int32_t i = 0; i < pages; ++i) p.indices.push_back(perm[next++]);
    p.indptr.push_back(static_cast<int32_t>(p.indices.size()));
    p.last.push_back(pages ? lens[b] - (pages - 1) * c.page_size : 0);
    for (int32_t pos = c.old_lens[b]; pos < lens[b]; ++pos) {
      p.batch_indices.push_back(static_cast<int32_t>(b));
      p.positions.push_back(pos);
    }
  }
  // Appended rows in shuffled order: the kernel must not assume grouping.
  std::vector<size_t> order(p.positions.size());
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), rng);
  std::vector<int32_t> bi(order.size()), po(order.size());
  for (size_t i = 0; i < order.size(); ++i) {
    bi[i] = p.batch_indices[order[i]];
    po[i] = p.positions[order[i]];
  }
  p.batch_indices = bi;
  p.positions = po;

  const int64_t nnz = static_cast<int64_t>(p.positions.size()), H = c.heads, D = c.head_dim, DV = c.vdim();
  if (c.padded_rows) {  // [nnz, H, D] inside a [nnz, H + 1, D + 8] buffer
    p.key = make_host_strided(c.dt, {nnz, H, D}, {(H + 1) * (D + 8), D + 8, 1});
    p.value = make_host_strided(c.dt, {nnz, H, DV}, {(H + 1) * (DV + 8), DV + 8, 1});
  } else {
    p.key = make_host(c.dt, {nnz, H, D});
    p.value = make_host(c.dt, {nnz, H, DV});
  }
  fill_random(p.key, rng(), c.row_lo, c.row_hi);
  fill_random(p.value, rng(), c.row_lo, c.row_hi);
  if (c.interleaved) {
    std::vector<int64_t> s = page_shape(c, p.num_pages, D);
    s.insert(s.begin() + 1, 2);
    p.kv = make_host(c.cache(), s);
    fill_random(p.kv, rng(), 5.f, 6.f);  // old contents, distinguishable from appended values
  } else {
    p.k = make_host(c.cache(), page_shape(c, p.num_pages, D));
    p.v = make_host(c.cache(), page_shape(c, p.num_pages, DV));
    fill_random(p.k, rng(), 5.f, 6.f);
    fill_random(p.v, rng(), 5.f, 6.f);
  }
  return p;
}

// The cache after the append, written element by element through logical
// indices; only the tokens for which `keep(i)` holds are written.
template <typename Keep>
AppendProblem expected_after_append(const AppendCase& c, const AppendProblem& p, Keep keep) {
  AppendProblem e = p;
  for (size_t i = 0; i < e.positions.size(); ++i) {
    if (!keep(i)) continue;
    const int32_t b = e.batch_indices[i], pos = e.positions[i];
    const int64_t page = e.indices[e.indptr[b] + pos / c.page_size], slot = pos % c.page_size;
    const int64_t n = static_cast<int64_t>(i);
    for (int64_t h = 0; h < c.heads; ++h) {
      const int64_t a = c.layout == KVLayout::kNHD ? slot : h, bb = c.layout == KVLayout::kNHD ? h : slot;
      // Divided in float, as the kernel does; a copy's scale is 1 (exact).
      for (int64_t d = 0; d < c.head_dim; ++d) {
        const float kx = load(e.key.view, {n, h, d}) / c.k_scale;
        if (c.interleaved) store(e.kv.view, {page, 0, a, bb, d}, kx);
        else store(e.k.view, {page, a, bb, d}, kx);
      }
      for (int64_t d = 0; d < c.vdim(); ++d) {
        const float vx = load(e.value.view, {n, h, d}) / c.v_scale;
        if (c.interleaved) store(e.kv.view, {page, 1, a, bb, d}, vx);
        else store(e.v.view, {page, a, bb, d}, vx);
      }
    }
  }
  return e;
}

inline AppendProblem expected_after_append(const AppendCase& c, const AppendProblem& p) {
  return expected_after_append(c, p, [](size_t) { return true; });
}

// The whole storage (padding included) compared bit for bit.
inline void expect_same_cache(const AppendCase& c, const AppendProblem& got, const AppendProblem& want) {
  if (c.interleaved) {
    EXPECT_TRUE(got.kv.storage == want.kv.storage);
  } else {
    EXPECT_TRUE(got.k.storage == want.k.storage);
    EXPECT_TRUE(got.v.storage == want.v.storage);
  }
}

}  // namespace tessera::test
