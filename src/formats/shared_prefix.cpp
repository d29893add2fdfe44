// Shared-prefix detection over a page table and its two composable levels
// (see formats/shared_prefix.hpp for the rule). Once per step on the plan()
// path, so it is a few linear passes plus a sort of one key per candidate
// request, with scratch kept per thread and the output's vectors reused.
#include "tessera/formats/shared_prefix.hpp"

#include <algorithm>
#include <chrono>
#include <string>

#include "tessera/core/error.hpp"
#include "tessera/formats/paged_kv.hpp"
#include "tessera/formats/ragged.hpp"

namespace tessera {

namespace {

std::string str(int64_t x) { return std::to_string(x); }

// A group while it is found: its members are keys[begin, end) (sorted by
// first page id, then request, so keys[begin] is its smallest request).
struct Found {
  size_t begin, end;
  int32_t shared_pages;
};

// Per-thread scratch: a plan() per step must not allocate once warm.
struct Scratch {
  std::vector<int32_t> kv_lens, group_of;
  std::vector<uint64_t> keys;
  std::vector<Found> found;
};

Scratch& scratch() {
  thread_local Scratch s;
  return s;
}

uint32_t request_of(uint64_t key) { return static_cast<uint32_t>(key & 0xffffffffu); }
uint32_t first_page_of(uint64_t key) { return static_cast<uint32_t>(key >> 32); }

void reset_level(PrefixLevel& l) {
  l.qo_indptr.assign(1, 0);
  l.kv_indptr.assign(1, 0);
  l.kv_indices.clear();
  l.kv_last_page_len.clear();
}

}  // namespace

void find_shared_prefixes(std::span<const int32_t> kv_indptr, std::span<const int32_t> kv_indices,
                          std::span<const int32_t> kv_last_page_len, int32_t page_size,
                          std::span<const int32_t> qo_indptr, const SharedPrefixOptions& opt, SharedPrefixSplit& out) {
  const auto t0 = std::chrono::steady_clock::now();
  if (opt.min_shared_pages < 1)
    throw InvalidArgument("min_shared_pages: expected >= 1, got " + str(opt.min_shared_pages));
  if (opt.min_saved_pages < 0) throw InvalidArgument("min_saved_pages: expected >= 0, got " + str(opt.min_saved_pages));
  if (opt.min_members < 2) throw InvalidArgument("min_members: expected >= 2, got " + str(opt.min_members));
  if (kv_indptr.empty()) throw InvalidArgument("kv_indptr: expected requests + 1 >= 1 entries, got 0");
  Scratch& s = scratch();
  // The checks a plan() makes (the message names indptr / indices /
  // last_page_len as plan()'s do); each request's KV length into kv_lens.
  (void)check_page_table(kv_indptr, kv_indices, kv_last_page_len, page_size, s.kv_lens);
  const int64_t n = static_cast<int64_t>(kv_indptr.size()) - 1;
  const bool has_qo = !qo_indptr.empty();
  if (has_qo) {
    if (qo_indptr.size() != kv_indptr.size())
      throw InvalidArgument("qo_indptr: expected " + str(static_cast<int64_t>(kv_indptr.size())) +
                            " entries (like kv_indptr), got " + str(static_cast<int64_t>(qo_indptr.size())));
    validate_indptr("qo_indptr", qo_indptr);
  }
  if (n > INT32_MAX) throw InvalidArgument("kv_indptr: expected at most 2^31 - 1 requests");
  auto q_len = [&](int64_t r) -> int32_t { return has_qo ? qo_indptr[r + 1] - qo_indptr[r] : 1; };

  // Candidates: requests with queries and enough full pages, keyed by their
  // first page id (ids are >= 0, checked above) and then their index, so a
  // sort puts each group together with its members in request order. With
  // keep_order the key is the run of adjacent candidates with one first id
  // instead, numbered in request order (the keys are then already sorted).
  s.keys.clear();
  uint32_t run = 0;
  int64_t prev = -1;  // the previous request, when it was a candidate
  s.group_of.assign(static_cast<size_t>(n), -1);
  // kv_lens becomes, in place, each request's shareable (full) pages.
  std::vector<int32_t>& full = s.kv_lens;
  for (int64_t r = 0; r < n; ++r) {
    const int64_t kv_len = s.kv_lens[r];
    const int32_t pages = kv_indptr[r + 1] - kv_indptr[r];
    int64_t f = pages - (pages > 0 && kv_last_page_len[r] < page_size ? 1 : 0);
    if (opt.causal) {  // every shared key must precede the request's first query
      const int64_t room = kv_len - q_len(r);
      f = room < 0 ? 0 : std::min<int64_t>(f, room / page_size);
    }
    full[r] = static_cast<int32_t>(f);
    if (q_len(r) > 0 && f >= opt.min_shared_pages) {
      uint32_t key = static_cast<uint32_t>(kv_indices[kv_indptr[r]]);
      if (opt.keep_order) {
        if (prev < 0 || kv_indices[kv_indptr[prev]] != kv_indices[kv_indptr[r]]) ++run;
        key = run;
        prev = r;
      }
      s.keys.push_back(static_cast<uint64_t>(key) << 32 | static_cast<uint32_t>(r));
    } else {
      prev = -1;
    }
  }
  std::sort(s.keys.begin(), s.keys.end());

  // Groups: runs of one first id with >= 2 members; their shared pages are
  // the longest common run of ids from position 0 within every member's
  // full pages (the same id at another position is another token range).
  s.found.clear();
  int64_t saved = 0;
  for (size_t i = 0; i < s.keys.size();) {
    size_t j = i + 1;
    while (j < s.keys.size() && first_page_of(s.keys[j]) == first_page_of(s.keys[i])) ++j;
    if (j - i >= static_cast<size_t>(opt.min_members)) {
      const uint32_t r0 = request_of(s.keys[i]);
      int32_t shared = full[r0];
      for (size_t k = i + 1; k < j; ++k) shared = std::min(shared, full[request_of(s.keys[k])]);
      const int32_t* base = kv_indices.data() + kv_indptr[r0];
      for (size_t k = i + 1; k < j && shared >= opt.min_shared_pages; ++k) {
        const int32_t* other = kv_indices.data() + kv_indptr[request_of(s.keys[k])];
        shared = static_cast<int32_t>(std::mismatch(base, base + shared, other).first - base);
      }
      if (shared >= opt.min_shared_pages) {
        for (size_t k = i; k < j; ++k) s.group_of[request_of(s.keys[k])] = static_cast<int32_t>(s.found.size());
        s.found.push_back({i, j, shared});
        saved += static_cast<int64_t>(shared) * static_cast<int64_t>(j - i - 1);
      }
    }
    i = j;
  }

  out.groups.clear();
  out.order.clear();
  out.row_order.clear();
  out.identity_order = true;
  out.saved_pages = saved;
  const bool worth = !s.found.empty() && saved >= opt.min_saved_pages;
  out.split = opt.always_levels || worth;
  out.grouped = worth;
  reset_level(out.shared);
  reset_level(out.unique);
  // The groups in the order of their first member, also when the levels do not hold them.
  if (!worth) {
    for (int64_t r = 0; r < n; ++r) {
      const int32_t g = s.group_of[r];
      if (g >= 0 && request_of(s.keys[s.found[g].begin]) == r)
        out.groups.push_back({-1, static_cast<int32_t>(s.found[g].end - s.found[g].begin), s.found[g].shared_pages});
    }
    if (!out.split) {
      out.host_us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
      return;
    }
  }

  // The levels, walking the requests in order: a group is emitted whole at
  // its first member (its members adjacent), other requests where they are.
  // Level 1 takes each request's pages after its group's shared ones; level
  // 0 one entry per group, and one entry without pages per run of requests
  // in no group (fewer, larger empty entries than one per request).
  PrefixLevel& sh = out.shared;
  PrefixLevel& un = out.unique;
  out.order.reserve(static_cast<size_t>(n));
  un.kv_indices.reserve(kv_indices.size());
  int32_t rows = 0;
  bool open_empty = false;  // the last level-0 entry is a run without pages
  auto emit_unique = [&](int32_t r, int32_t skip) {
    out.order.push_back(r);
    rows += q_len(r);
    un.qo_indptr.push_back(rows);
    const int32_t* p = kv_indices.data() + kv_indptr[r];
    un.kv_indices.insert(un.kv_indices.end(), p + skip, kv_indices.data() + kv_indptr[r + 1]);
    un.kv_indptr.push_back(static_cast<int32_t>(un.kv_indices.size()));
    un.kv_last_page_len.push_back(kv_indptr[r + 1] - kv_indptr[r] > skip ? kv_last_page_len[r] : 0);
  };
  for (int64_t r = 0; r < n; ++r) {
    const int32_t g = worth ? s.group_of[r] : -1;  // always_levels without a saving worth it: no groups
    if (g < 0) {
      emit_unique(static_cast<int32_t>(r), 0);
      if (open_empty) {
        sh.qo_indptr.back() = rows;
      } else {
        sh.qo_indptr.push_back(rows);
        sh.kv_indptr.push_back(sh.kv_indptr.back());
        sh.kv_last_page_len.push_back(0);
        open_empty = true;
      }
      continue;
    }
    const Found& f = s.found[g];
    if (request_of(s.keys[f.begin]) != r) continue;  // emitted with its group's first member
    out.groups.push_back({static_cast<int32_t>(out.order.size()), static_cast<int32_t>(f.end - f.begin),
                          f.shared_pages});
    for (size_t k = f.begin; k < f.end; ++k) emit_unique(static_cast<int32_t>(request_of(s.keys[k])), f.shared_pages);
    const int32_t* p = kv_indices.data() + kv_indptr[r];
    sh.kv_indices.insert(sh.kv_indices.end(), p, p + f.shared_pages);
    sh.qo_indptr.push_back(rows);
    sh.kv_indptr.push_back(static_cast<int32_t>(sh.kv_indices.size()));
    sh.kv_last_page_len.push_back(page_size);  // shared pages are full
    open_empty = false;
  }
  for (int64_t k = 0; k < n && out.identity_order; ++k) out.identity_order = out.order[k] == k;
  if (!out.identity_order) {
    out.row_order.reserve(static_cast<size_t>(rows));
    for (const int32_t r : out.order) {
      const int32_t begin = has_qo ? qo_indptr[r] : r;
      for (int32_t i = 0; i < q_len(r); ++i) out.row_order.push_back(begin + i);
    }
  }
  out.host_us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
}

SharedPrefixSplit find_shared_prefixes(std::span<const int32_t> kv_indptr, std::span<const int32_t> kv_indices,
                                       std::span<const int32_t> kv_last_page_len, int32_t page_size,
                                       std::span<const int32_t> qo_indptr, const SharedPrefixOptions& opt) {
  SharedPrefixSplit out;
  find_shared_prefixes(kv_indptr, kv_indices, kv_last_page_len, page_size, qo_indptr, opt, out);
  return out;
}

}  // namespace tessera
