// Built-in soft-cap and sliding-window variants (variants::soft_cap,
// variants::sliding_window, and both at once through
// variants::from_plan_options) against the CPU reference's logits_soft_cap /
// window_left options: batch prefill over paged and ragged KV (FA2 and the
// auto-chosen template, which is Hopper on sm_90 for d 64/128), and batch
// decode (split and unsplit KV).
#include <gtest/gtest.h>

#include <numeric>
#include <random>
#include <string>

#include "decode_util.hpp"
#include "prefill_util.hpp"
#include "tessera/api/prefill.hpp"
#include "tessera/reference/attention.hpp"

using namespace tessera;
using namespace tessera::test;

namespace {

struct VariantCase {
  float cap;        // > 0: soft cap
  int window_left;  // >= 0: sliding window
  bool causal;
  VariantSpec spec() const {
    if (cap > 0 && window_left >= 0) return variants::from_plan_options(causal, window_left, cap);
    return cap > 0 ? variants::soft_cap(cap, causal) : variants::sliding_window(window_left, causal);
  }
  reference::Options ref() const {
    reference::Options o;
    o.causal = causal;
    o.logits_soft_cap = cap;
    o.window_left = window_left;
    return o;
  }
  std::string name() const {
    std::string n = window_left >= 0 ? "window" + std::to_string(window_left) : "";
    if (cap > 0) n += (n.empty() ? "cap" : "_cap") + std::to_string(static_cast<int>(cap));
    return n + (causal ? "_causal" : "");
  }
};

// The last two combine a window with a soft cap (a Gemma-2 layer's options).
const VariantCase kCases[] = {{30.f, -1, false}, {30.f, -1, true}, {5.f, -1, false}, {5.f, -1, true}, {0.f, 0, true},
                              {0.f, 7, true},    {0.f, 100, true}, {30.f, 100, true}, {5.f, 7, false}};
constexpr int kNumCases = sizeof(kCases) / sizeof(kCases[0]);

// Requests: no queries, no keys, one query, q_len > kv_len (causal: early rows
// see nothing), chunked prefill (q_len < kv_len) with long KV.
struct Batch {
  std::vector<int32_t> qo{0}, kv_pages{0}, indices, last, kv_tokens{0};
  int64_t pool = 0;
};

Batch make_batch(int page_size, std::mt19937_64& rng) {
  const std::vector<int32_t> q_len{0, 5, 1, 37, 100, 64, 9}, kv_len{10, 0, 300, 37, 190, 64 + 513, 3};
  Batch b;
  std::vector<int32_t> pages;
  for (int32_t kv : kv_len) pages.push_back((kv + page_size - 1) / page_size);
  b.pool = std::accumulate(pages.begin(), pages.end(), 0) + 3;
  std::vector<int32_t> perm(b.pool);
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng);
  int next = 0;
  for (size_t r = 0; r < q_len.size(); ++r) {
    b.qo.push_back(b.qo.back() + q_len[r]);
    b.kv_tokens.push_back(b.kv_tokens.back() + kv_len[r]);
    for (int p = 0; p < pages[r]; ++p) b.indices.push_back(perm[next++]);
    b.kv_pages.push_back(static_cast<int32_t>(b.indices.size()));
    b.last.push_back(pages[r] ? kv_len[r] - (pages[r] - 1) * page_size : 0);
  }
  return b;
}

// (variant case, dtype, backend, paged). Paged: d 128, group 4, page 16;
// ragged: fp16 d 128 group 1, bf16 d 64 group 4.
class PrefillVariant : public ::testing::TestWithParam<std::tuple<int, DType, PrefillBackend, bool>> {};

TEST_P(PrefillVariant, MatchesReference) {
  SKIP_WITHOUT_GPU();
  const auto [ci, dt, backend, paged] = GetParam();
  const VariantCase vc = kCases[ci];
  const int64_t D = paged || dt == DType::kFloat16 ? 128 : 64;
  const int64_t group = paged || dt == DType::kBFloat16 ? 4 : 1, Hkv = 2, Hq = Hkv * group;
  const int page_size = paged ? 16 : 1;
  std::mt19937_64 rng(ci * 31 + D + group + paged);
  Batch b = make_batch(page_size, rng);
  const int64_t rows = b.qo.back();
  // Larger q spread so the soft cap bites (logits of several units).
  HostTensor q = make_host(dt, {rows, Hq, D});
  fill_random(q, rng(), -4.f, 4.f);
  const AttentionSpec spec{vc.spec(), dt, dt, dt, static_cast<int>(D)};
  PrefillOptions opt;
  opt.backend = backend;
  auto dq = to_device(q);
  if (paged) {
    HostTensor k = make_host(dt, {b.pool, page_size, Hkv, D}), v = k;
    fill_random(k, rng(), -2.f, 2.f);
    fill_random(v, rng());
    PagedKVCache cache(PagedKVStorage(k.view, v.view, KVLayout::kNHD),
                       PageTable(b.kv_pages, b.indices, b.last, page_size, b.pool));
    auto ref = reference::attention_paged(q.view, RaggedIndex(b.qo), cache, vc.ref());
    TaskInfo task{static_cast<int>(Hq), static_cast<int>(Hkv), page_size, KVLayout::kNHD, 16, 4 * b.pool};
    task.max_total_q = 1024;
    Workspace ws = prefill_workspace(spec, task, opt);
    BatchPrefill pre(spec, task, ws, opt);
    pre.plan_paged(b.qo, b.kv_pages, b.indices, b.last);
    auto dk = to_device(k), dv = to_device(v);
    PagedKVStorage kv(dk.view, dv.view, KVLayout::kNHD);
    Out a = run_and_fetch([&](const TensorView& o, const TensorView& lse) { pre.run(dq.view, kv, o, lse); }, dt, rows,
                          Hq, D);
    EXPECT_CLOSE(compare(to_doubles(a.o.view), ref.o), dt);
    EXPECT_CLOSE(compare(to_doubles(a.lse.view), ref.lse), DType::kFloat16);
  } else {
    const int64_t total_kv = b.kv_tokens.back();
    HostTensor k = make_host(dt, {total_kv, Hkv, D}), v = k;
    fill_random(k, rng(), -2.f, 2.f);
    fill_random(v, rng());
    auto ref = reference::attention_ragged(q.view, RaggedIndex(b.qo), k.view, v.view, RaggedIndex(b.kv_tokens), vc.ref());
    TaskInfo task{static_cast<int>(Hq), static_cast<int>(Hkv), 1, KVLayout::kNHD, 16, 1};
    task.max_total_q = 1024;
    Workspace ws = prefill_workspace(spec, task, opt);
    BatchPrefill pre(spec, task, ws, opt);
    pre.plan_ragged(b.qo, b.kv_tokens);
    auto dk = to_device(k), dv = to_device(v);
    Out a = run_and_fetch(
        [&](const TensorView& o, const TensorView& lse) { pre.run_ragged(dq.view, dk.view, dv.view, o, lse); }, dt, rows,
        Hq, D);
    EXPECT_CLOSE(compare(to_doubles(a.o.view), ref.o), dt);
    EXPECT_CLOSE(compare(to_doubles(a.lse.view), ref.lse), DType::kFloat16);
  }
}

