// fp8 KV caches on the host: the e4m3 / e5m2 conversions against independent
// oracles (every code; rounding checked by a nearest-value search), the
// validation that admits fp8 K / V only where a kernel reads it and names
// q_dtype / kv_dtype otherwise, the CPU attention and the reference on fp8
// K / V with scales, and the quantizing CPU append.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <tuple>

#include "append_kv_util.hpp"
#include "fake_workspace.hpp"
#include "jit_util.hpp"
#include "tessera/api/append_kv.hpp"
#include "tessera/api/cascade.hpp"
#include "tessera/api/decode.hpp"
#include "tessera/api/prefill.hpp"
#include "tessera/cpu/attention.hpp"
#include "tessera/reference/attention.hpp"
#include "tessera/runtime/kernel_catalog.hpp"
#include "tessera/abi/shared_memory.cuh"
#include "tessera/runtime/cuda.hpp"
#include "tessera/runtime/prefill_catalog.hpp"

using namespace tessera;
using namespace tessera::test;

namespace {

constexpr DType kE4M3 = DType::kFloat8E4M3, kE5M2 = DType::kFloat8E5M2;

TEST(Fp8Dtype, NamesSizesTags) {
  EXPECT_STREQ(dtype_name(kE4M3), "float8_e4m3fn");
  EXPECT_STREQ(dtype_name(kE5M2), "float8_e5m2");
  EXPECT_EQ(dtype_size(kE4M3), 1u);
  EXPECT_EQ(dtype_size(kE5M2), 1u);
  EXPECT_STREQ(dtype_device_name(kE4M3), "tessera::fp8_e4m3_t");
  EXPECT_EQ(catalog::dtype_tag(kE5M2), "e5m2");
  EXPECT_TRUE(is_fp8(kE4M3) && is_fp8(kE5M2) && !is_fp8(DType::kFloat16) && !is_fp8(DType::kUInt8));
  EXPECT_EQ(fp8_max(kE4M3), 448.f);
  EXPECT_EQ(fp8_max(kE5M2), 57344.f);
}

// e5m2 is the top byte of the fp16 of the same value; e4m3's exponent and
// mantissa bits placed into an fp16 one bit lower read 2^-8 of the value (the
// identity the sm_80 kernels widen with).
TEST(Fp8Dtype, EveryCodeDecodes) {
  for (int c = 0; c < 256; ++c) {
    const float e5 = fp8_to_float(static_cast<uint8_t>(c), kE5M2), h5 = half_to_float(static_cast<uint16_t>(c << 8));
    EXPECT_TRUE(e5 == h5 || (std::isnan(e5) && std::isnan(h5))) << c;
    const float e4 = fp8_to_float(static_cast<uint8_t>(c), kE4M3);
    if ((c & 0x7f) == 0x7f) {
      EXPECT_TRUE(std::isnan(e4)) << c;
      continue;
    }
    const uint16_t bits = static_cast<uint16_t>(((c & 0x80) << 8) | ((c & 0x7f) << 7));
    EXPECT_EQ(e4, half_to_float(bits) * 256.f) << c;
  }
  EXPECT_EQ(fp8_to_float(0x38, kE4M3), 1.f);
  EXPECT_EQ(fp8_to_float(0x01, kE4M3), std::ldexp(1.f, -9));
  EXPECT_EQ(fp8_to_float(0x7e, kE4M3), 448.f);
  EXPECT_EQ(fp8_to_float(0x3c, kE5M2), 1.f);
  EXPECT_TRUE(std::isinf(fp8_to_float(0x7c, kE5M2)));
}

// The nearest finite code by search (ties to the even code), saturating
// beyond the largest finite value: an oracle independent of the arithmetic.
uint8_t nearest_code(float x, DType t) {
  if (std::isnan(x)) return 0x7f;
  const uint8_t sign = std::signbit(x) ? 0x80 : 0;
  const double a = std::fabs(static_cast<double>(x));
  int best = 0;
  double best_err = INFINITY;
  for (int c = 0; c < 128; ++c) {
    const float v = fp8_to_float(static_cast<uint8_t>(c), t);
    if (!std::isfinite(v)) continue;
    const double err = std::fabs(a - v);
    if (err < best_err || (err == best_err && (c & 1) == 0)) best = c, best_err = err;
  }
  return sign | static_cast<uint8_t>(best);
}

TEST(Fp8Dtype, RoundsToNearestEvenAndSaturates) {
  for (DType t : {kE4M3, kE5M2}) {
    SCOPED_TRACE(dtype_name(t));
    for (int c = 0; c < 256; ++c) {  // every finite code round-trips, and each midpoint goes to the even side
      const float v = fp8_to_float(static_cast<uint8_t>(c), t);
      if (!std::isfinite(v)) continue;
      EXPECT_EQ(float_to_fp8(v, t), c) << c;
      const float next = fp8_to_float(static_cast<uint8_t>(c + 1), t);
      if ((c & 0x7f) < 0x7f && std::isfinite(next) && (c & 0x7f) != (t == kE4M3 ? 0x7e : 0x7b)) {
        const float mid = 0.5f * (v + next);
        EXPECT_EQ(float_to_fp8(mid, t), nearest_code(mid, t)) << c;
      }
    }
    std::mt19937_64 rng(7);
    std::uniform_real_distribution<float> e(-24.f, 18.f);
    for (int i = 0; i < 20000; ++i) {
      const float x = std::exp2(e(rng)) * (rng() % 2 ? -1.f : 1.f);
      ASSERT_EQ(float_to_fp8(x, t), nearest_code(x, t)) << x;
    }
    EXPECT_EQ(float_to_fp8(1e30f, t), t == kE4M3 ? 0x7e : 0x7b);
    EXPECT_EQ(float_to_fp8(-INFINITY, t), t == kE4M3 ? 0xfe : 0xfb);
    EXPECT_EQ(float_to_fp8(std::numeric_limits<float>::quiet_NaN(), t), 0x7f);
  }
  EXPECT_EQ(float_to_fp8(464.f, kE4M3), 0x7e);  // between 448 and 480 (NaN code): saturates
}

// ------------------------------------------------------------------ validation
AttentionSpec fp8_spec(DType q = DType::kFloat16, DType kv = kE4M3, int d = 128) {
  return {variants::standard(), q, kv, q, d};
}
TaskInfo task() { return {8, 2, 16, KVLayout::kNHD, 4, 64, 64}; }

TEST(Fp8Validation, KvOnly) {
  validate_spec(fp8_spec());
  validate_spec(fp8_spec(DType::kBFloat16, kE5M2, 64));
  EXPECT_THROW_MSG(validate_spec(fp8_spec(kE4M3, kE4M3)), TypeMismatch, "q_dtype");
  AttentionSpec o8 = fp8_spec();
  o8.o_dtype = kE5M2;
  EXPECT_THROW_MSG(validate_spec(o8), TypeMismatch, "o_dtype");
}

// The tensor-core prefill (FA2 template, hence decode with use_tensor_cores)
// takes fp8 caches; the Hopper template, unequal / 512 head dims and cascade
// refuse them naming kv_dtype.
TEST(Fp8Validation, TensorCoreFamiliesTakeFp8) {
  FakeWorkspace f;
  EXPECT_NO_THROW(BatchPrefill(fp8_spec(), task(), f.ws));
  EXPECT_GT(BatchPrefill::workspace_size(fp8_spec(), task(), 132).device_bytes, 0u);
  EXPECT_NO_THROW(catalog::batch_prefill(fp8_spec(DType::kBFloat16, kE5M2), 64));
  EXPECT_NO_THROW(catalog::batch_prefill(fp8_spec(DType::kBFloat16, kE5M2), 64, true));
  for (int q : {64, 128}) EXPECT_TRUE(catalog::hopper_supported(fp8_spec(), q));
  AttentionSpec mla = fp8_spec();
  mla.head_dim = 192;
  mla.head_dim_vo = 128;
  EXPECT_THROW_MSG(catalog::batch_prefill(mla, 64), TypeMismatch, "kv_dtype");
  EXPECT_THROW_MSG(catalog::batch_prefill(fp8_spec(DType::kFloat16, kE4M3, 512), 16), TypeMismatch, "kv_dtype");
  DecodeOptions tc;
  tc.use_tensor_cores = true;
  EXPECT_NO_THROW(BatchDecode(fp8_spec(), task(), f.ws, tc));
  EXPECT_GT(BatchDecode::workspace_size(fp8_spec(), task(), 132, tc).device_bytes, 0u);
  const std::vector<AttentionSpec> levels = {fp8_spec(), fp8_spec()};
  EXPECT_GT(CascadeAttention::workspace_size(levels, task(), 132).device_bytes, 0u);  // levels on the FA2 kernel
}

// FA2 fp8 configurations: the kernel name carries q's and the cache's types;
// shared memory (abi/shared_memory.cuh) holds the Q tile and the fp8 stages,
// and for variants that transform K / V also the 16-bit stages they widen into.
TEST(Fp8Validation, Fa2PrefillConfig) {
  for (int d : {64, 128, 256})
    for (int q : {16, 32, 64, 128}) {
      const PrefillConfig f16 = catalog::prefill_config(fp8_spec(DType::kFloat16, DType::kFloat16, d), q);
      const PrefillConfig f8 = catalog::prefill_config(fp8_spec(DType::kFloat16, kE4M3, d), q);
      // 32 rows of head dim 128 per warp: 32-token KV tiles for fp8 (16-bit: 64).
      const bool rows32_d128 = d == 128 && q / f16.warps_q == 32;
      EXPECT_EQ(f8.cta_kv, rows32_d128 ? 32 : f16.cta_kv) << d << " " << q;
      const int staging = f8.stages * f8.cta_kv * 2 * d;
      EXPECT_EQ(f8.kv_tiles, Fa2KvTiles::kFp8);
      EXPECT_EQ(f8.smem_bytes, 2 * q * d + staging) << d << " " << q;
      const PrefillConfig wide = catalog::prefill_config({variants::rope(), DType::kFloat16, kE4M3, DType::kFloat16, d}, q);
      EXPECT_EQ(wide.kv_tiles, Fa2KvTiles::kFp8Widened);
      EXPECT_EQ(wide.smem_bytes, fa2_smem_bytes(d, d, q, wide.cta_kv, wide.stages, Fa2KvTiles::k16Bit) +
                                     wide.stages * wide.cta_kv * 2 * d) << d << " " << q;
      EXPECT_LE(wide.smem_bytes, 227 * 1024) << d << " " << q;
    }
  // Widened tiles are a kernel of their own.
  const jit::KernelSource rope_src =
      catalog::batch_prefill({variants::rope(), DType::kFloat16, kE4M3, DType::kFloat16, 128}, 16);
  EXPECT_NE(rope_src.entry.find("_wide"), std::string::npos) << rope_src.entry;
  EXPECT_EQ(catalog::batch_prefill(fp8_spec(), 16).entry.find("_wide"), std::string::npos);
  const jit::KernelSource src = catalog::batch_prefill(fp8_spec(DType::kBFloat16, kE5M2, 128), 64);
  EXPECT_EQ(src.entry.rfind("tessera_prefill_" + variants::standard().name + "_bf16e5m2_bf16_d128_q64_", 0), 0u)
      << src.entry;
  EXPECT_NE(src.source.find("tessera::fp8_e5m2_t"), std::string::npos);
  // 16-bit caches keep their names.
  EXPECT_EQ(catalog::batch_prefill(fp8_spec(DType::kBFloat16, DType::kBFloat16, 128), 64)
                .entry.rfind("tessera_prefill_" + variants::standard().name + "_bf16_bf16_d128_q64_", 0),
            0u);
}

// The wrapper's pick is the CUDA-core kernel (dtypes differ), on every device.
// The wrapper's pick for an fp8 cache: the tensor cores on sm_90 (16-row
// tiles of the FA2 template), else the CUDA-core kernel; asked-for CUDA-core
// tuning keeps that kernel everywhere. The workspace has room for either.
TEST(Fp8Validation, DecodeKernelPick) {
  const bool sm90 = cuda::gpu_available() && cuda::device_info(0).major == 9;
  EXPECT_EQ(BatchDecode::runs_on_tensor_cores(fp8_spec(), {}, 0), sm90);
  DecodeOptions cc;
  cc.heads_per_thread = 2;
  EXPECT_FALSE(BatchDecode::runs_on_tensor_cores(fp8_spec(), cc, 0));
  DecodeOptions tc;
  tc.use_tensor_cores = true;
  const size_t both = BatchDecode::workspace_size(fp8_spec(), task(), 132).device_bytes;
  EXPECT_GE(both, BatchDecode::workspace_size(fp8_spec(), task(), 132, tc).device_bytes);
  EXPECT_GE(both, BatchDecode::workspace_size(fp8_spec(), task(), 132, cc).device_bytes);
}

// One stage of K and V stays ~16 KB: twice the tokens of fp16; 16 features a lane.
TEST(Fp8Validation, DecodeTile) {
  for (int d : {64, 128, 256})
    for (int g : {1, 4, 8}) {
      const DecodeConfig f16 = catalog::decode_config(fp8_spec(DType::kFloat16, DType::kFloat16, d), g);
      const DecodeConfig f8 = catalog::decode_config(fp8_spec(DType::kFloat16, kE4M3, d), g);
      EXPECT_EQ(f8.tile, 2 * f16.tile) << d << " " << g;
      EXPECT_GE(f8.smem_bytes, 32768) << d << " " << g;
      EXPECT_LE(f8.smem_bytes, 40000) << d << " " << g;
    }
  const jit::KernelSource src = catalog::batch_decode(fp8_spec(DType::kBFloat16, kE5M2, 128), 4);
  // fp8 caches default to 2 query heads per thread (the _h2 suffix); 16-bit ones to 4.
  EXPECT_EQ(src.entry, "tessera_decode_" + variants::standard().name + "_bf16_e5m2_bf16_d128_g4_t64_s2_h2");
  EXPECT_EQ(catalog::decode_config(fp8_spec(DType::kFloat16, kE4M3, 128), 4).heads_per_thread, 2);
  EXPECT_EQ(catalog::decode_config(fp8_spec(DType::kFloat16, DType::kFloat16, 128), 4).heads_per_thread, 4);
  EXPECT_NE(src.source.find("tessera::fp8_e5m2_t"), std::string::npos);
}

TEST(Fp8Validation, BuiltinsIncludeFp8Kernels) {
  int decode = 0, rowwise = 0, append = 0;
  for (const auto& k : catalog::builtin_kernels()) {
    if (k.entry.find("_e4m3_") == std::string::npos && k.entry.find("_e5m2_") == std::string::npos &&
        k.entry.find("to_e") == std::string::npos)
      continue;
    decode += k.entry.rfind("tessera_decode_", 0) == 0;
    rowwise += k.entry.rfind("tessera_rowwise_", 0) == 0;
    append += k.entry.rfind("tessera_append_", 0) == 0;
  }
  EXPECT_EQ(decode, 36);   // q f16 / bf16 x e4m3 / e5m2 x d 64 / 128 / 256 x group 1 / 4 / 8
  EXPECT_EQ(rowwise, 12);
  EXPECT_EQ(append, 4);
}

// ------------------------------------------------------------------ CPU attention
// fp8 K / V with scales against (a) the reference on the same fp8 tensors and
// (b) the reference on float32 copies holding the dequantized values.
TEST(Fp8CpuAttention, MatchesReferenceOnDequantizedKv) {
  const std::vector<int32_t> qo{0, 1, 2, 3}, kv{0, 70, 70, 300};  // request 1: no keys
  const int64_t Hq = 8, Hkv = 2, D = 64, keys = kv.back();
  for (DType t : {kE4M3, kE5M2}) {
    SCOPED_TRACE(dtype_name(t));
    HostTensor q = make_host(DType::kFloat16, {3, Hq, D}), k = make_host(t, {keys, Hkv, D}), v = make_host(t, {keys, Hkv, D});
    fill_random(q, 1, -2.f, 2.f);
    fill_random(k, 2, -200.f, 200.f);
    fill_random(v, 3, -200.f, 200.f);
    const double ks = 0.0078125, vs = 0.00390625;  // powers of two: the float32 copies are exact
    HostTensor kf = make_host(DType::kFloat32, {keys, Hkv, D}), vf = make_host(DType::kFloat32, {keys, Hkv, D});
    for (size_t i = 0; i < kf.storage_elems(); ++i) {
      kf.set(i, static_cast<float>(k.get(i) * ks));
      vf.set(i, static_cast<float>(v.get(i) * vs));
    }
    reference::Options ro;
    ro.k_scale = ks;
    ro.v_scale = vs;
    const auto ref = reference::attention_ragged(q.view, RaggedIndex(qo), k.view, v.view, RaggedIndex(kv), ro);
    const auto deq = reference::attention_ragged(q.view, RaggedIndex(qo), kf.view, vf.view, RaggedIndex(kv));
    EXPECT_EQ(ref.o, deq.o);
    EXPECT_EQ(ref.lse, deq.lse);

    cpu::AttentionOptions opt;
    opt.k_scale = ks;
    opt.v_scale = vs;
    HostTensor o = make_host(DType::kFloat32, {3, Hq, D}), lse = make_host(DType::kFloat32, {3, Hq});
    cpu::attention_ragged(q.view, qo, k.view, v.view, kv, opt, o.view, lse.view);
    double err = 0, mx = 0;
    for (size_t i = 0; i < ref.o.size(); ++i) {
      err = std::max(err, std::abs(o.get(i) - ref.o[i]));
      mx = std::max(mx, std::abs(ref.o[i]));
    }
    EXPECT_LT(err / mx, 1e-4);
    EXPECT_EQ(lse.get(Hq), -INFINITY);  // the request without keys
  }
}

TEST(Fp8CpuAttention, Errors) {
  HostTensor q = make_host(DType::kFloat16, {1, 2, 64}), k = make_host(kE4M3, {3, 1, 64}), v = make_host(kE5M2, {3, 1, 64});
  HostTensor o = make_host(DType::kFloat16, {1, 2, 64});
  EXPECT_THROW_MSG(cpu::attention_ragged(q.view, std::vector<int32_t>{0, 1}, k.view, v.view, std::vector<int32_t>{0, 3}, {},
                                         o.view, TensorView()),
                   TypeMismatch, "v");
  cpu::AttentionOptions bad;
  bad.k_scale = 0;
  EXPECT_THROW_MSG(cpu::attention_ragged(q.view, std::vector<int32_t>{0, 1}, k.view, k.view, std::vector<int32_t>{0, 3},
                                         bad, o.view, TensorView()),
                   InvalidArgument, "k_scale");
  HostTensor q8 = make_host(kE4M3, {1, 2, 64});
  EXPECT_THROW_MSG(cpu::attention_ragged(q8.view, std::vector<int32_t>{0, 1}, k.view, k.view, std::vector<int32_t>{0, 3},
                                         {}, o.view, TensorView()),
                   TypeMismatch, "q");
}

// ------------------------------------------------------------------ CPU append
void append_cpu(const AppendCase& c, AppendProblem& p, const AppendOptions& opt) {
  append_paged_kv_cache(p.key.view, p.value.view, AppendProblem::ints(p.batch_indices),
                        AppendProblem::ints(p.positions), p.storage(c), AppendProblem::ints(p.indices),
                        AppendProblem::ints(p.indptr), AppendProblem::ints(p.last), nullptr, opt);
}

class Fp8AppendCpu : public ::testing::TestWithParam<std::tuple<DType, DType, KVLayout, bool>> {};

// Quantized values (saturating where |x / scale| > max) land where the page
// table says, and nothing else changes; scale tensors multiply the floats.
TEST_P(Fp8AppendCpu, QuantizesIntoPlace) {
  const auto [rows, cache, layout, interleaved] = GetParam();
  AppendCase c;
  c.dt = rows;
  c.cache_dt = cache;
  c.layout = layout;
  c.interleaved = interleaved;
  c.page_size = 5;
  c.old_lens = {0, 5, 16, 31};
  c.add_lens = {3, 1, 2, 20};
  c.row_lo = -3.f, c.row_hi = 3.f;
  for (bool tensor : {false, true}) {
    SCOPED_TRACE(tensor ? "scale tensors" : "float scales");
    c.k_scale = 0.0125f;  // |3 / 0.0125| = 240: e4m3 saturates past 448 only for v
    c.v_scale = 0.005f;
    AppendProblem p = make_append_problem(c, 31);
    const AppendProblem want = expected_after_append(c, p);
    AppendOptions opt;
    float k_t = 0.5f, v_t = 2.f;  // tensor x float = the scales above
    HostTensor kt = make_host(DType::kFloat32, {1}), vt = make_host(DType::kFloat32, {1});
    kt.set(0, k_t);
    vt.set(0, v_t);
    if (tensor) {
      opt.k_scale = c.k_scale / k_t;
      opt.v_scale = c.v_scale / v_t;
      opt.k_scale_tensor = kt.view;
      opt.v_scale_tensor = vt.view;
    } else {
      opt.k_scale = c.k_scale;
      opt.v_scale = c.v_scale;
    }
    append_cpu(c, p, opt);
    expect_same_cache(c, p, want);
  }
}

INSTANTIATE_TEST_SUITE_P(All, Fp8AppendCpu,
                         ::testing::Combine(::testing::Values(DType::kFloat16, DType::kBFloat16),
                                            ::testing::Values(kE4M3, kE5M2),
                                            ::testing::Values(KVLayout::kNHD, KVLayout::kHND), ::testing::Bool()));

TEST(Fp8AppendCpuExtra, Fp8RowsAreCopiedBitForBit) {
  AppendCase c;
  c.dt = kE5M2;
  c.old_lens = {2, 0};
  c.add_lens = {7, 30};
  AppendProblem p = make_append_problem(c, 5);
  const AppendProblem want = expected_after_append(c, p);
  append_cpu(c, p, {});
  expect_same_cache(c, p, want);
}

TEST(Fp8AppendCpuExtra, Errors) {
  AppendCase c;
  c.dt = DType::kFloat16;
  c.cache_dt = kE4M3;
  c.old_lens = {2};
  c.add_lens = {3};
  AppendProblem p = make_append_problem(c, 5);
  AppendOptions o;
  o.k_scale = -1;
  EXPECT_THROW_MSG(append_cpu(c, p, o), InvalidArgument, "k_scale");
  o = {};
  HostTensor two = make_host(DType::kFloat32, {2}), f16 = make_host(DType::kFloat16, {1});
  o.v_scale_tensor = two.view;
  EXPECT_THROW_MSG(append_cpu(c, p, o), InvalidArgument, "v_scale_tensor");
  o.v_scale_tensor = f16.view;
  EXPECT_THROW_MSG(append_cpu(c, p, o), TypeMismatch, "v_scale_tensor");
  // A copy of the cache's own dtype takes no scale; fp8 rows go only into their own dtype.
  AppendCase same;
  same.old_lens = {2};
  same.add_lens = {3};
  AppendProblem q = make_append_problem(same, 5);
  o = {};
  o.k_scale = 2;
  EXPECT_THROW_MSG(append_cpu(same, q, o), InvalidArgument, "k_scale");
  AppendCase wrong = same;
  wrong.dt = kE4M3;
  wrong.cache_dt = DType::kFloat16;
  AppendProblem r = make_append_problem(wrong, 5);
  EXPECT_THROW_MSG(append_cpu(wrong, r, {}), TypeMismatch, "append_key");
  AppendCase mixed = c;
  mixed.cache_dt = kE5M2;
  AppendProblem m = make_append_problem(mixed, 5);
  m.value = make_host(DType::kBFloat16, {m.value.view.size(0), 2, 64});
  EXPECT_THROW_MSG(append_cpu(mixed, m, {}), TypeMismatch, "append_value");
}

}  // namespace

