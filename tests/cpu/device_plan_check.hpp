// Checks a device plan (runtime/device_planner.hpp, plan_on_host) against
// the planner's contract, for the device planner's tests: every query
// tile's visible keys (derived by planner_check.hpp from the documented
// rules, not by the planner) covered by the near-equal chunks of the plan's
// L, split tiles' consecutive partial slots and unique counters, the
// list-scheduling bound, the first items, the workspace bounds and the
// caller's caps. Also
// a step's index arrays as the kernel reads them and its configuration.
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <map>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "fuzz_util.hpp"
#include "planner_check.hpp"
#include "tessera/runtime/device_planner.hpp"

namespace tessera::test {

inline constexpr int32_t kNoSplit = 0x7fffffff;  // chunk_size when nothing may split

// One step's lengths, laid out as the kernel reads them.
struct Step {
  bool decode = true, causal = false;
  int group = 1, cta_q = 1, page_size = 0;  // page_size 0: ragged KV (kv_indptr counts tokens)
  std::vector<int32_t> qo, kv;              // per request; qo unused for decode
  std::vector<int32_t> qo_indptr, kv_indptr, last_page_len;

  int batch() const { return static_cast<int>(kv.size()); }
  bool paged() const { return page_size > 0; }
  DevicePlanInputs inputs() const { return {batch(), qo_indptr, kv_indptr, last_page_len}; }
  std::vector<PlanTile> tiles(const PlannerOptions& opt) const {
    return decode ? decode_tiles(kv, opt) : prefill_tiles(qo, kv, group, cta_q, causal, opt);
  }
  // Fills the index arrays from the lengths: whole pages, the last one partly
  // full; an empty request's last_page_len is junk the checks must skip.
  void lay_out(Rng& rng) {
    kv_indptr.assign(1, 0);
    last_page_len.clear();
    for (int32_t len : kv) {
      int32_t units = len;
      if (paged()) {
        units = (len + page_size - 1) / page_size;
        last_page_len.push_back(len > 0 ? len - (units - 1) * page_size
                                        : static_cast<int32_t>(rng.uniform(-1, 2 * page_size)));
      }
      kv_indptr.push_back(kv_indptr.back() + units);
    }
    qo_indptr.clear();
    if (!decode) {
      qo_indptr.assign(1, 0);
      for (int32_t q : qo) qo_indptr.push_back(qo_indptr.back() + q);
    }
  }
};

inline int64_t visible_keys(const std::vector<PlanTile>& tiles) {
  int64_t keys = 0;
  for (const PlanTile& t : tiles) keys += t.end - t.begin;
  return keys;
}

// How the chunk size is chosen: split_kv off, fixed chunks, a short step
// (whole tiles), or line 3 and its refinements.
enum class Mode { kUnsplit, kFixed, kShort, kSplit };
inline Mode mode_of(const std::vector<PlanTile>& tiles, int ctas, const PlannerOptions& o) {
  if (!o.split_kv) return Mode::kUnsplit;
  if (o.fixed_chunk > 0) return Mode::kFixed;
  return is_short_step(tiles, ctas, o) ? Mode::kShort : Mode::kSplit;
}

// device_plan_config plus bounds `slack` above the step's and the items
// capacity the workspace bounds give (fixed chunks: fixed_chunk_bound).
inline DevicePlanParams make_config(const Step& s, const PlannerOptions& opt, int ctas, int slack) {
  DevicePlanParams p = device_plan_config(opt, ctas, s.decode ? 1.0 : s.cta_q);
  p.max_batch = s.batch() + slack;
  p.max_pages = s.kv_indptr.back() + slack;
  p.max_total_q = s.decode ? p.max_batch : s.qo_indptr.back() + slack;
  p.page_size = std::max(1, s.page_size);
  p.decode = s.decode;
  p.group = s.group;
  p.cta_q = s.cta_q;
  p.causal = s.causal;
  p.max_tiles =
      static_cast<int>(s.decode ? p.max_batch : prefill_max_tiles(p.max_total_q, p.max_batch, s.group, s.cta_q));
  int64_t items = s.decode ? decode_max_items(p.max_batch, ctas) : prefill_max_items(p.max_tiles, ctas);
  if (opt.split_kv && opt.fixed_chunk > 0) {
    const auto tiles = s.tiles(opt);
    items = std::max<int64_t>(items, fixed_chunk_bound(visible_keys(tiles), static_cast<int64_t>(tiles.size()) + slack,
                                                       align_up(opt.fixed_chunk, align_of(opt))));
  }
  p.max_items = static_cast<int>(items);
  return p;
}

inline std::vector<PlanItem> items_of(const DevicePlanResult& r) {
  std::vector<PlanItem> out;
  for (const DecodeWorkItem& w : r.decode_items) out.push_back(plan_item(w));
  for (const PrefillWorkItem& w : r.items) out.push_back(plan_item(w));
  return out;
}

template <typename T>
inline bool same_bytes(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0);
}

