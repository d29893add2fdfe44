// AttentionWrapper and the RoPE ops on a GPU, beyond the built-in matrix:
// run()'s extras checks with real tensors, the custom-mask variant's bits as
// a run() argument, a CUDA graph captured with extras and replayed after
// re-plans, apply_rope / apply_rope_pos_ids (linear and Llama 3.1
// frequencies) and apply_rope_pos_ids_cos_sin_cache against the reference
// (both layouts, partial rotary_dim, in place), and fused RoPE decode against
// the unfused pipeline (apply_rope on q and the cache, then plain decode).
#include <gtest/gtest.h>

#include <cstring>
#include <numeric>
#include <random>

#include "decode_util.hpp"
#include "prefill_util.hpp"
#include "tessera/api/attention_wrapper.hpp"
#include "tessera/api/rope.hpp"
#include "tessera/formats/custom_mask.hpp"
#include "variant_gpu_util.hpp"

using namespace tessera;
using namespace tessera::test;

namespace {

const AttentionSpec kAlibiSpec{variants::alibi(true), DType::kFloat16, DType::kFloat16, DType::kFloat16, 128};

Workspace wrapper_workspace(const AttentionSpec& spec, const TaskInfo& task, const AttentionWrapperOptions& opt = {}) {
  auto s = AttentionWrapper::workspace_size(spec, task, cuda::device_info(cuda::current_device()).sm_count, opt);
  return Workspace::allocate(s.device_bytes, s.host_bytes);
}

TEST(VariantApiGpu, RunChecksExtrasByName) {
  SKIP_WITHOUT_GPU();
  const DecodeCase c{DType::kFloat16, 128, 4, 16, KVLayout::kNHD};
  std::mt19937_64 rng(5);
  const std::vector<int32_t> lens{40, 17};
  Table t = make_table(lens, 16, 8, rng);
  Problem p = make_problem(c, 2, 8, 2, 7);
  TaskInfo task{8, 2, 16, KVLayout::kNHD, 4, 32};
  task.max_total_q = 64;
  Workspace ws = wrapper_workspace(kAlibiSpec, task);
  AttentionWrapper attn(kAlibiSpec, task, ws);
  attn.plan(std::vector<int32_t>{0, 1, 2}, t.indptr, t.indices, t.last);
  HostTensor o = make_host(DType::kFloat16, {2, 8, 128});
  auto d_o = to_device(o);
  const PagedKVStorage kv(p.dk.view, p.dv.view, KVLayout::kNHD);
  HostTensor slopes32 = floats(std::vector<double>(8, 0.1)), slopes16 = make_host(DType::kFloat16, {8});
  auto d32 = to_device(slopes32), d16 = to_device(slopes16);
  auto run = [&](const VariantArgs& a) { attn.run(p.dq.view, kv, d_o.view, TensorView(), a); };
  EXPECT_THROW_MSG(run(VariantArgs()), InvalidArgument, "alibi_slopes: missing");
  VariantArgs wrong_dtype;
  wrong_dtype.set("alibi_slopes", d16.view);
  EXPECT_THROW_MSG(run(wrong_dtype), TypeMismatch, "alibi_slopes");
  VariantArgs on_host;
  on_host.set("alibi_slopes", slopes32.view);
  EXPECT_THROW_MSG(run(on_host), TypeMismatch, "alibi_slopes: expected device");
  VariantArgs unknown;
  unknown.set("alibi_slopes", d32.view).set("alibi_slope", d32.view);
  EXPECT_THROW_MSG(run(unknown), InvalidArgument, "alibi_slope: not an extra of variant CausalAlibi");
  VariantArgs good;
  good.set("alibi_slopes", d32.view);
  EXPECT_NO_THROW(run(good));
  TESSERA_CUDA_CHECK(cudaDeviceSynchronize());
  EXPECT_THROW_MSG(attn.run_ragged(p.dq.view, p.dk.view, p.dv.view, d_o.view, TensorView(), good), InvalidArgument,
                   "run_ragged");
  // A later plan must fit the kind the first one chose.
  EXPECT_THROW_MSG(attn.plan(std::vector<int32_t>{0, 2, 3}, t.indptr, t.indices, t.last), InvalidArgument, "kPrefill");
}

TEST(VariantApiGpu, CustomMaskBitsAreARunArgument) {
  SKIP_WITHOUT_GPU();
  const std::vector<int32_t> q_len{3, 0, 20, 7}, kv_len{9, 5, 20, 130};
  std::vector<int32_t> qo{0}, kvp{0};
  for (size_t i = 0; i < q_len.size(); ++i) qo.push_back(qo.back() + q_len[i]), kvp.push_back(kvp.back() + kv_len[i]);
  std::mt19937_64 rng(8);
  std::vector<uint8_t> mask;
  for (size_t i = 0; i < q_len.size(); ++i)
    for (int x = 0; x < q_len[i] * kv_len[i]; ++x) mask.push_back(rng() % 3 != 0);
  const PackedMask packed = pack_custom_mask(mask, q_len, kv_len);
  HostTensor q = make_host(DType::kBFloat16, {qo.back(), 8, 64}), k = make_host(DType::kBFloat16, {kvp.back(), 2, 64}), v = k;
  fill_random(q, 1, -2, 2);
  fill_random(k, 2);
  fill_random(v, 3);
  HostTensor bits = make_host(DType::kUInt8, {static_cast<int64_t>(packed.bits.size())});
  std::copy(packed.bits.begin(), packed.bits.end(), bits.storage.begin());
  reference::Options ro;
  ro.custom_mask = mask;
  auto ref = reference::attention_ragged(q.view, RaggedIndex(qo), k.view, v.view, RaggedIndex(kvp), ro);
  const AttentionSpec spec{variants::custom_mask(), DType::kBFloat16, DType::kBFloat16, DType::kBFloat16, 64};
  TaskInfo task{8, 2, 1, KVLayout::kNHD, 8, 1};
  task.max_total_q = 256;
  Workspace ws = wrapper_workspace(spec, task);
  AttentionWrapper attn(spec, task, ws);
  attn.plan_ragged(qo, kvp, nullptr, packed.indptr);
  auto dq = to_device(q), dk = to_device(k), dv = to_device(v), dbits = to_device(bits);
  VariantArgs args;
  args.set("packed_custom_mask", dbits.view);
  Out a = run_and_fetch([&](const TensorView& o, const TensorView& lse) { attn.run_ragged(dq.view, dk.view, dv.view, o, lse, args); },
                        DType::kBFloat16, qo.back(), 8, 64);
  EXPECT_CLOSE(compare(to_doubles(a.o.view), ref.o), DType::kBFloat16);
  EXPECT_CLOSE(compare(to_doubles(a.lse.view), ref.lse), DType::kFloat16);
  HostTensor o = make_host(DType::kBFloat16, {qo.back(), 8, 64});
  auto d_o = to_device(o);
  EXPECT_THROW_MSG(attn.run_ragged(dq.view, dk.view, dv.view, d_o.view, TensorView()), InvalidArgument,
                   "packed_custom_mask: missing");
}

// Three layers captured once with ALiBi slopes bound; replays after re-plans
// with other lengths must match the reference.
TEST(VariantApiGpu, GraphCapturedWithExtrasReplaysAfterReplan) {
  SKIP_WITHOUT_GPU();
  const DecodeCase c{DType::kFloat16, 128, 4, 16, KVLayout::kNHD};
  const int64_t max_batch = 8, pool = 16 * 40, layers = 3;
  std::mt19937_64 rng(21);
  TaskInfo task{8, 2, 16, KVLayout::kNHD, max_batch, pool};
  task.max_total_q = max_batch;
  AttentionWrapperOptions opt;
  opt.kind = AttentionKind::kDecode;
  Workspace ws = wrapper_workspace(kAlibiSpec, task, opt);
  AttentionWrapper attn(kAlibiSpec, task, ws, opt);
  std::vector<Problem> layer;
  for (int l = 0; l < layers; ++l) layer.push_back(make_problem(c, max_batch, pool, 2, 300 + l));
  const std::vector<double> slopes = [] {
    const auto s = variants::alibi_slopes(8);
    return std::vector<double>(s.begin(), s.end());
  }();
  auto d_slopes = to_device(floats(slopes));
  VariantArgs args;
  args.set("alibi_slopes", d_slopes.view);
  HostTensor o_like = make_host(DType::kFloat16, {max_batch, 8, 128});
  std::vector<DeviceTensor> outs;
  for (int l = 0; l < layers; ++l) outs.push_back(poisoned_like(o_like));
  auto lens_of = [&](int step) {
    std::vector<int32_t> lens(step == 0 ? max_batch : 3 + step);
    for (auto& x : lens) x = static_cast<int32_t>(1 + rng() % 700);
    lens[0] = 4000 + 300 * step;  // split over several CTAs
    return lens;
  };
  std::vector<int32_t> qo(max_batch + 1);
  std::iota(qo.begin(), qo.end(), 0);
  cudaStream_t stream;
  TESSERA_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  Table t = make_table(lens_of(0), 16, pool, rng);
  attn.plan(qo, t.indptr, t.indices, t.last, stream);
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  TESSERA_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  for (int l = 0; l < layers; ++l)
    attn.run(layer[l].dq.view, PagedKVStorage(layer[l].dk.view, layer[l].dv.view, KVLayout::kNHD), outs[l].view,
             TensorView(), args, stream);
  TESSERA_CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
  TESSERA_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  for (int step = 0; step < 3; ++step) {
    SCOPED_TRACE("step " + std::to_string(step));
    if (step > 0) {
      t = make_table(lens_of(step), 16, pool, rng);
      const std::vector<int32_t> step_qo(qo.begin(), qo.begin() + t.kv_lens.size() + 1);
      attn.plan(step_qo, t.indptr, t.indices, t.last, stream);
    }
    for (auto& o : outs) o.buf.fill(0xFF);
    TESSERA_CUDA_CHECK(cudaGraphLaunch(exec, stream));
    TESSERA_CUDA_CHECK(cudaStreamSynchronize(stream));
    const int64_t batch = static_cast<int64_t>(t.kv_lens.size());
    reference::Options ro;
    ro.alibi_slopes = slopes;
    std::vector<int32_t> ref_qo(qo.begin(), qo.begin() + batch + 1);
    for (int l = 0; l < layers; ++l) {
      PagedKVCache cache(PagedKVStorage(layer[l].k.view, layer[l].v.view, KVLayout::kNHD),
                         PageTable(t.indptr, t.indices, t.last, 16, t.num_pages));
      TensorView qv = layer[l].q.view;
      qv.shape[0] = batch;
      auto ref = reference::attention_paged(qv, RaggedIndex(ref_qo), cache, ro);
      HostTensor got = to_host(outs[l], o_like);
      TensorView gv = got.view;
      gv.shape[0] = batch;
      EXPECT_CLOSE(compare(to_doubles(gv), ref.o), DType::kFloat16);
    }
  }
  TESSERA_CUDA_CHECK(cudaGraphExecDestroy(exec));
  TESSERA_CUDA_CHECK(cudaGraphDestroy(graph));
  TESSERA_CUDA_CHECK(cudaStreamDestroy(stream));
}

struct RopeGpuCase {
  DType dt;
  int D, rotary_dim;
  bool interleave, in_place, pos_ids;
  bool llama31 = false;
};

class ApplyRopeGpu : public ::testing::TestWithParam<RopeGpuCase> {};

TEST_P(ApplyRopeGpu, MatchesReference) {
  SKIP_WITHOUT_GPU();
  const RopeGpuCase c = GetParam();
  RopeOptions o{c.rotary_dim, c.interleave, c.interleave ? 2.0 : 1.0, c.interleave ? 5e5 : 1e4};
  if (c.llama31) {
    // A short old context, so the positions here (up to ~1000) see all three
    // bands: wavelengths above 600 scaled by 8, below 120 kept, between blended.
    o.llama31 = true;
    o.rope_scale = 8.0, o.rope_theta = 5e5;
    o.low_freq_factor = 1.0, o.high_freq_factor = 5.0, o.old_context_len = 600.0;
  }
  // Positions up to ~1000: float RoPE frequencies carry ~1e-7 relative
  // error (device/primitives/rope.cuh), ~1e-4 rad here, well inside fp16's
  // rounding of the result; far larger positions would measure that error.
  const std::vector<int32_t> indptr{0, 5, 5, 300, 301}, offsets{0, 7, 700, 1000};
  std::vector<int64_t> pos;
  for (size_t b = 0; b + 1 < indptr.size(); ++b)
    for (int32_t n = indptr[b]; n < indptr[b + 1]; ++n) pos.push_back(offsets[b] + n - indptr[b]);
  const int64_t nnz = indptr.back();
  HostTensor q = make_host(c.dt, {nnz, 8, c.D}), k = make_host(c.dt, {nnz, 2, c.D});
  fill_random(q, 31, -3, 3);
  fill_random(k, 32, -3, 3);
  reference::RopeOptions ro{c.interleave, o.rope_scale, o.rope_theta, c.rotary_dim};
  ro.llama31 = o.llama31;
  ro.low_freq_factor = o.low_freq_factor, ro.high_freq_factor = o.high_freq_factor;
  ro.old_context_len = o.old_context_len;
  const auto want_q = reference::apply_rope(q.view, pos, ro), want_k = reference::apply_rope(k.view, pos, ro);
  auto dq = to_device(q), dk = to_device(k);
  DeviceTensor qo = c.in_place ? to_device(q) : poisoned_like(q), ko = c.in_place ? to_device(k) : poisoned_like(k);
  const TensorView& qin = c.in_place ? qo.view : dq.view;
  const TensorView& kin = c.in_place ? ko.view : dk.view;
  if (c.pos_ids) {
    HostTensor ids = make_host(DType::kInt32, {nnz});
    for (int64_t n = 0; n < nnz; ++n) reinterpret_cast<int32_t*>(ids.storage.data())[n] = static_cast<int32_t>(pos[n]);
    auto d_ids = to_device(ids);
    apply_rope_pos_ids(qin, kin, qo.view, ko.view, d_ids.view, o);
    TESSERA_CUDA_CHECK(cudaDeviceSynchronize());
  } else {
    HostTensor ip = make_host(DType::kInt32, {5}), off = make_host(DType::kInt32, {4});
    std::memcpy(ip.storage.data(), indptr.data(), sizeof(int32_t) * 5);
    std::memcpy(off.storage.data(), offsets.data(), sizeof(int32_t) * 4);
    auto d_ip = to_device(ip), d_off = to_device(off);
    apply_rope(qin, kin, qo.view, ko.view, d_ip.view, d_off.view, o);
    TESSERA_CUDA_CHECK(cudaDeviceSynchronize());
  }
  EXPECT_CLOSE(compare(to_doubles(to_host(qo, q).view), want_q), c.dt);
  EXPECT_CLOSE(compare(to_doubles(to_host(ko, k).view), want_k), c.dt);
}

INSTANTIATE_TEST_SUITE_P(Layouts, ApplyRopeGpu,
                         ::testing::Values(RopeGpuCase{DType::kFloat16, 128, -1, false, false, true},
                                           RopeGpuCase{DType::kFloat16, 128, -1, true, true, false},
                                           RopeGpuCase{DType::kBFloat16, 64, 32, false, true, true},
                                           RopeGpuCase{DType::kBFloat16, 256, 128, true, false, false},
                                           RopeGpuCase{DType::kFloat16, 64, -1, false, false, false},
                                           RopeGpuCase{DType::kFloat16, 128, -1, false, false, true, true},
                                           RopeGpuCase{DType::kBFloat16, 128, 64, true, true, true, true},
                                           RopeGpuCase{DType::kFloat16, 256, 128, false, true, false, true},
                                           RopeGpuCase{DType::kBFloat16, 64, -1, true, false, false, true}),
                         [](const auto& info) {
                           const RopeGpuCase& c = info.param;
                           return std::string(dtype_name(c.dt)) + "_d" + std::to_string(c.D) + "_rd" +
                                  std::to_string(c.rotary_dim < 0 ? c.D : c.rotary_dim) +
                                  (c.interleave ? "_interleave" : "_half") + (c.in_place ? "_inplace" : "") +
                                  (c.pos_ids ? "_pos_ids" : "_indptr") + (c.llama31 ? "_llama31" : "");
                         });

struct RopeCacheGpuCase {
  DType dt;
  int D, rotary_dim;
  bool interleave, in_place;
};

class ApplyRopeCosSinCacheGpu : public ::testing::TestWithParam<RopeCacheGpuCase> {};

// The cache holds arbitrary values (not unit cos/sin pairs), so a column read
// from the wrong place shows; a row past the cache (last position) must come
// out NaN in its rotated features and unchanged beyond rotary_dim.
TEST_P(ApplyRopeCosSinCacheGpu, MatchesReference) {
  SKIP_WITHOUT_GPU();
  const RopeCacheGpuCase c = GetParam();
  const int64_t nnz = 301, rows = 1100, rd = c.rotary_dim;
  std::mt19937_64 rng(c.D * 3 + rd + c.interleave);
  std::vector<int64_t> pos(nnz);
  for (int64_t n = 0; n < nnz; ++n) pos[n] = static_cast<int64_t>(rng() % rows);
  pos[7] = 0, pos[8] = rows - 1;
  HostTensor q = make_host(c.dt, {nnz, 8, c.D}), k = make_host(c.dt, {nnz, 2, c.D});
  fill_random(q, 41, -3, 3);
  fill_random(k, 42, -3, 3);
  // A padded row stride (rd + 16 floats): rows need not be contiguous.
  const int64_t stride = rd + 16;
  HostTensor cache = make_host(DType::kFloat32, {rows, stride});
  std::vector<double> dense(rows * rd);
  std::uniform_real_distribution<float> u(-1.25f, 1.25f);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < stride; ++j) {
      const float v = u(rng);
      reinterpret_cast<float*>(cache.storage.data())[r * stride + j] = v;
      if (j < rd) dense[r * rd + j] = v;
    }
  HostTensor cache_view = cache;
  cache_view.view.shape = {rows, rd};
  cache_view.view.strides = {stride, 1};
  const auto want_q = reference::apply_rope_cos_sin(q.view, pos, dense, rd, c.interleave);
  const auto want_k = reference::apply_rope_cos_sin(k.view, pos, dense, rd, c.interleave);
  auto dq = to_device(q), dk = to_device(k), dcache = to_device(cache_view);
  DeviceTensor qo = c.in_place ? to_device(q) : poisoned_like(q), ko = c.in_place ? to_device(k) : poisoned_like(k);
  const TensorView& qin = c.in_place ? qo.view : dq.view;
  const TensorView& kin = c.in_place ? ko.view : dk.view;
  HostTensor ids = make_host(DType::kInt32, {nnz});
  for (int64_t n = 0; n < nnz; ++n) reinterpret_cast<int32_t*>(ids.storage.data())[n] = static_cast<int32_t>(pos[n]);
  auto d_ids = to_device(ids);
  apply_rope_pos_ids_cos_sin_cache(qin, kin, qo.view, ko.view, dcache.view, d_ids.view, c.interleave);
  TESSERA_CUDA_CHECK(cudaDeviceSynchronize());
  EXPECT_CLOSE(compare(to_doubles(to_host(qo, q).view), want_q), c.dt);
  EXPECT_CLOSE(compare(to_doubles(to_host(ko, k).view), want_k), c.dt);

