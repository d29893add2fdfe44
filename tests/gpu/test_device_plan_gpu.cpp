// Planning on the GPU (api/device_batch.hpp, runtime/device_planner.hpp):
// the kernel writes exactly the host planner's plan on random batches
// (decode and prefill, paged and ragged, every option); a step planned on the GPU
// gives bitwise the outputs of the same step planned on the host (decode on
// tensor cores and CUDA cores, paged and ragged prefill), on 1,000 random
// batches; one
// CUDA graph (planner + layers) replays steps of any batch size against the
// reference; bad device inputs are raised by the next call; argument errors.
#include <gtest/gtest.h>

#include <cstring>
#include <random>

#include "decode_util.hpp"
#include "prefill_util.hpp"
#include "tessera/runtime/device_planner.hpp"

using namespace tessera;
using namespace tessera::test;

namespace {

Device gpu() { return Device{DeviceType::kCUDA, cuda::current_device()}; }

// An int32 CUDA buffer of `count` entries (at least 1), holding `values` first.
struct IntBuffer {
  cuda::DeviceBuffer buf;
  int64_t count;
  explicit IntBuffer(int64_t n) : buf(sizeof(int32_t) * std::max<int64_t>(n, 1)), count(std::max<int64_t>(n, 1)) {}
  void set(const std::vector<int32_t>& values) {
    if (!values.empty()) buf.upload(values.data(), sizeof(int32_t) * values.size());
  }
  TensorView view() const { return TensorView(buf.get(), DType::kInt32, gpu(), {count}); }
};

// The device buffers of a step, sized for the bounds.
struct StepBuffers {
  IntBuffer batch{1}, qo, kv, ids, last;
  StepBuffers(int64_t max_batch, int64_t max_pages) : qo(max_batch + 1), kv(max_batch + 1), ids(max_pages), last(max_batch) {}
  void set(const Table& t, const std::vector<int32_t>& qo_indptr = {}) {
    batch.set({static_cast<int32_t>(t.kv_lens.size())});
    kv.set(t.indptr);
    ids.set(t.indices);
    last.set(t.last);
    qo.set(qo_indptr);
  }
  DeviceBatch decode() const { return {batch.view(), TensorView(), kv.view(), ids.view(), last.view()}; }
  DeviceBatch prefill() const { return {batch.view(), qo.view(), kv.view(), ids.view(), last.view()}; }
};

std::vector<int32_t> random_lens(std::mt19937_64& rng, int64_t batch, int max_len) {
  std::vector<int32_t> lens(batch);
  for (auto& x : lens) {
    const int kind = static_cast<int>(rng() % 8);
    x = kind == 0 ? 0 : kind < 5 ? static_cast<int32_t>(rng() % 600) : static_cast<int32_t>(rng() % max_len);
  }
  return lens;
}

// ---------------------------------------------------------------- kernel vs twin

template <typename T>
std::vector<T> download(const cuda::DeviceBuffer& b, size_t n) {
  std::vector<T> out(n);
  if (n) b.download(out.data(), sizeof(T) * n);
  return out;
}

template <typename T>
bool same_bytes(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), sizeof(T) * a.size()) == 0);
}

