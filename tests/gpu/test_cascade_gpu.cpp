// Composable formats (CascadeAttention): a step whose requests share pages
// at several levels (a prefix every request shares, group prefixes, each
// request's own suffix), planned as levels over one page pool, against the
// CPU reference over each request's concatenated tokens. Page sizes 1 and 16
// (partial last pages mid-sequence), head dims 64 / 128, groups 1 / 4, fp16
// and bf16, causal last level (bottom-right on the suffix = causal over the
// whole sequence when q_len <= suffix length), a group with no pages at a
// level; bitwise repeat; CUDA-graph replay after a re-plan with new lengths;
// page ids that stay on the GPU; levels planned on the GPU in one graph.
#include <gtest/gtest.h>

#include <cstdio>

#include <cmath>
#include <cstring>
#include <numeric>
#include <random>

#include "cascade_util.hpp"
#include "prefill_util.hpp"
#include "tessera/api/cascade.hpp"
#include "tessera/reference/attention.hpp"

using namespace tessera;
using namespace tessera::test;

namespace {

// Seven requests: a prefix all share; groups {0,1,2}, {3}, {4,5,6} with their
// own prefixes (request 3's group has none); then each request's suffix
// (q_len <= suffix under causal; request 2 has none without it).
CascadeStep three_levels(bool causal) {
  CascadeStep s;
  s.q_len = {1, 3, 1, 5, 1, 2, 4};
  s.groups = {{7}, {3, 1, 3}, {1, 1, 1, 1, 1, 1, 1}};
  s.tokens = {{40}, {70, 0, 33}, {5, 9, causal ? 1 : 0, 130, 12, 2, 4}};
  return s;
}

std::vector<AttentionSpec> level_specs(DType dt, int D, size_t levels, bool causal) {
  std::vector<AttentionSpec> specs(levels, AttentionSpec{variants::standard(), dt, dt, dt, D});
  if (causal) specs.back().variant = variants::causal();
  return specs;
}

Workspace cascade_workspace(const std::vector<AttentionSpec>& specs, const TaskInfo& task) {
  const auto s = CascadeAttention::workspace_size(specs, task, cuda::device_info(cuda::current_device()).sm_count);
  return Workspace::allocate(s.device_bytes, s.host_bytes);
}

}  // namespace

class Cascade : public ::testing::TestWithParam<std::tuple<DType, int, int, int, bool>> {};

TEST_P(Cascade, MatchesFlatReferenceAndRepeats) {
  SKIP_WITHOUT_GPU();
  const auto [dt, D, group, P, causal] = GetParam();
  const int64_t Hkv = 2, Hq = Hkv * group;
  std::mt19937_64 rng(D + 7 * group + 31 * P + causal);
  const CascadeStep step = three_levels(causal);
  CascadeProblem prob(step, dt, D, Hkv, Hq, P, rng);
  const auto ref = prob.reference(causal);

  const auto specs = level_specs(dt, D, step.groups.size(), causal);
  TaskInfo task{static_cast<int>(Hq), static_cast<int>(Hkv), P, KVLayout::kNHD, 16, prob.pool};
  task.max_total_q = 64;
  Workspace ws = cascade_workspace(specs, task);
  CascadeAttention cascade(specs, task, ws);
  const auto in = prob.plan_input();
  cascade.plan(in);
  auto dk = to_device(prob.k), dv = to_device(prob.v), dq = to_device(prob.q);
  PagedKVStorage kv(dk.view, dv.view, KVLayout::kNHD);
  auto run = [&](const TensorView& o, const TensorView& lse) { cascade.run(dq.view, kv, o, lse); };
  const int64_t rows = prob.qo.back();
  Out a = run_and_fetch(run, dt, rows, Hq, D);
  EXPECT_CLOSE(compare(to_doubles(a.o.view), ref.o), dt);
  EXPECT_CLOSE(compare(to_doubles(a.lse.view), ref.lse), DType::kFloat16);
  // The levels' states merge in fp32 and are rounded to dt once: about one
  // kernel's error, not three levels' and two merges' roundings (fp16 runs
  // of this test measured up to 9e-4 when each level and merge rounded).
  const double err = compare(to_doubles(a.o.view), ref.o).rel;
  std::printf("cascade %s D=%d group=%d page=%d causal=%d: rel error %.3e\n", dtype_name(dt), D, group, P, causal, err);
  EXPECT_LT(err, dt == DType::kFloat16 ? 6e-4 : 5e-3);
  Out b = run_and_fetch(run, dt, rows, Hq, D);
  EXPECT_TRUE(bitwise_equal(a.o, b.o));
  EXPECT_TRUE(bitwise_equal(a.lse, b.lse));
  // Without an lse output the levels merge through the workspace's own.
  Out c = run_and_fetch([&](const TensorView& o, const TensorView&) { cascade.run(dq.view, kv, o, TensorView()); }, dt,
                        rows, Hq, D);
  EXPECT_TRUE(bitwise_equal(a.o, c.o));
}

