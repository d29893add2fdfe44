// BatchPrefill's first plan: the backend, the query tile, CTA pairs and head
// groups it fixes, the kernel and grid it loads, the workspace sections it
// lays out; and the planner's options for that configuration.
#include <algorithm>

#include "checks.hpp"
#include "tessera/api/prefill.hpp"

namespace tessera {

using detail::str;

// Backend of the first plan: the Hopper (wgmma) template on sm_90 where it
// covers the head dim and query tile ("auto"), or as the user forces it.
// CTA pairs (PrefillOptions::cluster) need the Hopper kernel's 128-row tiles
// and contiguous 16-bit KV, which the TMA multicasts. Auto leaves them off
// (slower at 1k, within noise at 8k-16k in the Table-1 setting;
// docs/performance.md, Hopper prefill), so only an explicit 2 turns them on.
int BatchPrefill::choose_cluster(Source src) const {
  const bool eligible = config_.hopper && config_.cta_q == 128 && src == Source::kRagged && !is_fp8(spec_.kv_dtype);
  return eligible && opt_.cluster == 2 ? 2 : 1;
}

bool BatchPrefill::use_hopper(int cta_q) const {
  const bool sm90 = jit::Arch::of_device(ws_->device()).major == 9;
  switch (opt_.backend) {
    case PrefillBackend::kFA2: return false;
    case PrefillBackend::kFA3:
      if (!sm90) throw InvalidArgument("backend: fa3 needs an sm_90 GPU (Hopper); use fa2 or auto");
      if (!catalog::hopper_supported(spec_, cta_q))
        throw InvalidArgument("backend: fa3 needs head_dim 64, 128 or 256 (head_dim_vo equal) and a query tile of 64 "
                              "or 128 rows (64 for an fp8 cache at head_dim 256) (cta_q " + str(cta_q) + ", head_dim " +
                              str(spec_.head_dim) +
                              ", head_dim_vo " + str(spec_.vo_dim()) + "); use fa2 or auto");
      return true;
    case PrefillBackend::kAuto: return sm90 && catalog::hopper_supported(spec_, cta_q);
  }
  return false;
}

// The first plan: choose the tile, load the kernel, fix the grid and the
// workspace sections (batch and total_q: the first plan's, for the tile
// heuristic and for bounds the task leaves open).
void BatchPrefill::configure(Source src, int64_t batch, int64_t total_q, int64_t total_kv, int64_t n_indices,
                             cudaStream_t stream) {
  const int group = task_.num_qo_heads / task_.num_kv_heads;
  int cta_q = opt_.cta_q ? opt_.cta_q : catalog::choose_cta_q(batch ? double(total_q) * group / batch : 1.0);
  // On sm_90 the Hopper kernel's 64-row tiles beat the FA2 template's 16- and
  // 32-row ones even where most rows go unused: short queries are memory
  // bound, and its producer streams KV faster (H100, bench/decode_one.py:
  // decode on tensor cores 2.76 -> 3.00 TB/s for MHA, 2.00 -> 2.28 for GQA).
  if (!opt_.cta_q && opt_.backend == PrefillBackend::kAuto && cta_q < 64 && use_hopper(64)) cta_q = 64;
  const bool hopper = use_hopper(cta_q);
  config_ = catalog::prefill_config(spec_, cta_q, hopper, opt_.tile, opt_.fp8_mma,
                                    catalog::keys_kv_heads(spec_, cta_q, hopper, task_.num_qo_heads, task_.num_kv_heads));
  config_.cluster = choose_cluster(src);
  const bool group_heads = opt_.group_heads == HeadGrouping::kOn ||
                           (may_group_heads(opt_, config_) && batch > 0 && total_kv >= kGroupHeadsMinKv * batch);
  for (;;) {  // once, or twice if the CTA pairs do not fit
    source_ = catalog::batch_prefill(spec_, config_.cta_q, config_.hopper, config_.cluster, opt_.tile, opt_.fp8_mma,
                                     config_.kv_heads);
    const auto pk = detail::load_persistent(source_, ws_->device(), config_.threads, config_.smem_bytes,
                                            config_.ctas_per_sm, kernel_heads(), opt_.max_sms, "BatchPrefill::plan");
    kernel_ = pk.kernel;
    const auto g = detail::head_groups(kernel_heads(), group_heads, cuda::device_info(ws_->device()).sm_count,
                                       pk.ctas_per_sm, opt_.max_sms);
    ctas_per_group_ = g.ctas_per_group;
    head_groups_ = g.groups;
    ctas_per_sm_ = pk.ctas_per_sm;
    if (config_.cluster == 1) break;
    // A persistent grid of pairs: every pair resident at once.
    const int c = config_.cluster;
    const int fit = detail::max_active_clusters(*kernel_, config_.threads, config_.smem_bytes, c) / head_groups_;
    ctas_per_group_ = std::min(ctas_per_group_ / c, fit) * c;
    if (ctas_per_group_ >= c) break;
    config_.cluster = 1;
  }
  if (task_.max_batch == 0) task_.max_batch = std::max<int64_t>(batch, 1);
  if (task_.max_total_q == 0) task_.max_total_q = std::max<int64_t>(total_q, 1);
  if (task_.max_pages == 0) task_.max_pages = std::max<int64_t>(n_indices, 1);
  // The partial states get the rows the workspace (or shared scratch) holds.
  layout_ = layout_for(spec_, kernel_task(task_, config_.kv_heads), ctas_per_group_, head_groups_, config_.cta_q,
                       opt_.planner.fixed_chunk,
                       ws_->device_bytes(), shared_scratch_ ? &shared_scratch_bytes_ : nullptr);
  detail::check_workspace_size(*ws_, shared_scratch_ ? layout_.scratch : layout_.total, layout_.staged);
  if (custom_mask_ && opt_.trim_masked_tiles) {  // loaded here: run() allocates nothing
    trim_kernel_ = &jit::KernelCache::global().kernel(catalog::trim_masked_items(), ws_->device());
    trim_blocks_ = 4 * cuda::device_info(ws_->device()).sm_count;
  }
  // Merge counters and words start at zero; runs leave them at zero.
  TESSERA_CUDA_CHECK(cudaMemsetAsync(scratch_base() + layout_.counters, 0, layout_.partial_lse - layout_.counters, stream));
}

// The planner's options for this wrapper's kernel and sections; the plan's
// query tile and queues (a CTA pair shares one queue of 2 * cta_q-row
// tiles) and the partial-state capacities go to the out-parameters.
PlannerOptions BatchPrefill::planner_options(int& plan_cta_q, int& plan_ctas, int64_t& slot_cap,
                                             int64_t& split_cap) const {
  PlannerOptions popt = opt_.planner;
  popt.chunk_align = std::max(popt.chunk_align, config_.cta_kv);  // chunks end on KV tile boundaries
  // Charged per row, the paper's alpha made a 128-row tile's fixed cost 4096
  // keys: the greedy then balanced tile counts rather than keys, and some
  // CTAs got a fifth more keys than others (PlannerOptions::alpha).
  if (config_.hopper && config_.cta_q >= 128) popt.alpha /= kComputeBoundAlphaScale;
  popt.window_left = spec_.variant.window_left;
  popt.serpentine = popt.serpentine || (custom_mask_ && opt_.trim_masked_tiles);  // trimmed costs vary by tile
  // Short steps unsplit only where the caller asks (decode on tensor cores):
  // "enough tiles" means one on every SM the plan's CTAs occupy.
  if (popt.unsplit_max_kv < 0) popt.unsplit_max_kv = 0;
  popt.unsplit_min_tiles = std::max(1, ctas_per_group_ / config_.cluster / std::max(1, ctas_per_sm_));
  // A CTA pair shares one work queue of 2 * cta_q-row tiles (its sections
  // fit the same workspace: half the queues, each slot twice the rows).
  plan_cta_q = config_.cta_q * config_.cluster;
  plan_ctas = ctas_per_group_ / config_.cluster;
  // What the sections hold (a workspace below workspace_size() has fewer
  // partial rows): the planner splits less to fit. A pair's counters are
  // cluster entries per split tile.
  slot_cap = layout_.max_slot_rows / plan_cta_q;
  split_cap = layout_.max_split_tiles / config_.cluster;
  popt.max_slots = popt.max_slots > 0 ? std::min(popt.max_slots, slot_cap) : slot_cap;
  popt.max_split_tiles = popt.max_split_tiles > 0 ? std::min(popt.max_split_tiles, split_cap) : split_cap;
  if (slot_cap == 0 && popt.fixed_chunk <= 0) popt.split_kv = false;  // no partial rows (a cap of 0 means none)
  return popt;
}

}  // namespace tessera
