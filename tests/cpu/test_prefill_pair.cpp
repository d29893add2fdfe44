// Two batch prefills in one launch (api/prefill_pair.hpp): the fused
// kernel's source and the configurations it refuses, checked without a GPU
// (NVRTC compiles it for sm_80 and sm_90a, FA2 and Hopper pairs).
#include <gtest/gtest.h>

#include "jit_util.hpp"
#include "tessera/runtime/jit.hpp"
#include "tessera/runtime/prefill_catalog.hpp"
#include "test_util.hpp"

using namespace tessera;

namespace {

AttentionSpec spec_of(int d, VariantSpec v, DType t = DType::kFloat16, DType kv = DType::kFloat16) {
  AttentionSpec s;
  s.variant = std::move(v);
  s.q_dtype = s.o_dtype = t;
  s.kv_dtype = kv;
  s.head_dim = d;
  return s;
}

TEST(PrefillPairSource, OneEntryCallingBothKernelsOnTheirOwnCtas) {
  const AttentionSpec p = spec_of(128, variants::causal()), d = spec_of(128, variants::standard());
  const jit::KernelSource src =
      catalog::batch_prefill_pair(p, catalog::prefill_config(p, 128), d, catalog::prefill_config(d, 16));
  EXPECT_NE(src.entry.find("CausalAttention"), std::string::npos);
  EXPECT_NE(src.entry.find("StandardAttention"), std::string::npos);
  EXPECT_NE(src.source.find("if (blockIdx.x < ctas_first) tessera::batch_prefill<tessera_spec_first"), std::string::npos);
  EXPECT_NE(src.source.find("if (blockIdx.x < ctas_second) tessera::batch_prefill<tessera_spec_second"),
            std::string::npos);
  // Every pair of configurations gets its own entry.
  const jit::KernelSource other =
      catalog::batch_prefill_pair(p, catalog::prefill_config(p, 64), d, catalog::prefill_config(d, 16));
  EXPECT_NE(src.entry, other.entry);
}

TEST(PrefillPairSource, RefusesMixedTemplatesHeadDim512AndUnequalTiles) {
  const AttentionSpec p = spec_of(128, variants::causal()), d = spec_of(128, variants::standard());
  const PrefillConfig fa2 = catalog::prefill_config(d, 16);
  EXPECT_THROW_MSG(catalog::batch_prefill_pair(p, catalog::prefill_config(p, 128, true), d, fa2), InvalidArgument,
                   "backend");
  EXPECT_THROW_MSG(catalog::batch_prefill_pair(d, fa2, p, catalog::prefill_config(p, 64, true)), InvalidArgument,
                   "backend");
  // Hopper: 128-row tiles take 3 warpgroups, 64-row ones 2; head dim 256's
  // 64-row tile one CTA per SM, head dim 128's two.
  EXPECT_THROW_MSG(catalog::batch_prefill_pair(p, catalog::prefill_config(p, 128, true), d,
                                               catalog::prefill_config(d, 64, true)),
                   InvalidArgument, "tile");
  const AttentionSpec d256h = spec_of(256, variants::standard());
  EXPECT_THROW_MSG(catalog::batch_prefill_pair(p, catalog::prefill_config(p, 64, true), d256h,
                                               catalog::prefill_config(d256h, 64, true)),
                   InvalidArgument, "tile");
  PrefillConfig pairs = catalog::prefill_config(p, 128, true);
  pairs.cluster = 2;
  EXPECT_THROW_MSG(catalog::batch_prefill_pair(p, pairs, p, catalog::prefill_config(p, 128, true)), InvalidArgument,
                   "cluster");
  const AttentionSpec d512 = spec_of(512, variants::standard());
  EXPECT_THROW_MSG(catalog::batch_prefill_pair(d512, catalog::prefill_config(d512, 16), d512,
                                               catalog::prefill_config(d512, 16)),
                   InvalidArgument, "head_dim");
  // Head dim 256's 128-row tile takes 8 warps, its 16-row tile 4.
  const AttentionSpec d256 = spec_of(256, variants::causal());
  EXPECT_THROW_MSG(catalog::batch_prefill_pair(d256, catalog::prefill_config(d256, 128), d256,
                                               catalog::prefill_config(d256, 16)),
                   InvalidArgument, "tile");
}

// The fused source compiles for both architectures, with variants that carry
// extras and an fp8 part.
TEST(PrefillPairSource, CompilesForSm80AndSm90a) {
  using variants::PosEncoding;
  const AttentionSpec rope = spec_of(128, variants::from_plan_options(true, 100, 30.f, PosEncoding::kRopeLlama),
                                     DType::kBFloat16, DType::kBFloat16);
  const AttentionSpec plain = spec_of(128, variants::standard(), DType::kBFloat16, DType::kBFloat16);
  const AttentionSpec fp8 = spec_of(64, variants::from_plan_options(false, -1, 0.f, PosEncoding::kAlibi),
                                    DType::kFloat16, DType::kFloat8E4M3);
  const AttentionSpec causal64 = spec_of(64, variants::causal());
  const std::vector<jit::KernelSource> kernels = {
      catalog::batch_prefill_pair(rope, catalog::prefill_config(rope, 128), plain, catalog::prefill_config(plain, 16)),
      catalog::batch_prefill_pair(causal64, catalog::prefill_config(causal64, 64), fp8,
                                  catalog::prefill_config(fp8, 16))};
  jit::KernelCache cache;  // the run's shared cache
  for (const char* arch : {"sm_80", "sm_90a"}) {
    const jit::Arch a = jit::Arch::parse(arch);
    cache.precompile(kernels, a, 2);
    for (const auto& k : kernels) EXPECT_TRUE(test::is_elf(cache.cubin(k, a)->image)) << arch << " " << k.entry;
  }
  // The Hopper pair: one warp specialization over both plans.
  const jit::KernelSource hopper = catalog::batch_prefill_pair(rope, catalog::prefill_config(rope, 64, true), plain,
                                                               catalog::prefill_config(plain, 64, true));
  EXPECT_NE(hopper.source.find("batch_prefill_sm90_pair<tessera::Sm90PrefillKernel<tessera_spec_first"),
            std::string::npos);
  EXPECT_TRUE(test::is_elf(cache.cubin(hopper, jit::Arch::parse("sm_90a"))->image)) << hopper.entry;
}

}  // namespace
