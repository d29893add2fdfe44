// The load-balanced scheduler (paper Algorithm 1), on the host.
//
// Work is a list of query tiles, each with the KV length it must visit (for
// decode a tile is one request's query; for prefill a tile is CTA_Q fused
// query rows, and under a causal mask only the visible KV prefix counts).
// Each tile's KV is cut into chunks of at most L_kv tokens, L_kv = total KV
// work / #CTA (so only long tiles split); chunks are sorted by length, longest
// first, and each goes to the currently cheapest CTA (a priority queue on
// cost = alpha * T_q + beta * l_kv). Prefill keeps each request's chunks
// together in that order (requests with the longest chunks first) so the CTAs
// share a request's KV through L2, but for its last chunks (plan::kTailRuns),
// which go longest first across requests. The result is a work queue per CTA plus
// the partial-state slots and merge counters of split tiles. Identical
// lengths always give an identical plan (every tie is broken by index), so the
// merge order, and the output bits, are reproducible.
#pragma once
#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include "tessera/abi/decode_params.cuh"
#include "tessera/abi/prefill_params.cuh"

namespace tessera {

// How much less a query row's fixed cost weighs on compute-bound tiles
// (PlannerOptions::alpha).
constexpr double kComputeBoundAlphaScale = 32.0;

struct PlannerOptions {
  bool split_kv = true;  // false: one chunk per tile (the ablation "no load balancing")
  // Fixed cost of a work item per query row of the tile, in KV-token units.
  // The paper's constant is for memory-bound rows (decode), where a KV token
  // costs the same whatever the tile's rows. On the Hopper prefill kernel's
  // 128-row tiles, compute-bound, a KV token costs every row's math, so
  // BatchPrefill charges alpha / kComputeBoundAlphaScale per row there (the
  // default: 128 tokens, one KV tile, for a tile's Q load and epilogue: at
  // half that, short prompts' plans gave some CTAs twice the items of others).
  double alpha = 32.0;
  double beta = 1.0;     // cost per KV token
  int min_chunk = 64;    // floor of L_kv (a tile's chunks are near-equal pieces of at most L_kv, each > L_kv / 2 but its last)
  int chunk_align = 16;  // L_kv is rounded up to a multiple of this
  // Cost of merging one row of one chunk's partial state, in KV-token units
  // (not in the paper's model). The model charges a split tile's merge to
  // one CTA, as its last writer merges it: a tile of R rows cut k ways costs
  // that CTA merge_cost * R * k more; L_kv grows (doubling) while that
  // lowers the estimated makespan. 0: off. 0.5 from the H100: a 64-row tile
  // of a shared prefix cut 33 ways merged for ~4x its chunks' own time,
  // merged by its last writer. The kernels merge a split tile in slices on
  // its CTAs (common/cooperative_merge.cuh), so the model
  // overcharges those tiles' splits; re-fitting it is open.
  double merge_cost = 0.5;
  // Sliding window (the variant's declared window_left, >= 0; -1 = none):
  // keys left of every row's window are not visited at all (tiles start at the
  // first key their first row sees, rounded down to chunk_align).
  int window_left = -1;
  // Reverse every other run of `ctas` chunks in the assignment order
  // (boustrophedon). With equal costs the greedy assignment deals chunks out
  // round robin, so CTA c would get query tile c of every request; when the
  // real cost grows with the tile (a custom mask that is causal-like, whose
  // masked tiles the run trims off), CTA c then gets tiles c and n - 1 - c in
  // turn, and every CTA the same total. Set by BatchPrefill for custom masks.
  bool serpentine = false;
  // Short steps (not in the paper's model). A split tile's merge is a chain
  // of dependent round trips (~2 us on an H100) that a short, memory-bound
  // step does not earn back once every tile already has an SM of its own:
  // decode on tensor cores, GQA 32/8, batch 16 x 256 / 512 / 1024 keys ran
  // 19% / 10% / 2% faster unsplit, and 3% slower at 2048
  // (bench/results/decode-short-steps-*). So when there are at least
  // unsplit_min_tiles tiles, no more than the CTAs, none has more than
  // unsplit_max_kv keys, and the longest is within 1/8 of the mean SM's
  // share (total / unsplit_min_tiles), every tile stays whole. Skewed
  // lengths keep splitting: uniform 256..1024 ran 15% slower unsplit.
  // unsplit_max_kv: 0 = off;
  // -1 = the wrapper's choice (1024 for decode on tensor cores, else off).
  int unsplit_max_kv = -1;
  int unsplit_min_tiles = 1;  // set by the wrapper: its CTAs / CTAs per SM
  // Batch-invariant chunks (FlashInfer's fixed_split_size; 0: off). > 0:
  // every tile is cut into near-equal chunks of at most fixed_chunk keys
  // (rounded up to chunk_align) whatever else is in the batch, and none of
  // the batch-dependent rules applies (line 3's L, the refinement, short
  // steps, merge-aware growth). A tile's chunks, their merge order and so its
  // output are then bitwise the same in any batch; the greedy assignment
  // still balances the CTAs. The workspace holds the extra partial states
  // (fixed_chunk_bound).
  int fixed_chunk = 0;
  // What the caller's workspace holds (0: no cap): partial-state slots and
  // split tiles (merge counters). A workspace smaller than the worst case
  // (max_split_slots) gets fewer partial rows; while a plan needs more than
  // these, L doubles (aligned, at most the longest tile, where nothing
  // splits), trading load balance for fitting. Caps at or above the worst
  // case never bind, so such plans are unchanged. Fixed chunks ignore them
  // (L is the caller's; the wrapper refuses a plan that does not fit).
  int64_t max_slots = 0;
  int64_t max_split_tiles = 0;
};

// What every plan reports besides its work items.
struct PlanStats {
  std::vector<int32_t> work_indptr;  // [ctas + 1]
  int32_t chunk_size = 0;            // L_kv
  int32_t num_slots = 0;             // partial states used by split tiles
  int32_t num_split = 0;             // split tiles (= merge counters used)
  double max_cta_cost = 0, mean_cta_cost = 0;
};

struct DecodePlan : PlanStats {
  std::vector<DecodeWorkItem> items;  // grouped by CTA
  int32_t num_split_requests = 0;
};

struct PrefillPlan : PlanStats {
  std::vector<PrefillWorkItem> items;
  int32_t cta_q = 0;
};

// Upper bounds that size the workspace (paper Appendix D.3): a split tile has
// more than L_kv >= total/ctas tokens, so split chunks number < 2 * ctas and
// split tiles < ctas.
inline int64_t max_split_slots(int64_t ctas) { return 2 * ctas; }
inline int64_t max_split_tiles(int64_t ctas) { return ctas; }
inline int64_t decode_max_slots(int64_t ctas) { return max_split_slots(ctas); }
inline int64_t decode_max_items(int64_t max_batch, int64_t ctas) { return max_batch + 2 * ctas; }
// Query tiles of a prefill batch: at most ceil(total_q * group / cta_q) + batch.
inline int64_t prefill_max_tiles(int64_t max_total_q, int64_t max_batch, int group, int cta_q) {
  return (max_total_q * group + cta_q - 1) / cta_q + max_batch;
}
inline int64_t prefill_max_items(int64_t max_tiles, int64_t ctas) { return max_tiles + 2 * ctas; }
// With PlannerOptions::fixed_chunk = L (aligned), tiles holding total_keys
// keys make at most total_keys / L + tiles chunks (each tile one partial piece).
inline int64_t fixed_chunk_bound(int64_t total_keys, int64_t tiles, int64_t L) {
  return L > 0 ? (total_keys + L - 1) / L + tiles : 0;
}

class Planner {
 public:
  // Decode: kv_lens[i] is request i's KV length (>= 0). ctas: CTA columns (>= 1).
  void plan_decode(std::span<const int32_t> kv_lens, int ctas, const PlannerOptions& opt, DecodePlan& out);
  // Prefill: per request qo_lens / kv_lens; `group` query heads fused per KV
  // head; cta_q fused rows per tile. causal: tiles only visit the KV prefix
  // their last row can see (bottom-right aligned), so fully masked KV tiles
  // are never loaded.
  void plan_prefill(std::span<const int32_t> qo_lens, std::span<const int32_t> kv_lens, int group, int cta_q,
                    bool causal, int ctas, const PlannerOptions& opt, PrefillPlan& out);

