// The device planner's host twin (runtime/device_planner.hpp): the plan's
// contract on random decode and prefill batches (the checks of
// device_plan_check.hpp, plus determinism and batch-invariant fixed chunks),
// its chunking against the host Planner where the rules make them equal by
// construction, its input checks, empty batches, and the kernel's NVRTC
// build. Seeds: fuzz_util.hpp (TESSERA_FUZZ_SEED / TESSERA_FUZZ_SCALE,
// test-only; CI runs the defaults).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <functional>
#include <iterator>
#include <map>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "device_plan_check.hpp"
#include "tessera/runtime/jit.hpp"
#include "tessera/runtime/kernel_catalog.hpp"
#include "test_util.hpp"

namespace tessera {
namespace {

using namespace tessera::test;

TEST(DevicePlanner, KernelCompilesForAmpereAndHopper) {
  jit::KernelCache cache;
  const auto k = catalog::device_planner();
  for (const char* arch : {"sm_80", "sm_90a"}) {
    auto bin = cache.cubin(k, jit::Arch::parse(arch));
    ASSERT_TRUE(bin) << arch;
    EXPECT_FALSE(bin->image.empty()) << arch;
  }
}

// Each tile's chunk boundaries, by (request, q tile).
using Boundaries = std::map<std::pair<int, int>, std::vector<std::pair<int, int>>>;
Boundaries boundaries(const DevicePlanResult& r) {
  Boundaries out;
  for (const PlanItem& w : items_of(r)) out[{w.request, w.q_tile}].push_back({w.kv_start, w.kv_end});
  for (auto& [tile, chunks] : out) std::sort(chunks.begin(), chunks.end());  // items come in queue order
  return out;
}

// A random step and options: decode or prefill (group 1/4/8, cta_q 64/128,
// causal or not), paged (page size 1/16/64) or ragged.
struct Case {
  Step step;
  PlannerOptions opt;
  int ctas = 1, slack = 0;
};

Case draw_case(Rng& rng, bool decode) {
  Case c;
  Step& s = c.step;
  s.decode = decode;
  s.page_size = rng.pick({0, 1, 16, 64});
  c.ctas = rng.chance(0.2)   ? static_cast<int>(rng.uniform(1, 8))
           : rng.chance(0.2) ? rng.pick({132, 264})
                             : static_cast<int>(rng.uniform(1, 300));
  c.slack = rng.chance(0.5) ? 0 : static_cast<int>(rng.uniform(1, 64));
  const int batch_kind = static_cast<int>(rng.uniform(0, 19));  // 0, 1, a few, up to 300
  const int64_t batch = batch_kind == 0 ? 0 : batch_kind < 3 ? 1 : rng.uniform(1, batch_kind < 8 ? 16 : 300);
  s.kv = draw_lengths(rng, static_cast<int>(batch), static_cast<int>(rng.uniform(0, 6)));
  if (!decode) {
    s.group = rng.pick({1, 4, 8});
    s.cta_q = rng.pick({64, 128});
    s.causal = rng.chance(0.5);
    // Self-attention, new queries behind a cache, a few speculative ones, or
    // unrelated; at most ~3000 query tiles (the kernel's tables hold 4096).
    const int q_kind = static_cast<int>(rng.uniform(0, 3));
    int64_t rows = 0;
    for (int32_t kv : s.kv) {
      s.qo.push_back(static_cast<int32_t>(q_kind == 0   ? kv
                                          : q_kind == 1 ? rng.uniform(0, kv)
                                          : q_kind == 2 ? rng.uniform(1, 16)
                                                        : rng.log_uniform(0, 20000)));
      rows += int64_t{s.qo.back()} * s.group;
    }
    if (const int64_t budget = 3000LL * s.cta_q; rows > budget)
      for (auto& q : s.qo) q = static_cast<int32_t>(q * budget / rows);
  }
  s.lay_out(rng);

  PlannerOptions& o = c.opt;
  o.split_kv = rng.chance(0.85);
  o.alpha = rng.pick({32.0, 0.0, 8.0, rng.real(0, 128)});
  o.beta = rng.chance(0.05) ? 0.0 : rng.pick({1.0, 0.5, 2.0, rng.real(0.05, 4)});
  o.min_chunk = static_cast<int>(rng.pick<int64_t>({64, 1, 256, rng.uniform(0, 2000)}));
  o.chunk_align = rng.pick({1, 16, 64});
  o.merge_cost = rng.pick({0.0, 0.5});
  if (rng.chance(0.4))
    o.window_left = static_cast<int>(rng.pick<int64_t>({0, rng.uniform(0, 256), rng.uniform(0, kMaxLen)}));
  o.unsplit_max_kv = static_cast<int>(rng.pick<int64_t>({-1, 0, 1024, rng.uniform(1, 8192)}));
  o.unsplit_min_tiles = static_cast<int>(rng.pick<int64_t>({1, rng.uniform(1, c.ctas), std::max(1, c.ctas / 4)}));
  if (rng.chance(0.2)) o.max_slots = rng.uniform(1, 2 * c.ctas);
  if (rng.chance(0.2)) o.max_split_tiles = rng.uniform(1, c.ctas);
  if (rng.chance(0.15))  // at most ~20000 chunks
    o.fixed_chunk = static_cast<int>(
        std::max<int64_t>(rng.pick<int64_t>({256, 1024, rng.uniform(16, 8192)}), visible_keys(s.tiles(o)) / 20000 + 1));
  return c;
}

// The case's seed and what it drew, for a failure's message.
std::string describe(uint64_t seed, int i, const Case& c) {
  std::ostringstream o;
  const PlannerOptions& p = c.opt;
  const Step& s = c.step;
  o << "TESSERA_FUZZ_SEED=" << seed << " case " << i << ": ctas " << c.ctas << " page_size " << s.page_size << " group "
    << s.group << " cta_q " << s.cta_q << " causal " << s.causal << "; split_kv " << p.split_kv << " alpha " << p.alpha
    << " beta " << p.beta << " min_chunk " << p.min_chunk << " align " << p.chunk_align << " merge " << p.merge_cost
    << " window " << p.window_left << " unsplit " << p.unsplit_max_kv << "/" << p.unsplit_min_tiles << " fixed "
    << p.fixed_chunk << " caps " << p.max_slots << "/" << p.max_split_tiles;
  for (const auto* v : {&s.kv, &s.qo}) {
    o << (v == &s.kv ? "; kv {" : "} qo {");
    for (int32_t x : *v) o << x << ",";
  }
  return o.str() + "}";
}

// The same requests in another order, among new ones; to[old] = new index.
Step reshuffled(const Step& s, Rng& rng, std::vector<int>& to) {
  Step t = s;
  std::vector<int> order(s.batch());
  for (int i = 0; i < s.batch(); ++i) order[i] = i;
  const int extra = static_cast<int>(rng.uniform(1, 8));
  for (int i = 0; i < extra; ++i) order.push_back(-1);
  std::shuffle(order.begin(), order.end(), rng.g);
  t.kv.clear();
  t.qo.clear();
  to.assign(s.batch(), -1);
  for (size_t i = 0; i < order.size(); ++i) {
    if (order[i] >= 0) to[order[i]] = static_cast<int>(i);
    t.kv.push_back(order[i] >= 0 ? s.kv[order[i]] : static_cast<int32_t>(rng.uniform(0, 50000)));
    if (!s.decode) t.qo.push_back(order[i] >= 0 ? s.qo[order[i]] : static_cast<int32_t>(rng.uniform(0, 64)));
  }
  t.lay_out(rng);
  return t;
}

// What the cases exercised, so a generator change that loses a path shows.
constexpr const char* kCovered[] = {"split",    "whole", "short steps", "L above line 3",
                                    "windowed", "fixed", "capped",      "paged"};

void fuzz(bool decode, int count) {
  const uint64_t seed = base_seed();
  int covered[std::size(kCovered)] = {};
  for (int i = 0; i < case_count(count); ++i) {
    const uint64_t cs = case_seed(seed, decode ? 11 : 12, i);
    Rng rng{std::mt19937_64(cs)};
    const Case c = draw_case(rng, decode);
    const Step& s = c.step;
    const PlannerOptions& o = c.opt;
    SCOPED_TRACE(describe(seed, i, c));
    const DevicePlanParams p = make_config(s, o, c.ctas, c.slack);
    const DevicePlanResult r = plan_on_host(p, s.inputs());
    check_result(s, o, p, r);
    expect_same_result(r, plan_on_host(p, s.inputs()));

    const auto tiles = s.tiles(o);
    const Mode mode = mode_of(tiles, c.ctas, o);
    const bool split = mode == Mode::kSplit;
    const int64_t L3 = line3_chunk(tiles, c.ctas, o);
    if (mode == Mode::kFixed) {  // each tile's chunks are the same in any batch
      std::vector<int> to;
      const Step t = reshuffled(s, rng, to);
      const DevicePlanParams pt = make_config(t, o, c.ctas, c.slack);
      const DevicePlanResult rt = plan_on_host(pt, t.inputs());
      check_result(t, o, pt, rt);
      const Boundaries mine = boundaries(r), theirs = boundaries(rt);
      for (const auto& [tile, chunks] : mine)
        EXPECT_EQ(theirs.at({to[tile.first], tile.second}), chunks)
            << "request " << tile.first << " tile " << tile.second;
    }
    if (::testing::Test::HasFailure()) return;
    const bool grown = split && r.chunk_size > L3, capped = split && (o.max_slots > 0 || o.max_split_tiles > 0);
    const bool hit[] = {r.num_split > 0,    r.num_split == 0,     mode == Mode::kShort,      grown && r.num_split > 0,
                        o.window_left >= 0, mode == Mode::kFixed, capped && r.num_split > 0, s.paged()};
    for (size_t k = 0; k < std::size(kCovered); ++k) covered[k] += hit[k];
  }
  std::printf("%s, %d cases:", decode ? "decode" : "prefill", case_count(count));
  for (size_t k = 0; k < std::size(kCovered); ++k) {
    std::printf(" %d %s%s", covered[k], kCovered[k], k + 1 < std::size(kCovered) ? "," : "\n");
    EXPECT_GT(covered[k], case_count(count) / 50) << kCovered[k];
  }
}

TEST(DevicePlanner, RandomDecodeBatches) { fuzz(true, 2500); }
TEST(DevicePlanner, RandomPrefillBatches) { fuzz(false, 1500); }

// Where the host Planner's chunk size cannot depend on its (greedy)
// assignment, both planners must cut every tile alike: no split_kv, fixed
// chunks, short steps, or line 3's L when the one-wave refinement does not
// apply and the merge-aware growth has nothing to merge.
TEST(DevicePlanner, ChunksMatchHostPlannerWhereTheRulesAgree) {
  const uint64_t seed = base_seed();
  int agreed = 0, by_mode[4] = {};
  Planner planner;
  for (int i = 0; i < case_count(1500); ++i) {
    const uint64_t cs = case_seed(seed, 13, i);
    Rng rng{std::mt19937_64(cs)};
    Case c = draw_case(rng, rng.chance(0.75));
    if (rng.chance(0.25)) {  // near-equal lengths of a short step
      Step& s = c.step;
      c.opt.split_kv = true;
      c.opt.fixed_chunk = 0;
      c.opt.window_left = -1;
      c.opt.unsplit_max_kv = static_cast<int>(rng.uniform(64, 4096));
      s.kv.resize(std::min<size_t>(std::max<size_t>(1, s.kv.size()), c.ctas));
      c.opt.unsplit_min_tiles = static_cast<int>(rng.uniform(1, static_cast<int64_t>(s.kv.size())));
      for (auto& x : s.kv) x = static_cast<int32_t>(rng.uniform(c.opt.unsplit_max_kv * 9 / 10, c.opt.unsplit_max_kv));
      if (!s.decode) s.qo.assign(s.kv.size(), 1);
      s.lay_out(rng);
    }
    const Step& s = c.step;
    const PlannerOptions& o = c.opt;
    const auto tiles = s.tiles(o);
    int64_t longest = 1;
    for (const PlanTile& t : tiles) longest = std::max<int64_t>(longest, t.end - t.begin);
    const int64_t L3 = line3_chunk(tiles, c.ctas, o), whole = align_up(longest, align_of(o));
    auto chunks_at = [&](int64_t l) {
      int64_t n = 0;
      for (const PlanTile& t : tiles) n += std::max<int64_t>(1, (t.end - t.begin + l - 1) / l);
      return n;
    };
    const bool splits_at_3 =
        std::any_of(tiles.begin(), tiles.end(), [&](const PlanTile& t) { return t.end - t.begin > L3; });
    const bool refines = chunks_at(L3) > c.ctas && chunks_at(whole) <= c.ctas;
    const Mode mode = mode_of(tiles, c.ctas, o);
    if (mode == Mode::kSplit && (refines || (o.merge_cost > 0 && splits_at_3))) continue;
    ++agreed;
    ++by_mode[static_cast<int>(mode)];
    SCOPED_TRACE(describe(seed, i, c));
    const DevicePlanResult r = plan_on_host(make_config(s, o, c.ctas, c.slack), s.inputs());
    ASSERT_EQ(r.error, kPlanOk);
    DecodePlan dp;
    PrefillPlan pp;
    if (s.decode)
      planner.plan_decode(s.kv, c.ctas, o, dp);
    else
      planner.plan_prefill(s.qo, s.kv, s.group, s.cta_q, s.causal, c.ctas, o, pp);
    const PlanStats& stats = s.decode ? static_cast<PlanStats&>(dp) : pp;
    std::vector<PlanItem> host = s.decode ? plan_items(dp) : plan_items(pp);
    std::vector<PlanItem> mine = items_of(r);
    auto by_position = [](const PlanItem& a, const PlanItem& b) {
      return std::tie(a.request, a.q_tile, a.kv_start) < std::tie(b.request, b.q_tile, b.kv_start);
    };
    std::sort(host.begin(), host.end(), by_position);
    std::sort(mine.begin(), mine.end(), by_position);
    EXPECT_EQ(r.chunk_size, stats.chunk_size);
    EXPECT_EQ(std::tie(r.num_slots, r.num_split), std::tie(stats.num_slots, stats.num_split));
    ASSERT_TRUE(mine == host) << "chunks, slots or counters differ";
  }
  std::printf("%d agreeing cases: %d unsplit, %d fixed, %d short steps, %d at line 3\n", agreed, by_mode[0], by_mode[1],
              by_mode[2], by_mode[3]);
  for (int k : by_mode) EXPECT_GT(k, 50);
}

// A valid step (decode, or causal prefill of 8 query tiles) for the input
// checks: 4 requests paged by 16 (kv_indptr 0 7 10 10 26), the third empty.
struct Checked {
  Rng rng{std::mt19937_64(7)};
  Step s;
  DevicePlanParams p;
  int batch = 4;
  explicit Checked(bool decode) {
    s.decode = decode;
    s.page_size = 16;
    s.kv = {100, 33, 0, 250};
    s.qo = {20, 1, 5, 64};
    s.group = 4;
    s.cta_q = 64;
    s.causal = true;
    s.lay_out(rng);
    p = make_config(s, PlannerOptions{}, 16, 2);
  }
  DevicePlanResult plan() const {
    DevicePlanInputs in = s.inputs();
    in.batch = batch;
    return plan_on_host(p, in);
  }
};

TEST(DevicePlanner, InputErrorsLeaveAnEmptyPlan) {
  struct Bad {
    const char* what;
    bool decode;
    std::function<void(Checked&)> spoil;
    int code, request, value;
    const char* needle;
  };
  const std::vector<Bad> cases = {
      {"negative batch", true, [](Checked& c) { c.batch = -1; }, kPlanBatchSize, -1, -1, "batch_size"},
      {"batch over max_batch", false, [](Checked& c) { c.batch = 7; }, kPlanBatchSize, -1, 7, "batch_size"},
      {"kv_indptr[0] != 0", true, [](Checked& c) { c.s.kv_indptr[0] = 3; }, kPlanKvIndptr, 0, 3, "kv_indptr"},
      {"kv_indptr decreasing", false, [](Checked& c) { c.s.kv_indptr[2] = c.s.kv_indptr[1] - 1; }, kPlanKvIndptr, 1, 6,
       "kv_indptr"},
      {"kv_indptr over max_pages", true, [](Checked& c) { c.p.max_pages = c.s.kv_indptr[4] - 1; }, kPlanMaxPages, 4, 26,
       "max_pages"},
      {"last_page_len 0", false, [](Checked& c) { c.s.last_page_len[1] = 0; }, kPlanLastPageLen, 1, 0,
       "kv_last_page_len"},
      {"last_page_len over page_size", true, [](Checked& c) { c.s.last_page_len[3] = 17; }, kPlanLastPageLen, 3, 17,
       "kv_last_page_len"},
      {"qo_indptr[0] != 0", false, [](Checked& c) { c.s.qo_indptr[0] = 2; }, kPlanQoIndptr, 0, 2, "qo_indptr"},
      {"qo_indptr decreasing", false, [](Checked& c) { c.s.qo_indptr[3] = 0; }, kPlanQoIndptr, 2, 0, "qo_indptr"},
      {"qo_indptr over max_total_q", false, [](Checked& c) { c.p.max_total_q = 89; }, kPlanMaxTotalQ, 4, 90,
       "max_total_q"},
      {"more tiles than max_tiles", false, [](Checked& c) { c.p.max_tiles = 6; }, kPlanMaxTiles, -1, 6, "query tiles"},
      // value: the plan's chunks (8), which the message calls the bound
      {"more chunks than max_items", true, [](Checked& c) { c.p.max_items = 3; }, kPlanMaxItems, -1, 8, "work items"},
  };
  for (const Bad& b : cases) {
    SCOPED_TRACE(b.what);
    Checked c(b.decode);
    b.spoil(c);
    const DevicePlanResult r = c.plan();
    EXPECT_EQ(std::tie(r.error, r.error_request, r.error_value), std::tie(b.code, b.request, b.value));
    expect_empty_plan(r, c.p.ctas);
    EXPECT_EQ(r.first_items.size(), b.decode ? 0u : static_cast<size_t>(c.p.ctas));
    if (!b.needle) continue;
    const std::string msg = device_plan_error_message(r.error, r.error_request, r.error_value);
    EXPECT_NE(msg.find(b.needle), std::string::npos) << msg;
    EXPECT_NE(msg.find(std::to_string(b.value)), std::string::npos) << msg;
    if (b.request >= 0) EXPECT_NE(msg.find("request " + std::to_string(b.request)), std::string::npos) << msg;
  }
  // The unspoiled steps plan, and an empty request's last_page_len is not checked.
  for (bool decode : {true, false}) {
    Checked c(decode);
    c.s.last_page_len[2] = 0;
    check_result(c.s, PlannerOptions{}, c.p, c.plan());
  }
  EXPECT_NE(device_plan_error_message(99, 0, 0).find("unknown"), std::string::npos);
}

TEST(DevicePlanner, ConfigurationChecks) {
  DevicePlanParams p = device_plan_config(PlannerOptions{}, 132, 1.0);
  p.max_batch = 64;
  p.max_tiles = kDevicePlanMaxTiles;
  const size_t at_most = device_plan_smem_bytes(p);
  p.max_tiles = 64;
  EXPECT_LT(device_plan_smem_bytes(p), at_most);
  p.max_tiles = kDevicePlanMaxTiles + 1;
  EXPECT_THROW_MSG(device_plan_smem_bytes(p), InvalidArgument, "max_batch");
  EXPECT_THROW_MSG(device_plan_config(PlannerOptions{}, 0, 1.0), InvalidArgument, "ctas");
  PlannerOptions o;
  o.fixed_chunk = -1;
  EXPECT_THROW_MSG(device_plan_config(o, 8, 1.0), InvalidArgument, "fixed_chunk");
  // Costs in 1/16 KV token: alpha * rows and beta, rounded.
  o = PlannerOptions{};
  o.alpha = 2.5;
  o.beta = 0.53;
  o.merge_cost = 0.5;
  p = device_plan_config(o, 8, 64);
  EXPECT_EQ(std::tie(p.item_cost, p.token_cost, p.merge_cost), std::make_tuple(int64_t{2560}, int64_t{8}, int64_t{8}));
}

// Batch 0 and empty requests: valid plans, an empty request one empty item.
TEST(DevicePlanner, EmptyBatchesAndRequests) {
  Rng rng{std::mt19937_64(3)};
  for (bool decode : {true, false})
    for (int page_size : {0, 16}) {
      SCOPED_TRACE(std::string(decode ? "decode" : "prefill") + " page_size " + std::to_string(page_size));
      for (const std::vector<int32_t>& kv : std::vector<std::vector<int32_t>>{{}, {0}, {0, 0, 0}, {0, 5000, 0, 17}}) {
        Step s;
        s.decode = decode;
        s.page_size = page_size;
        s.kv = kv;
        s.qo.assign(kv.size(), 3);
        if (!kv.empty() && !decode) s.qo[0] = 0;  // a request with no queries: no tile
        s.cta_q = 64;
        s.lay_out(rng);
        for (int ctas : {1, 7}) {
          const DevicePlanParams p = make_config(s, PlannerOptions{}, ctas, 0);
          const DevicePlanResult r = plan_on_host(p, s.inputs());
          check_result(s, PlannerOptions{}, p, r);
          EXPECT_EQ(r.num_items, static_cast<int>(s.tiles({}).size()) - r.num_split + r.num_slots);
        }
      }
    }
}

// A hand-checked plan: one 4096-key decode request on 4 CTAs is cut into 4
// chunks of 1024 (line 3), one per CTA, slots 0..3.
TEST(DevicePlanner, HandCheckedDecodePlan) {
  Rng rng{std::mt19937_64(5)};
  Step s;
  s.kv = {4096};
  s.lay_out(rng);
  const DevicePlanResult r = plan_on_host(make_config(s, PlannerOptions{}, 4, 0), s.inputs());
  EXPECT_EQ(r.chunk_size, 1024);
  EXPECT_EQ(r.work_indptr, (std::vector<int32_t>{0, 1, 2, 3, 4}));
  ASSERT_EQ(r.decode_items.size(), 4u);
  for (int k = 0; k < 4; ++k)
    EXPECT_EQ(plan_item(r.decode_items[k]), (PlanItem{0, 0, 1024 * k, 1024 * (k + 1), k, 0, 4, -1}));
  EXPECT_EQ(std::tie(r.num_slots, r.num_split, r.num_items), std::make_tuple(4, 1, 4));
}

}  // namespace
}  // namespace tessera
