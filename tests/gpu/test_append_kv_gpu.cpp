// append_paged_kv_cache on the GPU against the CPU path, bit for bit over the
// whole storage (so a stray write anywhere shows): fp16/bf16, NHD/HND,
// separate/interleaved K/V, page sizes 1/16/5, padded input rows, K / V
// head dims 192 / 128; 16-bit rows quantized into fp8 caches and fp8 rows
// copied; the device-side guard (out-of-range tokens are skipped, the rest
// written); a large append that exercises the grid-stride loop; CUDA-graph
// capture, also replayed after the page tables grew in their buffers.
#include <gtest/gtest.h>

#include <cstring>

#include "append_kv_util.hpp"
#include "gpu_util.hpp"
#include "tessera/api/append_kv.hpp"

using namespace tessera;
using namespace tessera::test;

namespace {

struct DeviceInts {
  cuda::DeviceBuffer buf;
  TensorView view;
};

DeviceInts ints_to_device(const std::vector<int32_t>& x) {
  HostTensor h = make_host(DType::kInt32, {static_cast<int64_t>(x.size())});
  if (!x.empty()) std::memcpy(h.storage.data(), x.data(), x.size() * sizeof(int32_t));
  DeviceTensor d = to_device(h);
  return {std::move(d.buf), d.view};
}

struct DeviceAppend {
  DeviceTensor k, v, kv, key, value;
  DeviceInts batch_indices, positions, indices, indptr, last;

