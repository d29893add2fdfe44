// Batch decode with use_tensor_cores (decode on the tensor-core prefill
// kernel, one query per request) against the CPU reference: fp16/bf16, head
// dims 64/128/256, group sizes 1/4/8, page sizes 1/16, NHD/HND, random
// lengths with 0, 1 and one far longer than the rest (split over CTAs);
// bitwise determinism; short steps unsplit; BSR input; CUDA-graph replay across steps whose lengths
// and batch change; bounds and bad input.
#include <gtest/gtest.h>

#include <random>

#include "decode_util.hpp"

using namespace tessera;
using namespace tessera::test;

namespace {

DecodeOptions tensor_cores() {
  DecodeOptions opt;
  opt.use_tensor_cores = true;
  return opt;
}

// 0 and 1, random lengths, and one request far longer than the rest.
std::vector<int32_t> random_lens(std::mt19937_64& rng, int n, int32_t long_len) {
  std::vector<int32_t> lens = {0, 1};
  while (static_cast<int>(lens.size()) < n - 1) lens.push_back(static_cast<int32_t>(2 + rng() % 1500));
  lens.push_back(long_len);
  std::shuffle(lens.begin(), lens.end(), rng);
  return lens;
}

// One step's page table (page size 16), inputs and reference.
struct Step {
  Table t;
  Problem p;
  reference::Result ref;
  int64_t batch, pool;
};
Step make_step(const DecodeCase& c, const std::vector<int32_t>& lens, std::mt19937_64& rng, int64_t Hkv, uint64_t seed) {
  const int64_t batch = static_cast<int64_t>(lens.size()), pool = pages_needed(lens, 16) + 2;
  Table t = make_table(lens, 16, pool, rng);
  Problem p = make_problem(c, batch, pool, Hkv, seed);
  auto ref = reference_decode(p, t, c);
  return {std::move(t), std::move(p), std::move(ref), batch, pool};
}

class DecodeTensorCoresGpu : public ::testing::TestWithParam<DecodeSweepParam> {};

TEST_P(DecodeTensorCoresGpu, MatchesReferenceAndIsDeterministic) {
  SKIP_WITHOUT_GPU();
  const DecodeCase c = decode_case(GetParam());
  std::mt19937_64 rng(c.head_dim * 7 + c.group * 3 + c.page_size + (c.layout == KVLayout::kHND ? 1000 : 0));
  auto [t, p, ref, spec, task] = make_sweep_problem(c, random_lens(rng, 12, 12000), rng);
  Workspace ws = decode_workspace(spec, task, tensor_cores());
  BatchDecode dec(spec, task, ws, tensor_cores());
  dec.plan(t.indptr, t.indices, t.last);
  ASSERT_NE(dec.tensor_core_prefill(), nullptr);
  EXPECT_GT(dec.tensor_core_prefill()->last_plan().num_split, 0) << "the long request must be split";
  EXPECT_GT(dec.last_plan_us(), 0);
  EXPECT_NE(dec.kernel_source().entry.find("prefill"), std::string::npos);
  check_matches_and_deterministic(dec, p, t, c, ref);
}

INSTANTIATE_TEST_SUITE_P(All, DecodeTensorCoresGpu,
                         ::testing::Combine(::testing::Values(DType::kFloat16, DType::kBFloat16), ::testing::Values(64, 128, 256),
                                            ::testing::Values(1, 4, 8), ::testing::Values(1, 16),
                                            ::testing::Values(KVLayout::kNHD, KVLayout::kHND)));

// The two paths compute the same attention (to rounding), and without KV
// splitting the tensor-core path is still correct.
TEST(DecodeTensorCoresGpuExtra, MatchesCudaCorePathAndNoSplit) {
  SKIP_WITHOUT_GPU();
  const DecodeCase c{DType::kFloat16, 128, 4, 16, KVLayout::kNHD};
  std::mt19937_64 rng(5);
  auto [t, p, ref, batch, pool] = make_step(c, random_lens(rng, 20, 9000), rng, 2, 9);
  const AttentionSpec spec{variants::standard(), c.dt, c.dt, c.dt, 128};
  TaskInfo task{8, 2, 16, KVLayout::kNHD, batch, pool};
  Workspace ws_cc = decode_workspace(spec, task), ws_tc = decode_workspace(spec, task, tensor_cores());
  BatchDecode cc(spec, task, ws_cc), tc(spec, task, ws_tc, tensor_cores());
  cc.plan(t.indptr, t.indices, t.last);
  tc.plan(t.indptr, t.indices, t.last);
  Outputs a = run_decode(cc, p, c, batch), b = run_decode(tc, p, c, batch);
  EXPECT_CLOSE(compare(to_doubles(b.o.view), to_doubles(a.o.view)), c.dt);
  EXPECT_CLOSE(compare(to_doubles(b.lse.view), to_doubles(a.lse.view)), DType::kFloat16);

  DecodeOptions no_split = tensor_cores();
  no_split.planner.split_kv = false;
  Workspace ws_ns = decode_workspace(spec, task, no_split);
  BatchDecode ns(spec, task, ws_ns, no_split);
  ns.plan(t.indptr, t.indices, t.last);
  EXPECT_EQ(ns.tensor_core_prefill()->last_plan().num_split, 0);
  Outputs n = run_decode(ns, p, c, batch);
  EXPECT_CLOSE(compare(to_doubles(n.o.view), ref.o), c.dt);
}

// A short step with a tile for every SM of the plan stays unsplit
// (PlannerOptions::unsplit_max_kv) and matches the reference and the split
// plan of the same step.
TEST(DecodeTensorCoresGpuExtra, ShortStepStaysUnsplit) {
  SKIP_WITHOUT_GPU();
  const DecodeCase c{DType::kFloat16, 128, 4, 16, KVLayout::kNHD};
  std::mt19937_64 rng(11);
  // 4 near-equal tiles on 4 SMs (max_sms), one KV head.
  auto [t, p, ref, batch, pool] = make_step(c, {1000, 1024, 960, 990}, rng, 1, 13);
  const AttentionSpec spec{variants::standard(), c.dt, c.dt, c.dt, 128};
  TaskInfo task{4, 1, 16, KVLayout::kNHD, batch, pool};
  DecodeOptions opt = tensor_cores();
  opt.max_sms = 4;
  Workspace ws = decode_workspace(spec, task, opt);
  BatchDecode dec(spec, task, ws, opt);
  dec.plan(t.indptr, t.indices, t.last);
  EXPECT_EQ(dec.tensor_core_prefill()->last_plan().num_split, 0);
  check_matches_and_deterministic(dec, p, t, c, ref);

  DecodeOptions split = opt;
  split.planner.unsplit_max_kv = 0;  // the paper's planner
  Workspace ws_s = decode_workspace(spec, task, split);
  BatchDecode ds(spec, task, ws_s, split);
  ds.plan(t.indptr, t.indices, t.last);
  // With two CTAs per SM (the Hopper kernel's 64-row tiles) it cuts every request.
  if (ds.tensor_core_prefill()->ctas_per_group() >= 8) EXPECT_GT(ds.tensor_core_prefill()->last_plan().num_split, 0);
  Outputs a = run_decode(dec, p, c, batch), b = run_decode(ds, p, c, batch);
  EXPECT_CLOSE(compare(to_doubles(b.o.view), to_doubles(a.o.view)), c.dt);
  EXPECT_CLOSE(compare(to_doubles(b.lse.view), to_doubles(a.lse.view)), DType::kFloat16);
}

TEST(DecodeTensorCoresGpuExtra, BsrInputMatchesPaged) {
  SKIP_WITHOUT_GPU();
  check_bsr_input({DType::kBFloat16, 128, 8, 16, KVLayout::kNHD}, {17, 0, 4000, 250, 1}, 16, tensor_cores(),
                  /*check_lse=*/true);
}

// Capture run() with lse for three layers once; replay across steps whose
// lengths (and batch) change, with an empty request each step, re-planning
// between replays.
TEST(DecodeTensorCoresGpuExtra, CudaGraphReplayAcrossSteps) {
  SKIP_WITHOUT_GPU();
  check_cuda_graph_replay({DType::kFloat16, 128, 4, 16, KVLayout::kHND}, tensor_cores(), /*with_lse=*/true,
                          /*zero_length_request=*/true);
}

TEST(DecodeTensorCoresGpuExtra, BoundsAndBadInput) {
  SKIP_WITHOUT_GPU();
  const AttentionSpec spec;  // fp16, head_dim 128
  TaskInfo task{8, 2, 16, KVLayout::kNHD, 0, 0};  // bounds from the first plan
  auto sizes = BatchDecode::workspace_size(spec, {8, 2, 16, KVLayout::kNHD, 4, 64},
                                           cuda::device_info(cuda::current_device()).sm_count, tensor_cores());
  Workspace ws = Workspace::allocate(sizes.device_bytes, sizes.host_bytes);
  BatchDecode dec(spec, task, ws, tensor_cores());
  HostTensor q = make_host(DType::kFloat16, {2, 8, 128}), k = make_host(DType::kFloat16, {6, 16, 2, 128});
  auto dq = to_device(q), d_o = to_device(q), dk = to_device(k), dv = to_device(k);
  PagedKVStorage kv(dk.view, dv.view, KVLayout::kNHD);
  EXPECT_THROW_MSG(dec.run(dq.view, kv, d_o.view, TensorView()), InvalidArgument, "plan");
  std::vector<int32_t> indptr = {0, 1, 3}, indices = {0, 5, 2}, last = {4, 16};
  dec.plan(indptr, indices, last);
  dec.run(dq.view, kv, d_o.view, TensorView());
  TESSERA_CUDA_CHECK(cudaDeviceSynchronize());
  std::vector<int32_t> one_indptr = {0, 2}, one_idx = {1, 4}, one_last = {3};  // fewer requests: within bounds
  dec.plan(one_indptr, one_idx, one_last);
  std::vector<int32_t> big_indptr = {0, 1, 2, 3}, big_idx = {0, 1, 2}, big_last = {1, 1, 1};
  EXPECT_THROW_MSG(dec.plan(big_indptr, big_idx, big_last), InvalidArgument, "max_batch");
  std::vector<int32_t> many_indptr = {0, 4}, many_idx = {0, 1, 2, 3}, many_last = {1};
  EXPECT_THROW_MSG(dec.plan(many_indptr, many_idx, many_last), InvalidArgument, "max_pages");
  dec.plan(indptr, indices, last);
  expect_run_rejects_bad_input(dec, q, dq, kv, d_o.view);
  HostTensor kh = make_host(DType::kFloat16, {6, 2, 16, 128});
  auto dkh = to_device(kh), dvh = to_device(kh);
  EXPECT_THROW_MSG(dec.run(dq.view, PagedKVStorage(dkh.view, dvh.view, KVLayout::kHND), d_o.view, TensorView()),
                   InvalidArgument, "layout");
  Workspace small = Workspace::allocate(256, 256);
  BatchDecode too_small(spec, task, small, tensor_cores());
  EXPECT_THROW_MSG(too_small.plan(indptr, indices, last), InvalidArgument, "workspace");
}

}  // namespace
