// The planner under a workspace's capacity (PlannerOptions::max_slots /
// max_split_tiles): a workspace smaller than the ideal holds fewer partial
// states, and the planner must then split less. Random decode and prefill
// batches under small caps never exceed them and still cover every key
// exactly once (planner_check.hpp); caps at or above what the natural plan
// uses change nothing, bit for bit; fixed chunks ignore the caps (the
// wrapper refuses what does not fit); the capped plan is deterministic.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "planner_check.hpp"
#include "tessera/runtime/planner.hpp"

using namespace tessera;
using namespace tessera::test;

namespace {

template <typename Plan>
void expect_same_plan(const Plan& a, const Plan& b, const std::string& what) {
  EXPECT_EQ(a.work_indptr, b.work_indptr) << what;
  EXPECT_TRUE(plan_items(a) == plan_items(b)) << what << ": items differ";
  EXPECT_EQ(a.chunk_size, b.chunk_size) << what;
  EXPECT_EQ(a.num_slots, b.num_slots) << what;
  EXPECT_EQ(a.num_split, b.num_split) << what;
  EXPECT_EQ(0, std::memcmp(&a.max_cta_cost, &b.max_cta_cost, sizeof(double))) << what << ": max_cta_cost";
}

// Lengths with long requests among short ones, so most batches split.
std::vector<int32_t> draw_lens(std::mt19937_64& rng, int n) {
  std::vector<int32_t> lens(n);
  for (auto& l : lens) l = static_cast<int32_t>(rng() % 4 == 0 ? 2000 + rng() % 60000 : rng() % 1500);
  return lens;
}

PlannerOptions draw_options(std::mt19937_64& rng) {
  PlannerOptions opt;
  opt.merge_cost = rng() % 2 ? 0.5 : 0.0;
  opt.chunk_align = rng() % 2 ? 16 : 64;
  if (rng() % 4 == 0) opt.window_left = static_cast<int>(rng() % 20000);
  return opt;
}

// Caps below the natural plan's usage: slots only, split tiles only, or both
// (1 allows no split at all: a split tile needs two slots).
void draw_caps(std::mt19937_64& rng, const PlanStats& natural, PlannerOptions& opt) {
  const int kind = static_cast<int>(rng() % 3);
  if (kind != 1) opt.max_slots = 1 + static_cast<int64_t>(rng() % natural.num_slots);
  if (kind != 0) opt.max_split_tiles = 1 + static_cast<int64_t>(rng() % natural.num_split);
}

TEST(PlannerCapacity, DecodeStaysWithinSmallCaps) {
  Planner planner;
  DecodePlan natural, capped, again;
  std::mt19937_64 rng(17);
  int binding = 0;
  for (int trial = 0; trial < 300; ++trial) {
    const int batch = 1 + static_cast<int>(rng() % 64), ctas = 1 + static_cast<int>(rng() % 300);
    const std::vector<int32_t> lens = draw_lens(rng, batch);
    PlannerOptions opt = draw_options(rng);
    planner.plan_decode(lens, ctas, opt, natural);
    if (natural.num_split == 0) continue;
    draw_caps(rng, natural, opt);
    SCOPED_TRACE("trial " + std::to_string(trial) + ": max_slots " + std::to_string(opt.max_slots) +
                 ", max_split_tiles " + std::to_string(opt.max_split_tiles) + ", natural slots " +
                 std::to_string(natural.num_slots) + ", split " + std::to_string(natural.num_split));
    planner.plan_decode(lens, ctas, opt, capped);
    check_decode_plan(lens, ctas, opt, capped);  // exact cover, slots, the caps, the greedy queues
    EXPECT_GE(capped.chunk_size, natural.chunk_size) << "capacity only lengthens the chunks";
    Planner fresh;
    fresh.plan_decode(lens, ctas, opt, again);
    expect_same_plan(capped, again, "capped plan, fresh Planner");
    if (HasFailure()) return;
    binding += capped.chunk_size > natural.chunk_size;
  }
  EXPECT_GT(binding, 100) << "too few batches where the caps changed the plan";
}

TEST(PlannerCapacity, PrefillStaysWithinSmallCaps) {
  Planner planner;
  PrefillPlan natural, capped, again;
  std::mt19937_64 rng(23);
  int binding = 0;
  for (int trial = 0; trial < 200; ++trial) {
    const int batch = 1 + static_cast<int>(rng() % 16), ctas = 1 + static_cast<int>(rng() % 264);
    const int group = 1 + static_cast<int>(rng() % 8), cta_q = rng() % 2 ? 64 : 16;
    const bool causal = rng() % 2;
    const std::vector<int32_t> kv = draw_lens(rng, batch);
    std::vector<int32_t> qo(kv.size());
    for (size_t r = 0; r < kv.size(); ++r) qo[r] = static_cast<int32_t>(std::min<uint64_t>(kv[r], 1 + rng() % 300));
    PlannerOptions opt = draw_options(rng);
    planner.plan_prefill(qo, kv, group, cta_q, causal, ctas, opt, natural);
    if (natural.num_split == 0) continue;
    draw_caps(rng, natural, opt);
    SCOPED_TRACE("trial " + std::to_string(trial) + ": max_slots " + std::to_string(opt.max_slots) +
                 ", max_split_tiles " + std::to_string(opt.max_split_tiles));
    planner.plan_prefill(qo, kv, group, cta_q, causal, ctas, opt, capped);
    check_prefill_plan(qo, kv, group, cta_q, causal, ctas, opt, capped);
    EXPECT_GE(capped.chunk_size, natural.chunk_size);
    Planner fresh;
    fresh.plan_prefill(qo, kv, group, cta_q, causal, ctas, opt, again);
    expect_same_plan(capped, again, "capped plan, fresh Planner");
    if (HasFailure()) return;
    binding += capped.chunk_size > natural.chunk_size;
  }
  EXPECT_GT(binding, 50) << "too few batches where the caps changed the plan";
}

// Caps the plan does not reach (exactly its usage, or the workspace's worst
// case) leave it bit for bit as without caps: callers whose workspace has the
// ideal size see no change.
TEST(PlannerCapacity, CapsAtOrAboveUsageChangeNothing) {
  Planner planner;
  std::mt19937_64 rng(29);
  for (int trial = 0; trial < 200; ++trial) {
    const int batch = 1 + static_cast<int>(rng() % 64), ctas = 1 + static_cast<int>(rng() % 300);
    const std::vector<int32_t> lens = draw_lens(rng, batch);
    const PlannerOptions opt = draw_options(rng);
    DecodePlan natural, capped;
    planner.plan_decode(lens, ctas, opt, natural);
    for (int which = 0; which < 2; ++which) {
      PlannerOptions c = opt;
      c.max_slots = which ? max_split_slots(ctas) : std::max(1, natural.num_slots);
      c.max_split_tiles = which ? max_split_tiles(ctas) : std::max(1, natural.num_split);
      planner.plan_decode(lens, ctas, c, capped);
      expect_same_plan(natural, capped,
                       "decode trial " + std::to_string(trial) + (which ? " worst-case caps" : " usage"));
    }
    std::vector<int32_t> qo(lens.size());
    for (size_t r = 0; r < lens.size(); ++r) qo[r] = std::min<int32_t>(lens[r], 1 + static_cast<int32_t>(rng() % 200));
    PrefillPlan pn, pc;
    const int cta_q = 64, group = 4;
    planner.plan_prefill(qo, lens, group, cta_q, true, ctas, opt, pn);
    PlannerOptions c = opt;
    c.max_slots = std::max(1, pn.num_slots);
    c.max_split_tiles = std::max(1, pn.num_split);
    planner.plan_prefill(qo, lens, group, cta_q, true, ctas, c, pc);
    expect_same_plan(pn, pc, "prefill trial " + std::to_string(trial));
    if (HasFailure()) return;
  }
}

// A workspace without room for any split: every tile stays whole (a cap of
// one slot, since a split tile needs two), and every key is still covered.
TEST(PlannerCapacity, OneSlotMeansNoSplit) {
  Planner planner;
  DecodePlan plan;
  const std::vector<int32_t> one = {32768};
  planner.plan_decode(one, 132, {}, plan);
  EXPECT_GE(plan.num_slots, 100) << "the natural plan spreads the request over the CTAs";
  PlannerOptions opt;
  opt.max_slots = 1;
  planner.plan_decode(one, 132, opt, plan);
  check_decode_plan(one, 132, opt, plan);
  EXPECT_EQ(plan.num_split, 0);
  ASSERT_EQ(plan.items.size(), 1u);
  EXPECT_EQ(plan.items[0].kv_end - plan.items[0].kv_start, 32768);
  // 16 slots: the request in at most 16 near-equal chunks.
  opt.max_slots = 16;
  planner.plan_decode(one, 132, opt, plan);
  check_decode_plan(one, 132, opt, plan);
  EXPECT_GT(plan.num_slots, 1);
  EXPECT_LE(plan.num_slots, 16);
}

// Batch-invariant chunks keep their length whatever the capacity (the
// wrapper raises when they do not fit): caps change nothing there.
TEST(PlannerCapacity, FixedChunksIgnoreTheCaps) {
  Planner planner;
  DecodePlan a, b;
  const std::vector<int32_t> lens = {30000, 100, 9000, 4097};
  PlannerOptions opt;
  opt.fixed_chunk = 1024;
  planner.plan_decode(lens, 64, opt, a);
  EXPECT_GT(a.num_slots, 4);
  opt.max_slots = 2;
  opt.max_split_tiles = 1;
  planner.plan_decode(lens, 64, opt, b);
  expect_same_plan(a, b, "fixed chunks under caps");
}

}  // namespace
