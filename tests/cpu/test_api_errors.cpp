// Bad input at the API boundary, caught before any GPU work (so these run on
// machines without a GPU): task/spec validation, plan() validation of lengths
// and page tables, workspace bounds, single_decode argument checks, and
// BatchDecode's use_tensor_cores option.
#include <gtest/gtest.h>

#include <cstdlib>

#include "tessera/api/attention.hpp"
#include "tessera/api/decode.hpp"
#include "fake_workspace.hpp"
#include "test_util.hpp"

using namespace tessera;
using namespace tessera::test;

namespace {

TaskInfo task(int hq = 8, int hkv = 2, int page = 16) { return {hq, hkv, page, KVLayout::kNHD, 4, 16}; }

TEST(ApiErrors, TaskAndSpec) {
  FakeWorkspace f;
  EXPECT_THROW_MSG(BatchAttention({}, task(6, 4), f.ws), InvalidArgument, "num_qo_heads");
  EXPECT_THROW_MSG(BatchAttention({}, task(8, 0), f.ws), InvalidArgument, "num_kv_heads");
  EXPECT_THROW_MSG(BatchAttention({}, task(8, 2, 0), f.ws), InvalidArgument, "page_size");
  AttentionSpec spec;
  spec.head_dim = 80;
  EXPECT_THROW_MSG(BatchAttention(spec, task(), f.ws), InvalidArgument, "head_dim");
  spec = {};
  spec.kv_dtype = DType::kFloat32;
  EXPECT_THROW_MSG(BatchAttention(spec, task(), f.ws), TypeMismatch, "kv_dtype");
}

TEST(ApiErrors, PlanValidatesLengthsAndPageTable) {
  FakeWorkspace f;
  BatchAttention attn({}, task(), f.ws);
  std::vector<int32_t> qo = {0, 1, 2}, kvp = {0, 1, 3}, idx = {0, 3, 1}, last = {5, 16};
  std::vector<int32_t> bad_qo = {0, 2, 1};
  EXPECT_THROW_MSG(attn.plan({bad_qo, kvp, idx, last}), InvalidArgument, "qo_indptr");
  std::vector<int32_t> qo_nz = {1, 2, 3};
  EXPECT_THROW_MSG(attn.plan({qo_nz, kvp, idx, last}), InvalidArgument, "qo_indptr");
  std::vector<int32_t> kvp_short = {0, 3};
  EXPECT_THROW_MSG(attn.plan({qo, kvp_short, idx, last}), InvalidArgument, "kv_indptr");
  std::vector<int32_t> kvp_bad = {0, 2, 1};
  EXPECT_THROW_MSG(attn.plan({qo, kvp_bad, idx, last}), InvalidArgument, "indptr");
  std::vector<int32_t> idx_neg = {0, -1, 1};
  EXPECT_THROW_MSG(attn.plan({qo, kvp, idx_neg, last}), InvalidArgument, "indices");
  std::vector<int32_t> last_bad = {17, 16};
  EXPECT_THROW_MSG(attn.plan({qo, kvp, idx, last_bad}), InvalidArgument, "last_page_len");
  std::vector<int32_t> idx_short = {0, 3};
  EXPECT_THROW_MSG(attn.plan({qo, kvp, idx_short, last}), InvalidArgument, "indices");
}

TEST(ApiErrors, PlanBeyondWorkspaceBounds) {
  FakeWorkspace f;
  TaskInfo t = task();
  t.max_batch = 1;  // but the plan brings 2 requests
  BatchAttention attn({}, t, f.ws);
  std::vector<int32_t> qo = {0, 1, 2}, kvp = {0, 1, 3}, idx = {0, 3, 1}, last = {5, 16};
  EXPECT_THROW_MSG(attn.plan({qo, kvp, idx, last}), InvalidArgument, "max_batch");
}

TEST(ApiErrors, WorkspaceTooSmall) {
  alignas(256) static char small[256];
  Workspace ws(small, sizeof small, small, sizeof small, 0);
  TaskInfo t = task();
  t.max_batch = 1000;
  t.max_pages = 100000;
  BatchAttention attn({}, t, ws);
  std::vector<int32_t> qo = {0, 1}, kvp = {0, 1}, idx = {0}, last = {5};
  EXPECT_THROW_MSG(attn.plan({qo, kvp, idx, last}), InvalidArgument, "workspace");
  EXPECT_GT(BatchAttention::workspace_bytes(1000, 100000), sizeof small);
}

TEST(ApiErrors, RunBeforePlan) {
  FakeWorkspace f;
  BatchAttention attn({}, task(), f.ws);
  HostTensor q = make_host(DType::kFloat16, {1, 8, 128});
  EXPECT_THROW_MSG(attn.run(q.view, PagedKVStorage(), q.view, TensorView()), InvalidArgument, "plan");
}

TEST(ApiErrors, SingleDecodeArguments) {
  const AttentionSpec spec;  // fp16, head_dim 128
  HostTensor q = make_host(DType::kFloat16, {8, 128}), o = q;
  HostTensor k = make_host(DType::kFloat16, {10, 2, 128}), v = k;
  // Host tensors are not accepted by the GPU kernel path.
  EXPECT_THROW_MSG(single_decode(spec, q.view, k.view, v.view, KVLayout::kNHD, o.view, TensorView()), TypeMismatch, "q");
  HostTensor kb = make_host(DType::kBFloat16, {10, 2, 128});
  EXPECT_THROW_MSG(single_decode(spec, q.view, kb.view, kb.view, KVLayout::kNHD, o.view, TensorView()), TypeMismatch, "k");
  HostTensor v_bad = make_host(DType::kFloat16, {11, 2, 128});
  EXPECT_THROW_MSG(single_decode(spec, q.view, k.view, v_bad.view, KVLayout::kNHD, o.view, TensorView()),
                   InvalidArgument, "v");
  HostTensor k3 = make_host(DType::kFloat16, {10, 3, 128});
  EXPECT_THROW_MSG(single_decode(spec, q.view, k3.view, k3.view, KVLayout::kNHD, o.view, TensorView()),
                   InvalidArgument, "heads");
  HostTensor k64 = make_host(DType::kFloat16, {10, 2, 64});
  EXPECT_THROW_MSG(single_decode(spec, q.view, k64.view, k64.view, KVLayout::kNHD, o.view, TensorView()),
                   InvalidArgument, "head_dim");
}

DecodeOptions tensor_cores() {
  DecodeOptions opt;
  opt.use_tensor_cores = true;
  return opt;
}

// use_tensor_cores runs decode on the tensor-core prefill kernel: its
// constraints (q_dtype == kv_dtype), its workspace, and decode's own bound
// messages, all checked before any GPU work.
TEST(ApiErrors, DecodeTensorCoreOptions) {
  FakeWorkspace f;
  AttentionSpec mixed;
  mixed.kv_dtype = DType::kBFloat16;  // q float16
  EXPECT_THROW_MSG(BatchDecode(mixed, task(), f.ws, tensor_cores()), TypeMismatch, "q_dtype");
  EXPECT_THROW_MSG(BatchDecode::workspace_size(mixed, task(), 132, tensor_cores()), TypeMismatch, "q_dtype");
  for (int DecodeOptions::*knob : {&DecodeOptions::tile, &DecodeOptions::stages, &DecodeOptions::ctas_per_sm}) {
    DecodeOptions opt = tensor_cores();
    opt.*knob = 2;
    EXPECT_THROW(BatchDecode({}, task(), f.ws, opt), InvalidArgument);
  }
  DecodeOptions neg = tensor_cores();
  neg.max_sms = -1;
  EXPECT_THROW_MSG(BatchDecode({}, task(), f.ws, neg), InvalidArgument, "max_sms");
  // CTA pairs: 0 (auto), 1 or 2, checked when the wrapper is built.
  for (int c : {-1, 3, 4}) {
    PrefillOptions pairs;
    pairs.cluster = c;
    EXPECT_THROW_MSG(BatchPrefill({}, task(), f.ws, pairs), InvalidArgument, "cluster");
  }

  // The prefill wrapper's sections with one query per request on decode's
  // 8-row tiles (a group of 4 heads), one plan per KV head (decode's plan()
  // runs every step: no head groups).
  const AttentionSpec spec{variants::standard(), DType::kBFloat16, DType::kBFloat16, DType::kBFloat16, 128};
  TaskInfo t{32, 8, 16, KVLayout::kHND, 64, 4096};
  TaskInfo as_prefill = t;
  as_prefill.max_total_q = 64;
  const auto tc = BatchDecode::workspace_size(spec, t, 132, tensor_cores());
  const auto rows8 = BatchPrefill::workspace_size(spec, as_prefill, 132, PrefillOptions{.cta_q = 8});
  EXPECT_EQ(tc.device_bytes, rows8.device_bytes);
  EXPECT_EQ(tc.host_bytes, rows8.host_bytes);
  const auto pre = BatchPrefill::workspace_size(spec, as_prefill, 132);
  // Grouped heads (8 heads, 132 SMs: 4 groups of 2) plan twice the requests.
  const auto per_head = BatchPrefill::workspace_size(spec, as_prefill, 132, {.group_heads = HeadGrouping::kOff});
  const auto grouped = BatchPrefill::workspace_size(spec, as_prefill, 132, {.group_heads = HeadGrouping::kOn});
  EXPECT_GT(grouped.host_bytes, per_head.host_bytes);
  // The default (kAuto) may group at a first plan of long prompts on 128-row
  // Hopper tiles (not on FA2 ones, which kOn groups too): its workspace holds
  // every per-head layout and that one (which may not be the largest).
  TaskInfo prompts = as_prefill;
  prompts.max_total_q = 8192;
  const auto auto_long = BatchPrefill::workspace_size(spec, prompts, 132);
  const auto off_long = BatchPrefill::workspace_size(spec, prompts, 132, {.group_heads = HeadGrouping::kOff});
  const auto on_long = BatchPrefill::workspace_size(spec, prompts, 132, {.group_heads = HeadGrouping::kOn});
  EXPECT_GT(on_long.host_bytes, off_long.host_bytes);
  EXPECT_GE(auto_long.host_bytes, off_long.host_bytes);
  EXPECT_LE(auto_long.host_bytes, on_long.host_bytes);
  EXPECT_GE(auto_long.device_bytes, off_long.device_bytes);
  // Below 128-row tiles nothing is grouped unless asked.
  EXPECT_EQ(rows8.host_bytes,
            BatchPrefill::workspace_size(spec, as_prefill, 132, {.cta_q = 8, .group_heads = HeadGrouping::kOff}).host_bytes);
  EXPECT_GT(tc.device_bytes, 0u);
  // Fixed chunks: TaskInfo::max_fixed_chunks, when given, sizes the pieces
  // (work items and partial states) instead of the one-tile-per-request bound.
  PrefillOptions fixed_opt;
  fixed_opt.planner.fixed_chunk = 1024;
  TaskInfo few = as_prefill, many = as_prefill;
  few.max_fixed_chunks = 10;
  many.max_fixed_chunks = 10000;
  const auto bound = BatchPrefill::workspace_size(spec, as_prefill, 132, fixed_opt);
  EXPECT_GE(bound.device_bytes, pre.device_bytes);
  EXPECT_GT(BatchPrefill::workspace_size(spec, many, 132, fixed_opt).device_bytes, bound.device_bytes);
  EXPECT_LE(BatchPrefill::workspace_size(spec, few, 132, fixed_opt).device_bytes, bound.device_bytes);
  EXPECT_EQ(BatchPrefill::workspace_size(spec, many, 132).device_bytes, pre.device_bytes);  // unused without them
  t.max_batch = 0;
  EXPECT_THROW_MSG(BatchDecode::workspace_size(spec, t, 132, tensor_cores()), InvalidArgument, "max_batch");

  BatchDecode dec({}, task(), f.ws, tensor_cores());  // max_batch 4, max_pages 16
  ASSERT_NE(dec.tensor_core_prefill(), nullptr);
  HostTensor q = make_host(DType::kFloat16, {1, 8, 128});
  EXPECT_THROW_MSG(dec.run(q.view, PagedKVStorage(), q.view, TensorView()), InvalidArgument, "plan");
  std::vector<int32_t> ip5 = {0, 1, 2, 3, 4, 5}, idx5 = {0, 1, 2, 3, 4}, last5 = {1, 1, 1, 1, 1};
  EXPECT_THROW_MSG(dec.plan(ip5, idx5, last5), InvalidArgument, "max_batch");
  std::vector<int32_t> ip1 = {0, 17}, idx17(17, 0), last1 = {1};
  EXPECT_THROW_MSG(dec.plan(ip1, idx17, last1), InvalidArgument, "max_pages");
  EXPECT_THROW_MSG(dec.plan(BSRMatrix(4, 64, 2, 16, {0, 1, 2}, {0, 1})), InvalidArgument, "Br");
  DecodeOptions cc;
  cc.cuda_cores = true;
  EXPECT_EQ(BatchDecode({}, task(), f.ws, cc).tensor_core_prefill(), nullptr);
  t.max_batch = 64;
  DecodeOptions both = tensor_cores();
  both.cuda_cores = true;
  EXPECT_THROW_MSG(BatchDecode({}, task(), f.ws, both), InvalidArgument, "cuda_cores");
  EXPECT_THROW_MSG(BatchDecode::workspace_size(spec, t, 132, both), InvalidArgument, "cuda_cores");
  // Left to the wrapper (use_tensor_cores false, no CUDA-core tuning): room
  // for either kernel, since it picks one on the device.
  const auto cc_size = BatchDecode::workspace_size(spec, t, 132, cc);
  const auto pick = BatchDecode::workspace_size(spec, t, 132);
  EXPECT_EQ(pick.device_bytes, std::max(cc_size.device_bytes, tc.device_bytes));
  EXPECT_EQ(pick.host_bytes, std::max(cc_size.host_bytes, tc.host_bytes));
  EXPECT_TRUE(BatchDecode::runs_on_tensor_cores(spec, tensor_cores(), 0));
  EXPECT_FALSE(BatchDecode::runs_on_tensor_cores(spec, cc, 0));
  DecodeOptions tuned;
  tuned.tile = 32;  // CUDA-core tuning asks for that kernel
  EXPECT_FALSE(BatchDecode::runs_on_tensor_cores(spec, tuned, 0));
  const AttentionSpec q_kv_differ{variants::standard(), DType::kFloat16, DType::kBFloat16, DType::kFloat16, 128};
  EXPECT_FALSE(BatchDecode::runs_on_tensor_cores(q_kv_differ, {}, 0)) << "q_dtype != kv_dtype: CUDA cores only";
}

// DecodeOptions::tc_cta_q: the tensor-core path's query tile (0: heuristic,
// else one of the prefill tiles), refused on the CUDA-core path.
TEST(ApiErrors, DecodeTensorCoreQueryTile) {
  FakeWorkspace f;
  for (int bad : {-1, 12, 48, 256}) {
    DecodeOptions opt = tensor_cores();
    opt.tc_cta_q = bad;
    EXPECT_THROW_MSG(BatchDecode({}, task(), f.ws, opt), InvalidArgument, "tc_cta_q");
    EXPECT_THROW_MSG(BatchDecode::workspace_size({}, task(), 132, opt), InvalidArgument, "tc_cta_q");
  }
  DecodeOptions cuda_cores;
  cuda_cores.tc_cta_q = 64;
  EXPECT_THROW_MSG(BatchDecode({}, task(), f.ws, cuda_cores), InvalidArgument, "tc_cta_q");
  for (int q : {8, 16, 32, 64, 128}) {
    DecodeOptions opt = tensor_cores();
    opt.tc_cta_q = q;
    BatchDecode dec({}, task(), f.ws, opt);
    ASSERT_NE(dec.tensor_core_prefill(), nullptr);
    EXPECT_EQ(dec.tensor_core_prefill()->config().cta_q, q);
  }
}

// PrefillOptions::tile is checked when the wrapper is built and when its
// workspace is sized, against every query tile and backend the first plan
// may choose, with the field named.
TEST(ApiErrors, PrefillTileOption) {
  FakeWorkspace f;
  auto with = [](PrefillTile t, int cta_q = 0, PrefillBackend b = PrefillBackend::kAuto) {
    PrefillOptions opt;
    opt.tile = t;
    opt.cta_q = cta_q;
    opt.backend = b;
    return opt;
  };
  TaskInfo sized = task();
  sized.max_total_q = 64;
  auto throws = [&](const PrefillOptions& opt, const char* field) {
    EXPECT_THROW_MSG(BatchPrefill({}, task(), f.ws, opt), InvalidArgument, field);
    EXPECT_THROW_MSG(BatchPrefill::workspace_size({}, sized, 132, opt), InvalidArgument, field);
  };
  throws(with({.stages = 1}), "tile.stages");
  throws(with({.cta_kv = 40}), "tile.cta_kv");
  throws(with({.warps_kv = -2}), "tile.warps_kv");
  throws(with({.warps_q = 4}), "tile.warps_q");                            // the heuristic may choose 16 rows
  throws(with({.warps_q = 2}, 64), "tile.warps_q");                        // the Hopper kernel's warps are fixed
  throws(with({.cta_kv = 32}, 128, PrefillBackend::kFA3), "tile.cta_kv");  // Hopper: 64 or 128
  EXPECT_NO_THROW(BatchPrefill({}, task(), f.ws, with({.warps_q = 2}, 64, PrefillBackend::kFA2)));
  EXPECT_NO_THROW(BatchPrefill({}, task(), f.ws, with({.cta_kv = 64, .stages = 3})));
  EXPECT_GT(BatchPrefill::workspace_size({}, sized, 132, with({.cta_kv = 64, .stages = 3})).device_bytes, 0u);
  // Fits the FA2 template at 128 rows but not the Hopper kernel (237568 bytes).
  throws(with({.cta_kv = 128, .stages = 3}), "tile");
  EXPECT_NO_THROW(BatchPrefill({}, task(), f.ws, with({.cta_kv = 128, .stages = 3}, 0, PrefillBackend::kFA2)));
}

}  // namespace
