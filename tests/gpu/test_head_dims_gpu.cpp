// Head dims beyond 64 / 128 / 256 on the GPU against the CPU reference:
// BatchPrefill with head_dim_qk 192 / head_dim_vo 128 (separate K and V of
// different widths, V at strides of its own) and head dim 512 (the 512 / 256
// kernel launched twice), ragged and paged (page sizes 1 / 16) KV, causal or
// not, group sizes 1 / 4 / 8, fp16 / bf16, with a request long enough to split
// its KV; and BatchDecode at head dim 512 with use_tensor_cores false (routed
// to the tensor cores) and true. Outputs are poisoned with NaN first; a second
// run repeats the bits.
#include <gtest/gtest.h>

#include <numeric>
#include <random>

#include "decode_util.hpp"
#include "prefill_util.hpp"
#include "tessera/api/prefill.hpp"
#include "tessera/reference/attention.hpp"

using namespace tessera;
using namespace tessera::test;

namespace {

// Requests with no queries, no keys, one query, q_len == kv_len, chunked
// prefill, q_len > kv_len, and a long KV the planner splits over CTAs.
const std::vector<int32_t> kQLens = {0, 5, 1, 37, 100, 9, 40};
const std::vector<int32_t> kKvLens = {10, 0, 300, 37, 190, 3, 2100};

// (dtype, head_dim_qk, head_dim_vo (0: same), page size (0: ragged), causal, group)
using Param = std::tuple<DType, int, int, int, bool, int>;
class HeadDimsPrefillGpu : public ::testing::TestWithParam<Param> {};

TEST_P(HeadDimsPrefillGpu, MatchesReferenceAndRepeats) {
  SKIP_WITHOUT_GPU();
  const auto [dt, qk, vo, page_size, causal, group] = GetParam();
  const int64_t DV = vo ? vo : qk, Hkv = 2, Hq = Hkv * group;
  std::mt19937_64 rng(qk + DV + page_size * 7 + group);
  std::vector<int32_t> qo{0}, kv_tokens{0};
  for (size_t r = 0; r < kQLens.size(); ++r) {
    qo.push_back(qo.back() + kQLens[r]);
    kv_tokens.push_back(kv_tokens.back() + kKvLens[r]);
  }
  const int64_t rows = qo.back();
  HostTensor q = make_host(dt, {rows, Hq, qk});
  fill_random(q, rng(), -2.f, 2.f);
  reference::Options ro;
  ro.causal = causal;
  const AttentionSpec spec{causal ? variants::causal() : variants::standard(), dt, dt, dt, qk, vo};
  PrefillOptions opt;  // backend auto: the FA2 template (the Hopper one takes neither shape)
  auto dq = to_device(q);
  if (page_size == 0) {
    HostTensor k = make_host(dt, {kv_tokens.back(), Hkv, qk}), v = make_host(dt, {kv_tokens.back(), Hkv, DV});
    fill_random(k, rng());
    fill_random(v, rng());
    const auto ref = reference::attention_ragged(q.view, RaggedIndex(qo), k.view, v.view, RaggedIndex(kv_tokens), ro);
    TaskInfo task{static_cast<int>(Hq), static_cast<int>(Hkv), 1, KVLayout::kNHD, 16, kv_tokens.back()};
    task.max_total_q = 1024;
    Workspace ws = prefill_workspace(spec, task, opt);
    BatchPrefill pre(spec, task, ws, opt);
    pre.plan_ragged(qo, kv_tokens);
    EXPECT_FALSE(pre.config().hopper);
    EXPECT_EQ(pre.config().vo_split, qk == 512 ? 2 : 1);
    EXPECT_GT(pre.last_plan().num_split, 0) << "the long request must be split";
    auto dk = to_device(k), dv = to_device(v);
    auto run = [&](const TensorView& o, const TensorView& lse) { pre.run_ragged(dq.view, dk.view, dv.view, o, lse); };
    Out a = run_and_fetch(run, dt, rows, Hq, DV), b = run_and_fetch(run, dt, rows, Hq, DV);
    EXPECT_CLOSE(compare(to_doubles(a.o.view), ref.o), dt);
    EXPECT_CLOSE(compare(to_doubles(a.lse.view), ref.lse), DType::kFloat16);
    EXPECT_TRUE(bitwise_equal(a.o, b.o));
    EXPECT_TRUE(bitwise_equal(a.lse, b.lse));
    return;
  }
  // Paged: K [pool, page, Hkv, qk] and V [pool, page, Hkv, DV] over shuffled pages.
  const Table t = make_table(kKvLens, page_size, pages_needed(kKvLens, page_size) + 3, rng);
  HostTensor k = make_host(dt, {t.num_pages, page_size, Hkv, qk}), v = make_host(dt, {t.num_pages, page_size, Hkv, DV});
  fill_random(k, rng());
  fill_random(v, rng());
  const PagedKVCache cache(PagedKVStorage(k.view, v.view, KVLayout::kNHD),
                           PageTable(t.indptr, t.indices, t.last, page_size, t.num_pages));
  const auto ref = reference::attention_paged(q.view, RaggedIndex(qo), cache, ro);
  TaskInfo task{static_cast<int>(Hq), static_cast<int>(Hkv), page_size, KVLayout::kNHD, 16, 2 * t.num_pages};
  task.max_total_q = 1024;
  Workspace ws = prefill_workspace(spec, task, opt);
  BatchPrefill pre(spec, task, ws, opt);
  pre.plan_paged(qo, t.indptr, t.indices, t.last);
  auto dk = to_device(k), dv = to_device(v);
  const PagedKVStorage storage(dk.view, dv.view, KVLayout::kNHD);
  auto run = [&](const TensorView& o, const TensorView& lse) { pre.run(dq.view, storage, o, lse); };
  Out a = run_and_fetch(run, dt, rows, Hq, DV), b = run_and_fetch(run, dt, rows, Hq, DV);
  EXPECT_CLOSE(compare(to_doubles(a.o.view), ref.o), dt);
  EXPECT_CLOSE(compare(to_doubles(a.lse.view), ref.lse), DType::kFloat16);
  EXPECT_TRUE(bitwise_equal(a.o, b.o));
  EXPECT_TRUE(bitwise_equal(a.lse, b.lse));
}

INSTANTIATE_TEST_SUITE_P(Mla, HeadDimsPrefillGpu,
                         ::testing::Combine(::testing::Values(DType::kFloat16, DType::kBFloat16), ::testing::Values(192),
                                            ::testing::Values(128), ::testing::Values(0, 1, 16), ::testing::Bool(),
                                            ::testing::Values(1, 4, 8)));
INSTANTIATE_TEST_SUITE_P(HeadDim512, HeadDimsPrefillGpu,
                         ::testing::Combine(::testing::Values(DType::kFloat16, DType::kBFloat16), ::testing::Values(512),
                                            ::testing::Values(0), ::testing::Values(0, 16), ::testing::Bool(),
                                            ::testing::Values(1, 4)));

// Every query tile of the FA2 template at both shapes (the heuristic picks
// one per batch): a pinned cta_q runs each kernel.
TEST(HeadDimsPrefillTilesGpu, EveryQueryTile) {
  SKIP_WITHOUT_GPU();
  for (const auto& [qk, vo] : {std::pair{192, 128}, {512, 0}})
    for (int cta_q : {16, 32, 64, 128}) {
      SCOPED_TRACE(std::to_string(qk) + "/" + std::to_string(vo) + " cta_q " + std::to_string(cta_q));
      const DType dt = DType::kFloat16;
      const int64_t DV = vo ? vo : qk, Hkv = 2, Hq = 8;
      const std::vector<int32_t> qo{0, 50, 51, 180}, kv{0, 700, 1700, 1830};
      const auto [q, k, v, ref] = causal_ragged_case(dt, qo, kv, Hq, Hkv, qk, DV, cta_q);
      const AttentionSpec spec{variants::causal(), dt, dt, dt, qk, vo};
      TaskInfo task{static_cast<int>(Hq), static_cast<int>(Hkv), 1, KVLayout::kNHD, 4, kv.back()};
      task.max_total_q = qo.back();
      PrefillOptions opt;
      opt.cta_q = cta_q;
      Workspace ws = prefill_workspace(spec, task, opt);
      BatchPrefill pre(spec, task, ws, opt);
      pre.plan_ragged(qo, kv);
      auto dq = to_device(q), dk = to_device(k), dv = to_device(v);
      Out a = run_and_fetch([&](const TensorView& o, const TensorView& lse) { pre.run_ragged(dq.view, dk.view, dv.view, o, lse); },
                            dt, qo.back(), Hq, DV);
      EXPECT_CLOSE(compare(to_doubles(a.o.view), ref.o), dt);
      EXPECT_CLOSE(compare(to_doubles(a.lse.view), ref.lse), DType::kFloat16);
    }
}

// Head dim 512 decode: either flag runs the tensor-core path.
class HeadDim512DecodeGpu : public ::testing::TestWithParam<std::tuple<DType, int, bool>> {};

TEST_P(HeadDim512DecodeGpu, MatchesReferenceAndIsDeterministic) {
  SKIP_WITHOUT_GPU();
  const auto [dt, page_size, use_tensor_cores] = GetParam();
  const DecodeCase c{dt, 512, 4, page_size, KVLayout::kNHD};
  std::mt19937_64 rng(page_size + (use_tensor_cores ? 100 : 0));
  auto [t, p, ref, spec, task] = make_sweep_problem(c, {1, 97, 0, 3001, 16, 17}, rng);
  DecodeOptions opt;
  opt.use_tensor_cores = use_tensor_cores;
  Workspace ws = decode_workspace(spec, task, opt);
  BatchDecode dec(spec, task, ws, opt);
  dec.plan(t.indptr, t.indices, t.last);
  ASSERT_NE(dec.tensor_core_prefill(), nullptr);
  check_matches_and_deterministic(dec, p, t, c, ref);
}

INSTANTIATE_TEST_SUITE_P(All, HeadDim512DecodeGpu,
                         ::testing::Combine(::testing::Values(DType::kFloat16, DType::kBFloat16), ::testing::Values(1, 16),
                                            ::testing::Bool()));

// backend fa3 takes neither shape: on sm_90 the plan names head_dim.
TEST(HeadDimsPrefillGpuErrors, Fa3NamesHeadDim) {
  SKIP_WITHOUT_GPU();
  if (jit::Arch::of_device(0).major != 9) GTEST_SKIP() << "skipped: the Hopper kernel is sm_90's";
  for (const auto& [qk, vo] : {std::pair{192, 128}, {512, 0}}) {
    const AttentionSpec spec{variants::standard(), DType::kFloat16, DType::kFloat16, DType::kFloat16, qk, vo};
    TaskInfo task{8, 2, 1, KVLayout::kNHD, 2, 64};
    task.max_total_q = 64;
    PrefillOptions opt;
    opt.backend = PrefillBackend::kFA3;
    Workspace ws = prefill_workspace(spec, task, opt);
    BatchPrefill pre(spec, task, ws, opt);
    const std::vector<int32_t> qo{0, 64}, kv{0, 64};
    EXPECT_THROW_MSG(pre.plan_ragged(qo, kv), InvalidArgument, "head_dim");
  }
}

}  // namespace
