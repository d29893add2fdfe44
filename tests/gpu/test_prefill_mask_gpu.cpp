// Custom masks (variants::custom_mask(), FlashInfer's packed_custom_mask) on
// the tensor-core prefill kernel against the CPU reference: random masks with
// fully masked rows and a tree-attention mask (speculative decoding: each
// draft query sees the prefix and its ancestors), fp16/bf16, head dims
// 64/128/256, groups 1 and 4, paged KV (page sizes 1 and 16) and ragged KV,
// q_len < kv_len, a long request that the planner splits (masked partial
// states merge), both backends; outputs poisoned first. Structured masks
// (causal, banded, documents) also check that trimming their fully masked
// tiles off the work items changes no bit. Plus run()'s checks
// of the mask tensor and a re-plan with other lengths and masks.
#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <numeric>
#include <random>

#include "prefill_util.hpp"
#include "tessera/api/prefill.hpp"
#include "tessera/formats/custom_mask.hpp"
#include "tessera/reference/attention.hpp"

using namespace tessera;
using namespace tessera::test;

namespace {

// kStructured: per request a causal, banded (40 keys) or block-diagonal
// (documents of 37 keys) pattern, bottom-right aligned, with blank rows:
// whole KV tiles are masked, which the run trims off its work items.
enum class MaskKind { kRandom, kTree, kStructured };
enum class Kv { kPage1, kPage16, kRagged };

// Per request a row-major [q_len, kv_len] 0/1 block, concatenated.
std::vector<uint8_t> make_mask(MaskKind kind, const std::vector<int32_t>& q_len, const std::vector<int32_t>& kv_len,
                               std::mt19937_64& rng) {
  std::vector<uint8_t> m;
  for (size_t b = 0; b < q_len.size(); ++b) {
    const int Q = q_len[b], K = kv_len[b];
    if (kind == MaskKind::kTree) {
      // Draft token i sits at key prefix + i; its parent is an earlier draft
      // token or the prefix itself (-1). It sees the whole prefix, its
      // ancestors and itself. (A request without keys has no mask bits.)
      if (K == 0) continue;
      EXPECT_GE(K, Q) << "a tree needs its draft tokens among the keys";
      const int prefix = K - Q;
      std::vector<int> parent(Q);
      for (int i = 0; i < Q; ++i) parent[i] = i == 0 ? -1 : static_cast<int>(rng() % (i + 1)) - 1;
      for (int i = 0; i < Q; ++i) {
        std::vector<uint8_t> row(K, 0);
        for (int j = 0; j < prefix; ++j) row[j] = 1;
        for (int a = i; a >= 0; a = parent[a]) row[prefix + a] = 1;
        m.insert(m.end(), row.begin(), row.end());
      }
      continue;
    }
    if (kind == MaskKind::kStructured) {
      for (int i = 0; i < Q; ++i) {
        const int pos = i + K - Q;  // the query's key position
        const int lo = b % 3 == 0 ? 0 : b % 3 == 1 ? pos - 40 : pos / 37 * 37;
        for (int j = 0; j < K; ++j) m.push_back(i % 7 != 3 && j >= lo && j <= pos ? 1 : 0);
      }
      continue;
    }
    const double density = std::array<double, 3>{0.1, 0.5, 0.95}[b % 3];
    std::bernoulli_distribution keep(density);
    for (int i = 0; i < Q; ++i) {
      const bool empty_row = i % 7 == 3 || (b == 3 && i == 0);  // fully masked rows, some in every tile
      for (int j = 0; j < K; ++j) m.push_back(!empty_row && keep(rng) ? 1 : 0);
    }
  }
  return m;
}

// Lengths with q_len < kv_len (chunked prefill / speculative drafts), a
// request without queries, one without keys, and a long one that splits.
struct Batch {
  std::vector<int32_t> q_len = {0, 5, 1, 37, 100, 9, 4, 17, 3};
  std::vector<int32_t> kv_len = {10, 0, 300, 61, 190, 1500, 4, 80, 29};
  std::vector<int32_t> qo{0}, kv_tokens{0}, kv_pages{0}, indices, last;
  int64_t pool = 0;

