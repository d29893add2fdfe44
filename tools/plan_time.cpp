// `tessera plan-time`: host time of a steady-state BatchDecode::plan() for a
// serving-sized batch (issue 3's "plan() for 256 requests under 30 us"), with
// the planner alone timed on the same lengths so the rest of plan() (page
// table check, staging copy, upload) shows as the difference. Each timed plan
// starts with the GPU idle, as after a generation step. Page ids come from
// the host or stay on the GPU (api/page_ids.hpp).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include "commands.hpp"
#include "timing.hpp"
#include "tessera/tessera.hpp"

namespace tessera::tools {
namespace {


// Constant lengths, or Zipf-like skewed ones (weight 1 / rank^1.1 for a
// random rank) scaled to the given mean. Not bench/common.py's draws: the
// planner's time depends on the request count, not on the exact lengths.
std::vector<int32_t> lengths(bool zipf, int batch, int mean, unsigned seed) {
  std::vector<int32_t> lens(batch, mean);
  if (!zipf) return lens;
  std::mt19937_64 rng(seed);
  std::vector<double> w(batch);
  double sum = 0;
  for (int i = 0; i < batch; ++i) sum += (w[i] = 1.0 / std::pow(1.0 + rng() % batch, 1.1));
  for (int i = 0; i < batch; ++i) lens[i] = std::max(1, static_cast<int32_t>(w[i] / sum * mean * batch));
  return lens;
}

struct PageTable {
  std::vector<int32_t> indptr, indices, last;
};

PageTable page_table(const std::vector<int32_t>& lens, int page_size, unsigned seed) {
  PageTable t;
  t.indptr.push_back(0);
  for (int32_t n : lens) {
    const int32_t pages = (n + page_size - 1) / page_size;
    t.indptr.push_back(t.indptr.back() + pages);
    t.last.push_back(pages ? n - (pages - 1) * page_size : 0);
  }
  t.indices.resize(t.indptr.back());
  for (size_t i = 0; i < t.indices.size(); ++i) t.indices[i] = static_cast<int32_t>(i);
  std::shuffle(t.indices.begin(), t.indices.end(), std::mt19937(seed));
  return t;
}

}  // namespace

int run_plan_time(int batch, int reps) {
  if (!cuda::gpu_available()) {
    std::printf("plan-time: no GPU (%s): plan() uploads to the device\n", cuda::no_gpu_reason().c_str());
    return 1;
  }
  constexpr int kHq = 32, kHkv = 8, kHeadDim = 128;
  const int sms = cuda::device_info(cuda::current_device()).sm_count;
  std::printf("plan() host time, %d requests, %d/%d heads, fp16, head dim %d: median of %d re-plans, GPU idle\n", batch,
              kHq, kHkv, kHeadDim, reps);
  std::printf("%-10s %5s %5s %9s %6s | %10s %10s %10s\n", "lengths", "page", "path", "page ids", "ids on", "plan() us",
              "planner us", "rest us");
  cudaStream_t stream;
  TESSERA_CUDA_CHECK(cudaStreamCreate(&stream));
  for (bool zipf : {false, true})
    for (int page_size : {16, 1})
      for (bool tc : {false, true})
        for (bool device_ids : {false, true}) {
          const auto lens = lengths(zipf, batch, 1024, 7);
          const PageTable t = page_table(lens, page_size, 11);
          const AttentionSpec spec{variants::standard(), DType::kFloat16, DType::kFloat16, DType::kFloat16, kHeadDim};
          const TaskInfo task{kHq, kHkv, page_size, KVLayout::kNHD, batch, static_cast<int64_t>(t.indices.size())};
          DecodeOptions opt;
          opt.use_tensor_cores = tc;
          const auto sizes = BatchDecode::workspace_size(spec, task, sms, opt);
          Workspace ws = Workspace::allocate(sizes.device_bytes, sizes.host_bytes);
          BatchDecode dec(spec, task, ws, opt);
          // Page ids on the host (plan() checks and stages them) or kept on
          // the GPU, as serving engines keep their block tables (plan() only
          // copies them on the stream; api/page_ids.hpp).
          int32_t* ids_dev = nullptr;
          TensorView ids_view;
          if (device_ids) {
            const size_t bytes = sizeof(int32_t) * std::max<size_t>(t.indices.size(), 1);
            TESSERA_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&ids_dev), bytes));
            TESSERA_CUDA_CHECK(
                cudaMemcpy(ids_dev, t.indices.data(), sizeof(int32_t) * t.indices.size(), cudaMemcpyHostToDevice));
            ids_view = TensorView(ids_dev, DType::kInt32, Device{DeviceType::kCUDA, cuda::current_device()},
                                  {static_cast<int64_t>(t.indices.size())});
          }
          auto plan = [&] {
            if (device_ids)
              dec.plan(t.indptr, ids_view, t.last, stream);
            else
              dec.plan(t.indptr, t.indices, t.last, stream);
          };
          plan();  // the first plan loads the kernel
          std::vector<double> plan_us, planner_us;
          for (int r = 0; r < reps; ++r) {
            TESSERA_CUDA_CHECK(cudaStreamSynchronize(stream));
            plan();
            plan_us.push_back(dec.last_plan_us());
          }
          TESSERA_CUDA_CHECK(cudaStreamSynchronize(stream));
          if (ids_dev) TESSERA_CUDA_CHECK(cudaFree(ids_dev));
          // The planner alone on the same lengths and CTAs: decode's for the
          // CUDA-core path; the tensor-core path plans one-row requests as
          // prefill query tiles.
          Planner planner;
          DecodePlan dplan;
          PrefillPlan pplan;
          const std::vector<int32_t> ones(lens.size(), 1);
          const int cta_q = tc ? dec.tensor_core_prefill()->last_plan().cta_q : 0;
          for (int r = 0; r < reps; ++r) {
            const auto t0 = Clock::now();
            if (tc)
              planner.plan_prefill(ones, lens, kHq / kHkv, cta_q, false, dec.ctas_per_head(), {}, pplan);
            else
              planner.plan_decode(lens, dec.ctas_per_head(), {}, dplan);
            planner_us.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
          }
          const double p = median(plan_us), pl = median(planner_us);
          std::printf("%-10s %5d %5s %9zu %6s | %10.1f %10.1f %10.1f\n", zipf ? "zipf:1024" : "const:1024", page_size,
                      tc ? "tc" : "cc", t.indices.size(), device_ids ? "gpu" : "host", p, pl, p - pl);
        }
  TESSERA_CUDA_CHECK(cudaStreamSynchronize(stream));
  TESSERA_CUDA_CHECK(cudaStreamDestroy(stream));
  return 0;
}

}  // namespace tessera::tools
