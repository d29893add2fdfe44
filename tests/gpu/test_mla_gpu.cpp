// BatchMLA on the GPU against the float64 reference (expanded attention over
// the latent KV, reference/mla.hpp). Every case draws fresh random inputs,
// shuffles the pages through the pool, poisons every cache slot no request
// owns (and the outputs) with NaN, and checks o and lse: fp16 within 1e-3 of
// the reference's largest magnitude, bf16 within 1e-2. Shapes: H = 16, 32,
// 64, 128; page sizes 1, 16, 64; lengths 0, 1, primes and long contexts
// (split-KV); query lengths 1..8, causal among the new tokens; keys drifting
// along the context, so row maxima keep jumping. Also bitwise
// determinism across runs, CUDA-graph replay after re-plans with other
// lengths, page ids on the GPU, and a bad page id raised by the next call.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <random>

#include "gpu_util.hpp"
#include "tessera/api/mla.hpp"
#include "tessera/reference/mla.hpp"

namespace tessera {
namespace {

using test::DeviceTensor;
using test::HostTensor;

constexpr int kDc = 512, kDr = 64;

struct Step {
  std::vector<int32_t> qo_indptr{0}, kv_indptr{0}, kv_indices, kv_lens;
};

// Lengths -> a step whose pages are a shuffled subset of `pool` pages.
Step make_step(const std::vector<int32_t>& qo_lens, const std::vector<int32_t>& kv_lens, int page_size, int pool,
               std::mt19937& rng) {
  Step s;
  s.kv_lens = kv_lens;
  for (size_t i = 0; i < qo_lens.size(); ++i) {
    s.qo_indptr.push_back(s.qo_indptr.back() + qo_lens[i]);
    s.kv_indptr.push_back(s.kv_indptr.back() + (kv_lens[i] + page_size - 1) / page_size);
  }
  std::vector<int32_t> perm(pool);
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng);
  EXPECT_LE(s.kv_indptr.back(), pool);
  s.kv_indices.assign(perm.begin(), perm.begin() + s.kv_indptr.back());
  return s;
}

// Caches of `pool` pages, random where a request of `s` owns a slot, NaN elsewhere.
// ramp > 0 adds ramp x t to every feature of a request's token t, so a
// row's logits climb (or, where its q sums negative, fall) along the context.
void fill_caches(HostTensor& ckv, HostTensor& kpe, const Step& s, int page_size, uint64_t seed, double ramp = 0.0) {
  test::fill_random(ckv, seed);
  test::fill_random(kpe, seed + 1);
  const int64_t pool = ckv.view.size(0);
  std::vector<uint8_t> used(pool * page_size, 0);
  for (size_t b = 0; b + 1 < s.kv_indptr.size(); ++b)
    for (int t = 0; t < s.kv_lens[b]; ++t) {
      const int64_t slot = s.kv_indices[s.kv_indptr[b] + t / page_size] * page_size + t % page_size;
      used[slot] = 1;
      if (ramp == 0.0) continue;
      for (int x = 0; x < kDc; ++x) ckv.set(slot * kDc + x, static_cast<float>(ckv.get(slot * kDc + x) + ramp * t));
      for (int x = 0; x < kDr; ++x) kpe.set(slot * kDr + x, static_cast<float>(kpe.get(slot * kDr + x) + ramp * t));
    }
  for (int64_t slot = 0; slot < pool * page_size; ++slot) {
    if (used[slot]) continue;
    for (int x = 0; x < kDc; ++x) ckv.set(slot * kDc + x, NAN);
    for (int x = 0; x < kDr; ++x) kpe.set(slot * kDr + x, NAN);
  }
}

struct Inputs {
  HostTensor q_nope, q_pe, ckv, kpe, o, lse;
  DeviceTensor d_q_nope, d_q_pe, d_ckv, d_kpe, d_o, d_lse;
};

// kv_dt: the caches' dtype (dt's, or fp8: random values are quantized).
Inputs make_inputs(const Step& s, int H, int page_size, int pool, DType dt, uint64_t seed, DType kv_dt,
                   double ramp = 0.0) {
  Inputs in;
  const int64_t T = s.qo_indptr.back();
  in.q_nope = test::make_host(dt, {T, H, kDc});
  in.q_pe = test::make_host(dt, {T, H, kDr});
  in.ckv = test::make_host(kv_dt, {pool, page_size, kDc});
  in.kpe = test::make_host(kv_dt, {pool, page_size, kDr});
  in.o = test::make_host(dt, {T, H, kDc});
  in.lse = test::make_host(DType::kFloat32, {T, H});
  test::fill_random(in.q_nope, seed + 10);
  test::fill_random(in.q_pe, seed + 11);
  fill_caches(in.ckv, in.kpe, s, page_size, seed + 12, ramp);
  in.d_q_nope = test::to_device(in.q_nope);
  in.d_q_pe = test::to_device(in.q_pe);
  in.d_ckv = test::to_device(in.ckv);
  in.d_kpe = test::to_device(in.kpe);
  in.d_o = test::poisoned_like(in.o);
  in.d_lse = test::poisoned_like(in.lse);
  return in;
}
Inputs make_inputs(const Step& s, int H, int page_size, int pool, DType dt, uint64_t seed) {
  return make_inputs(s, H, page_size, pool, dt, seed, dt);
}

// An fp8 cache's values dequantized (stored value x scale) into float32, NaN kept.
HostTensor dequantized(const HostTensor& t, double scale) {
  if (!is_fp8(t.view.dtype)) return t;
  HostTensor f = test::make_host(DType::kFloat32, t.view.shape);
  for (size_t i = 0; i < f.storage_elems(); ++i) f.set(i, static_cast<float>(t.get(i) * scale));
  return f;
}

// ckv_scale / kpe_scale: an fp8 cache's dequantization scales; the reference
// attends over the dequantized values, so it measures the kernel, not the
// quantization.
void expect_matches_reference(const Inputs& in, const Step& s, bool causal, double sm_scale, DType dt,
                              const std::string& what, double ckv_scale = 1.0, double kpe_scale = 1.0) {
  SCOPED_TRACE(what);
  const HostTensor ckv = dequantized(in.ckv, ckv_scale), kpe = dequantized(in.kpe, kpe_scale);
  const reference::Result ref = reference::mla_paged(in.q_nope.view, in.q_pe.view, ckv.view, kpe.view,
                                                     s.qo_indptr, s.kv_indptr, s.kv_indices, s.kv_lens, causal,
                                                     sm_scale);
  const HostTensor o = test::to_host(in.d_o, in.o), lse = test::to_host(in.d_lse, in.lse);
  EXPECT_CLOSE(test::compare(test::to_doubles(o.view), ref.o), dt);
  EXPECT_CLOSE(test::compare(test::to_doubles(lse.view), ref.lse), DType::kFloat16);  // LSE in fp32: 1e-3
}

struct Case {
  int H, page_size;
  DType dt;
  bool causal;
  std::vector<int32_t> qo_lens, kv_lens;
  DType kv_dt = DType::kFloat32;  // the caches' dtype; kFloat32: dt's
  double ckv_scale = 1.0, kpe_scale = 1.0;
  double ramp = 0.0;  // fill_caches: keys drifting along the context
};

// Returns the most chunks the plan cut a query tile into.
int run_case(const Case& c, uint64_t seed, MLAOptions opt = {}) {
  std::mt19937 rng(static_cast<unsigned>(seed));
  int64_t need = 0;
  for (int32_t k : c.kv_lens) need += (k + c.page_size - 1) / c.page_size;
  const int pool = static_cast<int>(need) + 3;
  const Step s = make_step(c.qo_lens, c.kv_lens, c.page_size, pool, rng);
  const DType kv_dt = c.kv_dt == DType::kFloat32 ? c.dt : c.kv_dt;
  Inputs in = make_inputs(s, c.H, c.page_size, pool, c.dt, seed, kv_dt, c.ramp);
  MLATask task;
  task.num_heads = c.H;
  task.page_size = c.page_size;
  task.q_dtype = c.dt;
  task.kv_dtype = kv_dt;
  task.causal = c.causal;
  task.max_batch = static_cast<int64_t>(c.qo_lens.size());
  task.max_total_q = std::max<int64_t>(1, s.qo_indptr.back());
  task.max_pages = std::max<int64_t>(1, need);
  const auto sz = BatchMLA::workspace_size(task, cuda::device_info(cuda::current_device()).sm_count, opt);
  Workspace ws = Workspace::allocate(sz.device_bytes, sz.host_bytes);
  BatchMLA mla(task, ws, opt);
  mla.plan(s.qo_indptr, s.kv_indptr, s.kv_indices, s.kv_lens);
  MLARunOptions ro;
  ro.sm_scale = 1.0 / std::sqrt(192.0);  // DeepSeek's: 1 / sqrt(qk_nope 128 + rope 64)
  ro.ckv_scale = c.ckv_scale;
  ro.kpe_scale = c.kpe_scale;
  mla.run(in.d_q_nope.view, in.d_q_pe.view, in.d_ckv.view, in.d_kpe.view, in.d_o.view, in.d_lse.view, nullptr, ro);
  const cudaError_t synced = cudaDeviceSynchronize();
  EXPECT_EQ(synced, cudaSuccess);
  if (synced != cudaSuccess) return 0;
  std::string what = "H " + std::to_string(c.H) + " page " + std::to_string(c.page_size) + " " + dtype_name(c.dt) +
                     " caches " + dtype_name(kv_dt) + (c.causal ? " causal" : "") + " tile " +
                     std::to_string(mla.config().cta_q) + (mla.config().hopper ? " hopper" : "") + " split tiles " +
                     std::to_string(mla.last_plan().num_split);
  expect_matches_reference(in, s, c.causal, ro.sm_scale, c.dt, what, c.ckv_scale, c.kpe_scale);
  int most_chunks = 0;
  for (const PrefillWorkItem& w : mla.last_plan().items) most_chunks = std::max(most_chunks, w.num_chunks);
  return most_chunks;
}

// Every correctness case runs on both kernel templates: the mma.sync kernel
// (fa2, any sm_80+) and the Hopper kernel (fa3, sm_90 only).
class MlaGpuBackend : public ::testing::TestWithParam<MlaBackend> {
 protected:
  void SetUp() override {
    SKIP_WITHOUT_GPU();
    if (GetParam() == MlaBackend::kFA3 && cuda::device_info(cuda::current_device()).major != 9)
      GTEST_SKIP() << "skipped: the Hopper MLA kernel needs sm_90";
  }
  MLAOptions options() const {
    MLAOptions o;
    o.backend = GetParam();
    return o;
  }
};
INSTANTIATE_TEST_SUITE_P(Templates, MlaGpuBackend, ::testing::Values(MlaBackend::kFA2, MlaBackend::kFA3),
                         [](const auto& info) { return info.param == MlaBackend::kFA2 ? "fa2" : "fa3"; });

TEST_P(MlaGpuBackend, DecodeAcrossHeadsPagesAndDtypes) {
  uint64_t seed = 100;
  for (DType dt : {DType::kFloat16, DType::kBFloat16})
    for (int H : {16, 32, 64, 128})
      for (int ps : {1, 16, 64})
        run_case({H, ps, dt, false, {1, 1, 1, 1, 1}, {0, 1, 97, 1031, 64}}, ++seed, options());
}

TEST_P(MlaGpuBackend, MultiTokenCausalQueries) {
  uint64_t seed = 200;
  for (DType dt : {DType::kFloat16, DType::kBFloat16})
    for (int H : {16, 32, 64, 128})
      for (int q : {1, 2, 3, 5, 8})
        run_case({H, 64, dt, true, {q, q, q}, {q, 37 + q, 509}}, ++seed, options());
  // Mixed query lengths in one batch, page size 16 and 1.
  for (int ps : {1, 16})
    run_case({32, ps, DType::kFloat16, true, {1, 8, 4, 2, 7}, {1, 8, 131, 2053, 9}}, ++seed, options());
  // Non-causal multi-token (absorbed prefill without a mask).
  run_case({16, 16, DType::kFloat16, false, {6, 3}, {100, 3}}, ++seed, options());
}

TEST_P(MlaGpuBackend, LongContextsSplitKvAndMerge) {
  // Few requests, long KV: the planner splits them over the CTAs.
  run_case({16, 64, DType::kFloat16, false, {1}, {32768}}, 300, options());
  run_case({128, 64, DType::kBFloat16, false, {1, 1}, {20011, 4099}}, 301, options());
  run_case({64, 16, DType::kFloat16, true, {2, 8}, {16411, 8191}}, 302, options());
  // A workspace with no partial states: no split, same answers.
  MLAOptions no_split = options();
  no_split.planner.split_kv = false;
  run_case({16, 64, DType::kFloat16, true, {3}, {9001}}, 303, no_split);
  // Each query tile pinned (at 16 rows a request of 32 heads spans 2-8
  // tiles).
  for (int q : {16, 32, 64}) {
    MLAOptions o = options();
    o.cta_q = q;
    run_case({32, 16, DType::kBFloat16, true, {2, 1, 4}, {5000, 17, 777}}, 310 + q, o);
  }
  {
    // Two requests of 128 heads (four 64-row tiles) on 8 SMs: the plan cuts
    // every tile in two (on the Hopper kernel's one CTA an SM), which the
    // chunks' CTAs merge cooperatively.
    MLAOptions o = options();
    o.cta_q = 64;
    o.max_sms = 8;
    const int chunks = run_case({128, 64, DType::kBFloat16, false, {1, 1}, {4099, 3001}}, 390, o);
    if (GetParam() == MlaBackend::kFA3) EXPECT_EQ(chunks, 2) << "every tile cut in two";
  }
  if (GetParam() == MlaBackend::kFA3) {
    // H = 16 decode on the 64-row tiles (auto takes 16 there), and 8 heads x
    // 2 causal queries in one 16-row tile.
    MLAOptions o = options();
    o.cta_q = 64;
    run_case({16, 64, DType::kFloat16, false, {1, 1, 1}, {0, 97, 20011}}, 380, o);
    o.cta_q = 16;
    run_case({8, 16, DType::kBFloat16, true, {2, 2, 1}, {2, 600, 8191}}, 381, o);
    // The pair form (32-row tiles, a consumer per 16 rows): H = 16 x 2
    // causal queries and H = 32 decode pick it; a long context cut over
    // every SM (both consumers merge the tile together), four tiles on 8
    // SMs (each cut in two: the register merge, per consumer), and 8 heads
    // x 3 queries, whose second consumer holds 8 rows.
    o = options();
    run_case({16, 64, DType::kBFloat16, true, {2, 2, 2}, {2, 600, 20011}}, 382, o);
    EXPECT_EQ(run_case({32, 64, DType::kFloat16, false, {1}, {32768}}, 383, o) > 2, true) << "cut over the SMs";
    o.max_sms = 8;
    EXPECT_EQ(run_case({32, 64, DType::kBFloat16, false, {1, 1, 1, 1}, {4099, 4099, 4099, 4099}}, 384, o), 2)
        << "every tile cut in two";
    o = options();
    o.cta_q = 32;
    run_case({8, 1, DType::kFloat16, true, {3, 1}, {4099, 3}}, 385, o);
  }
}

// fp8 latent caches (the Hopper kernel): e4m3 and e5m2 under fp16 and bf16
// queries, per-tensor scales (equal and unequal for ckv and kpe), against the
// reference over the dequantized caches; decode, causal multi-token queries
// and a long split context.
// Logits that climb along the context: a row's maximum jumps past the
// kernels' slack (2^8) tile after tile, so O is rescaled in most tiles,
// which random keys, whose maximum settles in the first tile, never ask
// for. ramp 0.12 a token moves a row whose q sums to one standard
// deviation (~14) by ~11 (base 2) a 64-key tile; rows with other sums
// climb slower, stay or fall. Every tile form: 16 rows (H 16), the pair
// (H 32), 64 rows (H 64 / 128, and fp8 caches at H 16 x 2).
TEST_P(MlaGpuBackend, RowMaximaThatKeepJumping) {
  uint64_t seed = 900;
  for (DType dt : {DType::kFloat16, DType::kBFloat16})
    for (int H : {16, 32, 64, 128}) {
      Case c{H, 64, dt, false, {1, 1, 1}, {1031, 300, 700}};
      c.ramp = 0.12;
      run_case(c, ++seed, options());
    }
  Case causal{128, 16, DType::kBFloat16, true, {2, 3}, {1500, 515}};
  causal.ramp = 0.12;
  run_case(causal, ++seed, options());
  if (GetParam() == MlaBackend::kFA3) {  // stored values up to ~1 + 0.24 x 900, scale 0.5
    Case fp8{16, 64, DType::kBFloat16, true, {2, 2}, {900, 333}, DType::kFloat8E4M3, 0.5, 0.5};
    fp8.ramp = 0.24;
    run_case(fp8, ++seed, options());
  }
}

TEST(MlaGpuFp8, HopperKernelMatchesTheDequantizedReference) {
  SKIP_WITHOUT_GPU();
  if (cuda::device_info(cuda::current_device()).major != 9) GTEST_SKIP() << "skipped: fp8 MLA caches need sm_90";
  uint64_t seed = 400;
  for (DType kv : {DType::kFloat8E4M3, DType::kFloat8E5M2})
    for (DType dt : {DType::kFloat16, DType::kBFloat16})
      for (int H : {16, 128})
        for (int ps : {1, 16, 64}) {
          Case c{H, ps, dt, false, {1, 1, 1, 1, 1}, {0, 1, 97, 1031, 64}, kv, 0.5, ps == 16 ? 0.5 : 1.75};
          run_case(c, ++seed);
        }
  for (int q : {2, 8})
    run_case({128, 64, DType::kBFloat16, true, {q, q, q}, {q, 37 + q, 509}, DType::kFloat8E4M3, 0.03, 0.02}, ++seed);
  run_case({16, 64, DType::kFloat16, false, {1, 1}, {32768, 3001}, DType::kFloat8E4M3, 2.0, 0.25}, ++seed);
  // H x q_len <= 16 takes the 16-row tiles (their widener warpgroups widen
  // the rows); the same decode pinned to the 64-row ones, and causal
  // queries of 8 heads x 2 in one 16-row tile.
  MLAOptions tile64;
  tile64.cta_q = 64;
  run_case({16, 64, DType::kBFloat16, false, {1, 1, 1}, {0, 97, 20011}, DType::kFloat8E4M3, 0.5, 1.75}, ++seed, tile64);
  run_case({8, 16, DType::kFloat16, true, {2, 2, 1}, {2, 600, 8191}, DType::kFloat8E5M2, 0.5, 0.5}, ++seed);
  run_case({8, 1, DType::kBFloat16, true, {2, 1}, {4099, 3}, DType::kFloat8E4M3, 0.02, 0.03}, ++seed);
}

// Two runs of one plan write the same bits (split tiles merge in chunk order).
TEST_P(MlaGpuBackend, BitwiseDeterministic) {
  std::mt19937 rng(7);
  const int H = 128, ps = 64;
  const std::vector<int32_t> qo(8, 2), kv{10000, 300, 7, 4096, 1, 12345, 640, 2};
  int pool = 0;
  for (int32_t k : kv) pool += (k + ps - 1) / ps;
  const Step s = make_step(qo, kv, ps, pool, rng);
  Inputs in = make_inputs(s, H, ps, pool, DType::kBFloat16, 7);
  MLATask task;
  task.num_heads = H;
  task.page_size = ps;
  task.q_dtype = task.kv_dtype = DType::kBFloat16;
  task.causal = true;
  task.max_batch = 8;
  task.max_total_q = 16;
  task.max_pages = pool;
  const auto sz = BatchMLA::workspace_size(task, cuda::device_info(cuda::current_device()).sm_count, options());
  Workspace ws = Workspace::allocate(sz.device_bytes, sz.host_bytes);
  BatchMLA mla(task, ws, options());
  mla.plan(s.qo_indptr, s.kv_indptr, s.kv_indices, s.kv_lens);
  EXPECT_EQ(mla.config().hopper, GetParam() == MlaBackend::kFA3);
  EXPECT_GT(mla.last_plan().num_split, 0);
  HostTensor first;
  for (int run = 0; run < 3; ++run) {
    in.d_o.buf.fill(0xFF);
    mla.run(in.d_q_nope.view, in.d_q_pe.view, in.d_ckv.view, in.d_kpe.view, in.d_o.view, in.d_lse.view);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    HostTensor o = test::to_host(in.d_o, in.o);
    if (run == 0) first = o;
    else EXPECT_TRUE(test::bitwise_equal(first, o)) << "run " << run;
  }
  expect_matches_reference(in, s, true, 1.0 / std::sqrt(576.0), DType::kBFloat16, "determinism case");
}

// One capture of run(), replayed after plans of other lengths (same bounds),
// each checked against the reference; page ids on the GPU for the second step.
TEST_P(MlaGpuBackend, CudaGraphReplayWithChangedLengths) {
  std::mt19937 rng(11);
  const int H = 16, ps = 16, pool = 1200;
  MLATask task;
  task.num_heads = H;
  task.page_size = ps;
  task.causal = true;
  task.max_batch = 16;
  task.max_total_q = 64;
  task.max_pages = pool;
  const auto sz = BatchMLA::workspace_size(task, cuda::device_info(cuda::current_device()).sm_count, options());
  Workspace ws = Workspace::allocate(sz.device_bytes, sz.host_bytes);
  BatchMLA mla(task, ws, options());
  // Fixed tensors sized for the bounds; each step uses a prefix of q / o rows.
  const std::vector<std::vector<int32_t>> qo_steps = {{1, 1, 1, 1}, {2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2}, {4, 1, 3}};
  const std::vector<std::vector<int32_t>> kv_steps = {{1, 700, 63, 4000}, {2, 9, 100, 5, 17, 2000, 3, 30, 2, 444, 8, 11},
                                                      {16000, 1, 9}};
  HostTensor q_nope = test::make_host(DType::kFloat16, {64, H, kDc}), q_pe = test::make_host(DType::kFloat16, {64, H, kDr});
  HostTensor ckv = test::make_host(DType::kFloat16, {pool, ps, kDc}), kpe = test::make_host(DType::kFloat16, {pool, ps, kDr});
  HostTensor o = test::make_host(DType::kFloat16, {64, H, kDc}), lse = test::make_host(DType::kFloat32, {64, H});
  test::fill_random(q_nope, 1);
  test::fill_random(q_pe, 2);
  DeviceTensor dq = test::to_device(q_nope), dqp = test::to_device(q_pe);
  DeviceTensor dckv = test::to_device(ckv), dkpe = test::to_device(kpe);
  DeviceTensor d_o = test::poisoned_like(o), d_lse = test::poisoned_like(lse);
  cudaStream_t stream;
  ASSERT_EQ(cudaStreamCreate(&stream), cudaSuccess);
  cudaGraphExec_t exec = nullptr;
  for (size_t k = 0; k < qo_steps.size(); ++k) {
    const Step s = make_step(qo_steps[k], kv_steps[k], ps, pool, rng);
    fill_caches(ckv, kpe, s, ps, 50 + k);
    dckv.buf.upload(ckv.storage.data(), ckv.storage.size());
    dkpe.buf.upload(kpe.storage.data(), kpe.storage.size());
    d_o.buf.fill(0xFF);
    d_lse.buf.fill(0xFF);
    // Each step's rows are a prefix of the fixed tensors; the capture (first
    // step) bakes in their addresses, later steps only plan.
    const int64_t T = s.qo_indptr.back();
    TensorView qv = dq.view, qpv = dqp.view, ov = d_o.view, lv = d_lse.view;
    if (k == 1) {  // page ids on the GPU
      cuda::DeviceBuffer ids(std::max<size_t>(4, s.kv_indices.size() * 4));
      ids.upload(s.kv_indices.data(), s.kv_indices.size() * 4);
      TensorView idv(ids.get(), DType::kInt32, Device{DeviceType::kCUDA, cuda::current_device()},
                     {static_cast<int64_t>(s.kv_indices.size())});
      mla.plan(s.qo_indptr, s.kv_indptr, idv, s.kv_lens, stream);
      ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);  // ids copied before the buffer goes
    } else {
      mla.plan(s.qo_indptr, s.kv_indptr, s.kv_indices, s.kv_lens, stream);
    }
    qv.shape[0] = qpv.shape[0] = ov.shape[0] = lv.shape[0] = T;
    if (exec == nullptr) {
      cudaGraph_t graph;
      ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal), cudaSuccess);
      mla.run(qv, qpv, dckv.view, dkpe.view, ov, lv, stream);
      ASSERT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
      ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
      cudaGraphDestroy(graph);
    }
    ASSERT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    // Reference on this step's rows.
    HostTensor qn = test::make_host(DType::kFloat16, {T, H, kDc}), qp = test::make_host(DType::kFloat16, {T, H, kDr});
    std::copy_n(q_nope.storage.begin(), qn.storage.size(), qn.storage.begin());
    std::copy_n(q_pe.storage.begin(), qp.storage.size(), qp.storage.begin());
    const reference::Result ref = reference::mla_paged(qn.view, qp.view, ckv.view, kpe.view, s.qo_indptr, s.kv_indptr,
                                                       s.kv_indices, s.kv_lens, true);
    HostTensor oh = test::to_host(d_o, o), lh = test::to_host(d_lse, lse);
    std::vector<double> od = test::to_doubles(oh.view), ld = test::to_doubles(lh.view);
    od.resize(ref.o.size());
    ld.resize(ref.lse.size());
    SCOPED_TRACE("step " + std::to_string(k));
    EXPECT_CLOSE(test::compare(od, ref.o), DType::kFloat16);
    EXPECT_CLOSE(test::compare(ld, ref.lse), DType::kFloat16);
  }
  cudaGraphExecDestroy(exec);
  cudaStreamDestroy(stream);
}

