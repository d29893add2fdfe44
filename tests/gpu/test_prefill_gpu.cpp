// Tensor-core batch prefill (FA2 template) against the CPU reference: paged
// (page sizes 1 and 16), ragged and BSR (Br 1/4/16, Bc 1/4/16) KV; causal
// (bottom-right, q_len < kv_len) and non-causal; head dims 64/128/256; group
// sizes 1/4/8; every query tile size; fp16/bf16; empty requests and rows
// that see nothing; keys drifting along the context (row maxima that keep
// jumping); bitwise determinism.
#include <gtest/gtest.h>

#include <numeric>
#include <random>

#include "prefill_util.hpp"
#include "tessera/api/prefill.hpp"
#include "tessera/reference/attention.hpp"

using namespace tessera;
using namespace tessera::test;

namespace {

struct Batch {
  std::vector<int32_t> qo{0}, kv_pages{0}, indices, last, kv_tokens{0};
  std::vector<int32_t> q_len, kv_len;
  int64_t pool = 0;
};

// Requests include: no queries, no keys, one query, q_len < kv_len (chunked
// prefill), q_len > kv_len under causal (early rows see nothing).
Batch make_batch(int page_size, std::mt19937_64& rng) {
  Batch b;
  b.q_len = {0, 5, 1, 37, 100, 64, 9};
  b.kv_len = {10, 0, 300, 37, 190, 64 + 513, 3};
  std::vector<int32_t> pages;
  for (int32_t kv : b.kv_len) pages.push_back((kv + page_size - 1) / page_size);
  b.pool = std::accumulate(pages.begin(), pages.end(), 0) + 3;
  std::vector<int32_t> perm(b.pool);
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng);
  int next = 0;
  for (size_t r = 0; r < b.q_len.size(); ++r) {
    b.qo.push_back(b.qo.back() + b.q_len[r]);
    b.kv_tokens.push_back(b.kv_tokens.back() + b.kv_len[r]);
    for (int p = 0; p < pages[r]; ++p) b.indices.push_back(perm[next++]);
    b.kv_pages.push_back(static_cast<int32_t>(b.indices.size()));
    b.last.push_back(pages[r] ? b.kv_len[r] - (pages[r] - 1) * page_size : 0);
  }
  return b;
}

// backend: kAuto picks the Hopper (wgmma) template on sm_90 for head_dim
// 64/128/256 and query tiles of 64/128 rows; kFA2 keeps the FA2 template tested there.
class PrefillPaged : public ::testing::TestWithParam<std::tuple<DType, int, int, int, bool, int, PrefillBackend>> {};

// A paged batch (make_batch: shuffled pages, empty and long requests) against
// the reference, run twice for the same bits.
void check_paged_case(DType dt, int D, int group, int page_size, bool causal, int cta_q, PrefillBackend backend,
                      const PrefillTile& tile = {}) {
  const int64_t Hkv = 2, Hq = Hkv * group;
  std::mt19937_64 rng(D + group * 10 + page_size * 100 + cta_q + tile.stages * 1000);
  Batch b = make_batch(page_size, rng);
  const int64_t rows = b.qo.back();
  const PagedInputs in(dt, Hkv, Hq, D, page_size, b.pool, b.qo, b.kv_pages, b.indices, b.last, causal, rng);
  const HostTensor &k = in.k, &v = in.v, &q = in.q;
  const reference::Result& ref = in.ref;

  const AttentionSpec spec{causal ? variants::causal() : variants::standard(), dt, dt, dt, D};
  TaskInfo task{static_cast<int>(Hq), static_cast<int>(Hkv), page_size, KVLayout::kNHD, 16, 4 * b.pool};
  task.max_total_q = 1024;
  PrefillOptions opt;
  opt.cta_q = cta_q;
  opt.backend = backend;
  opt.tile = tile;
  Workspace ws = prefill_workspace(spec, task, opt);
  BatchPrefill pre(spec, task, ws, opt);
  pre.plan_paged(b.qo, b.kv_pages, b.indices, b.last);
  if (tile.stages) EXPECT_EQ(pre.config().stages, tile.stages);
  auto dk = to_device(k), dv = to_device(v), dq = to_device(q);
  PagedKVStorage kv(dk.view, dv.view, KVLayout::kNHD);
  auto run = [&](const TensorView& o, const TensorView& lse) { pre.run(dq.view, kv, o, lse); };
  Out a = run_and_fetch(run, dt, rows, Hq, D);
  EXPECT_CLOSE(compare(to_doubles(a.o.view), ref.o), dt);
  EXPECT_CLOSE(compare(to_doubles(a.lse.view), ref.lse), DType::kFloat16);
  Out c = run_and_fetch(run, dt, rows, Hq, D);
  EXPECT_TRUE(bitwise_equal(a.o, c.o));
}

TEST_P(PrefillPaged, MatchesReference) {
  SKIP_WITHOUT_GPU();
  const auto [dt, D, group, page_size, causal, cta_q, backend] = GetParam();
  check_paged_case(dt, D, group, page_size, causal, cta_q, backend);
}