// ------------------------------------------------------------ FA2 fp8 prefill
// The fp8 instantiations of the FA2 template compile with NVRTC for sm_80
// (the software widening) and sm_90a (cvt instructions: the template sm_90
// runs for fp8 caches), for both q types, both formats, every head dim and
// query tile layout (16-row: 4 KV warps; 128-row head dim 256: 8 warps), and
// a variant with a logits transform and a window.
TEST(Fp8Prefill, Fa2KernelsCompile) {
  jit::KernelCache cache;
  const VariantSpec soft_cap_window = variants::from_plan_options(true, 64, 30.f);
  std::vector<jit::KernelSource> kernels;
  for (auto [q, kv, d, cta_q] : {std::tuple{DType::kFloat16, kE4M3, 128, 64}, {DType::kBFloat16, kE5M2, 128, 128},
                                 {DType::kFloat16, kE5M2, 64, 16}, {DType::kBFloat16, kE4M3, 256, 128}}) {
    AttentionSpec s = fp8_spec(q, kv, d);
    s.variant = variants::causal();
    kernels.push_back(catalog::batch_prefill(s, cta_q));
  }
  AttentionSpec o32 = fp8_spec(DType::kFloat16, kE4M3, 128);
  o32.o_dtype = DType::kFloat32;
  o32.variant = soft_cap_window;
  kernels.push_back(catalog::batch_prefill(o32, 32));
  for (const char* arch : {"sm_80", "sm_90a"}) {
    const jit::Arch a = jit::Arch::parse(arch);
    cache.precompile(kernels, a, 2);
    for (const auto& k : kernels) EXPECT_TRUE(is_elf(cache.cubin(k, a)->image)) << arch << " " << k.entry;
  }
}

