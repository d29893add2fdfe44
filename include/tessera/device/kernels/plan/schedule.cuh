// The planner's arithmetic, shared by the host planner (runtime/planner.cpp)
// and the device planner (plan/kernel.cuh), so both cut and cost every tile
// alike: the chunking of a tile at chunk size L (near-equal aligned pieces
// of at most L keys), integer costs in 1/16 KV token, a prefill tile's
// visible keys and window, and the chunk-size rule itself
// (choose_chunk_size), which judges each candidate L by the makespan of
// Algorithm 1's greedy assignment, computed by the caller's evaluator.
#pragma once
#include "tessera/abi/device_plan_params.cuh"

#if defined(__CUDACC__) || defined(__CUDACC_RTC__)
#define TESSERA_PLAN_FN __host__ __device__ __forceinline__
#else
#define TESSERA_PLAN_FN inline
#endif

namespace tessera::plan {

constexpr int kNoSplit = 0x7fffffff;  // L when nothing splits
// Prefill's assignment order keeps each request's chunks together (L2
// sharing), but its last kTailRuns * ctas chunks go longest first across
// requests: in request order the batch's last chunks are one or two
// requests', too few and too alike to even out what the chunks before them
// left, and the few requests the tail reads stay in L2 in either order.
constexpr int kTailRuns = 2;

TESSERA_PLAN_FN i64 imin(i64 a, i64 b) { return a < b ? a : b; }
TESSERA_PLAN_FN i64 imax(i64 a, i64 b) { return a > b ? a : b; }
// x / d and ceil(x / d) for x >= 0, d >= 1: in 32 bits when both fit (a
// 64-bit division is a long instruction sequence on the GPU, and the
// device planner's critical path is mostly these divisions).
#if defined(__CUDACC__) || defined(__CUDACC_RTC__)
__host__ __device__ __noinline__
#else
inline
#endif
i64 div_down_wide(i64 x, i64 d) { return x / d; }  // out of line: rarely taken, long on the GPU
TESSERA_PLAN_FN i64 div_down(i64 x, i64 d) {
  if ((static_cast<u64>(x) | static_cast<u64>(d)) >> 32 == 0) return static_cast<unsigned>(x) / static_cast<unsigned>(d);
  return div_down_wide(x, d);
}
TESSERA_PLAN_FN i64 div_up(i64 x, i64 d) { return div_down(x + d - 1, d); }
TESSERA_PLAN_FN i64 align_up(i64 x, int a) { return div_up(x, a) * a; }

// A tile of len keys at chunk size L: n chunks of `step` keys, the last
// holding the rest (host planner's rule: n = ceil(len / L) near-equal
// aligned pieces), in 32-bit unsigned arithmetic (len, L < 2^31; the
// aligned step below 2^32).
struct ChunkShape {
  int n, step;
};
TESSERA_PLAN_FN ChunkShape chunk_shape(int len, int L, int align) {
  if (len <= L) return {1, len};
  const unsigned l = static_cast<unsigned>(len) - 1, a = static_cast<unsigned>(align);
  const unsigned n = l / static_cast<unsigned>(L) + 1;
  unsigned step = (l / n + a) / a * a;  // align_up(ceil(len / n), a)
  if (step > static_cast<unsigned>(L)) step = static_cast<unsigned>(L);
  return {static_cast<int>(l / step + 1), static_cast<int>(step)};
}

// The last chunk's keys (the others hold step each).
TESSERA_PLAN_FN int last_chunk_keys(int len, ChunkShape s) { return len - (s.n - 1) * s.step; }

// A prefill query tile: t of request (qo_len queries, kv_len keys), cta_q
// fused rows of `group` heads per query. Its visible keys (causal:
// bottom-right aligned, up to its last query's) and rows.
struct TileSpan {
  int begin, len, rows;
};
TESSERA_PLAN_FN TileSpan prefill_tile(int t, int qo_len, int kv_len, int group, int cta_q, bool causal) {
  const i64 rows = static_cast<i64>(qo_len) * group;
  int visible = kv_len;
  if (causal) {
    const i64 last_q = div_down(imin(rows, static_cast<i64>(t + 1) * cta_q) - 1, group);
    visible = static_cast<int>(imin(imax(last_q + kv_len - qo_len + 1, 0), kv_len));
  }
  return {0, visible, static_cast<int>(imin(cta_q, rows - static_cast<i64>(t) * cta_q))};
}

// A declared window: keys left of first_key (rounded down to align) are dropped.
TESSERA_PLAN_FN void clip_to_window(TileSpan& s, i64 first_key, int align) {
  const int begin = static_cast<int>(imin(imax(first_key, 0), s.len) / align * align);
  s.begin = begin;
  s.len -= begin;
}
// Window of a decode request (its query at position kv_len - 1) or of a
// prefill tile (its first row's query, bottom-right aligned).
TESSERA_PLAN_FN i64 decode_window_start(int kv_len, int window_left) {
  return static_cast<i64>(kv_len) - 1 - window_left;
}
TESSERA_PLAN_FN i64 prefill_window_start(int t, int qo_len, int kv_len, int group, int cta_q, int window_left) {
  return div_down(static_cast<i64>(t) * cta_q, group) + kv_len - qo_len - window_left;
}

// A request's KV length from its page-table row (paged) or its token range (ragged).
TESSERA_PLAN_FN int kv_length(int begin, int end, int last_page_len, int page_size, bool paged) {
  if (!paged) return end - begin;
  return end > begin ? (end - begin - 1) * page_size + last_page_len : 0;
}

// What the greedy assignment at one chunk size gives: the largest CTA cost,
// the partial slots and split tiles it needs, the largest rows x chunks of
// a split tile (its merge), the chunk count.
struct Evaluation {
  i64 makespan, slots, splits, worst, chunks;
};

// The chunk size: Algorithm 1's line 3; the smallest L that fits one wave
// of CTAs (binary search) if the greedy assignment rates it cheaper; no split for
// short steps; the caller's fixed chunks; merge-aware doubling while the
// estimate (makespan + the largest split tile's merge) drops; doubling
// while the workspace's caps are exceeded. The host planner and the device
// planner both decide with this one function: `ev` evaluates a size
// (ev.evaluate(L) -> Evaluation, leaving its tables at L) and counts the
// one-wave refinement's chunks (ev.chunks_at(len)); n tiles, total keys,
// longest tile (>= 1). On return the evaluator's tables hold L's.
template <typename Evaluator>
TESSERA_PLAN_FN int choose_chunk_size(const DevicePlanParams& p, int n, i64 total, i64 longest, Evaluator& ev) {
  const int a = p.chunk_align > 1 ? p.chunk_align : 1;
  const i64 sms = p.unsplit_min_tiles > 1 ? p.unsplit_min_tiles : 1;
  const bool short_step = p.unsplit_max_kv > 0 && n >= sms && n <= p.ctas && longest <= p.unsplit_max_kv &&
                          8 * longest * sms <= 9 * total;
  const bool fixed = p.split_kv && p.fixed_chunk > 0;
  const bool split = p.split_kv && !short_step && !fixed;
  auto clamp = [](i64 L) { return static_cast<int>(imin(L, kNoSplit)); };
  int L = kNoSplit;
  if (split) L = clamp(align_up(imax(div_up(total, p.ctas), p.min_chunk > 1 ? p.min_chunk : 1), a));
  if (fixed) L = clamp(align_up(p.fixed_chunk, a));
  Evaluation cur = ev.evaluate(L);
  if (!split) return L;
  int tables_at = L;
  const int whole = clamp(align_up(longest, a));
  if (ev.chunks_at(L) > p.ctas && ev.chunks_at(whole) <= p.ctas) {
    int lo = L, hi = whole;
    while (hi - lo > a) {
      const int mid = clamp(align_up(lo + (hi - lo) / 2, a));
      if (mid >= hi) break;
      if (ev.chunks_at(mid) <= p.ctas) hi = mid;
      else lo = mid;
    }
    const Evaluation fit = ev.evaluate(hi);
    tables_at = hi;
    if (fit.makespan < cur.makespan) {
      cur = fit;
      L = hi;
    }
  }
  if (p.merge_cost > 0) {
    i64 est = cur.makespan + p.merge_cost * cur.worst;
    while (10 * p.merge_cost * cur.worst > est && L < whole) {
      const int next = clamp(align_up(imin(2 * static_cast<i64>(L), longest), a));
      const Evaluation e = ev.evaluate(next);
      tables_at = next;
      const i64 e_est = e.makespan + p.merge_cost * e.worst;
      if (!(e_est < est)) break;
      est = e_est;
      cur = e;
      L = next;
    }
  }
  auto over = [&p](const Evaluation& e) {
    return (p.max_slots > 0 && e.slots > p.max_slots) || (p.max_split_tiles > 0 && e.splits > p.max_split_tiles);
  };
  while (over(cur) && L < whole) {
    L = clamp(align_up(imin(2 * static_cast<i64>(L), longest), a));
    cur = ev.evaluate(L);
    tables_at = L;
  }
  if (tables_at != L) ev.evaluate(L);
  return L;
}

}  // namespace tessera::plan
