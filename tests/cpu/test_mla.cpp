// MLA (DeepSeek-style latent attention) without a GPU: the catalogue's
// configurations, BatchMLA's structural validation (every error names its
// argument, before any GPU work), workspace sizing, the float64 reference
// against dense attention over the concatenated latent KV, and the plans
// the wrapper makes (Planner::plan_prefill with group = H) against the
// planner's contract. The kernels' sources compile with NVRTC for sm_80 and
// sm_90a in Jit.MlaBuiltinsCompile.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>

#include "fake_workspace.hpp"
#include "jit_util.hpp"
#include "planner_check.hpp"
#include "tessera/abi/mla_params.cuh"
#include "tessera/api/mla.hpp"
#include "tessera/reference/mla.hpp"
#include "tessera/runtime/kernel_catalog.hpp"
#include "test_util.hpp"

namespace tessera {
namespace {

using test::make_host;

TEST(MlaCatalog, ConfigsFitAnSmAndNameTheirTile) {
  for (int q : {16, 32, 64}) {
    const MlaKernelConfig c = catalog::mla_config(q);
    EXPECT_EQ(c.cta_q, q);
    EXPECT_LE(c.smem_bytes + 1024, 232448) << q;  // + static shared memory
    EXPECT_EQ(c.threads, 32 * (q / 16) * c.warps_d);
    EXPECT_EQ(c.cta_kv % (16 * c.warps_d), 0);
    EXPECT_GE(c.stages, 2);
  }
  EXPECT_EQ(catalog::choose_mla_cta_q(16), 16);
  EXPECT_EQ(catalog::choose_mla_cta_q(17), 32);
  EXPECT_EQ(catalog::choose_mla_cta_q(128), 64);
  EXPECT_THROW_MSG(catalog::mla_config(128), InvalidArgument, "cta_q");
  EXPECT_THROW_MSG(catalog::batch_mla(DType::kFloat32, 16, false), TypeMismatch, "q_dtype");
  const auto k = catalog::batch_mla(DType::kBFloat16, 64, true);
  EXPECT_EQ(k.entry, "tessera_mla_bf16_q64_kv32_causal");
  EXPECT_NE(k.source.find("batch_mla<tessera::bf16_t, tessera::bf16_t, 64, true>"), std::string::npos);
  EXPECT_EQ(catalog::builtin_mla_kernels().size(), 32u);
  int in_builtins = 0;
  for (const auto& b : catalog::builtin_kernels()) in_builtins += b.entry.rfind("tessera_mla_", 0) == 0;
  EXPECT_EQ(in_builtins, 32);  // `tessera compile` and scripts/test.sh compile them
}

TEST(MlaCatalog, HopperKernelFitsAnSm) {
  const MlaKernelConfig c = catalog::mla_sm90_config();
  EXPECT_TRUE(c.hopper);
  EXPECT_EQ(c.cta_q, 64);
  EXPECT_EQ(c.cta_kv, 64);
  EXPECT_EQ(c.threads, 384);
  // The storage (Q, two KV stages, P: 224 KB), its alignment slack and the
  // barriers and row exchange in static shared memory fit the 227 KB a CTA may have.
  EXPECT_EQ(c.smem_bytes, 28 * 8192 + 1024);
  EXPECT_LE(c.smem_bytes + 1088, 232448);
  const auto k = catalog::batch_mla_sm90(DType::kFloat16, DType::kFloat16, true);
  EXPECT_EQ(k.entry, "tessera_mla_sm90_f16_causal");
  EXPECT_NE(k.source.find("batch_mla_sm90<tessera::half_t, tessera::half_t, tessera::half_t, true>"), std::string::npos);
  const auto f8 = catalog::batch_mla_sm90(DType::kBFloat16, DType::kFloat8E5M2, false);
  EXPECT_NE(f8.source.find("batch_mla_sm90<tessera::bf16_t, tessera::fp8_e5m2_t, tessera::bf16_t, false>"),
            std::string::npos);
  EXPECT_NE(f8.entry, catalog::batch_mla_sm90(DType::kBFloat16, DType::kBFloat16, false).entry);
  EXPECT_THROW_MSG(catalog::batch_mla_sm90(DType::kFloat8E4M3, DType::kFloat8E4M3, false), TypeMismatch, "q_dtype");
  EXPECT_THROW_MSG(catalog::batch_mla_sm90(DType::kFloat16, DType::kBFloat16, false), TypeMismatch, "kv_dtype");
}

// The 16-row form: one consumer warpgroup, a 16-row Q tile (18 KB) beside
// the same two KV stages; caches of q's dtype, or fp8 widened into them.
TEST(MlaCatalog, HopperSixteenRowTiles) {
  const MlaKernelConfig c = catalog::mla_sm90_config(16);
  EXPECT_TRUE(c.hopper);
  EXPECT_EQ(c.cta_q, 16);
  EXPECT_EQ(c.cta_kv, 64);
  EXPECT_EQ(c.threads, 256);
  EXPECT_EQ(c.smem_bytes, 9 * 2048 + 2 * 9 * 8192 + 2048 + 1024);
  EXPECT_LE(c.smem_bytes + 1024, 232448);
  const auto k = catalog::batch_mla_sm90(DType::kBFloat16, DType::kBFloat16, true, 16);
  EXPECT_EQ(k.entry, "tessera_mla_sm90_q16_bf16_causal");
  EXPECT_NE(k.source.find("batch_mla_sm90_narrow<tessera::bf16_t, tessera::bf16_t, tessera::bf16_t, true, 1>"),
            std::string::npos);
  EXPECT_NE(k.entry, catalog::batch_mla_sm90(DType::kBFloat16, DType::kBFloat16, true).entry);
  const MlaKernelConfig c8 = catalog::mla_sm90_config(16, true);  // two widener warpgroups, the raw ring
  EXPECT_EQ(c8.threads, 512);
  EXPECT_EQ(c8.smem_bytes, c.smem_bytes + 3 * 32 * 576);
  EXPECT_LE(c8.smem_bytes + 1024, 232448);
  const auto f8 = catalog::batch_mla_sm90(DType::kFloat16, DType::kFloat8E4M3, false, 16);
  EXPECT_EQ(f8.entry, "tessera_mla_sm90_q16_f16_e4m3");
  EXPECT_NE(f8.source.find("batch_mla_sm90_narrow<tessera::half_t, tessera::fp8_e4m3_t, tessera::half_t, false, 1>"),
            std::string::npos);
  EXPECT_THROW_MSG(catalog::batch_mla_sm90(DType::kFloat16, DType::kBFloat16, false, 16), TypeMismatch, "kv_dtype");
  EXPECT_THROW_MSG(catalog::mla_sm90_config(48), InvalidArgument, "cta_q");
  EXPECT_THROW_MSG(catalog::batch_mla_sm90(DType::kFloat16, DType::kFloat16, false, 128), InvalidArgument, "cta_q");
}

// The pair form: two 16-row consumers on a 32-row Q tile (36 KB), the same
// two KV stages and a P^T block each; 16-bit caches only.
TEST(MlaCatalog, HopperPairTiles) {
  const MlaKernelConfig c = catalog::mla_sm90_config(32);
  EXPECT_TRUE(c.hopper);
  EXPECT_EQ(c.cta_q, 32);
  EXPECT_EQ(c.threads, 384);
  EXPECT_EQ(c.smem_bytes, 9 * 4096 + 2 * 9 * 8192 + 2 * 2048 + 1024);
  EXPECT_LE(c.smem_bytes + 1024, 232448);
  const auto k = catalog::batch_mla_sm90(DType::kFloat16, DType::kFloat16, true, 32);
  EXPECT_EQ(k.entry, "tessera_mla_sm90_q32_f16_causal");
  EXPECT_NE(k.source.find("batch_mla_sm90_narrow<tessera::half_t, tessera::half_t, tessera::half_t, true, 2>"),
            std::string::npos);
  EXPECT_NE(k.source.find("kMlaSm90PairSmemBytes"), std::string::npos);
  EXPECT_THROW_MSG(catalog::mla_sm90_config(32, true), TypeMismatch, "kv_data_type");
  EXPECT_THROW_MSG(catalog::batch_mla_sm90(DType::kBFloat16, DType::kFloat8E4M3, false, 32), TypeMismatch,
                   "kv_data_type");
}

MLATask small_task() {
  MLATask t;
  t.num_heads = 16;
  t.page_size = 16;
  return t;
}

TEST(MlaValidation, TaskFieldsAreNamed) {
  test::FakeWorkspace fw;
  auto make = [&](auto edit) {
    MLATask t = small_task();
    edit(t);
    BatchMLA m(t, fw.ws);
  };
  EXPECT_THROW_MSG(make([](MLATask& t) { t.num_heads = 0; }), InvalidArgument, "num_heads");
  EXPECT_THROW_MSG(make([](MLATask& t) { t.head_dim_ckv = 256; }), InvalidArgument, "head_dim_ckv");
  EXPECT_THROW_MSG(make([](MLATask& t) { t.head_dim_kpe = 32; }), InvalidArgument, "head_dim_kpe");
  EXPECT_THROW_MSG(make([](MLATask& t) { t.page_size = 0; }), InvalidArgument, "page_size");
  EXPECT_THROW_MSG(make([](MLATask& t) { t.q_dtype = DType::kFloat32; }), TypeMismatch, "q_data_type");
  EXPECT_THROW_MSG(make([](MLATask& t) { t.kv_dtype = DType::kBFloat16; }), TypeMismatch, "kv_data_type");
  EXPECT_THROW_MSG(make([](MLATask& t) { t.kv_dtype = DType::kFloat32; }), TypeMismatch, "kv_data_type");
  {
    MLATask t = small_task();
    t.kv_dtype = DType::kFloat8E4M3;  // the Hopper kernel's: accepted by auto and fa3, refused by fa2
    BatchMLA auto_ok(t, fw.ws);
    MLAOptions fa3;
    fa3.backend = MlaBackend::kFA3;
    BatchMLA fa3_ok(t, fw.ws, fa3);
    MLAOptions fa2;
    fa2.backend = MlaBackend::kFA2;
    EXPECT_THROW_MSG(BatchMLA(t, fw.ws, fa2), TypeMismatch, "kv_data_type");
    MLAOptions tile16;
    tile16.cta_q = 16;
    BatchMLA tile16_ok(t, fw.ws, tile16);
    tile16.cta_q = 32;  // the mma.sync kernel's tile: 16-bit caches only
    EXPECT_THROW_MSG(BatchMLA(t, fw.ws, tile16), TypeMismatch, "kv_data_type");
  }
  EXPECT_THROW_MSG(make([](MLATask& t) { t.max_pages = -1; }), InvalidArgument, "max_pages");
  MLAOptions opt;
  opt.cta_q = 48;
  EXPECT_THROW_MSG(BatchMLA(small_task(), fw.ws, opt), InvalidArgument, "cta_q");
  opt = {};
  opt.planner.fixed_chunk = 256;
  EXPECT_THROW_MSG(BatchMLA(small_task(), fw.ws, opt), InvalidArgument, "fixed_chunk");
  opt = {};
  opt.backend = MlaBackend::kFA3;
  opt.cta_q = 32;  // the pair form: 16-bit caches only
  BatchMLA fa3_32(small_task(), fw.ws, opt);
  {
    MLATask t = small_task();
    t.kv_dtype = DType::kFloat8E4M3;
    EXPECT_THROW_MSG(BatchMLA(t, fw.ws, opt), TypeMismatch, "kv_data_type");
  }
  opt.cta_q = 16;
  BatchMLA fa3_16(small_task(), fw.ws, opt);
  {
    MLATask t = small_task();
    t.kv_dtype = DType::kFloat8E4M3;  // fp8 caches take the 16-row tiles too
    BatchMLA fa3_16_fp8(t, fw.ws, opt);
  }
  opt = {};
  opt.backend = static_cast<MlaBackend>(7);
  EXPECT_THROW_MSG(BatchMLA(small_task(), fw.ws, opt), InvalidArgument, "backend");
}

TEST(MlaValidation, PlanArgumentsAreNamedBeforeAnyGpuWork) {
  test::FakeWorkspace fw;
  BatchMLA m(small_task(), fw.ws);
  const std::vector<int32_t> qo{0, 1, 3}, kv{0, 1, 3}, ids{4, 2, 7}, lens{5, 20};
  EXPECT_THROW_MSG(m.plan(std::vector<int32_t>{}, kv, ids, lens), InvalidArgument, "qo_indptr");
  EXPECT_THROW_MSG(m.plan(std::vector<int32_t>{0, 2, 1}, kv, ids, lens), InvalidArgument, "qo_indptr");
  EXPECT_THROW_MSG(m.plan(qo, std::vector<int32_t>{0, 1}, ids, lens), InvalidArgument, "kv_indptr");
  EXPECT_THROW_MSG(m.plan(qo, kv, ids, std::vector<int32_t>{5}), InvalidArgument, "kv_len_arr");
  EXPECT_THROW_MSG(m.plan(qo, kv, ids, std::vector<int32_t>{5, -1}), InvalidArgument, "kv_len_arr");
  EXPECT_THROW_MSG(m.plan(qo, kv, ids, std::vector<int32_t>{5, 40}), InvalidArgument, "kv_indptr");  // 3 pages needed
  EXPECT_THROW_MSG(m.plan(qo, kv, ids, std::vector<int32_t>{17, 20}), InvalidArgument, "kv_indptr");
  EXPECT_THROW_MSG(m.plan(qo, kv, std::vector<int32_t>{4, 2}, lens), InvalidArgument, "kv_indices");
  EXPECT_THROW_MSG(m.plan(qo, kv, std::vector<int32_t>{4, -2, 7}, lens), InvalidArgument, "kv_indices");
  TensorView none;
  EXPECT_THROW_MSG(m.run(none, none, none, none, none, none), InvalidArgument, "plan");
}

TEST(MlaWorkspace, SizesCoverEveryTileAndRefuseTooSmall) {
  MLATask t = small_task();
  EXPECT_THROW_MSG(BatchMLA::workspace_size(t, 132), InvalidArgument, "max_batch");
  t.max_batch = 256;
  t.max_total_q = 512;
  t.max_pages = 256 * 64;
  const auto ideal = BatchMLA::workspace_size(t, 132), least = BatchMLA::min_workspace_size(t, 132);
  EXPECT_GT(ideal.device_bytes, least.device_bytes);
  EXPECT_EQ(ideal.host_bytes, least.host_bytes);
  for (int q : {16, 32, 64}) {
    const auto l = BatchMLA::layout_for(t, 132, q);
    EXPECT_LE(l.total, ideal.device_bytes);
    EXPECT_LE(l.staged, ideal.host_bytes);
    EXPECT_EQ(l.max_slot_rows, max_split_slots(132) * q);  // every partial state fits
    EXPECT_LT(l.indices, l.staged);
    EXPECT_LE(l.staged, l.scratch);
    // Split-KV scratch: counters, the cooperative merge's 64-bit words, partial
    // states, in that order and apart.
    EXPECT_LE(l.scratch, l.counters);
    EXPECT_LE(l.counters + sizeof(int32_t) * l.max_split_tiles, l.merge_words);
    EXPECT_EQ(l.merge_words % sizeof(uint64_t), 0u);
    EXPECT_LE(l.merge_words + sizeof(uint64_t) * l.max_split_tiles, l.partial_lse);
    EXPECT_LE(l.partial_lse + sizeof(float) * l.max_slot_rows, l.partial_o);
    EXPECT_LE(l.partial_o + sizeof(float) * l.max_slot_rows * 512, l.total);
    const auto half = BatchMLA::layout_for(t, 132, q, (l.min_total + l.ideal_total) / 2);
    EXPECT_GT(half.max_slot_rows, 0);
    EXPECT_LT(half.max_slot_rows, l.max_slot_rows);
    EXPECT_EQ(half.max_slot_rows % q, 0);  // whole query tiles
    EXPECT_THROW_MSG(BatchMLA::layout_for(t, 132, q, l.min_total - 1), InvalidArgument, "workspace");
  }
}

// ---------------------------------------------------------------- reference

struct MlaCase {
  std::vector<int32_t> qo_indptr, kv_indptr, kv_indices, kv_lens;
  test::HostTensor q_nope, q_pe, ckv, kpe;
};

// Random inputs; pages shuffled through the pool (one spare page).
MlaCase make_case(const std::vector<int32_t>& qo_lens, const std::vector<int32_t>& kv_lens, int H, int page_size,
                  DType dt, int dc, int dr, uint64_t seed) {
  MlaCase c;
  c.qo_indptr = {0};
  c.kv_indptr = {0};
  c.kv_lens = kv_lens;
  for (size_t i = 0; i < qo_lens.size(); ++i) {
    c.qo_indptr.push_back(c.qo_indptr.back() + qo_lens[i]);
    c.kv_indptr.push_back(c.kv_indptr.back() + (kv_lens[i] + page_size - 1) / page_size);
  }
  const int pages = c.kv_indptr.back() + 1;
  std::vector<int32_t> perm(pages);
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), std::mt19937(static_cast<unsigned>(seed)));
  c.kv_indices.assign(perm.begin(), perm.begin() + c.kv_indptr.back());
  c.q_nope = make_host(dt, {c.qo_indptr.back(), H, dc});
  c.q_pe = make_host(dt, {c.qo_indptr.back(), H, dr});
  c.ckv = make_host(dt, {pages, page_size, dc});
  c.kpe = make_host(dt, {pages, page_size, dr});
  test::fill_random(c.q_nope, seed + 1);
  test::fill_random(c.q_pe, seed + 2);
  test::fill_random(c.ckv, seed + 3);
  test::fill_random(c.kpe, seed + 4);
  return c;
}