// The Hopper template's fp8 instantiations: a two-tile staging ring after
// the V stages (abi/shared_memory.cuh), within the shared memory of one SM (two
// CTAs' for the 64-row tiles at head dims 64 / 128), no TMA for K / V, and
// q's type in the name; they compile for sm_90a, plain and with a
// transforming variant (RoPE on the keys in the producer).
TEST(Fp8Prefill, HopperKernelsCompile) {
  EXPECT_FALSE(catalog::hopper_supported(fp8_spec(DType::kFloat16, kE4M3, 256), 128));  // the FA2 template's
  EXPECT_THROW(catalog::prefill_config(fp8_spec(DType::kFloat16, kE4M3, 256), 128, true), InvalidArgument);
  for (int d : {64, 128, 256})
    for (int q : {64, 128}) {
      if (d == 256 && q == 128) continue;
      const PrefillConfig f16 = catalog::prefill_config(fp8_spec(DType::kFloat16, DType::kFloat16, d), q, true);
      const PrefillConfig f8 = catalog::prefill_config(fp8_spec(DType::kFloat16, kE4M3, d), q, true);
      EXPECT_TRUE(f8.hopper);
      EXPECT_EQ(f8.cta_kv, f16.cta_kv) << d << " " << q;
      EXPECT_EQ(f8.smem_bytes - sm90_smem_layout(d, q, f8.cta_kv, f8.stages, f8.v_stages, f8.q_bufs).dynamic_bytes,
                kSm90Fp8StagingTiles * f8.cta_kv * d);
      EXPECT_LE(f8.ctas_per_sm * (f8.smem_bytes + kSm90StaticSmemBound), 228 * 1024) << d << " " << q;
      EXPECT_GE(f8.ctas_per_sm, f16.ctas_per_sm - (d == 128 ? 0 : 1)) << d << " " << q;
    }
  jit::KernelCache cache;
  std::vector<jit::KernelSource> kernels;
  for (auto [q, kv, d, cta_q] : {std::tuple{DType::kFloat16, kE4M3, 128, 128}, {DType::kBFloat16, kE5M2, 128, 64},
                                 {DType::kFloat16, kE5M2, 64, 128}, {DType::kBFloat16, kE4M3, 256, 64}}) {
    AttentionSpec s = fp8_spec(q, kv, d);
    s.variant = variants::causal();
    kernels.push_back(catalog::batch_prefill(s, cta_q, true));
  }
  EXPECT_EQ(kernels[0].entry.rfind("tessera_prefill_" + variants::causal().name + "_f16e4m3_f16_d128_q128_", 0), 0u)
      << kernels[0].entry;
  AttentionSpec rope = fp8_spec(DType::kFloat16, kE4M3, 128);
  rope.variant = variants::from_plan_options(false, -1, 0.f, variants::PosEncoding::kRopeLlama);
  kernels.push_back(catalog::batch_prefill(rope, 128, true));
  const jit::Arch a = jit::Arch::parse("sm_90a");
  cache.precompile(kernels, a, 2);
  for (const auto& k : kernels) EXPECT_TRUE(is_elf(cache.cubin(k, a)->image)) << k.entry;
}