TEST(DevicePlanGpu, KernelWritesTheHostTwinsPlan) {
  SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(2026);
  const int cases = 400;
  int split_cases = 0, planned = 0;
  for (int c = 0; c < cases; ++c) {
    SCOPED_TRACE("case " + std::to_string(c));
    const bool decode = c % 2 == 0, paged = c % 5 != 0;
    const int max_batch = 1 + static_cast<int>(rng() % 300), ctas = 1 + static_cast<int>(rng() % 264);
    const int page = paged ? std::vector<int>{1, 5, 16, 64}[rng() % 4] : 1;
    PlannerOptions opt;
    opt.split_kv = rng() % 8 != 0;
    opt.fixed_chunk = rng() % 6 == 0 ? 64 * (1 + static_cast<int>(rng() % 8)) : 0;
    opt.window_left = rng() % 4 == 0 ? static_cast<int>(rng() % 3000) : -1;
    opt.merge_cost = rng() % 2 ? 0.5 : 0.0;
    opt.unsplit_max_kv = rng() % 3 == 0 ? 1024 : 0;
    opt.unsplit_min_tiles = 1 + static_cast<int>(rng() % 132);
    opt.serpentine = !decode && rng() % 3 == 0;
    opt.chunk_align = decode ? 16 : 64;
    if (rng() % 5 == 0) opt.max_slots = 1 + static_cast<int64_t>(rng() % 64);
    const int group = decode ? 1 : std::vector<int>{1, 4, 8}[rng() % 3], cta_q = decode ? 1 : 64 * (1 + rng() % 2);
    DevicePlanParams p = device_plan_config(opt, ctas, decode ? 1.0 : cta_q);
    const int batch = static_cast<int>(rng() % (max_batch + 1));
    std::vector<int32_t> lens = random_lens(rng, batch, 9000), qo{0};
    for (int b = 0; b < batch; ++b) qo.push_back(qo.back() + static_cast<int32_t>(rng() % 40));
    Table t = paged ? make_table(lens, page, pages_needed(lens, page) + 1, rng) : Table{};
    if (!paged)
      for (int32_t x : lens) t.indptr.push_back(t.indptr.back() + x);
    p.max_batch = max_batch;
    p.max_pages = static_cast<int>(std::max<int64_t>(t.indptr.back(), 1));
    p.max_total_q = decode ? max_batch : std::max(qo.back(), 1);
    p.page_size = page;
    p.decode = decode;
    p.group = group;
    p.cta_q = cta_q;
    p.causal = static_cast<int>(rng() % 2);
    p.max_tiles = decode ? max_batch : static_cast<int>(prefill_max_tiles(p.max_total_q, max_batch, group, cta_q));
    if (p.max_tiles > kDevicePlanMaxTiles) continue;
    // Room for the plan (the host's bound for decode; the twin's count else), within one block's shared memory.
    p.max_items = 1 << 20;
    const DevicePlanInputs in{batch, decode ? std::span<const int32_t>() : std::span<const int32_t>(qo), t.indptr,
                              paged ? std::span<const int32_t>(t.last) : std::span<const int32_t>()};
    const DevicePlanResult host = plan_on_host(p, in);
    ASSERT_EQ(host.error, kPlanOk);
    p.max_items = static_cast<int>(std::max<int64_t>(decode_max_items(max_batch, ctas), host.num_items));
    size_t smem = 0;
    try {
      smem = device_plan_smem_bytes(p);
    } catch (const InvalidArgument&) {
      continue;  // bounds beyond one block
    }
    ++planned;
    split_cases += host.num_split > 0;

    IntBuffer d_batch(1), d_qo(max_batch + 1), d_kv(max_batch + 1), d_last(max_batch), d_stats(4);
    d_batch.set({batch});
    d_qo.set(qo);
    d_kv.set(t.indptr);
    d_last.set(t.last);
    cuda::DeviceBuffer d_indptr(sizeof(int32_t) * (ctas + 1)), d_first(sizeof(PrefillWorkItem) * ctas),
        d_items(sizeof(PrefillWorkItem) * p.max_items);
    DevicePlanErrors errors;
    p.batch_size = d_batch.buf.as<int>();
    p.qo_indptr = decode ? nullptr : d_qo.buf.as<int>();
    p.kv_indptr = d_kv.buf.as<int>();
    p.kv_last_page_len = paged ? d_last.buf.as<int>() : nullptr;
    p.work_indptr = d_indptr.as<int>();
    p.items = d_items.get();
    p.first_items = decode ? nullptr : d_first.as<PrefillWorkItem>();
    p.stats = d_stats.buf.as<int>();
    p.error = errors.device_ptr();
    launch_device_planner(device_planner_kernel(cuda::current_device(), smem), p, smem, nullptr);
    TESSERA_CUDA_CHECK(cudaDeviceSynchronize());
    EXPECT_NO_THROW(errors.raise_pending());
    EXPECT_EQ(download<int32_t>(d_indptr, ctas + 1), host.work_indptr);
    const auto stats = download<int32_t>(d_stats.buf, 4);
    EXPECT_EQ(stats, (std::vector<int32_t>{host.chunk_size, host.num_slots, host.num_split, host.num_items}));
    if (decode) {
      EXPECT_TRUE(same_bytes(download<DecodeWorkItem>(d_items, host.num_items), host.decode_items));
    } else {
      EXPECT_TRUE(same_bytes(download<PrefillWorkItem>(d_items, host.num_items), host.items));
      EXPECT_TRUE(same_bytes(download<PrefillWorkItem>(d_first, ctas), host.first_items));
    }
  }
  EXPECT_GT(planned, cases * 3 / 4);
  EXPECT_GT(split_cases, cases / 5);  // the cases exercise split tiles
}

