// Variant specs with extras, without a GPU: the built-ins' declarations, spec
// validation, the host layout of Extra and of each kernel parameter block
// (against the C++ compiler's own layout of equivalent structs), and packing
// of run() arguments by name with every error case named.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "tessera/abi/rowwise_params.cuh"
#include "tessera/abi/decode_params.cuh"
#include "tessera/abi/prefill_params.cuh"
#include "tessera/abi/variant_extra.cuh"
#include "tessera/runtime/variant_params.hpp"
#include "test_util.hpp"
#include "variant_cases.hpp"

using namespace tessera;

namespace {

const Device kGpu0{DeviceType::kCUDA, 0};

// A CUDA tensor view over a fake address (packing only copies the pointer).
TensorView fake_cuda(DType dt, std::vector<int64_t> shape, uintptr_t addr = 0x7000) {
  return TensorView(reinterpret_cast<void*>(addr), dt, kGpu0, std::move(shape));
}

}  // namespace

TEST(VariantSpecs, BuiltinsDeclareTheirExtras) {
  const VariantSpec a = variants::alibi(true);
  EXPECT_EQ(a.name, "CausalAlibi");
  EXPECT_TRUE(a.causal);
  ASSERT_EQ(a.tensors.size(), 1u);
  EXPECT_EQ(a.tensors[0], (ExtraParam{"alibi_slopes", DType::kFloat32}));
  EXPECT_FALSE(variants::alibi(false).causal);

  const VariantSpec s = variants::flash_sigmoid();
  EXPECT_FALSE(s.use_softmax);
  EXPECT_EQ(s.scalars, (std::vector<ExtraParam>{{"sigmoid_scale", DType::kFloat32}, {"sigmoid_bias", DType::kFloat32}}));

  const VariantSpec k = variants::attention_sink();
  EXPECT_TRUE(k.causal);
  EXPECT_EQ(k.scalars, (std::vector<ExtraParam>{{"sink_size", DType::kInt32}, {"window_left", DType::kInt32}}));

  const VariantSpec r = variants::rope(false, true), ri = variants::rope(true, false);
  EXPECT_EQ(r.name, "CausalRope");
  EXPECT_EQ(ri.name, "RopeInterleaved");
  EXPECT_EQ(r.struct_name, "tessera::variants::Rope<tessera::Pairing::kHalves, kHeadDim>");
  EXPECT_EQ(ri.struct_name, "tessera::variants::Rope<tessera::Pairing::kAdjacent, kHeadDim>");
  EXPECT_EQ(r.scalars, (std::vector<ExtraParam>{{"rope_scale", DType::kFloat32}, {"rope_theta", DType::kFloat32}}));

  EXPECT_TRUE(variants::is_causal(variants::causal()));
  EXPECT_TRUE(variants::is_causal(variants::soft_cap(30.f, true)));
  EXPECT_TRUE(variants::is_causal(variants::attention_sink()));
  EXPECT_FALSE(variants::is_causal(variants::rope()));
  // A user spec is scheduled causally only when the spec says so.
  EXPECT_FALSE(variants::is_causal({"MyCausal", "struct MyCausal : tessera::VariantBase {\n"
                                                "  static constexpr bool causal = true;\n};\n"}));
}

TEST(VariantSpecs, AlibiSlopes) {
  const std::vector<float> eight = variants::alibi_slopes(8);
  ASSERT_EQ(eight.size(), 8u);
  for (int h = 0; h < 8; ++h) EXPECT_FLOAT_EQ(eight[h], std::exp2(-(h + 1.0f)));
  // 12 heads: the 8 of the nearest power of two, then odd powers of 16's base.
  const std::vector<float> twelve = variants::alibi_slopes(12);
  ASSERT_EQ(twelve.size(), 12u);
  for (int h = 0; h < 8; ++h) EXPECT_FLOAT_EQ(twelve[h], eight[h]);
  for (int i = 0; i < 4; ++i) EXPECT_FLOAT_EQ(twelve[8 + i], std::exp2(-0.5f * (2 * i + 1)));
  EXPECT_THROW_MSG(variants::alibi_slopes(0), InvalidArgument, "num_heads");
}

