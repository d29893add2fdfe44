// The CPU reference's variant options (ALiBi, FlashSigmoid, attention sink,
// fused RoPE in both layouts, a user logits function) against a naive loop
// written from the formulas: RoPE as complex rotation, masks as explicit
// conditions, softmax in natural exp. Ragged, paged (page size 1) and BSR.
#include <gtest/gtest.h>

#include <cmath>
#include <complex>
#include <limits>
#include <random>

#include "tessera/reference/attention.hpp"
#include "test_util.hpp"
#include "variant_cases.hpp"

namespace tessera {
namespace {

using reference::Options;
using reference::Result;
using test::HostTensor;
using test::make_host;

const double kNegInf = -std::numeric_limits<double>::infinity();

// RoPE of one row at `pos`: feature pairs as complex numbers times e^(i angle).
void naive_rope(std::vector<double>& x, int64_t D, double pos, const reference::RopeOptions& r) {
  const int64_t half = D / 2;
  for (int64_t j = 0; j < half; ++j) {
    const int64_t a = r.interleave ? 2 * j : j, b = r.interleave ? 2 * j + 1 : j + half;
    const double angle = pos / r.rope_scale / std::pow(r.rope_theta, 2.0 * j / D);
    const std::complex<double> z = std::complex<double>(x[a], x[b]) * std::polar(1.0, angle);
    x[a] = z.real();
    x[b] = z.imag();
  }
}

// One request and head: q [nq][D], k/v [nk][D] -> o [nq][D], lse [nq].
void naive_request(const std::vector<std::vector<double>>& q, const std::vector<std::vector<double>>& k,
                   const std::vector<std::vector<double>>& v, int64_t request, int64_t head, int64_t kv_head,
                   const Options& opt, std::vector<std::vector<double>>& o, std::vector<double>& lse) {
  const int64_t nq = static_cast<int64_t>(q.size()), nk = static_cast<int64_t>(k.size());
  const int64_t D = nq ? static_cast<int64_t>(q[0].size()) : 0;
  const double scale = 1.0 / std::sqrt(static_cast<double>(D));
  o.assign(nq, std::vector<double>(D, 0.0));
  lse.assign(nq, opt.flash_sigmoid ? 0.0 : kNegInf);
  for (int64_t i = 0; i < nq; ++i) {
    const int64_t q_pos = i + nk - nq;
    std::vector<double> qi = q[i];
    if (opt.rope) naive_rope(qi, D, static_cast<double>(q_pos), *opt.rope);
    std::vector<double> logits;
    std::vector<int64_t> js;
    for (int64_t j = 0; j < nk; ++j) {
      if (opt.causal && j > q_pos) continue;
      if (opt.window_left >= 0 && j < q_pos - opt.window_left && j >= opt.sink_size) continue;
      std::vector<double> kj = k[j];
      if (opt.rope) naive_rope(kj, D, static_cast<double>(j), *opt.rope);
      double dot = 0;
      for (int64_t d = 0; d < D; ++d) dot += qi[d] * kj[d];
      double logit = dot * scale;
      if (!opt.alibi_slopes.empty()) logit -= opt.alibi_slopes[head] * static_cast<double>(q_pos - j);
      if (opt.logits_fn) logit = opt.logits_fn(logit, {request, i, j, head, kv_head, nq, nk});
      logits.push_back(logit);
      js.push_back(j);
    }
    if (opt.flash_sigmoid) {
      for (size_t t = 0; t < js.size(); ++t) {
        const double w = 1.0 / (1.0 + std::exp(-(logits[t] * opt.sigmoid_scale + opt.sigmoid_bias)));
        for (int64_t d = 0; d < D; ++d) o[i][d] += w * v[js[t]][d];
      }
      continue;
    }
    if (js.empty()) continue;
    double sum = 0;
    for (double l : logits) sum += std::exp(l);
    for (size_t t = 0; t < js.size(); ++t)
      for (int64_t d = 0; d < D; ++d) o[i][d] += std::exp(logits[t]) / sum * v[js[t]][d];
    lse[i] = std::log(sum) / std::log(2.0);
  }
}

std::vector<std::vector<double>> rows_of(const HostTensor& t, int64_t first, int64_t n, int64_t head) {
  const int64_t D = t.view.size(2);
  std::vector<std::vector<double>> out(n, std::vector<double>(D));
  for (int64_t r = 0; r < n; ++r)
    for (int64_t d = 0; d < D; ++d) out[r][d] = test::load(t.view, {first + r, head, d});
  return out;
}

// Expected result for requests of (q rows, kv rows) ranges; kv_rows[i] lists
// request i's token rows of k / v in order.
Result naive_all(const HostTensor& q, const std::vector<int64_t>& q_first, const std::vector<int64_t>& q_len,
                 const HostTensor& k, const HostTensor& v, const std::vector<std::vector<int64_t>>& kv_rows,
                 const Options& opt) {
  const int64_t Hq = q.view.size(1), Hkv = k.view.size(1), D = q.view.size(2);
  Result r;
  r.rows = q.view.size(0), r.heads = Hq, r.head_dim = D;
  r.o.assign(r.rows * Hq * D, 0.0);
  r.lse.assign(r.rows * Hq, 0.0);
  for (size_t i = 0; i < q_len.size(); ++i)
    for (int64_t h = 0; h < Hq; ++h) {
      const int64_t hk = h / (Hq / Hkv);
      std::vector<std::vector<double>> kr, vr;
      for (int64_t row : kv_rows[i]) {
        kr.push_back(rows_of(k, row, 1, hk)[0]);
        vr.push_back(rows_of(v, row, 1, hk)[0]);
      }
      std::vector<std::vector<double>> o;
      std::vector<double> lse;
      naive_request(rows_of(q, q_first[i], q_len[i], h), kr, vr, static_cast<int64_t>(i), h, hk, opt, o, lse);
      for (int64_t a = 0; a < q_len[i]; ++a) {
        for (int64_t d = 0; d < D; ++d) r.o[((q_first[i] + a) * Hq + h) * D + d] = o[a][d];
        r.lse[(q_first[i] + a) * Hq + h] = lse[a];
      }
    }
  return r;
}

void expect_close(const Result& got, const Result& want, double tol) {
  ASSERT_EQ(got.o.size(), want.o.size());
  for (size_t i = 0; i < want.o.size(); ++i) ASSERT_NEAR(got.o[i], want.o[i], tol) << "o[" << i << "]";
  for (size_t i = 0; i < want.lse.size(); ++i) {
    if (want.lse[i] == kNegInf) ASSERT_EQ(got.lse[i], kNegInf) << "lse[" << i << "]";
    else ASSERT_NEAR(got.lse[i], want.lse[i], tol) << "lse[" << i << "]";
  }
}

struct VariantCase {
  std::string name;
  std::function<void(Options&, int64_t num_heads)> set;
  bool masks;  // uses causal / window options (not allowed with BSR)
};

std::vector<VariantCase> cases() {
  auto rope = [](bool interleave, double scale, double theta) {
    return reference::RopeOptions{interleave, scale, theta, -1};
  };
  return {
      {"alibi", [](Options& o, int64_t h) { o.alibi_slopes.assign(h, 0); for (int64_t i = 0; i < h; ++i) o.alibi_slopes[i] = std::exp2(-(i + 1.0)); }, false},
      {"alibi_causal", [](Options& o, int64_t h) { o.causal = true; o.alibi_slopes.assign(h, 0.3); }, true},
      {"sigmoid", [](Options& o, int64_t) { o.flash_sigmoid = true; o.sigmoid_scale = 0.7; o.sigmoid_bias = -1.5; }, false},
      {"sigmoid_causal", [](Options& o, int64_t) { o.flash_sigmoid = true; o.causal = true; o.sigmoid_bias = 0.25; }, true},
      {"sink", [](Options& o, int64_t) { o.causal = true; o.window_left = 3; o.sink_size = 2; }, true},
      {"sink_only", [](Options& o, int64_t) { o.causal = true; o.window_left = 0; o.sink_size = 1; }, true},
      {"rope_half", [=](Options& o, int64_t) { o.rope = rope(false, 1.0, 1e4); }, false},
      {"rope_interleaved_causal", [=](Options& o, int64_t) { o.rope = rope(true, 2.0, 500.0); o.causal = true; }, true},
      {"rope_sink_window", [=](Options& o, int64_t) { o.rope = rope(false, 1.0, 1e4); o.causal = true; o.window_left = 4; o.sink_size = 3; }, true},
      {"docs_example", [](Options& o, int64_t h) { o.logits_fn = test::docs_example_logits(std::vector<double>(h, 1.5), 0.2, 5); }, false},
  };
}

class VariantVsNaive : public ::testing::TestWithParam<int> {};

TEST_P(VariantVsNaive, RaggedPagedAndBsr) {
  const VariantCase vc = cases()[GetParam()];
  const int64_t Hq = 4, Hkv = 2, D = 64;
  std::mt19937_64 rng(500 + GetParam());
  const std::vector<int32_t> q_lens{0, 3, 6, 4, 1, 5}, kv_lens{4, 0, 3, 17, 9, 12};
  RaggedIndex qo = RaggedIndex::from_lengths(q_lens), kv = RaggedIndex::from_lengths(kv_lens);
  HostTensor q = make_host(DType::kFloat16, {qo.total(), Hq, D});
  HostTensor k = make_host(DType::kFloat16, {kv.total(), Hkv, D}), v = make_host(DType::kFloat16, {kv.total(), Hkv, D});
  test::fill_random(q, rng(), -2, 2);
  test::fill_random(k, rng(), -2, 2);
  test::fill_random(v, rng());
  Options opt;
  vc.set(opt, Hq);
  std::vector<int64_t> q_first, qn;
  std::vector<std::vector<int64_t>> kv_rows;
  for (int64_t i = 0; i < qo.num_sequences(); ++i) {
    q_first.push_back(qo.begin(i));
    qn.push_back(qo.length(i));
    kv_rows.emplace_back();
    for (int64_t j = 0; j < kv.length(i); ++j) kv_rows.back().push_back(kv.begin(i) + j);
  }
  const Result want = naive_all(q, q_first, qn, k, v, kv_rows, opt);
  expect_close(reference::attention_ragged(q.view, qo, k.view, v.view, kv, opt), want, 1e-12);

  // Paged, page size 1, pages in reverse order: the same logical KV.
  const int64_t total = kv.total();
  HostTensor kc = make_host(DType::kFloat16, {total, 1, Hkv, D}), vc_ = make_host(DType::kFloat16, {total, 1, Hkv, D});
  std::vector<int32_t> indptr{0}, indices, last;
  for (int64_t i = 0; i < kv.num_sequences(); ++i) {
    for (int64_t j = 0; j < kv.length(i); ++j) {
      const int64_t page = total - 1 - (kv.begin(i) + j);
      for (int64_t x = 0; x < Hkv * D; ++x) {
        kc.set(page * Hkv * D + x, k.get((kv.begin(i) + j) * Hkv * D + x));
        vc_.set(page * Hkv * D + x, v.get((kv.begin(i) + j) * Hkv * D + x));
      }
      indices.push_back(static_cast<int32_t>(page));
    }
    indptr.push_back(static_cast<int32_t>(indices.size()));
    last.push_back(kv.length(i) ? 1 : 0);
  }
  PagedKVCache cache(PagedKVStorage(kc.view, vc_.view, KVLayout::kNHD), PageTable(indptr, indices, last, 1, total));
  expect_close(reference::attention_paged(q.view, qo, cache, opt), want, 1e-12);

  if (vc.masks) {
    EXPECT_THROW(reference::attention_bsr(q.view, BSRMatrix(4, 8, 2, 4, {0, 1, 2}, {1, 0}), k.view, v.view, opt),
                 InvalidArgument);
    return;
  }
  // BSR: block rows of 2 queries; each block row is a request over the keys
  // of its column blocks (4 tokens each), in block order.
  HostTensor qb = make_host(DType::kFloat16, {6, Hq, D});
  HostTensor kb = make_host(DType::kFloat16, {12, Hkv, D}), vb = make_host(DType::kFloat16, {12, Hkv, D});
  test::fill_random(qb, rng(), -2, 2);
  test::fill_random(kb, rng(), -2, 2);
  test::fill_random(vb, rng());
  const BSRMatrix bsr(6, 12, 2, 4, {0, 2, 2, 3}, {2, 0, 1});
  const std::vector<std::vector<int64_t>> gathered{{8, 9, 10, 11, 0, 1, 2, 3}, {}, {4, 5, 6, 7}};
  expect_close(reference::attention_bsr(qb.view, bsr, kb.view, vb.view, opt),
               naive_all(qb, {0, 2, 4}, {2, 2, 2}, kb, vb, gathered, opt), 1e-12);
}

INSTANTIATE_TEST_SUITE_P(Variants, VariantVsNaive, ::testing::Range(0, static_cast<int>(cases().size())),
                         [](const auto& info) { return cases()[info.param].name; });

TEST(ReferenceVariants, RopeIsIdentityAtZeroAndRelative) {
  // RoPE keeps q.k a function of the position difference only.
  std::mt19937_64 rng(9);
  std::uniform_real_distribution<double> u(-1, 1);
  std::vector<double> q(64), k(64);
  for (auto& x : q) x = u(rng);
  for (auto& x : k) x = u(rng);
  for (bool interleave : {false, true}) {
    const reference::RopeOptions r{interleave, 1.0, 1e4, -1};
    std::vector<double> q0 = q;
    reference::rope_rotate(q0.data(), 64, 0.0, r);
    for (int d = 0; d < 64; ++d) EXPECT_DOUBLE_EQ(q0[d], q[d]);
    auto dot_at = [&](double pq, double pk) {
      std::vector<double> a = q, b = k;
      reference::rope_rotate(a.data(), 64, pq, r);
      reference::rope_rotate(b.data(), 64, pk, r);
      double s = 0;
      for (int d = 0; d < 64; ++d) s += a[d] * b[d];
      return s;
    };
    EXPECT_NEAR(dot_at(100, 37), dot_at(1063, 1000), 1e-10);
  }
  // rotary_dim: features past it are untouched.
  std::vector<double> x = q;
  reference::rope_rotate(x.data(), 64, 5.0, {false, 1.0, 1e4, 32});
  for (int d = 32; d < 64; ++d) EXPECT_EQ(x[d], q[d]);
  EXPECT_NE(x[0], q[0]);
}

TEST(ReferenceVariants, RejectsBadOptions) {
  HostTensor q = make_host(DType::kFloat32, {2, 4, 8}), k = make_host(DType::kFloat32, {3, 2, 8}), v = k;
  RaggedIndex qo({0, 2}), kv({0, 3});
  Options o;
  o.alibi_slopes = {1, 2, 3};
  EXPECT_THROW_MSG(reference::attention_ragged(q.view, qo, k.view, v.view, kv, o), InvalidArgument, "alibi_slopes");
  o = Options();
  o.sink_size = -1;
  EXPECT_THROW_MSG(reference::attention_ragged(q.view, qo, k.view, v.view, kv, o), InvalidArgument, "sink_size");
  o = Options();
  o.rope = reference::RopeOptions{false, 1.0, 1e4, 7};
  EXPECT_THROW_MSG(reference::attention_ragged(q.view, qo, k.view, v.view, kv, o), InvalidArgument, "rotary_dim");
  o.rope = reference::RopeOptions{false, 0.0, 1e4, -1};
  EXPECT_THROW_MSG(reference::attention_ragged(q.view, qo, k.view, v.view, kv, o), InvalidArgument, "rope_scale");
  o.rope = reference::RopeOptions{false, 1.0, -5, -1};
  EXPECT_THROW_MSG(reference::attention_ragged(q.view, qo, k.view, v.view, kv, o), InvalidArgument, "rope_theta");
  EXPECT_THROW_MSG(reference::apply_rope(q.view, {0}, {}), InvalidArgument, "pos");
}

}  // namespace
}  // namespace tessera