// ---------------------------------------------------------------- decode

DecodeOptions decode_options(bool tensor_cores) {
  DecodeOptions opt;
  opt.use_tensor_cores = tensor_cores;
  opt.cuda_cores = !tensor_cores;
  return opt;
}

// q's leading `rows` rows run into NaN-poisoned outputs of `out_rows` rows.
Outputs run_rows(const BatchDecode& dec, const Problem& p, const DecodeCase& c, int64_t rows, int64_t out_rows,
                 cudaStream_t stream = nullptr) {
  const int64_t Hq = p.q.view.size(1);
  Outputs out{make_host(c.dt, {out_rows, Hq, c.head_dim}), make_host(DType::kFloat32, {out_rows, Hq})};
  auto d_o = poisoned_like(out.o), dlse = poisoned_like(out.lse);
  TensorView q = p.dq.view, o = d_o.view, lse = dlse.view;
  q.shape[0] = o.shape[0] = lse.shape[0] = rows;
  dec.run(q, PagedKVStorage(p.dk.view, p.dv.view, c.layout), o, lse, stream);
  TESSERA_CUDA_CHECK(cudaDeviceSynchronize());
  out.o = to_host(d_o, out.o);
  out.lse = to_host(dlse, out.lse);
  return out;
}

HostTensor leading_rows(const HostTensor& h, int64_t rows) {
  HostTensor out = make_host(h.view.dtype, [&] {
    std::vector<int64_t> s = h.view.shape;
    s[0] = rows;
    return s;
  }());
  std::memcpy(out.storage.data(), h.storage.data(), out.storage.size());
  return out;
}

class DevicePlanDecode : public ::testing::TestWithParam<bool> {};

// 500 random batches per kernel: the device plan's outputs are bitwise the
// host plan's (same chunks, same merge order), and match the reference.
TEST_P(DevicePlanDecode, BitwiseTheHostPlannedStep) {
  SKIP_WITHOUT_GPU();
  const bool tc = GetParam();
  const DecodeCase c{DType::kFloat16, 128, 4, 16, KVLayout::kNHD};
  const int64_t Hkv = 2, max_batch = 64, max_len = 6000, pool = max_batch * (max_len / 16 + 1);
  std::mt19937_64 rng(tc ? 5 : 6);
  Problem p = make_problem(c, max_batch, pool, Hkv, rng());
  const AttentionSpec spec{variants::standard(), c.dt, c.dt, c.dt, c.head_dim};
  const TaskInfo task{static_cast<int>(Hkv * c.group), static_cast<int>(Hkv), c.page_size, c.layout, max_batch, pool};
  Workspace ws = decode_workspace(spec, task, decode_options(tc));
  BatchDecode host(spec, task, ws, decode_options(tc));
  Workspace ws2 = decode_workspace(spec, task, decode_options(tc));
  BatchDecode dev(spec, task, ws2, decode_options(tc));
  StepBuffers step(max_batch, pool);
  int split = 0;
  for (int i = 0; i < 500; ++i) {
    SCOPED_TRACE("batch " + std::to_string(i));
    const int64_t batch = 1 + static_cast<int64_t>(rng() % max_batch);
    Table t = make_table(random_lens(rng, batch, max_len), c.page_size, pool, rng);
    host.plan(t.indptr, t.indices, t.last);
    const Outputs a = run_rows(host, p, c, batch, batch);
    step.set(t);
    dev.plan_on_device(step.decode());
    const Outputs b = run_rows(dev, p, c, max_batch, max_batch);
    ASSERT_TRUE(bitwise_equal(a.o, leading_rows(b.o, batch)));
    ASSERT_TRUE(bitwise_equal(a.lse, leading_rows(b.lse, batch)));
    split += (tc ? host.tensor_core_prefill()->last_plan().num_split : host.last_plan().num_split) > 0;
    if (i % 50 == 0) EXPECT_CLOSE(compare(to_doubles(a.o.view), reference_decode(p, t, c).o), c.dt);
  }
  EXPECT_GT(split, 100);  // most batches split some request
}

