// find_shared_prefixes (formats/shared_prefix.hpp) and cascade_levels: the
// two levels, expanded back to per-request key lists, must give every
// request exactly its keys of the flat table, in order (shared first), each
// once; hand-made tables pin the rule (full pages only, position 0, groups
// by first page, causal cut); random tables with forks at and inside page
// boundaries, several groups and reused ids check the same on thousands of
// cases; the host time of a 256 x 4k-token step is printed.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <random>
#include <utility>
#include <vector>

#include "tessera/api/cascade.hpp"
#include "tessera/formats/paged_kv.hpp"
#include "tessera/formats/shared_prefix.hpp"
#include "tessera/runtime/cuda.hpp"
#include "fake_workspace.hpp"
#include "test_util.hpp"

using namespace tessera;
using namespace tessera::test;

namespace {

struct Table {
  std::vector<int32_t> indptr{0}, indices, last, qo;  // qo empty: decode (one row per request)
  int32_t page_size = 16;

  // A request of these pages holding `tokens` tokens, with q query rows.
  void add(std::vector<int32_t> pages, int32_t tokens, int32_t q = 1) {
    indices.insert(indices.end(), pages.begin(), pages.end());
    indptr.push_back(static_cast<int32_t>(indices.size()));
    last.push_back(pages.empty() ? 0 : tokens - (static_cast<int32_t>(pages.size()) - 1) * page_size);
    if (qo.empty()) qo.push_back(0);
    qo.push_back(qo.back() + q);
  }
  int64_t requests() const { return static_cast<int64_t>(indptr.size()) - 1; }
  SharedPrefixSplit find(const SharedPrefixOptions& opt = {}, bool decode = false) const {
    return find_shared_prefixes(indptr, indices, last, page_size, decode ? std::span<const int32_t>() : qo, opt);
  }
};

using Keys = std::vector<std::pair<int32_t, int32_t>>;  // (page id, slot) of each key, in order

// Keys of entry e of a level (or a table): its pages, the last one cut to its length.
Keys entry_keys(std::span<const int32_t> indptr, std::span<const int32_t> indices, std::span<const int32_t> last,
                int32_t page_size, int64_t e) {
  Keys k;
  for (int32_t p = indptr[e]; p < indptr[e + 1]; ++p) {
    const int32_t n = p + 1 == indptr[e + 1] ? last[e] : page_size;
    for (int32_t s = 0; s < n; ++s) k.emplace_back(indices[p], s);
  }
  return k;
}

// The entry of a level whose query rows hold rows [a, b) (all of them: a
// request's rows must not straddle two entries); -1 when none does.
int64_t entry_of(std::span<const int32_t> qo, int32_t a, int32_t b) {
  const auto it = std::upper_bound(qo.begin(), qo.end(), a);
  if (it == qo.begin() || it == qo.end()) return -1;
  const int64_t e = (it - qo.begin()) - 1;
  return qo[e + 1] >= b ? e : -1;
}

// Every check of a split against its table: the levels are valid page
// tables of full shared pages, every request's rows sit in one entry of each
// level, and shared + unique keys are exactly the request's flat keys.
void check_split(const Table& t, const SharedPrefixSplit& sp, bool decode, bool causal) {
  const int64_t n = t.requests();
  auto q_len = [&](int64_t r) { return decode ? 1 : t.qo[r + 1] - t.qo[r]; };
  auto q_begin = [&](int64_t r) { return decode ? static_cast<int32_t>(r) : t.qo[r]; };
  ASSERT_TRUE(sp.split);
  ASSERT_EQ(static_cast<int64_t>(sp.order.size()), n);
  std::vector<int32_t> seen(static_cast<size_t>(n), 0);
  for (const int32_t r : sp.order) {
    ASSERT_GE(r, 0);
    ASSERT_LT(r, n);
    ++seen[r];
  }
  EXPECT_TRUE(std::all_of(seen.begin(), seen.end(), [](int32_t c) { return c == 1; })) << "order is a permutation";
  bool identity = true;
  for (int64_t k = 0; k < n; ++k) identity = identity && sp.order[k] == k;
  EXPECT_EQ(sp.identity_order, identity);
  const int32_t total = decode ? static_cast<int32_t>(n) : t.qo.back();
  for (const PrefixLevel* l : {&sp.shared, &sp.unique}) {
    std::vector<int32_t> lens;
    ASSERT_NO_THROW(check_page_table(l->kv_indptr, l->kv_indices, l->kv_last_page_len, t.page_size, lens));
    ASSERT_EQ(l->qo_indptr.size(), l->kv_indptr.size());
    EXPECT_EQ(l->qo_indptr.back(), total);
  }
  EXPECT_EQ(sp.unique.qo_indptr.size(), static_cast<size_t>(n + 1));
  for (size_t e = 0; e + 1 < sp.shared.kv_indptr.size(); ++e)
    if (sp.shared.kv_indptr[e + 1] > sp.shared.kv_indptr[e]) EXPECT_EQ(sp.shared.kv_last_page_len[e], t.page_size);
  // Rows: level row i is the caller's row row_order[i] (identity when empty).
  if (sp.identity_order) EXPECT_TRUE(sp.row_order.empty());
  else ASSERT_EQ(static_cast<int32_t>(sp.row_order.size()), total);
  int32_t row = 0;
  int64_t saved = 0;
  for (int64_t k = 0; k < n; ++k) {
    const int32_t r = sp.order[k], q = q_len(r);
    for (int32_t i = 0; i < q && !sp.identity_order; ++i) ASSERT_EQ(sp.row_order[row + i], q_begin(r) + i);
    const int64_t e1 = k;  // level 1: one entry per request, in order
    ASSERT_EQ(sp.unique.qo_indptr[e1], row);
    ASSERT_EQ(sp.unique.qo_indptr[e1 + 1], row + q);
    Keys got;
    if (q > 0) {
      const int64_t e0 = entry_of(sp.shared.qo_indptr, row, row + q);
      ASSERT_GE(e0, 0) << "request " << r << " straddles level-0 entries";
      got = entry_keys(sp.shared.kv_indptr, sp.shared.kv_indices, sp.shared.kv_last_page_len, t.page_size, e0);
    }
    const Keys shared_keys = got;
    const Keys own = entry_keys(sp.unique.kv_indptr, sp.unique.kv_indices, sp.unique.kv_last_page_len, t.page_size, e1);
    got.insert(got.end(), own.begin(), own.end());
    EXPECT_EQ(got, entry_keys(t.indptr, t.indices, t.last, t.page_size, r)) << "request " << r;
    const int64_t kv_len = static_cast<int64_t>(got.size());
    if (causal && !shared_keys.empty())  // the shared level has no mask: its keys precede every query
      EXPECT_LE(static_cast<int64_t>(shared_keys.size()), kv_len - q) << "request " << r;
    row += q;
  }
  for (const SharedPrefixGroup& g : sp.groups) {
    ASSERT_GE(g.size, 2);
    saved += static_cast<int64_t>(g.shared_pages) * (g.size - 1);
    if (!sp.grouped) {  // listed, not in the levels
      EXPECT_EQ(g.first, -1);
      continue;
    }
    // A group's members are adjacent and share its level-0 entry.
    const int32_t r0 = sp.order[g.first];
    for (int32_t m = 1; m < g.size; ++m) {
      const int32_t r = sp.order[g.first + m];
      for (int32_t p = 0; p < g.shared_pages; ++p) EXPECT_EQ(t.indices[t.indptr[r] + p], t.indices[t.indptr[r0] + p]);
    }
  }
  EXPECT_EQ(saved, sp.saved_pages);
}

// The group (index in sp.groups) of each request, -1 for none.
std::vector<int32_t> group_of(const SharedPrefixSplit& sp, int64_t n) {
  std::vector<int32_t> g(static_cast<size_t>(n), -1);
  for (size_t i = 0; i < sp.groups.size(); ++i)
    for (int32_t m = 0; m < sp.groups[i].size; ++m) g[sp.order[sp.groups[i].first + m]] = static_cast<int32_t>(i);
  return g;
}

}  // namespace