// fn() throws InvalidArgument whose message contains `words`.
template <typename Fn>
void expect_refused(Fn fn, const std::string& words) {
  try {
    fn();
    ADD_FAILURE() << "no error, expected one naming " << words;
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find(words), std::string::npos) << e.what();
  }
}

// fp8 tensor cores (PrefillOptions::fp8_mma): 128-key tiles, one CTA per SM,
// fp8 K / V stages and the quantized Q tile in the layout the kernel uses;
// refused by name where it does not apply; compiles for sm_90a.
TEST(Fp8Prefill, Fp8TensorCoreKernels) {
  const AttentionSpec spec = fp8_spec(DType::kFloat16, kE4M3, 128);
  for (int q : {64, 128}) {
    const PrefillConfig c = catalog::prefill_config(spec, q, true, {}, true);
    EXPECT_TRUE(c.hopper && c.fp8_mma);
    EXPECT_EQ(c.cta_kv, 128);
    EXPECT_EQ(c.ctas_per_sm, 1);
    EXPECT_EQ(c.smem_bytes, sm90_smem_layout(128, q, 128, c.stages, c.v_stages, c.q_bufs, kSm90Fp8StagingTiles, true)
                                .dynamic_bytes);
    EXPECT_LE(c.smem_bytes + kSm90StaticSmemBound, 227 * 1024);
  }
  expect_refused([] { catalog::prefill_config(fp8_spec(DType::kFloat16, DType::kFloat16, 128), 128, true, {}, true); },
          "fp8_mma: fp8 tensor cores need an fp8 kv_dtype");
  expect_refused([] { catalog::prefill_config(fp8_spec(DType::kFloat16, kE4M3, 64), 128, true, {}, true); },
          "fp8_mma: fp8 tensor cores take head_dim 128");
  expect_refused([&] { catalog::prefill_config(spec, 64, false, {}, true); }, "fp8_mma: fp8 tensor cores run on the Hopper");
  expect_refused([&] { catalog::prefill_config(spec, 128, true, PrefillTile{64, 0, 0, 0}, true); }, "tile.cta_kv");
  expect_refused([&] { catalog::batch_prefill(spec, 128, true, 2, {}, true); }, "cluster");
  AttentionSpec rope = spec;
  rope.variant = variants::from_plan_options(false, -1, 0.f, variants::PosEncoding::kRopeLlama);
  expect_refused([&] { catalog::check_fp8_mma(rope, true); }, "KeyTransform");
  const PrefillConfig c = catalog::prefill_config(spec, 128, true, {}, true);
  expect_refused([&] { catalog::batch_prefill_pair(spec, c, spec, c); }, "fp8_mma");

  std::vector<jit::KernelSource> kernels;
  AttentionSpec causal = spec;
  causal.variant = variants::causal();
  kernels.push_back(catalog::batch_prefill(causal, 128, true, 1, {}, true));
  kernels.push_back(catalog::batch_prefill(fp8_spec(DType::kBFloat16, kE5M2, 128), 64, true, 1, {}, true));
  EXPECT_NE(kernels[0].entry.find("_f8mma"), std::string::npos) << kernels[0].entry;
  EXPECT_NE(kernels[0].source.find(", 1, true>"), std::string::npos);
  jit::KernelCache cache;
  const jit::Arch a = jit::Arch::parse("sm_90a");
  cache.precompile(kernels, a, 2);
  for (const auto& k : kernels) EXPECT_TRUE(is_elf(cache.cubin(k, a)->image)) << k.entry;
}