TEST(VariantSpecs, Validation) {
  VariantSpec v = test::docs_example_variant();
  EXPECT_NO_THROW(validate_variant(v));
  // Each case: the docs' spec with one change, and what the error names.
  auto with = [&](auto change) {
    VariantSpec bad = v;
    change(bad);
    return bad;
  };
  EXPECT_THROW_MSG(validate_variant(with([](VariantSpec& b) { b.name = "1abc"; })), InvalidArgument, "variant.name");
  EXPECT_THROW_MSG(validate_variant(with([](VariantSpec& b) { b.scalars.push_back({"head_scale", DType::kFloat32}); })),
                   InvalidArgument, "head_scale: declared twice");
  EXPECT_THROW_MSG(validate_variant(with([](VariantSpec& b) { b.scalars.push_back({"my-scale", DType::kFloat32}); })),
                   InvalidArgument, "variant.scalars");
  EXPECT_THROW_MSG(validate_variant(with([](VariantSpec& b) { b.tensors.push_back({"__reserved", DType::kFloat32}); })),
                   InvalidArgument, "variant.tensors");
  EXPECT_THROW_MSG(validate_variant(with([](VariantSpec& b) { b.scalars.push_back({"half_scalar", DType::kFloat16}); })),
                   TypeMismatch, "half_scalar");
  VariantSpec bad = with([](VariantSpec& b) {
    for (int i = 0; i < 600; ++i) b.tensors.push_back({"t" + std::to_string(i), DType::kFloat32});
  });
  EXPECT_THROW_MSG(validate_variant(bad), InvalidArgument, "launch limit");
  AttentionSpec spec;
  spec.variant = bad;
  EXPECT_THROW_MSG(validate_spec(spec), InvalidArgument, "launch limit");
}

// What the generated Extra of the docs' example is, written by hand.
struct alignas(8) DocsExtra {
  const float* head_scale;
  float decay;
  int max_distance;
};
// One scalar only: 4 bytes of tail padding.
struct alignas(8) OneScalarExtra {
  int x;
};

template <template <typename> class P, typename Extra>
void expect_layout(ParamsKind kind, const VariantSpec& v) {
  const ParamsLayout l = params_layout(kind, v);
  EXPECT_EQ(l.extra_offset, offsetof(P<Extra>, extra));
  EXPECT_EQ(l.total, sizeof(P<Extra>));
  EXPECT_EQ(l.head_bytes, offsetof(P<NoExtra>, extra));
}

TEST(VariantParams, LayoutMatchesTheCompilersLayout) {
  const VariantSpec docs = test::docs_example_variant();
  const ExtraLayout e = extra_layout(docs);
  ASSERT_EQ(e.fields.size(), 3u);
  EXPECT_EQ(e.size, sizeof(DocsExtra));
  EXPECT_EQ(e.fields[0].name, "head_scale");
  EXPECT_EQ(e.fields[0].offset, offsetof(DocsExtra, head_scale));
  EXPECT_EQ(e.fields[1].offset, offsetof(DocsExtra, decay));
  EXPECT_EQ(e.fields[2].offset, offsetof(DocsExtra, max_distance));
  expect_layout<PrefillParams, DocsExtra>(ParamsKind::kPrefill, docs);
  expect_layout<DecodeParams, DocsExtra>(ParamsKind::kDecode, docs);
  expect_layout<RowwiseParams, DocsExtra>(ParamsKind::kRowwise, docs);

  VariantSpec one{"One", ""};
  one.scalars = {{"x", DType::kInt32}};
  EXPECT_EQ(extra_layout(one).size, sizeof(OneScalarExtra));
  expect_layout<PrefillParams, OneScalarExtra>(ParamsKind::kPrefill, one);
  expect_layout<DecodeParams, OneScalarExtra>(ParamsKind::kDecode, one);

  const VariantSpec none = variants::standard();
  EXPECT_EQ(extra_layout(none).size, 0u);
  expect_layout<PrefillParams, NoExtra>(ParamsKind::kPrefill, none);
  expect_layout<RowwiseParams, NoExtra>(ParamsKind::kRowwise, none);
  EXPECT_EQ(params_kind("DecodeParams"), ParamsKind::kDecode);
  EXPECT_THROW_MSG(params_kind("MergeParams"), InvalidArgument, "params_type");
}

