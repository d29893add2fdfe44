// Shared prefixes found from a page table (FlashInfer paper §3.1.2, §4.4).
//
// With prefix caching or parallel samples of one prompt, several requests
// list the same pages at the start of their page tables. Attention over the
// flat table reads those pages once per request; split into two composable
// levels it reads them once per group of sharers, on the tensor cores, and
// merges the states (O, LSE) with each request's own pages:
//
//   level 0 (shared): one entry per group, its query rows being all of its
//            members' rows, its pages the shared ones (all full); runs of
//            requests in no group form entries without pages;
//   level 1 (unique): one entry per request, its pages after the shared ones
//            (with its own last_page_len), in the same row order.
//
// Every (request, key) pair is in exactly one level, in the request's key
// order (shared keys first), so CascadeAttention over the two levels equals
// the flat attention (api/cascade.hpp: cascade_levels() turns a split into
// its CascadeLevels).
//
// Detection: a request's *full* pages are all but a partly filled last page
// (a fork mid-page shares the slots before the fork, but the request sees
// only its own tokens of that page, so the page is not shared). Requests
// are grouped by their first page id; a group's shared pages are its
// members' longest common run of identical ids at identical positions from
// position 0, cut to every member's full pages. A group of fewer than two
// members or with fewer than min_shared_pages shared pages is no group.
// (Two-level only: members that share more among themselves than with
// their whole group share the group's prefix here; a third level would take
// the rest.) Cost: one pass over the ids to validate them, a sort of the
// candidates' first ids, one comparison of each member's shared run, and
// the copies into the levels: ~O(pages + requests log requests).
#pragma once
#include <cstdint>
#include <span>
#include <vector>

namespace tessera {

struct SharedPrefixOptions {
  // The fewest shared pages that make a group (>= 1).
  int32_t min_shared_pages = 1;
  // Build the levels only when the split saves at least this many page
  // reads: the sum over groups of shared_pages * (members - 1) (>= 0). The
  // split costs a launch and a merge per layer, so callers set this from
  // their page bytes (the Python wrappers: 16 MiB of K / V).
  int64_t min_saved_pages = 1;
  // Causal prefill (bottom-right aligned: query i of a request with q
  // queries over L keys sees keys <= L - q + i). The shared level has no
  // mask, so each member shares at most floor((L - q) / page_size) pages:
  // then every shared key precedes all of its queries, and its level-1
  // keys (L' = L - shared keys >= q) keep the same alignment. Decode and
  // non-causal prefill need no cut.
  bool causal = false;
  // Groups only of adjacent requests (a run in the caller's order with the
  // same first page id), so the levels keep the caller's row order
  // (identity_order always): no gather of q or scatter of the outputs, which
  // a CUDA graph would have to replay on every step. Members of one prompt
  // that are not adjacent form one group per run.
  bool keep_order = false;
  // Fill the levels on every call (`split` true): without groups worth
  // min_saved_pages, level 0 is entries without pages (`grouped` false; the
  // groups found are still listed). For a caller that runs the same launches
  // every step (a captured CUDA graph).
  bool always_levels = false;
  // The fewest members that make a group (>= 2). Members the flat kernels
  // run side by side read a shared page mostly from L2, so small groups
  // save little HBM traffic.
  int32_t min_members = 2;
};

struct SharedPrefixGroup {
  int32_t first = 0;         // position of its first member in SharedPrefixSplit::order (-1 when the levels do not hold it)
  int32_t size = 0;          // members (>= 2): order[first .. first + size)
  int32_t shared_pages = 0;  // >= min_shared_pages
};

// A level as CascadeLevel takes it (host arrays).
struct PrefixLevel {
  std::vector<int32_t> qo_indptr, kv_indptr, kv_indices, kv_last_page_len;
};

struct SharedPrefixSplit {
  // Every group, in the order of their smallest request index; found even
  // when the split is not worth it (`split` false).
  std::vector<SharedPrefixGroup> groups;
  int64_t saved_pages = 0;  // page reads the split saves: sum of shared_pages * (size - 1)
  // Whether the levels below are filled: groups found and saved_pages >=
  // min_saved_pages, or always_levels. When false, attend over the caller's
  // table as usual.
  bool split = false;
  // Whether level 0 holds the groups (false with always_levels when they
  // save less than min_saved_pages: then every request is in level 1 whole).
  bool grouped = false;
  // The request order of both levels: level position k holds request
  // order[k]. Each group's members are made adjacent (a level-0 entry is a
  // contiguous range of query rows), at the place of its first member; other
  // requests keep their places. identity_order: order[k] == k for all k.
  std::vector<int32_t> order;
  bool identity_order = true;
  // Without identity_order: level query row i is the caller's query row
  // row_order[i] (gather q by it, scatter the outputs back); empty otherwise.
  std::vector<int32_t> row_order;
  PrefixLevel shared, unique;  // levels 0 and 1
  double host_us = 0;          // time spent in find_shared_prefixes
};

// Finds the shared prefixes of a page table and, when worth it, its two
// levels. kv_indptr [requests + 1] (in pages), kv_indices, kv_last_page_len
// [requests] and page_size as BatchDecode / BatchPrefill plans take them
// (checked the same way; errors name the argument). qo_indptr [requests + 1]:
// the query rows of each request (prefill), or empty for decode (one query
// row per request). Requests without queries join no group (sharing saves
// them nothing). Deterministic: the result depends only on the arguments.
// The second form reuses `out`'s buffers (no allocation in steady state).
SharedPrefixSplit find_shared_prefixes(std::span<const int32_t> kv_indptr, std::span<const int32_t> kv_indices,
                                       std::span<const int32_t> kv_last_page_len, int32_t page_size,
                                       std::span<const int32_t> qo_indptr = {}, const SharedPrefixOptions& opt = {});
void find_shared_prefixes(std::span<const int32_t> kv_indptr, std::span<const int32_t> kv_indices,
                          std::span<const int32_t> kv_last_page_len, int32_t page_size,
                          std::span<const int32_t> qo_indptr, const SharedPrefixOptions& opt, SharedPrefixSplit& out);

}  // namespace tessera
