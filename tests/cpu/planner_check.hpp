// Checks a plan against the planner's contract (runtime/planner.hpp), for
// the planner's unit tests and its randomized test. The expected query tiles
// and their visible KV ranges are derived here from the documented rules
// (causal bottom-right alignment, window clipping rounded down to
// chunk_align), not taken from the planner; the work items must cover each
// range exactly once, split tiles must own consecutive partial slots and a
// unique merge counter, the plan must fit the workspace bounds, and the CTA
// queues must be exactly what lines 5-13 of Algorithm 1 (longest first, each
// chunk to the cheapest CTA, ties by index) give for the plan's own chunks.
// Costs are counted as the planner counts them, in 1/16 token units, so the
// greedy bounds are checked exactly rather than up to rounding.
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <queue>
#include <span>
#include <tuple>
#include <utility>
#include <vector>

#include "tessera/device/kernels/plan/schedule.cuh"
#include "tessera/runtime/planner.hpp"

namespace tessera::test {

// A query tile as the planner must see it: keys [begin, end) of `request`.
struct PlanTile {
  int32_t request, q_tile, begin, end;
};

// The fields of a work item that the planner writes (the prefill wrapper
// fills qo_begin .. kv_len afterwards); decode items have q_tile 0, counter -1.
struct PlanItem {
  int32_t request, q_tile, kv_start, kv_end, partial_slot, first_slot, num_chunks, counter;
  bool operator==(const PlanItem&) const = default;
};
inline PlanItem plan_item(const DecodeWorkItem& w) {
  return {w.request, 0, w.kv_start, w.kv_end, w.partial_slot, w.first_slot, w.num_chunks, -1};
}
inline PlanItem plan_item(const PrefillWorkItem& w) {
  return {w.request, w.q_tile, w.kv_start, w.kv_end, w.partial_slot, w.first_slot, w.num_chunks, w.counter};
}
template <typename Plan>
std::vector<PlanItem> plan_items(const Plan& plan) {
  std::vector<PlanItem> out;
  out.reserve(plan.items.size());
  for (const auto& w : plan.items) out.push_back(plan_item(w));
  return out;
}

inline int64_t align_of(const PlannerOptions& opt) { return std::max(1, opt.chunk_align); }
inline int64_t align_up(int64_t x, int64_t a) { return (x + a - 1) / a * a; }

// Keys left of first_key are skipped, rounded down to chunk_align.
inline int32_t window_begin(int64_t first_key, int64_t end, const PlannerOptions& opt) {
  if (opt.window_left < 0) return 0;
  return static_cast<int32_t>(std::clamp<int64_t>(first_key, 0, end) / align_of(opt) * align_of(opt));
}

// Decode: one tile per request; its single query sits at key len - 1.
inline std::vector<PlanTile> decode_tiles(std::span<const int32_t> lens, const PlannerOptions& opt) {
  std::vector<PlanTile> tiles;
  for (size_t r = 0; r < lens.size(); ++r) {
    const int64_t len = lens[r];
    tiles.push_back({static_cast<int32_t>(r), 0, window_begin(len - 1 - opt.window_left, len, opt),
                     static_cast<int32_t>(len)});
  }
  return tiles;
}

// Prefill: tiles of cta_q fused rows (row = query * group + head); query i
// of a request sits at key i + kv - q (bottom-right aligned). Causal: a tile
// sees keys up to its last query's; a window starts at its first query's
// position - window_left.
inline std::vector<PlanTile> prefill_tiles(std::span<const int32_t> qo, std::span<const int32_t> kv, int group,
                                           int cta_q, bool causal, const PlannerOptions& opt) {
  std::vector<PlanTile> tiles;
  for (size_t r = 0; r < qo.size(); ++r) {
    const int64_t q = qo[r], k = kv[r], rows = q * group;
    for (int64_t t = 0; t * cta_q < rows; ++t) {
      const int64_t first_q = t * cta_q / group, last_q = (std::min(rows, (t + 1) * cta_q) - 1) / group;
      const int64_t end = causal ? std::clamp<int64_t>(last_q + k - q + 1, 0, k) : k;
      tiles.push_back({static_cast<int32_t>(r), static_cast<int32_t>(t),
                       window_begin(first_q + k - q - opt.window_left, end, opt), static_cast<int32_t>(end)});
    }
  }
  return tiles;
}

// Line 3 of Algorithm 1 (total keys / ctas, at least min_chunk, aligned) and
// the short-step rule (PlannerOptions::unsplit_max_kv), from the tiles.
inline int64_t line3_chunk(const std::vector<PlanTile>& tiles, int ctas, const PlannerOptions& opt) {
  int64_t total = 0;
  for (const PlanTile& t : tiles) total += t.end - t.begin;
  return align_up(std::max<int64_t>((total + ctas - 1) / ctas, std::max(1, opt.min_chunk)), align_of(opt));
}
inline bool is_short_step(const std::vector<PlanTile>& tiles, int ctas, const PlannerOptions& opt) {
  int64_t total = 0, longest = 1;
  for (const PlanTile& t : tiles) {
    total += t.end - t.begin;
    longest = std::max<int64_t>(longest, t.end - t.begin);
  }
  const int64_t n_tiles = static_cast<int64_t>(tiles.size()), sms = std::max(1, opt.unsplit_min_tiles);
  return opt.unsplit_max_kv > 0 && n_tiles >= sms && n_tiles <= ctas && longest <= opt.unsplit_max_kv &&
         8 * longest * sms <= 9 * total;
}

// A tile longer than L is cut into n = ceil(len / L) near-equal pieces of
// `step` keys, step a multiple of chunk_align and at most L; the last piece
// takes the rest. Returns the chunks' [start, end).
inline std::vector<std::pair<int32_t, int32_t>> chunks_of(const PlanTile& t, int64_t L, int64_t align) {
  const int64_t len = t.end - t.begin;
  if (len <= L) return {{t.begin, t.end}};
  const int64_t n = (len + L - 1) / L;
  const int64_t step = std::min(L, align_up((len + n - 1) / n, align));
  std::vector<std::pair<int32_t, int32_t>> out;
  for (int64_t s = 0; s < len; s += step)
    out.push_back({static_cast<int32_t>(t.begin + s), static_cast<int32_t>(t.begin + std::min(len, s + step))});
  return out;
}

// An item's cost as the planner's heap counts it: alpha * tile_rows + beta *
// keys, alpha * tile_rows and beta each rounded to 1/16 token units.
inline uint64_t cost16(const PlannerOptions& opt, double tile_rows, int64_t keys) {
  auto fixed = [](double x) { return static_cast<uint64_t>(std::max(x, 0.0) * 16.0 + 0.5); };
  return fixed(opt.alpha * tile_rows) + fixed(opt.beta) * static_cast<uint64_t>(keys);
}

// Lines 5-13 of Algorithm 1 on the given chunks: the assignment order
// (longest first, ties by request, q tile, position; prefill first orders
// requests by their longest chunk, but for its last plan::kTailRuns * ctas
// chunks; serpentine reverses every other run of `ctas`), then each chunk to
// the cheapest CTA, ties to the lowest index.
// Returns the chunk indices in assignment order and sets cta[i] per chunk and
// each CTA's final cost.
inline std::vector<size_t> list_schedule(const std::vector<PlanItem>& chunks, int ctas, const PlannerOptions& opt,
                                         double tile_rows, bool by_request, std::vector<int>& cta,
                                         std::vector<uint64_t>& cta_cost) {
  int32_t requests = 0;
  for (const PlanItem& c : chunks) requests = std::max(requests, c.request + 1);
  std::vector<int32_t> rank(requests, 0);
  for (const PlanItem& c : chunks) rank[c.request] = std::max(rank[c.request], c.kv_end - c.kv_start);
  auto key = [&](size_t i) {
    const PlanItem& c = chunks[i];
    return std::make_tuple(by_request ? -rank[c.request] : 0, by_request ? c.request : 0, -(c.kv_end - c.kv_start),
                           c.request, c.q_tile, c.kv_start);
  };
  std::vector<size_t> order(chunks.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return key(a) < key(b); });
  const size_t m = static_cast<size_t>(ctas);
  if (by_request) {  // the last kTailRuns * ctas chunks: longest first whatever the request
    auto plain = [&](size_t i) {
      const PlanItem& c = chunks[i];
      return std::make_tuple(-(c.kv_end - c.kv_start), c.request, c.q_tile, c.kv_start);
    };
    const size_t tail = std::min(order.size(), static_cast<size_t>(plan::kTailRuns) * m);
    std::sort(order.end() - static_cast<std::ptrdiff_t>(tail), order.end(),
              [&](size_t a, size_t b) { return plain(a) < plain(b); });
  }
  if (opt.serpentine)
    for (size_t b = m; b < order.size(); b += 2 * m)
      std::reverse(order.begin() + b, order.begin() + std::min(order.size(), b + m));
  using Entry = std::pair<uint64_t, int>;
  std::priority_queue<Entry, std::vector<Entry>, std::greater<Entry>> heap;
  for (int c = 0; c < ctas; ++c) heap.push({0, c});
  cta.assign(chunks.size(), -1);
  for (size_t i : order) {
    auto [cost, c] = heap.top();
    heap.pop();
    cta[i] = c;
    heap.push({cost + cost16(opt, tile_rows, chunks[i].kv_end - chunks[i].kv_start), c});
  }
  cta_cost.assign(m, 0);
  for (; !heap.empty(); heap.pop()) cta_cost[heap.top().second] = heap.top().first;
  return order;
}

