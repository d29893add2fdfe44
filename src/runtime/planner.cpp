#include "tessera/runtime/planner.hpp"

#include <algorithm>

#include "tessera/core/error.hpp"

namespace tessera {

void Planner::plan_decode(std::span<const int32_t> kv_lens, int ctas, const PlannerOptions& opt, DecodePlan& out) {
  if (ctas < 1) throw InvalidArgument("ctas: expected >= 1, got " + std::to_string(ctas));
  const int64_t batch = static_cast<int64_t>(kv_lens.size());
  int64_t total = 0;
  for (int64_t i = 0; i < batch; ++i) {
    if (kv_lens[i] < 0) throw InvalidArgument("kv_lens: expected values >= 0, got " + std::to_string(kv_lens[i]));
    total += kv_lens[i];
  }

  // Line 3 of Algorithm 1: the largest chunk, total / #CTA (rounded up).
  int64_t L = INT32_MAX;
  if (opt.split_kv) {
    const int64_t align = std::max(1, opt.chunk_align);
    L = std::max<int64_t>((total + ctas - 1) / ctas, std::max(1, opt.min_chunk));
    L = (L + align - 1) / align * align;
  }
  out.chunk_size = static_cast<int32_t>(std::min<int64_t>(L, INT32_MAX));

  // Line 4: chunks; split requests get consecutive partial slots.
  chunks_.clear();
  first_slot_.assign(batch, -1);
  num_chunks_.assign(batch, 1);
  int32_t slots = 0, split = 0;
  for (int64_t i = 0; i < batch; ++i) {
    const int64_t len = kv_lens[i];
    const int64_t n = std::max<int64_t>(1, (len + L - 1) / L);
    num_chunks_[i] = static_cast<int32_t>(n);
    if (n > 1) {
      first_slot_[i] = slots;
      slots += static_cast<int32_t>(n);
      ++split;
    }
    for (int64_t c = 0; c < n; ++c)
      chunks_.push_back({static_cast<int32_t>(i), static_cast<int32_t>(c * L), static_cast<int32_t>(std::min(len, (c + 1) * L))});
  }
  out.num_slots = slots;
  out.num_split_requests = split;

  // Line 5: longest first; ties by request, then chunk (deterministic).
  order_.resize(chunks_.size());
  for (size_t i = 0; i < order_.size(); ++i) order_[i] = static_cast<int32_t>(i);
  std::sort(order_.begin(), order_.end(), [&](int32_t a, int32_t b) {
    const int32_t la = chunks_[a].end - chunks_[a].start, lb = chunks_[b].end - chunks_[b].start;
    return la != lb ? la > lb : a < b;
  });

  // Lines 6-13: each chunk to the cheapest CTA (ties: lowest index).
  heap_.clear();
  for (int c = 0; c < ctas; ++c) heap_.push_back({0.0, c});
  auto cheaper_last = [](const std::pair<double, int32_t>& a, const std::pair<double, int32_t>& b) {
    return a.first != b.first ? a.first > b.first : a.second > b.second;  // min-heap
  };
  std::make_heap(heap_.begin(), heap_.end(), cheaper_last);
  owner_.resize(chunks_.size());
  for (int32_t w : order_) {
    std::pop_heap(heap_.begin(), heap_.end(), cheaper_last);
    auto& [cost, cta] = heap_.back();
    owner_[w] = cta;
    cost += opt.alpha * 1.0 + opt.beta * (chunks_[w].end - chunks_[w].start);
    std::push_heap(heap_.begin(), heap_.end(), cheaper_last);
  }
  double max_cost = 0, sum_cost = 0;
  for (auto& [cost, cta] : heap_) {
    max_cost = std::max(max_cost, cost);
    sum_cost += cost;
  }
  out.max_cta_cost = max_cost;
  out.mean_cta_cost = sum_cost / ctas;

  // Per-CTA queues (counting sort by owner, keeping assignment order).
  out.work_indptr.assign(ctas + 1, 0);
  for (int32_t w : order_) ++out.work_indptr[owner_[w] + 1];
  for (int c = 0; c < ctas; ++c) out.work_indptr[c + 1] += out.work_indptr[c];
  out.items.resize(chunks_.size());
  std::vector<int32_t>& fill = fill_;
  fill.assign(out.work_indptr.begin(), out.work_indptr.end() - 1);
  for (int32_t w : order_) {
    const Chunk& ch = chunks_[w];
    const int32_t r = ch.request;
    const int32_t chunk_idx = L == INT32_MAX ? 0 : static_cast<int32_t>(ch.start / L);
    DecodeWorkItem item;
    item.request = r;
    item.kv_start = ch.start;
    item.kv_end = ch.end;
    item.first_slot = first_slot_[r];
    item.num_chunks = num_chunks_[r];
    item.partial_slot = first_slot_[r] < 0 ? -1 : first_slot_[r] + chunk_idx;
    out.items[fill[owner_[w]]++] = item;
  }
}

}  // namespace tessera
