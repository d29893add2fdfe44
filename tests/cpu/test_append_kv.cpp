// append_paged_kv_cache on host tensors: every token lands in the page and
// slot its request's page table names (NHD, HND, interleaved; page sizes 1,
// 16 and odd; padded input rows; K and V of head dims 192 / 128), nothing
// else in the cache changes, and bad input is rejected by name before
// anything is written.
#include <gtest/gtest.h>

#include "append_kv_util.hpp"
#include "tessera/api/append_kv.hpp"

using namespace tessera;
using namespace tessera::test;

namespace {

void run_append(const AppendCase& c, AppendProblem& p) {
  append_paged_kv_cache(p.key.view, p.value.view, AppendProblem::ints(p.batch_indices),
                        AppendProblem::ints(p.positions), p.storage(c), AppendProblem::ints(p.indices),
                        AppendProblem::ints(p.indptr), AppendProblem::ints(p.last));
}

class AppendCpu : public ::testing::TestWithParam<std::tuple<DType, KVLayout, bool, int>> {};

TEST_P(AppendCpu, PlacesEveryTokenAndNothingElse) {
  const auto [dt, layout, interleaved, page_size] = GetParam();
  AppendCase c;
  c.dt = dt;
  c.layout = layout;
  c.interleaved = interleaved;
  c.page_size = page_size;
  // Fresh requests, decode steps (one token), page-boundary crossings, and a
  // request that appends nothing.
  c.old_lens = {0, 5, 16, 31, 100, 7};
  c.add_lens = {3, 1, 1, 2, 40, 0};
  for (bool padded : {false, true}) {
    SCOPED_TRACE(padded ? "padded rows" : "contiguous rows");
    c.padded_rows = padded;
    AppendProblem p = make_append_problem(c, 17 + page_size);
    const AppendProblem want = expected_after_append(c, p);
    run_append(c, p);
    expect_same_cache(c, p, want);
  }
}

INSTANTIATE_TEST_SUITE_P(All, AppendCpu,
                         ::testing::Combine(::testing::Values(DType::kFloat16, DType::kBFloat16),
                                            ::testing::Values(KVLayout::kNHD, KVLayout::kHND), ::testing::Bool(),
                                            ::testing::Values(1, 16, 5)));

TEST(AppendCpuExtra, HeadDimsAndManyHeads) {
  for (int64_t d : {64, 128, 256}) {
    AppendCase c;
    c.head_dim = d;
    c.heads = 8;
    c.layout = KVLayout::kHND;
    c.old_lens = {3, 0};
    c.add_lens = {20, 17};
    AppendProblem p = make_append_problem(c, d);
    const AppendProblem want = expected_after_append(c, p);
    run_append(c, p);
    expect_same_cache(c, p, want);
  }
}

// K rows of 192 features and V rows of 128 (DeepSeek-style prefill caches),
// each at its own strides; copies, and 16-bit rows quantized into fp8.
TEST(AppendCpuExtra, UnequalHeadDims) {
  for (KVLayout layout : {KVLayout::kNHD, KVLayout::kHND}) {
    for (bool padded : {false, true}) {
      for (bool fp8 : {false, true}) {
        SCOPED_TRACE(std::string(layout == KVLayout::kNHD ? "NHD" : "HND") + (padded ? ", padded rows" : "") +
                     (fp8 ? ", fp8 cache" : ""));
        AppendOptions opt;
        const AppendCase c =
            unequal_dims_case(layout, padded, {0, 5, 16, 31}, {3, 1, 17, 2},
                              fp8 ? std::optional<DType>(DType::kFloat8E4M3) : std::nullopt, DType::kBFloat16, opt);
        AppendProblem p = make_append_problem(c, 70);
        const AppendProblem want = expected_after_append(c, p);
        append_paged_kv_cache(p.key.view, p.value.view, AppendProblem::ints(p.batch_indices),
                              AppendProblem::ints(p.positions), p.storage(c), AppendProblem::ints(p.indices),
                              AppendProblem::ints(p.indptr), AppendProblem::ints(p.last), nullptr, opt);
        expect_same_cache(c, p, want);
      }
    }
  }
}

// Each row tensor is checked against its own cache's width.
TEST(AppendCpuExtra, UnequalHeadDimsRowWidths) {
  AppendCase c;
  c.head_dim = 192;
  c.v_head_dim = 128;
  c.old_lens = {4};
  c.add_lens = {2};
  AppendProblem p = make_append_problem(c, 71);
  const AppendProblem before = p;
  auto call = [&](const TensorView& key, const TensorView& value) {
    append_paged_kv_cache(key, value, AppendProblem::ints(p.batch_indices), AppendProblem::ints(p.positions),
                          p.storage(c), AppendProblem::ints(p.indices), AppendProblem::ints(p.indptr),
                          AppendProblem::ints(p.last));
  };
  EXPECT_THROW_MSG(call(p.key.view, p.key.view), InvalidArgument, "append_value");
  EXPECT_THROW_MSG(call(p.value.view, p.value.view), InvalidArgument, "append_key");
  expect_same_cache(c, p, before);
}

TEST(AppendCpuExtra, NoTokensIsANoOp) {
  AppendCase c;
  c.old_lens = {4, 9};
  c.add_lens = {0, 0};
  AppendProblem p = make_append_problem(c, 1);
  const AppendProblem before = p;
  run_append(c, p);
  expect_same_cache(c, p, before);
}

class AppendCpuErrors : public ::testing::Test {
 protected:
  void SetUp() override {
    c.old_lens = {5, 20};
    c.add_lens = {2, 3};
    p = make_append_problem(c, 99);
    before = p;
  }
  // Runs with the given overrides; the cache must be untouched afterwards.
  void call() { run_append(c, p); }
  void TearDown() override { expect_same_cache(c, p, before); }
  AppendCase c;
  AppendProblem p, before;
};

TEST_F(AppendCpuErrors, RowsDtypeShapeDevice) {
  HostTensor f32 = make_host(DType::kFloat32, {5, 2, 64});
  EXPECT_THROW_MSG(append_paged_kv_cache(f32.view, p.value.view, AppendProblem::ints(p.batch_indices),
                                         AppendProblem::ints(p.positions), p.storage(c), AppendProblem::ints(p.indices),
                                         AppendProblem::ints(p.indptr), AppendProblem::ints(p.last)),
                   TypeMismatch, "append_key");
  HostTensor bf = make_host(DType::kBFloat16, {5, 2, 64});
  EXPECT_THROW_MSG(append_paged_kv_cache(p.key.view, bf.view, AppendProblem::ints(p.batch_indices),
                                         AppendProblem::ints(p.positions), p.storage(c), AppendProblem::ints(p.indices),
                                         AppendProblem::ints(p.indptr), AppendProblem::ints(p.last)),
                   TypeMismatch, "append_value");
  HostTensor heads = make_host(DType::kFloat16, {5, 4, 64});
  EXPECT_THROW_MSG(append_paged_kv_cache(heads.view, heads.view, AppendProblem::ints(p.batch_indices),
                                         AppendProblem::ints(p.positions), p.storage(c), AppendProblem::ints(p.indices),
                                         AppendProblem::ints(p.indptr), AppendProblem::ints(p.last)),
                   InvalidArgument, "append_key");
  HostTensor dim = make_host(DType::kFloat16, {5, 2, 128});
  EXPECT_THROW_MSG(append_paged_kv_cache(p.key.view, dim.view, AppendProblem::ints(p.batch_indices),
                                         AppendProblem::ints(p.positions), p.storage(c), AppendProblem::ints(p.indices),
                                         AppendProblem::ints(p.indptr), AppendProblem::ints(p.last)),
                   InvalidArgument, "append_value");
  HostTensor fewer = make_host(DType::kFloat16, {4, 2, 64});
  EXPECT_THROW_MSG(append_paged_kv_cache(p.key.view, fewer.view, AppendProblem::ints(p.batch_indices),
                                         AppendProblem::ints(p.positions), p.storage(c), AppendProblem::ints(p.indices),
                                         AppendProblem::ints(p.indptr), AppendProblem::ints(p.last)),
                   InvalidArgument, "append_value");
  TensorView on_gpu = AppendProblem::ints(p.indptr);  // never dereferenced: rejected first
  on_gpu.device = Device{DeviceType::kCUDA, 0};
  EXPECT_THROW_MSG(append_paged_kv_cache(p.key.view, p.value.view, AppendProblem::ints(p.batch_indices),
                                         AppendProblem::ints(p.positions), p.storage(c), AppendProblem::ints(p.indices),
                                         on_gpu, AppendProblem::ints(p.last)),
                   TypeMismatch, "kv_indptr");
}

TEST_F(AppendCpuErrors, IndexDtypeAndShape) {
  std::vector<float> f(p.positions.size());
  TensorView fv(f.data(), DType::kFloat32, Device{}, {static_cast<int64_t>(f.size())});
  EXPECT_THROW_MSG(append_paged_kv_cache(p.key.view, p.value.view, fv, AppendProblem::ints(p.positions), p.storage(c),
                                         AppendProblem::ints(p.indices), AppendProblem::ints(p.indptr),
                                         AppendProblem::ints(p.last)),
                   TypeMismatch, "batch_indices");
  std::vector<int32_t> short_pos(p.positions.begin(), p.positions.end() - 1);
  EXPECT_THROW_MSG(append_paged_kv_cache(p.key.view, p.value.view, AppendProblem::ints(p.batch_indices),
                                         AppendProblem::ints(short_pos), p.storage(c), AppendProblem::ints(p.indices),
                                         AppendProblem::ints(p.indptr), AppendProblem::ints(p.last)),
                   InvalidArgument, "positions");
  std::vector<int32_t> long_last = {1, 1, 1};
  EXPECT_THROW_MSG(append_paged_kv_cache(p.key.view, p.value.view, AppendProblem::ints(p.batch_indices),
                                         AppendProblem::ints(p.positions), p.storage(c), AppendProblem::ints(p.indices),
                                         AppendProblem::ints(p.indptr), AppendProblem::ints(long_last)),
                   InvalidArgument, "kv_last_page_len");
}

// Index values: each bad value is reported by the argument that holds it.
TEST_F(AppendCpuErrors, IndexValues) {
  auto rejects = [&](const char* name) { EXPECT_THROW_MSG(call(), InvalidArgument, name); };
  const AppendProblem good = p;
  // Restores the index arrays only: the cache itself must stay as written.
  auto reset = [&] {
    p.batch_indices = good.batch_indices;
    p.positions = good.positions;
    p.indices = good.indices;
    p.indptr = good.indptr;
    p.last = good.last;
  };
  p.positions[0] = p.batch_indices[0] == 0 ? 7 : 23;  // == the request's length after the append
  rejects("positions");
  reset();
  p.positions[1] = -1;
  rejects("positions");
  reset();
  p.batch_indices[2] = 2;  // only requests 0 and 1 exist
  rejects("batch_indices");
  reset();
  p.batch_indices[2] = -1;
  rejects("batch_indices");
  reset();
  for (size_t i = 0; i < p.positions.size(); ++i)  // the page of request 1's token at position 21
    if (p.batch_indices[i] == 1) p.indices[p.indptr[1] + p.positions[i] / c.page_size] = static_cast<int32_t>(p.num_pages);
  rejects("kv_indices");
  reset();
  p.indptr = {0, 2, 1};
  rejects("kv_indptr");
  reset();
  p.indptr.back() += 1;  // more pages than kv_indices holds
  rejects("kv_indptr");
  reset();
  p.last[1] = 0;  // a request with pages needs a non-empty last page
  rejects("kv_last_page_len");
  reset();
  p.last[0] = c.page_size + 1;
  rejects("kv_last_page_len");
  reset();
}

// AppendOptions::max_batch / max_indices: 0, or at least the views' lengths
// and below 2^31, checked on both paths (so a mistake shows without a GPU).
TEST_F(AppendCpuErrors, TableBounds) {
  auto rejects = [&](int64_t max_batch, int64_t max_indices, const char* name) {
    AppendOptions opt;
    opt.max_batch = max_batch;
    opt.max_indices = max_indices;
    EXPECT_THROW_MSG(append_paged_kv_cache(p.key.view, p.value.view, AppendProblem::ints(p.batch_indices),
                                           AppendProblem::ints(p.positions), p.storage(c), AppendProblem::ints(p.indices),
                                           AppendProblem::ints(p.indptr), AppendProblem::ints(p.last), nullptr, opt),
                     InvalidArgument, name);
  };
  const int64_t batch = static_cast<int64_t>(p.last.size()), n = static_cast<int64_t>(p.indices.size());
  rejects(batch - 1, 0, "max_batch");  // fewer requests than kv_indptr holds
  rejects(-1, 0, "max_batch");
  rejects(int64_t{1} << 31, 0, "max_batch");
  rejects(0, n - 1, "max_indices");
  rejects(batch, -5, "max_indices");
  rejects(batch + 10, int64_t{1} << 31, "max_indices");
}

// Bounds past the views are accepted on the CPU, which still validates and
// reads the views only: entries past them are never looked at.
TEST(AppendCpuExtra, TableBoundsPastTheViewsReadTheViewsOnly) {
  AppendCase c;
  c.old_lens = {5, 20, 0};
  c.add_lens = {2, 3, 4};
  AppendProblem p = make_append_problem(c, 12);
  const AppendProblem want = expected_after_append(c, p);
  const int64_t batch = static_cast<int64_t>(p.last.size()), n = static_cast<int64_t>(p.indices.size());
  std::vector<int32_t> indptr = p.indptr, last = p.last, indices = p.indices;
  indptr.insert(indptr.end(), {-7, 1 << 30});  // garbage past the views
  last.insert(last.end(), {99, -1});
  indices.insert(indices.end(), {-3, 1 << 30});
  AppendOptions opt;
  opt.max_batch = batch + 2;
  opt.max_indices = n + 2;
  append_paged_kv_cache(p.key.view, p.value.view, AppendProblem::ints(p.batch_indices), AppendProblem::ints(p.positions),
                        p.storage(c), TensorView(indices.data(), DType::kInt32, Device{}, {n}),
                        TensorView(indptr.data(), DType::kInt32, Device{}, {batch + 1}),
                        TensorView(last.data(), DType::kInt32, Device{}, {batch}), nullptr, opt);
  expect_same_cache(c, p, want);
}

TEST(AppendCpuExtra, RejectsNonContiguousRows) {
  AppendCase c;
  c.old_lens = {1};
  c.add_lens = {1};
  AppendProblem p = make_append_problem(c, 5);
  TensorView rows = p.key.view;
  rows.strides = {rows.stride(0), rows.stride(1), 2};
  EXPECT_THROW_MSG(append_paged_kv_cache(rows, p.value.view, AppendProblem::ints(p.batch_indices),
                                         AppendProblem::ints(p.positions), p.storage(c), AppendProblem::ints(p.indices),
                                         AppendProblem::ints(p.indptr), AppendProblem::ints(p.last)),
                   InvalidArgument, "append_key");
}

// The CUDA-only checks run before any device access, so views marked as CUDA
// tensors (over host memory) exercise them without a GPU.
TEST(AppendCpuExtra, CudaRowsMustBeVectorAligned) {
  AppendCase c;
  c.old_lens = {1};
  c.add_lens = {2};
  AppendProblem p = make_append_problem(c, 6);
  const Device gpu{DeviceType::kCUDA, 0};
  auto on_gpu = [&](TensorView t) {
    t.device = gpu;
    return t;
  };
  const PagedKVStorage kv(on_gpu(p.k.view), on_gpu(p.v.view), c.layout);
  TensorView odd = on_gpu(p.key.view);
  odd.strides = {c.heads * c.head_dim + 4, c.head_dim, 1};  // 2 rows: the token stride matters
  EXPECT_THROW_MSG(append_paged_kv_cache(odd, on_gpu(p.value.view), on_gpu(AppendProblem::ints(p.batch_indices)),
                                         on_gpu(AppendProblem::ints(p.positions)), kv,
                                         on_gpu(AppendProblem::ints(p.indices)), on_gpu(AppendProblem::ints(p.indptr)),
                                         on_gpu(AppendProblem::ints(p.last))),
                   InvalidArgument, "append_key");
  // Host index tensors with a CUDA cache.
  EXPECT_THROW_MSG(append_paged_kv_cache(on_gpu(p.key.view), on_gpu(p.value.view), AppendProblem::ints(p.batch_indices),
                                         on_gpu(AppendProblem::ints(p.positions)), kv,
                                         on_gpu(AppendProblem::ints(p.indices)), on_gpu(AppendProblem::ints(p.indptr)),
                                         on_gpu(AppendProblem::ints(p.last))),
                   TypeMismatch, "batch_indices");
  // A bad table bound, before any device access.
  AppendOptions opt;
  opt.max_indices = -1;
  EXPECT_THROW_MSG(append_paged_kv_cache(on_gpu(p.key.view), on_gpu(p.value.view),
                                         on_gpu(AppendProblem::ints(p.batch_indices)),
                                         on_gpu(AppendProblem::ints(p.positions)), kv,
                                         on_gpu(AppendProblem::ints(p.indices)), on_gpu(AppendProblem::ints(p.indptr)),
                                         on_gpu(AppendProblem::ints(p.last)), nullptr, opt),
                   InvalidArgument, "max_indices");
}

}  // namespace