  Batch(int page_size, std::mt19937_64& rng) {
    std::vector<int32_t> pages;
    for (int32_t kv : kv_len) pages.push_back((kv + page_size - 1) / page_size);
    pool = std::accumulate(pages.begin(), pages.end(), 0) + 2;
    std::vector<int32_t> perm(pool);
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng);
    int next = 0;
    for (size_t r = 0; r < q_len.size(); ++r) {
      qo.push_back(qo.back() + q_len[r]);
      kv_tokens.push_back(kv_tokens.back() + kv_len[r]);
      for (int p = 0; p < pages[r]; ++p) indices.push_back(perm[next++]);
      kv_pages.push_back(static_cast<int32_t>(indices.size()));
      last.push_back(pages[r] ? kv_len[r] - (pages[r] - 1) * page_size : 0);
    }
  }
};

// Rows whose mask is all zero must be exactly O = 0 and LSE = -inf.
void expect_empty_rows(const Out& out, const std::vector<uint8_t>& mask, const Batch& b, int64_t hq, int64_t d,
                       int& empty_rows) {
  size_t pos = 0;
  for (size_t r = 0; r < b.q_len.size(); ++r)
    for (int i = 0; i < b.q_len[r]; ++i) {
      bool any = false;
      for (int j = 0; j < b.kv_len[r]; ++j) any |= mask[pos + j] != 0;
      pos += b.kv_len[r];
      if (any) continue;
      ++empty_rows;
      const int64_t row = b.qo[r] + i;
      for (int64_t h = 0; h < hq; ++h) {
        EXPECT_EQ(out.lse.get(row * hq + h), -INFINITY) << "row " << row << " head " << h;
        for (int64_t c = 0; c < d; ++c) ASSERT_EQ(out.o.get((row * hq + h) * d + c), 0.f) << "row " << row;
      }
    }
}

using Param = std::tuple<DType, int, int, Kv, MaskKind, PrefillBackend>;

struct MaskedRun {
  Batch batch;
  std::vector<uint8_t> mask;  // unpacked, as the kernel must read it
  reference::Result ref;
  Out out;
};

// One batch of the case's shape and mask, run on poisoned outputs.
MaskedRun run_masked(const Param& param, bool trim, bool pdl = false) {
  const auto [dt, D, group, kv_kind, mask_kind, backend] = param;
  const int page_size = kv_kind == Kv::kPage16 ? 16 : 1;
  const int64_t Hkv = 2, Hq = Hkv * group;
  std::mt19937_64 rng(D * 7 + group * 131 + static_cast<int>(kv_kind) * 17 + static_cast<int>(mask_kind) * 3);
  MaskedRun r{Batch(page_size, rng), {}, {}, {}};
  const Batch& b = r.batch;
  const PackedMask packed = pack_custom_mask(make_mask(mask_kind, b.q_len, b.kv_len, rng), b.q_len, b.kv_len);
  const int64_t rows = b.qo.back();

  HostTensor q = make_host(dt, {rows, Hq, D});
  fill_random(q, rng(), -2.f, 2.f);
  HostTensor bits = make_host(DType::kUInt8, {static_cast<int64_t>(packed.bits.size())});
  std::copy(packed.bits.begin(), packed.bits.end(), bits.storage.begin());
  reference::Options ro;
  ro.custom_mask = r.mask = unpack_custom_mask(packed.bits, packed.indptr, b.q_len, b.kv_len);

  const AttentionSpec spec{variants::custom_mask(), dt, dt, dt, D};
  TaskInfo task{static_cast<int>(Hq), static_cast<int>(Hkv), page_size, KVLayout::kNHD, 16, 2 * b.pool + 8};
  task.max_total_q = 512;
  PrefillOptions opt;
  opt.backend = backend;
  opt.trim_masked_tiles = trim;
  Workspace ws = prefill_workspace(spec, task, opt);
  BatchPrefill pre(spec, task, ws, opt);
  auto dq = to_device(q), dbits = to_device(bits);
  const TensorView& mask_view = dbits.view;
  RunOptions ropt;
  ropt.pdl = pdl;

  if (kv_kind == Kv::kRagged) {
    const int64_t total_kv = b.kv_tokens.back();
    HostTensor k = make_host(dt, {total_kv, Hkv, D}), v = k;
    fill_random(k, rng());
    fill_random(v, rng());
    r.ref = reference::attention_ragged(q.view, RaggedIndex(b.qo), k.view, v.view, RaggedIndex(b.kv_tokens), ro);
    pre.plan_ragged(b.qo, b.kv_tokens, packed.indptr);
    auto dk = to_device(k), dv = to_device(v);
    r.out = run_and_fetch([&](const TensorView& o, const TensorView& lse) {
      pre.run_ragged(dq.view, dk.view, dv.view, mask_view, o, lse, nullptr, ropt);
    }, dt, rows, Hq, D);
  } else {
    HostTensor k = make_host(dt, {b.pool, page_size, Hkv, D}), v = k;
    fill_random(k, rng());
    fill_random(v, rng());
    PagedKVCache cache(PagedKVStorage(k.view, v.view, KVLayout::kNHD),
                       PageTable(b.kv_pages, b.indices, b.last, page_size, b.pool));
    r.ref = reference::attention_paged(q.view, RaggedIndex(b.qo), cache, ro);
    pre.plan_paged(b.qo, b.kv_pages, b.indices, b.last, packed.indptr);
    auto dk = to_device(k), dv = to_device(v);
    PagedKVStorage kv(dk.view, dv.view, KVLayout::kNHD);
    r.out = run_and_fetch(
        [&](const TensorView& o, const TensorView& lse) { pre.run(dq.view, kv, mask_view, o, lse, nullptr, ropt); }, dt,
        rows, Hq, D);
  }
  return r;
}