INSTANTIATE_TEST_SUITE_P(All, PrefillPaged,
                         ::testing::Combine(::testing::Values(DType::kFloat16, DType::kBFloat16), ::testing::Values(64, 128, 256),
                                            ::testing::Values(1, 4, 8), ::testing::Values(1, 16), ::testing::Bool(),
                                            ::testing::Values(16, 64, 128),
                                            ::testing::Values(PrefillBackend::kAuto, PrefillBackend::kFA2)));

// Deeper FA2 pipelines over paged KV keep STAGES - 1 tiles in flight: the
// page ids arrive STAGES tiles ahead through a ring (common/tiles.cuh).
// Pages of 1 and 16 tokens, tiles of 16 to 64 keys, 3 and 4 stages.
TEST(PrefillPagedDeepPipeline, MatchesReference) {
  SKIP_WITHOUT_GPU();
  for (int stages : {3, 4})
    for (int page_size : {1, 16})
      for (const auto& [cta_q, cta_kv] : {std::pair{16, 64}, std::pair{64, 32}, std::pair{128, 16}}) {
        SCOPED_TRACE("stages " + std::to_string(stages) + ", page " + std::to_string(page_size) + ", tile " +
                     std::to_string(cta_q) + " x " + std::to_string(cta_kv));
        check_paged_case(DType::kFloat16, 128, 4, page_size, true, cta_q, PrefillBackend::kFA2,
                         {.cta_kv = cta_kv, .stages = stages});
      }
}

// A ragged batch (make_batch) over Hkv KV heads (group query heads each),
// random q / k / v, and the reference result. ramp > 0 adds ramp x t to
// every feature of a request's key t, so a row's logits climb (or fall,
// where its q sums negative) along the context.
struct RaggedCase {
  Batch b;
  HostTensor q, k, v;
  reference::Result ref;
  AttentionSpec spec;
  TaskInfo task;

  RaggedCase(DType dt, int D, int group, bool causal, int n, std::mt19937_64& rng, int64_t Hkv = 2, double ramp = 0.0)
      : b(make_batch(n, rng)) {
    const int64_t Hq = Hkv * group;
    k = make_host(dt, {b.kv_tokens.back(), Hkv, D});
    v = k;
    q = make_host(dt, {rows(), Hq, D});
    fill_random(k, rng());
    if (ramp != 0.0)
      for (size_t r = 0; r + 1 < b.kv_tokens.size(); ++r)
        for (int32_t t = b.kv_tokens[r]; t < b.kv_tokens[r + 1]; ++t)
          for (int64_t x = 0; x < Hkv * D; ++x)
            k.set(t * Hkv * D + x, static_cast<float>(k.get(t * Hkv * D + x) + ramp * (t - b.kv_tokens[r])));
    fill_random(v, rng());
    fill_random(q, rng(), -2.f, 2.f);
    reference::Options ro;
    ro.causal = causal;
    ref = reference::attention_ragged(q.view, RaggedIndex(b.qo), k.view, v.view, RaggedIndex(b.kv_tokens), ro);
    spec = AttentionSpec{causal ? variants::causal() : variants::standard(), dt, dt, dt, D};
    task = TaskInfo{static_cast<int>(Hq), static_cast<int>(Hkv), 1, KVLayout::kNHD, 16, 1};
    task.max_total_q = 1024;
  }
  int64_t rows() const { return b.qo.back(); }
};