TEST(MlaReference, MatchesDenseAttentionOverConcatenatedLatentKv) {
  const int H = 3, dc = 32, dr = 8, ps = 4;
  for (bool causal : {false, true}) {
    const MlaCase c = make_case({1, 3, 2, 0}, {7, 5, 0, 9}, H, ps, DType::kFloat32, dc, dr, causal ? 7 : 3);
    const double scale = 0.3;
    const reference::Result r = reference::mla_paged(c.q_nope.view, c.q_pe.view, c.ckv.view, c.kpe.view, c.qo_indptr,
                                                     c.kv_indptr, c.kv_indices, c.kv_lens, causal, scale);
    ASSERT_EQ(r.head_dim, dc);
    for (size_t b = 0; b + 1 < c.qo_indptr.size(); ++b) {
      const int64_t nq = c.qo_indptr[b + 1] - c.qo_indptr[b], nk = c.kv_lens[b];
      for (int h = 0; h < H; ++h) {
        std::vector<double> q(nq * (dc + dr)), k(nk * (dc + dr)), v(nk * (dc + dr), 0.0), o, lse;
        for (int64_t j = 0; j < nq; ++j)
          for (int x = 0; x < dc + dr; ++x)
            q[j * (dc + dr) + x] = x < dc ? test::load(c.q_nope.view, {c.qo_indptr[b] + j, h, x})
                                          : test::load(c.q_pe.view, {c.qo_indptr[b] + j, h, x - dc});
        for (int64_t t = 0; t < nk; ++t) {
          const int64_t page = c.kv_indices[c.kv_indptr[b] + t / ps], slot = t % ps;
          for (int x = 0; x < dc + dr; ++x) {
            k[t * (dc + dr) + x] = x < dc ? test::load(c.ckv.view, {page, slot, x}) : test::load(c.kpe.view, {page, slot, x - dc});
            if (x < dc) v[t * (dc + dr) + x] = k[t * (dc + dr) + x];
          }
        }
        std::vector<uint8_t> mask;
        if (causal) {
          mask.assign(nq * nk, 0);
          for (int64_t j = 0; j < nq; ++j)
            for (int64_t t = 0; t < nk; ++t) mask[j * nk + t] = t <= j + nk - nq;
        }
        if (nq == 0) continue;
        reference::dense_attention(q, k, v, nq, nk, dc + dr, scale, mask, o, lse);
        for (int64_t j = 0; j < nq; ++j) {
          const int64_t row = c.qo_indptr[b] + j;
          if (nk == 0) {
            EXPECT_TRUE(std::isinf(r.lse_at(row, h)) && r.lse_at(row, h) < 0);
            for (int x = 0; x < dc; ++x) EXPECT_EQ(r.at(row, h, x), 0.0);
            continue;
          }
          EXPECT_NEAR(r.lse_at(row, h), lse[j], 1e-9) << b << " " << j << " " << h;
          for (int x = 0; x < dc; ++x) EXPECT_NEAR(r.at(row, h, x), o[j * (dc + dr) + x], 1e-9);
        }
      }
    }
  }
}