 private:
  struct Tile {
    int32_t request, q_tile, kv_len;  // kv_len keys from kv_begin are visited
    int32_t kv_begin = 0;
    int32_t rows = 1;  // query rows the tile holds (what a merge of its chunks reads per chunk)
  };
  struct Chunk {
    int32_t tile, start, end, index;
  };
  // Chunks the tiles, assigns chunks to CTAs; fills stats and, per chunk in
  // queue order, the chunk and its owning CTA (order_).
  void schedule(int ctas, double tile_rows, const PlannerOptions& opt, PlanStats& out);
  // Drops the keys before first_key (rounded down to chunk_align) from a tile.
  static void clip_to_window(Tile& tile, int64_t first_key, const PlannerOptions& opt);
  // Chunks every tile at most L long and assigns the chunks greedily; returns
  // the largest CTA cost (1/16 token).
  int64_t assign(int64_t L, int ctas, double tile_rows, const PlannerOptions& opt);

  // What assign() leaves for schedule(): the chunks, their CTAs and order,
  // the split tiles' slots, the final heap (CTA costs).
  struct Assignment {
    std::vector<Chunk> chunks;
    std::vector<int32_t> first_slot, num_chunks, counter, owner, order;
    std::vector<uint64_t> heap;
    int32_t slots = 0, split = 0;
  };
  // Stable sort of minor_ by its high 32 bits (decode's chunk order: the low
  // bits, the chunk ids, are already ascending), LSD radix on the bytes the
  // key range needs.
  void sort_by_length();

  std::vector<Tile> tiles_;
  Assignment cur_;
  std::vector<int32_t> fill_, queue_, rank_;
  static constexpr int kCtaBits = 20;  // heap entries: cost (1/16 token units) << kCtaBits | CTA
  static constexpr uint64_t kCtaMask = (uint64_t{1} << kCtaBits) - 1;
  std::vector<uint64_t> minor_, radix_tmp_;          // assign()'s sort keys: (length descending, chunk id) ...
  std::vector<std::pair<uint64_t, uint64_t>> keys_;  // ... behind (request rank, request) for prefill
  bool group_by_request_ = false;  // chunk order: by request, then length (prefill), or by length alone
};

}  // namespace tessera