  // Position `rows` (one past the cache) on row 0: NaN where rotated, the input beyond.
  reinterpret_cast<int32_t*>(ids.storage.data())[0] = static_cast<int32_t>(rows);
  auto d_far = to_device(ids);
  DeviceTensor qf = poisoned_like(q), kf = poisoned_like(k);
  apply_rope_pos_ids_cos_sin_cache(dq.view, dk.view, qf.view, kf.view, dcache.view, d_far.view, c.interleave);
  TESSERA_CUDA_CHECK(cudaDeviceSynchronize());
  const HostTensor hq = to_host(qf, q);
  for (int64_t h = 0; h < 8; ++h)
    for (int64_t d = 0; d < c.D; ++d) {
      const float got = load(hq.view, {0, h, d});
      if (d < rd) EXPECT_TRUE(std::isnan(got)) << "head " << h << " feature " << d;
      else EXPECT_EQ(got, load(q.view, {0, h, d})) << "head " << h << " feature " << d;
    }
  const auto rest = to_doubles(hq.view);
  const size_t row = static_cast<size_t>(8 * c.D);
  EXPECT_CLOSE(compare(std::vector<double>(rest.begin() + row, rest.end()),
                       std::vector<double>(want_q.begin() + row, want_q.end())),
               c.dt);
}

