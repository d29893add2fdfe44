// Head dims beyond 64 / 128 / 256 without a GPU: head_dim_qk != head_dim_vo
// (DeepSeek's 192 / 128) and head dim 512 (Gemma 3). Which specs each kernel
// family takes and the errors naming the argument, the FA2 tiles they get
// (shared memory, the 512 / 256 kernel run twice), kernel names carrying
// both dims, NVRTC compiles of every new instantiation, paged storage with a
// narrower V, and the CPU path against the float64 reference.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

#include "jit_util.hpp"
#include "tessera/api/append_kv.hpp"
#include "tessera/api/decode.hpp"
#include "tessera/api/prefill.hpp"
#include "tessera/core/error.hpp"
#include "tessera/cpu/attention.hpp"
#include "tessera/formats/paged_kv.hpp"
#include "tessera/formats/ragged.hpp"
#include "tessera/reference/attention.hpp"
#include "tessera/runtime/jit.hpp"
#include "tessera/runtime/prefill_catalog.hpp"
#include "test_util.hpp"

using namespace tessera;
using namespace tessera::test;

namespace {

AttentionSpec spec_of(int qk, int vo, DType t = DType::kFloat16, VariantSpec v = variants::standard()) {
  return AttentionSpec{std::move(v), t, t, t, qk, vo};
}

}  // namespace

TEST(HeadDims, SpecsAcceptExactlyTheSupportedPairs) {
  for (int d : {64, 128, 256, 512}) {
    EXPECT_NO_THROW(validate_spec(spec_of(d, 0))) << d;
    EXPECT_NO_THROW(validate_spec(spec_of(d, d))) << d;
  }
  EXPECT_NO_THROW(validate_spec(spec_of(192, 128)));
  for (int d : {32, 96, 192, 384, 1024}) EXPECT_THROW_MSG(validate_spec(spec_of(d, 0)), InvalidArgument, "head_dim: ");
  for (auto [qk, vo] : {std::pair{128, 64}, {192, 64}, {256, 128}, {512, 256}, {128, 192}})
    EXPECT_THROW_MSG(validate_spec(spec_of(qk, vo)), InvalidArgument, "head_dim_qk, head_dim_vo");
  EXPECT_THROW_MSG(validate_spec(spec_of(128, -1)), InvalidArgument, "head_dim_vo");
  // Equal dims keep their spec text (it is in every kernel source, hence cache keys).
  EXPECT_EQ(spec_of(128, 128).str(), spec_of(128, 0).str());
  EXPECT_EQ(spec_of(128, 0).str().find("dvo"), std::string::npos);
  EXPECT_NE(spec_of(192, 128).str().find("/d=192/dvo=128"), std::string::npos);
}

// The kernels other than the FA2 prefill template take equal 64 / 128 / 256
// and say where the others run.
TEST(HeadDims, OtherKernelFamiliesRefuseByName) {
  for (const AttentionSpec& s : {spec_of(512, 0), spec_of(192, 128)}) {
    const char* name = s.dims_equal() ? "head_dim: " : "head_dim_vo: ";
    EXPECT_THROW_MSG(catalog::batch_decode(s, 4), InvalidArgument, name);
    EXPECT_THROW_MSG(catalog::attention_rowwise(s), InvalidArgument, name);
    for (int q : {64, 128}) EXPECT_FALSE(catalog::hopper_supported(s, q));
    EXPECT_THROW_MSG(catalog::prefill_config(s, 128, true), InvalidArgument, "backend");
  }
  EXPECT_TRUE(catalog::hopper_supported(spec_of(256, 0), 128));
}

