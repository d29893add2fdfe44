// Planning on the GPU: the wrappers' argument checks of plan_on_device /
// plan_paged_on_device / plan_ragged_on_device and of the cascade's
// plan_on_device, which raise before any GPU work (so they run without a
// GPU). The step's buffers are views that claim the workspace's CUDA device;
// no check reads them.
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "tessera/api/cascade.hpp"
#include "tessera/api/prefill.hpp"
#include "tessera/runtime/cuda.hpp"
#include "fake_workspace.hpp"
#include "test_util.hpp"

using namespace tessera;
using namespace tessera::test;

namespace {

constexpr int64_t kMaxBatch = 4, kMaxQ = 64, kMaxPages = 16;

TaskInfo bounded_task() {
  TaskInfo t{8, 2, 16, KVLayout::kNHD, kMaxBatch, kMaxPages};
  t.max_total_q = kMaxQ;
  return t;
}

// int32 views of `count` entries on CUDA device 0 (never dereferenced here).
struct StepViews {
  int32_t storage[64] = {};
  TensorView view(int64_t count, DType dt = DType::kInt32, DeviceType where = DeviceType::kCUDA) {
    return TensorView(storage, dt, Device{where, 0}, {count});
  }
  DeviceBatch ragged() { return {view(1), view(kMaxBatch + 1), view(kMaxBatch + 1), TensorView(), TensorView()}; }
  DeviceBatch paged() {
    return {view(1), view(kMaxBatch + 1), view(kMaxBatch + 1), view(kMaxPages), view(kMaxBatch)};
  }
};

TEST(DevicePlanApi, RaggedArguments) {
  FakeWorkspace f;
  BatchPrefill pre({}, bounded_task(), f.ws);
  StepViews s;
  for (int64_t bad : {int64_t{0}, int64_t{-3}, int64_t{1} << 31})
    EXPECT_THROW_MSG(pre.plan_ragged_on_device(s.ragged(), bad), InvalidArgument, "max_kv_tokens");
  DeviceBatch with_ids = s.ragged();
  with_ids.kv_indices = s.view(kMaxPages);
  EXPECT_THROW_MSG(pre.plan_ragged_on_device(with_ids, 100), InvalidArgument, "kv_indices");
  DeviceBatch with_last = s.ragged();
  with_last.kv_last_page_len = s.view(kMaxBatch);
  EXPECT_THROW_MSG(pre.plan_ragged_on_device(with_last, 100), InvalidArgument, "kv_last_page_len");
  DeviceBatch no_size = s.ragged();
  no_size.batch_size = TensorView();
  EXPECT_THROW_MSG(pre.plan_ragged_on_device(no_size, 100), InvalidArgument, "batch_size");
  DeviceBatch short_indptr = s.ragged();
  short_indptr.kv_indptr = s.view(kMaxBatch);
  EXPECT_THROW_MSG(pre.plan_ragged_on_device(short_indptr, 100), InvalidArgument, "kv_indptr");
  DeviceBatch host_qo = s.ragged();
  host_qo.qo_indptr = s.view(kMaxBatch + 1, DType::kInt32, DeviceType::kCPU);
  EXPECT_THROW_MSG(pre.plan_ragged_on_device(host_qo, 100), TypeMismatch, "qo_indptr");
  DeviceBatch wide = s.ragged();
  wide.kv_indptr = s.view(kMaxBatch + 1, DType::kFloat32);
  EXPECT_THROW_MSG(pre.plan_ragged_on_device(wide, 100), TypeMismatch, "kv_indptr");
  // Ragged KV needs no page bound, but the query bounds.
  TaskInfo open = bounded_task();
  open.max_total_q = 0;
  BatchPrefill unbounded({}, open, f.ws);
  EXPECT_THROW_MSG(unbounded.plan_ragged_on_device(s.ragged(), 100), InvalidArgument, "max_total_q");
}

TEST(DevicePlanApi, PagedNeedsItsPageTable) {
  FakeWorkspace f;
  BatchPrefill pre({}, bounded_task(), f.ws);
  StepViews s;
  DeviceBatch no_ids = s.paged();
  no_ids.kv_indices = TensorView();
  EXPECT_THROW_MSG(pre.plan_paged_on_device(no_ids), InvalidArgument, "kv_indices");
  DeviceBatch no_last = s.paged();
  no_last.kv_last_page_len = TensorView();
  EXPECT_THROW_MSG(pre.plan_paged_on_device(no_last), InvalidArgument, "kv_last_page_len");
  AttentionSpec masked;
  masked.variant = variants::custom_mask();
  BatchPrefill custom(masked, bounded_task(), f.ws);
  EXPECT_THROW_MSG(custom.plan_ragged_on_device(s.ragged(), 100), InvalidArgument, "plan_ragged");
  EXPECT_THROW_MSG(custom.plan_paged_on_device(s.paged()), InvalidArgument, "plan_paged");
}

TEST(DevicePlanApi, CascadeLevels) {
  const std::vector<AttentionSpec> specs(2);
  const TaskInfo task = bounded_task();
  const int sms = cuda::gpu_available() ? cuda::device_info(0).sm_count : 1;  // what the constructor sizes for
  const auto need = CascadeAttention::min_workspace_size(specs, task, sms);
  HostWorkspace h(need.device_bytes, need.host_bytes);
  CascadeAttention cascade(specs, task, h.ws);
  StepViews s;
  const std::vector<DeviceBatch> one = {s.paged()};
  EXPECT_THROW_MSG(cascade.plan_on_device(one), InvalidArgument, "levels");
  std::vector<DeviceBatch> two = {s.paged(), s.paged()};
  two[1].qo_indptr = TensorView();
  EXPECT_THROW_MSG(cascade.plan_on_device(two), InvalidArgument, "levels[1].qo_indptr");
}

}  // namespace