TEST(MlaGpu, BadDevicePageIdIsRaisedByTheNextCall) {
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(3);
  const int H = 16, ps = 16, pool = 8;
  const Step s = make_step({1}, {40}, ps, pool, rng);
  Inputs in = make_inputs(s, H, ps, pool, DType::kFloat16, 3);
  MLATask task;
  task.num_heads = H;
  task.page_size = ps;
  Workspace ws = Workspace::allocate(64 << 20, 1 << 20);
  BatchMLA mla(task, ws);
  std::vector<int32_t> bad = s.kv_indices;
  bad[1] = pool + 5;
  cuda::DeviceBuffer ids(bad.size() * 4);
  ids.upload(bad.data(), bad.size() * 4);
  TensorView idv(ids.get(), DType::kInt32, Device{DeviceType::kCUDA, cuda::current_device()},
                 {static_cast<int64_t>(bad.size())});
  mla.plan(s.qo_indptr, s.kv_indptr, idv, s.kv_lens);
  mla.run(in.d_q_nope.view, in.d_q_pe.view, in.d_ckv.view, in.d_kpe.view, in.d_o.view, in.d_lse.view);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_THROW_MSG(mla.plan(s.qo_indptr, s.kv_indptr, s.kv_indices, s.kv_lens), InvalidArgument, "kv_indices");
}