INSTANTIATE_TEST_SUITE_P(All, Cascade,
                         ::testing::Combine(::testing::Values(DType::kFloat16, DType::kBFloat16), ::testing::Values(64, 128),
                                            ::testing::Values(1, 4), ::testing::Values(1, 16), ::testing::Bool()));

// RunOptions::merge_lse: each request's own pages run first into (o, lse);
// the shared level then merges into o in its kernel's epilogue (no merge
// kernel, no state buffer), its merged LSE into a separate buffer. Against
// the flat reference; the group with no shared pages keeps o bit for bit. FA2
// and Hopper templates, split and unsplit tiles; a bad merge_lse is named.
class MergeIntoOutput : public ::testing::TestWithParam<std::tuple<DType, int, int, PrefillBackend, bool>> {};

TEST_P(MergeIntoOutput, SharedLevelMergesIntoTheUniqueOne) {
  SKIP_WITHOUT_GPU();
  const auto [dt, group, P, backend, split] = GetParam();
  if (backend == PrefillBackend::kFA3 && jit::Arch::of_device(0).major != 9)
    GTEST_SKIP() << "skipped: the Hopper kernel needs sm_90";
  const int D = 128;
  const int64_t Hkv = 2, Hq = Hkv * group;
  std::mt19937_64 rng(group + 7 * P + 31 * split + 131 * static_cast<int>(backend));
  CascadeStep step;
  step.q_len = {1, 2, 1, 3, 1, 1, 2};
  step.groups = {{3, 1, 3}, {1, 1, 1, 1, 1, 1, 1}};
  step.tokens = {{300, 0, 133}, {5, 9, 0, 130, 12, 2, 4}};
  CascadeProblem prob(step, dt, D, Hkv, Hq, P, rng);
  const auto ref = prob.reference(false);
  const int64_t rows = prob.qo.back();
  TaskInfo task{static_cast<int>(Hq), static_cast<int>(Hkv), P, KVLayout::kNHD, 16, prob.pool};
  task.max_total_q = rows;
  PrefillOptions opt;
  opt.backend = backend;
  opt.cta_q = backend == PrefillBackend::kFA3 ? 64 : 0;  // the Hopper kernel's smallest tile
  opt.planner.split_kv = split;
  const AttentionSpec spec{variants::standard(), dt, dt, dt, D};
  const auto sizes = BatchPrefill::workspace_size(spec, task, cuda::device_info(cuda::current_device()).sm_count, opt);
  Workspace ws_u = Workspace::allocate(sizes.device_bytes, sizes.host_bytes);
  Workspace ws_s = Workspace::allocate(sizes.device_bytes, sizes.host_bytes);
  BatchPrefill unique(spec, task, ws_u, opt), shared(spec, task, ws_s, opt);
  const LevelArrays &sh = prob.levels[0], &un = prob.levels[1];
  unique.plan_paged(un.qo, un.kv, un.indices, un.last);
  shared.plan_paged(sh.qo, sh.kv, sh.indices, sh.last);
  auto dk = to_device(prob.k), dv = to_device(prob.v), dq = to_device(prob.q);
  PagedKVStorage kv(dk.view, dv.view, KVLayout::kNHD);
  HostTensor own_lse_h = make_host(DType::kFloat32, {rows, Hq});
  auto own_lse = poisoned_like(own_lse_h);
  HostTensor after_unique;
  auto run = [&](const TensorView& o, const TensorView& lse) {
    unique.run(dq.view, kv, o, own_lse.view);
    after_unique = make_host(dt, {rows, Hq, D});
    TESSERA_CUDA_CHECK(cudaMemcpy(after_unique.storage.data(), o.data, after_unique.storage.size(),
                                  cudaMemcpyDeviceToHost));
    RunOptions ro;
    ro.merge_lse = own_lse.view;
    shared.run(dq.view, kv, o, lse, nullptr, ro);
  };
  Out a = run_and_fetch(run, dt, rows, Hq, D);
  EXPECT_CLOSE(compare(to_doubles(a.o.view), ref.o), dt);
  EXPECT_CLOSE(compare(to_doubles(a.lse.view), ref.lse), DType::kFloat16);
  // Request 3 (rows 4-6) has no shared pages: its rows keep the unique level's bits.
  const size_t row_bytes = static_cast<size_t>(Hq * D) * dtype_size(dt);
  EXPECT_EQ(std::memcmp(a.o.storage.data() + 4 * row_bytes, after_unique.storage.data() + 4 * row_bytes,
                        3 * row_bytes),
            0);
  Out b = run_and_fetch(run, dt, rows, Hq, D);
  EXPECT_TRUE(bitwise_equal(a.o, b.o));
  EXPECT_TRUE(bitwise_equal(a.lse, b.lse));
  // pdl_defer_wait: both levels back to back with programmatic dependent
  // launch, the shared one reading q, K and V and computing before it waits
  // for the unique one (the Hopper kernel; FA2 waits at its start): the same
  // bits, with o and the unique LSE poisoned before every step, from the
  // stream and from a captured graph.
  if (cuda::device_info(cuda::current_device()).major >= 9) {
    cudaStream_t stream;
    TESSERA_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    auto o = poisoned_like(a.o), lse = poisoned_like(a.lse);
    RunOptions first, second;
    first.pdl = second.pdl = second.pdl_defer_wait = true;
    second.merge_lse = own_lse.view;
    auto enqueue_pair = [&] {
      unique.run(dq.view, kv, o.view, own_lse.view, stream, first);
      shared.run(dq.view, kv, o.view, lse.view, stream, second);
    };
    auto poison = [&] {
      o.buf.fill(0xFF);
      lse.buf.fill(0xFF);
      own_lse.buf.fill(0xFF);
      TESSERA_CUDA_CHECK(cudaDeviceSynchronize());
    };
    auto expect_reference_bits = [&] {
      TESSERA_CUDA_CHECK(cudaStreamSynchronize(stream));
      EXPECT_TRUE(bitwise_equal(to_host(o, a.o), a.o));
      EXPECT_TRUE(bitwise_equal(to_host(lse, a.lse), a.lse));
    };
    for (int trial = 0; trial < 3; ++trial) {
      SCOPED_TRACE("back to back " + std::to_string(trial));
      poison();
      enqueue_pair();
      expect_reference_bits();
    }
    // The same pair captured in a CUDA graph (programmatic edges), replayed.
    {
      const CapturedGraph graph(stream, enqueue_pair);
      for (int replay = 0; replay < 2; ++replay) {
        SCOPED_TRACE("graph replay " + std::to_string(replay));
        poison();
        graph.launch(stream);
        expect_reference_bits();
      }
    }
    TESSERA_CUDA_CHECK(cudaStreamDestroy(stream));
    RunOptions alone = second;  // it defers a wait only behind another launch with pdl
    alone.pdl = false;
    EXPECT_THROW_MSG(shared.run(dq.view, kv, o.view, lse.view, nullptr, alone), InvalidArgument, "pdl_defer_wait");
    alone = second;
    alone.merge_lse = TensorView();
    EXPECT_THROW_MSG(shared.run(dq.view, kv, o.view, lse.view, nullptr, alone), InvalidArgument, "pdl_defer_wait");
  }
  // merge_lse must not be lse's memory (it is read while lse is written), and must be [rows, Hq] float32.
  auto o = poisoned_like(a.o);
  RunOptions same;
  same.merge_lse = own_lse.view;
  EXPECT_THROW_MSG(shared.run(dq.view, kv, o.view, own_lse.view, nullptr, same), InvalidArgument, "merge_lse");
  RunOptions bad;
  bad.merge_lse = TensorView(own_lse.view.data, DType::kFloat32, own_lse.view.device, {rows, Hq + 1});
  EXPECT_THROW_MSG(shared.run(dq.view, kv, o.view, TensorView(), nullptr, bad), InvalidArgument, "merge_lse");
}

