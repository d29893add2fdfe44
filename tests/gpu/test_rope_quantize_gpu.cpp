// The fused RoPE + fp8 quantize (+ paged append) kernel against the host
// reference of rope_quantize_util.hpp, byte for byte over every output and
// the whole cache (poisoned first, so a stray or missing write shows):
// fp16 / bf16 rows into e4m3 / e5m2, NHD / HND, page sizes 1 / 16, half-split
// and interleaved pairs, GQA and MLA caches, padding tokens, saturation; the
// unpaged rope_quantize_fp8 form; the CPU path on the same problem; the
// device-side guards; a large problem for the grid-stride loop; CUDA-graph
// capture, also replayed after the page tables grew in their buffers.
#include <gtest/gtest.h>

#include <cstring>

#include "gpu_util.hpp"
#include "rope_quantize_util.hpp"
#include "tessera/api/rope_quantize.hpp"

using namespace tessera;
using namespace tessera::test;

namespace {

DeviceTensor ints_to_device(const std::vector<int32_t>& x) {
  HostTensor h = make_host(DType::kInt32, {static_cast<int64_t>(x.size())});
  if (!x.empty()) std::memcpy(h.storage.data(), x.data(), x.size() * sizeof(int32_t));
  return to_device(h);
}

struct DeviceRQ {
  DeviceTensor q_rope, k_rope, q_nope, k_nope, v, cos_sin, q_rope_out, q_nope_out, cache0, cache1;
  DeviceTensor pos_ids, batch_indices, positions, indptr, indices;
  explicit DeviceRQ(const RQProblem& p)
      : q_rope(to_device(p.q_rope)), k_rope(to_device(p.k_rope)), q_nope(to_device(p.q_nope)),
        k_nope(to_device(p.k_nope)), v(to_device(p.v)), cos_sin(to_device(p.cos_sin)),
        q_rope_out(to_device(p.q_rope_out)), q_nope_out(to_device(p.q_nope_out)), cache0(to_device(p.cache0)),
        cache1(to_device(p.cache1)), pos_ids(ints_to_device(p.pos_ids)), batch_indices(ints_to_device(p.batch_indices)),
        positions(ints_to_device(p.positions)), indptr(ints_to_device(p.indptr)), indices(ints_to_device(p.indices)) {}

