// Batch decode (planner + persistent split-KV kernel with fused merge) against
// the CPU reference: fp16/bf16, head dims 64/128/256, group sizes 1/4/8, page
// sizes 1/16/64, NHD/HND, lengths 0, 1 and far longer than the rest; bitwise
// determinism; the no-split ablation; BSR input; CUDA-graph replay across
// steps whose lengths change. (The tensor-core path: test_decode_tc_gpu.cpp.)
#include <gtest/gtest.h>

#include <random>

#include "decode_util.hpp"

using namespace tessera;
using namespace tessera::test;

namespace {

DecodeOptions cuda_cores() {
  DecodeOptions opt;
  opt.cuda_cores = true;
  return opt;
}

class DecodeGpu : public ::testing::TestWithParam<DecodeSweepParam> {};

TEST_P(DecodeGpu, MatchesReferenceAndIsDeterministic) {
  SKIP_WITHOUT_GPU();
  const DecodeCase c = decode_case(GetParam());
  std::mt19937_64 rng(c.head_dim * 7 + c.group * 3 + c.page_size);
  auto [t, p, ref, spec, task] = make_sweep_problem(c, {0, 1, 7, 300, 1000, 5003, 33, 129, 64, 2, 777}, rng);
  for (bool split : {true, false}) {
    SCOPED_TRACE(split ? "split-KV" : "no split");
    DecodeOptions opt;
    opt.cuda_cores = true;  // this file tests the CUDA-core kernel (test_decode_tc_gpu.cpp: the other)
    opt.planner.split_kv = split;
    Workspace ws = decode_workspace(spec, task, opt);
    BatchDecode dec(spec, task, ws, opt);
    dec.plan(t.indptr, t.indices, t.last);
    if (split) EXPECT_GT(dec.last_plan().num_split_requests, 0) << "the long request must be split";
    check_matches_and_deterministic(dec, p, t, c, ref);
  }
}

INSTANTIATE_TEST_SUITE_P(All, DecodeGpu,
                         ::testing::Combine(::testing::Values(DType::kFloat16, DType::kBFloat16), ::testing::Values(64, 128, 256),
                                            ::testing::Values(1, 4, 8), ::testing::Values(1, 16, 64),
                                            ::testing::Values(KVLayout::kNHD, KVLayout::kHND)));

TEST(DecodeGpuExtra, BsrInputMatchesPaged) {
  SKIP_WITHOUT_GPU();
  check_bsr_input({DType::kFloat16, 128, 4, 16, KVLayout::kNHD}, {17, 0, 4000, 250}, 8, cuda_cores(),
                  /*check_lse=*/false);
}

// Capture run() (no lse) for three layers once; replay across steps whose
// lengths (and batch) change, re-planning between replays.
TEST(DecodeGpuExtra, CudaGraphReplayAcrossSteps) {
  SKIP_WITHOUT_GPU();
  check_cuda_graph_replay({DType::kFloat16, 128, 4, 16, KVLayout::kNHD}, cuda_cores(), /*with_lse=*/false,
                          /*zero_length_request=*/false);
}

TEST(DecodeGpuExtra, BadInput) {
  SKIP_WITHOUT_GPU();
  const AttentionSpec spec;
  TaskInfo task{8, 2, 16, KVLayout::kNHD, 4, 64};
  Workspace ws = decode_workspace(spec, task, cuda_cores());
  BatchDecode dec(spec, task, ws, cuda_cores());
  std::vector<int32_t> indptr = {0, 1, 3}, indices = {0, 5, 2}, last = {4, 16};
  dec.plan(indptr, indices, last);
  HostTensor q = make_host(DType::kFloat16, {2, 8, 128}), k = make_host(DType::kFloat16, {6, 16, 2, 128});
  auto dq = to_device(q), d_o = to_device(q), dk = to_device(k), dv = to_device(k);
  PagedKVStorage kv(dk.view, dv.view, KVLayout::kNHD);
  dec.run(dq.view, kv, d_o.view, TensorView());
  TESSERA_CUDA_CHECK(cudaDeviceSynchronize());
  expect_run_rejects_bad_input(dec, q, dq, kv, d_o.view);
  HostTensor k4 = make_host(DType::kFloat16, {6, 16, 4, 128});
  auto dk4 = to_device(k4), dv4 = to_device(k4);
  EXPECT_THROW_MSG(dec.run(dq.view, PagedKVStorage(dk4.view, dv4.view, KVLayout::kNHD), d_o.view, TensorView()),
                   InvalidArgument, "KV heads");
  std::vector<int32_t> big_indptr = {0, 1, 2, 3, 4, 5}, big_idx = {0, 1, 2, 3, 4}, big_last = {1, 1, 1, 1, 1};
  EXPECT_THROW_MSG(dec.plan(big_indptr, big_idx, big_last), InvalidArgument, "max_batch");
}

}  // namespace