TEST(MlaReference, ArgumentsAreNamed) {
  const MlaCase c = make_case({1, 1}, {3, 5}, 2, 4, DType::kFloat16, 16, 8, 1);
  auto call = [&](std::vector<int32_t> qo, std::vector<int32_t> kv, std::vector<int32_t> ids, std::vector<int32_t> lens) {
    (void)reference::mla_paged(c.q_nope.view, c.q_pe.view, c.ckv.view, c.kpe.view, qo, kv, ids, lens, false);
  };
  EXPECT_THROW_MSG(call({0, 1}, c.kv_indptr, c.kv_indices, c.kv_lens), InvalidArgument, "qo_indptr");
  EXPECT_THROW_MSG(call(c.qo_indptr, {0, 1}, c.kv_indices, c.kv_lens), InvalidArgument, "kv_indptr");
  EXPECT_THROW_MSG(call(c.qo_indptr, c.kv_indptr, c.kv_indices, {3}), InvalidArgument, "kv_lens");
  EXPECT_THROW_MSG(call(c.qo_indptr, c.kv_indptr, c.kv_indices, {3, 9}), InvalidArgument, "kv_lens");
  EXPECT_THROW_MSG(call(c.qo_indptr, c.kv_indptr, {0, 9, 1}, c.kv_lens), InvalidArgument, "kv_indices");
  EXPECT_THROW_MSG((void)reference::mla_paged(c.q_nope.view, c.q_nope.view, c.ckv.view, c.kpe.view, c.qo_indptr,
                                              c.kv_indptr, c.kv_indices, c.kv_lens, false),
                   InvalidArgument, "kpe_cache");
}