// Head groups (HeadGrouping::kOn, at every length and tile): KV heads planned
// together so the grid fills every SM (8 or
// 16 heads on 132 SMs: gcd(heads, CTAs) = 4 groups of 2 or 4 heads; max_sms =
// 3 leaves 1-3 groups of 3-6 CTAs, splitting every long request). Ragged and
// paged (page size 1) KV, both backends: each run matches the reference and
// repeats its bits.
TEST(PrefillHeadGroups, MatchReferenceAndRepeat) {
  SKIP_WITHOUT_GPU();
  const DType dt = DType::kFloat16;
  bool any_grouped = false;
  for (const PrefillBackend backend : {PrefillBackend::kAuto, PrefillBackend::kFA2})
    for (const auto& [Hkv, max_sms] : {std::pair{8, 0}, {16, 0}, {8, 3}}) {
      SCOPED_TRACE("backend " + std::to_string(static_cast<int>(backend)) + ", " + std::to_string(Hkv) +
                   " KV heads, max_sms " + std::to_string(max_sms));
      std::mt19937_64 rng(Hkv * 10 + max_sms);
      const RaggedCase c(dt, 128, 2, true, 12, rng, Hkv);
      const auto& [b, q, k, v, ref, spec, task] = c;
      const int64_t rows = c.rows(), Hq = task.num_qo_heads, D = 128, N = b.kv_tokens.back();
      TaskInfo t = task;
      t.max_pages = N;
      PrefillOptions opt;
      opt.backend = backend;
      opt.max_sms = max_sms;
      opt.cta_q = 128;
      opt.group_heads = HeadGrouping::kOn;
      auto dk = to_device(k), dv = to_device(v), dq = to_device(q);
      Workspace ws = prefill_workspace(spec, t, opt);
      BatchPrefill pre(spec, t, ws, opt);
      pre.plan_ragged(b.qo, b.kv_tokens);
      ASSERT_GT(pre.head_groups(), 0);
      EXPECT_EQ(Hkv % pre.head_groups(), 0);
      any_grouped |= pre.head_groups() < Hkv;
      auto ragged = [&](const TensorView& o, const TensorView& lse) { pre.run_ragged(dq.view, dk.view, dv.view, o, lse); };
      Out r1 = run_and_fetch(ragged, dt, rows, Hq, D), r2 = run_and_fetch(ragged, dt, rows, Hq, D);
      EXPECT_CLOSE(compare(to_doubles(r1.o.view), ref.o), dt);
      EXPECT_CLOSE(compare(to_doubles(r1.lse.view), ref.lse), DType::kFloat16);
      EXPECT_TRUE(bitwise_equal(r1.o, r2.o));
      EXPECT_TRUE(bitwise_equal(r1.lse, r2.lse));
      // The same keys as pages of one token, in order.
      std::vector<int32_t> indices(N), last;
      std::iota(indices.begin(), indices.end(), 0);
      for (size_t r = 0; r + 1 < b.kv_tokens.size(); ++r) last.push_back(b.kv_tokens[r + 1] > b.kv_tokens[r] ? 1 : 0);
      pre.plan_paged(b.qo, b.kv_tokens, indices, last);
      TensorView kp = dk.view, vp = dv.view;
      kp.shape = vp.shape = {N, 1, Hkv, D};
      kp.strides = vp.strides = {Hkv * D, Hkv * D, D, 1};
      Out p1 = run_and_fetch([&](const TensorView& o, const TensorView& lse) {
        pre.run(dq.view, PagedKVStorage(kp, vp, KVLayout::kNHD), o, lse);
      }, dt, rows, Hq, D);
      EXPECT_CLOSE(compare(to_doubles(p1.o.view), ref.o), dt);
      EXPECT_CLOSE(compare(to_doubles(p1.lse.view), ref.lse), DType::kFloat16);
    }
  EXPECT_TRUE(any_grouped);
}

class PrefillRagged : public ::testing::TestWithParam<std::tuple<DType, int, bool, int, PrefillBackend>> {};

// A RaggedCase (head dim 128) on query tiles of cta_q rows: o and lse
// against the reference, and a second run's bits against the first's.
void check_ragged_case(const RaggedCase& c, int cta_q, PrefillBackend backend) {
  const auto& [b, q, k, v, ref, spec, task] = c;
  const int64_t rows = c.rows(), Hq = task.num_qo_heads, D = 128;
  PrefillOptions opt;
  opt.cta_q = cta_q;
  opt.backend = backend;
  Workspace ws = prefill_workspace(spec, task, opt);
  BatchPrefill pre(spec, task, ws, opt);
  pre.plan_ragged(b.qo, b.kv_tokens);
  auto dk = to_device(k), dv = to_device(v), dq = to_device(q);
  auto run = [&](const TensorView& o, const TensorView& lse) { pre.run_ragged(dq.view, dk.view, dv.view, o, lse); };
  Out a = run_and_fetch(run, spec.q_dtype, rows, Hq, D), a2 = run_and_fetch(run, spec.q_dtype, rows, Hq, D);
  EXPECT_CLOSE(compare(to_doubles(a.o.view), ref.o), spec.q_dtype);
  EXPECT_CLOSE(compare(to_doubles(a.lse.view), ref.lse), DType::kFloat16);
  EXPECT_TRUE(bitwise_equal(a.o, a2.o));
  EXPECT_TRUE(bitwise_equal(a.lse, a2.lse));
}

TEST_P(PrefillRagged, MatchesReference) {
  SKIP_WITHOUT_GPU();
  const auto [dt, group, causal, cta_q, backend] = GetParam();
  std::mt19937_64 rng(group + cta_q);
  check_ragged_case(RaggedCase(dt, 128, group, causal, 16, rng), cta_q, backend);
}

INSTANTIATE_TEST_SUITE_P(All, PrefillRagged,
                         ::testing::Combine(::testing::Values(DType::kFloat16, DType::kBFloat16), ::testing::Values(1, 4, 8),
                                            ::testing::Bool(), ::testing::Values(16, 32, 64, 128),
                                            ::testing::Values(PrefillBackend::kAuto, PrefillBackend::kFA2)));

