// fp8 KV caches (e4m3 / e5m2) on the CUDA-core decode kernels against the
// float64 reference on the dequantized KV: batch decode over fp16 / bf16
// queries, head dims 64 / 128 / 256, groups 1 / 4 / 8, page sizes 1 / 16 /
// 64, NHD / HND, shuffled pages, lengths 0 to 5003 (split and whole), scales
// as floats and as device tensors, outputs poisoned first, bitwise re-runs;
// the built-in variants (window, soft cap, both, fused RoPE); single_decode
// (row-wise kernel); CUDA-graph replay with new scale-tensor values; the
// end-to-end error of fp16 K / V quantized by the append against the
// unquantized reference, printed per dtype and head dim; bad input; and the
// tensor-core decode path (FA2 template) on fp8 caches.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <random>

#include "decode_util.hpp"
#include "tessera/api/append_kv.hpp"
#include "tessera/runtime/variant_params.hpp"

using namespace tessera;
using namespace tessera::test;

namespace {

constexpr DType kE4M3 = DType::kFloat8E4M3, kE5M2 = DType::kFloat8E5M2;
constexpr double kKScale = 0.0131, kVScale = 0.0097;  // not powers of two

struct Fp8Case {
  DType q, kv;
  int head_dim, group, page_size;
  KVLayout layout;
};

// A paged fp8 cache whose stored values span most of the format (|x| up to
// 200, e4m3's largest is 448) and 16-bit queries.
struct Fp8Problem {
  Table t;
  HostTensor k, v, q;
  DeviceTensor dk, dv, dq;
  AttentionSpec spec;
  TaskInfo task;
};

Fp8Problem make_fp8_problem(const Fp8Case& c, const std::vector<int32_t>& lens, uint64_t seed,
                            VariantSpec variant = variants::standard()) {
  std::mt19937_64 rng(seed);
  const int64_t Hkv = 2, Hq = Hkv * c.group, D = c.head_dim, batch = static_cast<int64_t>(lens.size());
  const int64_t pool = pages_needed(lens, c.page_size) + 5;
  Fp8Problem p;
  p.t = make_table(lens, c.page_size, pool, rng);
  const std::vector<int64_t> shape = c.layout == KVLayout::kNHD ? std::vector<int64_t>{pool, c.page_size, Hkv, D}
                                                                : std::vector<int64_t>{pool, Hkv, c.page_size, D};
  p.k = make_host(c.kv, shape);
  p.v = make_host(c.kv, shape);
  p.q = make_host(c.q, {batch, Hq, D});
  fill_random(p.k, rng(), -200.f, 200.f);
  fill_random(p.v, rng(), -200.f, 200.f);
  fill_random(p.q, rng(), -2.f, 2.f);
  p.dk = to_device(p.k);
  p.dv = to_device(p.v);
  p.dq = to_device(p.q);
  p.spec = {std::move(variant), c.q, c.kv, c.q, c.head_dim};
  p.task = {static_cast<int>(Hq), static_cast<int>(Hkv), c.page_size, c.layout, 32, 4 * pool};
  return p;
}

reference::Result fp8_reference(const Fp8Problem& p, const Fp8Case& c, double k_scale, double v_scale,
                                reference::Options opt = {}) {
  PagedKVCache cache(PagedKVStorage(p.k.view, p.v.view, c.layout),
                     PageTable(p.t.indptr, p.t.indices, p.t.last, c.page_size, p.t.num_pages));
  std::vector<int32_t> qo(p.t.kv_lens.size() + 1);
  std::iota(qo.begin(), qo.end(), 0);
  opt.k_scale = k_scale;
  opt.v_scale = v_scale;
  return reference::attention_paged(p.q.view, RaggedIndex(qo), cache, opt);
}

// A 1-element float32 device tensor holding x.
DeviceTensor scale_tensor(float x) {
  HostTensor h = make_host(DType::kFloat32, {1});
  h.set(0, x);
  return to_device(h);
}

Outputs run_fp8(const BatchDecode& dec, const Fp8Problem& p, const RunOptions& opt, cudaStream_t stream = nullptr) {
  const int64_t batch = p.q.view.size(0), Hq = p.q.view.size(1), D = p.q.view.size(2);
  Outputs out{make_host(p.spec.o_dtype, {batch, Hq, D}), make_host(DType::kFloat32, {batch, Hq})};
  auto d_o = poisoned_like(out.o), dlse = poisoned_like(out.lse);
  dec.run(p.dq.view, PagedKVStorage(p.dk.view, p.dv.view, p.task.layout), d_o.view, dlse.view, stream, opt);
  TESSERA_CUDA_CHECK(cudaDeviceSynchronize());
  return {to_host(d_o, out.o), to_host(dlse, out.lse)};
}

void expect_matches(const Outputs& got, const reference::Result& ref, DType q_dtype) {
  EXPECT_CLOSE(compare(to_doubles(got.o.view), ref.o), q_dtype);
  EXPECT_CLOSE(compare(to_doubles(got.lse.view), ref.lse), DType::kFloat16);  // LSE in fp32
}

DecodeOptions cuda_cores() {
  DecodeOptions opt;
  opt.cuda_cores = true;
  return opt;
}

using Fp8Param = std::tuple<std::pair<DType, DType>, int, int, std::pair<int, KVLayout>>;
class Fp8DecodeGpu : public ::testing::TestWithParam<Fp8Param> {};

TEST_P(Fp8DecodeGpu, MatchesDequantizedReference) {
  SKIP_WITHOUT_GPU();
  const auto [dtypes, D, group, paging] = GetParam();
  const Fp8Case c{dtypes.first, dtypes.second, D, group, paging.first, paging.second};
  Fp8Problem p = make_fp8_problem(c, {0, 1, 7, 300, 1000, 5003, 33, 129, 64, 2, 777}, D * 7 + group * 3 + c.page_size);
  const auto ref = fp8_reference(p, c, kKScale, kVScale);
  Workspace ws = decode_workspace(p.spec, p.task);
  // The CUDA-core kernel, then the wrapper's pick (on sm_90 the tensor cores).
  for (bool pick : {false, true}) {
    SCOPED_TRACE(pick ? "the wrapper's pick" : "CUDA cores");
    BatchDecode dec(p.spec, p.task, ws, pick ? DecodeOptions{} : cuda_cores());
    EXPECT_EQ(dec.tensor_core_prefill() != nullptr, pick && jit::Arch::of_device(0).major == 9);
    dec.plan(p.t.indptr, p.t.indices, p.t.last);
    if (!pick) EXPECT_GT(dec.last_plan().num_split_requests, 0) << "the long request must be split";
    RunOptions opt;
    opt.k_scale = kKScale;
    opt.v_scale = kVScale;
    const Outputs a = run_fp8(dec, p, opt);
    expect_matches(a, ref, c.q);
    const Outputs b = run_fp8(dec, p, opt);  // bitwise the same on a re-run
    EXPECT_TRUE(bitwise_equal(a.o, b.o));
    EXPECT_TRUE(bitwise_equal(a.lse, b.lse));
    // The same scales as device tensors (times the float scales, here 2 and 0.5).
    DeviceTensor ks = scale_tensor(static_cast<float>(kKScale / 2)), vs = scale_tensor(static_cast<float>(kVScale * 2));
    RunOptions t;
    t.k_scale = 2;
    t.v_scale = 0.5;
    t.k_scale_tensor = ks.view;
    t.v_scale_tensor = vs.view;
    expect_matches(run_fp8(dec, p, t), ref, c.q);
  }
}

INSTANTIATE_TEST_SUITE_P(
    All, Fp8DecodeGpu,
    ::testing::Combine(::testing::Values(std::pair{DType::kFloat16, kE4M3}, std::pair{DType::kFloat16, kE5M2},
                                         std::pair{DType::kBFloat16, kE4M3}, std::pair{DType::kBFloat16, kE5M2}),
                       ::testing::Values(64, 128, 256), ::testing::Values(1, 4, 8),
                       ::testing::Values(std::pair{1, KVLayout::kNHD}, std::pair{16, KVLayout::kHND},
                                         std::pair{64, KVLayout::kNHD}, std::pair{5, KVLayout::kHND})));

// The built-in variants FlashInfer's plan() options select, on fp8 K / V.
TEST(Fp8DecodeGpuExtra, Variants) {
  SKIP_WITHOUT_GPU();
  const Fp8Case c{DType::kFloat16, kE4M3, 128, 4, 16, KVLayout::kNHD};
  struct V {
    const char* name;
    VariantSpec spec;
    reference::Options opt;
  };
  reference::Options window, cap, both, rope;
  window.window_left = 100;
  cap.logits_soft_cap = 5.0;
  both.window_left = 300;
  both.logits_soft_cap = 5.0;
  rope.rope = reference::RopeOptions{false, 1.0, 1e4, -1};
  const std::vector<V> cases = {{"window", variants::from_plan_options(false, 100), window},
                                {"soft cap", variants::from_plan_options(false, -1, 5.f), cap},
                                {"window + cap", variants::from_plan_options(false, 300, 5.f), both},
                                {"rope", variants::rope(), rope}};
  for (const V& v : cases) {
    SCOPED_TRACE(v.name);
    Fp8Problem p = make_fp8_problem(c, {0, 5, 700, 2500, 64}, 5, v.spec);
    const auto ref = fp8_reference(p, c, kKScale, kVScale, v.opt);
    Workspace ws = decode_workspace(p.spec, p.task);
    BatchDecode dec(p.spec, p.task, ws);
    dec.plan(p.t.indptr, p.t.indices, p.t.last);
    VariantArgs args;
    if (v.opt.rope) args.set("rope_scale", 1.0).set("rope_theta", 1e4);
    RunOptions opt;
    opt.k_scale = kKScale;
    opt.v_scale = kVScale;
    opt.extras = v.opt.rope ? &args : nullptr;
    expect_matches(run_fp8(dec, p, opt), ref, c.q);
  }
}

// heads_per_thread (a tuning option) changes the thread layout, not the answer.
TEST(Fp8DecodeGpuExtra, HeadsPerThread) {
  SKIP_WITHOUT_GPU();
  const Fp8Case c{DType::kBFloat16, kE5M2, 128, 8, 16, KVLayout::kHND};
  Fp8Problem p = make_fp8_problem(c, {3000, 17, 0, 900}, 9);
  const auto ref = fp8_reference(p, c, kKScale, kVScale);
  for (int hpt : {1, 2, 4}) {
    SCOPED_TRACE("heads_per_thread " + std::to_string(hpt));
    DecodeOptions o;
    o.heads_per_thread = hpt;
    Workspace ws = decode_workspace(p.spec, p.task, o);
    BatchDecode dec(p.spec, p.task, ws, o);
    dec.plan(p.t.indptr, p.t.indices, p.t.last);
    RunOptions opt;
    opt.k_scale = kKScale;
    opt.v_scale = kVScale;
    expect_matches(run_fp8(dec, p, opt), ref, c.q);
  }
}

// use_tensor_cores: the FA2 template widens the fp8 tiles into 16-bit
// stages; the same reference, page sizes (5: not a power of two), layouts,
// scale forms and bitwise re-runs.
TEST(Fp8DecodeGpuExtra, TensorCoresMatchDequantizedReference) {
  SKIP_WITHOUT_GPU();
  for (auto [q, kv] : {std::pair{DType::kFloat16, kE4M3}, std::pair{DType::kFloat16, kE5M2},
                       std::pair{DType::kBFloat16, kE4M3}, std::pair{DType::kBFloat16, kE5M2}})
    for (auto [page, layout] : {std::pair{1, KVLayout::kNHD}, std::pair{16, KVLayout::kHND},
                                std::pair{5, KVLayout::kHND}, std::pair{64, KVLayout::kNHD}}) {
      SCOPED_TRACE(std::string(dtype_name(q)) + " " + dtype_name(kv) + " page " + std::to_string(page));
      const Fp8Case c{q, kv, 128, 4, page, layout};
      Fp8Problem p = make_fp8_problem(c, {0, 1, 7, 300, 1000, 5003, 33, 129, 64, 2, 777}, 11 * page + 3);
      const auto ref = fp8_reference(p, c, kKScale, kVScale);
      DecodeOptions o;
      o.use_tensor_cores = true;
      Workspace ws = decode_workspace(p.spec, p.task, o);
      BatchDecode dec(p.spec, p.task, ws, o);
      ASSERT_NE(dec.tensor_core_prefill(), nullptr);
      dec.plan(p.t.indptr, p.t.indices, p.t.last);
      RunOptions opt;
      opt.k_scale = kKScale;
      opt.v_scale = kVScale;
      const Outputs a = run_fp8(dec, p, opt);
      expect_matches(a, ref, c.q);
      EXPECT_TRUE(bitwise_equal(a.o, run_fp8(dec, p, opt).o));
      DeviceTensor ks = scale_tensor(static_cast<float>(kKScale)), vs = scale_tensor(static_cast<float>(kVScale));
      RunOptions t;
      t.k_scale_tensor = ks.view;
      t.v_scale_tensor = vs.view;
      expect_matches(run_fp8(dec, p, t), ref, c.q);
    }
}

class Fp8SingleDecodeGpu : public ::testing::TestWithParam<std::tuple<DType, DType, int, KVLayout>> {};

TEST_P(Fp8SingleDecodeGpu, MatchesDequantizedReference) {
  SKIP_WITHOUT_GPU();
  const auto [qt, kvt, D, layout] = GetParam();
  const int64_t Hkv = 2, Hq = 8;
  const bool nhd = layout == KVLayout::kNHD;
  for (int64_t kv_len : {1, 300, 4097}) {
    SCOPED_TRACE("kv_len=" + std::to_string(kv_len));
    HostTensor q = make_host(qt, {Hq, D});
    HostTensor k = make_host(kvt, nhd ? std::vector<int64_t>{kv_len, Hkv, D} : std::vector<int64_t>{Hkv, kv_len, D});
    HostTensor v = k;
    fill_random(q, 1 + kv_len, -2.f, 2.f);
    fill_random(k, 2 + kv_len, -200.f, 200.f);
    fill_random(v, 3 + kv_len, -200.f, 200.f);
    auto as_nhd = [&](const HostTensor& x) {
      return nhd ? x.view : TensorView(x.view.data, kvt, {}, {kv_len, Hkv, D}, {D, kv_len * D, 1});
    };
    reference::Options ro;
    ro.k_scale = kKScale;
    ro.v_scale = kVScale;
    const auto ref = reference::attention_ragged(TensorView(q.view.data, qt, {}, {1, Hq, D}), RaggedIndex({0, 1}),
                                                 as_nhd(k), as_nhd(v), RaggedIndex({0, static_cast<int32_t>(kv_len)}), ro);
    HostTensor o = make_host(qt, {Hq, D}), lse = make_host(DType::kFloat32, {Hq});
    auto dq = to_device(q), dk = to_device(k), dv = to_device(v), d_o = poisoned_like(o), dlse = poisoned_like(lse);
    DeviceTensor ks = scale_tensor(static_cast<float>(kKScale));
    RunOptions opt;  // K's scale as a tensor, V's as a float
    opt.k_scale_tensor = ks.view;
    opt.v_scale = kVScale;
    single_decode({variants::standard(), qt, kvt, qt, D}, dq.view, dk.view, dv.view, layout, d_o.view, dlse.view,
                  nullptr, opt);
    TESSERA_CUDA_CHECK(cudaDeviceSynchronize());
    EXPECT_CLOSE(compare(to_doubles(to_host(d_o, o).view), ref.o), qt);
    EXPECT_CLOSE(compare(to_doubles(to_host(dlse, lse).view), ref.lse), DType::kFloat16);
  }
}

INSTANTIATE_TEST_SUITE_P(All, Fp8SingleDecodeGpu,
                         ::testing::Combine(::testing::Values(DType::kFloat16, DType::kBFloat16),
                                            ::testing::Values(kE4M3, kE5M2), ::testing::Values(64, 128, 256),
                                            ::testing::Values(KVLayout::kNHD, KVLayout::kHND)));

// Captured once with scale tensors; each replay follows new values written
// into them (and a new plan), with no re-capture.
TEST(Fp8DecodeGpuExtra, CudaGraphReplaysNewScaleTensors) {
  SKIP_WITHOUT_GPU();
  const Fp8Case c{DType::kFloat16, kE4M3, 128, 4, 16, KVLayout::kNHD};
  std::mt19937_64 rng(3);
  const std::vector<int32_t> lens0 = {3000, 5, 800, 0, 1200, 64, 9, 2000};
  Fp8Problem p = make_fp8_problem(c, lens0, 21);
  Workspace ws = decode_workspace(p.spec, p.task);
  BatchDecode dec(p.spec, p.task, ws);
  cudaStream_t stream;
  TESSERA_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  dec.plan(p.t.indptr, p.t.indices, p.t.last, stream);
  TESSERA_CUDA_CHECK(cudaStreamSynchronize(stream));
  DeviceTensor ks = scale_tensor(1.f), vs = scale_tensor(1.f);
  RunOptions opt;
  opt.k_scale_tensor = ks.view;
  opt.v_scale_tensor = vs.view;
  const int64_t batch = static_cast<int64_t>(lens0.size()), Hq = p.task.num_qo_heads, D = c.head_dim;
  HostTensor o_like = make_host(c.q, {batch, Hq, D});
  DeviceTensor d_o = poisoned_like(o_like);
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  TESSERA_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  dec.run(p.dq.view, PagedKVStorage(p.dk.view, p.dv.view, c.layout), d_o.view, TensorView(), stream, opt);
  TESSERA_CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
  TESSERA_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  const double scales[][2] = {{kKScale, kVScale}, {0.05, 0.002}, {0.003, 0.02}};
  for (int step = 0; step < 3; ++step) {
    SCOPED_TRACE("step " + std::to_string(step));
    if (step > 0) {  // new lengths over the same pool
      for (auto& n : p.t.kv_lens) n = static_cast<int32_t>(rng() % 700);  // fits the pool
      p.t = make_table(p.t.kv_lens, c.page_size, p.t.num_pages, rng);
      dec.plan(p.t.indptr, p.t.indices, p.t.last, stream);
    }
    const float k = static_cast<float>(scales[step][0]), v = static_cast<float>(scales[step][1]);
    TESSERA_CUDA_CHECK(cudaMemcpyAsync(ks.buf.get(), &k, sizeof k, cudaMemcpyHostToDevice, stream));
    TESSERA_CUDA_CHECK(cudaMemcpyAsync(vs.buf.get(), &v, sizeof v, cudaMemcpyHostToDevice, stream));
    d_o.buf.fill(0xFF);
    TESSERA_CUDA_CHECK(cudaGraphLaunch(exec, stream));
    TESSERA_CUDA_CHECK(cudaStreamSynchronize(stream));
    EXPECT_CLOSE(compare(to_doubles(to_host(d_o, o_like).view), fp8_reference(p, c, k, v).o), c.q);
  }
  TESSERA_CUDA_CHECK(cudaGraphExecDestroy(exec));
  TESSERA_CUDA_CHECK(cudaGraphDestroy(graph));
  TESSERA_CUDA_CHECK(cudaStreamDestroy(stream));
}

// fp16 K / V quantized into fp8 by the append (scale = amax / the format's
// largest value), then decoded: the error against the unquantized float64
// reference, printed; the tight check is against the dequantized one.
TEST(Fp8DecodeGpuExtra, EndToEndErrorAgainstFp16) {
  SKIP_WITHOUT_GPU();
  for (DType kvt : {kE4M3, kE5M2})
    for (DType qt : {DType::kFloat16, DType::kBFloat16})
      for (int D : {64, 128, 256}) {
        const Fp8Case c{qt, kvt, D, 4, 16, KVLayout::kNHD};
        const std::vector<int32_t> lens = {1500, 300, 4000, 77};
        Fp8Problem p = make_fp8_problem(c, lens, 100 + D);
        HostTensor k16 = make_host(qt, p.k.view.shape), v16 = make_host(qt, p.v.view.shape);
        fill_random(k16, 7, -3.f, 3.f);
        fill_random(v16, 8, -3.f, 3.f);
        const double ks = 3.0 / fp8_max(kvt), vs = 3.0 / fp8_max(kvt);
        // Token i of request b, as the append takes it: rows [nnz, Hkv, D].
        std::vector<int32_t> bidx, pos;
        for (size_t b = 0; b < lens.size(); ++b)
          for (int32_t i = 0; i < lens[b]; ++i) bidx.push_back(static_cast<int32_t>(b)), pos.push_back(i);
        const int64_t nnz = static_cast<int64_t>(pos.size()), Hkv = 2;
        HostTensor rows_k = make_host(qt, {nnz, Hkv, D}), rows_v = make_host(qt, {nnz, Hkv, D});
        PagedKVCache c16(PagedKVStorage(k16.view, v16.view, c.layout),
                         PageTable(p.t.indptr, p.t.indices, p.t.last, c.page_size, p.t.num_pages));
        for (int64_t n = 0; n < nnz; ++n) {
          const int64_t off = c16.storage.offset(c16.table.page_of(bidx[n], pos[n]), 0, c16.table.slot_of(pos[n]));
          for (int64_t h = 0; h < Hkv; ++h)
            for (int64_t d = 0; d < D; ++d) {
              rows_k.set((n * Hkv + h) * D + d, k16.get(off + h * c16.storage.head_stride() + d));
              rows_v.set((n * Hkv + h) * D + d, v16.get(off + h * c16.storage.head_stride() + d));
            }
        }
        auto ints = [](std::vector<int32_t>& x) {
          HostTensor h = make_host(DType::kInt32, {static_cast<int64_t>(x.size())});
          std::memcpy(h.storage.data(), x.data(), x.size() * 4);
          return to_device(h);
        };
        auto d_rk = to_device(rows_k), d_rv = to_device(rows_v);
        auto d_b = ints(bidx), d_p = ints(pos), d_idx = ints(p.t.indices), d_ptr = ints(p.t.indptr), d_last = ints(p.t.last);
        AppendOptions ao;
        ao.k_scale = ks;
        ao.v_scale = vs;
        append_paged_kv_cache(d_rk.view, d_rv.view, d_b.view, d_p.view, PagedKVStorage(p.dk.view, p.dv.view, c.layout),
                              d_idx.view, d_ptr.view, d_last.view, nullptr, ao);
        TESSERA_CUDA_CHECK(cudaDeviceSynchronize());
        p.k = to_host(p.dk, p.k);
        p.v = to_host(p.dv, p.v);
        Workspace ws = decode_workspace(p.spec, p.task);
        BatchDecode dec(p.spec, p.task, ws);
        dec.plan(p.t.indptr, p.t.indices, p.t.last);
        RunOptions opt;
        opt.k_scale = static_cast<float>(ks);  // the scales the append divided by
        opt.v_scale = static_cast<float>(vs);
        const Outputs got = run_fp8(dec, p, opt);
        expect_matches(got, fp8_reference(p, c, static_cast<float>(ks), static_cast<float>(vs)), qt);
        std::vector<int32_t> qo(lens.size() + 1);
        std::iota(qo.begin(), qo.end(), 0);
        const auto exact = reference::attention_paged(p.q.view, RaggedIndex(qo), c16);
        const double err = compare(to_doubles(got.o.view), exact.o).rel;
        std::printf("fp8 end-to-end: kv %-13s q %-8s head_dim %3d: error vs the unquantized reference %.2e\n",
                    dtype_name(kvt), dtype_name(qt), D, err);
        // Loose: the quantization dominates (a float64 simulation of these
        // shapes gave 0.07-0.08 for e4m3 and 0.08-0.17 for e5m2).
        EXPECT_LT(err, kvt == kE4M3 ? 0.2 : 0.35);
      }
}

TEST(Fp8DecodeGpuExtra, BadInput) {
  SKIP_WITHOUT_GPU();
  const Fp8Case c{DType::kFloat16, kE4M3, 128, 4, 16, KVLayout::kNHD};
  Fp8Problem p = make_fp8_problem(c, {40, 3}, 2);
  Workspace ws = decode_workspace(p.spec, p.task);
  BatchDecode dec(p.spec, p.task, ws);
  dec.plan(p.t.indptr, p.t.indices, p.t.last);
  HostTensor o = make_host(c.q, p.q.view.shape);
  DeviceTensor d_o = to_device(o);
  const PagedKVStorage kv(p.dk.view, p.dv.view, c.layout);
  HostTensor host_scale = make_host(DType::kFloat32, {1}), two = make_host(DType::kFloat32, {2});
  HostTensor half_scale = make_host(DType::kFloat16, {1});
  auto d_two = to_device(two), d_half = to_device(half_scale);
  RunOptions opt;
  opt.k_scale_tensor = host_scale.view;
  EXPECT_THROW_MSG(dec.run(p.dq.view, kv, d_o.view, TensorView(), nullptr, opt), TypeMismatch, "k_scale_tensor");
  opt.k_scale_tensor = d_two.view;
  EXPECT_THROW_MSG(dec.run(p.dq.view, kv, d_o.view, TensorView(), nullptr, opt), InvalidArgument, "k_scale_tensor");
  opt = {};
  opt.v_scale_tensor = d_half.view;
  EXPECT_THROW_MSG(dec.run(p.dq.view, kv, d_o.view, TensorView(), nullptr, opt), TypeMismatch, "v_scale_tensor");
  opt = {};
  opt.k_scale = 0;
  EXPECT_THROW_MSG(dec.run(p.dq.view, kv, d_o.view, TensorView(), nullptr, opt), InvalidArgument, "k_scale");
  HostTensor k5 = make_host(kE5M2, p.k.view.shape);  // the other fp8 format
  auto dk5 = to_device(k5), dv5 = to_device(k5);
  EXPECT_THROW_MSG(dec.run(p.dq.view, PagedKVStorage(dk5.view, dv5.view, c.layout), d_o.view, TensorView()),
                   TypeMismatch, "kv");
  // The tensor-core kernels read no scale tensors (fp16 KV; use_tensor_cores).
  const AttentionSpec f16{variants::standard(), DType::kFloat16, DType::kFloat16, DType::kFloat16, 128};
  DecodeOptions tc;
  tc.use_tensor_cores = true;
  Workspace ws16 = decode_workspace(f16, p.task, tc);
  BatchDecode dec16(f16, p.task, ws16, tc);
  dec16.plan(p.t.indptr, p.t.indices, p.t.last);
  HostTensor k16 = make_host(DType::kFloat16, p.k.view.shape);
  auto dk16 = to_device(k16), dv16 = to_device(k16);
  DeviceTensor ks = scale_tensor(1.f);
  opt = {};
  opt.k_scale_tensor = ks.view;
  EXPECT_THROW_MSG(dec16.run(p.dq.view, PagedKVStorage(dk16.view, dv16.view, c.layout), d_o.view, TensorView(),
                             nullptr, opt),
                   InvalidArgument, "k_scale_tensor");
}

}  // namespace