TEST(MlaGpu, RunChecksTensorsByName) {
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(5);
  const Step s = make_step({1, 1}, {20, 3}, 16, 4, rng);
  Inputs in = make_inputs(s, 16, 16, 4, DType::kFloat16, 5);
  MLATask task;
  task.num_heads = 16;
  task.page_size = 16;
  Workspace ws = Workspace::allocate(64 << 20, 1 << 20);
  BatchMLA mla(task, ws);
  mla.plan(s.qo_indptr, s.kv_indptr, s.kv_indices, s.kv_lens);
  const TensorView& q = in.d_q_nope.view;
  EXPECT_THROW_MSG(mla.run(in.d_q_pe.view, in.d_q_pe.view, in.d_ckv.view, in.d_kpe.view, in.d_o.view, in.d_lse.view),
                   InvalidArgument, "q_nope");
  EXPECT_THROW_MSG(mla.run(q, q, in.d_ckv.view, in.d_kpe.view, in.d_o.view, in.d_lse.view), InvalidArgument, "q_pe");
  EXPECT_THROW_MSG(mla.run(q, in.d_q_pe.view, in.d_kpe.view, in.d_kpe.view, in.d_o.view, in.d_lse.view),
                   InvalidArgument, "ckv_cache");
  EXPECT_THROW_MSG(mla.run(q, in.d_q_pe.view, in.d_ckv.view, in.d_ckv.view, in.d_o.view, in.d_lse.view),
                   InvalidArgument, "kpe_cache");
  EXPECT_THROW_MSG(mla.run(q, in.d_q_pe.view, in.d_ckv.view, in.d_kpe.view, in.d_lse.view, in.d_lse.view),
                   InvalidArgument, "o");
  EXPECT_THROW_MSG(mla.run(q, in.d_q_pe.view, in.d_ckv.view, in.d_kpe.view, in.d_o.view, in.d_o.view),
                   InvalidArgument, "lse");
}

}  // namespace
}  // namespace tessera