// FA2 tiles: shared memory within a CTA's 227 KB, head dim 512 as two
// launches of the 512 / 256 kernel, and kernel names with both dims (equal
// dims keep their names).
TEST(HeadDims, Fa2TilesFitAndNameBothDims) {
  for (int q : {16, 32, 64, 128}) {
    SCOPED_TRACE("cta_q " + std::to_string(q));
    const PrefillConfig c512 = catalog::prefill_config(spec_of(512, 0), q);
    EXPECT_EQ(c512.head_dim_qk, 512);
    EXPECT_EQ(c512.head_dim_vo, 256);
    EXPECT_EQ(c512.vo_split, 2);
    EXPECT_EQ(c512.smem_bytes, 2 * (q * 512 + c512.stages * c512.cta_kv * (512 + 256)));
    EXPECT_LE(c512.smem_bytes + 4096, 227 * 1024);
    const PrefillConfig mla = catalog::prefill_config(spec_of(192, 128), q);
    EXPECT_EQ(mla.head_dim_qk, 192);
    EXPECT_EQ(mla.head_dim_vo, 128);
    EXPECT_EQ(mla.vo_split, 1);
    EXPECT_EQ(mla.smem_bytes, 2 * (q * 192 + mla.stages * mla.cta_kv * (192 + 128)));
    EXPECT_LE(mla.smem_bytes, 227 * 1024);
    const PrefillConfig d128 = catalog::prefill_config(spec_of(128, 0), q);
    EXPECT_EQ(d128.vo_split, 1);
    EXPECT_EQ(d128.smem_bytes, 2 * (q * 128 + d128.stages * 2 * d128.cta_kv * 128));
    const std::string e512 = catalog::batch_prefill(spec_of(512, 0), q).entry;
    EXPECT_NE(e512.find("_d512v256_q" + std::to_string(q)), std::string::npos) << e512;
    const std::string emla = catalog::batch_prefill(spec_of(192, 128), q).entry;
    EXPECT_NE(emla.find("_d192v128_q" + std::to_string(q)), std::string::npos) << emla;
    const jit::KernelSource k128 = catalog::batch_prefill(spec_of(128, 0), q);
    EXPECT_NE(k128.entry.find("_d128_q" + std::to_string(q)), std::string::npos) << k128.entry;
    // The template gets both dims: <..., 128, 128, cta_q, ...> for equal ones.
    EXPECT_NE(k128.source.find(", 128, 128, " + std::to_string(q) + ", "), std::string::npos);
    EXPECT_EQ(k128.source, catalog::batch_prefill(spec_of(128, 128), q).source);
  }
  // Partial states hold one launch's V / O features.
  EXPECT_EQ(catalog::prefill_launch_vo(spec_of(512, 0)), 256);
  EXPECT_EQ(catalog::prefill_launch_vo(spec_of(192, 128)), 128);
  EXPECT_EQ(catalog::prefill_launch_vo(spec_of(256, 0)), 256);
  // Head dim 512's two launches number V / O columns from 0 each: per-column
  // value and output transforms are refused.
  const VariantSpec scaled{"Scaled", "struct Scaled : tessera::VariantBase {\n  using VariantBase::VariantBase;\n"
                                     "  template <typename P> __device__ float OutputTransform(const P&, float o, int, int, "
                                     "int, int col) const { return col < 8 ? o : 0.f; }\n};"};
  EXPECT_THROW_MSG(catalog::prefill_config(spec_of(512, 0, DType::kFloat16, scaled), 64), InvalidArgument, "variant");
  EXPECT_NO_THROW(catalog::prefill_config(spec_of(256, 0, DType::kFloat16, scaled), 64));
  // A tile override is checked against both dims.
  EXPECT_THROW_MSG(catalog::prefill_config(spec_of(512, 0), 64, false, {.cta_kv = 128}), InvalidArgument, "tile");
  // Unequal dims copy rows threads / 8 apart: one warp (4 rows) is refused.
  EXPECT_THROW_MSG(catalog::prefill_config(spec_of(192, 128), 64, false, {.warps_q = 1}), InvalidArgument, "tile.cta_kv");
  EXPECT_NO_THROW(catalog::prefill_config(spec_of(128, 0), 64, false, {.warps_q = 1}));
}