INSTANTIATE_TEST_SUITE_P(All, MergeIntoOutput,
                         ::testing::Combine(::testing::Values(DType::kFloat16, DType::kBFloat16), ::testing::Values(1, 4),
                                            ::testing::Values(1, 16),
                                            ::testing::Values(PrefillBackend::kFA2, PrefillBackend::kFA3),
                                            ::testing::Bool()));

// Parallel generation (two levels: one long shared prefix, unique suffixes),
// captured once in a CUDA graph and replayed after re-plans whose lengths and
// groups change within the bounds.
TEST(CascadeGraph, ReplayAfterReplanMatchesReference) {
  SKIP_WITHOUT_GPU();
  const DType dt = DType::kFloat16;
  const int D = 128, P = 16;
  const int64_t Hkv = 2, Hq = 8;
  std::mt19937_64 rng(5);
  CascadeStep first;
  first.q_len = {1, 1, 1, 1, 1, 1};
  first.groups = {{6}, {1, 1, 1, 1, 1, 1}};
  first.tokens = {{1500}, {3, 40, 17, 100, 1, 64}};
  CascadeStep second;
  second.q_len = {1, 2, 1, 1, 3, 1};
  second.groups = {{2, 4}, {1, 1, 1, 1, 1, 1}};
  second.tokens = {{900, 2100}, {4, 41, 18, 101, 5, 65}};
  CascadeProblem p1(first, dt, D, Hkv, Hq, P, rng), p2(second, dt, D, Hkv, Hq, P, rng);
  const auto specs = level_specs(dt, D, 2, true);
  TaskInfo task{static_cast<int>(Hq), static_cast<int>(Hkv), P, KVLayout::kNHD, 8, std::max(p1.pool, p2.pool)};
  task.max_total_q = 16;
  Workspace ws = cascade_workspace(specs, task);
  CascadeAttention cascade(specs, task, ws);
  cudaStream_t stream;
  TESSERA_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  // One device pool and q buffer big enough for both steps (their addresses are baked into the graph).
  const int64_t pool = task.max_pages;
  HostTensor k = make_host(dt, {pool, P, Hkv, D}), v = k, q = make_host(dt, {task.max_total_q, Hq, D});
  HostTensor o = make_host(dt, {task.max_total_q, Hq, D}), lse = make_host(DType::kFloat32, {task.max_total_q, Hq});
  auto dk = to_device(k), dv = to_device(v), dq = to_device(q), d_o = poisoned_like(o), dlse = poisoned_like(lse);
  PagedKVStorage kv(dk.view, dv.view, KVLayout::kNHD);
  auto load = [&](const CascadeProblem& p) {
    dk.buf.upload(p.k.storage.data(), p.k.storage.size());
    dv.buf.upload(p.v.storage.data(), p.v.storage.size());
    dq.buf.upload(p.q.storage.data(), p.q.storage.size());
    d_o.buf.fill(0xFF);
    dlse.buf.fill(0xFF);
  };
  const auto in1 = p1.plan_input();
  cascade.plan(in1, stream);
  // Captured with tensors of the bound's rows: every step plans fewer.
  cascade.run(dq.view, kv, d_o.view, dlse.view, stream);  // loads the kernels outside the capture
  TESSERA_CUDA_CHECK(cudaStreamSynchronize(stream));
  const CapturedGraph graph(stream, [&] { cascade.run(dq.view, kv, d_o.view, dlse.view, stream); });
  for (const CascadeProblem* p : {&p1, &p2, &p1}) {
    const auto in = p->plan_input();
    cascade.plan(in, stream);
    TESSERA_CUDA_CHECK(cudaStreamSynchronize(stream));
    load(*p);
    graph.launch(stream);
    TESSERA_CUDA_CHECK(cudaStreamSynchronize(stream));
    const int64_t rows = p->qo.back();
    HostTensor got_o = to_host(d_o, o), got_lse = to_host(dlse, lse);
    const auto ref = p->reference(true);
    std::vector<double> go = to_doubles(got_o.view), gl = to_doubles(got_lse.view);
    // Rows beyond the plan stay as they were (poisoned: NaN).
    for (size_t i = static_cast<size_t>(rows * Hq * D); i < go.size(); ++i) ASSERT_TRUE(std::isnan(go[i])) << i;
    for (size_t i = static_cast<size_t>(rows * Hq); i < gl.size(); ++i) ASSERT_TRUE(std::isnan(gl[i])) << i;
    go.resize(static_cast<size_t>(rows * Hq * D));
    gl.resize(static_cast<size_t>(rows * Hq));
    EXPECT_CLOSE(compare(go, ref.o), dt);
    EXPECT_CLOSE(compare(gl, ref.lse), DType::kFloat16);
  }
  TESSERA_CUDA_CHECK(cudaStreamDestroy(stream));
}