TEST(SharedPrefix, NoSharing) {
  Table t;
  t.add({0, 1}, 20);
  t.add({2, 3, 4}, 48);
  t.add({}, 0);
  const auto sp = t.find();
  EXPECT_FALSE(sp.split);
  EXPECT_TRUE(sp.groups.empty());
  EXPECT_EQ(sp.saved_pages, 0);
  EXPECT_TRUE(sp.order.empty());
  EXPECT_THROW_MSG(cascade_levels(sp), InvalidArgument, "split");
}

TEST(SharedPrefix, ForkAtAPageBoundary) {
  Table t;
  t.add({0, 1, 2, 3}, 60);
  t.add({0, 1, 4, 5}, 50);
  t.add({6, 7}, 17);
  const auto sp = t.find();
  ASSERT_EQ(sp.groups.size(), 1u);
  EXPECT_EQ(sp.groups[0].shared_pages, 2);
  EXPECT_EQ(sp.groups[0].size, 2);
  EXPECT_TRUE(sp.identity_order);
  EXPECT_EQ(sp.shared.qo_indptr, (std::vector<int32_t>{0, 2, 3}));
  EXPECT_EQ(sp.shared.kv_indices, (std::vector<int32_t>{0, 1}));
  EXPECT_EQ(sp.shared.kv_last_page_len, (std::vector<int32_t>{16, 0}));
  EXPECT_EQ(sp.unique.kv_indices, (std::vector<int32_t>{2, 3, 4, 5, 6, 7}));
  EXPECT_EQ(sp.unique.kv_last_page_len, (std::vector<int32_t>{12, 2, 1}));
  check_split(t, sp, false, false);
  const auto levels = cascade_levels(sp);
  EXPECT_EQ(levels[0].kv_indices.size(), 2u);
  EXPECT_EQ(levels[1].qo_indptr.back(), 3);
}

