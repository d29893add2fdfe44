// The CPU reference attention is the oracle for every GPU test, so it is
// itself checked against (a) closed-form tiny cases and (b) dense_attention,
// a naive per-head formula, on logical KV that the tests lay out themselves
// (ragged, paged with shuffled pages, BSR). Storage padding is filled with
// random garbage so that reading a wrong slot shows up as a mismatch.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <optional>
#include <random>
#include <string>

#include "tessera/reference/attention.hpp"
#include "reference_test_util.hpp"
#include "test_util.hpp"

namespace tessera {
namespace {

using reference::Options;
using reference::Result;
using test::HostTensor;
using test::make_host;
using test::LogicalKV;
using test::expect_same;
using test::expected_per_head;

using test::kNegInf;


// Per-request [q_len, kv_len] visibility (empty = all visible), and the
// concatenated custom mask for Options when `custom` is set.
struct Masks {
  std::vector<std::vector<uint8_t>> per_request;
  std::vector<uint8_t> custom_concat;
};

Masks make_masks(const std::vector<int32_t>& q_lens, const std::vector<int32_t>& kv_lens, bool causal, bool custom,
                 std::mt19937_64& rng) {
  Masks m;
  for (size_t i = 0; i < q_lens.size(); ++i) {
    const int64_t nq = q_lens[i], nk = kv_lens[i];
    std::vector<uint8_t> vis(nq * nk, 1);
    for (int64_t r = 0; r < nq; ++r)
      for (int64_t c = 0; c < nk; ++c) {
        uint8_t bit = 1;
        if (custom) {
          // Row r % 3 == 2 is fully masked, so masked rows are always exercised.
          bit = (r % 3 == 2) ? 0 : static_cast<uint8_t>(rng() % 3 != 0);
          m.custom_concat.push_back(bit);
        }
        if (causal && c > r + nk - nq) bit = 0;
        vis[r * nk + c] = bit;
      }
    if (causal || custom) m.per_request.push_back(std::move(vis));
    else m.per_request.emplace_back();
  }
  return m;
}


// Expected result: dense_attention per request and qo head.
Result expected_dense(const TensorView& q, const RaggedIndex& qo, const LogicalKV& kv, int64_t Hkv,
                      const Masks& masks, double sm_scale) {
  return expected_per_head(q, qo, kv, Hkv,
                           [&](int64_t i, const std::vector<double>& qh, const std::vector<double>& kh,
                               const std::vector<double>& vh, int64_t nq, int64_t nk, int64_t D, std::vector<double>& o,
                               std::vector<double>& lse) {
                             reference::dense_attention(qh, kh, vh, nq, nk, D, sm_scale, masks.per_request[i], o, lse);
                           });
}


std::vector<int32_t> random_lengths(std::mt19937_64& rng, int n, int max_len, bool allow_zero) {
  std::vector<int32_t> lens(n);
  for (auto& l : lens) l = static_cast<int32_t>(rng() % (max_len + 1));
  if (!allow_zero)
    for (auto& l : lens) l = std::max(l, 1);
  return lens;
}

// ---------------------------------------------------------------------------
// Closed-form cases

TEST(Reference, HandComputedTwoKeys) {
  // q = [1, 0]; keys [1, 0], [0, 1]; values [1, 2], [3, 4]; sm_scale = 1.
  // logits (1, 0) -> weights e/(e+1), 1/(e+1); natural lse = ln(1 + e).
  HostTensor q = make_host(DType::kFloat32, {1, 1, 2}), k = make_host(DType::kFloat32, {2, 1, 2}),
             v = make_host(DType::kFloat32, {2, 1, 2});
  const float qv[] = {1, 0}, kvals[] = {1, 0, 0, 1}, vvals[] = {1, 2, 3, 4};
  for (int i = 0; i < 2; ++i) q.set(i, qv[i]);
  for (int i = 0; i < 4; ++i) k.set(i, kvals[i]), v.set(i, vvals[i]);
  Options opt;
  opt.sm_scale = 1.0;
  Result r = reference::attention_ragged(q.view, RaggedIndex({0, 1}), k.view, v.view, RaggedIndex({0, 2}), opt);
  const double e = std::exp(1.0);
  EXPECT_NEAR(r.at(0, 0, 0), (e * 1 + 3) / (e + 1), 1e-14);
  EXPECT_NEAR(r.at(0, 0, 1), (e * 2 + 4) / (e + 1), 1e-14);
  EXPECT_NEAR(r.lse_at(0, 0), std::log2(1 + e), 1e-14);  // base 2, not ln(1 + e)

  // Default scale 1/sqrt(2), and a soft cap of 0.5 applied after the scale.
  opt.sm_scale = -1.0;
  opt.logits_soft_cap = 0.5;
  r = reference::attention_ragged(q.view, RaggedIndex({0, 1}), k.view, v.view, RaggedIndex({0, 2}), opt);
  const double l0 = 0.5 * std::tanh(1.0 / std::sqrt(2.0) / 0.5);  // logit of key 1 stays 0
  const double w0 = std::exp(l0) / (std::exp(l0) + 1);
  EXPECT_NEAR(r.at(0, 0, 0), w0 * 1 + (1 - w0) * 3, 1e-14);
  EXPECT_NEAR(r.at(0, 0, 1), w0 * 2 + (1 - w0) * 4, 1e-14);
  EXPECT_NEAR(r.lse_at(0, 0), std::log2(std::exp(l0) + 1), 1e-14);
}

TEST(Reference, EqualLogitsGiveMeanAndLog2N) {
  // A zero query makes every logit 0: O is the mean of V, lse = log2(n) exactly.
  HostTensor q = make_host(DType::kFloat16, {1, 2, 3});
  HostTensor k = make_host(DType::kFloat16, {4, 1, 3}), v = make_host(DType::kFloat16, {4, 1, 3});
  test::fill_random(k, 1);
  test::fill_random(v, 2);
  Result r = reference::attention_ragged(q.view, RaggedIndex({0, 1}), k.view, v.view, RaggedIndex({0, 4}));
  for (int h = 0; h < 2; ++h) {
    EXPECT_EQ(r.lse_at(0, h), 2.0);
    for (int d = 0; d < 3; ++d) {
      double mean = 0;
      for (int j = 0; j < 4; ++j) mean += v.get(j * 3 + d) / 4.0;
      EXPECT_NEAR(r.at(0, h, d), mean, 1e-14);
    }
  }
}

// ---------------------------------------------------------------------------
// Ragged vs dense

struct RaggedParam {
  DType dtype;
  int Hq, Hkv, D;
  bool causal, custom;
};

class RaggedVsDense : public ::testing::TestWithParam<RaggedParam> {};

TEST_P(RaggedVsDense, Matches) {
  const RaggedParam p = GetParam();
  std::mt19937_64 rng(1234 + p.Hq * 7 + p.D + p.causal * 3 + p.custom * 5);
  // Lengths include 0 queries and 0 keys; causal with q_len > kv_len yields
  // fully masked rows, q_len < kv_len the usual bottom-right alignment.
  std::vector<int32_t> q_lens = random_lengths(rng, 6, 7, true), kv_lens = random_lengths(rng, 6, 12, true);
  q_lens[0] = 0;
  kv_lens[1] = 0;
  q_lens[2] = 5, kv_lens[2] = 2;
  q_lens[3] = 3, kv_lens[3] = 11;
  RaggedIndex qo = RaggedIndex::from_lengths(q_lens), kv = RaggedIndex::from_lengths(kv_lens);
  HostTensor q = make_host(p.dtype, {qo.total(), p.Hq, p.D});
  HostTensor k = make_host(p.dtype, {kv.total(), p.Hkv, p.D}), v = make_host(p.dtype, {kv.total(), p.Hkv, p.D});
  test::fill_random(q, rng(), -2, 2);
  test::fill_random(k, rng(), -2, 2);
  test::fill_random(v, rng());

  Masks masks = make_masks(q_lens, kv_lens, p.causal, p.custom, rng);
  Options opt;
  opt.causal = p.causal;
  opt.custom_mask = masks.custom_concat;
  LogicalKV logical;
  const std::vector<double> kd = test::to_doubles(k.view), vd = test::to_doubles(v.view);
  const int64_t row = p.Hkv * p.D;
  for (int64_t i = 0; i < kv.num_sequences(); ++i) {
    logical.k.emplace_back(kd.begin() + kv.begin(i) * row, kd.begin() + (kv.begin(i) + kv.length(i)) * row);
    logical.v.emplace_back(vd.begin() + kv.begin(i) * row, vd.begin() + (kv.begin(i) + kv.length(i)) * row);
  }
  Result got = reference::attention_ragged(q.view, qo, k.view, v.view, kv, opt);
  expect_same(got, expected_dense(q.view, qo, logical, p.Hkv, masks, -1.0));

  // Rows that see nothing (zero kv, causal overhang, masked row) are O=0, LSE=-inf.
  int empty_rows = 0;
  for (int64_t i = 0; i < qo.num_sequences(); ++i)
    for (int64_t a = 0; a < qo.length(i); ++a) {
      const auto& vis = masks.per_request[i];
      bool any = false;
      for (int64_t c = 0; c < kv.length(i); ++c) any |= vis.empty() || vis[a * kv.length(i) + c];
      if (any) continue;
      ++empty_rows;
      for (int64_t h = 0; h < p.Hq; ++h) {
        EXPECT_EQ(got.lse_at(qo.begin(i) + a, h), kNegInf);
        for (int64_t d = 0; d < p.D; ++d) EXPECT_EQ(got.at(qo.begin(i) + a, h, d), 0.0);
      }
    }
  EXPECT_GT(empty_rows, 0);  // request 1 has no keys
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, RaggedVsDense,
    ::testing::Values(RaggedParam{DType::kFloat32, 4, 4, 16, false, false},   // MHA
                      RaggedParam{DType::kFloat16, 8, 2, 64, true, false},    // GQA, causal
                      RaggedParam{DType::kBFloat16, 4, 1, 32, false, true},   // MQA, custom mask
                      RaggedParam{DType::kFloat16, 6, 3, 8, true, true},      // causal AND custom
                      RaggedParam{DType::kFloat32, 2, 1, 1, true, false}),    // head_dim 1
    [](const auto& info) {
      const RaggedParam& p = info.param;
      return std::string(dtype_name(p.dtype)) + "_Hq" + std::to_string(p.Hq) + "_Hkv" + std::to_string(p.Hkv) +
             "_D" + std::to_string(p.D) + (p.causal ? "_causal" : "") + (p.custom ? "_mask" : "");
    });

// ---------------------------------------------------------------------------
// Paged vs dense

struct PagedParam {
  int page_size;
  KVLayout layout;
  bool interleaved;
  DType dtype;
  int Hq, Hkv;
};

class PagedVsDense : public ::testing::TestWithParam<PagedParam> {};

TEST_P(PagedVsDense, Matches) {
  const PagedParam p = GetParam();
  const int D = 64, ps = p.page_size;
  std::mt19937_64 rng(99 + ps * 13 + static_cast<int>(p.layout) * 5 + p.interleaved);
  std::vector<int32_t> q_lens = random_lengths(rng, 5, 4, false), kv_lens = random_lengths(rng, 5, 40, true);
  kv_lens[2] = 0;
  kv_lens[3] = ps;  // exactly full last page
  q_lens[4] = 0;
  // Pages: each request gets ceil(kv_len / ps) pages from a shuffled pool
  // with spare pages, so table order != storage order.
  std::vector<int32_t> indptr{0}, indices, last;
  int64_t needed = 0;
  for (int32_t len : kv_lens) needed += (len + ps - 1) / ps;
  const int64_t P = needed + 3;
  std::vector<int32_t> pool(P);
  std::iota(pool.begin(), pool.end(), 0);
  std::shuffle(pool.begin(), pool.end(), rng);
  for (int32_t len : kv_lens) {
    const int32_t pages = (len + ps - 1) / ps;
    for (int32_t j = 0; j < pages; ++j) indices.push_back(pool[indices.size()]);
    indptr.push_back(static_cast<int32_t>(indices.size()));
    last.push_back(pages == 0 ? (rng() % 2 ? ps : 0) : len - (pages - 1) * ps);
  }
  PageTable table(indptr, indices, last, ps, P);

  // Storage page = [ps, H, D] (NHD) or [H, ps, D] (HND); filled with random
  // values everywhere, including the unused tail of last pages.
  const std::vector<int64_t> page = p.layout == KVLayout::kNHD ? std::vector<int64_t>{ps, p.Hkv, D}
                                                               : std::vector<int64_t>{p.Hkv, ps, D};
  HostTensor kbuf, vbuf, kvbuf;
  std::optional<PagedKVStorage> storage;
  if (p.interleaved) {
    kvbuf = make_host(p.dtype, {P, 2, page[0], page[1], page[2]});
    test::fill_random(kvbuf, rng());
    storage.emplace(kvbuf.view, p.layout);
  } else {
    kbuf = make_host(p.dtype, {P, page[0], page[1], page[2]});
    vbuf = make_host(p.dtype, {P, page[0], page[1], page[2]});
    test::fill_random(kbuf, rng());
    test::fill_random(vbuf, rng());
    storage.emplace(kbuf.view, vbuf.view, p.layout);
  }
  PagedKVCache cache(*storage, table);

  // Gather logical KV by the layout's definition (independent of PagedKVStorage::offset).
  auto element = [&](bool is_v, int64_t pg, int64_t slot, int64_t h, int64_t d) -> double {
    const int64_t in_page = p.layout == KVLayout::kNHD ? (slot * p.Hkv + h) * D + d : (h * ps + slot) * D + d;
    const int64_t page_elems = int64_t{ps} * p.Hkv * D;
    if (p.interleaved) return kvbuf.get((pg * 2 + (is_v ? 1 : 0)) * page_elems + in_page);
    return (is_v ? vbuf : kbuf).get(pg * page_elems + in_page);
  };
  LogicalKV logical;
  for (size_t i = 0; i < kv_lens.size(); ++i) {
    std::vector<double> kk, vv;
    for (int64_t pos = 0; pos < kv_lens[i]; ++pos)
      for (int64_t h = 0; h < p.Hkv; ++h)
        for (int64_t d = 0; d < D; ++d) {
          const int64_t pg = indices[indptr[i] + pos / ps];
          kk.push_back(element(false, pg, pos % ps, h, d));
          vv.push_back(element(true, pg, pos % ps, h, d));
        }
    logical.k.push_back(std::move(kk));
    logical.v.push_back(std::move(vv));
  }

  RaggedIndex qo = RaggedIndex::from_lengths(q_lens);
  HostTensor q = make_host(DType::kFloat16, {qo.total(), p.Hq, D});
  test::fill_random(q, rng(), -2, 2);
  for (bool causal : {false, true}) {
    Masks masks = make_masks(q_lens, kv_lens, causal, false, rng);
    Options opt;
    opt.causal = causal;
    opt.sm_scale = 0.3;
    SCOPED_TRACE(causal ? "causal" : "full");
    expect_same(reference::attention_paged(q.view, qo, cache, opt),
                expected_dense(q.view, qo, logical, p.Hkv, masks, 0.3));
  }
}

INSTANTIATE_TEST_SUITE_P(
    Layouts, PagedVsDense,
    ::testing::Values(PagedParam{1, KVLayout::kNHD, false, DType::kFloat16, 4, 4},
                      PagedParam{1, KVLayout::kHND, true, DType::kBFloat16, 4, 2},
                      PagedParam{3, KVLayout::kNHD, true, DType::kFloat16, 8, 2},
                      PagedParam{3, KVLayout::kHND, false, DType::kBFloat16, 2, 1},
                      PagedParam{16, KVLayout::kNHD, false, DType::kBFloat16, 4, 1},
                      PagedParam{16, KVLayout::kHND, true, DType::kFloat16, 4, 2}),
    [](const auto& info) {
      const PagedParam& p = info.param;
      return "ps" + std::to_string(p.page_size) + "_" + kv_layout_name(p.layout) +
             (p.interleaved ? "_interleaved_" : "_separate_") + dtype_name(p.dtype) + "_Hq" + std::to_string(p.Hq) +
             "_Hkv" + std::to_string(p.Hkv);
    });

// ---------------------------------------------------------------------------
// BSR vs dense, and page table -> BSR

struct BsrParam {
  int Br, Bc;
  bool with_last_len;
};

class BsrVsDense : public ::testing::TestWithParam<BsrParam> {};

TEST_P(BsrVsDense, Matches) {
  const BsrParam p = GetParam();
  const int Hq = 4, Hkv = 2, D = 16, nbr = 5, nbc = 6;
  const int64_t M = int64_t{nbr} * p.Br, N = int64_t{nbc} * p.Bc;
  std::mt19937_64 rng(7 + p.Br * 31 + p.Bc);
  std::vector<int32_t> indptr{0}, indices, last;
  for (int r = 0; r < nbr; ++r) {
    std::vector<int32_t> cols(nbc);
    std::iota(cols.begin(), cols.end(), 0);
    std::shuffle(cols.begin(), cols.end(), rng);  // block order is arbitrary
    const int nnz = r == 1 ? 0 : static_cast<int>(1 + rng() % nbc);
    indices.insert(indices.end(), cols.begin(), cols.begin() + nnz);
    indptr.push_back(static_cast<int32_t>(indices.size()));
    last.push_back(nnz == 0 ? 0 : static_cast<int32_t>(1 + rng() % p.Bc));
  }
  if (!p.with_last_len) last.clear();
  BSRMatrix bsr(M, N, p.Br, p.Bc, indptr, indices, last);

  HostTensor q = make_host(DType::kBFloat16, {M, Hq, D});
  HostTensor k = make_host(DType::kFloat32, {N, Hkv, D}), v = make_host(DType::kFloat32, {N, Hkv, D});
  test::fill_random(q, rng(), -2, 2);
  test::fill_random(k, rng(), -2, 2);
  test::fill_random(v, rng());
  const std::vector<double> kd = test::to_doubles(k.view), vd = test::to_doubles(v.view);

  // Every query row is its own "request" for dense_attention.
  std::vector<int32_t> ones(M, 1);
  LogicalKV logical;
  for (int64_t m = 0; m < M; ++m) {
    const int64_t r = m / p.Br;
    std::vector<double> kk, vv;
    for (int32_t b = indptr[r]; b < indptr[r + 1]; ++b) {
      const bool is_last = b + 1 == indptr[r + 1];
      const int64_t width = (is_last && p.with_last_len) ? last[r] : p.Bc;
      for (int64_t c = 0; c < width; ++c) {
        const int64_t col = int64_t{indices[b]} * p.Bc + c;
        kk.insert(kk.end(), kd.begin() + col * Hkv * D, kd.begin() + (col + 1) * Hkv * D);
        vv.insert(vv.end(), vd.begin() + col * Hkv * D, vd.begin() + (col + 1) * Hkv * D);
      }
    }
    logical.k.push_back(std::move(kk));
    logical.v.push_back(std::move(vv));
  }
  Masks no_masks;
  no_masks.per_request.resize(M);
  RaggedIndex per_row = RaggedIndex::from_lengths(ones);
  expect_same(reference::attention_bsr(q.view, bsr, k.view, v.view),
              expected_dense(q.view, per_row, logical, Hkv, no_masks, -1.0));
}

INSTANTIATE_TEST_SUITE_P(Blocks, BsrVsDense,
                         ::testing::Values(BsrParam{1, 1, false}, BsrParam{1, 4, true}, BsrParam{4, 16, true},
                                           BsrParam{4, 4, false}, BsrParam{1, 16, true}, BsrParam{4, 1, true}),
                         [](const auto& info) {
                           const BsrParam& p = info.param;
                           return "Br" + std::to_string(p.Br) + "_Bc" + std::to_string(p.Bc) +
                                  (p.with_last_len ? "_lastlen" : "");
                         });

TEST(Reference, PagedEqualsBsrOfPageTable) {
  const int ps = 4, H = 2, D = 64, P = 9;
  std::mt19937_64 rng(5);
  HostTensor k = make_host(DType::kFloat16, {P, ps, H, D}), v = make_host(DType::kFloat16, {P, ps, H, D});
  test::fill_random(k, rng());
  test::fill_random(v, rng());
  // Requests: 3 pages (last 1), none, 2 pages (full), 1 page (last 3).
  PageTable table({0, 3, 3, 5, 6}, {7, 2, 5, 0, 8, 3}, {1, 0, 4, 3}, ps, P);
  PagedKVCache cache(PagedKVStorage(k.view, v.view, KVLayout::kNHD), table);
  RaggedIndex qo({0, 2, 3, 7, 8});
  HostTensor q = make_host(DType::kFloat32, {8, 4, D});
  test::fill_random(q, rng());
  BSRMatrix bsr = page_table_to_bsr(table, qo);
  // NHD pages are consecutive rows of a [P * ps, H, D] matrix.
  TensorView k_flat(k.view.data, DType::kFloat16, Device{}, {P * ps, H, D});
  TensorView v_flat(v.view.data, DType::kFloat16, Device{}, {P * ps, H, D});
  Options opt;
  opt.logits_soft_cap = 2.0;
  Result paged = reference::attention_paged(q.view, qo, cache, opt);
  expect_same(reference::attention_bsr(q.view, bsr, k_flat, v_flat, opt), paged, 0.0);
  EXPECT_EQ(paged.lse_at(2, 0), kNegInf);  // request 1 has no pages
  EXPECT_NE(paged.lse_at(0, 0), kNegInf);
}

TEST(Reference, PagedHonorsStorageStrides) {
  // The same pages stored contiguously and as a padded slice of a bigger
  // buffer (page stride 3000 instead of 2 * 4 * 2 * 64 = 1024) must give
  // identical attention: the reference has to use the real strides.
  const int P = 3, ps = 4, H = 2, D = 64;
  HostTensor kv = make_host(DType::kBFloat16, {P, 2, H, ps, D});
  HostTensor padded = test::make_host_strided(DType::kBFloat16, {P, 2, H, ps, D},
                                              {3000, ps * H * D, ps * D, D, 1});
  test::fill_random(kv, 8);
  test::fill_random(padded, 9);  // garbage in the padding
  for (int64_t pg = 0; pg < P; ++pg)
    for (int64_t t = 0; t < 2; ++t)
      for (int64_t h = 0; h < H; ++h)
        for (int64_t s = 0; s < ps; ++s)
          for (int64_t d = 0; d < D; ++d)
            test::store(padded.view, {pg, t, h, s, d}, test::load(kv.view, {pg, t, h, s, d}));
  PageTable table({0, 2, 3}, {2, 0, 1}, {3, 4}, ps, P);
  PagedKVCache dense_cache(PagedKVStorage(kv.view, KVLayout::kHND), table);
  PagedKVCache strided_cache(PagedKVStorage(padded.view, KVLayout::kHND), table);
  RaggedIndex qo({0, 3, 5});
  HostTensor q = make_host(DType::kFloat16, {5, 4, D});
  test::fill_random(q, 10);
  Options opt;
  opt.causal = true;
  expect_same(reference::attention_paged(q.view, qo, strided_cache, opt),
              reference::attention_paged(q.view, qo, dense_cache, opt), 0.0);
}

// ---------------------------------------------------------------------------
// Validation

TEST(Reference, RejectsBadInput) {
  HostTensor q = make_host(DType::kFloat16, {3, 4, 8});
  HostTensor k = make_host(DType::kFloat16, {5, 2, 8}), v = make_host(DType::kFloat16, {5, 2, 8});
  RaggedIndex qo({0, 1, 3}), kv({0, 2, 5});
  auto ragged = [&](const TensorView& qq, const TensorView& kk, const TensorView& vv, const RaggedIndex& qi,
                    const RaggedIndex& ki, const Options& o) { reference::attention_ragged(qq, qi, kk, vv, ki, o); };
  EXPECT_NO_THROW(ragged(q.view, k.view, v.view, qo, kv, {}));

  HostTensor q2d = make_host(DType::kFloat16, {3, 32});
  EXPECT_THROW_MSG(ragged(q2d.view, k.view, v.view, qo, kv, {}), InvalidArgument, "q: expected a 3-D");
  HostTensor qi32 = make_host(DType::kInt32, {3, 4, 8});
  EXPECT_THROW_MSG(ragged(qi32.view, k.view, v.view, qo, kv, {}), TypeMismatch, "q: expected dtype");
  TensorView q_gpu = q.view;
  q_gpu.device = Device{DeviceType::kCUDA, 0};
  EXPECT_THROW_MSG(ragged(q_gpu, k.view, v.view, qo, kv, {}), TypeMismatch, "q: expected device cpu");
  HostTensor v_bad = make_host(DType::kFloat16, {5, 1, 8}), v_narrow = make_host(DType::kFloat16, {5, 2, 4});
  EXPECT_THROW_MSG(ragged(q.view, k.view, v_bad.view, qo, kv, {}), InvalidArgument, "v: expected the rows and heads of k");
  EXPECT_NO_THROW(ragged(q.view, k.view, v_narrow.view, qo, kv, {}));  // a head_dim_vo of its own
  EXPECT_THROW_MSG(ragged(q.view, k.view, v.view, qo, RaggedIndex({0, 2, 4}), {}), InvalidArgument, "k: expected 4 rows");
  EXPECT_THROW_MSG(ragged(q.view, k.view, v.view, qo, RaggedIndex({0, 5}), {}), InvalidArgument, "kv: expected 2 sequences");
  EXPECT_THROW_MSG(ragged(q.view, k.view, v.view, RaggedIndex({0, 1, 2}), kv, {}), InvalidArgument, "q: expected 2 rows");
  HostTensor q_d16 = make_host(DType::kFloat16, {3, 4, 16});
  EXPECT_THROW_MSG(ragged(q_d16.view, k.view, v.view, qo, kv, {}), InvalidArgument, "head_dim");
  HostTensor q_h3 = make_host(DType::kFloat16, {3, 3, 8});
  EXPECT_THROW_MSG(ragged(q_h3.view, k.view, v.view, qo, kv, {}), InvalidArgument, "num_qo_heads");
  Options bad_mask;
  bad_mask.custom_mask.assign(7, 1);  // need 1*2 + 2*3 = 8
  EXPECT_THROW_MSG(ragged(q.view, k.view, v.view, qo, kv, bad_mask), InvalidArgument, "custom_mask: expected 8");
  Options bad_cap;
  bad_cap.logits_soft_cap = -1.0;
  EXPECT_THROW_MSG(ragged(q.view, k.view, v.view, qo, kv, bad_cap), InvalidArgument, "logits_soft_cap");
  bad_cap.logits_soft_cap = std::numeric_limits<double>::infinity();
  EXPECT_THROW_MSG(ragged(q.view, k.view, v.view, qo, kv, bad_cap), InvalidArgument, "logits_soft_cap");
  Options bad_window;
  bad_window.window_left = -2;
  EXPECT_THROW_MSG(ragged(q.view, k.view, v.view, qo, kv, bad_window), InvalidArgument, "window_left");

  // BSR: the matrix is the mask.
  BSRMatrix bsr(3, 5, 1, 1, {0, 1, 2, 3}, {0, 1, 2});
  Options causal;
  causal.causal = true;
  EXPECT_THROW_MSG(reference::attention_bsr(q.view, bsr, k.view, v.view, causal), InvalidArgument, "causal");
  Options masked;
  masked.custom_mask = {1};
  EXPECT_THROW_MSG(reference::attention_bsr(q.view, bsr, k.view, v.view, masked), InvalidArgument, "custom_mask");
  Options windowed;
  windowed.window_left = 4;
  EXPECT_THROW_MSG(reference::attention_bsr(q.view, bsr, k.view, v.view, windowed), InvalidArgument, "window_left");
  BSRMatrix wide(3, 6, 1, 1, {0, 1, 2, 3}, {0, 1, 2});
  EXPECT_THROW_MSG(reference::attention_bsr(q.view, wide, k.view, v.view), InvalidArgument, "k: expected 6 rows");
  BSRMatrix tall(4, 5, 1, 1, {0, 1, 2, 3, 3}, {0, 1, 2});
  EXPECT_THROW_MSG(reference::attention_bsr(q.view, tall, k.view, v.view), InvalidArgument, "q: expected 4 rows");

  // Paged.
  HostTensor kc = make_host(DType::kFloat16, {2, 4, 2, 64}), vc = make_host(DType::kFloat16, {2, 4, 2, 64});
  PagedKVCache cache(PagedKVStorage(kc.view, vc.view, KVLayout::kNHD), PageTable({0, 1, 2}, {1, 0}, {3, 4}, 4, 2));
  EXPECT_THROW_MSG(reference::attention_paged(q.view, qo, cache), InvalidArgument, "q: expected head_dim 64");
  HostTensor q64 = make_host(DType::kFloat16, {3, 4, 64});
  EXPECT_NO_THROW(reference::attention_paged(q64.view, qo, cache));
  EXPECT_THROW_MSG(reference::attention_paged(q64.view, RaggedIndex({0, 3}), cache), InvalidArgument,
                   "cache: expected 1 requests");
  TensorView kc_gpu = kc.view, vc_gpu = vc.view;
  kc_gpu.device = vc_gpu.device = Device{DeviceType::kCUDA, 0};
  PagedKVCache gpu_cache(PagedKVStorage(kc_gpu, vc_gpu, KVLayout::kNHD), PageTable({0, 1, 2}, {1, 0}, {3, 4}, 4, 2));
  EXPECT_THROW_MSG(reference::attention_paged(q64.view, qo, gpu_cache), TypeMismatch, "cache: expected device cpu");

  std::vector<double> o, lse;
  EXPECT_THROW_MSG(reference::dense_attention({1, 2}, {1, 2}, {1, 2}, 1, 1, 3, 1.0, {}, o, lse), InvalidArgument, "q");
  EXPECT_THROW_MSG(reference::dense_attention({1, 2}, {1, 2}, {1, 2}, 1, 1, 2, 1.0, {1, 1}, o, lse), InvalidArgument,
                   "mask");
}

}  // namespace
}  // namespace tessera