// Page ids that stay on the GPU (one CUDA tensor per level): the same bits
// as host ids; a bad id in a level is raised by the next run().
TEST(CascadeDevicePageIds, SameBitsAsHostIdsAndBadIdRaised) {
  SKIP_WITHOUT_GPU();
  const DType dt = DType::kFloat16;
  const int D = 128, P = 16;
  const int64_t Hkv = 2, Hq = 8;
  std::mt19937_64 rng(9);
  const CascadeStep step = three_levels(true);
  CascadeProblem prob(step, dt, D, Hkv, Hq, P, rng);
  const auto specs = level_specs(dt, D, step.groups.size(), true);
  TaskInfo task{static_cast<int>(Hq), static_cast<int>(Hkv), P, KVLayout::kNHD, 16, prob.pool};
  task.max_total_q = 64;
  Workspace ws = cascade_workspace(specs, task);
  CascadeAttention cascade(specs, task, ws);
  auto dk = to_device(prob.k), dv = to_device(prob.v), dq = to_device(prob.q);
  PagedKVStorage kv(dk.view, dv.view, KVLayout::kNHD);
  auto run = [&](const TensorView& o, const TensorView& lse) { cascade.run(dq.view, kv, o, lse); };
  const int64_t rows = prob.qo.back();
  const auto host_in = prob.plan_input();
  cascade.plan(host_in);
  Out host = run_and_fetch(run, dt, rows, Hq, D);
  EXPECT_CLOSE(compare(to_doubles(host.o.view), prob.reference(true).o), dt);

  // Each level's ids as a device tensor (one spare entry: a longer buffer is fine).
  auto device_levels = [&](int bad_level, int32_t bad_id) {
    std::vector<DeviceTensor> ids;
    for (size_t l = 0; l < prob.levels.size(); ++l) {
      std::vector<int32_t> v = prob.levels[l].indices;
      if (static_cast<int>(l) == bad_level) v[v.size() / 2] = bad_id;
      v.push_back(-1);
      HostTensor h = make_host(DType::kInt32, {static_cast<int64_t>(v.size())});
      std::memcpy(h.storage.data(), v.data(), v.size() * sizeof(int32_t));
      ids.push_back(to_device(h));
    }
    return ids;
  };
  auto plan_device = [&](const std::vector<DeviceTensor>& ids) {
    std::vector<CascadeLevel> in = prob.plan_input();
    for (size_t l = 0; l < in.size(); ++l) {
      in[l].kv_indices = {};
      in[l].kv_indices_device = &ids[l].view;
    }
    cascade.plan(in);
  };
  const auto good = device_levels(-1, 0);
  plan_device(good);
  Out dev = run_and_fetch(run, dt, rows, Hq, D);
  EXPECT_TRUE(bitwise_equal(host.o, dev.o));
  EXPECT_TRUE(bitwise_equal(host.lse, dev.lse));

  const auto bad = device_levels(1, static_cast<int32_t>(prob.pool) + 7);
  plan_device(bad);
  (void)run_and_fetch(run, dt, rows, Hq, D);
  EXPECT_THROW_MSG((void)run_and_fetch(run, dt, rows, Hq, D), InvalidArgument, std::to_string(prob.pool + 7));
  plan_device(good);
  Out again = run_and_fetch(run, dt, rows, Hq, D);
  EXPECT_TRUE(bitwise_equal(host.o, again.o));
}

