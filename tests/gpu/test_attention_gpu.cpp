// The row-wise attention kernel through the JIT, against the CPU reference:
// single decode (contiguous NHD/HND KV) and BatchAttention over paged KV
// (page sizes 1/16/64, separate and interleaved K/V, causal, empty requests),
// fp16/bf16, head dims 64/128/256, group sizes 1/4/8. Outputs are poisoned
// before each run; runs are checked to be bitwise deterministic.
#include <gtest/gtest.h>

#include <numeric>
#include <random>

#include "gpu_util.hpp"
#include "tessera/api/attention.hpp"
#include "tessera/reference/attention.hpp"

using namespace tessera;
using namespace tessera::test;

namespace {

std::vector<double> lse_doubles(const reference::Result& r) { return r.lse; }

class SingleDecodeGpu : public ::testing::TestWithParam<std::tuple<DType, int, int, KVLayout>> {};

TEST_P(SingleDecodeGpu, MatchesReference) {
  SKIP_WITHOUT_GPU();
  const auto [dt, D, group, layout] = GetParam();
  const int64_t Hkv = 2, Hq = Hkv * group;
  for (int64_t kv_len : {1, 17, 300, 4097}) {
    SCOPED_TRACE("kv_len=" + std::to_string(kv_len));
    HostTensor q = make_host(dt, {Hq, D});
    fill_random(q, 11 + kv_len);
    // Storage in the tested layout; the reference reads it through an NHD view.
    const bool nhd = layout == KVLayout::kNHD;
    HostTensor k = make_host(dt, nhd ? std::vector<int64_t>{kv_len, Hkv, D} : std::vector<int64_t>{Hkv, kv_len, D});
    HostTensor v = k;
    fill_random(k, 12 + kv_len);
    fill_random(v, 13 + kv_len);
    auto as_nhd = [&](const HostTensor& t) {
      return nhd ? t.view : TensorView(t.view.data, dt, {}, {kv_len, Hkv, D}, {D, kv_len * D, 1});
    };
    TensorView q3(q.view.data, dt, {}, {1, Hq, D});
    auto ref = reference::attention_ragged(q3, RaggedIndex({0, 1}), as_nhd(k), as_nhd(v),
                                           RaggedIndex({0, static_cast<int32_t>(kv_len)}));

    HostTensor o = make_host(dt, {Hq, D}), lse = make_host(DType::kFloat32, {Hq});
    auto dq = to_device(q), dk = to_device(k), dv = to_device(v), d_o = poisoned_like(o), dlse = poisoned_like(lse);
    const AttentionSpec spec{variants::standard(), dt, dt, dt, D};
    single_decode(spec, dq.view, dk.view, dv.view, layout, d_o.view, dlse.view);
    TESSERA_CUDA_CHECK(cudaDeviceSynchronize());
    HostTensor got = to_host(d_o, o);
    EXPECT_CLOSE(compare(to_doubles(got.view), ref.o), dt);
    EXPECT_CLOSE(compare(to_doubles(to_host(dlse, lse).view), lse_doubles(ref)), DType::kFloat16);  // LSE in fp32

    // Deterministic: a second run is bitwise identical.
    d_o.buf.fill(0xFF);
    single_decode(spec, dq.view, dk.view, dv.view, layout, d_o.view, TensorView());
    TESSERA_CUDA_CHECK(cudaDeviceSynchronize());
    EXPECT_TRUE(bitwise_equal(to_host(d_o, o), got));
  }
}

INSTANTIATE_TEST_SUITE_P(All, SingleDecodeGpu,
                         ::testing::Combine(::testing::Values(DType::kFloat16, DType::kBFloat16),
                                            ::testing::Values(64, 128, 256), ::testing::Values(1, 4, 8),
                                            ::testing::Values(KVLayout::kNHD, KVLayout::kHND)));

// A random batch: some requests empty (0 queries or 0 keys), one much longer.
struct PagedBatch {
  std::vector<int32_t> qo_indptr{0}, kv_indptr{0}, indices, last;
  int64_t num_pages = 0;
};

PagedBatch random_batch(int page_size, bool prefill, std::mt19937_64& rng) {
  std::vector<int32_t> kv_lens = {0, 1, 5, 33, 257, 2049, 64, 3};
  PagedBatch b;
  std::vector<int32_t> pages_of;
  for (int32_t kv : kv_lens) pages_of.push_back((kv + page_size - 1) / page_size);
  b.num_pages = std::accumulate(pages_of.begin(), pages_of.end(), 0) + 3;
  std::vector<int32_t> perm(b.num_pages);
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng);
  int next = 0;
  for (size_t r = 0; r < kv_lens.size(); ++r) {
    int q = prefill ? std::min<int>(kv_lens[r], 1 + static_cast<int>(rng() % 9)) : 1;
    if (r == 2) q = 0;  // a request with no queries
    b.qo_indptr.push_back(b.qo_indptr.back() + q);
    for (int p = 0; p < pages_of[r]; ++p) b.indices.push_back(perm[next++]);
    b.kv_indptr.push_back(static_cast<int32_t>(b.indices.size()));
    b.last.push_back(pages_of[r] ? kv_lens[r] - (pages_of[r] - 1) * page_size : 0);
  }
  return b;
}