// Keys drifting along the context (RaggedCase's ramp, 0.055 a token: a row
// whose q sums to one standard deviation moves ~12 (base 2) a 128-key
// tile): row maxima jump past the Hopper mainloop's slack (2^8) tile after
// tile, so O and the row sums are rescaled in most tiles, which random keys,
// whose maxima settle in the first tile, never ask for. Both templates,
// query tiles of 64 and 128 rows, fp16 (row sums on the tensor cores) and
// bf16; each run matches the reference and repeats its bits.
TEST(PrefillMaximaJumps, MatchReferenceAndRepeat) {
  SKIP_WITHOUT_GPU();
  for (const DType dt : {DType::kFloat16, DType::kBFloat16})
    for (const bool causal : {false, true})
      for (const PrefillBackend backend : {PrefillBackend::kAuto, PrefillBackend::kFA2})
        for (const int cta_q : {64, 128}) {
          SCOPED_TRACE(std::string(dtype_name(dt)) + (causal ? " causal" : "") + " backend " +
                       std::to_string(static_cast<int>(backend)) + " tile " + std::to_string(cta_q));
          std::mt19937_64 rng(cta_q + causal);
          check_ragged_case(RaggedCase(dt, 128, 4, causal, 16, rng, 2, 0.055), cta_q, backend);
        }
}

// fp32 outputs (o_dtype float32, what a cascade's levels write): the value a
// 16-bit output rounds. Both backends, head dims 64 / 128 / 256, requests
// long enough to split (merged partials are written as fp32 too): the fp32
// output, rounded to the inputs' dtype, is the 16-bit run bit for bit.
class PrefillF32Out : public ::testing::TestWithParam<std::tuple<DType, int, PrefillBackend>> {};

TEST_P(PrefillF32Out, RoundsToThe16BitRun) {
  SKIP_WITHOUT_GPU();
  const auto [dt, D, backend] = GetParam();
  std::mt19937_64 rng(D + 3);
  const RaggedCase c(dt, D, 4, true, 16, rng);
  const auto& [b, q, k, v, ref, spec, task] = c;
  const int64_t rows = c.rows(), Hq = task.num_qo_heads;
  auto dk = to_device(k), dv = to_device(v), dq = to_device(q);
  auto run = [&](DType o_dtype) {
    AttentionSpec s = spec;
    s.o_dtype = o_dtype;
    PrefillOptions opt;
    opt.backend = backend;
    Workspace ws = prefill_workspace(s, task, opt);
    BatchPrefill pre(s, task, ws, opt);
    pre.plan_ragged(b.qo, b.kv_tokens);
    return run_and_fetch([&](const TensorView& o, const TensorView& lse) { pre.run_ragged(dq.view, dk.view, dv.view, o, lse); },
                         o_dtype, rows, Hq, D);
  };
  const Out o32 = run(DType::kFloat32), o16 = run(dt);
  EXPECT_CLOSE(compare(to_doubles(o32.o.view), ref.o), dt);
  EXPECT_TRUE(bitwise_equal(o32.lse, o16.lse));
  HostTensor rounded = make_host(dt, {rows, Hq, D});
  for (int64_t i = 0; i < rounded.view.numel(); ++i) rounded.set(static_cast<size_t>(i), o32.o.get(static_cast<size_t>(i)));
  EXPECT_TRUE(bitwise_equal(rounded, o16.o));
}

INSTANTIATE_TEST_SUITE_P(All, PrefillF32Out,
                         ::testing::Combine(::testing::Values(DType::kFloat16, DType::kBFloat16), ::testing::Values(64, 128, 256),
                                            ::testing::Values(PrefillBackend::kAuto, PrefillBackend::kFA2)));

// Builds a wrapper for c with opt, plans it, hands it to check, and runs it
// `runs` times.
template <typename Check>
std::vector<Out> run_ragged_case(const RaggedCase& c, const PrefillOptions& opt, const DeviceTensor& dq,
                                 const DeviceTensor& dk, const DeviceTensor& dv, int runs, Check check) {
  Workspace ws = prefill_workspace(c.spec, c.task, opt);
  BatchPrefill pre(c.spec, c.task, ws, opt);
  pre.plan_ragged(c.b.qo, c.b.kv_tokens);
  check(pre);
  std::vector<Out> outs;
  for (int i = 0; i < runs; ++i)
    outs.push_back(run_and_fetch(
        [&](const TensorView& o, const TensorView& lse) { pre.run_ragged(dq.view, dk.view, dv.view, o, lse); },
        c.spec.q_dtype, c.rows(), c.task.num_qo_heads, c.spec.head_dim));
  return outs;
}