// Levels planned on the GPU: one CUDA graph of plan_on_device() and run()
// replays steps whose groups, lengths and rows change, each bitwise the same
// step planned on the host and close to the reference, rows past the step
// untouched; a level whose rows differ from level 0's is raised by name.
TEST(CascadeDevicePlan, OneGraphBitwiseTheHostPlan) {
  SKIP_WITHOUT_GPU();
  const DType dt = DType::kBFloat16;
  const int D = 128, P = 16;
  const int64_t Hkv = 2, Hq = 8;
  std::mt19937_64 rng(13);
  CascadeStep other;
  other.q_len = {2, 1, 1, 3, 1};
  other.groups = {{5}, {2, 3}, {1, 1, 1, 1, 1}};
  other.tokens = {{700}, {90, 0}, {8, 3, 1, 250, 16}};
  CascadeProblem p1(three_levels(true), dt, D, Hkv, Hq, P, rng), p2(other, dt, D, Hkv, Hq, P, rng);
  const auto specs = level_specs(dt, D, 3, true);
  TaskInfo task{static_cast<int>(Hq), static_cast<int>(Hkv), P, KVLayout::kNHD, 8, std::max(p1.pool, p2.pool)};
  task.max_total_q = 24;
  PrefillOptions opt;
  opt.cta_q = 64;  // the host and device cascades' tile, whatever their first plans bring
  Workspace ws = cascade_workspace(specs, task), ws_host = cascade_workspace(specs, task);
  CascadeAttention cascade(specs, task, ws, opt), host(specs, task, ws_host, opt);
  const int64_t pool = task.max_pages, rows_max = task.max_total_q;
  HostTensor k = make_host(dt, {pool, P, Hkv, D}), q = make_host(dt, {rows_max, Hq, D});
  HostTensor o = make_host(dt, {rows_max, Hq, D}), lse = make_host(DType::kFloat32, {rows_max, Hq});
  auto dk = to_device(k), dv = to_device(k), dq = to_device(q), d_o = poisoned_like(o), dlse = poisoned_like(lse);
  PagedKVStorage kv(dk.view, dv.view, KVLayout::kNHD);
  // Per level: batch size, qo_indptr, kv_indptr, ids, last page lengths, sized for the bounds.
  auto ints = [](int64_t n) { return to_device(make_host(DType::kInt32, {n})); };
  struct LevelBuffers {
    DeviceTensor batch, qo, kv, ids, last;
  };
  std::vector<LevelBuffers> bufs;
  std::vector<DeviceBatch> levels;
  for (int l = 0; l < 3; ++l) {
    bufs.push_back({ints(1), ints(task.max_batch + 1), ints(task.max_batch + 1), ints(pool), ints(task.max_batch)});
    const LevelBuffers& b = bufs.back();
    levels.push_back({b.batch.view, b.qo.view, b.kv.view, b.ids.view, b.last.view});
  }
  auto put = [](DeviceTensor& t, const std::vector<int32_t>& v) {
    if (!v.empty()) t.buf.upload(v.data(), v.size() * sizeof(int32_t));
  };
  auto load = [&](const CascadeProblem& p) {
    dk.buf.upload(p.k.storage.data(), p.k.storage.size());
    dv.buf.upload(p.v.storage.data(), p.v.storage.size());
    dq.buf.upload(p.q.storage.data(), p.q.storage.size());
    for (size_t l = 0; l < 3; ++l) {
      const LevelArrays& a = p.levels[l];
      put(bufs[l].batch, {static_cast<int32_t>(a.last.size())});
      put(bufs[l].qo, a.qo);
      put(bufs[l].kv, a.kv);
      put(bufs[l].ids, a.indices);
      put(bufs[l].last, a.last);
    }
    d_o.buf.fill(0xFF);
    dlse.buf.fill(0xFF);
  };
  cudaStream_t stream;
  TESSERA_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  load(p1);
  cascade.plan_on_device(levels, stream);  // loads the kernels outside the capture
  cascade.run(dq.view, kv, d_o.view, dlse.view, stream);
  TESSERA_CUDA_CHECK(cudaStreamSynchronize(stream));
  const CapturedGraph graph(stream, [&] {
    cascade.plan_on_device(levels, stream);
    cascade.run(dq.view, kv, d_o.view, dlse.view, stream);
  });
  for (const CascadeProblem* p : {&p1, &p2, &p1}) {
    load(*p);
    graph.launch(stream);
    TESSERA_CUDA_CHECK(cudaStreamSynchronize(stream));
    const int64_t rows = p->qo.back();
    const HostTensor got_o = to_host(d_o, o), got_lse = to_host(dlse, lse);
    std::vector<double> go = to_doubles(got_o.view), gl = to_doubles(got_lse.view);
    for (size_t i = static_cast<size_t>(rows * Hq * D); i < go.size(); ++i) ASSERT_TRUE(std::isnan(go[i])) << i;
    for (size_t i = static_cast<size_t>(rows * Hq); i < gl.size(); ++i) ASSERT_TRUE(std::isnan(gl[i])) << i;
    const auto in = p->plan_input();
    host.plan(in, stream);
    Out h = run_and_fetch([&](const TensorView& ho, const TensorView& hl) {
      TensorView qv = dq.view;
      qv.shape[0] = rows;
      host.run(qv, kv, ho, hl, stream);
    }, dt, rows, Hq, D);
    HostTensor lead_o = make_host(dt, {rows, Hq, D}), lead_lse = make_host(DType::kFloat32, {rows, Hq});
    std::memcpy(lead_o.storage.data(), got_o.storage.data(), lead_o.storage.size());
    std::memcpy(lead_lse.storage.data(), got_lse.storage.data(), lead_lse.storage.size());
    EXPECT_TRUE(bitwise_equal(h.o, lead_o));
    EXPECT_TRUE(bitwise_equal(h.lse, lead_lse));
    EXPECT_CLOSE(compare(to_doubles(lead_o.view), p->reference(true).o), dt);
  }
  // Level 1 ending one row short of level 0: recorded, raised by the next run.
  std::vector<int32_t> qo1 = p1.levels[1].qo;
  qo1.back() -= 1;
  put(bufs[1].qo, qo1);
  graph.launch(stream);
  TESSERA_CUDA_CHECK(cudaStreamSynchronize(stream));
  try {
    cascade.run(dq.view, kv, d_o.view, dlse.view, stream);
    ADD_FAILURE() << "expected the level's rows to be raised";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("levels[1]"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("level 0"), std::string::npos) << e.what();
  }
  TESSERA_CUDA_CHECK(cudaStreamSynchronize(stream));
  TESSERA_CUDA_CHECK(cudaStreamDestroy(stream));
  // No qo_indptr on a level: refused before any GPU work.
  levels[2].qo_indptr = TensorView();
  EXPECT_THROW_MSG(cascade.plan_on_device(levels, stream), InvalidArgument, "levels[2].qo_indptr");
}
