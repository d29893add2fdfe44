// The library's CPU attention (cpu::attention_ragged, float accumulation with
// an online softmax over KV tiles) against the float64 reference: every mask
// and logits option, GQA, requests longer than one KV tile, empty requests
// and rows that see no key, fp32 and fp16 inputs.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>

#include "tessera/cpu/attention.hpp"
#include "tessera/reference/attention.hpp"
#include "test_util.hpp"

namespace tessera {
namespace {

using test::HostTensor;
using test::make_host;

struct Case {
  const char* name;
  bool causal = false;
  int window_left = -1;
  double cap = 0.0;
  bool mask = false;
  bool rope = false;
};

class CpuAttention : public ::testing::TestWithParam<std::tuple<Case, DType>> {};

TEST_P(CpuAttention, MatchesReference) {
  const auto [c, dt] = GetParam();
  const std::vector<int32_t> qo{0, 5, 5, 205, 206}, kv{0, 9, 17, 217, 220};  // request 1: no queries
  const int64_t Hq = 4, Hkv = 2, D = 64, rows = qo.back(), keys = kv.back();
  HostTensor q = make_host(dt, {rows, Hq, D}), k = make_host(dt, {keys, Hkv, D}), v = make_host(dt, {keys, Hkv, D});
  test::fill_random(q, 1, -2.f, 2.f);
  test::fill_random(k, 2);
  test::fill_random(v, 3);
  std::vector<uint8_t> mask;
  std::mt19937 rng(4);
  for (size_t r = 0; c.mask && r + 1 < qo.size(); ++r)
    for (int64_t n = int64_t(qo[r + 1] - qo[r]) * (kv[r + 1] - kv[r]); n-- > 0;) mask.push_back(rng() % 3 != 0);
  if (c.mask) std::fill_n(mask.begin() + 9 * 2, 9, 0);  // request 0, row 2 sees no key

  reference::Options ro;
  ro.causal = c.causal;
  ro.window_left = c.window_left;
  ro.logits_soft_cap = c.cap;
  ro.custom_mask = mask;
  if (c.rope) ro.rope = reference::RopeOptions{false, 2.0, 1e4, -1};
  const reference::Result ref = reference::attention_ragged(q.view, RaggedIndex(qo), k.view, v.view, RaggedIndex(kv), ro);

  cpu::AttentionOptions opt;
  opt.causal = c.causal;
  opt.window_left = c.window_left;
  opt.logits_soft_cap = c.cap;
  opt.custom_mask = mask;
  opt.rope = c.rope;
  opt.rope_scale = 2.0;
  HostTensor o = make_host(DType::kFloat32, {rows, Hq, D}), lse = make_host(DType::kFloat32, {rows, Hq});
  cpu::attention_ragged(q.view, qo, k.view, v.view, kv, opt, o.view, lse.view);

  const std::vector<double> got_o = test::to_doubles(o.view), got_lse = test::to_doubles(lse.view);
  for (size_t i = 0; i < got_o.size(); ++i) ASSERT_NEAR(got_o[i], ref.o[i], 1e-5) << c.name << " o[" << i << "]";
  for (size_t i = 0; i < got_lse.size(); ++i) {
    if (std::isinf(ref.lse[i])) EXPECT_EQ(got_lse[i], ref.lse[i]) << c.name << " lse[" << i << "]";
    else EXPECT_NEAR(got_lse[i], ref.lse[i], 1e-5 * std::max(1.0, std::abs(ref.lse[i]))) << c.name << " lse[" << i << "]";
  }
}

INSTANTIATE_TEST_SUITE_P(
    All, CpuAttention,
    ::testing::Combine(::testing::Values(Case{"plain"}, Case{"causal", true}, Case{"window", true, 30},
                                         Case{"soft_cap", false, -1, 5.0}, Case{"custom_mask", false, -1, 0.0, true},
                                         Case{"rope", true, -1, 0.0, false, true}),
                       ::testing::Values(DType::kFloat32, DType::kFloat16)));

TEST(CpuAttention, RejectsBadArguments) {
  HostTensor q = make_host(DType::kFloat32, {3, 4, 64}), k = make_host(DType::kFloat32, {5, 2, 64});
  HostTensor o = make_host(DType::kFloat32, {3, 4, 64}), k3 = make_host(DType::kFloat32, {5, 3, 64});
  const std::vector<int32_t> qo{0, 3}, kv{0, 5}, kv_short{0, 4};
  EXPECT_THROW_MSG(cpu::attention_ragged(q.view, qo, k.view, k.view, kv_short, {}, o.view, {}), InvalidArgument, "k");
  EXPECT_THROW_MSG(cpu::attention_ragged(q.view, qo, k3.view, k3.view, kv, {}, o.view, {}), InvalidArgument, "k");
  EXPECT_THROW_MSG(cpu::attention_ragged(q.view, qo, k.view, k.view, kv, {}, k.view, {}), InvalidArgument, "o");
  cpu::AttentionOptions opt;
  const std::vector<uint8_t> mask(14, 1);
  opt.custom_mask = mask;
  EXPECT_THROW_MSG(cpu::attention_ragged(q.view, qo, k.view, k.view, kv, opt, o.view, {}), InvalidArgument, "custom_mask");
}

}  // namespace
}  // namespace tessera
