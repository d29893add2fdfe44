// Batch decode (planner + persistent split-KV kernel with fused merge) against
// the CPU reference: fp16/bf16, head dims 64/128/256, group sizes 1/4/8, page
// sizes 1/16/64, NHD/HND, lengths 0, 1 and far longer than the rest; bitwise
// determinism; the no-split ablation; BSR input; CUDA-graph replay across
// steps whose lengths change. (The tensor-core path: test_decode_tc_gpu.cpp.)
#include <gtest/gtest.h>

#include <numeric>
#include <random>

#include "decode_util.hpp"

using namespace tessera;
using namespace tessera::test;

namespace {

class DecodeGpu : public ::testing::TestWithParam<std::tuple<DType, int, int, int, KVLayout>> {};

TEST_P(DecodeGpu, MatchesReferenceAndIsDeterministic) {
  SKIP_WITHOUT_GPU();
  const auto [dt, D, group, page_size, layout] = GetParam();
  const DecodeCase c{dt, D, group, page_size, layout};
  const int64_t Hkv = 2, Hq = Hkv * group;
  std::mt19937_64 rng(D * 7 + group * 3 + page_size);
  std::vector<int32_t> lens = {0, 1, 7, 300, 1000, 5003, 33, 129, 64, 2, 777};
  const int64_t batch = static_cast<int64_t>(lens.size()), pool = pages_needed(lens, page_size) + 5;
  Table t = make_table(lens, page_size, pool, rng);
  Problem p = make_problem(c, batch, pool, Hkv, rng());
  auto ref = reference_decode(p, t, c);

  const AttentionSpec spec{variants::standard(), dt, dt, dt, D};
  TaskInfo task{static_cast<int>(Hq), static_cast<int>(Hkv), page_size, layout, 32, 4 * pool};
  for (bool split : {true, false}) {
    SCOPED_TRACE(split ? "split-KV" : "no split");
    DecodeOptions opt;
    opt.planner.split_kv = split;
    Workspace ws = decode_workspace(spec, task, opt);
    BatchDecode dec(spec, task, ws, opt);
    dec.plan(t.indptr, t.indices, t.last);
    if (split) EXPECT_GT(dec.last_plan().num_split_requests, 0) << "the long request must be split";
    Outputs a = run_decode(dec, p, c, batch);
    EXPECT_CLOSE(compare(to_doubles(a.o.view), ref.o), dt);
    EXPECT_CLOSE(compare(to_doubles(a.lse.view), ref.lse), DType::kFloat16);
    Outputs b = run_decode(dec, p, c, batch);  // same plan, second run
    EXPECT_TRUE(bitwise_equal(a.o, b.o));
    EXPECT_TRUE(bitwise_equal(a.lse, b.lse));
    dec.plan(t.indptr, t.indices, t.last);  // an identical second plan
    Outputs d = run_decode(dec, p, c, batch);
    EXPECT_TRUE(bitwise_equal(a.o, d.o));
  }
}

INSTANTIATE_TEST_SUITE_P(All, DecodeGpu,
                         ::testing::Combine(::testing::Values(DType::kFloat16, DType::kBFloat16), ::testing::Values(64, 128, 256),
                                            ::testing::Values(1, 4, 8), ::testing::Values(1, 16, 64),
                                            ::testing::Values(KVLayout::kNHD, KVLayout::kHND)));

TEST(DecodeGpuExtra, BsrInputMatchesPaged) {
  SKIP_WITHOUT_GPU();
  const DecodeCase c{DType::kFloat16, 128, 4, 16, KVLayout::kNHD};
  std::mt19937_64 rng(3);
  std::vector<int32_t> lens = {17, 0, 4000, 250};
  const int64_t pool = pages_needed(lens, 16) + 3;
  Table t = make_table(lens, 16, pool, rng);
  Problem p = make_problem(c, 4, pool, 2, 77);
  auto ref = reference_decode(p, t, c);
  BSRMatrix bsr(4, pool * 16, 1, 16, t.indptr, t.indices, t.last);
  const AttentionSpec spec{variants::standard(), c.dt, c.dt, c.dt, 128};
  TaskInfo task{8, 2, 16, KVLayout::kNHD, 8, pool};
  Workspace ws = decode_workspace(spec, task);
  BatchDecode dec(spec, task, ws);
  dec.plan(bsr);
  Outputs a = run_decode(dec, p, c, 4);
  EXPECT_CLOSE(compare(to_doubles(a.o.view), ref.o), c.dt);
  BSRMatrix wrong(4, pool * 16, 2, 16, {0, 1, 2}, {0, 1});
  EXPECT_THROW_MSG(dec.plan(wrong), InvalidArgument, "Br");
}

// Capture run() for three layers once; replay across steps whose lengths (and
// batch) change, re-planning between replays.
TEST(DecodeGpuExtra, CudaGraphReplayAcrossSteps) {
  SKIP_WITHOUT_GPU();
  const DecodeCase c{DType::kFloat16, 128, 4, 16, KVLayout::kNHD};
  const int64_t Hkv = 2, Hq = 8, D = 128, max_batch = 16, layers = 3;
  std::mt19937_64 rng(11);
  const int64_t pool = 16 * (6000 / 16 + 2);
  const AttentionSpec spec{variants::standard(), c.dt, c.dt, c.dt, D};
  TaskInfo task{static_cast<int>(Hq), static_cast<int>(Hkv), 16, KVLayout::kNHD, max_batch, pool};
  Workspace ws = decode_workspace(spec, task);
  BatchDecode dec(spec, task, ws);

  std::vector<Problem> layer;
  for (int l = 0; l < layers; ++l) layer.push_back(make_problem(c, max_batch, pool, Hkv, 100 + l));
  HostTensor o_like = make_host(c.dt, {max_batch, Hq, D});
  std::vector<DeviceTensor> outs;
  for (int l = 0; l < layers; ++l) outs.push_back(poisoned_like(o_like));

  auto step_lens = [&](int step) {
    std::vector<int32_t> lens(step == 0 ? max_batch : 5 + step * 3);
    for (auto& x : lens) x = static_cast<int32_t>(rng() % 900);
    lens[step % lens.size()] = 3000 + step * 500;  // one long request, split
    return lens;
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
    dec.run(layer[l].dq.view, PagedKVStorage(layer[l].dk.view, layer[l].dv.view, c.layout), outs[l].view, TensorView(), stream);
  TESSERA_CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
  TESSERA_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));

