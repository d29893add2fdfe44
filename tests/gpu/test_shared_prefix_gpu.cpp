// Automatic shared prefixes (DecodeOptions / PrefillOptions::shared_prefix):
// a flat page table whose requests share full pages in runs, planned by the
// wrapper itself into a unique and a shared level, against the CPU reference
// over each request's tokens. Both decode kernels (tensor cores, CUDA cores),
// page sizes 1 and 16, fp16 / bf16, groups below min_shared_tokens (no
// group), a member with no pages of its own, causal prefill whose queries cut
// a member's shared pages; stats; the shared level re-planned only when its
// groups change; bitwise repeat; CUDA-graph replay after re-plans with and
// without groups; what the option refuses, by name.
#include <gtest/gtest.h>

#include <random>

#include "cascade_util.hpp"
#include "decode_util.hpp"
#include "prefill_util.hpp"
#include "tessera/api/decode.hpp"
#include "test_util.hpp"

using namespace tessera;
using namespace tessera::test;

namespace {

constexpr int kMinTokens = 64;
// Groups of any size and saving.
constexpr AutoSharedPrefix kEveryGroup{true, kMinTokens, 2, 0};

// Nine requests in runs: {0,1,2} share 320 tokens, {3} none, {4,5} 48 (under
// kMinTokens: no group), {6,7,8} 160 (request 6 has no tokens of its own).
// Shared tokens are whole pages of 16 (a flat table's pages are full but the last).
CascadeStep decode_step() {
  CascadeStep s;
  s.q_len.assign(9, 1);
  s.groups = {{3, 1, 2, 3}, {1, 1, 1, 1, 1, 1, 1, 1, 1}};
  s.tokens = {{320, 0, 48, 160}, {5, 70, 17, 33, 1, 64, 0, 37, 5}};
  return s;
}


void expect_matches(const Out& got, const reference::Result& ref, DType dt) {
  EXPECT_CLOSE(compare(to_doubles(got.o.view), ref.o), dt);
  EXPECT_CLOSE(compare(to_doubles(got.lse.view), ref.lse), DType::kFloat16);
}

// Two runs on poisoned outputs: against the reference, then bit for bit the same. Returns the first.
template <typename RunFn>
Out matches_and_repeats(RunFn run, const reference::Result& ref, DType dt, int64_t rows, int64_t hq, int64_t d) {
  Out a = run_and_fetch(run, dt, rows, hq, d);
  expect_matches(a, ref, dt);
  Out b = run_and_fetch(run, dt, rows, hq, d);
  EXPECT_TRUE(bitwise_equal(a.o, b.o));
  EXPECT_TRUE(bitwise_equal(a.lse, b.lse));
  return a;
}

}  // namespace

class SharedPrefixDecode : public ::testing::TestWithParam<std::tuple<DType, int, bool>> {};

