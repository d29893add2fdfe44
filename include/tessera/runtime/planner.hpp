// The load-balanced scheduler (paper Algorithm 1), on the host.
//
// Decode (query tile 1): each request's KV is cut into chunks of at most L_kv
// tokens, L_kv = total KV / #CTA (so only "long" requests split); chunks are
// sorted by length, longest first, and each goes to the currently cheapest CTA
// (a priority queue on cost = alpha * l_q + beta * l_kv). The result is a work
// queue per CTA plus the partial-state slots of split requests. Identical
// lengths always give an identical plan (every tie is broken by index), so the
// merge order, and the output bits, are reproducible.
#pragma once
#include <cstdint>
#include <span>
#include <vector>

#include "tessera/device/kernels/decode_params.cuh"

namespace tessera {

struct PlannerOptions {
  bool split_kv = true;  // false: one chunk per request (the ablation "no load balancing")
  double alpha = 32.0;   // fixed cost of a work item, in KV-token units
  double beta = 1.0;     // cost per KV token
  int min_chunk = 64;    // chunks are never cut shorter than this many tokens
  int chunk_align = 16;  // L_kv is rounded up to a multiple of this
};

struct DecodePlan {
  std::vector<int32_t> work_indptr;    // [ctas + 1]
  std::vector<DecodeWorkItem> items;   // grouped by CTA
  int32_t chunk_size = 0;              // L_kv
  int32_t num_slots = 0;               // partial states used by split requests
  int32_t num_split_requests = 0;
  double max_cta_cost = 0, mean_cta_cost = 0;
};

// Upper bounds that size the workspace (paper Appendix D.3): a split request
// has more than L_kv >= total/ctas tokens, so split chunks number < 2 * ctas.
inline int64_t decode_max_slots(int64_t ctas) { return 2 * ctas; }
inline int64_t decode_max_items(int64_t max_batch, int64_t ctas) { return max_batch + 2 * ctas; }

class Planner {
 public:
  // kv_lens[i]: KV length of request i (>= 0). ctas: CTA columns (>= 1).
  // Reuses internal buffers: no allocation once warmed up to the batch size.
  void plan_decode(std::span<const int32_t> kv_lens, int ctas, const PlannerOptions& opt, DecodePlan& out);

 private:
  struct Chunk {
    int32_t request, start, end;
  };
  std::vector<Chunk> chunks_;
  std::vector<int32_t> first_slot_, num_chunks_, owner_, order_, fill_;
  std::vector<std::pair<double, int32_t>> heap_;
};

}  // namespace tessera