// ---------------------------------------------------------------- plans

// The wrapper's plans (group = H, the tile's rows, causal clipping, chunks
// aligned to the KV tile) satisfy the planner's contract on random decode /
// MTP batches, for every tile configuration (the mma.sync kernel's and, every
// other batch, the Hopper kernel's 64- or 16-row tiles of 64 keys).
TEST(MlaPlan, RandomBatchesMeetThePlannerContract) {
  std::mt19937 rng(30);
  Planner planner;
  PrefillPlan plan;
  for (int iter = 0; iter < 200 && !::testing::Test::HasFailure(); ++iter) {
    const int H = std::vector<int>{16, 32, 64, 128}[rng() % 4];
    const MlaKernelConfig cfg = iter % 2 ? catalog::mla_sm90_config(std::vector<int>{16, 32, 64}[iter / 2 % 3])
                                         : catalog::mla_config(catalog::choose_mla_cta_q(H));
    const int cta_q = cfg.cta_q;
    const int batch = 1 + static_cast<int>(rng() % 64), q_len = 1 + static_cast<int>(rng() % 8);
    const bool causal = rng() % 2;
    const int ctas = 1 + static_cast<int>(rng() % 132);
    std::vector<int32_t> qo(batch, q_len), kv(batch);
    for (int32_t& k : kv) k = rng() % 5 == 0 ? static_cast<int32_t>(rng() % 3) : static_cast<int32_t>(rng() % 40000);
    if (causal)
      for (int32_t& k : kv) k = std::max(k, q_len);
    PlannerOptions opt;
    opt.chunk_align = std::max(opt.chunk_align, cfg.cta_kv);
    opt.unsplit_max_kv = 0;
    planner.plan_prefill(qo, kv, H, cta_q, causal, ctas, opt, plan);
    SCOPED_TRACE("iter " + std::to_string(iter) + " H " + std::to_string(H) + " batch " + std::to_string(batch) +
                 " q_len " + std::to_string(q_len));
    const auto tiles = test::prefill_tiles(qo, kv, H, cta_q, causal, opt);
    const int64_t max_tiles = prefill_max_tiles(batch * q_len, batch, H, cta_q);
    test::check_plan(tiles, batch, ctas, opt, cta_q, true, plan, test::plan_items(plan),
                     {max_split_slots(ctas), max_split_tiles(ctas), prefill_max_items(max_tiles, ctas)});
    for (const auto& w : plan.items) {  // chunks start on KV tile boundaries (the kernel's tiles)
      EXPECT_EQ(w.kv_start % cfg.cta_kv, 0);
    }
  }
}

TEST(Jit, MlaBuiltinsCompile) {
  jit::KernelCache cache;
  const auto kernels = catalog::builtin_mla_kernels();
  for (const char* arch : {"sm_80", "sm_90a"}) {
    cache.precompile(kernels, jit::Arch::parse(arch), 2);
    for (const auto& k : kernels) EXPECT_TRUE(test::is_elf(cache.cubin(k, jit::Arch::parse(arch))->image)) << k.entry;
  }
}

}  // namespace
}  // namespace tessera
