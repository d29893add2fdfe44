// `tessera device-plan`: a decode step of a stack of attention layers
// (Llama-3.1-8B shape: 32 query / 8 KV heads, head dim 128, fp16, page 16)
// planned on the GPU inside one CUDA graph for every batch size, against
// the same step planned on the host with a graph captured for its exact
// batch size. Steps alternate between the two paths in one process; each
// step's outputs of the first and last layer must be bitwise equal.
//
// Per step both paths copy the step's page ids to the GPU; the host path
// then runs plan() (host lengths, the ids on the GPU) and launches its
// graph, the device path copies the lengths and launches its one graph.
// Reported per phase: GPU time of the step (events around all of its
// stream work), wall time of the step with its synchronization (what an
// engine that samples each step waits), the host time of the calls, and
// the host path's graph alone as a share of its step (the ratio a device
// planner of zero cost would reach); then the planner's GPU time, and the
// graph launch's host time beside a one-node graph's after the same step.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <map>
#include <random>
#include <utility>
#include <vector>

#include "commands.hpp"
#include "timing.hpp"
#include "tessera/runtime/device_buffer.hpp"
#include "tessera/tessera.hpp"

namespace tessera::tools {
namespace {

constexpr int kHq = 32, kHkv = 8, kD = 128, kPage = 16;

struct Step {
  int batch;
  std::vector<int32_t> indptr, last, ids;
};

// batch requests of 1 .. max_len keys, pages from a shuffled pool.
Step make_step(std::mt19937_64& rng, int batch, int max_len, const std::vector<int32_t>& pool) {
  Step s{batch, {0}, {}, {}};
  size_t next = rng() % pool.size();
  for (int b = 0; b < batch; ++b) {
    const int len = 1 + static_cast<int>(rng() % max_len), pages = (len + kPage - 1) / kPage;
    for (int p = 0; p < pages; ++p) s.ids.push_back(pool[next++ % pool.size()]);
    s.indptr.push_back(static_cast<int32_t>(s.ids.size()));
    s.last.push_back(len - (pages - 1) * kPage);
  }
  return s;
}

// Device memory filled with a repeating block of random fp16 values in [-1, 1).
cuda::DeviceBuffer random_fp16(size_t bytes, std::vector<uint16_t>& pattern) {
  cuda::DeviceBuffer b(bytes);
  const size_t block = pattern.size() * sizeof(uint16_t);
  for (size_t at = 0; at < bytes; at += block)
    TESSERA_CUDA_CHECK(cudaMemcpy(static_cast<char*>(b.get()) + at, pattern.data(), std::min(block, bytes - at),
                                  cudaMemcpyHostToDevice));
  std::rotate(pattern.begin(), pattern.begin() + 7919, pattern.end());  // the next buffer differs
  return b;
}

struct Timing {
  std::vector<double> gpu_host, gpu_dev, wall_host, wall_dev, ratio_gpu, ratio_wall, launch_dev, calls_dev, calls_host,
      plan_host, bound;
};

}  // namespace

int run_device_plan(const DevicePlanOptions& o) {
  if (!cuda::gpu_available()) {
    std::printf("device-plan: no GPU (%s)\n", cuda::no_gpu_reason().c_str());
    return 1;
  }
  const Device gpu{DeviceType::kCUDA, cuda::current_device()};
  const int sms = cuda::device_info(gpu.index).sm_count;
  const int max_batch = o.max_batch, pages_per_req = (o.max_len + kPage - 1) / kPage;
  const int64_t pool_pages = int64_t{max_batch} * pages_per_req;
  std::mt19937_64 rng(o.seed);
  std::vector<uint16_t> pattern(1 << 22);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  for (auto& x : pattern) x = float_to_half(u(rng));

  // One KV pool read by every layer (larger than L2 at these lengths), per-layer q and outputs.
  const size_t kv_bytes = sizeof(uint16_t) * pool_pages * kPage * kHkv * kD;
  cuda::DeviceBuffer k = random_fp16(kv_bytes, pattern), v = random_fp16(kv_bytes, pattern);
  const TensorView kv_k(k.get(), DType::kFloat16, gpu, {pool_pages, kPage, kHkv, kD});
  const TensorView kv_v(v.get(), DType::kFloat16, gpu, {pool_pages, kPage, kHkv, kD});
  const PagedKVStorage kv(kv_k, kv_v, KVLayout::kNHD);
  const size_t row_bytes = sizeof(uint16_t) * kHq * kD;
  std::vector<cuda::DeviceBuffer> q, o_host, o_dev;
  for (int l = 0; l < o.layers; ++l) {
    q.push_back(random_fp16(row_bytes * max_batch, pattern));
    o_host.emplace_back(row_bytes * max_batch);
    o_dev.emplace_back(row_bytes * max_batch);
  }
  auto rows = [&](const cuda::DeviceBuffer& b, int64_t n) {
    return TensorView(b.get(), DType::kFloat16, gpu, {n, kHq, kD});
  };

  const AttentionSpec spec{variants::standard(), DType::kFloat16, DType::kFloat16, DType::kFloat16, kD};
  const TaskInfo task{kHq, kHkv, kPage, KVLayout::kNHD, max_batch, pool_pages};
  DecodeOptions opt;
  opt.cuda_cores = o.cuda_cores;
  const auto sizes = BatchDecode::workspace_size(spec, task, sms, opt);
  Workspace ws_host = Workspace::allocate(sizes.device_bytes, sizes.host_bytes);
  Workspace ws_dev = Workspace::allocate(sizes.device_bytes, sizes.host_bytes);
  BatchDecode host(spec, task, ws_host, opt), dev(spec, task, ws_dev, opt);

  // The step's inputs: lengths [batch | kv_indptr | last] and page ids, pinned on the host and on the GPU.
  const int64_t meta_n = 1 + (max_batch + 1) + max_batch;
  int32_t *meta_h = nullptr, *ids_h = nullptr;
  TESSERA_CUDA_CHECK(cudaHostAlloc(reinterpret_cast<void**>(&meta_h), sizeof(int32_t) * meta_n, cudaHostAllocDefault));
  TESSERA_CUDA_CHECK(cudaHostAlloc(reinterpret_cast<void**>(&ids_h), sizeof(int32_t) * pool_pages, cudaHostAllocDefault));
  cuda::DeviceBuffer meta_d(sizeof(int32_t) * meta_n), ids_d(sizeof(int32_t) * pool_pages);
  int32_t* md = meta_d.as<int32_t>();
  const DeviceBatch inputs{TensorView(md, DType::kInt32, gpu, {1}), TensorView(),
                           TensorView(md + 1, DType::kInt32, gpu, {max_batch + 1}),
                           TensorView(ids_d.get(), DType::kInt32, gpu, {pool_pages}),
                           TensorView(md + 2 + max_batch, DType::kInt32, gpu, {max_batch})};
  auto stage = [&](const Step& s) {
    meta_h[0] = s.batch;
    std::memcpy(meta_h + 1, s.indptr.data(), sizeof(int32_t) * s.indptr.size());
    std::memcpy(meta_h + 2 + max_batch, s.last.data(), sizeof(int32_t) * s.last.size());
    std::memcpy(ids_h, s.ids.data(), sizeof(int32_t) * s.ids.size());
  };

  std::vector<int32_t> pool(pool_pages);
  for (int64_t i = 0; i < pool_pages; ++i) pool[i] = static_cast<int32_t>(i);
  std::shuffle(pool.begin(), pool.end(), rng);

  cudaStream_t stream;
  TESSERA_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cudaEvent_t e0, e1;
  TESSERA_CUDA_CHECK(cudaEventCreate(&e0));
  TESSERA_CUDA_CHECK(cudaEventCreate(&e1));
  RunOptions ro;
  ro.pdl = true;
  auto capture = [&](auto&& body) {
    cudaGraph_t g;
    cudaGraphExec_t exec;
    TESSERA_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    body();
    TESSERA_CUDA_CHECK(cudaStreamEndCapture(stream, &g));
    TESSERA_CUDA_CHECK(cudaGraphInstantiate(&exec, g, 0));
    TESSERA_CUDA_CHECK(cudaGraphDestroy(g));
    return exec;
  };

  // The device path's one graph: planner + every layer at max_batch rows.
  const Step warm = make_step(rng, 1, 64, pool);
  stage(warm);
  TESSERA_CUDA_CHECK(cudaMemcpy(md, meta_h, sizeof(int32_t) * meta_n, cudaMemcpyHostToDevice));
  TESSERA_CUDA_CHECK(cudaMemcpy(ids_d.get(), ids_h, sizeof(int32_t) * warm.ids.size(), cudaMemcpyHostToDevice));
  dev.plan_on_device(inputs, stream);  // loads the kernels outside the capture
  TESSERA_CUDA_CHECK(cudaStreamSynchronize(stream));
  cudaGraphExec_t dev_graph = capture([&] {
    dev.plan_on_device(inputs, stream);
    for (int l = 0; l < o.layers; ++l) dev.run(rows(q[l], max_batch), kv, rows(o_dev[l], max_batch), TensorView(), stream, ro);
  });
  // The host path: a graph per batch size, captured at its first step (after that step's plan).
  std::map<int, cudaGraphExec_t> host_graphs;
  const TensorView ids_view(ids_d.get(), DType::kInt32, gpu, {pool_pages});

  struct Phase {
    const char* name;
    int min_batch, max_batch, max_len;
  };
  const Phase phases[] = {{"serving", 1, max_batch, o.max_len}, {"small", 1, std::min(16, max_batch), 1024}};
  int mismatches = 0;
  std::printf("decode step, %d attention layers, %d/%d heads, head dim %d, fp16, page %d, %s; %d steps per phase\n",
              o.layers, kHq, kHkv, kD, kPage, o.cuda_cores ? "CUDA cores" : "the wrapper's kernel", o.steps);
  for (const Phase& ph : phases) {
    Timing t;
    for (int i = 0; i < o.steps; ++i) {
      const int batch = ph.min_batch + static_cast<int>(rng() % (ph.max_batch - ph.min_batch + 1));
      const Step s = make_step(rng, batch, ph.max_len, pool);
      stage(s);
      const size_t ids_bytes = sizeof(int32_t) * s.ids.size();
      if (!host_graphs.count(batch)) {  // capture outside the timed steps
        host.plan(s.indptr, TensorView(ids_d.get(), DType::kInt32, gpu, {pool_pages}), s.last, stream);
        host_graphs[batch] = capture([&] {
          for (int l = 0; l < o.layers; ++l) host.run(rows(q[l], batch), kv, rows(o_host[l], batch), TensorView(), stream, ro);
        });
      }
      double gpu_ms[2], wall[2];
      for (int k = 0; k < 2; ++k) {
        const bool device_path = (k == 0) == (i % 2 == 0);  // alternate which path goes first
        TESSERA_CUDA_CHECK(cudaStreamSynchronize(stream));
        const auto t0 = Clock::now();
        TESSERA_CUDA_CHECK(cudaEventRecord(e0, stream));
        if (device_path) {
          TESSERA_CUDA_CHECK(cudaMemcpyAsync(md, meta_h, sizeof(int32_t) * meta_n, cudaMemcpyHostToDevice, stream));
          TESSERA_CUDA_CHECK(cudaMemcpyAsync(ids_d.get(), ids_h, ids_bytes, cudaMemcpyHostToDevice, stream));
          const auto t1 = Clock::now();
          TESSERA_CUDA_CHECK(cudaGraphLaunch(dev_graph, stream));
          const auto t2 = Clock::now();
          t.launch_dev.push_back(us_since(t1, t2));
          t.calls_dev.push_back(us_since(t0, t2));
        } else {
          TESSERA_CUDA_CHECK(cudaMemcpyAsync(ids_d.get(), ids_h, ids_bytes, cudaMemcpyHostToDevice, stream));
          host.plan(s.indptr, ids_view, s.last, stream);
          TESSERA_CUDA_CHECK(cudaGraphLaunch(host_graphs[batch], stream));
          t.calls_host.push_back(us_since(t0, Clock::now()));
          t.plan_host.push_back(host.last_plan_us());
        }
        TESSERA_CUDA_CHECK(cudaEventRecord(e1, stream));
        TESSERA_CUDA_CHECK(cudaStreamSynchronize(stream));
        wall[device_path] = us_since(t0, Clock::now());
        float ms = 0;
        TESSERA_CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
        gpu_ms[device_path] = ms * 1e3;
      }
      t.gpu_host.push_back(gpu_ms[0]);
      t.gpu_dev.push_back(gpu_ms[1]);
      t.wall_host.push_back(wall[0]);
      t.wall_dev.push_back(wall[1]);
      t.ratio_gpu.push_back(gpu_ms[1] / gpu_ms[0]);
      t.ratio_wall.push_back(wall[1] / wall[0]);
      // The host path's graph alone (its plan and copies done): no device
      // planner, however fast, makes the step cheaper than these layers.
      TESSERA_CUDA_CHECK(cudaEventRecord(e0, stream));
      TESSERA_CUDA_CHECK(cudaGraphLaunch(host_graphs[batch], stream));
      TESSERA_CUDA_CHECK(cudaEventRecord(e1, stream));
      TESSERA_CUDA_CHECK(cudaStreamSynchronize(stream));
      float graph_ms = 0;
      TESSERA_CUDA_CHECK(cudaEventElapsedTime(&graph_ms, e0, e1));
      t.bound.push_back(graph_ms * 1e3 / gpu_ms[0]);
      // The same bits from both plans (first and last layer).
      for (int l : {0, o.layers - 1}) {
        std::vector<char> a(row_bytes * batch), b(row_bytes * batch);
        o_host[l].download(a.data(), a.size());
        o_dev[l].download(b.data(), b.size());
        mismatches += a != b;
      }
    }
    std::printf("%-8s batch %d-%d, keys 1-%d: GPU step us host-planned %.1f, device-planned %.1f (ratio %.3f); "
                "wall with sync %.1f / %.1f (ratio %.3f); host us: graph launch %.1f, device path calls %.1f, "
                "host path calls %.1f (plan() %.1f); the host path's graph alone over its step (the best ratio a "
                "device planner of zero cost could reach) %.3f\n",
                ph.name, ph.min_batch, ph.max_batch, ph.max_len, median(t.gpu_host), median(t.gpu_dev),
                median(t.ratio_gpu), median(t.wall_host), median(t.wall_dev), median(t.ratio_wall),
                median(t.launch_dev), median(t.calls_dev), median(t.calls_host), median(t.plan_host),
                median(t.bound));
  }
  // The planner alone for small batches and a full one: GPU time per planner
  // of a graph of 20 planners back to back (no launch gaps), events around it.
  for (int batch : {4, 8, 16, max_batch}) {
    const Step s = make_step(rng, batch, batch == max_batch ? o.max_len : 1024, pool);
    stage(s);
    TESSERA_CUDA_CHECK(cudaMemcpy(md, meta_h, sizeof(int32_t) * meta_n, cudaMemcpyHostToDevice));
    TESSERA_CUDA_CHECK(cudaMemcpy(ids_d.get(), ids_h, sizeof(int32_t) * s.ids.size(), cudaMemcpyHostToDevice));
    constexpr int kPlanners = 20;
    cudaGraphExec_t planners = capture([&] {
      for (int r = 0; r < kPlanners; ++r) dev.plan_on_device(inputs, stream);
    });
    std::vector<double> planner;
    for (int r = 0; r < 20; ++r) {
      TESSERA_CUDA_CHECK(cudaEventRecord(e0, stream));
      TESSERA_CUDA_CHECK(cudaGraphLaunch(planners, stream));
      TESSERA_CUDA_CHECK(cudaEventRecord(e1, stream));
      TESSERA_CUDA_CHECK(cudaStreamSynchronize(stream));
      float ms = 0;
      TESSERA_CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
      planner.push_back(ms * 1e3 / kPlanners);
    }
    TESSERA_CUDA_CHECK(cudaGraphExecDestroy(planners));
    std::printf("planner kernel alone, batch %d: %.1f us GPU time (graph of %d, median of 20)\n", batch,
                median(planner), kPlanners);
  }
  // The graph launch alone, the step's inputs already on the GPU (as an
  // engine that updates its block table there), after the GPU finished a
  // step of this batch (synchronized): beside it, under the same conditions,
  // a one-node graph (a 4-byte memset), the least any graph launch costs
  // then. A launch right after a long GPU task costs more whatever the graph
  // holds, so both are reported after a short and a long step.
  const cuda::DeviceBuffer scratch(sizeof(int32_t));
  const cudaGraphExec_t one_node = capture([&] { TESSERA_CUDA_CHECK(cudaMemsetAsync(scratch.get(), 0, 4, stream)); });
  for (const auto [batch, len] : {std::pair{8, 1024}, std::pair{max_batch, o.max_len}}) {
    const Step s = make_step(rng, batch, len, pool);
    stage(s);
    TESSERA_CUDA_CHECK(cudaMemcpy(md, meta_h, sizeof(int32_t) * meta_n, cudaMemcpyHostToDevice));
    TESSERA_CUDA_CHECK(cudaMemcpy(ids_d.get(), ids_h, sizeof(int32_t) * s.ids.size(), cudaMemcpyHostToDevice));
    std::vector<double> ours, baseline, step_us;
    for (int r = 0; r < 40; ++r) {
      const cudaGraphExec_t timed = r % 2 ? one_node : dev_graph;
      TESSERA_CUDA_CHECK(cudaEventRecord(e0, stream));
      TESSERA_CUDA_CHECK(cudaGraphLaunch(dev_graph, stream));  // the step before
      TESSERA_CUDA_CHECK(cudaEventRecord(e1, stream));
      TESSERA_CUDA_CHECK(cudaStreamSynchronize(stream));
      float ms = 0;
      TESSERA_CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
      step_us.push_back(ms * 1e3);
      const auto t0 = Clock::now();
      TESSERA_CUDA_CHECK(cudaGraphLaunch(timed, stream));
      (r % 2 ? baseline : ours).push_back(us_since(t0, Clock::now()));
      TESSERA_CUDA_CHECK(cudaStreamSynchronize(stream));
    }
    std::printf("graph launch after a %.0f us step (batch %d, keys 1-%d), inputs on the GPU: %.1f us host time; a "
                "one-node graph there: %.1f us (medians of 20)\n",
                median(step_us), batch, len, median(ours), median(baseline));
  }
  TESSERA_CUDA_CHECK(cudaGraphExecDestroy(one_node));
  std::printf("outputs bitwise equal: %s (%d mismatching layer outputs), %zu host graphs\n",
              mismatches ? "NO" : "yes", mismatches, host_graphs.size());
  for (auto& [b, g] : host_graphs) TESSERA_CUDA_CHECK(cudaGraphExecDestroy(g));
  TESSERA_CUDA_CHECK(cudaGraphExecDestroy(dev_graph));
  TESSERA_CUDA_CHECK(cudaEventDestroy(e0));
  TESSERA_CUDA_CHECK(cudaEventDestroy(e1));
  TESSERA_CUDA_CHECK(cudaStreamDestroy(stream));
  TESSERA_CUDA_CHECK(cudaFreeHost(meta_h));
  TESSERA_CUDA_CHECK(cudaFreeHost(ids_h));
  return mismatches ? 1 : 0;
}

}  // namespace tessera::tools