// A fork inside page 2: both list page 2, but request 0 holds only its first
// 5 tokens (its last page), so page 2 is not shared.
TEST(SharedPrefix, ForkMidPageSharesOnlyFullPages) {
  Table t;
  t.add({0, 1, 2}, 37);
  t.add({0, 1, 2, 3}, 55);
  const auto sp = t.find();
  ASSERT_EQ(sp.groups.size(), 1u);
  EXPECT_EQ(sp.groups[0].shared_pages, 2);
  EXPECT_EQ(sp.unique.kv_indices, (std::vector<int32_t>{2, 2, 3}));
  EXPECT_EQ(sp.unique.kv_last_page_len, (std::vector<int32_t>{5, 7}));
  check_split(t, sp, false, false);
}

// A request whose pages are all shared (its last page full) attends to them
// at level 0 only: no pages at level 1.
TEST(SharedPrefix, RequestInsideTheSharedPrefix) {
  Table t;
  t.add({4, 5}, 32);
  t.add({4, 5, 6}, 35);
  t.add({4, 5}, 32, 3);
  const auto sp = t.find();
  ASSERT_EQ(sp.groups.size(), 1u);
  EXPECT_EQ(sp.groups[0].shared_pages, 2);
  EXPECT_EQ(sp.groups[0].size, 3);
  EXPECT_EQ(sp.unique.kv_indptr, (std::vector<int32_t>{0, 0, 1, 1}));
  EXPECT_EQ(sp.unique.kv_last_page_len, (std::vector<int32_t>{0, 3, 0}));
  check_split(t, sp, false, false);
  // The same request ending one token short of a full page: that page is its own.
  Table u;
  u.add({4, 5}, 31);
  u.add({4, 5, 6}, 35);
  const auto su = u.find();
  ASSERT_EQ(su.groups.size(), 1u);
  EXPECT_EQ(su.groups[0].shared_pages, 1);
  check_split(u, su, false, false);
}

