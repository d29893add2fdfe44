// CascadeAttention's argument checks, which run before any GPU work (the
// GPU tests are in tests/gpu/test_cascade_gpu.cpp): level specs, workspace
// bounds and size, the levels of a plan, run before plan.
#include <gtest/gtest.h>

#include <vector>

#include "tessera/api/cascade.hpp"
#include "tessera/runtime/cuda.hpp"
#include "test_util.hpp"

using namespace tessera;
using namespace tessera::test;

namespace {

TaskInfo small_task() {
  TaskInfo t{8, 2, 16, KVLayout::kNHD, 8, 64};
  t.max_total_q = 32;
  return t;
}

std::vector<AttentionSpec> two_levels() {
  return {AttentionSpec{}, AttentionSpec{variants::causal(), DType::kFloat16, DType::kFloat16, DType::kFloat16, 128}};
}

// A borrowed host-memory workspace of the size the cascade asks for (sized
// as the constructor sizes its slices: for the GPU's SMs, or one without a
// GPU). Only argument checks run on it, never a plan.
struct HostWorkspace {
  std::vector<char> dev, host;
  Workspace ws;
  HostWorkspace(const std::vector<AttentionSpec>& specs, const TaskInfo& task, size_t shrink = 0, bool least = false) {
    const int sms = cuda::gpu_available() ? cuda::device_info(0).sm_count : 1;
    const auto s = least ? CascadeAttention::min_workspace_size(specs, task, sms)
                         : CascadeAttention::workspace_size(specs, task, sms);
    dev.resize(s.device_bytes + 256);
    host.resize(s.host_bytes + 256);
    auto at256 = [](std::vector<char>& b) {
      return reinterpret_cast<char*>((reinterpret_cast<uintptr_t>(b.data()) + 255) / 256 * 256);
    };
    ws = Workspace(at256(dev), s.device_bytes - shrink, at256(host), s.host_bytes, 0);
  }
};

}  // namespace

TEST(CascadeErrors, LevelSpecsAndBounds) {
  HostWorkspace f(two_levels(), small_task());
  EXPECT_THROW_MSG(CascadeAttention({}, small_task(), f.ws), InvalidArgument, "level_specs: expected at least one");
  auto mixed = two_levels();
  mixed[1].o_dtype = DType::kBFloat16;
  EXPECT_THROW_MSG(CascadeAttention(mixed, small_task(), f.ws), InvalidArgument, "level_specs[1]");
  auto dims = two_levels();
  dims[1].head_dim = 64;
  EXPECT_THROW_MSG(CascadeAttention(dims, small_task(), f.ws), InvalidArgument, "head_dim");
  auto masked = two_levels();
  masked[0].variant = variants::custom_mask();
  EXPECT_THROW_MSG(CascadeAttention(masked, small_task(), f.ws), InvalidArgument, "custom masks");
  TaskInfo open = small_task();
  open.max_total_q = 0;
  EXPECT_THROW_MSG(CascadeAttention(two_levels(), open, f.ws), InvalidArgument, "max_total_q");
  TaskInfo heads = small_task();
  heads.num_qo_heads = 6;
  heads.num_kv_heads = 4;
  EXPECT_THROW_MSG(CascadeAttention(two_levels(), heads, f.ws), InvalidArgument, "num_qo_heads");
  // Below the ideal size the levels' split-KV scratch shrinks; below the minimum it is refused.
  HostWorkspace tight(two_levels(), small_task(), 256);
  EXPECT_NO_THROW(CascadeAttention(two_levels(), small_task(), tight.ws));
  HostWorkspace least(two_levels(), small_task(), 0, true), below(two_levels(), small_task(), 1, true);
  EXPECT_NO_THROW(CascadeAttention(two_levels(), small_task(), least.ws));
  EXPECT_THROW_MSG(CascadeAttention(two_levels(), small_task(), below.ws), InvalidArgument, "workspace");
}