// Every new FA2 instantiation compiles under NVRTC: both head-dim pairs,
// fp16 / bf16, every query tile (sm_80; the 64-row one for sm_90a too), and
// the variants whose code touches head dims (RoPE's halves, a cap with a
// window, a custom mask).
TEST(HeadDims, Fa2KernelsCompile) {
  jit::KernelCache cache;  // the run's shared cache
  std::vector<jit::KernelSource> ampere;
  for (DType t : {DType::kFloat16, DType::kBFloat16})
    for (int q : {16, 32, 64, 128}) {
      ampere.push_back(catalog::batch_prefill(spec_of(512, 0, t, variants::causal()), q));
      ampere.push_back(catalog::batch_prefill(spec_of(192, 128, t, variants::causal()), q));
    }
  using variants::PosEncoding;
  for (const VariantSpec& v : {variants::from_plan_options(true, 100, 30.f, PosEncoding::kRopeLlama),
                               variants::custom_mask(), variants::from_plan_options(false, 64, 50.f)}) {
    ampere.push_back(catalog::batch_prefill(spec_of(512, 0, DType::kBFloat16, v), 16));
    ampere.push_back(catalog::batch_prefill(spec_of(192, 128, DType::kFloat16, v), 64));
  }
  const jit::Arch sm80 = jit::Arch::parse("sm_80"), sm90 = jit::Arch::parse("sm_90a");
  cache.precompile(ampere, sm80, 2);
  for (const auto& k : ampere) EXPECT_TRUE(is_elf(cache.cubin(k, sm80)->image)) << k.entry;
  const std::vector<jit::KernelSource> hopper = {catalog::batch_prefill(spec_of(512, 0), 64),
                                                 catalog::batch_prefill(spec_of(192, 128), 64)};
  cache.precompile(hopper, sm90, 2);
  for (const auto& k : hopper) EXPECT_TRUE(is_elf(cache.cubin(k, sm90)->image)) << k.entry;
}

// Batch decode: head dim 512 runs on the tensor-core path whatever
// use_tensor_cores says; what only the CUDA-core kernel does names head_dim.
TEST(HeadDims, DecodeOf512RoutesToTensorCores) {
  const TaskInfo task{8, 2, 16, KVLayout::kNHD, 4, 64};
  const AttentionSpec d512 = spec_of(512, 0);
  for (bool tc : {false, true}) {
    DecodeOptions opt;
    opt.use_tensor_cores = tc;
    EXPECT_TRUE(BatchDecode::runs_on_tensor_cores(d512, opt, 0));
    TaskInfo t = task;
    t.max_total_q = t.max_batch;
    DecodeOptions as_tc = opt;
    as_tc.use_tensor_cores = true;
    EXPECT_GT(BatchDecode::workspace_size(d512, task, 132, opt).device_bytes, 0u);
    EXPECT_EQ(BatchDecode::workspace_size(d512, task, 132, opt).device_bytes,
              BatchDecode::workspace_size(d512, task, 132, as_tc).device_bytes);
  }
  DecodeOptions cc;
  cc.cuda_cores = true;
  EXPECT_THROW_MSG(BatchDecode::workspace_size(d512, task, 132, cc), InvalidArgument, "head_dim: 512");
  DecodeOptions tuned;
  tuned.tile = 32;
  EXPECT_THROW_MSG(BatchDecode::workspace_size(d512, task, 132, tuned), InvalidArgument, "head_dim: 512");
  AttentionSpec fp8 = d512;
  fp8.kv_dtype = DType::kFloat8E4M3;
  EXPECT_THROW_MSG(BatchDecode::workspace_size(fp8, task, 132, {}), InvalidArgument, "head_dim: 512");
  AttentionSpec mixed = d512;
  mixed.kv_dtype = DType::kBFloat16;
  EXPECT_THROW_MSG(BatchDecode::workspace_size(mixed, task, 132, {}), InvalidArgument, "head_dim: 512");
  AttentionSpec user = d512;
  user.variant = VariantSpec{"Mine", "struct Mine : tessera::VariantBase {};"};
  EXPECT_THROW_MSG(BatchDecode::workspace_size(user, task, 132, {}), InvalidArgument, "head_dim: 512");
  DecodeOptions user_tc;
  user_tc.use_tensor_cores = true;
  EXPECT_NO_THROW(BatchDecode::workspace_size(user, task, 132, user_tc));
  // Head dims the CUDA-core kernel takes keep the flag's meaning.
  EXPECT_FALSE(BatchDecode::runs_on_tensor_cores(spec_of(256, 0), cc, 0));
}

