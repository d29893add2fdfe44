// Randomized property test of the host planner: thousands of seeded decode
// and prefill batches (skewed, constant, empty, huge and tiny lengths; random
// CTA counts and PlannerOptions) checked against the planner's contract
// (planner_check.hpp: exact cover of every tile's visible keys, slots,
// counters, workspace bounds, the greedy schedule and its balance bound),
// plus determinism across Planner objects and bad arguments. Every case has
// its own seed, printed with a reproducer on failure. TESSERA_FUZZ_SEED
// picks another base seed and TESSERA_FUZZ_SCALE multiplies the case count,
// for longer local runs; CI runs the fixed defaults.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "fuzz_util.hpp"
#include "planner_check.hpp"
#include "tessera/runtime/planner.hpp"
#include "test_util.hpp"

using namespace tessera;
using namespace tessera::test;

namespace {

int draw_batch(Rng& rng) {
  const int kind = static_cast<int>(rng.uniform(0, 19));
  if (kind == 0) return 0;
  if (kind < 3) return 1;
  if (kind < 8) return static_cast<int>(rng.uniform(1, 16));
  return static_cast<int>(rng.uniform(1, 300));
}

int draw_ctas(Rng& rng) {
  const int kind = static_cast<int>(rng.uniform(0, 4));
  if (kind == 0) return static_cast<int>(rng.uniform(1, 8));
  if (kind == 1) return rng.pick({78, 108, 114, 132, 264, 396, 528});
  return static_cast<int>(rng.uniform(1, 1000));
}

PlannerOptions draw_options(Rng& rng, int ctas) {
  PlannerOptions o;
  o.split_kv = rng.chance(0.85);
  o.alpha = rng.pick({32.0, 0.0, 1.0, 8.0, rng.real(0, 128)});
  o.beta = rng.chance(0.05) ? 0.0 : rng.pick({1.0, 0.5, 2.0, rng.real(0.05, 4)});
  o.min_chunk = static_cast<int>(rng.pick<int64_t>({64, 1, 16, 256, rng.uniform(0, 2000)}));
  o.chunk_align = rng.pick({1, 16, 64});
  o.merge_cost = rng.pick({0.0, 0.5});
  if (rng.chance(0.5))
    o.window_left = static_cast<int>(rng.pick<int64_t>({0, rng.uniform(0, 256), rng.uniform(0, kMaxLen)}));
  o.serpentine = rng.chance(0.25);
  o.unsplit_max_kv = static_cast<int>(rng.pick<int64_t>({-1, 0, 1024, rng.uniform(1, 8192)}));
  o.unsplit_min_tiles = static_cast<int>(rng.pick<int64_t>({1, rng.uniform(1, ctas), std::max(1, ctas / 4)}));
  if (rng.chance(0.1)) o.fixed_chunk = static_cast<int>(rng.pick<int64_t>({1024, rng.uniform(512, 8192)}));
  return o;
}

template <typename T>
std::string list(const std::vector<T>& v) {
  std::ostringstream s;
  s << "{";
  for (size_t i = 0; i < v.size(); ++i) s << (i ? ", " : "") << v[i];
  s << "}";
  return s.str();
}

std::string options(const PlannerOptions& o) {
  std::ostringstream s;
  s.precision(17);
  s << "opt.split_kv = " << o.split_kv << "; opt.alpha = " << o.alpha << "; opt.beta = " << o.beta
    << "; opt.min_chunk = " << o.min_chunk << "; opt.chunk_align = " << o.chunk_align
    << "; opt.merge_cost = " << o.merge_cost << "; opt.window_left = " << o.window_left
    << "; opt.serpentine = " << o.serpentine << "; opt.unsplit_max_kv = " << o.unsplit_max_kv
    << "; opt.unsplit_min_tiles = " << o.unsplit_min_tiles << "; opt.fixed_chunk = " << o.fixed_chunk << ";";
  return s.str();
}

// Plans must not depend on what a Planner planned before, nor on the output
// object's previous contents: compare every planner-written field bitwise.
template <typename Plan>
void expect_same_plan(const Plan& a, const Plan& b, const char* what) {
  EXPECT_EQ(a.work_indptr, b.work_indptr) << what;
  EXPECT_TRUE(plan_items(a) == plan_items(b)) << what << ": items differ";
  EXPECT_EQ(a.chunk_size, b.chunk_size) << what;
  EXPECT_EQ(a.num_slots, b.num_slots) << what;
  EXPECT_EQ(a.num_split, b.num_split) << what;
  EXPECT_EQ(0, std::memcmp(&a.max_cta_cost, &b.max_cta_cost, sizeof(double))) << what << ": max_cta_cost";
  EXPECT_EQ(0, std::memcmp(&a.mean_cta_cost, &b.mean_cta_cost, sizeof(double))) << what << ": mean_cta_cost";
}

// What the cases exercised, so a generator change that loses a path shows.
struct Coverage {
  int cases = 0, split = 0, whole = 0, short_step = 0, grown_l = 0, windowed = 0, serpentine = 0, errors = 0;
  void count(const PlanStats& p, const PlannerOptions& o, int64_t line3) {
    ++cases;
    p.num_split > 0 ? ++split : ++whole;
    short_step += o.split_kv && o.unsplit_max_kv > 0 && p.chunk_size == INT32_MAX;
    grown_l += p.chunk_size != INT32_MAX && p.chunk_size > line3 && p.num_split > 0;
    windowed += o.window_left >= 0;
    serpentine += o.serpentine;
  }
  void expect_all(const char* what) const {
    std::printf("%s: %d cases, %d split, %d whole, %d short steps, %d with L above line 3, %d windowed, "
                "%d serpentine, %d argument errors\n",
                what, cases, split, whole, short_step, grown_l, windowed, serpentine, errors);
    EXPECT_GT(split, cases / 10);
    EXPECT_GT(whole, cases / 10);
    EXPECT_GT(short_step, 0);
    EXPECT_GT(grown_l, 0);
    EXPECT_GT(windowed, cases / 4);
    EXPECT_GT(serpentine, cases / 10);
    EXPECT_GT(errors, 0);
  }
};

// A bad call on the shared Planner: it must throw InvalidArgument naming the
// argument, and leave the Planner fit for the next case (the next case
// compares the shared Planner's plan with a fresh one's).
void bad_decode_call(Rng& rng, Planner& planner, std::vector<int32_t> lens, Coverage& cov) {
  DecodePlan plan;
  ++cov.errors;
  if (lens.empty() || rng.chance(0.5)) {
    const int ctas = static_cast<int>(rng.pick<int64_t>({0, -1, rng.uniform(-1000, 0), 1 << 20}));
    EXPECT_THROW_MSG(planner.plan_decode(lens, ctas, {}, plan), InvalidArgument, "ctas");
  } else {
    lens[rng.uniform(0, static_cast<int64_t>(lens.size()) - 1)] = static_cast<int32_t>(rng.uniform(INT32_MIN, -1));
    EXPECT_THROW_MSG(planner.plan_decode(lens, 8, {}, plan), InvalidArgument, "kv_lens");
  }
}

void bad_prefill_call(Rng& rng, Planner& planner, std::vector<int32_t> qo, std::vector<int32_t> kv,
                      Coverage& cov) {
  PrefillPlan plan;
  ++cov.errors;
  const int kind = static_cast<int>(rng.uniform(0, qo.empty() ? 1 : 4));
  if (kind == 0) {
    const int ctas = static_cast<int>(rng.pick<int64_t>({0, -1, rng.uniform(-1000, 0)}));
    EXPECT_THROW_MSG(planner.plan_prefill(qo, kv, 1, 64, true, ctas, {}, plan), InvalidArgument, "ctas");
  } else if (kind == 1) {
    rng.chance(0.5) || kv.empty() ? kv.push_back(1) : kv.pop_back();
    EXPECT_THROW_MSG(planner.plan_prefill(qo, kv, 1, 64, true, 8, {}, plan), InvalidArgument, "kv_lens");
  } else if (kind == 2) {
    auto& v = rng.chance(0.5) ? qo : kv;
    v[rng.uniform(0, static_cast<int64_t>(v.size()) - 1)] = static_cast<int32_t>(rng.uniform(INT32_MIN, -1));
    EXPECT_THROW_MSG(planner.plan_prefill(qo, kv, 1, 64, false, 8, {}, plan), InvalidArgument,
                     &v == &qo ? "qo_lens" : "kv_lens");
  } else {
    const bool group = rng.chance(0.5);
    const int bad = static_cast<int>(rng.uniform(-4, 0));
    EXPECT_THROW_MSG(planner.plan_prefill(qo, kv, group ? bad : 1, group ? 64 : bad, true, 8, {}, plan),
                     InvalidArgument, group ? "group" : "cta_q");
  }
}

}  // namespace

