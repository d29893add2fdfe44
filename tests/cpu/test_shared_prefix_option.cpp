// DecodeOptions / PrefillOptions::shared_prefix without a GPU: what the
// option does not combine with is refused by name when the workspace is
// sized (before anything needs a device), and its size counts the shared
// level on top of the wrapper's own.
#include <gtest/gtest.h>

#include "tessera/api/decode.hpp"
#include "tessera/api/prefill.hpp"
#include "test_util.hpp"

using namespace tessera;

namespace {

constexpr int kSms = 132;

TaskInfo bounded_task() {
  TaskInfo t{32, 8, 16, KVLayout::kNHD, 64, 4096};
  t.max_total_q = 256;
  return t;
}

AttentionSpec spec_with(VariantSpec v, DType kv = DType::kFloat16) {
  return AttentionSpec{std::move(v), DType::kFloat16, kv, DType::kFloat16, 128};
}

DecodeOptions decode_auto() {
  DecodeOptions o;
  o.shared_prefix.enabled = true;
  return o;
}

PrefillOptions prefill_auto() {
  PrefillOptions o;
  o.shared_prefix.enabled = true;
  return o;
}

}  // namespace

TEST(SharedPrefixOption, WorkspaceCountsTheSharedLevel) {
  const TaskInfo task = bounded_task();
  const AttentionSpec spec = spec_with(variants::standard());
  for (bool minimum : {false, true}) {
    const auto size = minimum ? BatchDecode::min_workspace_size : BatchDecode::workspace_size;
    const auto own = size(spec, task, kSms, {}), both = size(spec, task, kSms, decode_auto());
    // At least the unique level's LSE beside the wrapper's own sections.
    EXPECT_GE(both.device_bytes, own.device_bytes + sizeof(float) * task.max_batch * task.num_qo_heads);
    EXPECT_GT(both.host_bytes, own.host_bytes);
    const auto psize = minimum ? BatchPrefill::min_workspace_size : BatchPrefill::workspace_size;
    const auto pown = psize(spec, task, kSms, {}), pboth = psize(spec, task, kSms, prefill_auto());
    EXPECT_GE(pboth.device_bytes, pown.device_bytes + sizeof(float) * task.max_total_q * task.num_qo_heads);
    EXPECT_GT(pboth.host_bytes, pown.host_bytes);
  }
}

TEST(SharedPrefixOption, RefusesWhatDoesNotSplitExactly) {
  const TaskInfo task = bounded_task();
  for (const VariantSpec& v : {variants::rope(), variants::sliding_window(64), variants::alibi(),
                               variants::attention_sink(), variants::flash_sigmoid()}) {
    EXPECT_THROW_MSG(BatchDecode::workspace_size(spec_with(v), task, kSms, decode_auto()), InvalidArgument,
                     "shared_prefix");
    EXPECT_THROW_MSG(BatchPrefill::workspace_size(spec_with(v), task, kSms, prefill_auto()), InvalidArgument,
                     "shared_prefix");
  }
  EXPECT_THROW_MSG(BatchPrefill::workspace_size(spec_with(variants::custom_mask()), task, kSms, prefill_auto()),
                   InvalidArgument, "shared_prefix");
  // The soft cap and causal split exactly.
  EXPECT_NO_THROW(BatchDecode::workspace_size(spec_with(variants::soft_cap(30.f)), task, kSms, decode_auto()));
  EXPECT_NO_THROW(BatchPrefill::workspace_size(spec_with(variants::soft_cap(30.f, true)), task, kSms, prefill_auto()));
  EXPECT_NO_THROW(BatchPrefill::workspace_size(spec_with(variants::causal()), task, kSms, prefill_auto()));
  EXPECT_THROW_MSG(BatchDecode::workspace_size(spec_with(variants::standard(), DType::kFloat8E4M3), task, kSms,
                                               decode_auto()),
                   InvalidArgument, "shared_prefix");
}

TEST(SharedPrefixOption, RefusesBadSettingsAndOpenBounds) {
  const AttentionSpec spec = spec_with(variants::standard());
  DecodeOptions zero = decode_auto();
  zero.shared_prefix.min_shared_tokens = 0;
  EXPECT_THROW_MSG(BatchDecode::workspace_size(spec, bounded_task(), kSms, zero), InvalidArgument, "min_shared_tokens");
  DecodeOptions one = decode_auto();
  one.shared_prefix.min_members = 1;
  EXPECT_THROW_MSG(BatchDecode::workspace_size(spec, bounded_task(), kSms, one), InvalidArgument, "min_members");
  DecodeOptions negative = decode_auto();
  negative.shared_prefix.min_saved_tokens = -1;
  EXPECT_THROW_MSG(BatchDecode::workspace_size(spec, bounded_task(), kSms, negative), InvalidArgument,
                   "min_saved_tokens");
  DecodeOptions fixed = decode_auto();
  fixed.planner.fixed_chunk = 512;
  EXPECT_THROW_MSG(BatchDecode::workspace_size(spec, bounded_task(), kSms, fixed), InvalidArgument, "fixed_chunk");
  TaskInfo open = bounded_task();
  open.max_total_q = 0;
  EXPECT_THROW_MSG(BatchPrefill::workspace_size(spec, open, kSms, prefill_auto()), InvalidArgument, "task");
  // CascadeAttention's scratch-sharing sizes have no shared level.
  EXPECT_THROW_MSG(BatchPrefill::scratch_size(spec, bounded_task(), kSms, prefill_auto()), InvalidArgument,
                   "shared_prefix");
}