TEST(CascadeErrors, WorkspaceGrowsWithLevelsAndRows) {
  const auto one = CascadeAttention::workspace_size({AttentionSpec{}}, small_task(), 132);
  const auto two = CascadeAttention::workspace_size(two_levels(), small_task(), 132);
  EXPECT_GT(two.device_bytes, one.device_bytes);
  EXPECT_GT(two.host_bytes, one.host_bytes);
  TaskInfo more = small_task();
  more.max_total_q = 4096;
  // The scratch state alone: 4096 rows x 8 heads x (128 fp16 + 2 float32 LSE).
  EXPECT_GE(CascadeAttention::workspace_size(two_levels(), more, 132).device_bytes - two.device_bytes,
            static_cast<size_t>(4096 - 32) * 8 * (128 * 2 + 8));
}

// The levels share one split-KV scratch: a cascade of L levels needs far less
// than L batch prefills' workspaces.
TEST(CascadeErrors, LevelsShareTheSplitScratch) {
  const AttentionSpec spec;
  const TaskInfo t = small_task();
  const auto whole = BatchPrefill::workspace_size(spec, t, 132);
  const auto shared = BatchPrefill::workspace_size_shared(spec, t, 132);
  const size_t scratch = BatchPrefill::scratch_size(spec, t, 132);
  EXPECT_EQ(shared.device_bytes + scratch, whole.device_bytes);
  EXPECT_GT(scratch, shared.device_bytes);  // the partial states dominate
  EXPECT_EQ(shared.host_bytes, whole.host_bytes);
  const auto three = CascadeAttention::workspace_size({spec, spec, spec}, t, 132);
  EXPECT_LT(three.device_bytes, 2 * whole.device_bytes);
  HostWorkspace f(two_levels(), t);
  BatchPrefill pre(spec, t, f.ws);
  alignas(256) static char region[512];
  EXPECT_THROW_MSG(pre.use_shared_scratch(region + 16, 256), InvalidArgument, "scratch: expected a device buffer aligned");
  EXPECT_THROW_MSG(pre.use_shared_scratch(nullptr, 256), InvalidArgument, "scratch");
  EXPECT_NO_THROW(pre.use_shared_scratch(region, sizeof region));
}

TEST(CascadeErrors, PlanChecksEveryLevelFirst) {
  HostWorkspace f(two_levels(), small_task());
  CascadeAttention c(two_levels(), small_task(), f.ws);
  EXPECT_EQ(c.num_levels(), 2);
  EXPECT_THROW_MSG(c.level(2), InvalidArgument, "level");
  // Level 0: one group of 3 rows over 2 pages; level 1: each request its page.
  const std::vector<int32_t> qo0 = {0, 3}, kv0 = {0, 2}, idx0 = {0, 1}, last0 = {16};
  const std::vector<int32_t> qo1 = {0, 1, 2, 3}, kv1 = {0, 1, 2, 3}, idx1 = {2, 3, 4}, last1 = {5, 1, 16};
  const CascadeLevel l0{qo0, kv0, idx0, last0}, l1{qo1, kv1, idx1, last1};
  const std::vector<CascadeLevel> one = {l0};
  EXPECT_THROW_MSG(c.plan(one), InvalidArgument, "levels: expected 2");
  const std::vector<int32_t> qo_short = {0, 1, 2};
  const std::vector<CascadeLevel> rows = {l0, {qo_short, kv1, idx1, last1}};
  EXPECT_THROW_MSG(c.plan(rows), InvalidArgument, "levels[1].qo_indptr: expected the last entry");
  const std::vector<int32_t> qo_down = {0, 2, 1, 3};
  const std::vector<CascadeLevel> down = {l0, {qo_down, kv1, idx1, last1}};
  EXPECT_THROW_MSG(c.plan(down), InvalidArgument, "levels[1].qo_indptr");
  const std::vector<int32_t> idx_bad = {2, 3, -1};
  const std::vector<CascadeLevel> pages = {l0, {qo1, kv1, idx_bad, last1}};
  EXPECT_THROW_MSG(c.plan(pages), InvalidArgument, "levels[1]: indices: expected values >= 0");
  const std::vector<int32_t> last_bad = {17};
  const std::vector<CascadeLevel> tail = {{qo0, kv0, idx0, last_bad}, l1};
  EXPECT_THROW_MSG(c.plan(tail), InvalidArgument, "levels[0]: last_page_len");
  HostTensor q = make_host(DType::kFloat16, {3, 8, 128});
  EXPECT_THROW_MSG(c.run(q.view, PagedKVStorage(), q.view, TensorView()), InvalidArgument, "plan");
}