// The same run on the keys of ragged k / v ([N, Hkv, D] on the GPU) seen as
// pages of one token, in order: the Hopper producer then gathers K / V
// through the page table with cp.async instead of the TMA.
Out run_one_token_pages(const AttentionSpec& spec, TaskInfo task, const PrefillOptions& opt,
                        std::span<const int32_t> qo, std::span<const int32_t> kv, const DeviceTensor& dq,
                        const DeviceTensor& dk, const DeviceTensor& dv) {
  const int64_t N = kv.back(), Hkv = task.num_kv_heads, D = spec.head_dim;
  std::vector<int32_t> indices(N), last;
  std::iota(indices.begin(), indices.end(), 0);
  for (size_t r = 0; r + 1 < kv.size(); ++r) last.push_back(kv[r + 1] > kv[r] ? 1 : 0);
  task.page_size = 1;
  task.max_pages = std::max<int64_t>(N, 1);
  Workspace ws = prefill_workspace(spec, task, opt);
  BatchPrefill pre(spec, task, ws, opt);
  pre.plan_paged(qo, kv, indices, last);
  TensorView kp = dk.view, vp = dv.view;
  kp.shape = vp.shape = {N, 1, Hkv, D};
  kp.strides = vp.strides = {Hkv * D, Hkv * D, D, 1};
  return run_and_fetch([&](const TensorView& o, const TensorView& lse) {
    pre.run(dq.view, PagedKVStorage(kp, vp, KVLayout::kNHD), o, lse);
  }, spec.q_dtype, qo.back(), task.num_qo_heads, D);
}

// Contiguous KV on the Hopper kernel is loaded by the TMA (tensor maps, 64 x
// CTA_KV boxes, rows past a chunk read from the neighbouring keys and masked);
// the cp.async gather of the same keys as one-token pages must give the very
// same bits, and both must match the reference.
class PrefillTma : public ::testing::TestWithParam<std::tuple<DType, int, bool, int, int>> {};

TEST_P(PrefillTma, SameBitsAsCpAsyncAndMatchesReference) {
  SKIP_WITHOUT_GPU();
  if (jit::Arch::of_device(0).major != 9) GTEST_SKIP() << "skipped: the TMA path is the Hopper kernel's";
  const auto [dt, D, causal, group, cta_q] = GetParam();
  std::mt19937_64 rng(D + group * 7 + cta_q);
  const RaggedCase c(dt, D, group, causal, 12, rng);
  const auto& [b, q, k, v, ref, spec, task] = c;
  PrefillOptions opt;
  opt.cta_q = cta_q;
  opt.backend = PrefillBackend::kFA3;
  auto dk = to_device(k), dv = to_device(v), dq = to_device(q);
  const Out with_tma = run_ragged_case(c, opt, dq, dk, dv, 1, [](const BatchPrefill&) {})[0];
  const Out gathered = run_one_token_pages(spec, task, opt, b.qo, b.kv_tokens, dq, dk, dv);
  EXPECT_CLOSE(compare(to_doubles(with_tma.o.view), ref.o), dt);
  EXPECT_CLOSE(compare(to_doubles(with_tma.lse.view), ref.lse), DType::kFloat16);
  EXPECT_TRUE(bitwise_equal(with_tma.o, gathered.o));
  EXPECT_TRUE(bitwise_equal(with_tma.lse, gathered.lse));
}

INSTANTIATE_TEST_SUITE_P(All, PrefillTma,
                         ::testing::Combine(::testing::Values(DType::kFloat16, DType::kBFloat16), ::testing::Values(64, 128, 256),
                                            ::testing::Bool(), ::testing::Values(1, 4), ::testing::Values(64, 128)));

// CTA pairs (PrefillOptions::cluster = 2): clusters of two CTAs take 256-row
// tiles, 128 rows each, and receive each K / V tile by one TMA multicast.
// Must match the reference and repeat its bits (split tiles merge per rank).
// max_sms 4 splits every long request into chunks.
class PrefillPairs : public ::testing::TestWithParam<std::tuple<DType, int, bool, int, int>> {};

TEST_P(PrefillPairs, MatchReferenceAndRepeat) {
  SKIP_WITHOUT_GPU();
  if (jit::Arch::of_device(0).major != 9) GTEST_SKIP() << "skipped: CTA pairs are the Hopper kernel's";
  const auto [dt, D, causal, group, max_sms] = GetParam();
  std::mt19937_64 rng(D + group * 7 + max_sms);
  const RaggedCase c(dt, D, group, causal, 12, rng);
  const auto& [b, q, k, v, ref, spec, task] = c;
  PrefillOptions opt;
  opt.cta_q = 128;
  opt.backend = PrefillBackend::kFA3;
  opt.cluster = 2;
  opt.max_sms = max_sms;
  auto dk = to_device(k), dv = to_device(v), dq = to_device(q);
  const std::vector<Out> pairs = run_ragged_case(c, opt, dq, dk, dv, 2, [](const BatchPrefill& pre) {
    EXPECT_EQ(pre.cluster(), 2);
    EXPECT_EQ(pre.ctas_per_group() % 2, 0);
  });
  EXPECT_CLOSE(compare(to_doubles(pairs[0].o.view), ref.o), dt);
  EXPECT_CLOSE(compare(to_doubles(pairs[0].lse.view), ref.lse), DType::kFloat16);
  EXPECT_TRUE(bitwise_equal(pairs[0].o, pairs[1].o));
  EXPECT_TRUE(bitwise_equal(pairs[0].lse, pairs[1].lse));
}

INSTANTIATE_TEST_SUITE_P(All, PrefillPairs,
                         ::testing::Combine(::testing::Values(DType::kFloat16, DType::kBFloat16), ::testing::Values(64, 128, 256),
                                            ::testing::Bool(), ::testing::Values(1, 4, 8), ::testing::Values(0, 4)));

