// Workspaces below the ideal size on the GPU: BatchPrefill and BatchDecode
// (CUDA-core and tensor-core kernels) on long-KV batches that split with the
// ideal workspace, run with the first plan's exact minimum (no partial
// states: nothing splits), with min_workspace_size(), with 16 MB (what
// FlashInfer callers often allocate) and with a size in between (fewer
// partial states: the plan stays within them), each against the CPU
// reference; one byte below the exact minimum is refused at the first plan.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <string>

#include "decode_util.hpp"
#include "prefill_util.hpp"
#include "tessera/reference/attention.hpp"

using namespace tessera;
using namespace tessera::test;

namespace {

constexpr size_t kSixteenMB = size_t{16} << 20;

int sm_count() { return cuda::device_info(cuda::current_device()).sm_count; }

// ---------------------------------------------------------------- decode

class DecodeWorkspaceFitGpu : public ::testing::TestWithParam<bool> {};

DecodeOptions decode_options(bool tensor_cores) {
  DecodeOptions opt;
  opt.use_tensor_cores = tensor_cores;
  opt.cuda_cores = !tensor_cores;
  return opt;
}

// Partial states the last plan used and what the workspace holds, and the
// layout's exact minimum (for the grid the first plan chose).
struct DecodeUse {
  int64_t slots, capacity;
  size_t exact_min;
};
DecodeUse decode_use(const BatchDecode& dec, const AttentionSpec& spec, const TaskInfo& task, size_t bytes) {
  if (const BatchPrefill* tc = dec.tensor_core_prefill()) {
    TaskInfo t = task;
    t.max_total_q = task.max_batch;  // decode on tensor cores: one query per request
    const auto l =
        BatchPrefill::layout_for(spec, t, tc->ctas_per_group(), tc->head_groups(), tc->config().cta_q, 0, bytes);
    return {tc->last_plan().num_slots, l.max_slot_rows / (tc->config().cta_q * tc->cluster()),
            l.scratch + l.min_scratch_bytes};
  }
  const auto l = BatchDecode::layout_for(spec, task, dec.ctas_per_head(), 0, bytes);
  return {dec.last_plan().num_slots, l.max_slots, l.min_total};
}

TEST_P(DecodeWorkspaceFitGpu, SmallWorkspacesSplitLessAndMatchTheReference) {
  SKIP_WITHOUT_GPU();
  const bool tc = GetParam();
  const DecodeCase c{DType::kFloat16, 128, 4, 16, KVLayout::kNHD};
  std::mt19937_64 rng(41);
  auto [t, p, ref, spec, task] = make_sweep_problem(c, {0, 30000, 7, 12000, 300, 1}, rng);
  const DecodeOptions opt = decode_options(tc);
  const auto ideal = BatchDecode::workspace_size(spec, task, sm_count(), opt);
  const auto least = BatchDecode::min_workspace_size(spec, task, sm_count(), opt);
  ASSERT_LT(least.device_bytes, ideal.device_bytes);

  size_t exact_min = 0;
  {  // the ideal workspace: the long requests split
    Workspace ws = Workspace::allocate(ideal.device_bytes, ideal.host_bytes);
    BatchDecode dec(spec, task, ws, opt);
    dec.plan(t.indptr, t.indices, t.last);
    ASSERT_EQ(dec.tensor_core_prefill() != nullptr, tc);
    const DecodeUse use = decode_use(dec, spec, task, ideal.device_bytes);
    EXPECT_GT(use.slots, 0) << "the long requests must split with the ideal workspace";
    exact_min = use.exact_min;
    check_matches_and_deterministic(dec, p, t, c, ref);
  }
  ASSERT_LE(exact_min, least.device_bytes);
  const size_t between = exact_min + (ideal.device_bytes - exact_min) / 6;
  for (size_t bytes : {exact_min, least.device_bytes, std::max(kSixteenMB, least.device_bytes), between}) {
    SCOPED_TRACE("workspace of " + std::to_string(bytes) + " bytes");
    Workspace ws = Workspace::allocate(bytes, ideal.host_bytes);
    BatchDecode dec(spec, task, ws, opt);
    dec.plan(t.indptr, t.indices, t.last);
    const DecodeUse use = decode_use(dec, spec, task, bytes);
    EXPECT_LE(use.slots, use.capacity) << "more partial states than the workspace holds";
    if (bytes == exact_min) EXPECT_EQ(use.slots, 0) << "no partial states, no split";
    if (bytes == between) EXPECT_GT(use.capacity, 0);
    check_matches_and_deterministic(dec, p, t, c, ref);
  }
  Workspace tight = Workspace::allocate(exact_min - 1, ideal.host_bytes);
  BatchDecode dec(spec, task, tight, opt);
  EXPECT_THROW_MSG(dec.plan(t.indptr, t.indices, t.last), InvalidArgument,
                   "workspace: expected at least " + std::to_string(exact_min));
}

INSTANTIATE_TEST_SUITE_P(Kernels, DecodeWorkspaceFitGpu, ::testing::Bool(),
                         [](const auto& info) { return info.param ? "TensorCores" : "CudaCores"; });

// ---------------------------------------------------------------- prefill

class PrefillWorkspaceFitGpu : public ::testing::TestWithParam<bool> {};

TEST_P(PrefillWorkspaceFitGpu, SmallWorkspacesSplitLessAndMatchTheReference) {
  SKIP_WITHOUT_GPU();
  const bool causal = GetParam();
  const DType dt = DType::kFloat16;
  const int64_t D = 128, Hkv = 2, Hq = 8, page_size = 16;
  std::mt19937_64 rng(43);
  const std::vector<int32_t> q_lens = {3, 17, 1}, kv_lens = {9000, 20000, 700};
  Table table = make_table(kv_lens, page_size, pages_needed(kv_lens, page_size) + 3, rng);
  std::vector<int32_t> qo = {0};
  for (int32_t n : q_lens) qo.push_back(qo.back() + n);
  const int64_t rows = qo.back();
  const PagedInputs in(dt, Hkv, Hq, D, page_size, table.num_pages, qo, table.indptr, table.indices, table.last, causal,
                       rng);
  const HostTensor &k = in.k, &v = in.v, &q = in.q;
  const reference::Result& ref = in.ref;
  auto dk = to_device(k), dv = to_device(v), dq = to_device(q);
  const PagedKVStorage kv(dk.view, dv.view, KVLayout::kNHD);

  const AttentionSpec spec{causal ? variants::causal() : variants::standard(), dt, dt, dt, static_cast<int>(D)};
  TaskInfo task{static_cast<int>(Hq), static_cast<int>(Hkv), static_cast<int>(page_size), KVLayout::kNHD, 4,
                4 * table.num_pages};
  task.max_total_q = 64;
  const PrefillOptions opt{};
  const auto ideal = BatchPrefill::workspace_size(spec, task, sm_count(), opt);
  const auto least = BatchPrefill::min_workspace_size(spec, task, sm_count(), opt);
  ASSERT_LT(least.device_bytes, ideal.device_bytes);

  // Plans and runs on a workspace of `bytes`; returns the exact minimum of
  // the grid the plan chose, and checks the plan against what it holds.
  auto run_with = [&](size_t bytes, bool expect_split, bool expect_whole) {
    SCOPED_TRACE("workspace of " + std::to_string(bytes) + " bytes");
    Workspace ws = Workspace::allocate(bytes, ideal.host_bytes);
    BatchPrefill pre(spec, task, ws, opt);
    pre.plan_paged(qo, table.indptr, table.indices, table.last);
    const auto l = BatchPrefill::layout_for(spec, task, pre.ctas_per_group(), pre.head_groups(), pre.config().cta_q,
                                            0, bytes);
    const PrefillPlan& plan = pre.last_plan();
    EXPECT_LE(int64_t{plan.num_slots} * plan.cta_q, l.max_slot_rows) << "more partial rows than the workspace holds";
    if (expect_split) EXPECT_GT(plan.num_split, 0) << "the long requests must split with the ideal workspace";
    if (expect_whole) EXPECT_EQ(plan.num_split, 0) << "no partial states, no split";
    auto run = [&](const TensorView& o, const TensorView& lse) { pre.run(dq.view, kv, o, lse); };
    Out a = run_and_fetch(run, dt, rows, Hq, D);
    EXPECT_CLOSE(compare(to_doubles(a.o.view), ref.o), dt);
    EXPECT_CLOSE(compare(to_doubles(a.lse.view), ref.lse), DType::kFloat16);
    Out b = run_and_fetch(run, dt, rows, Hq, D);
    EXPECT_TRUE(bitwise_equal(a.o, b.o));
    return l.scratch + l.min_scratch_bytes;
  };
  const size_t exact_min = run_with(ideal.device_bytes, true, false);
  ASSERT_LE(exact_min, least.device_bytes);
  run_with(exact_min, false, true);
  run_with(least.device_bytes, false, false);
  run_with(std::max(kSixteenMB, least.device_bytes), false, false);
  run_with(exact_min + (ideal.device_bytes - exact_min) / 6, false, false);
  Workspace tight = Workspace::allocate(exact_min - 1, ideal.host_bytes);
  BatchPrefill pre(spec, task, tight, opt);
  EXPECT_THROW_MSG(pre.plan_paged(qo, table.indptr, table.indices, table.last), InvalidArgument,
                   "workspace: expected at least " + std::to_string(exact_min));
}

INSTANTIATE_TEST_SUITE_P(Masks, PrefillWorkspaceFitGpu, ::testing::Bool(),
                         [](const auto& info) { return info.param ? "Causal" : "NonCausal"; });

}  // namespace