class BatchGpu : public ::testing::TestWithParam<std::tuple<DType, int, int, KVLayout, bool>> {};

TEST_P(BatchGpu, PagedMatchesReference) {
  SKIP_WITHOUT_GPU();
  const auto [dt, page_size, group, layout, interleaved] = GetParam();
  const int64_t D = 128, Hkv = 2, Hq = Hkv * group;
  std::mt19937_64 rng(page_size * 131 + group);
  for (bool causal : {false, true}) {
    SCOPED_TRACE(causal ? "causal" : "non-causal");
    PagedBatch b = random_batch(page_size, /*prefill=*/causal, rng);
    const int64_t rows = b.qo_indptr.back(), P = b.num_pages;
    std::vector<int64_t> page = layout == KVLayout::kNHD ? std::vector<int64_t>{page_size, Hkv, D}
                                                         : std::vector<int64_t>{Hkv, page_size, D};
    std::vector<int64_t> kv_shape = {P};
    if (interleaved) kv_shape.push_back(2);
    kv_shape.insert(kv_shape.end(), page.begin(), page.end());
    HostTensor kv = make_host(dt, kv_shape), k2 = make_host(dt, {P, page[0], page[1], page[2]}), v2 = k2;
    fill_random(kv, 21);
    fill_random(k2, 22);
    fill_random(v2, 23);
    HostTensor q = make_host(dt, {rows, Hq, D});
    fill_random(q, 24);
    auto storage_of = [&](const HostTensor& a, const HostTensor& bb, const HostTensor& c, Device dev, void* pa, void* pb,
                          void* pc) {
      if (interleaved) {
        TensorView t = a.view;
        t.data = pa;
        t.device = dev;
        return PagedKVStorage(t, layout);
      }
      TensorView tk = bb.view, tv = c.view;
      tk.data = pb;
      tv.data = pc;
      tk.device = tv.device = dev;
      return PagedKVStorage(tk, tv, layout);
    };
    PagedKVStorage host_storage = storage_of(kv, k2, v2, {}, kv.view.data, k2.view.data, v2.view.data);
    PagedKVCache host_cache(host_storage, PageTable(b.kv_indptr, b.indices, b.last, page_size, P));
    reference::Options ropt;
    ropt.causal = causal;
    auto ref = reference::attention_paged(q.view, RaggedIndex(b.qo_indptr), host_cache, ropt);

    auto dkv = to_device(kv), dk = to_device(k2), dv = to_device(v2), dq = to_device(q);
    HostTensor o = make_host(dt, {rows, Hq, D}), lse = make_host(DType::kFloat32, {rows, Hq});
    auto d_o = poisoned_like(o), dlse = poisoned_like(lse);
    const Device dev{DeviceType::kCUDA, cuda::current_device()};
    PagedKVStorage dev_storage = storage_of(kv, k2, v2, dev, dkv.view.data, dk.view.data, dv.view.data);

    TaskInfo task{static_cast<int>(Hq), static_cast<int>(Hkv), page_size, layout, 0, 0};
    const size_t bytes = BatchAttention::workspace_bytes(64, 4096);
    Workspace ws = Workspace::allocate(bytes, bytes);
    task.max_batch = 64;
    task.max_pages = 4096;
    BatchAttention attn({causal ? variants::causal() : variants::standard(), dt, dt, dt, 128}, task, ws);
    attn.plan({b.qo_indptr, b.kv_indptr, b.indices, b.last});
    attn.run(dq.view, dev_storage, d_o.view, dlse.view);
    TESSERA_CUDA_CHECK(cudaDeviceSynchronize());
    HostTensor got = to_host(d_o, o);
    EXPECT_CLOSE(compare(to_doubles(got.view), ref.o), dt);
    EXPECT_CLOSE(compare(to_doubles(to_host(dlse, lse).view), ref.lse), DType::kFloat16);

    // Same plan again, and an identical second plan: bitwise identical output.
    d_o.buf.fill(0xFF);
    attn.plan({b.qo_indptr, b.kv_indptr, b.indices, b.last});
    attn.run(dq.view, dev_storage, d_o.view, dlse.view);
    TESSERA_CUDA_CHECK(cudaDeviceSynchronize());
    EXPECT_TRUE(bitwise_equal(to_host(d_o, o), got));
  }
}

