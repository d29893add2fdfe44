// Planning on the GPU (device/kernels/plan/): configuration, launch, and
// the planner's host twin.
//
// The device planner computes the host planner's plan in one block,
// reading the step's lengths from device memory: the chunk size by the
// rule both share (plan::choose_chunk_size, device/kernels/plan/
// schedule.cuh), each candidate judged by Algorithm 1's greedy assignment. plan_on_host() is that plan from the host Planner,
// with the kernel's input checks: the kernel's queues are bitwise these
// (tests compare them on random batches).
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "tessera/abi/device_plan_params.cuh"
#include "tessera/runtime/planner.hpp"

namespace tessera {

namespace jit {
class LoadedKernel;
}

// The planner options and the tile shape in the device planner's integer
// units (PlannerOptions' costs rounded to 1/16 KV token, as the host
// planner rounds them); pointers and bounds are left for the caller.
// tile_rows: query rows per work item (decode 1, prefill cta_q).
DevicePlanParams device_plan_config(const PlannerOptions& opt, int ctas, double tile_rows);

// Dynamic shared memory of the planner kernel for these bounds; throws
// InvalidArgument naming max_batch (or the tiles) when they exceed what
// one block's tables hold.
size_t device_plan_smem_bytes(const DevicePlanParams& p);

// What the kernel reads, as host arrays (kv_last_page_len empty: ragged;
// qo_indptr empty: decode).
struct DevicePlanInputs {
  int batch = 0;
  std::span<const int32_t> qo_indptr, kv_indptr, kv_last_page_len;
};

// What the kernel writes.
struct DevicePlanResult {
  int error = kPlanOk, error_request = 0, error_value = 0;
  std::vector<int32_t> work_indptr;            // [ctas + 1]
  std::vector<DecodeWorkItem> decode_items;    // decode
  std::vector<PrefillWorkItem> items;          // prefill
  std::vector<PrefillWorkItem> first_items;    // prefill: [ctas]
  int32_t chunk_size = 0, num_slots = 0, num_split = 0, num_items = 0;
  PlanStats plan;  // the host planner's statistics of the same plan
};

// The device planner's schedule on the host (config: device_plan_config
// plus the bounds and mode fields; pointers ignored).
DevicePlanResult plan_on_host(const DevicePlanParams& config, const DevicePlanInputs& in);

// A message naming the failed input for a recorded DevicePlanError.
std::string device_plan_error_message(int code, int request, int value);

// The planner kernel (loaded on `device`, its shared memory limit raised to
// smem_bytes) and its launch: one block on `stream`, never early (the
// attention kernels after it read its queues before their dependency wait).
const jit::LoadedKernel& device_planner_kernel(int device, size_t smem_bytes);
void launch_device_planner(const jit::LoadedKernel& kernel, const DevicePlanParams& p, size_t smem_bytes,
                           cudaStream_t stream);

}  // namespace tessera