// One graph holds the planner and three layers; steps of 1 .. max_batch
// requests (and 0) replay it after rewriting the buffers.
TEST_P(DevicePlanDecode, OneGraphForEveryBatchSize) {
  SKIP_WITHOUT_GPU();
  const bool tc = GetParam();
  const DecodeCase c{DType::kBFloat16, 128, 4, 16, KVLayout::kHND};
  const int64_t Hkv = 2, Hq = Hkv * c.group, max_batch = 32, layers = 3, pool = max_batch * (5000 / 16 + 1);
  std::mt19937_64 rng(tc ? 7 : 8);
  const AttentionSpec spec{variants::standard(), c.dt, c.dt, c.dt, c.head_dim};
  const TaskInfo task{static_cast<int>(Hq), static_cast<int>(Hkv), c.page_size, c.layout, max_batch, pool};
  Workspace ws = decode_workspace(spec, task, decode_options(tc));
  BatchDecode dec(spec, task, ws, decode_options(tc));
  std::vector<Problem> layer;
  for (int l = 0; l < layers; ++l) layer.push_back(make_problem(c, max_batch, pool, Hkv, 300 + l));
  const HostTensor o_like = make_host(c.dt, {max_batch, Hq, c.head_dim}), lse_like = make_host(DType::kFloat32, {max_batch, Hq});
  std::vector<DeviceTensor> outs, lses;
  for (int l = 0; l < layers; ++l) {
    outs.push_back(poisoned_like(o_like));
    lses.push_back(poisoned_like(lse_like));
  }
  StepBuffers step(max_batch, pool);
  step.set(make_table({100}, c.page_size, pool, rng));
  cudaStream_t stream;
  TESSERA_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  dec.plan_on_device(step.decode(), stream);  // loads the kernels outside the capture
  TESSERA_CUDA_CHECK(cudaStreamSynchronize(stream));
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  RunOptions ro;
  ro.pdl = true;  // the first layer still waits for the planner
  TESSERA_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  dec.plan_on_device(step.decode(), stream);
  for (int l = 0; l < layers; ++l)
    dec.run(layer[l].dq.view, PagedKVStorage(layer[l].dk.view, layer[l].dv.view, c.layout), outs[l].view,
            lses[l].view, stream, ro);
  TESSERA_CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
  TESSERA_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  for (int64_t batch : {1, 17, 32, 0, 5, 29}) {
    SCOPED_TRACE("batch " + std::to_string(batch));
    std::vector<int32_t> lens = random_lens(rng, batch, 5000);
    if (batch > 2) lens[1] = 4900;  // a long request, split
    Table t = make_table(lens, c.page_size, pool, rng);
    step.set(t);
    for (auto& o : outs) o.buf.fill(0xFF);
    for (auto& lse : lses) lse.buf.fill(0xFF);
    TESSERA_CUDA_CHECK(cudaGraphLaunch(exec, stream));
    TESSERA_CUDA_CHECK(cudaStreamSynchronize(stream));
    for (int l = 0; l < layers; ++l) {
      const HostTensor o = to_host(outs[l], o_like), lse = to_host(lses[l], lse_like);
      if (batch > 0) {
        const auto ref = reference_decode(layer[l], t, c);
        EXPECT_CLOSE(compare(to_doubles(leading_rows(o, batch).view), ref.o), c.dt);
        EXPECT_CLOSE(compare(to_doubles(leading_rows(lse, batch).view), ref.lse), DType::kFloat16);
      }
      // Rows past the batch keep their poison.
      const size_t row_bytes = o.storage.size() / max_batch;
      for (size_t i = batch * row_bytes; i < o.storage.size(); ++i) ASSERT_EQ(o.storage[i], 0xFF) << "byte " << i;
    }
  }
  TESSERA_CUDA_CHECK(cudaGraphExecDestroy(exec));
  TESSERA_CUDA_CHECK(cudaGraphDestroy(graph));
  TESSERA_CUDA_CHECK(cudaStreamDestroy(stream));
}