INSTANTIATE_TEST_SUITE_P(Layouts, ApplyRopeCosSinCacheGpu,
                         ::testing::Values(RopeCacheGpuCase{DType::kFloat16, 128, 128, false, false},
                                           RopeCacheGpuCase{DType::kFloat16, 128, 64, true, true},
                                           RopeCacheGpuCase{DType::kBFloat16, 64, 32, false, true},
                                           RopeCacheGpuCase{DType::kBFloat16, 256, 256, true, false},
                                           RopeCacheGpuCase{DType::kFloat16, 256, 96, false, false}),
                         [](const auto& info) {
                           const RopeCacheGpuCase& c = info.param;
                           return std::string(dtype_name(c.dt)) + "_d" + std::to_string(c.D) + "_rd" +
                                  std::to_string(c.rotary_dim) + (c.interleave ? "_interleave" : "_half") +
                                  (c.in_place ? "_inplace" : "");
                         });

// Fused RoPE decode == apply_rope on q (at kv_len - 1) and on every cached
// key (at its position), then standard decode: the same math, except that
// the unfused path stores rotated keys in fp16.
TEST(VariantApiGpu, FusedRopeDecodeMatchesUnfusedPipeline) {
  SKIP_WITHOUT_GPU();
  const DecodeCase c{DType::kFloat16, 128, 4, 16, KVLayout::kNHD};
  std::mt19937_64 rng(77);
  const std::vector<int32_t> lens{1, 50, 333, 1024};
  const int64_t batch = 4, pool = pages_needed(lens, 16) + 2;
  Table t = make_table(lens, 16, pool, rng);
  Problem p = make_problem(c, batch, pool, 2, 78);
  // Positions of every cache slot (unused slots: 0), and of each query.
  HostTensor slot_pos = make_host(DType::kInt32, {pool * 16}), q_pos = make_host(DType::kInt32, {batch});
  auto* sp = reinterpret_cast<int32_t*>(slot_pos.storage.data());
  for (int64_t b = 0; b < batch; ++b) {
    reinterpret_cast<int32_t*>(q_pos.storage.data())[b] = lens[b] - 1;
    for (int32_t pos = 0; pos < lens[b]; ++pos) sp[t.indices[t.indptr[b] + pos / 16] * 16 + pos % 16] = pos;
  }
  VariantArgs args;
  args.set("rope_scale", 1.0).set("rope_theta", 1e4);
  TaskInfo task{8, 2, 16, KVLayout::kNHD, 8, 4 * pool};
  const AttentionSpec fused{variants::rope(), DType::kFloat16, DType::kFloat16, DType::kFloat16, 128};
  Workspace ws = decode_workspace(fused, task);
  BatchDecode dec(fused, task, ws);
  dec.plan(t.indptr, t.indices, t.last);
  RunOptions ropt;
  ropt.extras = &args;
  Out a = run_and_fetch([&](const TensorView& o, const TensorView& lse) {
    dec.run(p.dq.view, PagedKVStorage(p.dk.view, p.dv.view, KVLayout::kNHD), o, lse, nullptr, ropt);
  }, DType::kFloat16, batch, 8, 128);

  reference::Options ro;
  ro.rope = reference::RopeOptions{false, 1.0, 1e4, -1};
  std::vector<int32_t> qo(batch + 1);
  std::iota(qo.begin(), qo.end(), 0);
  PagedKVCache cache(PagedKVStorage(p.k.view, p.v.view, KVLayout::kNHD),
                     PageTable(t.indptr, t.indices, t.last, 16, t.num_pages));
  const auto ref = reference::attention_paged(p.q.view, RaggedIndex(qo), cache, ro);
  EXPECT_CLOSE(compare(to_doubles(a.o.view), ref.o), DType::kFloat16);

  // Unfused: rotate q, and every cached key in place (K viewed as rows
  // [pool * 16, 2, 128]); apply_rope's k side gets zero heads here.
  auto qr = poisoned_like(p.q), kr = to_device(p.k);
  const TensorView k_rows(kr.view.data, DType::kFloat16, kr.view.device, {pool * 16, 2, 128});
  HostTensor no_heads_q = make_host(DType::kFloat16, {batch, 0, 128}), no_heads_k = make_host(DType::kFloat16, {pool * 16, 0, 128});
  auto nq = to_device(no_heads_q), nk = to_device(no_heads_k);
  auto d_slot = to_device(slot_pos), d_qpos = to_device(q_pos);
  apply_rope_pos_ids(p.dq.view, nq.view, qr.view, nq.view, d_qpos.view);
  apply_rope_pos_ids(k_rows, nk.view, k_rows, nk.view, d_slot.view);
  const AttentionSpec plain{variants::standard(), DType::kFloat16, DType::kFloat16, DType::kFloat16, 128};
  Workspace ws2 = decode_workspace(plain, task);
  BatchDecode dec2(plain, task, ws2);
  dec2.plan(t.indptr, t.indices, t.last);
  Out b = run_and_fetch([&](const TensorView& o, const TensorView& lse) {
    dec2.run(qr.view, PagedKVStorage(kr.view, p.dv.view, KVLayout::kNHD), o, lse);
  }, DType::kFloat16, batch, 8, 128);
  EXPECT_CLOSE(compare(to_doubles(b.o.view), to_doubles(a.o.view)), DType::kFloat16);
  EXPECT_CLOSE(compare(to_doubles(b.lse.view), to_doubles(a.lse.view)), DType::kFloat16);
}

}  // namespace
