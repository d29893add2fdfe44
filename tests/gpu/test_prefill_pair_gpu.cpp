// Two batch prefills in one launch (PrefillPair, POD-Attention's fusion): a
// causal prefill chunk over contiguous KV beside a decode batch over a
// shuffled paged cache, on the FA2 template and on the Hopper kernel,
// against the CPU reference, bit for bit equal to each wrapper's own run,
// deterministic, and the arguments it refuses.
#include <gtest/gtest.h>

#include <numeric>
#include <random>

#include "prefill_util.hpp"
#include "tessera/api/prefill_pair.hpp"
#include "tessera/reference/attention.hpp"

using namespace tessera;
using namespace tessera::test;

namespace {

// The step: one prompt chunk of q_len queries after `prefix` cached tokens
// (ragged KV of prefix + q_len rows), and a decode batch over pages of 16.
struct Step {
  int D, group, Hkv = 2;
  DType dt;
  int q_len = 333, prefix = 1200;
  std::vector<int32_t> kv_lens = {1, 17, 0, 300, 2049, 64, 5, 900};
  std::vector<int32_t> dec_qo{0}, kv_pages{0}, indices, last;
  int64_t pool = 0;
  HostTensor qp, kp, vp, qd, kc, vc;
  reference::Result ref_p, ref_d;

  Step(DType t, int d, int g, std::mt19937_64& rng) : D(d), group(g), dt(t) {
    const int64_t Hq = int64_t{Hkv} * group, kv_p = prefix + q_len;
    constexpr int kPage = 16;
    for (int32_t kv : kv_lens) pool += (kv + kPage - 1) / kPage;
    pool += 5;
    std::vector<int32_t> perm(pool);
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng);
    int next = 0;
    for (int32_t kv : kv_lens) {
      const int pages = (kv + kPage - 1) / kPage;
      for (int p = 0; p < pages; ++p) indices.push_back(perm[next++]);
      kv_pages.push_back(static_cast<int32_t>(indices.size()));
      last.push_back(pages ? kv - (pages - 1) * kPage : 0);
      dec_qo.push_back(dec_qo.back() + 1);
    }
    qp = make_host(dt, {q_len, Hq, D});
    kp = make_host(dt, {kv_p, Hkv, D});
    vp = kp;
    qd = make_host(dt, {batch(), Hq, D});
    kc = make_host(dt, {pool, kPage, Hkv, D});
    vc = kc;
    for (HostTensor* h : {&kp, &vp, &kc, &vc}) fill_random(*h, rng());
    for (HostTensor* h : {&qp, &qd}) fill_random(*h, rng(), -2.f, 2.f);
    reference::Options causal;
    causal.causal = true;
    ref_p = reference::attention_ragged(qp.view, RaggedIndex(std::vector<int32_t>{0, q_len}), kp.view, vp.view,
                                        RaggedIndex(std::vector<int32_t>{0, static_cast<int32_t>(kv_p)}), causal);
    PagedKVCache cache(PagedKVStorage(kc.view, vc.view, KVLayout::kNHD),
                       PageTable(kv_pages, indices, last, kPage, pool));
    ref_d = reference::attention_paged(qd.view, RaggedIndex(dec_qo), cache, {});
  }
  int64_t batch() const { return static_cast<int64_t>(kv_lens.size()); }
  int64_t hq() const { return int64_t{Hkv} * group; }
};

struct Wrappers {
  AttentionSpec spec_p, spec_d;
  TaskInfo task_p, task_d;
  PrefillOptions opt_p, opt_d;
  Workspace ws_p, ws_d;
  std::unique_ptr<BatchPrefill> pre, dec;