// The same id at another position is another token range: only identical
// ids at identical positions from position 0 are shared.
TEST(SharedPrefix, ReusedIdsElsewhereAreNotShared) {
  Table t;
  t.add({5, 6, 7}, 48);
  t.add({9, 5, 6}, 48);
  t.add({7, 6, 5}, 48);
  EXPECT_FALSE(t.find().split);
  EXPECT_TRUE(t.find().groups.empty());
  Table u;
  u.add({5, 6, 7, 8}, 64);
  u.add({5, 7, 6, 8}, 64);
  const auto su = u.find();
  ASSERT_EQ(su.groups.size(), 1u);
  EXPECT_EQ(su.groups[0].shared_pages, 1);
  check_split(u, su, false, false);
}

// Groups by first page, anywhere in the batch: members are made adjacent at
// their first member's place, and the rows follow (row_order).
TEST(SharedPrefix, SeveralGroupsInterleaved) {
  Table t;
  t.add({0, 1, 2}, 40, 2);     // A: group 0
  t.add({10, 11, 12}, 48, 1);  // C: group 1
  t.add({20}, 3, 4);           // F: none
  t.add({0, 1, 3}, 33, 1);     // B: group 0
  t.add({10, 11, 13}, 40, 3);  // D: group 1
  t.add({10, 11}, 32, 2);      // E: group 1, all shared
  const auto sp = t.find();
  ASSERT_EQ(sp.groups.size(), 2u);
  EXPECT_EQ(sp.order, (std::vector<int32_t>{0, 3, 1, 4, 5, 2}));
  EXPECT_FALSE(sp.identity_order);
  EXPECT_EQ(sp.groups[0].first, 0);
  EXPECT_EQ(sp.groups[0].size, 2);
  EXPECT_EQ(sp.groups[0].shared_pages, 2);
  EXPECT_EQ(sp.groups[1].first, 2);
  EXPECT_EQ(sp.groups[1].size, 3);
  EXPECT_EQ(sp.groups[1].shared_pages, 2);
  EXPECT_EQ(sp.saved_pages, 2 + 4);
  // Rows: A 0-1, C 2, F 3-6, B 7, D 8-10, E 11-12.
  EXPECT_EQ(sp.row_order, (std::vector<int32_t>{0, 1, 7, 2, 8, 9, 10, 11, 12, 3, 4, 5, 6}));
  EXPECT_EQ(sp.shared.qo_indptr, (std::vector<int32_t>{0, 3, 9, 13}));
  check_split(t, sp, false, false);
  check_split(t, t.find({}, true), true, false);  // decode: one row per request
}

TEST(SharedPrefix, Thresholds) {
  Table t;
  t.add({0, 1, 2}, 48);
  t.add({0, 5, 6}, 48);
  t.add({7, 8, 9}, 48);
  t.add({7, 8, 9}, 48);
  SharedPrefixOptions opt;
  opt.min_shared_pages = 2;  // the group of page 0 shares one page: no group
  auto sp = t.find(opt);
  ASSERT_EQ(sp.groups.size(), 1u);
  EXPECT_EQ(sp.groups[0].shared_pages, 3);
  check_split(t, sp, false, false);
  opt.min_saved_pages = 4;  // 3 pages saved: found, not split
  sp = t.find(opt);
  EXPECT_FALSE(sp.split);
  ASSERT_EQ(sp.groups.size(), 1u);
  EXPECT_EQ(sp.groups[0].first, -1);
  EXPECT_EQ(sp.saved_pages, 3);
  EXPECT_TRUE(sp.order.empty());
  opt.min_saved_pages = 3;
  EXPECT_TRUE(t.find(opt).split);
}