// A bad batch size, indptr or last-page length leaves an empty plan and is
// raised by the next call, naming the argument; a good step works again.
TEST_P(DevicePlanDecode, BadDeviceInputRaisedByTheNextCall) {
  SKIP_WITHOUT_GPU();
  const bool tc = GetParam();
  const DecodeCase c{DType::kFloat16, 128, 4, 16, KVLayout::kNHD};
  const int64_t Hkv = 2, max_batch = 8, pool = 64;
  std::mt19937_64 rng(9);
  Problem p = make_problem(c, max_batch, pool, Hkv, 1);
  const AttentionSpec spec{variants::standard(), c.dt, c.dt, c.dt, c.head_dim};
  const TaskInfo task{static_cast<int>(Hkv * c.group), static_cast<int>(Hkv), c.page_size, c.layout, max_batch, pool};
  Workspace ws = decode_workspace(spec, task, decode_options(tc));
  BatchDecode dec(spec, task, ws, decode_options(tc));
  StepBuffers step(max_batch, pool);
  const Table good = make_table({30, 200, 7}, c.page_size, pool, rng);
  auto expect_raised = [&](const std::string& name) {
    dec.plan_on_device(step.decode());
    TESSERA_CUDA_CHECK(cudaDeviceSynchronize());
    EXPECT_THROW_MSG((void)run_rows(dec, p, c, max_batch, max_batch), InvalidArgument, name);
    dec.plan_on_device(step.decode());  // raised by the next plan too
    TESSERA_CUDA_CHECK(cudaDeviceSynchronize());
    EXPECT_THROW_MSG(dec.plan_on_device(step.decode()), InvalidArgument, name);
    step.set(good);
    dec.plan_on_device(step.decode());
    const Outputs o = run_rows(dec, p, c, max_batch, max_batch);
    EXPECT_CLOSE(compare(to_doubles(leading_rows(o.o, 3).view), reference_decode(p, good, c).o), c.dt);
  };
  step.set(good);
  step.batch.set({static_cast<int32_t>(max_batch) + 1});
  expect_raised("batch_size");
  step.kv.set({0, 2, 1, 3});
  expect_raised("kv_indptr");
  step.last.set({0, 8, 7});
  expect_raised("kv_last_page_len");
  step.kv.set({0, 2, 4, static_cast<int32_t>(pool) + 1});
  expect_raised("max_pages");
}

INSTANTIATE_TEST_SUITE_P(Kernels, DevicePlanDecode, ::testing::Bool(),
                         [](const auto& info) { return info.param ? "TensorCores" : "CudaCores"; });

TEST(DevicePlanDecodeExtra, ArgumentErrors) {
  SKIP_WITHOUT_GPU();
  const AttentionSpec spec;  // fp16, head_dim 128
  const TaskInfo task{8, 2, 16, KVLayout::kNHD, 4, 64};
  Workspace ws = decode_workspace(spec, task);
  BatchDecode dec(spec, task, ws);
  StepBuffers ok(4, 64), small(3, 64);
  EXPECT_THROW_MSG(dec.plan_on_device(small.decode()), InvalidArgument, "kv_indptr");
  DeviceBatch with_qo = ok.prefill();
  EXPECT_THROW_MSG(dec.plan_on_device(with_qo), InvalidArgument, "qo_indptr");
  DeviceBatch host_batch = ok.decode();
  HostTensor h = make_host(DType::kInt32, {1});
  host_batch.batch_size = h.view;
  EXPECT_THROW_MSG(dec.plan_on_device(host_batch), TypeMismatch, "batch_size");
  DeviceTensor wide = to_device(make_host(DType::kFloat32, {5}));
  DeviceBatch wide_indptr = ok.decode();
  wide_indptr.kv_indptr = wide.view;
  EXPECT_THROW_MSG(dec.plan_on_device(wide_indptr), TypeMismatch, "kv_indptr");
  TaskInfo open = task;
  open.max_batch = 0;
  Workspace ws2 = decode_workspace(spec, task);
  BatchDecode unbounded(spec, open, ws2);
  EXPECT_THROW_MSG(unbounded.plan_on_device(ok.decode()), InvalidArgument, "max_batch");
}

// ---------------------------------------------------------------- prefill