// A paged cache with a narrower V (separate tensors): V keeps strides of its
// own; one interleaved tensor cannot hold 192 / 128.
TEST(HeadDims, PagedStorageTakesANarrowerV) {
  HostTensor k = make_host(DType::kFloat16, {3, 16, 2, 192}), v = make_host(DType::kFloat16, {3, 16, 2, 128});
  const PagedKVStorage nhd(k.view, v.view, KVLayout::kNHD);
  EXPECT_EQ(nhd.head_dim(), 192);
  EXPECT_EQ(nhd.v_head_dim(), 128);
  EXPECT_EQ(nhd.token_stride(), 2 * 192);
  EXPECT_EQ(nhd.v_token_stride(), 2 * 128);
  EXPECT_EQ(nhd.v_page_stride(), 16 * 2 * 128);
  EXPECT_EQ(nhd.v_head_stride(), 128);
  const PagedKVStorage hnd(k.view, v.view, KVLayout::kHND);  // [pages, 16 heads, 2 tokens, D] read as HND
  EXPECT_EQ(hnd.v_head_stride(), 2 * 128);
  EXPECT_EQ(hnd.v_token_stride(), 128);
  const device::PagedKV view = PagedKVCache(nhd, PageTable({0, 1}, {2}, {5}, 16, 3)).device_view(nullptr, nullptr, nullptr);
  EXPECT_EQ(view.token_stride, 2 * 192);
  EXPECT_EQ(view.v_token_stride, 2 * 128);
  // One head dim: V's strides are K's.
  HostTensor v192 = make_host(DType::kFloat16, {3, 16, 2, 192});
  const PagedKVStorage same(k.view, v192.view, KVLayout::kNHD);
  EXPECT_EQ(same.v_head_dim(), 192);
  EXPECT_EQ(same.v_token_stride(), same.token_stride());
  HostTensor v64 = make_host(DType::kFloat16, {3, 16, 2, 64});
  EXPECT_THROW_MSG(PagedKVStorage(k.view, v64.view, KVLayout::kNHD), InvalidArgument, "v:");
  HostTensor v_heads = make_host(DType::kFloat16, {3, 16, 4, 128});
  EXPECT_THROW_MSG(PagedKVStorage(k.view, v_heads.view, KVLayout::kNHD), InvalidArgument, "v:");
  HostTensor kv192 = make_host(DType::kFloat16, {3, 2, 16, 2, 192});
  EXPECT_THROW_MSG(PagedKVStorage(kv192.view, KVLayout::kNHD), InvalidArgument, "kv:");
  HostTensor k512 = make_host(DType::kBFloat16, {2, 2, 16, 1, 512});
  EXPECT_EQ(PagedKVStorage(k512.view, KVLayout::kNHD).head_dim(), 512);
  // Appends take K rows of k's width and V rows of v's (test_append_kv.cpp).
  HostTensor rows = make_host(DType::kFloat16, {1, 2, 192});
  EXPECT_THROW_MSG(append_paged_kv_cache(rows.view, rows.view, {}, {}, nhd, {}, {}, {}), InvalidArgument,
                   "append_value");
}