// keep_order: groups are runs of adjacent requests, so the levels keep the
// caller's rows (no gather / scatter for a captured graph to replay).
TEST(SharedPrefix, KeepOrderGroupsAdjacentRuns) {
  Table t;
  t.add({0, 1, 2}, 40, 2);     // A: run 1
  t.add({0, 1, 3}, 33, 1);     // B: run 1
  t.add({10, 11, 12}, 48, 1);  // C: run 2
  t.add({0, 1, 4}, 40, 1);     // D: first page 0 again, alone: no group
  t.add({10, 11, 13}, 40, 3);  // E: run 3
  t.add({10, 11}, 32, 2);      // F: run 3, all shared
  t.add({20}, 3, 4);           // G: none
  SharedPrefixOptions opt;
  opt.keep_order = true;
  for (const bool decode : {false, true}) {
    const auto sp = t.find(opt, decode);
    ASSERT_TRUE(sp.split);
    EXPECT_TRUE(sp.identity_order);
    EXPECT_TRUE(sp.row_order.empty());
    ASSERT_EQ(sp.groups.size(), 2u);
    EXPECT_EQ(sp.groups[0].first, 0);
    EXPECT_EQ(sp.groups[0].size, 2);
    EXPECT_EQ(sp.groups[0].shared_pages, 2);
    EXPECT_EQ(sp.groups[1].first, 4);
    EXPECT_EQ(sp.groups[1].size, 2);
    EXPECT_EQ(sp.groups[1].shared_pages, 2);
    EXPECT_EQ(sp.saved_pages, 4);
    check_split(t, sp, decode, false);
  }
  // A request without full pages between two sharers breaks their run.
  Table u;
  u.add({0, 1}, 32);
  u.add({5}, 3);
  u.add({0, 1}, 32);
  EXPECT_FALSE(u.find(opt, true).split);
  EXPECT_TRUE(u.find({}, true).split);  // without keep_order they are one group
}

// always_levels: levels on every call, also without any sharing.
TEST(SharedPrefix, AlwaysLevels) {
  Table t;
  t.add({0, 1, 2}, 40, 2);
  t.add({3, 4}, 20, 1);
  t.add({}, 0, 1);
  SharedPrefixOptions opt;
  opt.always_levels = true;
  opt.keep_order = true;
  for (const bool decode : {false, true}) {
    const auto sp = t.find(opt, decode);
    EXPECT_TRUE(sp.groups.empty());
    ASSERT_TRUE(sp.split);
    EXPECT_TRUE(sp.identity_order);
    EXPECT_EQ(sp.shared.kv_indptr, (std::vector<int32_t>{0, 0}));  // one entry without pages
    check_split(t, sp, decode, false);
  }
  // Groups below min_saved_pages are listed, not used: the levels hold every request whole.
  Table s;
  s.add({0, 1}, 32);
  s.add({0, 1}, 30);
  s.add({0, 1, 2}, 40);
  opt.min_saved_pages = 100;
  auto sp = s.find(opt, true);
  ASSERT_TRUE(sp.split);
  EXPECT_FALSE(sp.grouped);
  ASSERT_EQ(sp.groups.size(), 1u);
  EXPECT_EQ(sp.groups[0].first, -1);
  EXPECT_EQ(sp.groups[0].size, 3);
  EXPECT_EQ(sp.shared.kv_indptr, (std::vector<int32_t>{0, 0}));
  check_split(s, sp, true, false);
  opt.min_saved_pages = 2;
  sp = s.find(opt, true);
  ASSERT_TRUE(sp.grouped);
  EXPECT_EQ(sp.groups[0].first, 0);
  check_split(s, sp, true, false);
  // min_members: the three requests form no group of four.
  opt.min_members = 4;
  sp = s.find(opt, true);
  EXPECT_FALSE(sp.grouped);
  EXPECT_TRUE(sp.groups.empty());
  check_split(s, sp, true, false);
  opt.min_members = 1;
  EXPECT_THROW_MSG(s.find(opt, true), InvalidArgument, "min_members");
}

