// rope_quantize_fp8 / rope_quantize_fp8_append_paged_kv_cache /
// rope_quantize_fp8_append_paged_mla_cache on the CPU path: byte-exact
// against the test's own reference (rope_quantize_util.hpp), close to the
// composition of the existing CPU RoPE and float_to_fp8, structural
// validation naming the argument (no GPU needed), index errors that leave
// every output untouched, and the catalogue's kernels.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>

#include "rope_quantize_util.hpp"
#include "tessera/api/rope.hpp"
#include "tessera/api/rope_quantize.hpp"
#include "tessera/core/error.hpp"
#include "tessera/runtime/jit.hpp"
#include "tessera/runtime/kernel_catalog.hpp"

using namespace tessera;
using namespace tessera::test;

namespace {

void run_paged(const RQCase& c, RQProblem& p) {
  using I = RQProblem;
  if (c.mla) {
    rope_quantize_fp8_append_paged_mla_cache(p.q_rope.view, p.k_rope.view, p.q_nope.view, p.k_nope.view, p.cos_sin.view,
                                             I::ints(p.pos_ids), p.cache0.view, p.cache1.view, I::ints(p.indices),
                                             I::ints(p.indptr), I::ints(p.batch_indices), I::ints(p.positions),
                                             p.q_rope_out.view, p.q_nope_out.view, options(c));
  } else {
    rope_quantize_fp8_append_paged_kv_cache(p.q_rope.view, p.k_rope.view, p.q_nope.view, p.k_nope.view, p.v.view,
                                            p.cos_sin.view, I::ints(p.pos_ids), PagedKVStorage(p.cache0.view, p.cache1.view, c.layout),
                                            I::ints(p.indices), I::ints(p.indptr), I::ints(p.batch_indices),
                                            I::ints(p.positions), p.q_rope_out.view, p.q_nope_out.view, options(c));
  }
}

class RopeQuantizeCpu : public ::testing::TestWithParam<std::tuple<DType, DType, KVLayout, bool, bool, int>> {};

TEST_P(RopeQuantizeCpu, PagedMatchesReferenceBytes) {
  const auto [in, out, layout, interleave, mla, page_size] = GetParam();
  RQCase c;
  c.in = in, c.out = out, c.layout = layout, c.interleave = interleave, c.mla = mla, c.page_size = page_size;
  if (mla) c.qo_heads = 2, c.rope_dim = 64, c.no_rope_dim = 128;
  RQProblem p = make_rq_problem(c, 7 + page_size);
  const RQProblem want = rq_expected(c, p);
  run_paged(c, p);
  expect_same_rq(p, want);
}

INSTANTIATE_TEST_SUITE_P(All, RopeQuantizeCpu,
                         ::testing::Combine(::testing::Values(DType::kFloat16, DType::kBFloat16),
                                            ::testing::Values(DType::kFloat8E4M3, DType::kFloat8E5M2),
                                            ::testing::Values(KVLayout::kNHD, KVLayout::kHND), ::testing::Bool(),
                                            ::testing::Bool(), ::testing::Values(1, 16)));

// The unpaged form writes every token (no padding notion), k to its outputs.
TEST(RopeQuantizeCpuUnpaged, MatchesReferenceBytes) {
  for (bool mla : {false, true}) {
    SCOPED_TRACE(mla ? "MLA (2-D k)" : "GQA");
    RQCase c;
    c.mla = mla, c.padding = 0, c.interleave = mla, c.no_rope_dim = mla ? 0 : 64;
    RQProblem p = make_rq_problem(c, 3);
    std::vector<int64_t> ks = mla ? std::vector<int64_t>{p.nnz, c.rope_dim} : std::vector<int64_t>{p.nnz, c.kv_heads, c.rope_dim};
    HostTensor kro = poisoned(c.out, ks), kno = poisoned(c.out, mla ? std::vector<int64_t>{p.nnz, 0}
                                                                    : std::vector<int64_t>{p.nnz, c.kv_heads, 64});
    const TensorView none;
    rope_quantize_fp8(p.q_rope.view, p.k_rope.view, mla ? none : p.q_nope.view, mla ? none : p.k_nope.view, p.cos_sin.view,
                      RQProblem::ints(p.pos_ids), p.q_rope_out.view, kro.view, mla ? none : p.q_nope_out.view,
                      mla ? none : kno.view, options(c));
    for (int64_t i = 0; i < p.nnz; ++i) {
      const int32_t rp = p.pos_ids[i];
      for (int64_t h = 0; h < (mla ? 1 : c.kv_heads); ++h) {
        const auto kr = rq_row(p.k_rope, i, h), kn = rq_row(p.k_nope, i, h);
        for (int64_t d = 0; d < c.rope_dim; ++d)
          ASSERT_EQ(kro.storage[(i * (mla ? 1 : c.kv_heads) + h) * c.rope_dim + d], rq_expect(c, p, kr, d, true, rp, c.scale_kv));
        for (int64_t d = 0; d < c.no_rope_dim; ++d)
          ASSERT_EQ(kno.storage[(i * c.kv_heads + h) * c.no_rope_dim + d], rq_expect(c, p, kn, d, false, rp, c.scale_kv));
      }
      for (int64_t h = 0; h < c.qo_heads; ++h) {
        const auto qr = rq_row(p.q_rope, i, h);
        for (int64_t d = 0; d < c.rope_dim; ++d)
          ASSERT_EQ(p.q_rope_out.storage[(i * c.qo_heads + h) * c.rope_dim + d], rq_expect(c, p, qr, d, true, rp, c.scale_q));
      }
    }
  }
}

// Against the composition of the existing CPU RoPE (float64 math rounded to
// fp16) and float_to_fp8(x * scale): the fused op skips the fp16 rounding,
// so a rare value lands one fp8 code away (a double rounding), never more.
TEST(RopeQuantizeCpuCompose, AgreesWithCpuRopeThenFp8) {
  for (bool interleave : {false, true}) {
    RQCase c;
    c.interleave = interleave, c.padding = 0, c.no_rope_dim = 0, c.scale_q = 4.f, c.lo = -4.f, c.hi = 4.f;
    RQProblem p = make_rq_problem(c, 11);
    HostTensor kro = poisoned(c.out, {p.nnz, c.kv_heads, c.rope_dim});
    const TensorView none;
    rope_quantize_fp8(p.q_rope.view, p.k_rope.view, none, none, p.cos_sin.view, RQProblem::ints(p.pos_ids),
                      p.q_rope_out.view, kro.view, none, none, options(c));
    HostTensor q16 = make_host(c.in, {p.nnz, c.qo_heads, c.rope_dim}), k16 = make_host(c.in, {p.nnz, c.kv_heads, c.rope_dim});
    apply_rope_pos_ids_cos_sin_cache(p.q_rope.view, p.k_rope.view, q16.view, k16.view, p.cos_sin.view,
                                     RQProblem::ints(p.pos_ids), interleave);
    size_t differ = 0;
    for (size_t k = 0; k < q16.storage_elems(); ++k) {
      const uint8_t want = float_to_fp8(q16.get(k) * c.scale_q, c.out), got = p.q_rope_out.storage[k];
      if (got == want) continue;
      ++differ;
      ASSERT_EQ(got & 0x80, want & 0x80) << "sign at " << k;
      ASSERT_LE(std::abs(int{got & 0x7f} - int{want & 0x7f}), 1) << "more than one fp8 code apart at " << k;
    }
    EXPECT_LT(differ, q16.storage_elems() / 50) << "too many double-rounding differences";
  }
}

struct Args {
  RQCase c;
  RQProblem p;
  Args() : p(make_rq_problem(c, 5)) {}
  void paged() { run_paged(c, p); }
};

TEST(RopeQuantizeValidation, NamesTheArgument) {
  {
    Args a;
    a.p.q_rope = make_host(DType::kFloat32, {a.p.nnz, 4, 64});
    EXPECT_THROW_MSG(a.paged(), TypeMismatch, "q_rope");
  }
  {
    Args a;
    a.p.q_rope = make_host(DType::kFloat16, {a.p.nnz, 4, 40});
    EXPECT_THROW_MSG(a.paged(), InvalidArgument, "q_rope");
  }
  {
    Args a;
    a.p.k_rope = make_host(DType::kBFloat16, {a.p.nnz, 2, 64});
    EXPECT_THROW_MSG(a.paged(), TypeMismatch, "k_rope");
  }
  {
    Args a;
    a.p.k_rope = make_host(DType::kFloat16, {a.p.nnz, 64});
    EXPECT_THROW_MSG(a.paged(), InvalidArgument, "k_rope");
  }
  {
    Args a;
    a.p.q_nope = make_host(DType::kFloat16, {a.p.nnz, 4, 24});
    EXPECT_THROW_MSG(a.paged(), InvalidArgument, "q_nope");
  }
  {
    Args a;
    a.p.k_nope = make_host(DType::kFloat16, {a.p.nnz, 2, 32});
    EXPECT_THROW_MSG(a.paged(), InvalidArgument, "k_nope");
  }
  {
    Args a;
    a.p.v = make_host(DType::kFloat16, {a.p.nnz, 2, 64});
    EXPECT_THROW_MSG(a.paged(), InvalidArgument, "v");
  }
  {
    Args a;
    a.p.cos_sin = make_host(DType::kFloat16, {300, 64});
    EXPECT_THROW_MSG(a.paged(), TypeMismatch, "cos_sin_cache");
  }
  {
    Args a;
    a.p.cos_sin = make_host(DType::kFloat32, {300, 128});
    EXPECT_THROW_MSG(a.paged(), InvalidArgument, "cos_sin_cache");
  }
  {
    Args a;
    a.p.pos_ids.pop_back();
    EXPECT_THROW_MSG(a.paged(), InvalidArgument, "pos_ids");
  }
  {
    Args a;
    a.p.q_rope_out = make_host(DType::kFloat16, {a.p.nnz, 4, 64});
    EXPECT_THROW_MSG(a.paged(), TypeMismatch, "q_rope_out");
  }
  {
    Args a;
    a.p.q_nope_out = make_host(DType::kFloat8E5M2, {a.p.nnz, 4, 64});
    EXPECT_THROW_MSG(a.paged(), TypeMismatch, "q_nope_out");
  }
  {
    Args a;
    a.p.cache0 = make_host(DType::kFloat8E5M2, {a.p.num_pages, 16, 2, 128});
    a.p.cache1 = make_host(DType::kFloat8E5M2, {a.p.num_pages, 16, 2, 128});
    EXPECT_THROW_MSG(a.paged(), TypeMismatch, "kv");
  }
  {
    Args a;
    a.p.cache0 = make_host(DType::kFloat8E4M3, {a.p.num_pages, 16, 2, 64});
    a.p.cache1 = make_host(DType::kFloat8E4M3, {a.p.num_pages, 16, 2, 64});
    EXPECT_THROW_MSG(a.paged(), InvalidArgument, "kv");
  }
  {
    Args a;
    a.p.batch_indices.pop_back();
    EXPECT_THROW_MSG(a.paged(), InvalidArgument, "batch_indices");
  }
  {
    Args a;
    a.p.indptr.clear();
    EXPECT_THROW_MSG(a.paged(), InvalidArgument, "kv_indptr");
  }
  {
    Args a;
    a.c.scale_kv = INFINITY;
    EXPECT_THROW_MSG(a.paged(), InvalidArgument, "quant_scale_kv");
  }
  {
    Args a;
    a.c.mla = true;  // 3-D k for the MLA form
    EXPECT_THROW_MSG(a.paged(), InvalidArgument, "k_rope");
  }
}

// Host index errors throw naming the index before anything is written.
TEST(RopeQuantizeValidation, BadIndicesWriteNothing) {
  const auto check = [](auto edit, const char* name) {
    Args a;
    edit(a.p);
    const RQProblem before = a.p;
    EXPECT_THROW_MSG(a.paged(), InvalidArgument, name);
    EXPECT_EQ(a.p.q_rope_out.storage, before.q_rope_out.storage) << name;
    EXPECT_EQ(a.p.cache0.storage, before.cache0.storage) << name;
    EXPECT_EQ(a.p.cache1.storage, before.cache1.storage) << name;
  };
  check([](RQProblem& p) { p.batch_indices[0] = 6; }, "batch_indices");
  check([](RQProblem& p) { p.positions[0] = 1000; }, "positions");
  check([](RQProblem& p) { p.indices[0] = 999; }, "kv_indices");
  check([](RQProblem& p) { p.pos_ids[0] = 300; }, "pos_ids");
}

// max_batch / max_indices: 0, or at least the views' lengths and below 2^31,
// on both paged forms; the unpaged form reads no table and takes neither.
TEST(RopeQuantizeValidation, TableBounds) {
  for (bool mla : {false, true}) {
    SCOPED_TRACE(mla ? "MLA" : "GQA");
    const auto rejects = [&](int64_t max_batch, int64_t max_indices, const char* name) {
      RQCase c;
      c.mla = mla;
      if (mla) c.qo_heads = 2, c.rope_dim = 64, c.no_rope_dim = 128;
      c.max_batch = max_batch, c.max_indices = max_indices;
      RQProblem p = make_rq_problem(c, 9);
      const RQProblem before = p;
      EXPECT_THROW_MSG(run_paged(c, p), InvalidArgument, name);
      expect_same_rq(p, before);
    };
    const int64_t batch = static_cast<int64_t>(RQCase{}.old_lens.size());
    rejects(batch - 1, 0, "max_batch");
    rejects(-1, 0, "max_batch");
    rejects(int64_t{1} << 31, 0, "max_batch");
    rejects(0, 1, "max_indices");  // fewer than kv_indices holds
    rejects(batch, int64_t{1} << 31, "max_indices");
  }
  Args a;
  a.c.max_batch = 8;
  HostTensor kro = poisoned(a.c.out, {a.p.nnz, a.c.kv_heads, a.c.rope_dim});
  HostTensor kno = poisoned(a.c.out, {a.p.nnz, a.c.kv_heads, a.c.no_rope_dim});
  EXPECT_THROW_MSG(rope_quantize_fp8(a.p.q_rope.view, a.p.k_rope.view, a.p.q_nope.view, a.p.k_nope.view,
                                     a.p.cos_sin.view, RQProblem::ints(a.p.pos_ids), a.p.q_rope_out.view, kro.view,
                                     a.p.q_nope_out.view, kno.view, options(a.c)),
                   InvalidArgument, "max_batch");
}

// Bounds past the views are accepted on the CPU, which reads the views only.
TEST(RopeQuantizeCpuBounds, PastTheViewsReadTheViewsOnly) {
  for (bool mla : {false, true}) {
    SCOPED_TRACE(mla ? "MLA" : "GQA");
    RQCase c;
    c.mla = mla;
    if (mla) c.qo_heads = 2, c.rope_dim = 64, c.no_rope_dim = 128;
    RQProblem p = make_rq_problem(c, 23);
    const RQProblem want = rq_expected(c, p);
    const int64_t batch = static_cast<int64_t>(p.indptr.size()) - 1, n = static_cast<int64_t>(p.indices.size());
    std::vector<int32_t> indptr = p.indptr, indices = p.indices;
    indptr.insert(indptr.end(), {-7, 1 << 30});  // garbage past the views
    indices.insert(indices.end(), {-3, 1 << 30});
    c.max_batch = batch + 2, c.max_indices = n + 2;
    const TensorView ptr(indptr.data(), DType::kInt32, Device{}, {batch + 1});
    const TensorView idx(indices.data(), DType::kInt32, Device{}, {n});
    using I = RQProblem;
    if (mla)
      rope_quantize_fp8_append_paged_mla_cache(p.q_rope.view, p.k_rope.view, p.q_nope.view, p.k_nope.view,
                                               p.cos_sin.view, I::ints(p.pos_ids), p.cache0.view, p.cache1.view, idx,
                                               ptr, I::ints(p.batch_indices), I::ints(p.positions), p.q_rope_out.view,
                                               p.q_nope_out.view, options(c));
    else
      rope_quantize_fp8_append_paged_kv_cache(p.q_rope.view, p.k_rope.view, p.q_nope.view, p.k_nope.view, p.v.view,
                                              p.cos_sin.view, I::ints(p.pos_ids),
                                              PagedKVStorage(p.cache0.view, p.cache1.view, c.layout), idx, ptr,
                                              I::ints(p.batch_indices), I::ints(p.positions), p.q_rope_out.view,
                                              p.q_nope_out.view, options(c));
    expect_same_rq(p, want);
  }
}

TEST(RopeQuantizeCatalog, KernelsAreBuiltIn) {
  const auto all = catalog::builtin_kernels();
  int found = 0;
  for (const auto& k : all) found += k.entry.rfind("tessera_rope_quantize_", 0) == 0;
  EXPECT_EQ(found, 8);
  const auto src = catalog::rope_quantize_fp8(DType::kBFloat16, DType::kFloat8E5M2, true);
  EXPECT_NE(src.source.find("page/rope_quantize.cuh"), std::string::npos);
  EXPECT_NE(src.source.find("true>(p)"), std::string::npos);
  EXPECT_THROW_MSG(catalog::rope_quantize_fp8(DType::kFloat32, DType::kFloat8E4M3, false), TypeMismatch, "q_rope");
  EXPECT_THROW_MSG(catalog::rope_quantize_fp8(DType::kFloat16, DType::kFloat16, false), TypeMismatch, "quantize_dtype");
}

// NVRTC accepts the kernels for Ampere and Hopper (no GPU needed).
TEST(RopeQuantizeCatalog, CompilesForAmpereAndHopper) {
  jit::KernelCache cache;
  std::vector<jit::KernelSource> kernels;
  for (DType t : {DType::kFloat16, DType::kBFloat16})
    for (DType q : {DType::kFloat8E4M3, DType::kFloat8E5M2})
      for (bool interleave : {false, true}) kernels.push_back(catalog::rope_quantize_fp8(t, q, interleave));
  for (const char* arch : {"sm_80", "sm_90a"}) {
    cache.precompile(kernels, jit::Arch::parse(arch), 2);
    for (const auto& k : kernels) EXPECT_FALSE(cache.cubin(k, jit::Arch::parse(arch))->image.empty()) << k.entry;
  }
}

}  // namespace