// What a plan must fit: the workspace bounds for its shape and CTAs.
struct PlanBounds {
  int64_t slots, split_tiles, items;
};

// Checks a plan of the given tiles (in planner order: request, then q tile)
// on `ctas` CTAs. Reports gtest failures; the caller adds the case's context
// (SCOPED_TRACE) and stops at the first failure (HasFailure()).
inline void check_plan(const std::vector<PlanTile>& tiles, int32_t requests, int ctas, const PlannerOptions& opt,
                       double tile_rows, bool by_request, const PlanStats& stats, const std::vector<PlanItem>& items,
                       const PlanBounds& bounds) {
  // Queues: ctas + 1 offsets from 0 to the item count, non-decreasing.
  ASSERT_EQ(stats.work_indptr.size(), static_cast<size_t>(ctas) + 1) << "work_indptr size";
  ASSERT_EQ(stats.work_indptr.front(), 0) << "work_indptr[0]";
  ASSERT_EQ(stats.work_indptr.back(), static_cast<int32_t>(items.size())) << "work_indptr[ctas] != items";
  for (int c = 0; c < ctas; ++c)
    ASSERT_LE(stats.work_indptr[c], stats.work_indptr[c + 1]) << "work_indptr decreases at CTA " << c;

  // Each item names an expected tile; collect each tile's chunks.
  std::vector<int32_t> first_tile(requests + 1, 0);
  for (const PlanTile& t : tiles) ++first_tile[t.request + 1];
  for (int32_t r = 0; r < requests; ++r) first_tile[r + 1] += first_tile[r];
  std::vector<std::vector<int32_t>> of_tile(tiles.size());
  for (size_t i = 0; i < items.size(); ++i) {
    const PlanItem& w = items[i];
    ASSERT_TRUE(w.request >= 0 && w.request < requests) << "item " << i << ": request " << w.request;
    ASSERT_TRUE(w.q_tile >= 0 && w.q_tile < first_tile[w.request + 1] - first_tile[w.request])
        << "item " << i << ": request " << w.request << " has no q tile " << w.q_tile;
    of_tile[first_tile[w.request] + w.q_tile].push_back(static_cast<int32_t>(i));
  }

  // Exact cover of every tile's range, by the chunks L = chunk_size gives;
  // split tiles: consecutive slots in KV order, one counter.
  const int64_t align = align_of(opt), L = stats.chunk_size;
  std::vector<int> slot_uses(std::max(0, stats.num_slots), 0), counter_uses(std::max(0, stats.num_split), 0);
  int32_t split_tiles = 0, split_chunks = 0;
  for (size_t t = 0; t < tiles.size(); ++t) {
    const PlanTile& tile = tiles[t];
    auto& mine = of_tile[t];
    std::sort(mine.begin(), mine.end(), [&](int32_t a, int32_t b) { return items[a].kv_start < items[b].kv_start; });
    ASSERT_FALSE(mine.empty()) << "request " << tile.request << " tile " << tile.q_tile << " has no work item";
    int32_t at = tile.begin;
    for (int32_t i : mine) {
      const PlanItem& w = items[i];
      ASSERT_EQ(w.kv_start, at) << "request " << tile.request << " tile " << tile.q_tile << " [" << tile.begin
                                << ", " << tile.end << "): gap or overlap at key " << at;
      ASSERT_TRUE(w.kv_end > w.kv_start || (tile.begin == tile.end && mine.size() == 1))
          << "request " << tile.request << " tile " << tile.q_tile << ": empty chunk at " << at;
      ASSERT_LE(w.kv_end - w.kv_start, L) << "chunk over chunk_size";
      at = w.kv_end;
    }
    ASSERT_EQ(at, tile.end) << "request " << tile.request << " tile " << tile.q_tile << " [" << tile.begin << ", "
                            << tile.end << "): chunks end at " << at;
    const auto expect = chunks_of(tile, L, align);
    ASSERT_EQ(mine.size(), expect.size()) << "request " << tile.request << " tile " << tile.q_tile
                                          << ": not the near-equal chunking of L = " << L;
    for (size_t k = 0; k < mine.size(); ++k)
      ASSERT_EQ(items[mine[k]].kv_end, expect[k].second) << "request " << tile.request << " tile " << tile.q_tile
                                                         << " chunk " << k << ": not the chunking of L = " << L;
    const int32_t n = static_cast<int32_t>(mine.size());
    const PlanItem& head = items[mine[0]];
    for (int32_t k = 0; k < n; ++k) {
      const PlanItem& w = items[mine[k]];
      ASSERT_EQ(w.num_chunks, n) << "request " << tile.request << " tile " << tile.q_tile;
      ASSERT_EQ(w.first_slot, head.first_slot) << "request " << tile.request << " tile " << tile.q_tile;
      ASSERT_EQ(w.counter, head.counter) << "request " << tile.request << " tile " << tile.q_tile;
      if (n == 1) {
        ASSERT_EQ(w.partial_slot, -1) << "an unsplit tile writes through";
        ASSERT_EQ(w.first_slot, -1) << "an unsplit tile has no slots";
      } else {
        ASSERT_EQ(w.partial_slot, w.first_slot + k) << "request " << tile.request << " tile " << tile.q_tile
                                                    << ": chunk " << k << "'s slot";
      }
    }
    if (n == 1) {
      ASSERT_EQ(head.counter, -1) << "an unsplit tile has no merge counter";
      continue;
    }
    ++split_tiles;
    split_chunks += n;
    ASSERT_TRUE(head.first_slot >= 0 && head.first_slot + n <= stats.num_slots)
        << "request " << tile.request << " tile " << tile.q_tile << ": slots " << head.first_slot << "+" << n
        << " outside num_slots " << stats.num_slots;
    for (int32_t k = 0; k < n; ++k) ++slot_uses[head.first_slot + k];
    if (by_request) {  // prefill: a counter per split tile (decode's are per request, by index)
      ASSERT_TRUE(head.counter >= 0 && head.counter < stats.num_split)
          << "request " << tile.request << " tile " << tile.q_tile << ": counter " << head.counter;
      ++counter_uses[head.counter];
    }
  }
  EXPECT_EQ(stats.num_split, split_tiles);
  EXPECT_EQ(stats.num_slots, split_chunks);
  for (size_t s = 0; s < slot_uses.size(); ++s) ASSERT_EQ(slot_uses[s], 1) << "partial slot " << s;
  if (by_request) {
    for (size_t c = 0; c < counter_uses.size(); ++c) ASSERT_EQ(counter_uses[c], 1) << "merge counter " << c;
  }

  // Workspace bounds (paper Appendix D.3; fixed chunks: fixed_chunk_bound).
  int64_t keys = 0;
  for (const PlanTile& t : tiles) keys += t.end - t.begin;
  const bool fixed = opt.split_kv && opt.fixed_chunk > 0;
  const int64_t fixed_bound = fixed_chunk_bound(keys, static_cast<int64_t>(tiles.size()), opt.fixed_chunk);
  EXPECT_LE(stats.num_slots, std::max(bounds.slots, fixed_bound)) << "partial slots over the workspace bound";
  EXPECT_LE(stats.num_split, fixed ? static_cast<int64_t>(tiles.size()) : bounds.split_tiles)
      << "split tiles (merge counters) over the workspace bound";
  EXPECT_LE(static_cast<int64_t>(items.size()), std::max(bounds.items, fixed_bound))
      << "work items over the workspace bound";
  // The caller's capacity (PlannerOptions::max_slots / max_split_tiles),
  // which fixed chunks ignore.
  if (!fixed && opt.max_slots > 0) EXPECT_LE(stats.num_slots, opt.max_slots) << "partial slots over max_slots";
  if (!fixed && opt.max_split_tiles > 0) EXPECT_LE(stats.num_split, opt.max_split_tiles) << "split tiles over the cap";

  // Short steps (PlannerOptions::unsplit_max_kv) and the ablation stay whole;
  // otherwise L is at least line 3's total / ctas and a multiple of chunk_align.
  const bool short_step = is_short_step(tiles, ctas, opt);
  const int64_t L3 = line3_chunk(tiles, ctas, opt);
  if (fixed) {
    EXPECT_EQ(stats.chunk_size, align_up(opt.fixed_chunk, align)) << "fixed chunks: L is fixed_chunk, aligned";
  } else if (!opt.split_kv || short_step) {
    EXPECT_EQ(stats.num_split, 0) << (short_step ? "a short step is split" : "split_kv off, yet split");
    EXPECT_EQ(stats.chunk_size, INT32_MAX);
  } else {
    EXPECT_GE(stats.chunk_size, L3) << "L below line 3's total / ctas";
    EXPECT_EQ(stats.chunk_size % align, 0) << "L not a multiple of chunk_align";
  }

  // The queues are exactly the greedy list schedule of the plan's chunks.
  std::vector<int> cta;
  std::vector<uint64_t> cost;
  const auto order = list_schedule(items, ctas, opt, tile_rows, by_request, cta, cost);
  std::vector<std::vector<size_t>> expect_queue(ctas);
  for (size_t i : order) expect_queue[cta[i]].push_back(i);
  for (int c = 0; c < ctas; ++c) {
    const size_t n = expect_queue[c].size(), begin = stats.work_indptr[c];
    ASSERT_EQ(static_cast<size_t>(stats.work_indptr[c + 1]) - begin, n) << "CTA " << c << "'s queue length";
    for (size_t k = 0; k < n; ++k)
      ASSERT_EQ(expect_queue[c][k], begin + k) << "CTA " << c << " position " << k << ": not the greedy order";
  }
  // Hence the greedy bound: the last chunk of the busiest CTA went to the
  // cheapest CTA, at most the mean, so max <= mean + the largest item.
  uint64_t max16 = 0, total16 = 0, item16 = 0;
  for (uint64_t x : cost) {
    max16 = std::max(max16, x);
    total16 += x;
  }
  for (const PlanItem& w : items) item16 = std::max(item16, cost16(opt, tile_rows, w.kv_end - w.kv_start));
  EXPECT_LE(max16 * static_cast<uint64_t>(ctas), total16 + item16 * static_cast<uint64_t>(ctas))
      << "max CTA cost over the mean plus one item";
  EXPECT_EQ(stats.max_cta_cost, static_cast<double>(max16) / 16.0) << "reported max CTA cost";
  EXPECT_NEAR(stats.mean_cta_cost, static_cast<double>(total16) / 16.0 / ctas, 1e-9 * (1.0 + stats.mean_cta_cost))
      << "reported mean CTA cost";

  // The refinement keeps line 3's plan unless it is cheaper; without merge
  // costs or capacity caps the later growth of L never runs, so no plan is
  // worse than line 3's.
  const bool capped = opt.max_slots > 0 || opt.max_split_tiles > 0;
  if (opt.split_kv && !short_step && !fixed && opt.merge_cost <= 0 && !capped) {
    std::vector<PlanItem> line3;
    for (const PlanTile& t : tiles)
      for (auto [s, e] : chunks_of(t, L3, align)) line3.push_back({t.request, t.q_tile, s, e, -1, -1, 1, -1});
    std::vector<int> cta3;
    std::vector<uint64_t> cost3;
    list_schedule(line3, ctas, opt, tile_rows, by_request, cta3, cost3);
    const uint64_t max3 = cost3.empty() ? 0 : *std::max_element(cost3.begin(), cost3.end());
    EXPECT_LE(max16, max3) << "the chosen L (" << L << ") is costlier than line 3's (" << L3 << ")";
  }
}