TEST(PlannerFuzz, Decode) {
  const uint64_t seed = base_seed();
  Planner shared;
  DecodePlan plan, again, fresh_plan;
  Coverage cov;
  const int n = case_count(2500);
  for (int i = 0; i < n; ++i) {
    const uint64_t cs = case_seed(seed, 1, i);
    Rng rng{std::mt19937_64(cs)};
    const int dist = static_cast<int>(rng.uniform(0, 6));
    const int ctas = draw_ctas(rng);
    const std::vector<int32_t> lens = draw_lengths(rng, draw_batch(rng), dist);
    const PlannerOptions opt = draw_options(rng, ctas);
    SCOPED_TRACE("PlannerFuzz.Decode: TESSERA_FUZZ_SEED=" + std::to_string(seed) + " case " + std::to_string(i) +
                 " (case seed " + std::to_string(cs) + ", " + kDistNames[dist] + " lengths)");

    shared.plan_decode(lens, ctas, opt, plan);
    check_decode_plan(lens, ctas, opt, plan);
    shared.plan_decode(lens, ctas, opt, again);
    expect_same_plan(plan, again, "planned twice");
    Planner fresh;
    fresh.plan_decode(lens, ctas, opt, fresh_plan);
    expect_same_plan(plan, fresh_plan, "fresh Planner vs reused");
    if (::testing::Test::HasFailure()) {
      ADD_FAILURE() << "reproducer:\n  PlannerOptions opt; " << options(opt) << "\n  std::vector<int32_t> lens = "
                    << list(lens) << ";\n  planner.plan_decode(lens, /*ctas=*/" << ctas << ", opt, plan);";
      return;
    }
    cov.count(plan, opt, line3_chunk(decode_tiles(lens, opt), ctas, opt));
    if (rng.chance(0.1)) bad_decode_call(rng, shared, lens, cov);
  }
  cov.expect_all("decode");
}

