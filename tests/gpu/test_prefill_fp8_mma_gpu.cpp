// fp8 tensor cores (PrefillOptions::fp8_mma) on the Hopper prefill kernel:
// paged fp8 caches (e4m3 / e5m2) with fp16 / bf16 queries, page sizes 1 /
// 16 / 64, NHD / HND, shuffled pages, causal and not, query and KV lengths
// from 0 to 3000, against the float64 reference on the dequantized cache
// within the option's bound (the kernel rounds q to two e4m3 terms and P to
// e4m3),
// outputs poisoned first; bitwise re-runs; scales as floats and as device
// tensors. Also what the sanitizer subset runs for this kernel family.
#include <gtest/gtest.h>

#include <random>

#include "decode_util.hpp"
#include "prefill_util.hpp"
#include "tessera/runtime/jit.hpp"

using namespace tessera;
using namespace tessera::test;

namespace {

constexpr DType kE4M3 = DType::kFloat8E4M3, kE5M2 = DType::kFloat8E5M2;
constexpr double kKScale = 0.0131, kVScale = 0.0097;
// max |o - ref| / max |ref| and the same for LSE: P rounded to e4m3's
// three mantissa bits, q to about 7 (docs/performance.md states the
// measured error).
constexpr double kTolO = 4e-2, kTolLse = 3e-3;

struct MmaCase {
  DType q, kv;
  int page_size;
  KVLayout layout;
  bool causal;
};

class Fp8MmaPrefillGpu : public ::testing::TestWithParam<MmaCase> {};

TEST_P(Fp8MmaPrefillGpu, MatchesDequantizedReference) {
  SKIP_WITHOUT_GPU();
  if (jit::Arch::of_device(cuda::current_device()).major != 9) GTEST_SKIP() << "fp8 tensor cores run on sm_90";
  const MmaCase c = GetParam();
  std::mt19937_64 rng(1234 + c.page_size);
  const std::vector<int32_t> q_lens{0, 5, 1, 37, 100, 64, 9, 130}, kv_lens{10, 0, 300, 37, 190, 577, 3, 3000};
  const int64_t Hkv = 2, Hq = 8, D = 128, batch = static_cast<int64_t>(q_lens.size());
  const int64_t pool = pages_needed(kv_lens, c.page_size) + 5;
  const Table t = make_table(kv_lens, c.page_size, pool, rng);
  std::vector<int32_t> qo{0};
  for (int32_t n : q_lens) qo.push_back(qo.back() + n);
  const std::vector<int64_t> shape = c.layout == KVLayout::kNHD ? std::vector<int64_t>{pool, c.page_size, Hkv, D}
                                                                : std::vector<int64_t>{pool, Hkv, c.page_size, D};
  HostTensor k = make_host(c.kv, shape), v = make_host(c.kv, shape), q = make_host(c.q, {qo.back(), Hq, D});
  fill_random(k, rng(), -200.f, 200.f);
  fill_random(v, rng(), -200.f, 200.f);
  fill_random(q, rng(), -2.f, 2.f);
  const DeviceTensor dk = to_device(k), dv = to_device(v), dq = to_device(q);

  AttentionSpec spec{c.causal ? variants::causal() : variants::standard(), c.q, c.kv, c.q, 128};
  TaskInfo task{static_cast<int>(Hq), static_cast<int>(Hkv), c.page_size, c.layout, batch, pool, qo.back()};
  PrefillOptions opt;
  opt.fp8_mma = true;
  Workspace ws = prefill_workspace(spec, task, opt);
  BatchPrefill pre(spec, task, ws, opt);
  pre.plan_paged(qo, t.indptr, t.indices, t.last);
  ASSERT_TRUE(pre.config().hopper && pre.config().fp8_mma);
  RunOptions ro;
  ro.k_scale = kKScale;
  ro.v_scale = kVScale;
  const PagedKVStorage storage(dk.view, dv.view, c.layout);
  auto run = [&](const RunOptions& r) {
    return run_and_fetch([&](const TensorView& o, const TensorView& lse) { pre.run(dq.view, storage, o, lse, nullptr, r); },
                         c.q, qo.back(), Hq, D);
  };
  const Out got = run(ro);

  PagedKVCache cache(PagedKVStorage(k.view, v.view, c.layout),
                     PageTable(t.indptr, t.indices, t.last, c.page_size, t.num_pages));
  reference::Options ref_opt;
  ref_opt.causal = c.causal;
  ref_opt.k_scale = kKScale;
  ref_opt.v_scale = kVScale;
  const reference::Result ref = reference::attention_paged(q.view, RaggedIndex(qo), cache, ref_opt);
  const ErrorStats eo = compare(to_doubles(got.o.view), ref.o), el = compare(to_doubles(got.lse.view), ref.lse);
  std::printf("fp8_mma %s q, %s kv, page %d: o %.2e, lse %.2e\n", dtype_name(c.q), dtype_name(c.kv), c.page_size,
              eo.rel, el.rel);
  EXPECT_FALSE(eo.nan || el.nan) << "NaN in output";
  EXPECT_LT(eo.rel, kTolO);
  EXPECT_LT(el.rel, kTolLse);

  // Bitwise re-runs; scale tensors give the same outputs as the floats.
  EXPECT_TRUE(bitwise_equal(run(ro).o, got.o));
  HostTensor hs = make_host(DType::kFloat32, {1});
  hs.set(0, static_cast<float>(kKScale));
  const DeviceTensor ks = to_device(hs);
  hs.set(0, static_cast<float>(kVScale));
  const DeviceTensor vs = to_device(hs);
  RunOptions rt;
  rt.k_scale_tensor = ks.view;
  rt.v_scale_tensor = vs.view;
  EXPECT_CLOSE(compare(to_doubles(run(rt).o.view), to_doubles(got.o.view)), c.q);
}

INSTANTIATE_TEST_SUITE_P(All, Fp8MmaPrefillGpu,
                         ::testing::Values(MmaCase{DType::kFloat16, kE4M3, 16, KVLayout::kNHD, true},
                                           MmaCase{DType::kBFloat16, kE5M2, 1, KVLayout::kHND, true},
                                           MmaCase{DType::kFloat16, kE5M2, 64, KVLayout::kNHD, false},
                                           MmaCase{DType::kBFloat16, kE4M3, 16, KVLayout::kHND, false}));

}  // namespace