  // backend: FA2 or the Hopper kernel (kFA3) for both sides; decode_backend:
  // the decode side's, where it differs.
  explicit Wrappers(const Step& s, PrefillBackend backend = PrefillBackend::kFA2,
                    PrefillBackend decode_backend = PrefillBackend::kAuto) {
    if (decode_backend == PrefillBackend::kAuto) decode_backend = backend;
    spec_p = AttentionSpec{variants::causal(), s.dt, s.dt, s.dt, s.D};
    spec_d = AttentionSpec{variants::standard(), s.dt, s.dt, s.dt, s.D};
    task_p = TaskInfo{static_cast<int>(s.hq()), s.Hkv, 1, KVLayout::kNHD, 1, 1};
    task_p.max_total_q = s.q_len;
    task_d = TaskInfo{static_cast<int>(s.hq()), s.Hkv, 16, KVLayout::kNHD, s.batch(), s.pool};
    task_d.max_total_q = s.batch();
    opt_p.backend = backend;
    opt_d.backend = decode_backend;
    // Tiles of as many threads: FA2's 16-row decode tile has 4 warps, as its
    // 128-row tile (64 at head dim 256); the Hopper kernel's 64-row tiles.
    opt_p.cta_q = backend == PrefillBackend::kFA3 ? 64 : s.D == 256 ? 64 : 128;
    opt_d.cta_q = decode_backend == PrefillBackend::kFA3 ? 64 : 16;
    ws_p = prefill_workspace(spec_p, task_p, opt_p);
    ws_d = prefill_workspace(spec_d, task_d, opt_d);
    pre = std::make_unique<BatchPrefill>(spec_p, task_p, ws_p, opt_p);
    dec = std::make_unique<BatchPrefill>(spec_d, task_d, ws_d, opt_d);
  }
  void plan(const Step& s) {
    pre->plan_ragged(std::vector<int32_t>{0, s.q_len}, std::vector<int32_t>{0, s.prefix + s.q_len});
    dec->plan_paged(s.dec_qo, s.kv_pages, s.indices, s.last);
  }
};

// backend: kFA2 (any GPU) or kFA3 (the Hopper kernel, sm_90 only).
class PrefillPairGpu : public ::testing::TestWithParam<std::tuple<DType, int, int, PrefillBackend>> {};

TEST_P(PrefillPairGpu, MatchesReferenceAndEachWrappersOwnRun) {
  SKIP_WITHOUT_GPU();
  const auto [dt, D, group, backend] = GetParam();
  if (backend == PrefillBackend::kFA3 && cuda::device_info(cuda::current_device()).major != 9)
    GTEST_SKIP() << "skipped: the Hopper kernel needs sm_90";
  std::mt19937_64 rng(D * 7 + group);
  Step s(dt, D, group, rng);
  Wrappers w(s, backend);
  w.plan(s);
  PrefillPair pod(*w.pre, *w.dec);
  auto dqp = to_device(s.qp), dkp = to_device(s.kp), dvp = to_device(s.vp), dqd = to_device(s.qd),
       dkc = to_device(s.kc), dvc = to_device(s.vc);
  PagedKVStorage cache(dkc.view, dvc.view, KVLayout::kNHD);
  Out op = {make_host(dt, {s.q_len, s.hq(), D}), make_host(DType::kFloat32, {s.q_len, s.hq()})};
  Out od = {make_host(dt, {s.batch(), s.hq(), D}), make_host(DType::kFloat32, {s.batch(), s.hq()})};
  auto fused = [&] {
    auto o_p = poisoned_like(op.o), l_p = poisoned_like(op.lse), o_d = poisoned_like(od.o), l_d = poisoned_like(od.lse);
    PrefillRunArgs a{.q = dqp.view, .k = dkp.view, .v = dvp.view, .o = o_p.view, .lse = l_p.view};
    PrefillRunArgs b{.q = dqd.view, .kv = &cache, .o = o_d.view, .lse = l_d.view};
    pod.run(a, b);
    TESSERA_CUDA_CHECK(cudaDeviceSynchronize());
    return std::pair<Out, Out>{{to_host(o_p, op.o), to_host(l_p, op.lse)}, {to_host(o_d, od.o), to_host(l_d, od.lse)}};
  };
  auto [p1, d1] = fused();
  EXPECT_CLOSE(compare(to_doubles(p1.o.view), s.ref_p.o), dt);
  EXPECT_CLOSE(compare(to_doubles(p1.lse.view), s.ref_p.lse), DType::kFloat16);
  EXPECT_CLOSE(compare(to_doubles(d1.o.view), s.ref_d.o), dt);
  EXPECT_CLOSE(compare(to_doubles(d1.lse.view), s.ref_d.lse), DType::kFloat16);
  // Each part is its wrapper's own run, bit for bit.
  Out p2 = run_and_fetch([&](const TensorView& o, const TensorView& l) { w.pre->run_ragged(dqp.view, dkp.view, dvp.view, o, l); },
                         dt, s.q_len, s.hq(), D);
  Out d2 = run_and_fetch([&](const TensorView& o, const TensorView& l) { w.dec->run(dqd.view, cache, o, l); }, dt,
                         s.batch(), s.hq(), D);
  EXPECT_TRUE(bitwise_equal(p1.o, p2.o));
  EXPECT_TRUE(bitwise_equal(p1.lse, p2.lse));
  EXPECT_TRUE(bitwise_equal(d1.o, d2.o));
  EXPECT_TRUE(bitwise_equal(d1.lse, d2.lse));
  // Deterministic.
  auto [p3, d3] = fused();
  EXPECT_TRUE(bitwise_equal(p1.o, p3.o));
  EXPECT_TRUE(bitwise_equal(d1.o, d3.o));
  EXPECT_GT(w.pre->last_plan().num_split + w.dec->last_plan().num_split, 0) << "no split-KV merge tested";
}