// PrefillOptions::tile (experts' override): KV tiles, warp layouts and
// pipeline depths other than the heuristic's reach the kernel and still
// match the reference.
TEST(PrefillTileOverride, MatchesReference) {
  SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(31);
  const RaggedCase c(DType::kFloat16, 128, 4, true, 12, rng);
  const auto& [b, q, k, v, ref, spec, task] = c;
  auto dk = to_device(k), dv = to_device(v), dq = to_device(q);
  struct Case {
    PrefillBackend backend;
    int cta_q;
    PrefillTile tile;
  };
  for (const Case& t : {Case{PrefillBackend::kFA2, 64, {.cta_kv = 32, .stages = 3}},
                        Case{PrefillBackend::kFA2, 32, {.warps_q = 1, .warps_kv = 2}},
                        Case{PrefillBackend::kFA3, 128, {.cta_kv = 64, .stages = 3}}}) {
    if (t.backend == PrefillBackend::kFA3 && jit::Arch::of_device(0).major != 9) continue;
    SCOPED_TRACE("cta_q " + std::to_string(t.cta_q));
    PrefillOptions opt;
    opt.backend = t.backend;
    opt.cta_q = t.cta_q;
    opt.tile = t.tile;
    const PrefillConfig want = catalog::prefill_config(spec, t.cta_q, t.backend == PrefillBackend::kFA3, t.tile);
    const Out out = run_ragged_case(c, opt, dq, dk, dv, 1, [&](const BatchPrefill& pre) {
      EXPECT_EQ(pre.config().cta_kv, want.cta_kv);
      EXPECT_EQ(pre.config().warps_q, want.warps_q);
      EXPECT_EQ(pre.config().warps_kv, want.warps_kv);
      EXPECT_EQ(pre.config().stages, want.stages);
      EXPECT_EQ(pre.kernel_source().entry, catalog::batch_prefill(spec, t.cta_q, want.hopper, 1, t.tile).entry);
    })[0];
    EXPECT_CLOSE(compare(to_doubles(out.o.view), ref.o), DType::kFloat16);
    EXPECT_CLOSE(compare(to_doubles(out.lse.view), ref.lse), DType::kFloat16);
  }
}

// The Hopper kernel's Q tiles by the TMA (a rank-4 map: the group's heads x
// CTA_Q / group tokens; rows past a request's queries read the next
// request's and are never stored) must give the bits of the cp.async Q
// gather, and match the reference; q is also taken as a strided view (the
// q slice of a packed qkv tensor), and with paged KV. Long and short
// queries, an empty one. The Q TMA runs where queries fill their tiles on
// average; the same requests followed by many empty ones (which add no work
// and leave the schedule as it is) take the gather instead.
class PrefillQTma : public ::testing::TestWithParam<std::tuple<DType, int, int, int, bool>> {};

TEST_P(PrefillQTma, SameBitsAsCpAsyncAndMatchesReference) {
  SKIP_WITHOUT_GPU();
  if (jit::Arch::of_device(0).major != 9) GTEST_SKIP() << "skipped: the TMA path is the Hopper kernel's";
  const auto [dt, D, group, cta_q, strided] = GetParam();
  std::mt19937_64 rng(D * 3 + group * 7 + cta_q + strided);
  const int64_t Hkv = 2, Hq = Hkv * group;
  const std::vector<int32_t> q_len{130, 0, 257, 5, 64, 1, 600}, kv_len{200, 7, 257, 300, 64, 90, 640};
  std::vector<int32_t> qo{0}, kv{0};
  for (size_t r = 0; r < q_len.size(); ++r) {
    qo.push_back(qo.back() + q_len[r]);
    kv.push_back(kv.back() + kv_len[r]);
  }
  const int64_t rows = qo.back();
  ASSERT_GE(rows, static_cast<int64_t>(q_len.size()) * (cta_q / group));  // the Q tiles fill on average
  HostTensor q = strided ? make_host_strided(dt, {rows, Hq, D}, {3 * Hq * D, D, 1}) : make_host(dt, {rows, Hq, D});
  HostTensor k = make_host(dt, {kv.back(), Hkv, D}), v = make_host(dt, {kv.back(), Hkv, D});
  fill_random(q, rng(), -2.f, 2.f);
  fill_random(k, rng());
  fill_random(v, rng());
  reference::Options ro;
  ro.causal = true;
  const reference::Result ref = reference::attention_ragged(q.view, RaggedIndex(qo), k.view, v.view, RaggedIndex(kv), ro);
  const AttentionSpec spec{variants::causal(), dt, dt, dt, static_cast<int>(D)};
  const int empties = 256;  // (7 + 256) x 8 > 1057 rows: below one row per tile slot
  TaskInfo task{static_cast<int>(Hq), static_cast<int>(Hkv), 1, KVLayout::kNHD, 7 + empties, 1};
  task.max_total_q = 2048;
  PrefillOptions opt;
  opt.cta_q = cta_q;
  opt.backend = PrefillBackend::kFA3;
  auto dk = to_device(k), dv = to_device(v), dq = to_device(q);
  auto run_ragged = [&](const std::vector<int32_t>& qo_, const std::vector<int32_t>& kv_) {
    Workspace ws = prefill_workspace(spec, task, opt);
    BatchPrefill pre(spec, task, ws, opt);
    pre.plan_ragged(qo_, kv_);
    return run_and_fetch([&](const TensorView& o, const TensorView& lse) { pre.run_ragged(dq.view, dk.view, dv.view, o, lse); },
                         dt, rows, Hq, D);
  };
  std::vector<int32_t> qo_e = qo, kv_e = kv;
  qo_e.resize(qo.size() + empties, qo.back());
  kv_e.resize(kv.size() + empties, kv.back());
  const Out both = run_ragged(qo, kv), gathered = run_ragged(qo_e, kv_e);
  EXPECT_CLOSE(compare(to_doubles(both.o.view), ref.o), dt);
  EXPECT_CLOSE(compare(to_doubles(both.lse.view), ref.lse), DType::kFloat16);
  EXPECT_TRUE(bitwise_equal(both.o, gathered.o));
  EXPECT_TRUE(bitwise_equal(both.lse, gathered.lse));
  // Paged KV (the producer gathers K / V through the page table) with Q by the TMA.
  const Out paged = run_one_token_pages(spec, task, opt, qo, kv, dq, dk, dv);
  EXPECT_CLOSE(compare(to_doubles(paged.o.view), ref.o), dt);
  EXPECT_CLOSE(compare(to_doubles(paged.lse.view), ref.lse), DType::kFloat16);
  EXPECT_TRUE(bitwise_equal(both.o, paged.o));
}