class PrefillCustomMask : public ::testing::TestWithParam<Param> {};

TEST_P(PrefillCustomMask, MatchesReference) {
  SKIP_WITHOUT_GPU();
  const auto [dt, D, group, kv_kind, mask_kind, backend] = GetParam();
  const MaskedRun r = run_masked(GetParam(), true);
  const Batch& b = r.batch;
  EXPECT_CLOSE(compare(to_doubles(r.out.o.view), r.ref.o), dt);
  EXPECT_CLOSE(compare(to_doubles(r.out.lse.view), r.ref.lse), DType::kFloat16);
  int empty_rows = 0, rows_without_keys = 0;
  expect_empty_rows(r.out, r.mask, b, group * 2, D, empty_rows);
  for (size_t i = 0; i < b.q_len.size(); ++i) rows_without_keys += b.kv_len[i] == 0 ? b.q_len[i] : 0;
  // Random and structured masks blank rows on purpose; tree masks never (each query sees itself).
  if (mask_kind == MaskKind::kTree) EXPECT_EQ(empty_rows, rows_without_keys);
  else EXPECT_GT(empty_rows, rows_without_keys + 10);
}

// Trimming fully masked tiles off the work items changes no bit of the
// output or LSE (the skipped tiles would have left every state unchanged),
// including the split request whose chunks the band and document masks empty.
class PrefillMaskTrim : public ::testing::TestWithParam<Param> {};

TEST_P(PrefillMaskTrim, BitwiseUntrimmed) {
  SKIP_WITHOUT_GPU();
  const MaskedRun trimmed = run_masked(GetParam(), true), full = run_masked(GetParam(), false);
  EXPECT_CLOSE(compare(to_doubles(trimmed.out.o.view), trimmed.ref.o), std::get<0>(GetParam()));
  EXPECT_TRUE(bitwise_equal(trimmed.out.o, full.out.o));
  EXPECT_TRUE(bitwise_equal(trimmed.out.lse, full.out.lse));
  // With programmatic dependent launch the trim pass may start early (it
  // waits before reading anything); the attention kernel behind it may not.
  const MaskedRun early = run_masked(GetParam(), true, /*pdl=*/true);
  EXPECT_TRUE(bitwise_equal(trimmed.out.o, early.out.o));
  EXPECT_TRUE(bitwise_equal(trimmed.out.lse, early.out.lse));
}

INSTANTIATE_TEST_SUITE_P(Structured, PrefillMaskTrim,
                         ::testing::Combine(::testing::Values(DType::kFloat16, DType::kBFloat16),
                                            ::testing::Values(64, 128), ::testing::Values(1, 4),
                                            ::testing::Values(Kv::kPage1, Kv::kPage16, Kv::kRagged),
                                            ::testing::Values(MaskKind::kStructured),
                                            ::testing::Values(PrefillBackend::kAuto, PrefillBackend::kFA2)));