INSTANTIATE_TEST_SUITE_P(All, PrefillVariant,
                         ::testing::Combine(::testing::Range(0, kNumCases), ::testing::Values(DType::kFloat16, DType::kBFloat16),
                                            ::testing::Values(PrefillBackend::kAuto, PrefillBackend::kFA2),
                                            ::testing::Bool()),
                         [](const auto& info) {
                           const auto& t = info.param;
                           return kCases[std::get<0>(t)].name() + "_" + dtype_name(std::get<1>(t)) +
                                  (std::get<2>(t) == PrefillBackend::kFA2 ? "_fa2" : "_auto") +
                                  (std::get<3>(t) ? "_paged" : "_ragged");
                         });

// Decode: qo_len 1, so a sliding window keeps keys >= kv_len - 1 - window_left.
// (variant case, dtype, head dim / group).
class DecodeVariant : public ::testing::TestWithParam<std::tuple<int, DType, int>> {};

TEST_P(DecodeVariant, MatchesReference) {
  SKIP_WITHOUT_GPU();
  const auto [ci, dt, shape] = GetParam();
  const VariantCase vc = kCases[ci];
  const DecodeCase c{dt, shape == 0 ? 128 : 64, shape == 0 ? 4 : 1, 16, KVLayout::kNHD};
  const int64_t Hkv = 2, Hq = Hkv * c.group;
  std::mt19937_64 rng(ci * 17 + shape);
  const std::vector<int32_t> lens{0, 1, 7, 300, 5003, 33, 129, 2};
  const int64_t batch = static_cast<int64_t>(lens.size()), pool = pages_needed(lens, c.page_size) + 5;
  Table t = make_table(lens, c.page_size, pool, rng);
  Problem p = make_problem(c, batch, pool, Hkv, rng());
  fill_random(p.q, rng(), -6.f, 6.f);  // logits of several units: the cap bites
  p.dq = to_device(p.q);
  PagedKVCache cache(PagedKVStorage(p.k.view, p.v.view, c.layout),
                     PageTable(t.indptr, t.indices, t.last, c.page_size, t.num_pages));
  std::vector<int32_t> qo(batch + 1);
  std::iota(qo.begin(), qo.end(), 0);
  reference::Options ro = vc.ref();
  ro.causal = false;  // one query at the last position: causal changes nothing
  auto ref = reference::attention_paged(p.q.view, RaggedIndex(qo), cache, ro);
  const AttentionSpec spec{vc.spec(), dt, dt, dt, c.head_dim};
  TaskInfo task{static_cast<int>(Hq), static_cast<int>(Hkv), c.page_size, c.layout, 32, 4 * pool};
  for (bool split : {true, false}) {
    SCOPED_TRACE(split ? "split-KV" : "no split");
    DecodeOptions opt;
    opt.cuda_cores = true;  // the CUDA-core kernel's variants (the tensor-core path runs the prefill's)
    opt.planner.split_kv = split;
    Workspace ws = decode_workspace(spec, task, opt);
    BatchDecode dec(spec, task, ws, opt);
    dec.plan(t.indptr, t.indices, t.last);
    Outputs out = run_decode(dec, p, c, batch);
    EXPECT_CLOSE(compare(to_doubles(out.o.view), ref.o), dt);
    EXPECT_CLOSE(compare(to_doubles(out.lse.view), ref.lse), DType::kFloat16);
  }
}

INSTANTIATE_TEST_SUITE_P(All, DecodeVariant,
                         ::testing::Combine(::testing::Range(0, kNumCases), ::testing::Values(DType::kFloat16, DType::kBFloat16),
                                            ::testing::Values(0, 1)),
                         [](const auto& info) {
                           const auto& t = info.param;
                           return kCases[std::get<0>(t)].name() + "_" + dtype_name(std::get<1>(t)) +
                                  (std::get<2>(t) == 0 ? "_d128_g4" : "_d64_g1");
                         });

}  // namespace