INSTANTIATE_TEST_SUITE_P(All, PrefillPairGpu,
                         ::testing::Combine(::testing::Values(DType::kFloat16, DType::kBFloat16),
                                            ::testing::Values(64, 128, 256), ::testing::Values(1, 4, 8),
                                            ::testing::Values(PrefillBackend::kFA2, PrefillBackend::kFA3)));

TEST(PrefillPairGpuArgs, RefusesWhatCannotRunTogether) {
  SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(3);
  Step s(DType::kFloat16, 128, 4, rng);
  Wrappers w(s);
  EXPECT_THROW_MSG(PrefillPair(*w.pre, *w.dec), InvalidArgument, "planned");  // no plan yet
  w.plan(s);
  EXPECT_THROW_MSG(PrefillPair(*w.pre, *w.pre), InvalidArgument, "second");
  PrefillPair pod(*w.pre, *w.dec);
  auto dq = to_device(s.qp), dk = to_device(s.kp), dqd = to_device(s.qd), dkc = to_device(s.kc);
  PagedKVStorage cache(dkc.view, dkc.view, KVLayout::kNHD);
  HostTensor o_p = make_host(DType::kFloat16, {s.q_len, s.hq(), 128}), o_d = make_host(DType::kFloat16, {s.batch(), s.hq(), 128});
  auto dop = to_device(o_p), dod = to_device(o_d);
  const PrefillRunArgs ragged{.q = dq.view, .k = dk.view, .v = dk.view, .o = dop.view};
  const PrefillRunArgs paged{.q = dqd.view, .kv = &cache, .o = dod.view};
  EXPECT_THROW_MSG(pod.run(paged, paged), InvalidArgument, "first.kv");
  EXPECT_THROW_MSG(pod.run(ragged, ragged), InvalidArgument, "second.kv");
  PrefillRunArgs short_o = paged;
  short_o.o = dop.view;  // the prefill's rows
  EXPECT_THROW_MSG(pod.run(ragged, short_o), InvalidArgument, "o");
  // Both sides on one template.
  if (cuda::device_info(cuda::current_device()).major == 9) {
    Wrappers mixed(s, PrefillBackend::kFA3, PrefillBackend::kFA2);
    mixed.plan(s);
    EXPECT_THROW_MSG(PrefillPair(*mixed.pre, *mixed.dec), InvalidArgument, "second");
  }
}

}  // namespace
