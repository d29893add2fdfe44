// The variant JIT path without a GPU: every new built-in variant and the
// docs' example compile into each kernel family for sm_80 and sm_90a; the
// host/device layout check in generated kernels is live; compile errors in a
// user's variant point at the user's line; the docs show the tested code.
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

#include "jit_util.hpp"
#include "tessera/core/error.hpp"
#include "tessera/runtime/jit.hpp"
#include "tessera/runtime/kernel_catalog.hpp"
#include "tessera/runtime/prefill_catalog.hpp"
#include "test_util.hpp"
#include "variant_cases.hpp"

using namespace tessera;
using test::ScratchDir;
using test::is_elf;

namespace {

bool pairwise(const VariantSpec& v) { return (v.code + v.struct_name).find("tessera::Pairing::k") != std::string::npos; }

std::vector<VariantSpec> new_variants() {
  return {variants::alibi(true),        variants::flash_sigmoid(false), variants::attention_sink(),
          variants::rope(false, true),  variants::rope(true, false),    test::docs_example_variant()};
}

std::string compile_error(jit::KernelCache& cache, const jit::KernelSource& src, const char* arch) {
  try {
    cache.cubin(src, jit::Arch::parse(arch));
  } catch (const CompileError& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST(VariantJit, NewBuiltinsCompileIntoEveryKernelFamily) {
  jit::KernelCache cache;  // the run's shared cache
  std::vector<jit::KernelSource> ampere, hopper;
  for (const VariantSpec& v : new_variants()) {
    const AttentionSpec f16{v, DType::kFloat16, DType::kFloat16, DType::kFloat16, 128};
    const AttentionSpec bf16{v, DType::kBFloat16, DType::kBFloat16, DType::kBFloat16, 64};
    for (const auto& k : {catalog::batch_decode(f16, 4), catalog::batch_decode(bf16, 1), catalog::attention_rowwise(f16)})
      ampere.push_back(k);
    ampere.push_back(catalog::batch_prefill(f16, 64));
    ampere.push_back(catalog::batch_prefill(bf16, 16));
    hopper.push_back(catalog::batch_prefill(f16, 128, true));
  }
  for (const char* arch : {"sm_80", "sm_90a"}) {
    cache.precompile(ampere, jit::Arch::parse(arch), 2);
    for (const auto& k : ampere) EXPECT_TRUE(is_elf(cache.cubin(k, jit::Arch::parse(arch))->image)) << k.entry << " " << arch;
  }
  cache.precompile(hopper, jit::Arch::parse("sm_90a"), 2);
  for (const auto& k : hopper) EXPECT_TRUE(is_elf(cache.cubin(k, jit::Arch::parse("sm_90a"))->image)) << k.entry;
}

TEST(VariantJit, GeneratedKernelCarriesSpecFlagsAndLayoutChecks) {
  const AttentionSpec spec{test::docs_example_variant(), DType::kFloat16, DType::kFloat16, DType::kFloat16, 128};
  const jit::KernelSource src = catalog::batch_decode(spec, 1);
  EXPECT_NE(src.source.find("constexpr int kHeadDim = 128;"), std::string::npos);
  EXPECT_NE(src.source.find("const float* head_scale;"), std::string::npos);
  EXPECT_NE(src.source.find("static constexpr bool use_softmax = true && tessera_variant::DecayBias::use_softmax;"),
            std::string::npos)
      << src.source;
  const AttentionSpec sig{variants::flash_sigmoid(), DType::kFloat16, DType::kFloat16, DType::kFloat16, 128};
  EXPECT_NE(catalog::batch_decode(sig, 1).source.find("use_softmax = false &&"), std::string::npos);

  // The layout assertion is compiled: a host layout that disagrees fails.
  const ScratchDir dir("layout");  // the failing compile writes its source there
  jit::KernelCache cache(dir.str());
  jit::KernelSource tampered = src;
  const size_t at = tampered.source.find("sizeof(tessera::DecodeParams<tessera_variant::Extra>) == ");
  ASSERT_NE(at, std::string::npos) << src.source;
  tampered.source.insert(at + std::string("sizeof(tessera::DecodeParams<tessera_variant::Extra>) == ").size(), "8 + ");
  EXPECT_NE(compile_error(cache, tampered, "sm_80").find("kernel parameter layout differs from the host's"),
            std::string::npos);
  EXPECT_TRUE(is_elf(cache.cubin(src, jit::Arch::parse("sm_80"))->image));
}

TEST(VariantJit, UserCompileErrorPointsAtTheUsersLine) {
  const ScratchDir dir("userline");
  jit::KernelCache cache(dir.str());
  VariantSpec v{"Oops",
                "struct Oops : tessera::VariantBase {\n"
                "  using tessera::VariantBase::VariantBase;\n"
                "  template <typename Params>\n"
                "  __device__ float LogitsTransform(const Params& p, float x, int, int, int, int, int) const {\n"
                "    return x * p.extra.not_declared;\n"
                "  }\n"
                "};\n"};
  v.scalars = {{"declared", DType::kFloat32}};
  for (const jit::KernelSource& src :
       {catalog::batch_decode({v, DType::kFloat16, DType::kFloat16, DType::kFloat16, 128}, 1),
        catalog::batch_prefill({v, DType::kBFloat16, DType::kBFloat16, DType::kBFloat16, 64}, 64)}) {
    const std::string msg = compile_error(cache, src, "sm_80");
    EXPECT_NE(msg.find("variant:Oops(5): error"), std::string::npos) << msg;  // line 5 of the user's code
    EXPECT_NE(msg.find("not_declared"), std::string::npos) << msg;           // NVRTC's own words
    EXPECT_NE(msg.find("generated source: "), std::string::npos) << msg;
  }
}

TEST(VariantJit, DocsShowTheTestedExample) {
  std::ifstream f(std::string(TESSERA_SOURCE_DIR) + "/docs/variants.md");
  ASSERT_TRUE(f) << "docs/variants.md";
  std::stringstream ss;
  ss << f.rdbuf();
  EXPECT_NE(ss.str().find(test::kDocsExampleCode), std::string::npos)
      << "docs/variants.md must contain the example of tests/variant_cases.hpp verbatim";
}

// Which slots a variant overrides decides what kernels do (skip transforms,
// masks): the detection must hold under NVRTC, not only nvcc
// (tests/device/nvcc_check.cu asserts the same there).
TEST(VariantJit, SlotDetectionHoldsUnderNvrtc) {
  jit::KernelCache cache;  // the run's shared cache
  const jit::KernelSource src{"tessera_traits_probe", R"(
#include "tessera/abi/prefill_params.cuh"
#include "tessera/device/primitives/variant_traits.cuh"
using P = tessera::PrefillParams<tessera::NoExtra>;
struct Plain : tessera::VariantBase { using tessera::VariantBase::VariantBase; };
struct Masked : tessera::VariantBase {
  using tessera::VariantBase::VariantBase;
  template <typename Params> bool LogitsMask(const Params&, int, int q, int k, int, int) const { return k <= q; }
};
struct Logits : tessera::VariantBase {
  using tessera::VariantBase::VariantBase;
  template <typename Params> float LogitsTransform(const Params&, float x, int, int, int, int, int) const { return x; }
};
struct QElem : tessera::VariantBase {
  using tessera::VariantBase::VariantBase;
  template <typename Params> float QueryTransform(const Params&, float x, int, int, int, int) const { return x; }
};
struct KPair : tessera::VariantBase {
  using tessera::VariantBase::VariantBase;
  static constexpr tessera::Pairing pairing = tessera::Pairing::kAdjacent;
  template <typename Params> float KeyTransform(const Params&, float x, float, int, int, int, int) const { return x; }
};
template <typename V> using T = tessera::VariantTraits<V, P>;
static_assert(!T<Plain>::query_transform && !T<Plain>::key_transform && !T<Plain>::value_transform &&
              !T<Plain>::logits_transform && !T<Plain>::logits_mask, "plain");
static_assert(T<Masked>::logits_mask && !T<Masked>::logits_transform, "mask");
static_assert(T<Logits>::logits_transform && !T<Logits>::logits_mask, "logits");
static_assert(T<QElem>::query_transform && !T<QElem>::key_transform, "element-wise query");
static_assert(T<KPair>::key_transform && !T<KPair>::query_transform, "pairwise key");
extern "C" __global__ void tessera_traits_probe() {}
)", {}};
  for (const char* arch : {"sm_80", "sm_90a"})
    EXPECT_TRUE(is_elf(cache.cubin(src, jit::Arch::parse(arch))->image)) << arch;
}
