// Workspaces below the ideal size (FlashInfer callers bring fixed buffers,
// e.g. 16 MB): the split-KV partial states get the rows that fit, down to
// none, and everything else keeps its size. Checked on the layouts a first
// plan builds (BatchPrefill / BatchDecode::layout_for, no GPU needed), on the
// static sizes (workspace_size: ideal, min_workspace_size: smallest
// accepted), and on CascadeAttention, whose constructor lays out its levels.
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "tessera/api/cascade.hpp"
#include "tessera/api/decode.hpp"
#include "tessera/api/prefill.hpp"
#include "tessera/runtime/cuda.hpp"
#include "test_util.hpp"

using namespace tessera;
using namespace tessera::test;

namespace {

constexpr size_t kMB = size_t{1} << 20;

// Llama-like: fp16, head_dim 128, 32 query heads over 8 KV heads.
AttentionSpec fp16_spec() {
  return AttentionSpec{variants::standard(), DType::kFloat16, DType::kFloat16, DType::kFloat16, 128};
}

TaskInfo prefill_task(int64_t max_batch, int64_t max_total_q, int64_t max_pages) {
  TaskInfo t{32, 8, 16, KVLayout::kNHD, max_batch, max_pages};
  t.max_total_q = max_total_q;
  return t;
}

// The minimum and the ideal, as the layout's own fields say.
size_t min_total(const BatchPrefill::Layout& l) { return l.scratch + l.min_scratch_bytes; }
size_t ideal_total(const BatchPrefill::Layout& l) { return l.scratch + l.ideal_scratch_bytes; }

TEST(WorkspaceFit, PrefillPartialRowsShrinkToTheWorkspace) {
  const AttentionSpec spec = fp16_spec();
  const TaskInfo task = prefill_task(4, 512, 256);
  const int ctas = 33, groups = 8, cta_q = 64;  // an H100's 264 CTAs over 8 KV heads
  const auto ideal = BatchPrefill::layout_for(spec, task, ctas, groups, cta_q, 0);
  EXPECT_EQ(ideal.max_slot_rows, max_split_slots(ctas) * cta_q);
  EXPECT_EQ(ideal.max_slot_rows, ideal.ideal_slot_rows);
  EXPECT_EQ(ideal.total, ideal_total(ideal));
  EXPECT_LT(ideal.min_scratch_bytes, ideal.ideal_scratch_bytes / 100) << "the partial states are most of the scratch";

  // At or above the ideal: the ideal layout, section for section.
  const auto roomy = BatchPrefill::layout_for(spec, task, ctas, groups, cta_q, 0, ideal.total + 12345);
  EXPECT_EQ(roomy.max_slot_rows, ideal.max_slot_rows);
  EXPECT_EQ(roomy.partial_o, ideal.partial_o);
  EXPECT_EQ(roomy.total, ideal.total);

  // Below it: fewer rows, in whole query tiles, within the bytes given; the
  // other sections (index arrays, items, counters) keep their offsets.
  int64_t prev = ideal.max_slot_rows + 1;
  for (size_t bytes : {ideal.total - 1, ideal.total / 2, ideal.total / 7, min_total(ideal) + 300 * 1024}) {
    const auto l = BatchPrefill::layout_for(spec, task, ctas, groups, cta_q, 0, bytes);
    SCOPED_TRACE("workspace of " + std::to_string(bytes) + " bytes");
    EXPECT_LT(l.max_slot_rows, prev);
    EXPECT_GT(l.max_slot_rows, 0);
    EXPECT_EQ(l.max_slot_rows % cta_q, 0);
    EXPECT_LE(l.total, bytes);
    // The largest whole tile count that fits: one more tile would not.
    const size_t one_more = (l.max_slot_rows + cta_q) * groups * (spec.head_dim + 1) * sizeof(float);
    EXPECT_GT(l.scratch + l.partial_lse + one_more, bytes);
    EXPECT_EQ(l.items, ideal.items);
    EXPECT_EQ(l.indices, ideal.indices);
    EXPECT_EQ(l.scratch, ideal.scratch);
    EXPECT_EQ(l.counters, ideal.counters);
    EXPECT_EQ(l.max_split_tiles, ideal.max_split_tiles);
    EXPECT_EQ(l.ideal_slot_rows, ideal.ideal_slot_rows);
    prev = l.max_slot_rows;
  }

  // The minimum is accepted (no partial states), one byte less is refused,
  // naming the workspace and the minimum.
  const auto least = BatchPrefill::layout_for(spec, task, ctas, groups, cta_q, 0, min_total(ideal));
  EXPECT_EQ(least.max_slot_rows, 0);
  EXPECT_EQ(least.total, min_total(ideal));
  EXPECT_THROW_MSG(BatchPrefill::layout_for(spec, task, ctas, groups, cta_q, 0, min_total(ideal) - 1),
                   InvalidArgument,
                   "workspace: expected at least " + std::to_string(min_total(ideal)) + " device bytes");
}

TEST(WorkspaceFit, PrefillSharedScratchShrinksToo) {
  const AttentionSpec spec = fp16_spec();
  const TaskInfo task = prefill_task(4, 512, 256);
  const auto ideal = BatchPrefill::layout_for(spec, task, 33, 8, 64, 0);
  const size_t half = ideal.ideal_scratch_bytes / 2;
  const auto l = BatchPrefill::layout_for(spec, task, 33, 8, 64, 0, ideal.scratch, &half);
  EXPECT_LT(l.max_slot_rows, ideal.max_slot_rows);
  EXPECT_GT(l.max_slot_rows, 0);
  EXPECT_LE(l.scratch_bytes, half);
  const size_t least = ideal.min_scratch_bytes, below = least - 1;
  EXPECT_EQ(BatchPrefill::layout_for(spec, task, 33, 8, 64, 0, ideal.scratch, &least).max_slot_rows, 0);
  EXPECT_THROW_MSG(BatchPrefill::layout_for(spec, task, 33, 8, 64, 0, ideal.scratch, &below), InvalidArgument,
                   "scratch: expected at least " + std::to_string(least));
  EXPECT_THROW_MSG(BatchPrefill::layout_for(spec, task, 33, 8, 64, 0, ideal.scratch - 1, &least), InvalidArgument,
                   "workspace: expected at least " + std::to_string(ideal.scratch));
}

// Fixed chunks size the partial states for their pieces; a smaller
// workspace shrinks those rows as well (plan() then refuses what does not fit).
TEST(WorkspaceFit, PrefillFixedChunksShrinkToo) {
  const AttentionSpec spec = fp16_spec();
  TaskInfo task = prefill_task(4, 512, 4096);
  const auto ideal = BatchPrefill::layout_for(spec, task, 33, 8, 64, 1024);
  EXPECT_GT(ideal.ideal_slot_rows, max_split_slots(33) * 64);
  const auto l = BatchPrefill::layout_for(spec, task, 33, 8, 64, 1024, ideal.total / 3);
  EXPECT_LT(l.max_slot_rows, ideal.max_slot_rows);
  EXPECT_EQ(l.max_items, ideal.max_items);
}

TEST(WorkspaceFit, DecodePartialSlotsShrinkToTheWorkspace) {
  const AttentionSpec spec = fp16_spec();
  const TaskInfo task{32, 8, 16, KVLayout::kNHD, 64, 8192};
  const int ctas = 66;
  const auto ideal = BatchDecode::layout_for(spec, task, ctas, 0);
  EXPECT_EQ(ideal.max_slots, decode_max_slots(ctas));
  EXPECT_EQ(ideal.total, ideal.ideal_total);
  EXPECT_LT(ideal.min_total, ideal.ideal_total);
  EXPECT_EQ(BatchDecode::layout_for(spec, task, ctas, 0, ideal.total + 999).max_slots, ideal.max_slots);
  int64_t prev = ideal.max_slots + 1;
  for (size_t bytes : {ideal.total - 1, (ideal.total + ideal.min_total) / 2, ideal.min_total + 20000}) {
    const auto l = BatchDecode::layout_for(spec, task, ctas, 0, bytes);
    SCOPED_TRACE("workspace of " + std::to_string(bytes) + " bytes");
    EXPECT_LT(l.max_slots, prev);
    EXPECT_GT(l.max_slots, 0);
    EXPECT_LE(l.total, bytes);
    EXPECT_GT(l.partial_lse + (l.max_slots + 1) * task.num_qo_heads * (spec.head_dim + 1) * sizeof(float), bytes);
    EXPECT_EQ(l.items, ideal.items);
    EXPECT_EQ(l.counters, ideal.counters);
    EXPECT_EQ(l.staged, ideal.staged);
    prev = l.max_slots;
  }
  EXPECT_EQ(BatchDecode::layout_for(spec, task, ctas, 0, ideal.min_total).max_slots, 0);
  EXPECT_THROW_MSG(BatchDecode::layout_for(spec, task, ctas, 0, ideal.min_total - 1), InvalidArgument,
                   "workspace: expected at least " + std::to_string(ideal.min_total) + " device bytes");
}

// The problem this solves: on an H100 (132 SMs) the ideal prefill workspace
// for even a one-request bound is over 32 MB, all of it partial states; the
// 16 MB buffers FlashInfer callers allocate are above the minimum.
TEST(WorkspaceFit, SixteenMegabytesAreEnoughOnAnH100) {
  const AttentionSpec spec = fp16_spec();
  const TaskInfo one = prefill_task(1, 8, 1);
  const auto ideal = BatchPrefill::workspace_size(spec, one, 132);
  const auto least = BatchPrefill::min_workspace_size(spec, one, 132);
  EXPECT_GT(ideal.device_bytes, 32 * kMB);
  EXPECT_LT(least.device_bytes, kMB);
  EXPECT_EQ(least.host_bytes, ideal.host_bytes);
  // min_workspace_size is what a layout without partial states needs; the
  // static sizes stay the largest over the tiles a first plan may pick.
  const size_t scratch = BatchPrefill::scratch_size(spec, one, 132);
  const size_t min_scratch = BatchPrefill::min_scratch_size(spec, one, 132);
  const auto shared = BatchPrefill::workspace_size_shared(spec, one, 132);
  EXPECT_EQ(shared.device_bytes + scratch, ideal.device_bytes);
  EXPECT_EQ(shared.device_bytes + min_scratch, least.device_bytes);

  // Serving bounds: 256 requests, 8k query rows, 64k pages.
  const TaskInfo serving = prefill_task(256, 8192, 65536);
  EXPECT_LT(BatchPrefill::min_workspace_size(spec, serving, 132).device_bytes, 16 * kMB);
  EXPECT_GT(BatchPrefill::workspace_size(spec, serving, 132).device_bytes, 16 * kMB);
  TaskInfo dec{32, 8, 16, KVLayout::kNHD, 256, 65536};
  for (bool tc : {false, true}) {
    DecodeOptions opt;
    opt.use_tensor_cores = tc;
    opt.cuda_cores = !tc;
    SCOPED_TRACE(tc ? "tensor cores" : "CUDA cores");
    const auto d_least = BatchDecode::min_workspace_size(spec, dec, 132, opt);
    const auto d_ideal = BatchDecode::workspace_size(spec, dec, 132, opt);
    EXPECT_LT(d_least.device_bytes, 16 * kMB);
    EXPECT_LT(d_least.device_bytes, d_ideal.device_bytes);
    EXPECT_EQ(d_least.host_bytes, d_ideal.host_bytes);
  }
  // Left to the wrapper, the decode workspace holds either kernel's sections.
  const auto either = BatchDecode::min_workspace_size(spec, dec, 132);
  DecodeOptions tc;
  tc.use_tensor_cores = true;
  EXPECT_GE(either.device_bytes, BatchDecode::min_workspace_size(spec, dec, 132, tc).device_bytes);
}

// CascadeAttention lays out its levels in the constructor: the minimum is
// accepted (the levels' shared split-KV scratch shrinks), one byte less not.
TEST(WorkspaceFit, CascadeAcceptsItsMinimum) {
  const std::vector<AttentionSpec> specs = {fp16_spec(), AttentionSpec{variants::causal(), DType::kFloat16,
                                                                       DType::kFloat16, DType::kFloat16, 128}};
  const TaskInfo task = prefill_task(8, 256, 64);
  const int sms = cuda::gpu_available() ? cuda::device_info(0).sm_count : 1;
  const auto ideal = CascadeAttention::workspace_size(specs, task, sms);
  const auto least = CascadeAttention::min_workspace_size(specs, task, sms);
  ASSERT_LT(least.device_bytes, ideal.device_bytes);
  EXPECT_EQ(least.host_bytes, ideal.host_bytes);
  std::vector<char> dev(ideal.device_bytes + 256), host(ideal.host_bytes + 256);
  auto at256 = [](std::vector<char>& b) {
    return reinterpret_cast<char*>((reinterpret_cast<uintptr_t>(b.data()) + 255) / 256 * 256);
  };
  for (size_t bytes : {ideal.device_bytes, (ideal.device_bytes + least.device_bytes) / 2, least.device_bytes}) {
    Workspace ws(at256(dev), bytes, at256(host), ideal.host_bytes, 0);
    EXPECT_NO_THROW((void)CascadeAttention(specs, task, ws)) << bytes << " bytes";
  }
  Workspace tight(at256(dev), least.device_bytes - 1, at256(host), ideal.host_bytes, 0);
  EXPECT_THROW_MSG(CascadeAttention(specs, task, tight), InvalidArgument,
                   "workspace: expected at least " + std::to_string(least.device_bytes) + " device bytes");
}

}  // namespace