inline void expect_same_result(const DevicePlanResult& a, const DevicePlanResult& b) {
  EXPECT_EQ(std::tie(a.error, a.error_request, a.error_value), std::tie(b.error, b.error_request, b.error_value));
  EXPECT_EQ(a.work_indptr, b.work_indptr);
  EXPECT_TRUE(same_bytes(a.decode_items, b.decode_items)) << "decode items differ";
  EXPECT_TRUE(same_bytes(a.items, b.items)) << "items differ";
  EXPECT_TRUE(same_bytes(a.first_items, b.first_items)) << "first items differ";
  EXPECT_EQ(std::tie(a.chunk_size, a.num_slots, a.num_split, a.num_items),
            std::tie(b.chunk_size, b.num_slots, b.num_split, b.num_items));
}

// A failed check leaves an empty plan.
inline void expect_empty_plan(const DevicePlanResult& r, int ctas) {
  EXPECT_EQ(r.num_items, 0);
  EXPECT_EQ(r.work_indptr, std::vector<int32_t>(ctas + 1, 0));
  EXPECT_TRUE(r.items.empty() && r.decode_items.empty());
  EXPECT_EQ(r.num_slots, 0);
  EXPECT_EQ(r.num_split, 0);
  for (const PrefillWorkItem& w : r.first_items) EXPECT_TRUE(same_bytes<PrefillWorkItem>({w}, {PrefillWorkItem{}}));
}

inline int64_t cost_of(const DevicePlanParams& p, const PlanItem& w) {
  return p.item_cost + p.token_cost * (w.kv_end - w.kv_start);
}