TEST_P(SharedPrefixDecode, MatchesFlatReference) {
  SKIP_WITHOUT_GPU();
  const auto [dt, P, cuda_cores] = GetParam();
  const int D = 128;
  const int64_t Hkv = 2, Hq = 8;
  std::mt19937_64 rng(P + 7 * cuda_cores + 31 * static_cast<int>(dt));
  CascadeProblem prob(decode_step(), dt, D, Hkv, Hq, P, rng);
  const LevelArrays flat = prob.flat_table(P);
  const auto ref = prob.reference(false);
  // max_pages bounds the table's entries: a group's shared pages count once per member.
  TaskInfo task{static_cast<int>(Hq), static_cast<int>(Hkv), P, KVLayout::kNHD, 16,
                static_cast<int64_t>(flat.indices.size())};
  DecodeOptions opt;
  opt.cuda_cores = cuda_cores;
  opt.shared_prefix = kEveryGroup;
  const AttentionSpec spec{variants::standard(), dt, dt, dt, D};
  Workspace ws = decode_workspace(spec, task, opt);
  BatchDecode dec(spec, task, ws, opt);
  EXPECT_EQ(dec.tensor_core_prefill() == nullptr, cuda_cores);
  dec.plan(flat.kv, flat.indices, flat.last);
  const SharedPrefixStats* st = dec.shared_prefix_stats();
  ASSERT_NE(st, nullptr);
  EXPECT_EQ(st->groups, 2);
  EXPECT_EQ(st->requests_in_groups, 6);
  EXPECT_EQ(st->saved_pages, 2 * (320 / P) + 2 * (160 / P));
  EXPECT_TRUE(st->replanned);
  auto dk = to_device(prob.k), dv = to_device(prob.v), dq = to_device(prob.q);
  PagedKVStorage kv(dk.view, dv.view, KVLayout::kNHD);
  const int64_t rows = prob.qo.back();
  auto run = [&](const TensorView& o, const TensorView& lse) { dec.run(dq.view, kv, o, lse); };
  const Out a = matches_and_repeats(run, ref, dt, rows, Hq, D);
  Out c = run_and_fetch([&](const TensorView& o, const TensorView&) { dec.run(dq.view, kv, o, TensorView()); }, dt,
                        rows, Hq, D);
  EXPECT_TRUE(bitwise_equal(a.o, c.o));
  // The same groups again: the shared level keeps its plan, the output its bits.
  dec.plan(flat.kv, flat.indices, flat.last);
  EXPECT_FALSE(dec.shared_prefix_stats()->replanned);
  Out d = run_and_fetch(run, dt, rows, Hq, D);
  EXPECT_TRUE(bitwise_equal(a.o, d.o));
  // Limits the groups miss (3 members each, 960 tokens saved): found, left on the unique level.
  DecodeOptions limits;
  limits.cuda_cores = cuda_cores;
  limits.shared_prefix = {true, kMinTokens, 3, 32768};
  Workspace lws = decode_workspace(spec, task, limits);
  BatchDecode whole(spec, task, lws, limits);
  whole.plan(flat.kv, flat.indices, flat.last);
  EXPECT_EQ(whole.shared_prefix_stats()->groups, 0);
  EXPECT_EQ(whole.shared_prefix_stats()->groups_found, 2);
  EXPECT_EQ(whole.shared_prefix_stats()->saved_pages, 0);
  expect_matches(run_and_fetch([&](const TensorView& o, const TensorView& lse) { whole.run(dq.view, kv, o, lse); },
                               dt, rows, Hq, D),
                 ref, dt);
}

INSTANTIATE_TEST_SUITE_P(All, SharedPrefixDecode,
                         ::testing::Combine(::testing::Values(DType::kFloat16, DType::kBFloat16), ::testing::Values(1, 16),
                                            ::testing::Bool()));