TEST(VariantParams, ExtraStructSource) {
  EXPECT_EQ(extra_struct_source(variants::standard()), "typedef tessera::NoExtra Extra;\n");
  VariantSpec v{"V", ""};
  v.scalars = {{"s", DType::kFloat32}, {"n", DType::kInt32}};
  v.tensors = {{"a", DType::kBFloat16}, {"m", DType::kUInt8}};
  const std::string src = extra_struct_source(v);
  // Tensors first, then scalars, each in declaration order.
  const size_t a = src.find("const tessera::bf16_t* a;"), m = src.find("const unsigned char* m;"),
               s = src.find("float s;"), n = src.find("int n;");
  ASSERT_NE(a, std::string::npos) << src;
  ASSERT_NE(m, std::string::npos) << src;
  ASSERT_NE(s, std::string::npos) << src;
  ASSERT_NE(n, std::string::npos) << src;
  EXPECT_TRUE(a < m && m < s && s < n) << src;
  EXPECT_NE(src.find("struct alignas(8) Extra"), std::string::npos) << src;
}

TEST(VariantParams, PackWritesTheHeadAndTheExtrasByName) {
  const VariantSpec v = test::docs_example_variant();
  PrefillParams<NoExtra> head{};
  head.num_qo_heads = 12;
  head.sm_scale = 0.25f;
  head.o_scale = -0.75f;
  head.q = reinterpret_cast<const void*>(0x1234);
  VariantArgs args;
  args.set("max_distance", 7).set("decay", 0.5).set("head_scale", fake_cuda(DType::kFloat32, {12}, 0xabc0));
  ParamBlock block;
  pack_params(block, ParamsKind::kPrefill, &head, v, &args, kGpu0);
  PrefillParams<DocsExtra> got;
  ASSERT_EQ(block.size, sizeof got);
  std::memcpy(&got, block.bytes, sizeof got);
  EXPECT_EQ(got.num_qo_heads, 12);
  EXPECT_EQ(got.sm_scale, 0.25f);
  EXPECT_EQ(got.o_scale, -0.75f);  // v_scale rides in the head, not after the extras
  EXPECT_EQ(got.q, head.q);
  EXPECT_EQ(got.extra.head_scale, reinterpret_cast<const float*>(0xabc0));
  EXPECT_EQ(got.extra.decay, 0.5f);
  EXPECT_EQ(got.extra.max_distance, 7);
  // set() replaces; an int feeds a float scalar.
  args.set("decay", 2);
  pack_params(block, ParamsKind::kPrefill, &head, v, &args, kGpu0);
  std::memcpy(&got, block.bytes, sizeof got);
  EXPECT_EQ(got.extra.decay, 2.0f);
  EXPECT_EQ(args.args().size(), 3u);

  // No extras: exactly the NoExtra block.
  DecodeParams<NoExtra> d{};
  d.num_qo_heads = 5;
  pack_params(block, ParamsKind::kDecode, &d, variants::standard(), nullptr, kGpu0);
  EXPECT_EQ(block.size, sizeof d);
  EXPECT_EQ(std::memcmp(block.bytes, &d, offsetof(DecodeParams<NoExtra>, extra)), 0);
}

// The output scale (RunOptions::v_scale) is part of every attention
// parameter block's fixed head and defaults to 1: a block the host fills
// without it leaves outputs unscaled.
template <template <typename> class P>
void expect_output_scale_in_head() {
  const P<NoExtra> p{};
  EXPECT_EQ(p.o_scale, 1.f);
  EXPECT_LT(offsetof(P<NoExtra>, o_scale), offsetof(P<NoExtra>, extra));
}
TEST(VariantParams, OutputScaleDefaultsToOneInTheHead) {
  expect_output_scale_in_head<DecodeParams>();
  expect_output_scale_in_head<PrefillParams>();
  expect_output_scale_in_head<RowwiseParams>();
}

