// Automatic KV head groups (PrefillOptions::group_heads = HeadGrouping::kAuto,
// the default); the grouped and per-head layouts at every length are
// test_prefill_gpu.cpp's PrefillHeadGroups.
#include <gtest/gtest.h>

#include <tuple>
#include <vector>

#include "prefill_util.hpp"
#include "tessera/api/prefill.hpp"

using namespace tessera;
using namespace tessera::test;

namespace {

// HeadGrouping::kAuto: a first plan of long requests (mean KV length) on the
// Hopper kernel's 128-row tiles groups the KV heads (every SM busy); shorter
// ones and other tiles keep one plan per head. Grouped, the run matches the
// float64 reference (two chunks of 128 queries at the end of their KV).
TEST(PrefillHeadGroupsAuto, LongPromptsOnHopperTilesOnly) {
  SKIP_WITHOUT_GPU();
  if (jit::Arch::of_device(0).major != 9) GTEST_SKIP() << "skipped: grouping is automatic on the Hopper kernel only";
  const DType dt = DType::kFloat16;
  const int64_t Hkv = 8, D = 128, Q = 128;
  for (const auto& [len, cta_q, grouped] : {std::tuple{int(kGroupHeadsMinKv), 128, true},
                                            std::tuple{int(kGroupHeadsMinKv) / 2, 128, false},
                                            std::tuple{int(kGroupHeadsMinKv), 64, false}}) {
    SCOPED_TRACE("length " + std::to_string(len) + ", cta_q " + std::to_string(cta_q));
    const AttentionSpec spec{variants::causal(), dt, dt, dt, static_cast<int>(D)};
    TaskInfo t{static_cast<int>(Hkv), static_cast<int>(Hkv), 1, KVLayout::kNHD, 2, 2 * len};
    t.max_total_q = 2 * Q;
    PrefillOptions opt;
    opt.cta_q = cta_q;
    Workspace ws = prefill_workspace(spec, t, opt);
    BatchPrefill pre(spec, t, ws, opt);
    const std::vector<int32_t> qo{0, int(Q), int(2 * Q)}, kv{0, len, 2 * len};
    pre.plan_ragged(qo, kv);
    EXPECT_EQ(pre.head_groups() < Hkv, grouped);
    if (!grouped) continue;
    const auto [q, k, v, ref] = causal_ragged_case(dt, qo, kv, Hkv, Hkv, D, D, len);
    auto dq = to_device(q), dk = to_device(k), dv = to_device(v);
    auto ragged = [&](const TensorView& o, const TensorView& lse) { pre.run_ragged(dq.view, dk.view, dv.view, o, lse); };
    const Out r = run_and_fetch(ragged, dt, 2 * Q, Hkv, D);
    EXPECT_CLOSE(compare(to_doubles(r.o.view), ref.o), dt);
    EXPECT_CLOSE(compare(to_doubles(r.lse.view), ref.lse), DType::kFloat16);
  }
}

}  // namespace