  for (int step = 0; step < 4; ++step) {
    SCOPED_TRACE("step " + std::to_string(step));
    std::vector<int32_t> lens = step == 0 ? lens0 : step_lens(step);
    Table t = step == 0 ? t0 : make_table(lens, 16, pool, rng);
    if (step > 0) dec.plan(t.indptr, t.indices, t.last, stream);
    for (auto& o : outs) o.buf.fill(0xFF);
    TESSERA_CUDA_CHECK(cudaGraphLaunch(exec, stream));
    TESSERA_CUDA_CHECK(cudaStreamSynchronize(stream));
    const int64_t batch = static_cast<int64_t>(lens.size());
    for (int l = 0; l < layers; ++l) {
      HostTensor got = to_host(outs[l], o_like);
      Problem& p = layer[l];
      // Reference on the first `batch` query rows of this layer.
      TensorView qv = p.q.view;
      qv.shape[0] = batch;
      PagedKVCache cache(PagedKVStorage(p.k.view, p.v.view, c.layout), PageTable(t.indptr, t.indices, t.last, 16, pool));
      std::vector<int32_t> qo(batch + 1);
      std::iota(qo.begin(), qo.end(), 0);
      auto ref = reference::attention_paged(qv, RaggedIndex(qo), cache);
      TensorView gv = got.view;
      gv.shape[0] = batch;
      EXPECT_CLOSE(compare(to_doubles(gv), ref.o), c.dt);
    }
  }
  TESSERA_CUDA_CHECK(cudaGraphExecDestroy(exec));
  TESSERA_CUDA_CHECK(cudaGraphDestroy(graph));
  TESSERA_CUDA_CHECK(cudaStreamDestroy(stream));
}

TEST(DecodeGpuExtra, BadInput) {
  SKIP_WITHOUT_GPU();
  const AttentionSpec spec;
  TaskInfo task{8, 2, 16, KVLayout::kNHD, 4, 64};
  Workspace ws = decode_workspace(spec, task);
  BatchDecode dec(spec, task, ws);
  std::vector<int32_t> indptr = {0, 1, 3}, indices = {0, 5, 2}, last = {4, 16};
  dec.plan(indptr, indices, last);
  HostTensor q = make_host(DType::kFloat16, {2, 8, 128}), k = make_host(DType::kFloat16, {6, 16, 2, 128});
  auto dq = to_device(q), d_o = to_device(q), dk = to_device(k), dv = to_device(k);
  PagedKVStorage kv(dk.view, dv.view, KVLayout::kNHD);
  dec.run(dq.view, kv, d_o.view, TensorView());
  TESSERA_CUDA_CHECK(cudaDeviceSynchronize());
  HostTensor k_small = make_host(DType::kFloat16, {5, 16, 2, 128});  // page 5 is out of range
  auto dks = to_device(k_small), dvs = to_device(k_small);
  EXPECT_THROW_MSG(dec.run(dq.view, PagedKVStorage(dks.view, dvs.view, KVLayout::kNHD), d_o.view, TensorView()),
                   InvalidArgument, "kv_indices");
  HostTensor q3 = make_host(DType::kFloat16, {3, 8, 128});
  auto dq3 = to_device(q3), do3 = to_device(q3);
  EXPECT_THROW_MSG(dec.run(dq3.view, kv, do3.view, TensorView()), InvalidArgument, "q");
  HostTensor k4 = make_host(DType::kFloat16, {6, 16, 4, 128});
  auto dk4 = to_device(k4), dv4 = to_device(k4);
  EXPECT_THROW_MSG(dec.run(dq.view, PagedKVStorage(dk4.view, dv4.view, KVLayout::kNHD), d_o.view, TensorView()),
                   InvalidArgument, "KV heads");
  std::vector<int32_t> big_indptr = {0, 1, 2, 3, 4, 5}, big_idx = {0, 1, 2, 3, 4}, big_last = {1, 1, 1, 1, 1};
  EXPECT_THROW_MSG(dec.plan(big_indptr, big_idx, big_last), InvalidArgument, "max_batch");
  EXPECT_THROW_MSG(dec.run(q.view, kv, d_o.view, TensorView()), TypeMismatch, "q");
}

}  // namespace