inline void check_decode_plan(std::span<const int32_t> lens, int ctas, const PlannerOptions& opt,
                              const DecodePlan& plan) {
  const auto tiles = decode_tiles(lens, opt);
  const int64_t batch = static_cast<int64_t>(lens.size());
  check_plan(tiles, static_cast<int32_t>(batch), ctas, opt, 1.0, false, plan, plan_items(plan),
             {decode_max_slots(ctas), max_split_tiles(ctas), decode_max_items(batch, ctas)});
  EXPECT_EQ(plan.num_split_requests, plan.num_split);
}

inline void check_prefill_plan(std::span<const int32_t> qo, std::span<const int32_t> kv, int group, int cta_q,
                               bool causal, int ctas, const PlannerOptions& opt, const PrefillPlan& plan) {
  const auto tiles = prefill_tiles(qo, kv, group, cta_q, causal, opt);
  int64_t total_q = 0;
  for (int32_t q : qo) total_q += q;
  const int64_t batch = static_cast<int64_t>(qo.size()), max_tiles = prefill_max_tiles(total_q, batch, group, cta_q);
  EXPECT_LE(static_cast<int64_t>(tiles.size()), max_tiles) << "query tiles over prefill_max_tiles";
  EXPECT_EQ(plan.cta_q, cta_q);
  check_plan(tiles, static_cast<int32_t>(batch), ctas, opt, static_cast<double>(cta_q), true, plan, plan_items(plan),
             {max_split_slots(ctas), max_split_tiles(ctas), prefill_max_items(max_tiles, ctas)});
}

}  // namespace tessera::test