// Causal prefill: a member shares at most floor((kv_len - q_len) / page_size)
// pages, so the shared keys precede each of its queries.
TEST(SharedPrefix, CausalCutsToKeysBeforeTheQueries) {
  Table t;
  t.add({0, 1, 2, 3}, 64, 20);  // room 44: 2 pages
  t.add({0, 1, 2, 4}, 64, 1);   // room 63: 3 pages
  t.add({0, 1, 2, 5}, 50, 50);  // room 0: none
  SharedPrefixOptions opt;
  auto sp = t.find(opt);
  ASSERT_EQ(sp.groups.size(), 1u);
  EXPECT_EQ(sp.groups[0].shared_pages, 3);
  EXPECT_EQ(sp.groups[0].size, 3);
  opt.causal = true;
  sp = t.find(opt);
  ASSERT_EQ(sp.groups.size(), 1u);
  EXPECT_EQ(sp.groups[0].shared_pages, 2);
  EXPECT_EQ(sp.groups[0].size, 2);
  check_split(t, sp, false, true);
}

TEST(SharedPrefix, RequestsWithoutQueriesJoinNoGroup) {
  Table t;
  t.add({0, 1}, 32, 0);
  t.add({0, 1}, 32, 2);
  EXPECT_FALSE(t.find().split);
  t.add({0, 1, 2}, 40, 1);
  const auto sp = t.find();
  ASSERT_EQ(sp.groups.size(), 1u);
  EXPECT_EQ(sp.groups[0].size, 2);
  check_split(t, sp, false, false);
}

// The levels pass every check of CascadeAttention::plan (run before any GPU
// work: without a GPU, plan() stops only at the GPU itself).
TEST(SharedPrefix, LevelsPassTheCascadeChecks) {
  if (cuda::gpu_available()) GTEST_SKIP() << "plans on a host buffer only without a GPU (the GPU tests plan for real)";
  Table t;
  t.add({0, 1, 2}, 40, 2);
  t.add({10, 11, 12}, 48, 1);
  t.add({0, 1, 3}, 33, 3);
  t.add({10, 11}, 32, 2);
  SharedPrefixOptions opt;
  opt.causal = true;
  const auto sp = t.find(opt);
  ASSERT_TRUE(sp.split);
  TaskInfo task{8, 2, 16, KVLayout::kNHD, 8, 64};
  task.max_total_q = 16;
  const std::vector<AttentionSpec> specs = {
      AttentionSpec{}, AttentionSpec{variants::causal(), DType::kFloat16, DType::kFloat16, DType::kFloat16, 128}};
  const auto sizes = CascadeAttention::workspace_size(specs, task, 1);
  HostWorkspace h(sizes.device_bytes, sizes.host_bytes);
  CascadeAttention cascade(specs, task, h.ws);
  const auto levels = cascade_levels(sp);
  EXPECT_THROW_MSG(cascade.plan(levels), CudaError, "CascadeAttention::plan");
}

TEST(SharedPrefix, ArgumentErrors) {
  Table t;
  t.add({0, 1}, 20);
  t.add({0, 1}, 20);
  auto find = [&](std::vector<int32_t> indptr, std::vector<int32_t> indices, std::vector<int32_t> last, int32_t ps,
                  std::vector<int32_t> qo, SharedPrefixOptions opt = {}) {
    return find_shared_prefixes(indptr, indices, last, ps, qo, opt);
  };
  EXPECT_THROW_MSG(find({}, {}, {}, 16, {}), InvalidArgument, "kv_indptr");
  EXPECT_THROW_MSG(find(t.indptr, t.indices, t.last, 0, {}), InvalidArgument, "page_size");
  EXPECT_THROW_MSG(find(t.indptr, {0, 1, -1, 1}, t.last, 16, {}), InvalidArgument, "indices");
  EXPECT_THROW_MSG(find(t.indptr, {0, 1, 0}, t.last, 16, {}), InvalidArgument, "indices");
  EXPECT_THROW_MSG(find(t.indptr, t.indices, {4, 17}, 16, {}), InvalidArgument, "last_page_len");
  EXPECT_THROW_MSG(find(t.indptr, t.indices, t.last, 16, {0, 1}), InvalidArgument, "qo_indptr");
  EXPECT_THROW_MSG(find(t.indptr, t.indices, t.last, 16, {0, 2, 1}), InvalidArgument, "qo_indptr");
  SharedPrefixOptions bad;
  bad.min_shared_pages = 0;
  EXPECT_THROW_MSG(find(t.indptr, t.indices, t.last, 16, {}, bad), InvalidArgument, "min_shared_pages");
  bad = {};
  bad.min_saved_pages = -1;
  EXPECT_THROW_MSG(find(t.indptr, t.indices, t.last, 16, {}, bad), InvalidArgument, "min_saved_pages");
}

