// Every built-in variant spec and the docs' example, through AttentionWrapper
// with its extras passed by name, against the CPU reference (which implements
// the same variants directly): decode over paged KV and BSR (Br = 1), prefill
// over ragged, paged and BSR KV (auto backend, Hopper on sm_90, and FA2),
// fp16 (d 128, 8/2 heads) and bf16 (d 64, 4/2 heads). Outputs are poisoned
// first; fp16 must be within 1e-3 and bf16 1e-2 of the reference's largest
// magnitude, and NaN never passes.
#include <gtest/gtest.h>

#include <numeric>
#include <random>
#include <string>

#include "decode_util.hpp"
#include "prefill_util.hpp"
#include "tessera/api/attention_wrapper.hpp"
#include "variant_gpu_util.hpp"

using namespace tessera;
using namespace tessera::test;

namespace {

enum class Mode { kDecodePaged, kDecodeBsr, kPrefillRagged, kPrefillPaged, kPrefillBsr };
const char* mode_name(Mode m) {
  switch (m) {
    case Mode::kDecodePaged: return "decode_paged";
    case Mode::kDecodeBsr: return "decode_bsr";
    case Mode::kPrefillRagged: return "prefill_ragged";
    case Mode::kPrefillPaged: return "prefill_paged";
    case Mode::kPrefillBsr: return "prefill_bsr";
  }
  return "?";
}
bool is_prefill(Mode m) { return m != Mode::kDecodePaged && m != Mode::kDecodeBsr; }

struct Param {
  int ci;
  DType dt;
  Mode mode;
  PrefillBackend backend;
};

std::vector<Param> params() {
  std::vector<Param> out;
  const auto cases = builtin_cases();
  for (int ci = 0; ci < static_cast<int>(cases.size()); ++ci)
    for (DType dt : {DType::kFloat16, DType::kBFloat16})
      for (Mode m : {Mode::kDecodePaged, Mode::kDecodeBsr, Mode::kPrefillRagged, Mode::kPrefillPaged, Mode::kPrefillBsr}) {
        if (m == Mode::kPrefillBsr && cases[ci].masks) continue;  // the BSR reference takes no masks
        if (!is_prefill(m)) {
          out.push_back({ci, dt, m, PrefillBackend::kAuto});
          continue;
        }
        for (PrefillBackend b : {PrefillBackend::kAuto, PrefillBackend::kFA2}) out.push_back({ci, dt, m, b});
      }
  return out;
}

struct Shape {
  int64_t D, Hkv, Hq;
};
Shape shape_of(DType dt) { return dt == DType::kFloat16 ? Shape{128, 2, 8} : Shape{64, 2, 4}; }

// Requests of a prefill step: no queries, no keys, one query, q_len = kv_len,
// chunked prefill (q_len < kv_len) over long KV.
const std::vector<int32_t> kPrefillQ{0, 5, 1, 37, 100, 64, 9}, kPrefillKV{10, 0, 300, 37, 190, 577, 3};
const std::vector<int32_t> kDecodeKV{0, 1, 7, 300, 2000, 33, 129, 2};

std::vector<int32_t> prefix(const std::vector<int32_t>& lens) {
  std::vector<int32_t> p{0};
  for (int32_t x : lens) p.push_back(p.back() + x);
  return p;
}

class BuiltinVariantGpu : public ::testing::TestWithParam<Param> {};

TEST_P(BuiltinVariantGpu, MatchesReference) {
  SKIP_WITHOUT_GPU();
  const Param prm = GetParam();
  const BuiltinCase vc = builtin_cases()[prm.ci];
  const DType dt = prm.dt;
  const Shape s = shape_of(dt);
  const int page_size = 16;
  std::mt19937_64 rng(1000 + prm.ci * 37 + static_cast<int>(prm.mode) * 7 + (dt == DType::kBFloat16));
  ExtraTensors ext;
  VariantArgs args;
  reference::Options ro;
  vc.setup(static_cast<int>(s.Hq), ext, args, ro);
  const AttentionSpec spec{vc.spec(), dt, dt, dt, static_cast<int>(s.D)};
  AttentionWrapperOptions wopt;
  wopt.prefill.backend = prm.backend;
  auto random = [&](std::vector<int64_t> shape, float spread) {
    HostTensor t = make_host(dt, std::move(shape));
    fill_random(t, rng(), -spread, spread);
    return t;
  };

  const bool decode = !is_prefill(prm.mode);
  const std::vector<int32_t> q_lens = decode ? std::vector<int32_t>(kDecodeKV.size(), 1) : kPrefillQ;
  const std::vector<int32_t>& kv_lens = decode ? kDecodeKV : kPrefillKV;
  const std::vector<int32_t> qo = prefix(q_lens);
  const int64_t rows = prm.mode == Mode::kPrefillBsr ? 24 : qo.back();
  HostTensor q = random({rows, s.Hq, s.D}, vc.spread);
  auto dq = to_device(q);
  TaskInfo task{static_cast<int>(s.Hq), static_cast<int>(s.Hkv), page_size, KVLayout::kNHD, 16, 4096};
  task.max_total_q = 1024;
  auto sizes = AttentionWrapper::workspace_size(spec, task, cuda::device_info(cuda::current_device()).sm_count, wopt);
  Workspace ws = Workspace::allocate(sizes.device_bytes, sizes.host_bytes);
  AttentionWrapper attn(spec, task, ws, wopt);
  reference::Result ref;
  Out got;

  if (prm.mode == Mode::kPrefillRagged) {
    const std::vector<int32_t> kvp = prefix(kv_lens);
    HostTensor k = random({kvp.back(), s.Hkv, s.D}, vc.spread), v = random({kvp.back(), s.Hkv, s.D}, 1.f);
    ref = reference::attention_ragged(q.view, RaggedIndex(qo), k.view, v.view, RaggedIndex(kvp), ro);
    attn.plan_ragged(qo, kvp);
    auto dk = to_device(k), dv = to_device(v);
    got = run_and_fetch([&](const TensorView& o, const TensorView& lse) { attn.run_ragged(dq.view, dk.view, dv.view, o, lse, args); },
                        dt, rows, s.Hq, s.D);
  } else if (prm.mode == Mode::kPrefillBsr) {
    // 6 block rows of 4 queries over 12 column blocks of 16 keys, shuffled
    // columns, one empty block row; K/V [192, Hkv, D] seen as 12 pages.
    const BSRMatrix bsr(24, 192, 4, page_size, {0, 3, 3, 5, 9, 10, 12}, {7, 2, 11, 0, 5, 3, 9, 1, 6, 8, 4, 10});
    HostTensor k = random({12, page_size, s.Hkv, s.D}, vc.spread), v = random({12, page_size, s.Hkv, s.D}, 1.f);
    const TensorView k_rows(k.storage.data(), dt, Device{}, {192, s.Hkv, s.D}), v_rows(v.storage.data(), dt, Device{}, {192, s.Hkv, s.D});
    ref = reference::attention_bsr(q.view, bsr, k_rows, v_rows, ro);
    attn.plan_bsr(bsr);
    ASSERT_EQ(attn.kind(), AttentionKind::kPrefill);
    auto dk = to_device(k), dv = to_device(v);
    const PagedKVStorage kv(dk.view, dv.view, KVLayout::kNHD);
    got = run_and_fetch([&](const TensorView& o, const TensorView& lse) { attn.run(dq.view, kv, o, lse, args); }, dt, rows,
                        s.Hq, s.D);
  } else {  // paged: prefill, decode, decode as BSR with Br = 1
    const int64_t pool = pages_needed(kv_lens, page_size) + 5;
    Table t = make_table(kv_lens, page_size, pool, rng);
    HostTensor k = random({pool, page_size, s.Hkv, s.D}, vc.spread), v = random({pool, page_size, s.Hkv, s.D}, 1.f);
    PagedKVCache cache(PagedKVStorage(k.view, v.view, KVLayout::kNHD),
                       PageTable(t.indptr, t.indices, t.last, page_size, t.num_pages));
    ref = reference::attention_paged(q.view, RaggedIndex(qo), cache, ro);
    if (prm.mode == Mode::kDecodeBsr)
      attn.plan_bsr(BSRMatrix(static_cast<int64_t>(kv_lens.size()), pool * page_size, 1, page_size, t.indptr, t.indices, t.last));
    else
      attn.plan(qo, t.indptr, t.indices, t.last);
    ASSERT_EQ(attn.kind(), decode ? AttentionKind::kDecode : AttentionKind::kPrefill);
    auto dk = to_device(k), dv = to_device(v);
    const PagedKVStorage kv(dk.view, dv.view, KVLayout::kNHD);
    got = run_and_fetch([&](const TensorView& o, const TensorView& lse) { attn.run(dq.view, kv, o, lse, args); }, dt, rows,
                        s.Hq, s.D);
  }
  EXPECT_CLOSE(compare(to_doubles(got.o.view), ref.o), dt);
  EXPECT_CLOSE(compare(to_doubles(got.lse.view), ref.lse), DType::kFloat16);
}

INSTANTIATE_TEST_SUITE_P(All, BuiltinVariantGpu, ::testing::ValuesIn(params()), [](const auto& info) {
  const Param& p = info.param;
  return builtin_cases()[p.ci].name + "_" + dtype_name(p.dt) + "_" + mode_name(p.mode) +
         (is_prefill(p.mode) ? (p.backend == PrefillBackend::kFA2 ? "_fa2" : "_auto") : "");
});

}  // namespace