// One run() captured in a CUDA graph, replayed after plans with groups,
// without any, and with other groups (same batch, as an engine's bucket).
TEST(SharedPrefixDecodeGraph, ReplayAfterReplansMatchesReference) {
  SKIP_WITHOUT_GPU();
  const DType dt = DType::kFloat16;
  const int D = 128, P = 16;
  const int64_t Hkv = 2, Hq = 8, batch = 6;
  std::mt19937_64 rng(11);
  CascadeStep grouped, alone, regrouped;
  grouped.q_len = alone.q_len = regrouped.q_len = std::vector<int32_t>(batch, 1);
  grouped.groups = {{6}, {1, 1, 1, 1, 1, 1}};
  grouped.tokens = {{256}, {3, 40, 17, 100, 1, 64}};
  alone.groups = {{1, 1, 1, 1, 1, 1}, {1, 1, 1, 1, 1, 1}};
  alone.tokens = {{0, 0, 0, 0, 0, 0}, {300, 41, 18, 700, 5, 65}};
  regrouped.groups = {{2, 4}, {1, 1, 1, 1, 1, 1}};
  regrouped.tokens = {{128, 512}, {4, 9, 18, 101, 5, 65}};
  const CascadeProblem probs[] = {{grouped, dt, D, Hkv, Hq, P, rng}, {alone, dt, D, Hkv, Hq, P, rng},
                                  {regrouped, dt, D, Hkv, Hq, P, rng}};
  int64_t pool = 0, entries = 0;
  for (const auto& p : probs) {
    pool = std::max(pool, p.pool);
    entries = std::max(entries, static_cast<int64_t>(p.flat_table(P).indices.size()));
  }
  TaskInfo task{static_cast<int>(Hq), static_cast<int>(Hkv), P, KVLayout::kNHD, batch, entries};
  DecodeOptions opt;
  opt.shared_prefix = kEveryGroup;
  const AttentionSpec spec{variants::standard(), dt, dt, dt, D};
  Workspace ws = decode_workspace(spec, task, opt);
  BatchDecode dec(spec, task, ws, opt);
  cudaStream_t stream;
  TESSERA_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  HostTensor k = make_host(dt, {pool, P, Hkv, D}), v = k, q = make_host(dt, {batch, Hq, D});
  HostTensor o = make_host(dt, {batch, Hq, D}), lse = make_host(DType::kFloat32, {batch, Hq});
  auto dk = to_device(k), dv = to_device(v), dq = to_device(q), d_o = poisoned_like(o), dlse = poisoned_like(lse);
  PagedKVStorage kv(dk.view, dv.view, KVLayout::kNHD);
  const LevelArrays first = probs[0].flat_table(P);
  dec.plan(first.kv, first.indices, first.last, stream);
  dec.run(dq.view, kv, d_o.view, dlse.view, stream);  // loads the kernels outside the capture
  TESSERA_CUDA_CHECK(cudaStreamSynchronize(stream));
  const CapturedGraph graph(stream, [&] { dec.run(dq.view, kv, d_o.view, dlse.view, stream); });
  const int32_t groups[] = {1, 0, 2};
  for (int i : {0, 1, 2, 0}) {
    const CascadeProblem& p = probs[i];
    const LevelArrays flat = p.flat_table(P);
    dec.plan(flat.kv, flat.indices, flat.last, stream);
    EXPECT_EQ(dec.shared_prefix_stats()->groups, groups[i]);
    TESSERA_CUDA_CHECK(cudaStreamSynchronize(stream));
    dk.buf.upload(p.k.storage.data(), p.k.storage.size());
    dv.buf.upload(p.v.storage.data(), p.v.storage.size());
    dq.buf.upload(p.q.storage.data(), p.q.storage.size());
    d_o.buf.fill(0xFF);
    dlse.buf.fill(0xFF);
    graph.launch(stream);
    TESSERA_CUDA_CHECK(cudaStreamSynchronize(stream));
    expect_matches(Out{to_host(d_o, o), to_host(dlse, lse)}, p.reference(false), dt);
  }
  TESSERA_CUDA_CHECK(cudaStreamDestroy(stream));
}

// Prefill: several queries per request. Causal: request 1's three queries
// over two tokens of its own cut its shared pages by one (a shared key must
// precede every query), and with it its group's.
class SharedPrefixPrefill : public ::testing::TestWithParam<std::tuple<DType, bool>> {};

TEST_P(SharedPrefixPrefill, MatchesFlatReference) {
  SKIP_WITHOUT_GPU();
  const auto [dt, causal] = GetParam();
  const int D = 128, P = 16;
  const int64_t Hkv = 2, Hq = 8;
  std::mt19937_64 rng(3 + causal);
  CascadeStep step;
  step.q_len = {1, 3, 2, 5, 1, 2};
  step.groups = {{3, 1, 2}, {1, 1, 1, 1, 1, 1}};
  step.tokens = {{256, 0, 96}, {5, 2, 40, 130, 12, 7}};
  CascadeProblem prob(step, dt, D, Hkv, Hq, P, rng);
  const LevelArrays flat = prob.flat_table(P);
  const auto ref = prob.reference(causal);
  TaskInfo task{static_cast<int>(Hq), static_cast<int>(Hkv), P, KVLayout::kNHD, 8,
                static_cast<int64_t>(flat.indices.size())};
  task.max_total_q = 32;
  PrefillOptions opt;
  opt.shared_prefix = kEveryGroup;
  const AttentionSpec spec{causal ? variants::causal() : variants::standard(), dt, dt, dt, D};
  Workspace ws = prefill_workspace(spec, task, opt);
  BatchPrefill pre(spec, task, ws, opt);
  pre.plan_paged(flat.qo, flat.kv, flat.indices, flat.last);
  const SharedPrefixStats* st = pre.shared_prefix_stats();
  ASSERT_NE(st, nullptr);
  EXPECT_EQ(st->groups, 2);
  EXPECT_EQ(st->saved_pages, 2 * (256 / P - (causal ? 1 : 0)) + 96 / P);
  auto dk = to_device(prob.k), dv = to_device(prob.v), dq = to_device(prob.q);
  PagedKVStorage kv(dk.view, dv.view, KVLayout::kNHD);
  const int64_t rows = prob.qo.back();
  matches_and_repeats([&](const TensorView& o, const TensorView& lse) { pre.run(dq.view, kv, o, lse); }, ref, dt, rows,
                      Hq, D);
}