INSTANTIATE_TEST_SUITE_P(All, PrefillQTma,
                         ::testing::Combine(::testing::Values(DType::kFloat16, DType::kBFloat16), ::testing::Values(64, 128, 256),
                                            ::testing::Values(1, 4, 8), ::testing::Values(64, 128), ::testing::Bool()));

// One wrapper planned for ragged, then paged, then ragged KV again (the
// Hopper kernel takes TMA loads for the one and cp.async gathers for the
// other): every run must match the reference, and the two ragged runs give
// the same bits. One SM: every CTA runs many work items back to back, empty
// ones included, so the pipelines' ring positions carry across items.
TEST(PrefillSourceSwitch, RaggedPagedRaggedMatchReference) {
  SKIP_WITHOUT_GPU();
  for (const int cta_q : {64, 128}) {
    SCOPED_TRACE("cta_q " + std::to_string(cta_q));
    std::mt19937_64 rng(99 + cta_q);
    const DType dt = DType::kFloat16;
    RaggedCase c(dt, 128, 4, true, 10, rng);
    const int64_t rows = c.rows(), Hq = c.task.num_qo_heads, Hkv = c.task.num_kv_heads, D = 128;
    const int32_t total_kv = c.b.kv_tokens.back();
    TaskInfo task = c.task;
    task.max_pages = total_kv;
    PrefillOptions opt;
    opt.cta_q = cta_q;
    opt.max_sms = 1;
    Workspace ws = prefill_workspace(c.spec, task, opt);
    BatchPrefill pre(c.spec, task, ws, opt);
    auto dk = to_device(c.k), dv = to_device(c.v), dq = to_device(c.q);
    auto ragged = [&] {
      pre.plan_ragged(c.b.qo, c.b.kv_tokens);
      return run_and_fetch([&](const TensorView& o, const TensorView& lse) { pre.run_ragged(dq.view, dk.view, dv.view, o, lse); },
                           dt, rows, Hq, D);
    };
    // Page size 1 over the same tensors: page i is token i.
    std::vector<int32_t> indices(total_kv), last(c.b.kv_tokens.size() - 1, 1);
    std::iota(indices.begin(), indices.end(), 0);
    for (size_t i = 0; i + 1 < c.b.kv_tokens.size(); ++i)
      if (c.b.kv_tokens[i + 1] == c.b.kv_tokens[i]) last[i] = 0;
    TensorView kp = dk.view, vp = dv.view;
    kp.shape = vp.shape = {total_kv, 1, Hkv, D};
    kp.strides = vp.strides = {Hkv * D, Hkv * D, D, 1};
    const PagedKVStorage storage(kp, vp, KVLayout::kNHD);
    Out first = ragged();
    pre.plan_paged(c.b.qo, c.b.kv_tokens, indices, last);
    Out paged = run_and_fetch([&](const TensorView& o, const TensorView& lse) { pre.run(dq.view, storage, o, lse); }, dt,
                              rows, Hq, D);
    Out again = ragged();
    for (const Out* out : {&first, &paged, &again}) {
      EXPECT_CLOSE(compare(to_doubles(out->o.view), c.ref.o), dt);
      EXPECT_CLOSE(compare(to_doubles(out->lse.view), c.ref.lse), DType::kFloat16);
    }
    EXPECT_TRUE(bitwise_equal(first.o, again.o));
  }
}