TEST(VariantParams, PackRejectsBadArgumentsByName) {
  const VariantSpec v = test::docs_example_variant();
  PrefillParams<NoExtra> head{};
  ParamBlock block;
  auto pack = [&](const VariantArgs& a) { pack_params(block, ParamsKind::kPrefill, &head, v, &a, kGpu0); };
  auto good = [] {
    VariantArgs a;
    a.set("head_scale", fake_cuda(DType::kFloat32, {4})).set("decay", 0.1).set("max_distance", 3);
    return a;
  };
  EXPECT_NO_THROW(pack(good()));
  VariantArgs missing;
  missing.set("head_scale", fake_cuda(DType::kFloat32, {4})).set("decay", 0.1);
  EXPECT_THROW_MSG(pack(missing), InvalidArgument, "max_distance: missing");
  EXPECT_THROW_MSG(pack_params(block, ParamsKind::kPrefill, &head, v, nullptr, kGpu0), InvalidArgument, "head_scale: missing");
  VariantArgs unknown = good();
  unknown.set("decai", 0.1);
  EXPECT_THROW_MSG(pack(unknown), InvalidArgument, "decai: not an extra of variant DecayBias");
  VariantArgs float_for_int = good();
  float_for_int.set("max_distance", 3.5);
  EXPECT_THROW_MSG(pack(float_for_int), TypeMismatch, "max_distance: expected an int32 scalar");
  VariantArgs out_of_range = good();
  out_of_range.set("max_distance", int64_t{1} << 40);
  EXPECT_THROW_MSG(pack(out_of_range), InvalidArgument, "max_distance: expected a value in the int32 range");
  VariantArgs tensor_for_scalar = good();
  tensor_for_scalar.set("decay", fake_cuda(DType::kFloat32, {1}));
  EXPECT_THROW_MSG(pack(tensor_for_scalar), TypeMismatch, "decay: expected a float32 scalar, got a tensor");
  VariantArgs scalar_for_tensor = good();
  scalar_for_tensor.set("head_scale", 1.0);
  EXPECT_THROW_MSG(pack(scalar_for_tensor), TypeMismatch, "head_scale: expected a float32 tensor, got a scalar");
  VariantArgs wrong_dtype = good();
  wrong_dtype.set("head_scale", fake_cuda(DType::kFloat16, {4}));
  EXPECT_THROW_MSG(pack(wrong_dtype), TypeMismatch, "head_scale");
  VariantArgs host_tensor = good();
  std::vector<float> host(4);
  host_tensor.set("head_scale", TensorView(host.data(), DType::kFloat32, Device{}, {4}));
  EXPECT_THROW_MSG(pack(host_tensor), TypeMismatch, "head_scale: expected device");
  VariantArgs other_gpu = good();
  other_gpu.set("head_scale", TensorView(reinterpret_cast<void*>(0x10), DType::kFloat32, Device{DeviceType::kCUDA, 1}, {4}));
  EXPECT_THROW_MSG(pack(other_gpu), TypeMismatch, "head_scale: expected device");
  VariantArgs strided = good();
  strided.set("head_scale", TensorView(reinterpret_cast<void*>(0x10), DType::kFloat32, kGpu0, {4}, {2}));
  EXPECT_THROW_MSG(pack(strided), InvalidArgument, "head_scale: expected a contiguous tensor");
  // Extras given to a variant without any.
  VariantArgs extra;
  extra.set("decay", 1.0);
  DecodeParams<NoExtra> d{};
  EXPECT_THROW_MSG(pack_params(block, ParamsKind::kDecode, &d, variants::causal(), &extra, kGpu0), InvalidArgument,
                   "decay: not an extra of variant CausalAttention (its extras: none)");
}