// 8-row query tiles (keys as the mma's rows, prefill_sm80/mainloop_keys.cuh):
// fp8 caches, or 16-bit ones of q's dtype, whose variant leaves K / V as
// stored; decode's default tile for fp8 caches and groups of up to 8 heads;
// refused by name elsewhere; the kernels
// compile for sm_90a and sm_80.
TEST(Fp8Prefill, EightRowTiles) {
  for (int d : {64, 128, 256}) {
    const AttentionSpec spec = fp8_spec(DType::kFloat16, kE4M3, d);
    EXPECT_TRUE(catalog::keys_as_rows_supported(spec));
    const PrefillConfig c = catalog::prefill_config(spec, 8);
    EXPECT_FALSE(c.hopper);
    EXPECT_EQ(c.cta_q, 8);
    EXPECT_EQ(c.warps_q, 1);
    EXPECT_EQ(c.warps_kv, 4);
    EXPECT_EQ(c.kv_tiles, Fa2KvTiles::kFp8);
    EXPECT_EQ(c.threads, 32 * 4 + kFa2KeysProducerThreads);  // the math warps and the producer warpgroup
    EXPECT_EQ(c.cta_kv, d <= 128 ? 128 : 64) << d;
    EXPECT_EQ(c.stages, d <= 128 ? 3 : 2) << d;
    // The scratch (Q tile, KV-warp merge of 3 warps' O^T, m and d, the state move), then the fp8 stages.
    const int scratch = std::max({2 * 8 * d, 3 * 32 * (d / 4 + 4) * 4, 8 * (d + 4) * 4});
    EXPECT_EQ(c.smem_bytes, scratch + c.stages * c.cta_kv * 2 * d) << d;
    EXPECT_LE(2 * (c.smem_bytes + 2 * 1024), 228 * 1024) << d;  // two CTAs an SM
    EXPECT_NE(catalog::batch_prefill(spec, 8).entry.find("_q8_"), std::string::npos);
  }
  // 16-bit caches of q's dtype take them too (64-key stages, the same bytes), others not.
  const AttentionSpec f16 = fp8_spec(DType::kFloat16, DType::kFloat16, 128);
  EXPECT_TRUE(catalog::keys_as_rows_supported(f16));
  const PrefillConfig c16 = catalog::prefill_config(f16, 8);
  EXPECT_EQ(c16.kv_tiles, Fa2KvTiles::k16Bit);
  EXPECT_EQ(c16.cta_kv, 64);
  EXPECT_EQ(c16.smem_bytes, std::max({2 * 8 * 128, 3 * 32 * (128 / 4 + 4) * 4, 8 * 132 * 4}) + 3 * 64 * 2 * 128 * 2);
  EXPECT_FALSE(catalog::keys_as_rows_supported(fp8_spec(DType::kFloat16, DType::kBFloat16, 128)));
  const AttentionSpec rope{variants::rope(), DType::kFloat16, kE4M3, DType::kFloat16, 128};
  EXPECT_FALSE(catalog::keys_as_rows_supported(rope));
  expect_refused([&] { catalog::prefill_config(rope, 8); }, "cta_q: 8-row query tiles");
  expect_refused([&] { catalog::prefill_config(fp8_spec(), 8, true); }, "backend");
  expect_refused([&] { catalog::prefill_config(fp8_spec(), 8, false, PrefillTile{0, 2, 0, 0}); }, "tile.warps_q");
  // The producer resolves whole rows per thread; 28 math warps and the producer fill 1024 threads.
  expect_refused([&] { catalog::prefill_config(fp8_spec(), 8, false, PrefillTile{48, 0, 1, 0}); },
                 "tile.cta_kv: 8-row tiles: expected a multiple of 32");
  expect_refused([&] { catalog::prefill_config(fp8_spec(), 8, false, PrefillTile{928, 0, 29, 2}); },
                 "tile.warps_kv: expected warps_kv <= 28");
  EXPECT_EQ(catalog::prefill_config(fp8_spec(), 8, false, PrefillTile{64, 0, 2, 2}).threads, 64 + 128);
  DecodeOptions tc;
  tc.use_tensor_cores = true;
  tc.tc_cta_q = 8;
  EXPECT_GT(BatchDecode::workspace_size(fp8_spec(), task(), 132, tc).device_bytes, 0u);
  tc.tc_cta_q = 12;
  EXPECT_THROW_MSG(BatchDecode::workspace_size(fp8_spec(), task(), 132, tc), InvalidArgument, "tc_cta_q");

  std::vector<jit::KernelSource> kernels;
  AttentionSpec causal = fp8_spec(DType::kBFloat16, kE5M2, 128);
  causal.variant = variants::causal();
  kernels.push_back(catalog::batch_prefill(fp8_spec(DType::kFloat16, kE4M3, 128), 8));
  kernels.push_back(catalog::batch_prefill(causal, 8));
  kernels.push_back(catalog::batch_prefill(fp8_spec(DType::kFloat16, kE4M3, 256), 8));
  kernels.push_back(catalog::batch_prefill(fp8_spec(DType::kFloat16, kE4M3, 128), 8, false, 1, {}, false, 2));
  kernels.push_back(catalog::batch_prefill(causal, 8, false, 1, {}, false, 2));
  jit::KernelCache cache;
  for (const char* arch : {"sm_90a", "sm_80"}) {
    const jit::Arch a = jit::Arch::parse(arch);
    cache.precompile(kernels, a, 2);
    for (const auto& k : kernels) EXPECT_TRUE(is_elf(cache.cubin(k, a)->image)) << k.entry << " " << arch;
  }
}

