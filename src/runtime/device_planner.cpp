#include "tessera/runtime/device_planner.hpp"

#include <algorithm>
#include <cmath>

#include "tessera/core/error.hpp"
#include "tessera/device/kernels/plan/schedule.cuh"
#include "tessera/device/kernels/plan/tables.cuh"
#include "tessera/runtime/jit.hpp"
#include "tessera/runtime/kernel_catalog.hpp"

namespace tessera {

namespace {

int64_t sixteenths(double x) { return static_cast<int64_t>(std::max(x, 0.0) * 16.0 + 0.5); }

}  // namespace

DevicePlanParams device_plan_config(const PlannerOptions& opt, int ctas, double tile_rows) {
  if (ctas < 1) throw InvalidArgument("ctas: expected >= 1, got " + std::to_string(ctas));
  if (opt.fixed_chunk < 0) throw InvalidArgument("fixed_chunk: expected >= 0, got " + std::to_string(opt.fixed_chunk));
  DevicePlanParams p{};
  p.ctas = ctas;
  p.split_kv = opt.split_kv ? 1 : 0;
  p.fixed_chunk = opt.fixed_chunk;
  p.min_chunk = opt.min_chunk;
  p.chunk_align = std::max(1, opt.chunk_align);
  p.window_left = opt.window_left;
  p.unsplit_max_kv = opt.unsplit_max_kv;
  p.unsplit_min_tiles = opt.unsplit_min_tiles;
  p.serpentine = opt.serpentine ? 1 : 0;
  p.item_cost = sixteenths(opt.alpha * tile_rows);
  p.token_cost = sixteenths(opt.beta);
  p.merge_cost = sixteenths(opt.merge_cost);
  p.max_slots = opt.max_slots;
  p.max_split_tiles = opt.max_split_tiles;
  return p;
}

size_t device_plan_smem_bytes(const DevicePlanParams& p) {
  if (p.ctas > 1024)  // warp 0 holds every CTA's entry in registers (plan/assign.cuh)
    throw InvalidArgument("ctas: device planning assigns at most 1024 CTAs per head group, got " + std::to_string(p.ctas));
  if (p.decode && p.max_tiles < p.max_batch)
    throw InvalidArgument("max_tiles: decode plans a tile per request; expected at least max_batch (" +
                          std::to_string(p.max_batch) + "), got " + std::to_string(p.max_tiles));
  if (p.max_tiles > kDevicePlanMaxTiles)
    throw InvalidArgument("max_batch: device planning holds at most " + std::to_string(kDevicePlanMaxTiles) +
                          " query tiles per step (its tables live in one block's shared memory), the bounds give " +
                          std::to_string(p.max_tiles));
  const u64 bytes = plan::tables_layout(p.max_tiles, p.max_batch, p.ctas, p.max_items).bytes;
  constexpr u64 kLimit = 227 * 1024;  // one block's shared memory on sm_90 (sm_80: 163 KB, checked at the launch)
  if (bytes > kLimit)
    throw InvalidArgument("max_batch: device planning needs " + std::to_string(bytes) + " bytes of shared memory for " +
                          std::to_string(p.max_tiles) + " query tiles and " + std::to_string(p.max_items) +
                          " work items (the bounds), more than one block holds; expected smaller bounds");
  return bytes;
}

namespace {

// PlannerOptions whose rounding gives back p's integer costs exactly.
PlannerOptions planner_options_of(const DevicePlanParams& p, double tile_rows) {
  PlannerOptions opt;
  opt.split_kv = p.split_kv != 0;
  opt.alpha = static_cast<double>(p.item_cost) / (16.0 * tile_rows);
  opt.beta = static_cast<double>(p.token_cost) / 16.0;
  opt.merge_cost = static_cast<double>(p.merge_cost) / 16.0;
  opt.min_chunk = p.min_chunk;
  opt.chunk_align = p.chunk_align;
  opt.window_left = p.window_left;
  opt.serpentine = p.serpentine != 0;
  opt.unsplit_max_kv = p.unsplit_max_kv;
  opt.unsplit_min_tiles = p.unsplit_min_tiles;
  opt.fixed_chunk = p.fixed_chunk;
  opt.max_slots = p.max_slots;
  opt.max_split_tiles = p.max_split_tiles;
  return opt;
}

}  // namespace

DevicePlanResult plan_on_host(const DevicePlanParams& p, const DevicePlanInputs& in) {
  DevicePlanResult r;
  r.work_indptr.assign(p.ctas + 1, 0);
  if (!p.decode) r.first_items.assign(p.ctas, PrefillWorkItem{});
  const bool paged = !in.kv_last_page_len.empty(), one_query = in.qo_indptr.empty();
  auto fail = [&r](int code, int request, int value) {
    if (r.error != kPlanOk) return;
    r.error = code;
    r.error_request = request;
    r.error_value = value;
  };
  int batch = in.batch;
  if (batch < 0 || batch > p.max_batch) {
    fail(kPlanBatchSize, -1, batch);
    batch = 0;
  }
  auto kv_len = [&](int b) {
    return plan::kv_length(in.kv_indptr[b], in.kv_indptr[b + 1], paged ? in.kv_last_page_len[b] : 0, p.page_size, paged);
  };
  auto qo_len = [&](int b) { return one_query ? 1 : in.qo_indptr[b + 1] - in.qo_indptr[b]; };
  bool bad = false;
  for (int b = 0; b < batch; ++b) {
    const int k0 = in.kv_indptr[b], k1 = in.kv_indptr[b + 1];
    if ((b == 0 && k0 != 0) || k1 < k0) {
      fail(kPlanKvIndptr, b, b == 0 && k0 != 0 ? k0 : k1);
      bad = true;
    } else if (paged && k1 > k0 && (in.kv_last_page_len[b] < 1 || in.kv_last_page_len[b] > p.page_size)) {
      fail(kPlanLastPageLen, b, in.kv_last_page_len[b]);
      bad = true;
    }
    if (!one_query && ((b == 0 && in.qo_indptr[0] != 0) || in.qo_indptr[b + 1] < in.qo_indptr[b])) {
      fail(kPlanQoIndptr, b, b == 0 && in.qo_indptr[0] != 0 ? in.qo_indptr[0] : in.qo_indptr[b + 1]);
      bad = true;
    }
  }
  if (batch > 0 && in.kv_indptr[batch] > p.max_pages) {
    fail(kPlanMaxPages, batch, in.kv_indptr[batch]);
    bad = true;
  }
  if (batch > 0 && !one_query && in.qo_indptr[batch] > p.max_total_q) {
    fail(kPlanMaxTotalQ, batch, in.qo_indptr[batch]);
    bad = true;
  }
  if (bad) batch = 0;
  std::vector<int32_t> qo_lens(batch), kv_lens(batch);
  int64_t tiles = 0;
  for (int b = 0; b < batch; ++b) {
    qo_lens[b] = qo_len(b);
    kv_lens[b] = kv_len(b);
    tiles += p.decode ? 1 : (int64_t{qo_lens[b]} * p.group + p.cta_q - 1) / p.cta_q;
  }
  if (tiles > p.max_tiles) {
    fail(kPlanMaxTiles, -1, p.max_tiles);
    qo_lens.clear();
    kv_lens.clear();
  }

  // The host planner's plan (the kernel computes the same one).
  Planner planner;
  PlanStats* stats = nullptr;
  if (p.decode) {
    DecodePlan plan;
    planner.plan_decode(kv_lens, p.ctas, planner_options_of(p, 1.0), plan);
    r.decode_items = std::move(plan.items);
    r.num_items = static_cast<int32_t>(r.decode_items.size());
    static_cast<PlanStats&>(r.plan) = plan;
  } else {
    PrefillPlan plan;
    planner.plan_prefill(qo_lens, kv_lens, p.group, p.cta_q, p.causal != 0, p.ctas, planner_options_of(p, p.cta_q), plan);
    r.items = std::move(plan.items);
    for (PrefillWorkItem& w : r.items) {
      const int b = w.request;
      w.qo_begin = one_query ? b : in.qo_indptr[b];
      w.qo_len = qo_lens[b];
      w.kv_begin = in.kv_indptr[b];
      w.kv_len = kv_lens[b];
    }
    r.num_items = static_cast<int32_t>(r.items.size());
    static_cast<PlanStats&>(r.plan) = plan;
  }
  stats = &r.plan;
  r.chunk_size = stats->chunk_size;
  if (r.num_items > p.max_items) {  // an empty plan, as the kernel leaves it
    fail(kPlanMaxItems, -1, r.num_items);
    r.decode_items.clear();
    r.items.clear();
    r.num_items = 0;
    return r;
  }
  r.work_indptr = stats->work_indptr;
  for (int x = 0; x < p.ctas && !p.decode; ++x)
    if (r.work_indptr[x] < r.work_indptr[x + 1]) r.first_items[x] = r.items[r.work_indptr[x]];
  r.num_slots = stats->num_slots;
  r.num_split = stats->num_split;
  return r;
}

std::string device_plan_error_message(int code, int request, int value) {
  const std::string at = " (request " + std::to_string(request) + ", got " + std::to_string(value) + ")";
  switch (code) {
    case kPlanBatchSize: return "batch_size: expected a value in [0, max_batch], got " + std::to_string(value);
    case kPlanKvIndptr: return "kv_indptr: expected kv_indptr[0] == 0 and non-decreasing entries" + at;
    case kPlanMaxPages: return "kv_indptr: expected kv_indptr[batch] <= the plan's bound (max_pages; ragged KV: max_kv_tokens)" + at;
    case kPlanLastPageLen: return "kv_last_page_len: expected values in [1, page_size] for non-empty requests" + at;
    case kPlanQoIndptr: return "qo_indptr: expected qo_indptr[0] == 0 and non-decreasing entries" + at;
    case kPlanMaxTotalQ: return "qo_indptr: expected qo_indptr[batch] <= the workspace bound max_total_q" + at;
    case kPlanMaxTiles:
      return "qo_indptr: expected at most " + std::to_string(value) + " query tiles (the workspace's bound)";
    case kPlanLevelRows:
      return "qo_indptr: expected qo_indptr[batch] to equal level 0's (every cascade level covers the step's query "
             "rows)" + at;
    case kPlanMaxItems:
      return "kv_indptr: " + std::to_string(value) + " work items exceed the workspace (fixed_chunk splits the batch's "
             "keys into more chunks than its bound holds)";
    default: return "device plan: unknown error code " + std::to_string(code);
  }
}

const jit::LoadedKernel& device_planner_kernel(int device, size_t smem_bytes) {
  const jit::LoadedKernel& k = jit::KernelCache::global().kernel(catalog::device_planner(), device);
  k.set_max_dynamic_smem(static_cast<int>(smem_bytes));
  return k;
}

void launch_device_planner(const jit::LoadedKernel& kernel, const DevicePlanParams& p, size_t smem_bytes,
                           cudaStream_t stream) {
  DevicePlanParams copy = p;
  kernel.launch(dim3(1), dim3(kDevicePlanThreads), smem_bytes, stream, &copy, false);
}

}  // namespace tessera