INSTANTIATE_TEST_SUITE_P(All, BatchGpu,
                         ::testing::Combine(::testing::Values(DType::kFloat16, DType::kBFloat16), ::testing::Values(1, 16, 64),
                                            ::testing::Values(1, 4, 8), ::testing::Values(KVLayout::kNHD, KVLayout::kHND),
                                            ::testing::Values(false, true)));

TEST(BatchGpuErrors, RunRejectsBadInput) {
  SKIP_WITHOUT_GPU();
  const int64_t D = 128, Hq = 4, Hkv = 2, page = 16, P = 4;
  TaskInfo task{4, 2, 16, KVLayout::kNHD, 8, 16};
  const size_t bytes = BatchAttention::workspace_bytes(8, 16);
  Workspace ws = Workspace::allocate(bytes, bytes);
  BatchAttention attn({}, task, ws);
  std::vector<int32_t> qo = {0, 1, 2}, kvp = {0, 1, 3}, idx = {0, 3, 1}, last = {5, 16};
  attn.plan({qo, kvp, idx, last});
  HostTensor q = make_host(DType::kFloat16, {2, Hq, D}), o = q, k = make_host(DType::kFloat16, {P, page, Hkv, D}), v = k;
  auto dq = to_device(q), d_o = to_device(o), dk = to_device(k), dv = to_device(v);
  PagedKVStorage kv(dk.view, dv.view, KVLayout::kNHD);
  attn.run(dq.view, kv, d_o.view, TensorView());  // valid
  TESSERA_CUDA_CHECK(cudaDeviceSynchronize());
  // q on the host.
  EXPECT_THROW_MSG(attn.run(q.view, kv, d_o.view, TensorView()), TypeMismatch, "q");
  // Wrong dtype for o.
  HostTensor ob = make_host(DType::kBFloat16, {2, Hq, D});
  auto dob = to_device(ob);
  EXPECT_THROW_MSG(attn.run(dq.view, kv, dob.view, TensorView()), TypeMismatch, "o");
  // Rows do not match the plan.
  HostTensor q3 = make_host(DType::kFloat16, {3, Hq, D});
  auto dq3 = to_device(q3), do3 = to_device(q3);
  EXPECT_THROW_MSG(attn.run(dq3.view, kv, do3.view, TensorView()), InvalidArgument, "q");
  // A page index beyond the storage: plan names page 3, storage holds 3 pages.
  HostTensor ks = make_host(DType::kFloat16, {3, page, Hkv, D});
  auto dks = to_device(ks), dvs = to_device(ks);
  EXPECT_THROW_MSG(attn.run(dq.view, PagedKVStorage(dks.view, dvs.view, KVLayout::kNHD), d_o.view, TensorView()),
                   InvalidArgument, "kv_indices");
  // Plans beyond the workspace bounds fixed at the first plan.
  std::vector<int32_t> qo9(10), kv9(10), last9(9, 1), idx9(9);
  std::iota(qo9.begin(), qo9.end(), 0);
  std::iota(kv9.begin(), kv9.end(), 0);
  EXPECT_THROW_MSG(attn.plan({qo9, kv9, idx9, last9}), InvalidArgument, "max_batch");
}

}  // namespace
