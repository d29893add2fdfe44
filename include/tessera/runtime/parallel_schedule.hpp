// The device planner's parallel schedule (device/kernels/plan/schedule.cuh)
// on the host: its choice of chunk size, which the host planner makes too,
// and its assignment of chunks to CTAs, which the device planner's host
// twin (runtime/device_planner.hpp) uses.
#pragma once
#include <cstdint>
#include <span>
#include <vector>

#include "tessera/abi/device_plan_params.cuh"
#include "tessera/device/kernels/plan/schedule.cuh"

namespace tessera {

// The parallel schedule's choice of chunk size (plan/schedule.cuh), which
// the host planner makes too, so a tile is cut alike whichever planner
// ran and its output bits do not depend on where the step was planned.
// Tables reused call after call.
class ParallelSchedule {
 public:
  // Tiles of len[i] visible keys and rows[i] query rows; options and CTAs
  // from p (device_plan_config). Returns L (plan::kNoSplit: none splits);
  // chunk0() and cta_first() are then L's: each tile's first chunk, each
  // CTA's first chunk in tile order ([ctas + 1]).
  int choose_chunk_size(const DevicePlanParams& p, std::span<const int32_t> len, std::span<const int32_t> rows);
  const std::vector<int>& chunk0() const { return chunk0_; }
  const std::vector<int>& cta_first() const { return cta_first_; }

 private:
  struct Evaluation {
    int64_t makespan = 0, slots = 0, splits = 0, worst = 0, chunks = 0, cost = 0;
  };
  Evaluation evaluate(int L);
  int64_t chunks_at(int64_t l) const;
  plan::ChunkShape shape(size_t i, int L) const;

  const DevicePlanParams* p_ = nullptr;
  std::vector<int32_t> len_, rows_;
  std::vector<int> chunk0_, cta_first_;
  std::vector<int64_t> before_, mid2_, cta_before_;
};

}  // namespace tessera
