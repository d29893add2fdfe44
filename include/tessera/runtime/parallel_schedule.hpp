// The chunk-size rule of the host and device planners
// (device/kernels/plan/schedule.cuh), on the host.
#pragma once
#include <cstdint>
#include <span>
#include <vector>

#include "tessera/abi/device_plan_params.cuh"
#include "tessera/device/kernels/plan/schedule.cuh"

namespace tessera {

// The chunk size: Algorithm 1's line 3, the one-wave refinement, short
// steps, merge-aware growth and the workspace's capacity, each candidate
// judged by the makespan of the parallel schedule (chunks in tile order,
// each to the CTA whose share of the total cost holds its midpoint), which
// one block computes with scans, so the device planner decides exactly as
// the host does. Tables reused call after call.
class ParallelSchedule {
 public:
  // Tiles of len[i] visible keys and rows[i] query rows; options and CTAs
  // from p (device_plan_config). Returns L (plan::kNoSplit: none splits).
  int choose_chunk_size(const DevicePlanParams& p, std::span<const int32_t> len, std::span<const int32_t> rows);

 private:
  plan::Evaluation evaluate(int L);
  int64_t chunks_at(int64_t l) const;
  plan::ChunkShape shape(size_t i, int L) const;

  const DevicePlanParams* p_ = nullptr;
  std::vector<int32_t> len_, rows_;
  std::vector<int> chunk0_, cta_first_;
  std::vector<int64_t> before_, mid2_, cta_before_;
};

}  // namespace tessera