INSTANTIATE_TEST_SUITE_P(All, SharedPrefixPrefill,
                         ::testing::Combine(::testing::Values(DType::kFloat16, DType::kBFloat16), ::testing::Bool()));

// What the option refuses once built: other plan forms, merge_lse and scale
// tensors at run(), steps beyond the bounds.
TEST(SharedPrefixErrors, RefusedFormsAreNamed) {
  SKIP_WITHOUT_GPU();
  const DType dt = DType::kFloat16;
  const int D = 128, P = 16;
  std::mt19937_64 rng(5);
  CascadeProblem prob(decode_step(), dt, D, 2, 8, P, rng);
  const LevelArrays flat = prob.flat_table(P);
  TaskInfo task{8, 2, P, KVLayout::kNHD, 9, static_cast<int64_t>(flat.indices.size())};
  DecodeOptions opt;
  opt.shared_prefix = kEveryGroup;
  const AttentionSpec spec{variants::standard(), dt, dt, dt, D};
  Workspace ws = decode_workspace(spec, task, opt);
  BatchDecode dec(spec, task, ws, opt);
  HostTensor ids = make_host(DType::kInt32, {static_cast<int64_t>(flat.indices.size())});
  std::memcpy(ids.storage.data(), flat.indices.data(), ids.storage.size());
  auto d_ids = to_device(ids);
  EXPECT_THROW_MSG(dec.plan(flat.kv, d_ids.view, flat.last), InvalidArgument, "shared_prefix");
  EXPECT_THROW_MSG(dec.plan_on_device(DeviceBatch{}), InvalidArgument, "shared_prefix");
  std::vector<int32_t> ten(11);
  std::iota(ten.begin(), ten.end(), 0);
  EXPECT_THROW_MSG(dec.plan(ten, ten, std::vector<int32_t>(10, 1)), InvalidArgument, "max_batch");
  dec.plan(flat.kv, flat.indices, flat.last);
  auto dk = to_device(prob.k), dv = to_device(prob.v), dq = to_device(prob.q);
  PagedKVStorage kv(dk.view, dv.view, KVLayout::kNHD);
  HostTensor o = make_host(dt, {9, 8, D}), lse = make_host(DType::kFloat32, {9, 8}), one = make_host(DType::kFloat32, {1});
  auto d_o = poisoned_like(o), d_lse = poisoned_like(lse), d_one = poisoned_like(one);
  RunOptions merge;
  merge.merge_lse = d_lse.view;
  EXPECT_THROW_MSG(dec.run(dq.view, kv, d_o.view, TensorView(), nullptr, merge), InvalidArgument, "merge_lse");
  RunOptions scaled;
  scaled.k_scale_tensor = d_one.view;
  EXPECT_THROW_MSG(dec.run(dq.view, kv, d_o.view, TensorView(), nullptr, scaled), InvalidArgument, "k_scale_tensor");
  TaskInfo ptask = task;
  ptask.max_total_q = 9;
  PrefillOptions popt;
  popt.shared_prefix = kEveryGroup;
  Workspace pws = prefill_workspace(spec, ptask, popt);
  BatchPrefill pre(spec, ptask, pws, popt);
  EXPECT_THROW_MSG(pre.plan_ragged(flat.qo, flat.kv), InvalidArgument, "shared_prefix");
  EXPECT_THROW_MSG(pre.plan_paged(flat.qo, flat.kv, d_ids.view, flat.last), InvalidArgument, "shared_prefix");
}
