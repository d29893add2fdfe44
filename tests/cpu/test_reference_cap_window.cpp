// The CPU reference's logits soft-cap and sliding window, checked against a
// naive per-row loop (ragged and paged KV), and two closed-form properties:
// capped logits stay within the cap, and a zero-width window sees only the
// diagonal key. (The reference's other checks: test_reference.cpp and
// test_reference_variants.cpp.)
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <random>
#include <string>

#include "tessera/reference/attention.hpp"
#include "reference_test_util.hpp"
#include "test_util.hpp"

namespace tessera::test {
namespace {

using reference::Options;
using reference::Result;

// ---------------------------------------------------------------------------
// Soft cap and sliding window vs a naive per-row loop

// Naive attention of one request and qo head: logit = cap * tanh(q.k * scale
// / cap) (cap > 0), keys j visible when causal allows (j <= i + shift) and
// the window does (j >= i + shift - window_left, window_left >= 0); shift =
// kv_len - q_len. Returns O [nq, D] and base-2 LSE [nq].
void naive_capped_window(const std::vector<double>& q, const std::vector<double>& k, const std::vector<double>& v,
                         int64_t nq, int64_t nk, int64_t D, double scale, double cap, bool causal, int window_left,
                         std::vector<double>& o, std::vector<double>& lse) {
  o.assign(nq * D, 0.0);
  lse.assign(nq, kNegInf);
  const int64_t shift = nk - nq;
  for (int64_t i = 0; i < nq; ++i) {
    std::vector<double> w;
    std::vector<int64_t> js;
    for (int64_t j = 0; j < nk; ++j) {
      if (causal && j > i + shift) continue;
      if (window_left >= 0 && j < i + shift - window_left) continue;
      double dot = 0;
      for (int64_t d = 0; d < D; ++d) dot += q[i * D + d] * k[j * D + d];
      double logit = dot * scale;
      if (cap > 0) logit = cap * std::tanh(logit / cap);
      w.push_back(logit);
      js.push_back(j);
    }
    if (js.empty()) continue;
    double sum = 0;
    for (double x : w) sum += std::exp(x);
    for (size_t t = 0; t < js.size(); ++t)
      for (int64_t d = 0; d < D; ++d) o[i * D + d] += std::exp(w[t]) / sum * v[js[t] * D + d];
    lse[i] = std::log(sum) / std::log(2.0);
  }
}

struct CapWindowParam {
  double cap;
  int window_left;
  bool causal;
};

class CapWindowVsNaive : public ::testing::TestWithParam<CapWindowParam> {};

TEST_P(CapWindowVsNaive, RaggedAndPaged) {
  const CapWindowParam p = GetParam();
  const int64_t Hq = 4, Hkv = 2, D = 64;
  std::mt19937_64 rng(77 + p.window_left * 3 + p.causal + static_cast<int>(p.cap * 10));
  // Lengths: no queries, no keys, more queries than keys, the usual q < kv.
  std::vector<int32_t> q_lens{0, 3, 6, 4, 1, 5}, kv_lens{4, 0, 3, 17, 9, 12};
  RaggedIndex qo = RaggedIndex::from_lengths(q_lens), kv = RaggedIndex::from_lengths(kv_lens);
  HostTensor q = make_host(DType::kFloat16, {qo.total(), Hq, D});
  HostTensor k = make_host(DType::kFloat16, {kv.total(), Hkv, D}), v = make_host(DType::kFloat16, {kv.total(), Hkv, D});
  test::fill_random(q, rng(), -2, 2);  // large logits, so the cap matters
  test::fill_random(k, rng(), -3, 3);
  test::fill_random(v, rng());
  Options opt;
  opt.causal = p.causal;
  opt.logits_soft_cap = p.cap;
  opt.window_left = p.window_left;

  // Expected, from the naive loop.
  const std::vector<double> kd = test::to_doubles(k.view), vd = test::to_doubles(v.view);
  LogicalKV logical;
  for (int64_t i = 0; i < kv.num_sequences(); ++i) {
    logical.k.emplace_back(kd.begin() + kv.begin(i) * Hkv * D, kd.begin() + (kv.begin(i) + kv.length(i)) * Hkv * D);
    logical.v.emplace_back(vd.begin() + kv.begin(i) * Hkv * D, vd.begin() + (kv.begin(i) + kv.length(i)) * Hkv * D);
  }
  const Result want = expected_per_head(
      q.view, qo, logical, Hkv,
      [&](int64_t, const std::vector<double>& qh, const std::vector<double>& kh, const std::vector<double>& vh,
          int64_t nq, int64_t nk, int64_t d, std::vector<double>& o, std::vector<double>& lse) {
        naive_capped_window(qh, kh, vh, nq, nk, d, 1.0 / std::sqrt(double(d)), p.cap, p.causal, p.window_left, o, lse);
      });
  expect_same(reference::attention_ragged(q.view, qo, k.view, v.view, kv, opt), want, 1e-12);

  // Paged with page size 1, token t in page t: storage [total_kv, 1, Hkv, D]
  // holds k / v unchanged.
  HostTensor kc = make_host(DType::kFloat16, {kv.total(), 1, Hkv, D}), vc = make_host(DType::kFloat16, {kv.total(), 1, Hkv, D});
  for (int64_t i = 0; i < kv.total() * Hkv * D; ++i) kc.set(i, k.get(i)), vc.set(i, v.get(i));
  std::vector<int32_t> indptr, indices, last;
  for (int64_t i = 0; i <= kv.num_sequences(); ++i) indptr.push_back(static_cast<int32_t>(i < kv.num_sequences() ? kv.begin(i) : kv.total()));
  for (int32_t t = 0; t < kv.total(); ++t) indices.push_back(t);
  for (int32_t len : kv_lens) last.push_back(len ? 1 : 0);
  PagedKVCache cache(PagedKVStorage(kc.view, vc.view, KVLayout::kNHD), PageTable(indptr, indices, last, 1, kv.total()));
  expect_same(reference::attention_paged(q.view, qo, cache, opt), want, 1e-12);
}

INSTANTIATE_TEST_SUITE_P(Options, CapWindowVsNaive,
                         ::testing::Values(CapWindowParam{2.0, -1, false}, CapWindowParam{2.0, -1, true},
                                           CapWindowParam{0.0, 0, true}, CapWindowParam{0.0, 3, true},
                                           CapWindowParam{0.0, 3, false}, CapWindowParam{0.0, 100, true},
                                           CapWindowParam{1.5, 2, true}),
                         [](const auto& info) {
                           const CapWindowParam& p = info.param;
                           return "cap" + std::to_string(static_cast<int>(p.cap * 10)) + "_w" +
                                  (p.window_left < 0 ? std::string("off") : std::to_string(p.window_left)) +
                                  (p.causal ? "_causal" : "");
                         });

TEST(Reference, SoftCapBoundsLogits) {
  // Huge logits capped at 1: weights stay within e^2 of each other, unlike
  // uncapped softmax which would be one-hot.
  HostTensor q = make_host(DType::kFloat32, {1, 1, 1}), k = make_host(DType::kFloat32, {2, 1, 1}),
             v = make_host(DType::kFloat32, {2, 1, 1});
  q.set(0, 100.f);
  k.set(0, 100.f), k.set(1, -100.f);
  v.set(0, 1.f), v.set(1, 0.f);
  Options opt;
  opt.sm_scale = 1.0;
  opt.logits_soft_cap = 1.0;
  Result r = reference::attention_ragged(q.view, RaggedIndex({0, 1}), k.view, v.view, RaggedIndex({0, 2}), opt);
  const double e = std::exp(std::tanh(1e4)), f = std::exp(std::tanh(-1e4));
  EXPECT_NEAR(r.at(0, 0, 0), e / (e + f), 1e-14);
  EXPECT_NEAR(r.lse_at(0, 0), std::log2(e + f), 1e-14);
}

TEST(Reference, SlidingWindowZeroSeesOnlyItsDiagonalKey) {
  // window_left 0 with causal: query i sees exactly key i + kv_len - q_len, so O = that V row.
  HostTensor q = make_host(DType::kFloat32, {3, 1, 2}), k = make_host(DType::kFloat32, {5, 1, 2}),
             v = make_host(DType::kFloat32, {5, 1, 2});
  test::fill_random(q, 1);
  test::fill_random(k, 2);
  test::fill_random(v, 3);
  Options opt;
  opt.causal = true;
  opt.window_left = 0;
  Result r = reference::attention_ragged(q.view, RaggedIndex({0, 3}), k.view, v.view, RaggedIndex({0, 5}), opt);
  for (int i = 0; i < 3; ++i)
    for (int d = 0; d < 2; ++d) EXPECT_NEAR(r.at(i, 0, d), v.get((i + 2) * 2 + d), 1e-7);
}

}  // namespace
}  // namespace tessera::test