  void run(const RQCase& c, cudaStream_t stream = nullptr) const {
    if (c.mla) {
      rope_quantize_fp8_append_paged_mla_cache(q_rope.view, k_rope.view, q_nope.view, k_nope.view, cos_sin.view,
                                               pos_ids.view, cache0.view, cache1.view, indices.view, indptr.view,
                                               batch_indices.view, positions.view, q_rope_out.view, q_nope_out.view,
                                               options(c), stream);
    } else {
      rope_quantize_fp8_append_paged_kv_cache(q_rope.view, k_rope.view, q_nope.view, k_nope.view, v.view, cos_sin.view,
                                              pos_ids.view, PagedKVStorage(cache0.view, cache1.view, c.layout),
                                              indices.view, indptr.view, batch_indices.view, positions.view,
                                              q_rope_out.view, q_nope_out.view, options(c), stream);
    }
  }
  RQProblem download(const RQProblem& like) const {
    RQProblem out = like;
    out.q_rope_out = to_host(q_rope_out, like.q_rope_out);
    out.q_nope_out = to_host(q_nope_out, like.q_nope_out);
    out.cache0 = to_host(cache0, like.cache0);
    out.cache1 = to_host(cache1, like.cache1);
    return out;
  }
};

void run_cpu(const RQCase& c, RQProblem& p) {
  using I = RQProblem;
  if (c.mla)
    rope_quantize_fp8_append_paged_mla_cache(p.q_rope.view, p.k_rope.view, p.q_nope.view, p.k_nope.view, p.cos_sin.view,
                                             I::ints(p.pos_ids), p.cache0.view, p.cache1.view, I::ints(p.indices),
                                             I::ints(p.indptr), I::ints(p.batch_indices), I::ints(p.positions),
                                             p.q_rope_out.view, p.q_nope_out.view, options(c));
  else
    rope_quantize_fp8_append_paged_kv_cache(p.q_rope.view, p.k_rope.view, p.q_nope.view, p.k_nope.view, p.v.view,
                                            p.cos_sin.view, I::ints(p.pos_ids), PagedKVStorage(p.cache0.view, p.cache1.view, c.layout),
                                            I::ints(p.indices), I::ints(p.indptr), I::ints(p.batch_indices),
                                            I::ints(p.positions), p.q_rope_out.view, p.q_nope_out.view, options(c));
}

class RopeQuantizeGpu : public ::testing::TestWithParam<std::tuple<DType, DType, KVLayout, bool, int>> {};

TEST_P(RopeQuantizeGpu, MatchesHostReferenceBitwise) {
  SKIP_WITHOUT_GPU();
  const auto [in, out, layout, interleave, page_size] = GetParam();
  for (bool mla : {false, true}) {
    if (mla && layout == KVLayout::kHND) continue;  // MLA caches have no layout
    SCOPED_TRACE(mla ? "MLA" : "GQA");
    RQCase c;
    c.in = in, c.out = out, c.layout = layout, c.interleave = interleave, c.page_size = page_size, c.mla = mla;
    c.qo_heads = mla ? 16 : 8;
    c.kv_heads = mla ? 1 : 2;
    c.rope_dim = 64;
    c.no_rope_dim = mla ? 512 : 64;
    RQProblem p = make_rq_problem(c, 101 + page_size);
    const RQProblem want = rq_expected(c, p);
    DeviceRQ d(p);
    d.run(c);
    TESSERA_CUDA_CHECK(cudaDeviceSynchronize());
    expect_same_rq(d.download(p), want);
    run_cpu(c, p);  // the CPU path agrees with both
    expect_same_rq(p, want);
  }
}

INSTANTIATE_TEST_SUITE_P(All, RopeQuantizeGpu,
                         ::testing::Combine(::testing::Values(DType::kFloat16, DType::kBFloat16),
                                            ::testing::Values(DType::kFloat8E4M3, DType::kFloat8E5M2),
                                            ::testing::Values(KVLayout::kNHD, KVLayout::kHND), ::testing::Bool(),
                                            ::testing::Values(1, 16)));

// Head dim 128 with no non-rotary part (Llama-style), page size 64.
TEST(RopeQuantizeGpuShapes, FullRotaryHeadDim128) {
  SKIP_WITHOUT_GPU();
  RQCase c;
  c.rope_dim = 128, c.no_rope_dim = 0, c.page_size = 64, c.qo_heads = 32, c.kv_heads = 8;
  RQProblem p = make_rq_problem(c, 5);
  const RQProblem want = rq_expected(c, p);
  DeviceRQ d(p);
  const TensorView none;
  rope_quantize_fp8_append_paged_kv_cache(d.q_rope.view, d.k_rope.view, none, none, d.v.view, d.cos_sin.view,
                                          d.pos_ids.view, PagedKVStorage(d.cache0.view, d.cache1.view, c.layout),
                                          d.indices.view, d.indptr.view, d.batch_indices.view, d.positions.view,
                                          d.q_rope_out.view, none, options(c));
  TESSERA_CUDA_CHECK(cudaDeviceSynchronize());
  expect_same_rq(d.download(p), want);
}

// The unpaged form: k to its own outputs, every token written.
TEST(RopeQuantizeGpuUnpaged, MatchesCpuPathBitwise) {
  SKIP_WITHOUT_GPU();
  for (bool mla : {false, true}) {
    SCOPED_TRACE(mla ? "MLA" : "GQA");
    RQCase c;
    c.mla = mla, c.padding = 0, c.interleave = !mla, c.out = DType::kFloat8E5M2;
    RQProblem p = make_rq_problem(c, 9);
    const std::vector<int64_t> kr = mla ? std::vector<int64_t>{p.nnz, 64} : std::vector<int64_t>{p.nnz, 2, 64};
    HostTensor kro = poisoned(c.out, kr), kno = poisoned(c.out, kr);
    DeviceRQ d(p);
    DeviceTensor dkro = to_device(kro), dkno = to_device(kno);
    rope_quantize_fp8(d.q_rope.view, d.k_rope.view, d.q_nope.view, d.k_nope.view, d.cos_sin.view, d.pos_ids.view,
                      d.q_rope_out.view, dkro.view, d.q_nope_out.view, dkno.view, options(c));
    TESSERA_CUDA_CHECK(cudaDeviceSynchronize());
    RQProblem got = d.download(p);
    HostTensor gkro = to_host(dkro, kro), gkno = to_host(dkno, kno);
    rope_quantize_fp8(p.q_rope.view, p.k_rope.view, p.q_nope.view, p.k_nope.view, p.cos_sin.view,
                      RQProblem::ints(p.pos_ids), p.q_rope_out.view, kro.view, p.q_nope_out.view, kno.view, options(c));
    EXPECT_EQ(got.q_rope_out.storage, p.q_rope_out.storage);
    EXPECT_EQ(got.q_nope_out.storage, p.q_nope_out.storage);
    EXPECT_EQ(gkro.storage, kro.storage);
    EXPECT_EQ(gkno.storage, kno.storage);
    EXPECT_EQ(std::count(kro.storage.begin(), kro.storage.end(), uint8_t{0xFF}), 0);  // all written
  }
}

// Device guards: a token of an out-of-range request or page keeps its K / V
// slots untouched (q still written); an out-of-cache RoPE position gives fp8
// NaN in the rotated features only.
TEST(RopeQuantizeGpuGuards, SkipsUncoveredTokens) {
  SKIP_WITHOUT_GPU();
  RQCase c;
  RQProblem p = make_rq_problem(c, 13);
  RQProblem bad = p;
  bad.batch_indices[0] = 100;  // no such request
  bad.positions[1] = 10000;    // beyond its request's pages
  bad.pos_ids[2] = 5000;       // outside the cos/sin cache
  RQProblem ref = p;  // the expected result: tokens 0 and 1 drop their K / V
  ref.batch_indices[0] = ref.batch_indices[1] = -1;
  RQProblem want = rq_expected(c, ref);
  DeviceRQ d(bad);
  d.run(c);
  TESSERA_CUDA_CHECK(cudaDeviceSynchronize());
  RQProblem got = d.download(bad);
  const RQProblem full = rq_expected(c, p);
  // q of tokens 0 and 1 is written as usual.
  const size_t qrow = static_cast<size_t>(c.qo_heads * c.rope_dim), nrow = static_cast<size_t>(c.qo_heads * c.no_rope_dim);
  std::copy_n(full.q_rope_out.storage.begin(), 2 * qrow, want.q_rope_out.storage.begin());
  std::copy_n(full.q_nope_out.storage.begin(), 2 * nrow, want.q_nope_out.storage.begin());
  // Token 2: NaN (0x7f, or 0xff for a negative-signed NaN) in its rotated features.
  for (size_t k = 2 * qrow; k < 3 * qrow; ++k) {
    const uint8_t b = got.q_rope_out.storage[k];
    EXPECT_EQ(b & 0x7f, 0x7f) << k;
    got.q_rope_out.storage[k] = want.q_rope_out.storage[k];
  }
  // Token 2's K rotary features: NaN too; compare the rest.
  const int64_t b2 = p.batch_indices[2], pos2 = p.positions[2];
  const int64_t page = p.indices[p.indptr[b2] + pos2 / c.page_size], slot = pos2 % c.page_size, D = c.rope_dim + c.no_rope_dim;
  for (int64_t h = 0; h < c.kv_heads; ++h)
    for (int64_t d0 = 0; d0 < c.rope_dim; ++d0) {
      const size_t at = static_cast<size_t>(((page * c.page_size + slot) * c.kv_heads + h) * D + d0);
      EXPECT_EQ(got.cache0.storage[at] & 0x7f, 0x7f) << at;
      got.cache0.storage[at] = want.cache0.storage[at];
    }
  expect_same_rq(got, want);
}

// Enough work for several grid-stride iterations (the grid is capped at 4096 blocks).
TEST(RopeQuantizeGpuLarge, GridStrideLoop) {
  SKIP_WITHOUT_GPU();
  RQCase c;
  c.qo_heads = 32, c.kv_heads = 8, c.rope_dim = 64, c.no_rope_dim = 64, c.page_size = 16, c.padding = 5;
  c.old_lens.assign(64, 100);
  c.add_lens.assign(64, 64);
  RQProblem p = make_rq_problem(c, 17);
  const RQProblem want = rq_expected(c, p);
  DeviceRQ d(p);
  d.run(c);
  TESSERA_CUDA_CHECK(cudaDeviceSynchronize());
  expect_same_rq(d.download(p), want);
}

// One launch, no allocation, no sync: capturable in a CUDA graph.
TEST(RopeQuantizeGpuGraph, CapturesAndReplays) {
  SKIP_WITHOUT_GPU();
  RQCase c;
  RQProblem p = make_rq_problem(c, 19);
  const RQProblem want = rq_expected(c, p);
  DeviceRQ d(p);
  d.run(c);  // compile outside the capture
  TESSERA_CUDA_CHECK(cudaDeviceSynchronize());
  d.q_rope_out.buf.fill(0xFF);
  d.q_nope_out.buf.fill(0xFF);
  d.cache0.buf.fill(0xFF);
  d.cache1.buf.fill(0xFF);
  cudaStream_t s;
  TESSERA_CUDA_CHECK(cudaStreamCreate(&s));
  cudaGraph_t g;
  cudaGraphExec_t ge;
  TESSERA_CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  d.run(c, s);
  TESSERA_CUDA_CHECK(cudaStreamEndCapture(s, &g));
  TESSERA_CUDA_CHECK(cudaGraphInstantiate(&ge, g, 0));
  TESSERA_CUDA_CHECK(cudaGraphLaunch(ge, s));
  TESSERA_CUDA_CHECK(cudaStreamSynchronize(s));
  expect_same_rq(d.download(p), want);
  cudaGraphExecDestroy(ge);
  cudaGraphDestroy(g);
  cudaStreamDestroy(s);
}

// A graph captured with views of two requests' tables and max_batch /
// max_indices at the buffers' capacity follows the larger tables written
// into the same buffers before the replay (a serving engine's growing batch).
TEST(RopeQuantizeGpuGraph, FollowsTablesThatGrow) {
  SKIP_WITHOUT_GPU();
  for (bool mla : {false, true}) {
    SCOPED_TRACE(mla ? "MLA" : "GQA");
    RQCase c;
    c.mla = mla;
    if (mla) c.qo_heads = 16, c.kv_heads = 1, c.no_rope_dim = 512;
    RQProblem p = make_rq_problem(c, 29);
    const RQProblem want = rq_expected(c, p);
    DeviceRQ d(p);
    d.indptr.view.shape = {3};
    d.indices.view.shape = {p.indptr[2]};
    c.max_batch = static_cast<int64_t>(p.indptr.size()) - 1;
    c.max_indices = static_cast<int64_t>(p.indices.size());
    d.indptr.buf.fill(0);  // empty tables until the step writes its own
    d.indices.buf.fill(0);
    cudaStream_t s;
    TESSERA_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    d.run(c, s);  // compile outside the capture
    TESSERA_CUDA_CHECK(cudaStreamSynchronize(s));
    cudaGraph_t g;
    cudaGraphExec_t ge;
    TESSERA_CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    d.run(c, s);
    TESSERA_CUDA_CHECK(cudaStreamEndCapture(s, &g));
    TESSERA_CUDA_CHECK(cudaGraphInstantiate(&ge, g, 0));
    d.indptr.buf.upload(p.indptr.data(), p.indptr.size() * sizeof(int32_t));
    d.indices.buf.upload(p.indices.data(), p.indices.size() * sizeof(int32_t));
    for (DeviceTensor* t : {&d.q_rope_out, &d.q_nope_out, &d.cache0, &d.cache1}) t->buf.fill(0xFF);
    TESSERA_CUDA_CHECK(cudaGraphLaunch(ge, s));
    TESSERA_CUDA_CHECK(cudaStreamSynchronize(s));
    expect_same_rq(d.download(p), want);
    TESSERA_CUDA_CHECK(cudaGraphExecDestroy(ge));
    TESSERA_CUDA_CHECK(cudaGraphDestroy(g));
    TESSERA_CUDA_CHECK(cudaStreamDestroy(s));
  }
}

}  // namespace