  DeviceAppend(const AppendCase& c, const AppendProblem& p)
      : key(to_device(p.key)),
        value(to_device(p.value)),
        batch_indices(ints_to_device(p.batch_indices)),
        positions(ints_to_device(p.positions)),
        indices(ints_to_device(p.indices)),
        indptr(ints_to_device(p.indptr)),
        last(ints_to_device(p.last)) {
    if (c.interleaved) {
      kv = to_device(p.kv);
    } else {
      k = to_device(p.k);
      v = to_device(p.v);
    }
  }
  PagedKVStorage storage(const AppendCase& c) const {
    return c.interleaved ? PagedKVStorage(kv.view, c.layout) : PagedKVStorage(k.view, v.view, c.layout);
  }
  void append(const AppendCase& c, cudaStream_t stream = nullptr, const AppendOptions& opt = {}) const {
    append_paged_kv_cache(key.view, value.view, batch_indices.view, positions.view, storage(c), indices.view,
                          indptr.view, last.view, stream, opt);
  }
  // The cache copied back into a problem laid out like `like`.
  AppendProblem download(const AppendCase& c, const AppendProblem& like) const {
    AppendProblem out = like;
    if (c.interleaved) {
      out.kv = to_host(kv, like.kv);
    } else {
      out.k = to_host(k, like.k);
      out.v = to_host(v, like.v);
    }
    return out;
  }
};

void append_on_cpu(const AppendCase& c, AppendProblem& p) {
  append_paged_kv_cache(p.key.view, p.value.view, AppendProblem::ints(p.batch_indices),
                        AppendProblem::ints(p.positions), p.storage(c), AppendProblem::ints(p.indices),
                        AppendProblem::ints(p.indptr), AppendProblem::ints(p.last));
}

class AppendGpu : public ::testing::TestWithParam<std::tuple<DType, KVLayout, bool, int>> {};

TEST_P(AppendGpu, MatchesCpuBitwise) {
  SKIP_WITHOUT_GPU();
  const auto [dt, layout, interleaved, page_size] = GetParam();
  AppendCase c;
  c.dt = dt;
  c.layout = layout;
  c.interleaved = interleaved;
  c.page_size = page_size;
  c.heads = 4;
  c.head_dim = 128;
  c.old_lens = {0, 5, 16, 31, 100, 7, 250};
  c.add_lens = {3, 1, 1, 2, 40, 0, 1};
  for (bool padded : {false, true}) {
    SCOPED_TRACE(padded ? "padded rows" : "contiguous rows");
    c.padded_rows = padded;
    AppendProblem p = make_append_problem(c, 31 + page_size);
    DeviceAppend d(c, p);
    d.append(c);
    TESSERA_CUDA_CHECK(cudaDeviceSynchronize());
    const AppendProblem got = d.download(c, p);
    const AppendProblem want = expected_after_append(c, p);
    append_on_cpu(c, p);
    expect_same_cache(c, p, want);
    expect_same_cache(c, got, p);
  }
}

INSTANTIATE_TEST_SUITE_P(All, AppendGpu,
                         ::testing::Combine(::testing::Values(DType::kFloat16, DType::kBFloat16),
                                            ::testing::Values(KVLayout::kNHD, KVLayout::kHND), ::testing::Bool(),
                                            ::testing::Values(1, 16, 5)));

// 16-bit rows quantized into fp8 caches: the same bits as float_to_fp8 of
// value / scale (saturating: |3 / 0.005| > 448), scales as floats or as
// device tensors times floats.
class AppendFp8Gpu : public ::testing::TestWithParam<std::tuple<DType, DType, KVLayout, bool>> {};

TEST_P(AppendFp8Gpu, MatchesFloatToFp8Bitwise) {
  SKIP_WITHOUT_GPU();
  const auto [rows, cache, layout, interleaved] = GetParam();
  AppendCase c;
  c.dt = rows;
  c.cache_dt = cache;
  c.layout = layout;
  c.interleaved = interleaved;
  c.page_size = interleaved ? 5 : 16;
  c.heads = 4;
  c.head_dim = 128;
  c.old_lens = {0, 5, 16, 31, 100, 7, 250};
  c.add_lens = {3, 1, 1, 2, 40, 0, 1};
  c.row_lo = -3.f, c.row_hi = 3.f;
  c.k_scale = 0.0125f;
  c.v_scale = 0.005f;
  for (bool tensor : {false, true}) {
    SCOPED_TRACE(tensor ? "scale tensors" : "float scales");
    AppendProblem p = make_append_problem(c, 41);
    HostTensor kt = make_host(DType::kFloat32, {1}), vt = make_host(DType::kFloat32, {1});
    kt.set(0, 0.5f);
    vt.set(0, 2.f);
    DeviceTensor dkt = to_device(kt), dvt = to_device(vt);
    AppendOptions opt;
    opt.k_scale = tensor ? c.k_scale / 0.5f : c.k_scale;
    opt.v_scale = tensor ? c.v_scale / 2.f : c.v_scale;
    if (tensor) {
      opt.k_scale_tensor = dkt.view;
      opt.v_scale_tensor = dvt.view;
    }
    DeviceAppend d(c, p);
    d.append(c, nullptr, opt);
    TESSERA_CUDA_CHECK(cudaDeviceSynchronize());
    expect_same_cache(c, d.download(c, p), expected_after_append(c, p));
  }
}

INSTANTIATE_TEST_SUITE_P(All, AppendFp8Gpu,
                         ::testing::Combine(::testing::Values(DType::kFloat16, DType::kBFloat16),
                                            ::testing::Values(DType::kFloat8E4M3, DType::kFloat8E5M2),
                                            ::testing::Values(KVLayout::kNHD, KVLayout::kHND), ::testing::Bool()));

TEST(AppendGpuExtra, Fp8RowsCopiedBitForBit) {
  SKIP_WITHOUT_GPU();
  AppendCase c;
  c.dt = DType::kFloat8E4M3;
  c.head_dim = 256;
  c.old_lens = {0, 100, 3};
  c.add_lens = {40, 20, 17};
  AppendProblem p = make_append_problem(c, 3);
  DeviceAppend dev(c, p);
  dev.append(c);
  TESSERA_CUDA_CHECK(cudaDeviceSynchronize());
  expect_same_cache(c, dev.download(c, p), expected_after_append(c, p));
}

TEST(AppendGpuExtra, HeadDims) {
  SKIP_WITHOUT_GPU();
  for (int64_t d : {64, 256}) {
    AppendCase c;
    c.head_dim = d;
    c.heads = 8;
    c.dt = DType::kBFloat16;
    c.old_lens = {0, 100, 3};
    c.add_lens = {40, 20, 17};
    AppendProblem p = make_append_problem(c, d);
    DeviceAppend dev(c, p);
    dev.append(c);
    TESSERA_CUDA_CHECK(cudaDeviceSynchronize());
    const AppendProblem got = dev.download(c, p);
    append_on_cpu(c, p);
    expect_same_cache(c, got, p);
  }
}

// K rows of 192 features and V rows of 128, each at its own strides: copies
// and quantizing appends, NHD and HND, against the host expectation.
TEST(AppendGpuExtra, UnequalHeadDims) {
  SKIP_WITHOUT_GPU();
  for (KVLayout layout : {KVLayout::kNHD, KVLayout::kHND}) {
    for (bool fp8 : {false, true}) {
      SCOPED_TRACE(std::string(layout == KVLayout::kNHD ? "NHD" : "HND") + (fp8 ? ", fp8 cache" : ""));
      AppendOptions opt;
      const AppendCase c =
          unequal_dims_case(layout, true, {0, 100, 3, 31}, {40, 20, 17, 1},
                            fp8 ? std::optional<DType>(DType::kFloat8E5M2) : std::nullopt, DType::kFloat16, opt);
      AppendProblem p = make_append_problem(c, 72);
      DeviceAppend d(c, p);
      d.append(c, nullptr, opt);
      TESSERA_CUDA_CHECK(cudaDeviceSynchronize());
      expect_same_cache(c, d.download(c, p), expected_after_append(c, p));
    }
  }
}

// A prefill-sized append: 2.7M vectors, more than the grid has threads
// (4096 x 256), so the grid-stride loop runs several rounds.
TEST(AppendGpuExtra, LargeAppend) {
  SKIP_WITHOUT_GPU();
  AppendCase c;
  c.heads = 4;
  c.head_dim = 128;
  c.old_lens = {0, 1000, 3};
  c.add_lens = {40000, 1000, 17};
  AppendProblem p = make_append_problem(c, 5);
  DeviceAppend dev(c, p);
  dev.append(c);
  TESSERA_CUDA_CHECK(cudaDeviceSynchronize());
  const AppendProblem got = dev.download(c, p);
  append_on_cpu(c, p);
  expect_same_cache(c, got, p);
}

// Tokens the page table or the storage does not cover are skipped on the
// device; every other token is still written.
TEST(AppendGpuExtra, DeviceGuardSkipsOutOfRangeTokens) {
  SKIP_WITHOUT_GPU();
  AppendCase c;
  c.old_lens = {5, 20, 0};
  c.add_lens = {4, 6, 3};
  AppendProblem p = make_append_problem(c, 8);
  std::vector<bool> bad(p.positions.size(), false);
  auto corrupt = [&](size_t i, auto&& fn) {
    fn(i);
    bad[i] = true;
  };
  corrupt(0, [&](size_t i) { p.batch_indices[i] = 3; });                 // no such request
  corrupt(1, [&](size_t i) { p.batch_indices[i] = -1; });
  corrupt(2, [&](size_t i) { p.positions[i] = -4; });
  corrupt(3, [&](size_t i) {                                              // past the request's length
    const int32_t b = p.batch_indices[i];
    const int32_t pages = p.indptr[b + 1] - p.indptr[b];
    p.positions[i] = (pages - 1) * c.page_size + p.last[b];
  });
  corrupt(4, [&](size_t i) { p.positions[i] = 1 << 20; });               // past the request's pages
  // A page index beyond the storage, on a page only token 5 uses.
  const int32_t b5 = p.batch_indices[5];
  const int32_t j5 = p.indptr[b5] + p.positions[5] / c.page_size;
  bool shared = false;
  for (size_t i = 6; i < p.positions.size(); ++i)
    shared |= p.batch_indices[i] == b5 && p.indptr[b5] + p.positions[i] / c.page_size == j5;
  if (!shared) corrupt(5, [&](size_t) { p.indices[j5] = static_cast<int32_t>(p.num_pages); });

  const AppendProblem want = expected_after_append(c, p, [&](size_t i) { return !bad[i]; });
  DeviceAppend d(c, p);
  d.append(c);
  TESSERA_CUDA_CHECK(cudaDeviceSynchronize());
  expect_same_cache(c, d.download(c, p), want);
}

TEST(AppendGpuExtra, CapturedInACudaGraph) {
  SKIP_WITHOUT_GPU();
  AppendCase c;
  c.layout = KVLayout::kHND;
  c.interleaved = true;
  c.old_lens = {9, 0, 64};
  c.add_lens = {1, 1, 1};
  AppendProblem p = make_append_problem(c, 21);
  DeviceAppend d(c, p);
  cudaStream_t stream;
  TESSERA_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  d.append(c, stream);  // loads (JIT-compiles) the kernel outside the capture
  TESSERA_CUDA_CHECK(cudaStreamSynchronize(stream));
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  TESSERA_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  d.append(c, stream);
  TESSERA_CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
  TESSERA_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  d.kv.buf.upload(p.kv.storage.data(), p.kv.storage.size());  // back to the old contents
  TESSERA_CUDA_CHECK(cudaDeviceSynchronize());
  TESSERA_CUDA_CHECK(cudaGraphLaunch(exec, stream));
  TESSERA_CUDA_CHECK(cudaStreamSynchronize(stream));
  const AppendProblem got = d.download(c, p);
  append_on_cpu(c, p);
  expect_same_cache(c, got, p);
  TESSERA_CUDA_CHECK(cudaGraphExecDestroy(exec));
  TESSERA_CUDA_CHECK(cudaGraphDestroy(graph));
  TESSERA_CUDA_CHECK(cudaStreamDestroy(stream));
}

// A graph captured with views of preallocated tables (a serving engine's
// kv_indptr_buf[:bs + 1], ...) and max_batch / max_indices set to the
// buffers' capacity appends by the tables a replay finds in the buffers, with
// more requests and pages than the views covered at capture time. Without
// the bounds the same replay reads the captured views only (requests 0, 1).
TEST(AppendGpuExtra, GraphFollowsTablesThatGrow) {
  SKIP_WITHOUT_GPU();
  AppendCase c;
  c.old_lens = {9, 0, 64, 30, 5, 17};
  c.add_lens = {1, 2, 1, 3, 1, 16};
  AppendProblem p = make_append_problem(c, 33);
  DeviceAppend d(c, p);
  // Capture-time views: two requests and their pages.
  d.indptr.view.shape = {3};
  d.last.view.shape = {2};
  d.indices.view.shape = {p.indptr[2]};
  AppendOptions grow;
  grow.max_batch = static_cast<int64_t>(p.last.size());
  grow.max_indices = static_cast<int64_t>(p.indices.size());
  // Empty tables until the step below writes its own (no request has pages).
  for (DeviceInts* t : {&d.indptr, &d.last, &d.indices}) t->buf.fill(0);
  cudaStream_t stream;
  TESSERA_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  d.append(c, stream, grow);  // loads the kernel outside the capture; writes nothing
  TESSERA_CUDA_CHECK(cudaStreamSynchronize(stream));
  cudaGraph_t graph[2];
  cudaGraphExec_t exec[2];
  for (int g = 0; g < 2; ++g) {
    TESSERA_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    d.append(c, stream, g == 0 ? grow : AppendOptions{});
    TESSERA_CUDA_CHECK(cudaStreamEndCapture(stream, &graph[g]));
    TESSERA_CUDA_CHECK(cudaGraphInstantiate(&exec[g], graph[g], 0));
  }
  // The step: every request's table written into the same buffers.
  for (auto [t, x] : {std::pair{&d.indptr, &p.indptr}, {&d.last, &p.last}, {&d.indices, &p.indices}})
    t->buf.upload(x->data(), x->size() * sizeof(int32_t));
  for (int g = 0; g < 2; ++g) {
    SCOPED_TRACE(g == 0 ? "max_batch / max_indices: the buffers" : "the views' lengths");
    d.k.buf.upload(p.k.storage.data(), p.k.storage.size());  // the old contents
    d.v.buf.upload(p.v.storage.data(), p.v.storage.size());
    TESSERA_CUDA_CHECK(cudaGraphLaunch(exec[g], stream));
    TESSERA_CUDA_CHECK(cudaStreamSynchronize(stream));
    const AppendProblem want =
        g == 0 ? expected_after_append(c, p) : expected_after_append(c, p, [&](size_t i) { return p.batch_indices[i] < 2; });
    expect_same_cache(c, d.download(c, p), want);
  }
  for (int g = 0; g < 2; ++g) {
    TESSERA_CUDA_CHECK(cudaGraphExecDestroy(exec[g]));
    TESSERA_CUDA_CHECK(cudaGraphDestroy(graph[g]));
  }
  TESSERA_CUDA_CHECK(cudaStreamDestroy(stream));
}

TEST(AppendGpuExtra, BadInput) {
  SKIP_WITHOUT_GPU();
  AppendCase c;
  c.old_lens = {3};
  c.add_lens = {2};
  AppendProblem p = make_append_problem(c, 4);
  DeviceAppend d(c, p);
  // Index tensors on the host with a CUDA cache.
  EXPECT_THROW_MSG(append_paged_kv_cache(d.key.view, d.value.view, AppendProblem::ints(p.batch_indices),
                                         d.positions.view, d.storage(c), d.indices.view, d.indptr.view, d.last.view),
                   TypeMismatch, "batch_indices");
  // Rows on the host.
  EXPECT_THROW_MSG(append_paged_kv_cache(p.key.view, d.value.view, d.batch_indices.view, d.positions.view,
                                         d.storage(c), d.indices.view, d.indptr.view, d.last.view),
                   TypeMismatch, "append_key");
  // Rows whose token stride breaks 16-byte vectors (two rows: the stride of a
  // size-1 dim never matters, so one row would be accepted).
  TensorView odd = d.key.view;
  odd.strides = {c.heads * c.head_dim + 4, c.head_dim, 1};
  EXPECT_THROW_MSG(append_paged_kv_cache(odd, d.value.view, d.batch_indices.view, d.positions.view, d.storage(c),
                                         d.indices.view, d.indptr.view, d.last.view),
                   InvalidArgument, "append_key");
}

}  // namespace