namespace {

// A random step: a few prompts (page id runs); each request continues one
// of them (or none) for a random number of tokens, forking at a page
// boundary, inside a page (copy-on-write: the partial page gets a new id),
// or ending inside a prompt page; then its own pages. Some own pages reuse
// ids of other requests' later pages (an id at another position).
Table random_table(std::mt19937& gen, int32_t page_size, bool with_queries) {
  auto uni = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(gen); };
  Table t;
  t.page_size = page_size;
  int32_t next_id = 0;
  const int prompts = uni(1, 4), requests = uni(1, 24);
  std::vector<std::vector<int32_t>> prompt(prompts);
  for (auto& p : prompt)
    for (int i = uni(1, 8); i > 0; --i) p.push_back(next_id++);
  std::vector<int32_t> recent;  // ids other requests own, for reuse at other positions
  for (int r = 0; r < requests; ++r) {
    std::vector<int32_t> pages;
    int32_t tokens = 0;
    bool ends_in_prompt = false;  // its last page is a prompt page it fills only partly
    const int which = uni(-1, prompts - 1);
    if (which >= 0) {
      const auto& p = prompt[which];
      tokens = uni(0, static_cast<int>(p.size()) * page_size);
      const int32_t whole = tokens / page_size, part = tokens % page_size;
      pages.assign(p.begin(), p.begin() + whole);
      if (part > 0) {  // ends inside the prompt's page, or continues on a copy of it
        ends_in_prompt = uni(0, 2) == 0;
        pages.push_back(ends_in_prompt ? p[whole] : next_id++);
      }
    }
    const int32_t own = ends_in_prompt ? 0 : uni(0, 3 * page_size);
    if (own > 0) {
      int32_t room = tokens % page_size ? page_size - tokens % page_size : 0;  // the copied partial page
      int32_t left = own - std::min(own, room);
      tokens += own;
      while (left > 0) {
        const bool reuse = !recent.empty() && uni(0, 5) == 0;
        pages.push_back(reuse ? recent[uni(0, static_cast<int>(recent.size()) - 1)] : next_id++);
        left -= std::min(left, page_size);
      }
    }
    if (pages.empty()) tokens = 0;
    for (size_t i = 1; i < pages.size(); ++i) recent.push_back(pages[i]);
    t.add(pages, tokens, with_queries ? uni(0, 2) == 0 ? 0 : uni(1, 40) : 1);
  }
  return t;
}

}  // namespace

