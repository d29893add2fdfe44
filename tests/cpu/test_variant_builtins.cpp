// The built-in variants as device headers (device/variants/*.cuh), without a
// GPU: every built-in spec names embedded headers and a struct instead of
// code, the generated kernel includes the headers and names the struct where
// a user's code would go, a spec mixing the two forms is rejected, the tile
// heuristic still sees the built-ins' functors, and combinations compile
// under NVRTC.
#include <gtest/gtest.h>

#include <algorithm>

#include "jit_util.hpp"
#include "tessera/core/error.hpp"
#include "tessera/runtime/jit.hpp"
#include "tessera/runtime/kernel_catalog.hpp"
#include "tessera/runtime/prefill_catalog.hpp"
#include "test_util.hpp"

using namespace tessera;

namespace {

std::vector<VariantSpec> builtins() {
  return {variants::standard(),          variants::causal(),          variants::custom_mask(),
          variants::soft_cap(30.f, true), variants::sliding_window(128), variants::from_plan_options(true, 4096, 50.f),
          variants::alibi(true),          variants::flash_sigmoid(),   variants::attention_sink(),
          variants::rope(true, true)};
}

bool embedded(const std::string& name) {
  const auto& h = jit::embedded_headers();
  return std::any_of(h.begin(), h.end(), [&](const auto& e) { return e.first == name; });
}

}  // namespace

TEST(VariantBuiltins, SpecsNameTheirHeaderAndStruct) {
  for (const VariantSpec& v : builtins()) {
    SCOPED_TRACE(v.name);
    EXPECT_TRUE(v.code.empty());
    ASSERT_FALSE(v.headers.empty());
    for (const std::string& h : v.headers) {
      EXPECT_EQ(h.rfind("tessera/device/variants/", 0), 0u) << h;
      EXPECT_TRUE(embedded(h)) << h;
    }
    EXPECT_EQ(v.struct_name.rfind("tessera::variants::", 0), 0u) << v.struct_name;
    const AttentionSpec spec{v, DType::kFloat16, DType::kFloat16, DType::kFloat16, 128};
    const std::string src = v == variants::custom_mask() ? catalog::batch_prefill(spec, 64).source
                                                         : catalog::attention_rowwise(spec).source;
    for (const std::string& h : v.headers) EXPECT_NE(src.find("#include \"" + h + "\"\n"), std::string::npos) << src;
    EXPECT_NE(src.find("using " + v.name + " = " + v.struct_name + ";\n"), std::string::npos) << src;
    EXPECT_EQ(src.find("#line 1 \"variant:"), std::string::npos) << src;  // no user code
  }
  // The spec's declarations compose with the struct: causal from the spec.
  const std::string src =
      catalog::attention_rowwise({variants::alibi(true), DType::kFloat16, DType::kFloat16, DType::kFloat16, 64}).source;
  EXPECT_NE(src.find("static constexpr bool causal = true || tessera_variant::CausalAlibi::causal;"), std::string::npos)
      << src;
  EXPECT_NE(src.find("constexpr int kHeadDim = 64;"), std::string::npos);
}

TEST(VariantBuiltins, CodeAndHeadersDoNotMix) {
  VariantSpec both = variants::causal();
  both.code = "struct CausalAttention : tessera::VariantBase {};";
  EXPECT_THROW_MSG(validate_variant(both), InvalidArgument, "variant.code");
  VariantSpec outside = variants::causal();
  outside.headers = {"tessera/device/primitives/variant.cuh"};
  EXPECT_THROW_MSG(validate_variant(outside), InvalidArgument, "variant.headers");
  VariantSpec missing = variants::causal();
  missing.headers = {"tessera/device/variants/no_such_variant.cuh"};
  EXPECT_THROW_MSG(validate_variant(missing), InvalidArgument, "variant.headers");
  VariantSpec unnamed = variants::causal();
  unnamed.struct_name.clear();
  EXPECT_THROW_MSG(validate_variant(unnamed), InvalidArgument, "variant.struct_name");
  VariantSpec user{"V", "struct V : tessera::VariantBase {};"};
  EXPECT_NO_THROW(validate_variant(user));
  user.struct_name = "tessera::variants::StandardAttention";
  EXPECT_THROW_MSG(validate_variant(user), InvalidArgument, "variant.struct_name");
}

// 128-row FA2 tiles of head_dim 128 take 32-key KV tiles only for variants
// with per-element functors, read from the built-ins' headers.
TEST(VariantBuiltins, TileHeuristicSeesTheHeadersFunctors) {
  auto cta_kv = [](const VariantSpec& v) {
    return catalog::prefill_config({v, DType::kFloat16, DType::kFloat16, DType::kFloat16, 128}, 128).cta_kv;
  };
  for (const VariantSpec& v : {variants::standard(), variants::causal(), variants::sliding_window(128, true)})
    EXPECT_EQ(cta_kv(v), 64) << v.name;
  for (const VariantSpec& v : {variants::custom_mask(), variants::soft_cap(30.f), variants::from_plan_options(true, 64, 50.f),
                               variants::alibi(), variants::flash_sigmoid(), variants::attention_sink(), variants::rope()})
    EXPECT_EQ(cta_kv(v), 32) << v.name;
}