class PrefillBsr : public ::testing::TestWithParam<std::tuple<int, int>> {};

TEST_P(PrefillBsr, MatchesReference) {
  SKIP_WITHOUT_GPU();
  const auto [Br, Bc] = GetParam();
  const DType dt = DType::kFloat16;
  const int64_t D = 128, Hkv = 2, Hq = 8, R = 6, C = 64 / Bc + 5;
  const int64_t M = R * Br, N = C * Bc;
  std::mt19937_64 rng(Br * 100 + Bc);
  std::vector<int32_t> indptr{0}, indices, last;
  std::vector<int32_t> cols(C);
  int64_t n = 0;
  for (int64_t r = 0; r < R; ++r) {
    if (r < 4) {  // rows 4 and 5 repeat row 3: plan_bsr merges them into one request of 3 Br queries
      std::iota(cols.begin(), cols.end(), 0);
      std::shuffle(cols.begin(), cols.end(), rng);
      n = r == 2 ? 0 : 1 + static_cast<int64_t>(rng() % C);  // row 2 is empty
    }
    indices.insert(indices.end(), cols.begin(), cols.begin() + n);
    indptr.push_back(static_cast<int32_t>(indices.size()));
    last.push_back(r < 4 ? (n ? 1 + static_cast<int32_t>(rng() % Bc) : 0) : last[3]);
  }
  BSRMatrix bsr(M, N, Br, Bc, indptr, indices, last);
  HostTensor k = make_host(dt, {N, Hkv, D}), v = k, q = make_host(dt, {M, Hq, D});
  fill_random(k, 1);
  fill_random(v, 2);
  fill_random(q, 3, -2.f, 2.f);
  auto ref = reference::attention_bsr(q.view, bsr, k.view, v.view);
  const AttentionSpec spec{variants::standard(), dt, dt, dt, D};
  TaskInfo task{static_cast<int>(Hq), static_cast<int>(Hkv), Bc, KVLayout::kNHD, R, static_cast<int64_t>(indices.size()) + 1};
  task.max_total_q = M;
  Workspace ws = prefill_workspace(spec, task, {});
  BatchPrefill pre(spec, task, ws);
  pre.plan_bsr(bsr);
  auto dk = to_device(k), dv = to_device(v), dq = to_device(q);
  TensorView kp = dk.view, vp = dv.view;  // [N, H, D] viewed as pages [C, Bc, H, D]
  kp.shape = vp.shape = {C, Bc, Hkv, D};
  kp.strides = vp.strides = {Bc * Hkv * D, Hkv * D, D, 1};
  Out a = run_and_fetch([&](const TensorView& o, const TensorView& lse) {
    pre.run(dq.view, PagedKVStorage(kp, vp, KVLayout::kNHD), o, lse);
  }, dt, M, Hq, D);
  EXPECT_CLOSE(compare(to_doubles(a.o.view), ref.o), dt);
  EXPECT_CLOSE(compare(to_doubles(a.lse.view), ref.lse), DType::kFloat16);
}

INSTANTIATE_TEST_SUITE_P(All, PrefillBsr, ::testing::Combine(::testing::Values(1, 4, 16), ::testing::Values(1, 4, 16)));

}  // namespace

// Forcing the Hopper template where it does not apply is an error naming the
// option, raised at the first plan (where the GPU and query tile are known).
TEST(PrefillBackendErrors, Fa3RejectsUnsupportedShapes) {
  SKIP_WITHOUT_GPU();
  const bool sm90 = jit::Arch::of_device(0).major == 9;
  const DType dt = DType::kFloat16;
  const std::pair<int, int> shapes[] = {{128, 128}, {256, 128}, {256, 64}, {128, 32}, {256, 16}};  // head_dim, cta_q
  for (const auto& [D, cta_q] : shapes) {
    SCOPED_TRACE("head_dim " + std::to_string(D) + ", cta_q " + std::to_string(cta_q));
    const AttentionSpec spec{variants::standard(), dt, dt, dt, D};
    TaskInfo task{4, 4, 16, KVLayout::kNHD, 4, 64};
    task.max_total_q = 512;
    PrefillOptions opt;
    opt.backend = PrefillBackend::kFA3;
    opt.cta_q = cta_q;
    Workspace ws = prefill_workspace(spec, task, opt);
    BatchPrefill pre(spec, task, ws, opt);
    const std::vector<int32_t> qo{0, 200}, kv{0, 13}, idx(13), last{16};
    if (sm90 && cta_q >= 64) {
      EXPECT_NO_THROW(pre.plan_paged(qo, kv, idx, last));
    } else {
      EXPECT_THROW(
          {
            try {
              pre.plan_paged(qo, kv, idx, last);
            } catch (const InvalidArgument& e) {
              EXPECT_NE(std::string(e.what()).find("backend"), std::string::npos);
              throw;
            }
          },
          InvalidArgument);
    }
  }
}