TEST(PlannerFuzz, Prefill) {
  const uint64_t seed = base_seed();
  Planner shared;
  PrefillPlan plan, again, fresh_plan;
  Coverage cov;
  const int n = case_count(1500);
  for (int i = 0; i < n; ++i) {
    const uint64_t cs = case_seed(seed, 2, i);
    Rng rng{std::mt19937_64(cs)};
    const int dist = static_cast<int>(rng.uniform(0, 6));
    const int ctas = draw_ctas(rng);
    const int group = static_cast<int>(rng.uniform(1, 8)), cta_q = rng.pick({16, 64, 128});
    const bool causal = rng.chance(0.6);
    const std::vector<int32_t> kv = draw_lengths(rng, draw_batch(rng), dist);
    // Queries: self-attention (q = kv), a chunk of new queries behind a long
    // cache (q <= kv), a few speculative ones, or unrelated (q > kv too).
    std::vector<int32_t> qo(kv.size());
    const int q_kind = static_cast<int>(rng.uniform(0, 3));
    for (size_t r = 0; r < kv.size(); ++r)
      qo[r] = static_cast<int32_t>(q_kind == 0   ? kv[r]
                                   : q_kind == 1 ? rng.uniform(0, kv[r])
                                   : q_kind == 2 ? rng.uniform(1, 16)
                                                 : rng.log_uniform(0, 20000));
    // At most ~3000 query tiles, so thousands of cases stay fast.
    int64_t rows = 0;
    for (int32_t q : qo) rows += int64_t{q} * group;
    if (const int64_t budget = 3000LL * cta_q; rows > budget)
      for (auto& q : qo) q = static_cast<int32_t>(q * budget / rows);
    const PlannerOptions opt = draw_options(rng, ctas);
    SCOPED_TRACE("PlannerFuzz.Prefill: TESSERA_FUZZ_SEED=" + std::to_string(seed) + " case " + std::to_string(i) +
                 " (case seed " + std::to_string(cs) + ", " + kDistNames[dist] + " lengths)");

    shared.plan_prefill(qo, kv, group, cta_q, causal, ctas, opt, plan);
    check_prefill_plan(qo, kv, group, cta_q, causal, ctas, opt, plan);
    shared.plan_prefill(qo, kv, group, cta_q, causal, ctas, opt, again);
    expect_same_plan(plan, again, "planned twice");
    Planner fresh;
    fresh.plan_prefill(qo, kv, group, cta_q, causal, ctas, opt, fresh_plan);
    expect_same_plan(plan, fresh_plan, "fresh Planner vs reused");
    if (::testing::Test::HasFailure()) {
      ADD_FAILURE() << "reproducer:\n  PlannerOptions opt; " << options(opt) << "\n  std::vector<int32_t> qo = "
                    << list(qo) << ", kv = " << list(kv) << ";\n  planner.plan_prefill(qo, kv, /*group=*/" << group
                    << ", /*cta_q=*/" << cta_q << ", /*causal=*/" << causal << ", /*ctas=*/" << ctas
                    << ", opt, plan);";
      return;
    }
    cov.count(plan, opt, line3_chunk(prefill_tiles(qo, kv, group, cta_q, causal, opt), ctas, opt));
    if (rng.chance(0.1)) bad_prefill_call(rng, shared, qo, kv, cov);
  }
  cov.expect_all("prefill");
}