TEST(SharedPrefix, RandomTablesRecomposeExactly) {
  std::mt19937 gen(20240607);
  int splits = 0, interleaved = 0;
  for (int it = 0; it < 3000; ++it) {
    const int32_t page_size = std::vector<int32_t>{1, 4, 16}[it % 3];
    const bool decode = it % 4 == 0, causal = !decode && it % 2 == 1;
    const Table t = random_table(gen, page_size, !decode);
    SharedPrefixOptions opt;
    opt.causal = causal;
    const auto sp = t.find(opt, decode);
    SCOPED_TRACE("case " + std::to_string(it));
    {  // keep_order: the same keys, in the caller's order
      SharedPrefixOptions kept = opt;
      kept.keep_order = kept.always_levels = true;
      const auto ko = t.find(kept, decode);
      EXPECT_TRUE(ko.identity_order);
      check_split(t, ko, decode, causal);
    }
    // Deterministic, also when the output's buffers are reused.
    SharedPrefixSplit again = t.find(opt, decode);
    find_shared_prefixes(t.indptr, t.indices, t.last, page_size, decode ? std::span<const int32_t>() : t.qo, opt,
                         again);
    EXPECT_EQ(again.order, sp.order);
    EXPECT_EQ(again.shared.kv_indices, sp.shared.kv_indices);
    EXPECT_EQ(again.unique.kv_indices, sp.unique.kv_indices);
    EXPECT_EQ(again.row_order, sp.row_order);
    if (!sp.split) {
      EXPECT_TRUE(sp.groups.empty());  // min_saved_pages 1: any group splits
      continue;
    }
    ++splits;
    interleaved += sp.identity_order ? 0 : 1;
    check_split(t, sp, decode, causal);
    // Nothing missed: two requests with queries whose first pages are the
    // same full (and, causal, early enough) page are in one group.
    const auto g = group_of(sp, t.requests());
    auto shareable = [&](int64_t r) {
      const int32_t pages = t.indptr[r + 1] - t.indptr[r];
      const int32_t q = decode ? 1 : t.qo[r + 1] - t.qo[r];
      const int64_t kv = pages ? int64_t{pages - 1} * page_size + t.last[r] : 0;
      const bool full_first = pages > 1 || (pages == 1 && t.last[r] == page_size);
      return q > 0 && full_first && (!causal || kv - q >= page_size);
    };
    for (int64_t a = 0; a < t.requests(); ++a)
      for (int64_t b = a + 1; b < t.requests(); ++b)
        if (shareable(a) && shareable(b) && t.indices[t.indptr[a]] == t.indices[t.indptr[b]]) {
          EXPECT_GE(g[a], 0) << a << " and " << b;
          EXPECT_EQ(g[a], g[b]) << a << " and " << b;
        }
  }
  EXPECT_GT(splits, 500);  // the generator shares often, and interleaves groups
  EXPECT_GT(interleaved, 100);
}

// Host time of one step: 256 requests x 4096 tokens (page 16: 65536 ids),
// 32 prompts of 2048 tokens shared by 8 requests each, and the same batch
// without sharing.
TEST(SharedPrefix, HostTime256Requests4kTokens) {
  constexpr int kRequests = 256, kPages = 4096 / 16, kShared = 2048 / 16;
  Table shared, flat;
  int32_t next = 0;
  std::vector<int32_t> prompt;
  for (int r = 0; r < kRequests; ++r) {
    if (r % 8 == 0) {
      prompt.clear();
      for (int p = 0; p < kShared; ++p) prompt.push_back(next++);
    }
    std::vector<int32_t> pages = prompt, own;
    for (int p = kShared; p < kPages; ++p) pages.push_back(next++);
    for (int p = 0; p < kPages; ++p) own.push_back(next++);
    shared.add(pages, kPages * 16 - 7);
    flat.add(own, kPages * 16 - 7);
  }
  auto time_us = [](const Table& t, SharedPrefixSplit& out) {
    std::vector<double> us;
    for (int i = 0; i < 51; ++i) {
      find_shared_prefixes(t.indptr, t.indices, t.last, t.page_size, {}, {}, out);
      us.push_back(out.host_us);
    }
    std::sort(us.begin(), us.end());
    return us[us.size() / 2];
  };
  SharedPrefixSplit out;
  const double with = time_us(shared, out);
  ASSERT_TRUE(out.split);
  EXPECT_EQ(out.groups.size(), 32u);
  EXPECT_EQ(out.saved_pages, 32 * 7 * kShared);
  const double without = time_us(flat, out);
  EXPECT_FALSE(out.split);
  std::printf("find_shared_prefixes, 256 requests x 4096 tokens (65536 page ids): %.1f us with 32 groups of 8, "
              "%.1f us without sharing (median of 51)\n", with, without);
  EXPECT_LT(with, 20000.0);  // a guard against a quadratic path, not a benchmark bound
}