// Paged prefill on the FA2 template and the default kernel: 100 random
// batches each, device plan bitwise the host plan's, against the reference.
TEST(DevicePlanPrefill, BitwiseTheHostPlannedStep) {
  SKIP_WITHOUT_GPU();
  const DType dt = DType::kBFloat16;
  const int64_t Hkv = 2, Hq = 8, D = 128, page = 16, max_batch = 16, max_q = 1024, pool = max_batch * (3000 / 16 + 1);
  for (PrefillBackend backend : {PrefillBackend::kAuto, PrefillBackend::kFA2}) {
    SCOPED_TRACE(backend == PrefillBackend::kFA2 ? "fa2" : "auto");
    std::mt19937_64 rng(77);
    HostTensor k = make_host(dt, {pool, page, Hkv, D}), v = k, q = make_host(dt, {max_q, Hq, D});
    fill_random(k, rng());
    fill_random(v, rng());
    fill_random(q, rng(), -2.f, 2.f);
    auto dk = to_device(k), dv = to_device(v), dq = to_device(q);
    const AttentionSpec spec{variants::causal(), dt, dt, dt, D};
    TaskInfo task{static_cast<int>(Hq), static_cast<int>(Hkv), static_cast<int>(page), KVLayout::kNHD, max_batch, pool};
    task.max_total_q = max_q;
    PrefillOptions opt;
    opt.backend = backend;
    Workspace ws = prefill_workspace(spec, task, opt), ws2 = prefill_workspace(spec, task, opt);
    BatchPrefill host(spec, task, ws, opt), dev(spec, task, ws2, opt);
    StepBuffers step(max_batch, pool);
    const PagedKVStorage kv(dk.view, dv.view, KVLayout::kNHD);
    for (int i = 0; i < 100; ++i) {
      SCOPED_TRACE("batch " + std::to_string(i));
      const int64_t batch = 1 + static_cast<int64_t>(rng() % max_batch);
      std::vector<int32_t> kv_lens = random_lens(rng, batch, 3000), qo{0};
      for (int64_t b = 0; b < batch; ++b) {
        const int32_t ql = std::min<int32_t>(kv_lens[b], static_cast<int32_t>(rng() % 130));
        qo.push_back(std::min<int32_t>(qo.back() + ql, static_cast<int32_t>(max_q)));
      }
      Table t = make_table(kv_lens, static_cast<int>(page), pool, rng);
      const int64_t rows = qo.back();
      host.plan_paged(qo, t.indptr, t.indices, t.last);
      const Out a = run_and_fetch([&](const TensorView& o, const TensorView& lse) {
        TensorView qv = dq.view;
        qv.shape[0] = rows;
        host.run(qv, kv, o, lse);
      }, dt, rows, Hq, D);
      step.set(t, qo);
      dev.plan_paged_on_device(step.prefill());
      const Out b = run_and_fetch([&](const TensorView& o, const TensorView& lse) { dev.run(dq.view, kv, o, lse); }, dt,
                                  max_q, Hq, D);
      ASSERT_TRUE(bitwise_equal(a.o, leading_rows(b.o, rows)));
      ASSERT_TRUE(bitwise_equal(a.lse, leading_rows(b.lse, rows)));
      if (i % 25 == 0) {
        reference::Options ro;
        ro.causal = true;
        PagedKVCache cache(PagedKVStorage(k.view, v.view, KVLayout::kNHD),
                           PageTable(t.indptr, t.indices, t.last, static_cast<int>(page), pool));
        TensorView qv = q.view;
        qv.shape[0] = rows;
        EXPECT_CLOSE(compare(to_doubles(a.o.view), reference::attention_paged(qv, RaggedIndex(qo), cache, ro).o), dt);
      }
    }
  }
}