INSTANTIATE_TEST_SUITE_P(All, PrefillCustomMask,
                         ::testing::Combine(::testing::Values(DType::kFloat16, DType::kBFloat16),
                                            ::testing::Values(64, 128, 256), ::testing::Values(1, 4),
                                            ::testing::Values(Kv::kPage1, Kv::kPage16, Kv::kRagged),
                                            ::testing::Values(MaskKind::kRandom, MaskKind::kTree, MaskKind::kStructured),
                                            ::testing::Values(PrefillBackend::kAuto, PrefillBackend::kFA2)));

// run()'s checks of the mask tensor, and one wrapper re-planned with other
// lengths and another mask (the mask_indptr section is re-staged).
TEST(PrefillCustomMaskRun, ChecksAndReplan) {
  SKIP_WITHOUT_GPU();
  const DType dt = DType::kFloat16;
  const int64_t D = 128, Hq = 8, Hkv = 2;
  const AttentionSpec spec{variants::custom_mask(), dt, dt, dt, D};
  TaskInfo task{static_cast<int>(Hq), static_cast<int>(Hkv), 1, KVLayout::kNHD, 8, 1};
  task.max_total_q = 256;
  Workspace ws = prefill_workspace(spec, task, {});
  BatchPrefill pre(spec, task, ws);
  std::mt19937_64 rng(99);
  for (int step = 0; step < 2; ++step) {
    const std::vector<int32_t> q_len = step == 0 ? std::vector<int32_t>{7, 30} : std::vector<int32_t>{1, 12, 50};
    const std::vector<int32_t> kv_len = step == 0 ? std::vector<int32_t>{20, 33} : std::vector<int32_t>{9, 12, 140};
    std::vector<int32_t> qo{0}, kvi{0};
    for (size_t i = 0; i < q_len.size(); ++i) {
      qo.push_back(qo.back() + q_len[i]);
      kvi.push_back(kvi.back() + kv_len[i]);
    }
    const std::vector<uint8_t> mask = make_mask(step ? MaskKind::kTree : MaskKind::kRandom, q_len, kv_len, rng);
    const PackedMask packed = pack_custom_mask(mask, q_len, kv_len);
    HostTensor q = make_host(dt, {qo.back(), Hq, D}), k = make_host(dt, {kvi.back(), Hkv, D}), v = k;
    fill_random(q, rng(), -2.f, 2.f);
    fill_random(k, rng());
    fill_random(v, rng());
    HostTensor bits = make_host(DType::kUInt8, {static_cast<int64_t>(packed.bits.size())});
    std::copy(packed.bits.begin(), packed.bits.end(), bits.storage.begin());
    reference::Options ro;
    ro.custom_mask = mask;
    auto ref = reference::attention_ragged(q.view, RaggedIndex(qo), k.view, v.view, RaggedIndex(kvi), ro);
    pre.plan_ragged(qo, kvi, packed.indptr);
    auto dq = to_device(q), dk = to_device(k), dv = to_device(v), dbits = to_device(bits);
    HostTensor o_host = make_host(dt, {qo.back(), Hq, D});
    auto d_o = poisoned_like(o_host);

    TensorView small = dbits.view;  // one byte short
    small.shape = {static_cast<int64_t>(packed.bits.size()) - 1};
    EXPECT_THROW_MSG(pre.run_ragged(dq.view, dk.view, dv.view, small, d_o.view, TensorView()), InvalidArgument,
                     "packed_custom_mask");
    TensorView as_bool = dbits.view;
    as_bool.dtype = DType::kBool;
    EXPECT_THROW_MSG(pre.run_ragged(dq.view, dk.view, dv.view, as_bool, d_o.view, TensorView()), TypeMismatch,
                     "packed_custom_mask");
    EXPECT_THROW(pre.run_ragged(dq.view, dk.view, dv.view, bits.view, d_o.view, TensorView()), Error);  // host bytes
    EXPECT_THROW_MSG(pre.run_ragged(dq.view, dk.view, dv.view, d_o.view, TensorView()), InvalidArgument,
                     "packed_custom_mask");

    Out out = run_and_fetch([&](const TensorView& o, const TensorView& lse) {
      pre.run_ragged(dq.view, dk.view, dv.view, dbits.view, o, lse);
    }, dt, qo.back(), Hq, D);
    EXPECT_CLOSE(compare(to_doubles(out.o.view), ref.o), dt);
    EXPECT_CLOSE(compare(to_doubles(out.lse.view), ref.lse), DType::kFloat16);
  }
}

}  // namespace
