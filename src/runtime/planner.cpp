#include "tessera/runtime/planner.hpp"

#include <algorithm>
#include <string>

#include "tessera/core/error.hpp"
#include "tessera/device/kernels/plan/schedule.cuh"
#include "tessera/runtime/device_planner.hpp"

namespace tessera {

void Planner::sort_by_length() {
  const size_t n = minor_.size();
  if (n < 2) return;
  uint32_t lo = UINT32_MAX, hi = 0;
  for (uint64_t k : minor_) {
    lo = std::min(lo, static_cast<uint32_t>(k >> 32));
    hi = std::max(hi, static_cast<uint32_t>(k >> 32));
  }
  if (lo == hi) return;  // equal lengths: already in order
  radix_tmp_.resize(n);
  for (int shift = 0; shift < 32 && ((hi - lo) >> shift) != 0; shift += 8) {
    size_t count[257] = {};
    for (uint64_t k : minor_) ++count[((static_cast<uint32_t>(k >> 32) - lo) >> shift & 0xFF) + 1];
    for (int b = 0; b < 256; ++b) count[b + 1] += count[b];
    for (uint64_t k : minor_) radix_tmp_[count[(static_cast<uint32_t>(k >> 32) - lo) >> shift & 0xFF]++] = k;
    minor_.swap(radix_tmp_);
  }
}

int64_t Planner::assign(int64_t L, int ctas, double tile_rows, const PlannerOptions& opt) {
  Assignment& a = cur_;
  // Line 4: chunks. A tile of n chunks is cut into n near-equal aligned
  // pieces, not L-sized ones plus a tail: a tiny tail costs a whole item's
  // fixed overhead. A split tile gets consecutive partial slots and a counter.
  const int64_t align = std::max(1, opt.chunk_align);
  const size_t n_tiles = tiles_.size();
  a.chunks.clear();
  a.first_slot.assign(n_tiles, -1);
  a.num_chunks.assign(n_tiles, 1);
  a.counter.assign(n_tiles, -1);
  a.slots = a.split = 0;
  for (size_t i = 0; i < n_tiles; ++i) {
    const int64_t len = tiles_[i].kv_len, begin = tiles_[i].kv_begin;
    if (len <= L) {  // most tiles: one chunk, without the three 64-bit divisions below
      a.chunks.push_back({static_cast<int32_t>(i), static_cast<int32_t>(begin), static_cast<int32_t>(begin + len), 0});
      continue;
    }
    const int64_t n = (len + L - 1) / L;
    const int64_t step = std::min(L, ((len + n - 1) / n + align - 1) / align * align);
    const int64_t chunks = (len + step - 1) / step;
    a.num_chunks[i] = static_cast<int32_t>(chunks);
    if (chunks > 1) {
      a.first_slot[i] = a.slots;
      a.slots += static_cast<int32_t>(chunks);
      a.counter[i] = a.split++;
    }
    for (int64_t c = 0; c < chunks; ++c)
      a.chunks.push_back({static_cast<int32_t>(i), static_cast<int32_t>(begin + c * step),
                         static_cast<int32_t>(begin + std::min(len, (c + 1) * step)), static_cast<int32_t>(c)});
  }

  // Line 5: longest first; ties by tile, then chunk (deterministic).
  // Prefill (group_by_request_): requests one after another (the request with
  // the longest chunk first), each request's chunks longest first. Since the
  // CTAs drain their queues at about the same pace, they then work on the same
  // request at the same time and read its KV from L2 instead of each query
  // tile re-reading it from HBM (all requests' tiles at once made a 4k causal
  // batch read every KV row from HBM ~16 times: 1.45 TB/s of DRAM traffic in a
  // compute-bound kernel). Within a request the order is still line 5's, and
  // the last plan::kTailRuns * ctas chunks are in line 5's order whatever
  // their request.
  // The order is one sort of packed integer keys: (length descending, chunk
  // id) in 64 bits, behind (request rank, request) for prefill. plan() runs
  // every generation step, and an indirect comparator over ~500 chunks cost
  // ~10 us of its 30 us budget.
  auto len = [&](size_t c) { return a.chunks[c].end - a.chunks[c].start; };
  if (group_by_request_) {
    rank_.assign(tiles_.empty() ? 0 : tiles_.back().request + 1, 0);
    for (size_t c = 0; c < a.chunks.size(); ++c) {
      int32_t& r = rank_[tiles_[a.chunks[c].tile].request];
      r = std::max(r, len(c));
    }
  }
  const size_t n = a.chunks.size();
  minor_.resize(n);
  for (size_t c = 0; c < n; ++c) minor_[c] = (uint64_t{uint32_t(INT32_MAX - len(c))} << 32) | c;
  if (group_by_request_) {
    keys_.resize(n);
    for (size_t c = 0; c < n; ++c) {
      const uint64_t request = static_cast<uint32_t>(tiles_[a.chunks[c].tile].request);
      keys_[c] = {(uint64_t{uint32_t(INT32_MAX - rank_[request])} << 32) | request, minor_[c]};
    }
    std::sort(keys_.begin(), keys_.end());
    for (size_t i = 0; i < n; ++i) minor_[i] = keys_[i].second;
    // The tail longest first across requests (plan::kTailRuns).
    const size_t tail = std::min(n, static_cast<size_t>(plan::kTailRuns) * static_cast<size_t>(ctas));
    std::sort(minor_.end() - static_cast<std::ptrdiff_t>(tail), minor_.end());
  } else {
    // decode: one 64-bit key per chunk; the ids are ascending, so a stable
    // sort by length gives std::sort's order in a few linear passes (the
    // comparison sort was a third of plan() for skewed batches)
    sort_by_length();
  }

  if (opt.serpentine)  // odd runs of `ctas` chunks reversed (PlannerOptions::serpentine)
    for (size_t b = static_cast<size_t>(ctas); b < n; b += 2 * static_cast<size_t>(ctas))
      std::reverse(minor_.begin() + b, minor_.begin() + std::min(n, b + static_cast<size_t>(ctas)));

  // Lines 6-13: each chunk to the cheapest CTA (ties: lowest index). A heap
  // entry packs (cost in 1/16 token units, CTA) into one integer, so the
  // heap compares integers (doubles and pairs made this half of plan()).
  if (ctas >= (1 << kCtaBits)) throw InvalidArgument("ctas: expected < 2^20, got " + std::to_string(ctas));
  const size_t m = static_cast<size_t>(ctas);
  a.heap.resize(m + 1);
  for (size_t c = 0; c < m; ++c) a.heap[c] = c;  // cost 0: already a min-heap
  a.heap[m] = UINT64_MAX;  // sentinel: a missing right child is never the smaller one
  a.owner.resize(n);
  a.order.resize(n);
  // Costs in 1/16 token units, alpha * tile_rows and beta each rounded, as
  // the device planner counts them (device_plan_config).
  const DevicePlanParams units = device_plan_config(opt, ctas, tile_rows);
  const uint64_t item_cost = static_cast<uint64_t>(units.item_cost), token_cost = static_cast<uint64_t>(units.token_cost);
  auto added = [&](int32_t w) {
    return (item_cost + token_cost * static_cast<uint64_t>(a.chunks[w].end - a.chunks[w].start)) << kCtaBits;
  };
  // While every CTA still has cost 0, the cheapest is the lowest-numbered one
  // not yet given a chunk: chunk k goes to CTA k with no heap walk, as long
  // as each of those chunks adds a cost (else its CTA stays the cheapest).
  // One bottom-up heapify then orders those entries. The heap's layout may
  // differ from k sifts', but entries are unique, so every later minimum,
  // and hence the plan, is the same.
  size_t k = 0;
  for (; k < std::min(n, m); ++k) {
    const int32_t w = static_cast<int32_t>(minor_[k] & 0xFFFFFFFFu);
    const uint64_t cost = added(w);
    if (cost == 0) break;
    a.order[k] = w;
    a.owner[w] = static_cast<int32_t>(k);
    a.heap[k] += cost;
  }
  auto sift_down = [&](size_t i, uint64_t e) {
    for (size_t child = 2 * i + 1; child < m; child = 2 * i + 1) {
      child += a.heap[child + 1] < a.heap[child];
      if (a.heap[child] >= e) break;
      a.heap[i] = a.heap[child];
      i = child;
    }
    a.heap[i] = e;
  };
  if (k > 0)
    for (size_t i = m / 2; i-- > 0;) sift_down(i, a.heap[i]);
  for (; k < n; ++k) {
    const int32_t w = static_cast<int32_t>(minor_[k] & 0xFFFFFFFFu);
    a.order[k] = w;
    // The cheapest CTA takes the chunk and its entry grows. Bottom-up sift:
    // walk the smaller-child path to a leaf (a fixed-length loop with a
    // branch-free child choice), then climb back to where the entry fits.
    // Entries are unique (the CTA is in the low bits), so the heap ends up
    // exactly as a top-down sift would leave it, with fewer instructions.
    uint64_t e = a.heap[0];
    a.owner[w] = static_cast<int32_t>(e & kCtaMask);
    e += added(w);
    size_t i = 0;
    for (size_t child = 1; child < m; child = 2 * i + 1) {
      child += a.heap[child + 1] < a.heap[child];
      a.heap[i] = a.heap[child];
      i = child;
    }
    while (i > 0 && a.heap[(i - 1) / 2] > e) {
      a.heap[i] = a.heap[(i - 1) / 2];
      i = (i - 1) / 2;
    }
    a.heap[i] = e;
  }
  a.heap.pop_back();  // the sentinel
  uint64_t max_cost = 0;
  for (uint64_t e : a.heap) max_cost = std::max(max_cost, e >> kCtaBits);
  return static_cast<int64_t>(max_cost);
}

void Planner::schedule(int ctas, double tile_rows, const PlannerOptions& opt, PlanStats& out) {
  if (opt.fixed_chunk < 0) throw InvalidArgument("fixed_chunk: expected >= 0, got " + std::to_string(opt.fixed_chunk));
  // The chunk size: Algorithm 1's line 3, the one-wave refinement, short
  // steps, merge-aware growth and the workspace's capacity, each candidate
  // judged by its greedy assignment (plan::choose_chunk_size, the rule the
  // device planner runs too), so a step planned on the GPU is this plan.
  struct Greedy {
    Planner& planner;
    int ctas;
    double tile_rows;
    const PlannerOptions& opt;
    plan::Evaluation evaluate(int L) {
      const int64_t makespan = planner.assign(L, ctas, tile_rows, opt);
      const Assignment& a = planner.cur_;
      int64_t worst = 0;
      for (size_t t = 0; t < planner.tiles_.size(); ++t)
        if (a.num_chunks[t] > 1) worst = std::max<int64_t>(worst, int64_t{planner.tiles_[t].rows} * a.num_chunks[t]);
      return {makespan, a.slots, a.split, worst, static_cast<i64>(a.chunks.size())};
    }
    int64_t chunks_at(int64_t len) const {
      int64_t n = 0;
      for (const Tile& t : planner.tiles_) n += std::max<int64_t>(1, (t.kv_len + len - 1) / len);
      return n;
    }
  } greedy{*this, ctas, tile_rows, opt};
  int64_t total = 0, longest = 1;
  for (const Tile& t : tiles_) {
    total += t.kv_len;
    longest = std::max<int64_t>(longest, t.kv_len);
  }
  const int64_t L = plan::choose_chunk_size(device_plan_config(opt, ctas, tile_rows), static_cast<int>(tiles_.size()),
                                            total, longest, greedy);
  uint64_t max_cost = 0;
  for (uint64_t e : cur_.heap) max_cost = std::max(max_cost, e >> kCtaBits);
  const double best = static_cast<double>(max_cost) / 16.0;
  out.chunk_size = static_cast<int32_t>(std::min<int64_t>(L, INT32_MAX));
  out.num_slots = cur_.slots;
  out.num_split = cur_.split;
  double sum_cost = 0;
  for (uint64_t e : cur_.heap) sum_cost += static_cast<double>(e >> kCtaBits) / 16.0;
  out.max_cta_cost = best;
  out.mean_cta_cost = sum_cost / ctas;

  // Per-CTA queues (counting sort by owner, keeping assignment order): queue_
  // lists chunk ids in final item order.
  out.work_indptr.assign(ctas + 1, 0);
  for (int32_t w : cur_.order) ++out.work_indptr[cur_.owner[w] + 1];
  for (int c = 0; c < ctas; ++c) out.work_indptr[c + 1] += out.work_indptr[c];
  fill_.assign(out.work_indptr.begin(), out.work_indptr.end() - 1);
  queue_.resize(cur_.chunks.size());
  for (int32_t w : cur_.order) queue_[fill_[cur_.owner[w]]++] = w;
}

void Planner::clip_to_window(Tile& tile, int64_t first_key, const PlannerOptions& opt) {
  const int64_t align = std::max(1, opt.chunk_align);
  const int64_t begin = std::clamp<int64_t>(first_key, 0, tile.kv_len) / align * align;
  tile.kv_begin = static_cast<int32_t>(begin);
  tile.kv_len -= static_cast<int32_t>(begin);
}

void Planner::plan_decode(std::span<const int32_t> kv_lens, int ctas, const PlannerOptions& opt, DecodePlan& out) {
  if (ctas < 1) throw InvalidArgument("ctas: expected >= 1, got " + std::to_string(ctas));
  group_by_request_ = false;  // one tile per request: nothing to share
  tiles_.resize(kv_lens.size());
  int32_t min_len = 0;
  for (size_t i = 0; i < kv_lens.size(); ++i) {
    tiles_[i] = {static_cast<int32_t>(i), 0, kv_lens[i]};
    min_len = std::min(min_len, kv_lens[i]);
  }
  if (min_len < 0) throw InvalidArgument("kv_lens: expected values >= 0, got " + std::to_string(min_len));
  if (opt.window_left >= 0)
    for (Tile& t : tiles_) clip_to_window(t, t.kv_len - 1 - opt.window_left, opt);
  schedule(ctas, 1.0, opt, out);
  out.num_split_requests = out.num_split;
  out.items.resize(queue_.size());
  for (size_t i = 0; i < queue_.size(); ++i) {
    const Chunk& ch = cur_.chunks[queue_[i]];
    const int32_t t = ch.tile;
    DecodeWorkItem& item = out.items[i];
    item.request = tiles_[t].request;
    item.kv_start = ch.start;
    item.kv_end = ch.end;
    item.first_slot = cur_.first_slot[t];
    item.num_chunks = cur_.num_chunks[t];
    item.partial_slot = cur_.first_slot[t] < 0 ? -1 : cur_.first_slot[t] + ch.index;
  }
}

void Planner::plan_prefill(std::span<const int32_t> qo_lens, std::span<const int32_t> kv_lens, int group, int cta_q,
                           bool causal, int ctas, const PlannerOptions& opt, PrefillPlan& out) {
  if (ctas < 1) throw InvalidArgument("ctas: expected >= 1, got " + std::to_string(ctas));
  if (qo_lens.size() != kv_lens.size())
    throw InvalidArgument("kv_lens: expected one length per request (" + std::to_string(qo_lens.size()) + "), got " +
                          std::to_string(kv_lens.size()));
  if (group < 1 || cta_q < 1) throw InvalidArgument("group, cta_q: expected >= 1");
  tiles_.clear();
  group_by_request_ = true;
  for (size_t i = 0; i < qo_lens.size(); ++i) {
    const int64_t q = qo_lens[i], kv = kv_lens[i];
    if (q < 0 || kv < 0) throw InvalidArgument("qo_lens/kv_lens: expected values >= 0");
    const int64_t rows = q * group, n = (rows + cta_q - 1) / cta_q;
    for (int64_t t = 0; t < n; ++t) {
      int64_t visible = kv;
      if (causal) {  // the tile's last query sees keys [0, last + kv - q]
        const int64_t last_q = (std::min(rows, (t + 1) * cta_q) - 1) / group;
        visible = std::clamp<int64_t>(last_q + kv - q + 1, 0, kv);
      }
      tiles_.push_back({static_cast<int32_t>(i), static_cast<int32_t>(t), static_cast<int32_t>(visible), 0,
                        static_cast<int32_t>(std::min<int64_t>(cta_q, rows - t * cta_q))});
      // The tile's first row (query first_q, bottom-right position
      // first_q + kv - q) sees the fewest keys on the left.
      if (opt.window_left >= 0) clip_to_window(tiles_.back(), (t * cta_q) / group + kv - q - opt.window_left, opt);
    }
  }
  schedule(ctas, static_cast<double>(cta_q), opt, out);
  out.cta_q = cta_q;
  out.items.resize(queue_.size());
  for (size_t i = 0; i < queue_.size(); ++i) {
    const Chunk& ch = cur_.chunks[queue_[i]];
    const int32_t t = ch.tile;
    PrefillWorkItem& item = out.items[i];
    item.request = tiles_[t].request;
    item.q_tile = tiles_[t].q_tile;
    item.kv_start = ch.start;
    item.kv_end = ch.end;
    item.first_slot = cur_.first_slot[t];
    item.num_chunks = cur_.num_chunks[t];
    item.partial_slot = cur_.first_slot[t] < 0 ? -1 : cur_.first_slot[t] + ch.index;
    item.counter = cur_.counter[t];
  }
}

}  // namespace tessera