// Two adjacent KV heads a CTA on 8-row tiles: fp8 caches at head dim 128
// whose group fills half a tile or less and whose head count is even; the
// same bytes a stage (64 keys of both heads), two math warps a head; the
// workspace sized for the plan's halved head count covers the plan.
TEST(Fp8Prefill, EightRowTilesOfTwoKvHeads) {
  const AttentionSpec spec = fp8_spec(DType::kFloat16, kE4M3, 128);
  EXPECT_EQ(catalog::keys_kv_heads(spec, 8, false, 32, 8), 2);   // group 4
  EXPECT_EQ(catalog::keys_kv_heads(spec, 8, false, 32, 32), 2);  // MHA
  EXPECT_EQ(catalog::keys_kv_heads(spec, 8, false, 12, 6), 2);
  EXPECT_EQ(catalog::keys_kv_heads(spec, 8, false, 64, 8), 1);   // group 8 fills the tile alone
  EXPECT_EQ(catalog::keys_kv_heads(spec, 8, false, 6, 3), 1);    // an odd head count
  EXPECT_EQ(catalog::keys_kv_heads(spec, 16, false, 32, 8), 1);
  EXPECT_EQ(catalog::keys_kv_heads(spec, 8, true, 32, 8), 1);
  EXPECT_EQ(catalog::keys_kv_heads(fp8_spec(DType::kFloat16, kE4M3, 64), 8, false, 32, 8), 1);
  EXPECT_EQ(catalog::keys_kv_heads(fp8_spec(DType::kFloat16, DType::kFloat16, 128), 8, false, 32, 8), 1);
  const PrefillConfig one = catalog::prefill_config(spec, 8);
  const PrefillConfig two = catalog::prefill_config(spec, 8, false, {}, false, 2);
  EXPECT_EQ(two.kv_heads, 2);
  EXPECT_EQ(two.cta_kv, 64);
  EXPECT_EQ(two.smem_bytes, one.smem_bytes);  // the same bytes a stage
  EXPECT_EQ(two.threads, one.threads);
  const std::string entry = catalog::batch_prefill(spec, 8, false, 1, {}, false, 2).entry;
  EXPECT_NE(entry.find("_kv64_"), std::string::npos) << entry;
  EXPECT_NE(entry.find("_h2"), std::string::npos) << entry;
  expect_refused([&] { catalog::prefill_config(fp8_spec(DType::kFloat16, DType::kFloat16, 128), 8, false, {}, false, 2); },
                 "kv_heads");
  expect_refused([&] { catalog::prefill_config(spec, 16, false, {}, false, 2); }, "kv_heads");
  expect_refused([&] { catalog::prefill_config(spec, 8, false, PrefillTile{64, 0, 1, 0}, false, 2); }, "tile.warps_kv");
  // Decode sizes its workspace for the tiles plan() picks (GQA 8 / 2: two heads a CTA).
  DecodeOptions tc;
  tc.use_tensor_cores = true;
  const TaskInfo t{8, 2, 16, KVLayout::kNHD, 4, 64, 64};
  const size_t paired = BatchDecode::workspace_size(spec, t, 132, tc).device_bytes;
  EXPECT_GT(paired, 0u);
}
