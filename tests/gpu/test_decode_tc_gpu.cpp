// Batch decode with use_tensor_cores (decode on the tensor-core prefill
// kernel, one query per request) against the CPU reference: fp16/bf16, head
// dims 64/128/256, group sizes 1/4/8, page sizes 1/16, NHD/HND, random
// lengths with 0, 1 and one far longer than the rest (split over CTAs);
// bitwise determinism; BSR input; CUDA-graph replay across steps whose lengths
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

class DecodeTensorCoresGpu : public ::testing::TestWithParam<std::tuple<DType, int, int, int, KVLayout>> {};

TEST_P(DecodeTensorCoresGpu, MatchesReferenceAndIsDeterministic) {
  SKIP_WITHOUT_GPU();
  const auto [dt, D, group, page_size, layout] = GetParam();
  const DecodeCase c{dt, D, group, page_size, layout};
  const int64_t Hkv = 2, Hq = Hkv * group;
  std::mt19937_64 rng(D * 7 + group * 3 + page_size + (layout == KVLayout::kHND ? 1000 : 0));
  const std::vector<int32_t> lens = random_lens(rng, 12, 12000);
  const int64_t batch = static_cast<int64_t>(lens.size()), pool = pages_needed(lens, page_size) + 5;
  Table t = make_table(lens, page_size, pool, rng);
  Problem p = make_problem(c, batch, pool, Hkv, rng());
  auto ref = reference_decode(p, t, c);

  const AttentionSpec spec{variants::standard(), dt, dt, dt, D};
  TaskInfo task{static_cast<int>(Hq), static_cast<int>(Hkv), page_size, layout, 32, 4 * pool};
  Workspace ws = decode_workspace(spec, task, tensor_cores());
  BatchDecode dec(spec, task, ws, tensor_cores());
  dec.plan(t.indptr, t.indices, t.last);
  ASSERT_NE(dec.tensor_core_prefill(), nullptr);
  EXPECT_GT(dec.tensor_core_prefill()->last_plan().num_split, 0) << "the long request must be split";
  EXPECT_GT(dec.last_plan_us(), 0);
  EXPECT_NE(dec.kernel_source().entry.find("prefill"), std::string::npos);
  Outputs a = run_decode(dec, p, c, batch);
  EXPECT_CLOSE(compare(to_doubles(a.o.view), ref.o), dt);
  EXPECT_CLOSE(compare(to_doubles(a.lse.view), ref.lse), DType::kFloat16);
  Outputs b = run_decode(dec, p, c, batch);  // same plan, second run
  EXPECT_TRUE(bitwise_equal(a.o, b.o));
  EXPECT_TRUE(bitwise_equal(a.lse, b.lse));
  dec.plan(t.indptr, t.indices, t.last);  // an identical second plan
  Outputs d = run_decode(dec, p, c, batch);
  EXPECT_TRUE(bitwise_equal(a.o, d.o));
  EXPECT_TRUE(bitwise_equal(a.lse, d.lse));
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
  const std::vector<int32_t> lens = random_lens(rng, 20, 9000);
  const int64_t batch = static_cast<int64_t>(lens.size()), pool = pages_needed(lens, 16) + 2;
  Table t = make_table(lens, 16, pool, rng);
  Problem p = make_problem(c, batch, pool, 2, 9);
  auto ref = reference_decode(p, t, c);
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

TEST(DecodeTensorCoresGpuExtra, BsrInputMatchesPaged) {
  SKIP_WITHOUT_GPU();
  const DecodeCase c{DType::kBFloat16, 128, 8, 16, KVLayout::kNHD};
  std::mt19937_64 rng(3);
  std::vector<int32_t> lens = {17, 0, 4000, 250, 1};
  const int64_t pool = pages_needed(lens, 16) + 3;
  Table t = make_table(lens, 16, pool, rng);
  Problem p = make_problem(c, 5, pool, 2, 77);
  auto ref = reference_decode(p, t, c);
  BSRMatrix bsr(5, pool * 16, 1, 16, t.indptr, t.indices, t.last);
  const AttentionSpec spec{variants::standard(), c.dt, c.dt, c.dt, 128};
  TaskInfo task{16, 2, 16, KVLayout::kNHD, 8, pool};
  Workspace ws = decode_workspace(spec, task, tensor_cores());
  BatchDecode dec(spec, task, ws, tensor_cores());
  dec.plan(bsr);
  Outputs a = run_decode(dec, p, c, 5);
  EXPECT_CLOSE(compare(to_doubles(a.o.view), ref.o), c.dt);
  EXPECT_CLOSE(compare(to_doubles(a.lse.view), ref.lse), DType::kFloat16);
}

// Capture run() for three layers once; replay across steps whose lengths (and
// batch) change, re-planning between replays.
TEST(DecodeTensorCoresGpuExtra, CudaGraphReplayAcrossSteps) {
  SKIP_WITHOUT_GPU();
  const DecodeCase c{DType::kFloat16, 128, 4, 16, KVLayout::kHND};
  const int64_t Hkv = 2, Hq = 8, D = 128, max_batch = 16, layers = 3;
  std::mt19937_64 rng(11);
  const int64_t pool = 16 * (6000 / 16 + 2);
  const AttentionSpec spec{variants::standard(), c.dt, c.dt, c.dt, D};
  TaskInfo task{static_cast<int>(Hq), static_cast<int>(Hkv), 16, c.layout, max_batch, pool};
  Workspace ws = decode_workspace(spec, task, tensor_cores());
  BatchDecode dec(spec, task, ws, tensor_cores());

  std::vector<Problem> layer;
  for (int l = 0; l < layers; ++l) layer.push_back(make_problem(c, max_batch, pool, Hkv, 100 + l));
  HostTensor o_like = make_host(c.dt, {max_batch, Hq, D}), lse_like = make_host(DType::kFloat32, {max_batch, Hq});
  std::vector<DeviceTensor> outs, lses;
  for (int l = 0; l < layers; ++l) {
    outs.push_back(poisoned_like(o_like));
    lses.push_back(poisoned_like(lse_like));
  }
  // Captured with max_batch rows; a later step of fewer requests writes the
  // leading rows of o and lse only.
  auto step_lens = [&](int step) {
    std::vector<int32_t> lens(step == 0 ? max_batch : 5 + step * 3);
    for (auto& x : lens) x = static_cast<int32_t>(rng() % 900);
    lens[(step + 1) % lens.size()] = 0;
    lens[step % lens.size()] = 3000 + step * 500;  // one long request, split
    return lens;
  };
  auto leading = [](const HostTensor& h, int64_t rows) {
    TensorView v = h.view;
    v.shape[0] = rows;
    return to_doubles(v);
  };
  cudaStream_t stream;
  TESSERA_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  std::vector<int32_t> lens0 = step_lens(0);
  Table t0 = make_table(lens0, 16, pool, rng);
  dec.plan(t0.indptr, t0.indices, t0.last, stream);
  TESSERA_CUDA_CHECK(cudaStreamSynchronize(stream));

  cudaGraph_t graph;
  cudaGraphExec_t exec;
  TESSERA_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  for (int l = 0; l < layers; ++l)
    dec.run(layer[l].dq.view, PagedKVStorage(layer[l].dk.view, layer[l].dv.view, c.layout), outs[l].view, lses[l].view,
            stream);
  TESSERA_CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
  TESSERA_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));

  for (int step = 0; step < 4; ++step) {
    SCOPED_TRACE("step " + std::to_string(step));
    Table t = step == 0 ? t0 : make_table(step_lens(step), 16, pool, rng);
    if (step > 0) dec.plan(t.indptr, t.indices, t.last, stream);
    for (int l = 0; l < layers; ++l) {
      outs[l].buf.fill(0xFF);
      lses[l].buf.fill(0xFF);
    }
    TESSERA_CUDA_CHECK(cudaGraphLaunch(exec, stream));
    TESSERA_CUDA_CHECK(cudaStreamSynchronize(stream));
    const int64_t batch = static_cast<int64_t>(t.kv_lens.size());
    for (int l = 0; l < layers; ++l) {
      auto ref = reference_decode(layer[l], t, c);
      EXPECT_CLOSE(compare(leading(to_host(outs[l], o_like), batch), ref.o), c.dt);
      EXPECT_CLOSE(compare(leading(to_host(lses[l], lse_like), batch), ref.lse), DType::kFloat16);
    }
  }
  TESSERA_CUDA_CHECK(cudaGraphExecDestroy(exec));
  TESSERA_CUDA_CHECK(cudaGraphDestroy(graph));
  TESSERA_CUDA_CHECK(cudaStreamDestroy(stream));
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
  HostTensor k_small = make_host(DType::kFloat16, {5, 16, 2, 128});  // page 5 is out of range
  auto dks = to_device(k_small), dvs = to_device(k_small);
  EXPECT_THROW_MSG(dec.run(dq.view, PagedKVStorage(dks.view, dvs.view, KVLayout::kNHD), d_o.view, TensorView()),
                   InvalidArgument, "kv_indices");
  HostTensor q3 = make_host(DType::kFloat16, {3, 8, 128});
  auto dq3 = to_device(q3), do3 = to_device(q3);
  EXPECT_THROW_MSG(dec.run(dq3.view, kv, do3.view, TensorView()), InvalidArgument, "q");
  HostTensor kh = make_host(DType::kFloat16, {6, 2, 16, 128});
  auto dkh = to_device(kh), dvh = to_device(kh);
  EXPECT_THROW_MSG(dec.run(dq.view, PagedKVStorage(dkh.view, dvh.view, KVLayout::kHND), d_o.view, TensorView()),
                   InvalidArgument, "layout");
  EXPECT_THROW_MSG(dec.run(q.view, kv, d_o.view, TensorView()), TypeMismatch, "q");
  Workspace small = Workspace::allocate(256, 256);
  BatchDecode too_small(spec, task, small, tensor_cores());
  EXPECT_THROW_MSG(too_small.plan(indptr, indices, last), InvalidArgument, "workspace");
}

}  // namespace