// Ragged prefill (kv_indptr counting tokens of one K / V) on the default
// kernel and the FA2 template: 100 random batches each, the device plan
// bitwise the host plan's, against the reference; k and v of the bound's
// rows; a step beyond max_kv_tokens and argument errors raised by name.
TEST(DevicePlanPrefill, RaggedBitwiseTheHostPlannedStep) {
  SKIP_WITHOUT_GPU();
  const DType dt = DType::kFloat16;
  const int64_t Hkv = 2, Hq = 8, D = 128, max_batch = 12, max_q = 768, max_kv = 12 * 2500;
  for (PrefillBackend backend : {PrefillBackend::kAuto, PrefillBackend::kFA2}) {
    SCOPED_TRACE(backend == PrefillBackend::kFA2 ? "fa2" : "auto");
    std::mt19937_64 rng(91);
    HostTensor k = make_host(dt, {max_kv, Hkv, D}), v = k, q = make_host(dt, {max_q, Hq, D});
    fill_random(k, rng());
    fill_random(v, rng());
    fill_random(q, rng(), -2.f, 2.f);
    auto dk = to_device(k), dv = to_device(v), dq = to_device(q);
    const AttentionSpec spec{variants::causal(), dt, dt, dt, D};
    TaskInfo task{static_cast<int>(Hq), static_cast<int>(Hkv), 1, KVLayout::kNHD, max_batch, 1};
    task.max_total_q = max_q;
    PrefillOptions opt;
    opt.backend = backend;
    opt.cta_q = 64;  // both wrappers' tile, whatever their first plans bring
    Workspace ws = prefill_workspace(spec, task, opt), ws2 = prefill_workspace(spec, task, opt);
    BatchPrefill host(spec, task, ws, opt), dev(spec, task, ws2, opt);
    StepBuffers step(max_batch, 1);
    const DeviceBatch ragged{step.batch.view(), step.qo.view(), step.kv.view(), TensorView(), TensorView()};
    for (int i = 0; i < 100; ++i) {
      SCOPED_TRACE("batch " + std::to_string(i));
      const int64_t batch = 1 + static_cast<int64_t>(rng() % max_batch);
      std::vector<int32_t> kv_lens = random_lens(rng, batch, 2500), qo{0}, kv{0};
      for (int64_t b = 0; b < batch; ++b) {
        const int32_t ql = std::min<int32_t>(kv_lens[b], static_cast<int32_t>(rng() % 100));
        qo.push_back(std::min<int32_t>(qo.back() + ql, static_cast<int32_t>(max_q)));
        kv.push_back(kv.back() + kv_lens[b]);
      }
      const int64_t rows = qo.back();
      host.plan_ragged(qo, kv);
      const Out a = run_and_fetch([&](const TensorView& o, const TensorView& lse) {
        TensorView qv = dq.view, kv_k = dk.view, kv_v = dv.view;
        qv.shape[0] = rows;
        kv_k.shape[0] = kv_v.shape[0] = kv.back();
        host.run_ragged(qv, kv_k, kv_v, o, lse);
      }, dt, rows, Hq, D);
      step.batch.set({static_cast<int32_t>(batch)});
      step.qo.set(qo);
      step.kv.set(kv);
      dev.plan_ragged_on_device(ragged, max_kv);
      const Out b = run_and_fetch([&](const TensorView& o, const TensorView& lse) {
        dev.run_ragged(dq.view, dk.view, dv.view, o, lse);
      }, dt, max_q, Hq, D);
      ASSERT_TRUE(bitwise_equal(a.o, leading_rows(b.o, rows)));
      ASSERT_TRUE(bitwise_equal(a.lse, leading_rows(b.lse, rows)));
      if (i % 25 == 0) {
        reference::Options ro;
        ro.causal = true;
        TensorView qv = q.view, kv_k = k.view, kv_v = v.view;
        qv.shape[0] = rows;
        kv_k.shape[0] = kv_v.shape[0] = kv.back();
        EXPECT_CLOSE(compare(to_doubles(a.o.view),
                             reference::attention_ragged(qv, RaggedIndex(qo), kv_k, kv_v, RaggedIndex(kv), ro).o),
                     dt);
      }
    }
    // k / v below the bound, page-table buffers with ragged KV, a zero bound.
    TensorView short_k = dk.view;
    short_k.shape[0] = max_kv - 1;
    auto out = to_device(make_host(dt, {max_q, Hq, D}));
    EXPECT_THROW_MSG(dev.run_ragged(dq.view, short_k, dv.view, out.view, TensorView()), InvalidArgument, "max_kv_tokens");
    EXPECT_THROW_MSG(dev.plan_ragged_on_device(step.prefill(), max_kv), InvalidArgument, "kv_indices");
    EXPECT_THROW_MSG(dev.plan_ragged_on_device(ragged, 0), InvalidArgument, "max_kv_tokens");
    // A step past max_kv_tokens: recorded, raised by the next run, naming the bound.
    step.kv.set({0, 10, static_cast<int32_t>(max_kv) + 1});
    step.qo.set({0, 1, 2});
    step.batch.set({2});
    dev.plan_ragged_on_device(ragged, max_kv);
    TESSERA_CUDA_CHECK(cudaDeviceSynchronize());
    EXPECT_THROW_MSG(dev.run_ragged(dq.view, dk.view, dv.view, out.view, TensorView()), InvalidArgument,
                     "max_kv_tokens");
  }
}

}  // namespace