// The composed and declared-mask built-ins compile under NVRTC (the other
// built-ins: test_variant_jit.cpp, `tessera compile`).
TEST(VariantBuiltins, CombinationsCompile) {
  jit::KernelCache cache;  // the run's shared cache
  const AttentionSpec both{variants::from_plan_options(true, 4096, 50.f), DType::kFloat16, DType::kFloat16,
                           DType::kFloat16, 128};
  const AttentionSpec window{variants::sliding_window(64), DType::kBFloat16, DType::kBFloat16, DType::kBFloat16, 64};
  const std::vector<jit::KernelSource> ampere = {catalog::batch_decode(both, 4), catalog::batch_prefill(window, 64)};
  cache.precompile(ampere, jit::Arch::parse("sm_80"), 2);
  for (const auto& k : ampere) EXPECT_TRUE(test::is_elf(cache.cubin(k, jit::Arch::parse("sm_80"))->image)) << k.entry;
  const jit::KernelSource hopper = catalog::batch_prefill(both, 128, true);
  EXPECT_TRUE(test::is_elf(cache.cubin(hopper, jit::Arch::parse("sm_90a"))->image)) << hopper.entry;
  // The positional encodings under the composing templates: RoPE (a paired
  // transform) under a cap and a window, ALiBi (an extra tensor) under a cap.
  using variants::PosEncoding;
  const AttentionSpec rope_all{variants::from_plan_options(false, 100, 30.f, PosEncoding::kRopeLlama),
                               DType::kFloat16, DType::kFloat16, DType::kFloat16, 128};
  const AttentionSpec alibi_cap{variants::from_plan_options(true, -1, 30.f, PosEncoding::kAlibi), DType::kBFloat16,
                                DType::kBFloat16, DType::kBFloat16, 128};
  const jit::KernelSource rope_decode = catalog::batch_decode(rope_all, 4);
  EXPECT_TRUE(test::is_elf(cache.cubin(rope_decode, jit::Arch::parse("sm_80"))->image)) << rope_decode.entry;
  const jit::KernelSource alibi_prefill = catalog::batch_prefill(alibi_cap, 128, true);
  EXPECT_TRUE(test::is_elf(cache.cubin(alibi_prefill, jit::Arch::parse("sm_90a"))->image)) << alibi_prefill.entry;
  // A custom mask as the base of every plan option: RoPE, ALiBi, window, cap.
  const AttentionSpec mask_rope{variants::from_plan_options(false, 100, 30.f, PosEncoding::kRopeLlama, true),
                                DType::kFloat16, DType::kFloat16, DType::kFloat16, 128};
  const AttentionSpec mask_alibi{variants::from_plan_options(false, 64, 0.f, PosEncoding::kAlibi, true),
                                 DType::kBFloat16, DType::kBFloat16, DType::kBFloat16, 128};
  EXPECT_TRUE(mask_rope.variant.custom_mask && mask_alibi.variant.custom_mask);
  for (const jit::KernelSource& k : {catalog::batch_prefill(mask_rope, 64), catalog::batch_prefill(mask_alibi, 64)})
    EXPECT_TRUE(test::is_elf(cache.cubin(k, jit::Arch::parse("sm_80"))->image)) << k.entry;
  const jit::KernelSource mask_hopper = catalog::batch_prefill(mask_alibi, 128, true);
  EXPECT_TRUE(test::is_elf(cache.cubin(mask_hopper, jit::Arch::parse("sm_90a"))->image)) << mask_hopper.entry;
}

TEST(VariantBuiltins, CustomMaskUnderPlanOptions) {
  using variants::PosEncoding;
  EXPECT_EQ(variants::from_plan_options(false, -1, 0.f, PosEncoding::kNone, true), variants::custom_mask());
  const VariantSpec v = variants::from_plan_options(false, 12, 5.f, PosEncoding::kAlibi, true);
  EXPECT_TRUE(v.custom_mask);
  EXPECT_EQ(v.window_left, 12);
  EXPECT_NE(v.struct_name.find("CustomMaskAttention"), std::string::npos) << v.struct_name;
  EXPECT_NE(v.name.find("CustomMask"), std::string::npos) << v.name;
  EXPECT_FALSE(variants::from_plan_options(false, 12, 5.f, PosEncoding::kAlibi, false).custom_mask);
  EXPECT_THROW(variants::from_plan_options(true, -1, 0.f, PosEncoding::kNone, true), InvalidArgument);
}