// Checks a plan of the step against the planner's contract.
inline void check_result(const Step& s, const PlannerOptions& opt, const DevicePlanParams& p, const DevicePlanResult& r) {
  ASSERT_EQ(r.error, kPlanOk) << device_plan_error_message(r.error, r.error_request, r.error_value);
  const int ctas = p.ctas;
  const std::vector<PlanItem> items = items_of(r);
  ASSERT_TRUE(s.decode ? r.items.empty() : r.decode_items.empty()) << "items of the other kind";
  ASSERT_EQ(items.size(), static_cast<size_t>(r.num_items));
  ASSERT_LE(r.num_items, p.max_items);
  ASSERT_EQ(r.work_indptr.size(), static_cast<size_t>(ctas) + 1);
  ASSERT_EQ(r.work_indptr[0], 0);
  ASSERT_EQ(r.work_indptr[ctas], r.num_items);
  for (int c = 0; c < ctas; ++c) ASSERT_LE(r.work_indptr[c], r.work_indptr[c + 1]) << "work_indptr at CTA " << c;

  // Each tile's visible keys in the near-equal chunks of L (items in queue
  // order, so found per tile and sorted by position); a split tile's
  // chunks take consecutive partial slots and one counter (prefill), an
  // unsplit one writes through.
  const int64_t L = r.chunk_size, align = align_of(opt);
  const auto tiles = s.tiles(opt);
  std::map<std::pair<int32_t, int32_t>, std::vector<size_t>> of_tile;
  for (size_t i = 0; i < items.size(); ++i) of_tile[{items[i].request, items[i].q_tile}].push_back(i);
  for (auto& [key, v] : of_tile)
    std::sort(v.begin(), v.end(), [&](size_t a, size_t b) { return items[a].kv_start < items[b].kv_start; });
  std::vector<int> slot_uses(std::max(0, r.num_slots)), counter_uses(std::max(0, r.num_split));
  int split_tiles = 0;
  size_t seen = 0;
  for (const PlanTile& t : tiles) {
    const auto chunks = chunks_of(t, L, align);
    const int n = static_cast<int>(chunks.size());
    const std::string at = "request " + std::to_string(t.request) + " tile " + std::to_string(t.q_tile) + " [" +
                           std::to_string(t.begin) + ", " + std::to_string(t.end) + "), L " + std::to_string(L);
    const auto found = of_tile.find({t.request, t.q_tile});
    ASSERT_TRUE(found != of_tile.end()) << at << ": no items";
    const std::vector<size_t>& mine = found->second;
    ASSERT_EQ(mine.size(), static_cast<size_t>(n)) << at << ": chunk count";
    seen += mine.size();
    const PlanItem head = items[mine[0]];
    for (int k = 0; k < n; ++k) {
      const PlanItem& w = items[mine[k]];
      ASSERT_EQ(std::make_pair(w.kv_start, w.kv_end), chunks[k]) << at << " chunk " << k << ": gap, overlap or other";
      ASSERT_LE(w.kv_end - w.kv_start, L) << at;
      ASSERT_EQ(w.num_chunks, n) << at;
      ASSERT_EQ(std::tie(w.first_slot, w.counter), std::tie(head.first_slot, head.counter)) << at;
      ASSERT_EQ(w.partial_slot, n == 1 ? -1 : head.first_slot + k) << at << " chunk " << k;
      if (!s.decode) {
        const PrefillWorkItem& f = r.items[mine[k]];
        const int b = t.request;
        ASSERT_EQ(std::tie(f.qo_begin, f.qo_len, f.kv_begin, f.kv_len),
                  std::tie(s.qo_indptr[b], s.qo[b], s.kv_indptr[b], s.kv[b]))
            << at << ": the request's fields";
      }
    }
    if (n == 1) {
      ASSERT_EQ(std::tie(head.first_slot, head.counter), std::make_tuple(-1, -1)) << at << ": unsplit";
      continue;
    }
    ++split_tiles;
    ASSERT_TRUE(head.first_slot >= 0 && head.first_slot + n <= r.num_slots)
        << at << ": slots " << head.first_slot << "+" << n << " outside num_slots " << r.num_slots;
    for (int k = 0; k < n; ++k) ++slot_uses[head.first_slot + k];
    if (!s.decode) {  // decode's counters are per request, by index
      ASSERT_TRUE(head.counter >= 0 && head.counter < r.num_split) << at << ": counter " << head.counter;
      ++counter_uses[head.counter];
    }
  }
  ASSERT_EQ(seen, items.size()) << "items of no tile";
  EXPECT_EQ(r.num_split, split_tiles);
  for (size_t i = 0; i < slot_uses.size(); ++i) ASSERT_EQ(slot_uses[i], 1) << "partial slot " << i;
  if (!s.decode)
    for (size_t i = 0; i < counter_uses.size(); ++i) ASSERT_EQ(counter_uses[i], 1) << "merge counter " << i;

  // L: fixed chunks are the caller's; no split_kv or a short step keep every
  // tile whole; else at least line 3's, aligned, within the workspace bounds
  // and the caller's caps.
  const Mode mode = mode_of(tiles, ctas, opt);
  if (mode == Mode::kFixed) {
    EXPECT_EQ(L, align_up(opt.fixed_chunk, align));
  } else if (mode != Mode::kSplit) {
    EXPECT_EQ(L, kNoSplit);
    EXPECT_EQ(r.num_split, 0);
    EXPECT_EQ(items.size(), tiles.size()) << "one chunk per tile";
  } else {
    EXPECT_GE(L, line3_chunk(tiles, ctas, opt));
    EXPECT_EQ(L % align, 0);
    EXPECT_LE(r.num_slots, max_split_slots(ctas));
    EXPECT_LE(r.num_split, max_split_tiles(ctas));
    if (opt.max_slots > 0) EXPECT_LE(r.num_slots, opt.max_slots);
    if (opt.max_split_tiles > 0) EXPECT_LE(r.num_split, opt.max_split_tiles);
  }

  // The greedy bound: the last chunk of the busiest CTA went to the
  // cheapest CTA, at most the mean, so a CTA costs at most W / ctas + the
  // largest chunk.
  int64_t W = 0, largest = 0;
  for (const PlanItem& w : items) {
    W += cost_of(p, w);
    largest = std::max(largest, cost_of(p, w));
  }
  for (int c = 0; c < ctas; ++c) {
    int64_t mine = 0;
    for (int k = r.work_indptr[c]; k < r.work_indptr[c + 1]; ++k) mine += cost_of(p, items[k]);
    ASSERT_LE(mine * ctas, W + largest * ctas) << "CTA " << c << " over its share plus one item";
  }

  if (s.decode) {
    EXPECT_TRUE(r.first_items.empty());
  } else {
    ASSERT_EQ(r.first_items.size(), static_cast<size_t>(ctas));
    for (int c = 0; c < ctas; ++c) {
      const bool empty = r.work_indptr[c] == r.work_indptr[c + 1];
      EXPECT_TRUE(
          same_bytes<PrefillWorkItem>({r.first_items[c]}, {empty ? PrefillWorkItem{} : r.items[r.work_indptr[c]]}))
          << "first item of CTA " << c;
    }
  }
}

}  // namespace tessera::test