// The CPU path (float accumulation, the Python single_prefill on host
// tensors) against the float64 reference, for both new shapes, causal with
// a window; and the reference's paged form with a narrower V against its
// ragged form.
TEST(HeadDims, CpuPathAndReferenceAgree) {
  std::mt19937_64 rng(7);
  for (auto [qk, vo] : {std::pair{192, 128}, {512, 512}}) {
    SCOPED_TRACE(std::to_string(qk) + "/" + std::to_string(vo));
    const std::vector<int32_t> qo{0, 3, 10}, kv{0, 20, 29};
    HostTensor q = make_host(DType::kFloat32, {10, 4, qk}), k = make_host(DType::kFloat16, {29, 2, qk}),
               v = make_host(DType::kFloat16, {29, 2, vo});
    fill_random(q, rng());
    fill_random(k, rng());
    fill_random(v, rng());
    reference::Options ro;
    ro.causal = true;
    ro.window_left = 6;
    const reference::Result ref = reference::attention_ragged(q.view, RaggedIndex(qo), k.view, v.view, RaggedIndex(kv), ro);
    EXPECT_EQ(ref.head_dim, vo);
    HostTensor o = make_host(DType::kFloat32, {10, 4, vo}), lse = make_host(DType::kFloat32, {10, 4});
    cpu::AttentionOptions co;
    co.causal = true;
    co.window_left = 6;
    cpu::attention_ragged(q.view, qo, k.view, v.view, kv, co, o.view, lse.view);
    const std::vector<double> got = to_doubles(o.view), got_lse = to_doubles(lse.view);
    double err = 0, top = 0;
    for (size_t i = 0; i < got.size(); ++i) {
      err = std::max(err, std::abs(got[i] - ref.o[i]));
      top = std::max(top, std::abs(ref.o[i]));
    }
    EXPECT_LT(err, 1e-5 * top);
    for (size_t i = 0; i < got_lse.size(); ++i) EXPECT_NEAR(got_lse[i], ref.lse[i], 1e-4);
    // Default sm_scale: 1 / sqrt(head_dim_qk).
    reference::Options scaled = ro;
    scaled.sm_scale = 1.0 / std::sqrt(double(qk));
    EXPECT_EQ(reference::attention_ragged(q.view, RaggedIndex(qo), k.view, v.view, RaggedIndex(kv), scaled).lse,
              ref.lse);
    // o with q's head dim where v's differs is refused by name.
    if (qk != vo) {
      HostTensor bad = make_host(DType::kFloat32, {10, 4, qk});
      EXPECT_THROW_MSG(cpu::attention_ragged(q.view, qo, k.view, v.view, kv, co, bad.view, lse.view), InvalidArgument,
                       "o:");
    }
  }
  // Paged 192 / 128 (pages of 4 tokens, shuffled) equals ragged.
  const int64_t ps = 4, pages = 6;
  HostTensor kp = make_host(DType::kFloat16, {pages, ps, 2, 192}), vp = make_host(DType::kFloat16, {pages, ps, 2, 128});
  fill_random(kp, rng());
  fill_random(vp, rng());
  const std::vector<int32_t> order{4, 1, 5, 0, 2};  // request 0: pages 4, 1, 5 (last 3 tokens); request 1: 0, 2
  const PagedKVCache cache(PagedKVStorage(kp.view, vp.view, KVLayout::kNHD), PageTable({0, 3, 5}, order, {3, 4}, ps, pages));
  const std::vector<int32_t> qo{0, 2, 5}, kv{0, 11, 19};
  HostTensor q = make_host(DType::kFloat16, {5, 4, 192}), kr = make_host(DType::kFloat16, {19, 2, 192}),
             vr = make_host(DType::kFloat16, {19, 2, 128});
  fill_random(q, rng());
  int64_t row = 0;
  for (int64_t b = 0; b < 2; ++b)
    for (int64_t pos = 0; pos < kv[b + 1] - kv[b]; ++pos, ++row) {
      const int64_t page = order[(b == 0 ? 0 : 3) + pos / ps], slot = pos % ps;
      for (int64_t h = 0; h < 2; ++h) {
        std::memcpy(static_cast<char*>(kr.view.data) + ((row * 2 + h) * 192) * 2,
                    static_cast<const char*>(kp.view.data) + (((page * ps + slot) * 2 + h) * 192) * 2, 192 * 2);
        std::memcpy(static_cast<char*>(vr.view.data) + ((row * 2 + h) * 128) * 2,
                    static_cast<const char*>(vp.view.data) + (((page * ps + slot) * 2 + h) * 128) * 2, 128 * 2);
      }
    }
  reference::Options ro;
  ro.causal = true;
  const auto paged = reference::attention_paged(q.view, RaggedIndex(qo), cache, ro);
  const auto ragged = reference::attention_ragged(q.view, RaggedIndex(qo), kr.view, vr.view, RaggedIndex(kv), ro);
  EXPECT_EQ(paged.o, ragged.o);
  EXPECT_EQ(paged.lse, ragged.lse);
}
