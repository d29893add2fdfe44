// BatchPrefill's workspace: the sections a first plan lays out, and the
// sizes the static functions report (the ideal, the minimum, and the parts a
// shared split-KV scratch takes).
#include <algorithm>

#include "checks.hpp"
#include "prefill_candidates.hpp"
#include "shared_prefix_level.hpp"
#include "tessera/api/prefill.hpp"

namespace tessera {

using detail::str;

// Sections for a grid of ctas_per_group x groups CTAs: each group's plan
// covers its num_kv_heads / groups heads of every request (the tiles and
// items scale by that), its split tiles' counters and partial states are
// kept per group.
BatchPrefill::Layout BatchPrefill::layout_for(const AttentionSpec& spec, const TaskInfo& task, int ctas_per_group,
                                              int groups, int cta_q, int fixed_chunk, size_t device_bytes,
                                              const size_t* shared_scratch) {
  const int group = task.num_qo_heads / task.num_kv_heads;
  const int64_t heads_per_group = task.num_kv_heads / groups;
  const int64_t tiles = prefill_max_tiles(task.max_total_q * heads_per_group, task.max_batch * heads_per_group, group, cta_q);
  // Fixed chunks (PlannerOptions::fixed_chunk): room for max_fixed_chunks
  // pieces per KV head, else for the chunks of one query tile per request
  // over every key; plan() checks each batch against it.
  const int64_t fixed = fixed_chunk <= 0 ? 0
                        : task.max_fixed_chunks > 0
                            ? task.max_fixed_chunks * heads_per_group
                            : fixed_chunk_bound(task.max_pages * task.page_size * heads_per_group, tiles, fixed_chunk);
  const int64_t max_items = std::max(prefill_max_items(tiles, ctas_per_group), fixed);
  Layout l;
  l.max_items = max_items;
  WorkspaceLayout w;
  l.qo_indptr = w.add(sizeof(int32_t) * (task.max_batch + 1));
  l.kv_indptr = w.add(sizeof(int32_t) * (task.max_batch + 1));
  l.last = w.add(sizeof(int32_t) * task.max_batch);
  if (spec.variant.custom_mask) l.mask_indptr = w.add(sizeof(int32_t) * (task.max_batch + 1));
  l.work_indptr = w.add(sizeof(int32_t) * (ctas_per_group + 1));
  l.items = w.add(sizeof(PrefillWorkItem) * max_items);
  l.first_items = w.add(sizeof(PrefillWorkItem) * ctas_per_group);
  // Last, so a plan uploads only the ids it has (and none when they stay on the GPU).
  l.indices = w.add(sizeof(int32_t) * std::max<int64_t>(task.max_pages, 1));
  l.staged = w.total();
  if (spec.variant.custom_mask) {  // written on the GPU by each run
    l.trimmed_items = w.add(sizeof(PrefillWorkItem) * max_items);
    l.trimmed_first = w.add(sizeof(PrefillWorkItem) * ctas_per_group);
  }
  l.scratch = w.add(0);  // the split-KV scratch: the workspace's tail (or a shared region)

  // Split-KV scratch, relative to its own base: counters, then the partial
  // states of slot_rows rows per group (whole query tiles).
  l.max_split_tiles = std::max(max_split_tiles(ctas_per_group), std::min(fixed, tiles));
  l.ideal_slot_rows = std::max(max_split_slots(ctas_per_group) * cta_q, fixed * cta_q);
  auto lay_out = [&](int64_t slot_rows) {
    WorkspaceLayout s;
    l.max_slot_rows = slot_rows;
    l.counters = s.add(sizeof(int32_t) * l.max_split_tiles * groups);
    l.merge_words = s.add(sizeof(uint64_t) * l.max_split_tiles * groups);  // zeroed with the counters
    const int64_t rows = slot_rows * groups;
    l.partial_lse = s.add(sizeof(float) * rows);
    l.partial_o = s.add(sizeof(float) * rows * catalog::prefill_launch_vo(spec));  // one launch's V / O features
    return l.scratch_bytes = s.total();
  };
  l.min_scratch_bytes = lay_out(0);
  l.ideal_scratch_bytes = lay_out(l.ideal_slot_rows);
  if (shared_scratch == nullptr && device_bytes < l.scratch + l.min_scratch_bytes)
    throw InvalidArgument("workspace: expected at least " + str(l.scratch + l.min_scratch_bytes) +
                          " device bytes (the minimum for these bounds; " + str(l.scratch + l.ideal_scratch_bytes) +
                          " hold every partial state of split-KV), got " + str(device_bytes));
  if (shared_scratch != nullptr && device_bytes < l.scratch)
    throw InvalidArgument("workspace: expected at least " + str(l.scratch) + " device bytes (its split-KV scratch is "
                          "shared), got " + str(device_bytes));
  if (shared_scratch != nullptr && *shared_scratch < l.min_scratch_bytes)
    throw InvalidArgument("scratch: expected at least " + str(l.min_scratch_bytes) + " bytes of shared scratch (" +
                          str(l.ideal_scratch_bytes) + " hold every partial state), got " + str(*shared_scratch));
  const size_t budget = shared_scratch ? *shared_scratch : device_bytes - l.scratch;
  const int64_t tiles_fit =
      detail::largest_fitting(l.ideal_slot_rows / cta_q, [&](int64_t k) { return lay_out(k * cta_q) <= budget; });
  lay_out(tiles_fit * cta_q);
  l.total = l.scratch + l.scratch_bytes;
  return l;
}

BatchPrefill::Sizes BatchPrefill::workspace_size(const AttentionSpec& spec, const TaskInfo& task, int num_sms,
                                                 const PrefillOptions& opt) {
  if (opt.shared_prefix.enabled) return detail::SharedPrefixLevel::prefill_sizes(spec, task, num_sms, opt, false);
  return sizes(spec, task, num_sms, opt).whole;
}

BatchPrefill::Sizes BatchPrefill::min_workspace_size(const AttentionSpec& spec, const TaskInfo& task, int num_sms,
                                                     const PrefillOptions& opt) {
  if (opt.shared_prefix.enabled) return detail::SharedPrefixLevel::prefill_sizes(spec, task, num_sms, opt, true);
  return sizes(spec, task, num_sms, opt).min_whole;
}

BatchPrefill::Sizes BatchPrefill::workspace_size_shared(const AttentionSpec& spec, const TaskInfo& task, int num_sms,
                                                        const PrefillOptions& opt) {
  return sizes(spec, task, num_sms, opt).shared;
}

TaskInfo BatchPrefill::kernel_task(const TaskInfo& task, int kv_heads) {
  TaskInfo t = task;
  t.num_kv_heads = task.num_kv_heads / kv_heads;
  return t;
}

size_t BatchPrefill::scratch_size(const AttentionSpec& spec, const TaskInfo& task, int num_sms, const PrefillOptions& opt) {
  return sizes(spec, task, num_sms, opt).scratch;
}

size_t BatchPrefill::min_scratch_size(const AttentionSpec& spec, const TaskInfo& task, int num_sms,
                                      const PrefillOptions& opt) {
  return sizes(spec, task, num_sms, opt).min_scratch;
}

bool BatchPrefill::may_group_heads(const PrefillOptions& opt, const PrefillConfig& c) {
  return opt.group_heads == HeadGrouping::kOn ||
         (opt.group_heads == HeadGrouping::kAuto && c.hopper && c.cta_q >= 128);
}

// Each size is the largest over the tiles and backends a first plan may
// pick. The scratch is the layout's last section, so the workspace without
// it plus the largest scratch (ideal or minimal) is at least every layout's
// total.
BatchPrefill::SizeSet BatchPrefill::sizes(const AttentionSpec& spec, const TaskInfo& task, int num_sms,
                                          const PrefillOptions& opt) {
  validate_task(task, spec);
  if (opt.shared_prefix.enabled)  // the scratch-sharing sizes (CascadeAttention's levels) have no shared level
    detail::SharedPrefixLevel::refuse("takes a workspace of its own; expected workspace_size / min_workspace_size");
  if (task.max_batch < 1 || task.max_total_q < 1 || task.max_pages < 1)
    throw InvalidArgument("task: expected max_batch, max_total_q and max_pages >= 1 to size the workspace");
  if (opt.cta_q) (void)catalog::prefill_config(spec, opt.cta_q);  // rejects an invalid cta_q
  SizeSet r;
  detail::each_candidate(spec, opt, [&](const PrefillConfig& c) {  // whichever the first plan picks
    const TaskInfo kt =
        kernel_task(task, catalog::keys_kv_heads(spec, c.cta_q, c.hopper, task.num_qo_heads, task.num_kv_heads));
    for (const bool grouped : {false, true}) {  // kAuto: either, chosen by the first plan
      if (grouped ? !may_group_heads(opt, c) : !may_plan_per_head(opt)) continue;
      const auto g = detail::head_groups(kt.num_kv_heads, grouped, num_sms, c.ctas_per_sm, opt.max_sms);
      const Layout l = layout_for(spec, kt, g.ctas_per_group, g.groups, c.cta_q, opt.planner.fixed_chunk);
      r.shared.device_bytes = std::max(r.shared.device_bytes, l.scratch);
      r.shared.host_bytes = std::max(r.shared.host_bytes, l.staged);
      r.scratch = std::max(r.scratch, l.ideal_scratch_bytes);
      r.min_scratch = std::max(r.min_scratch, l.min_scratch_bytes);
    }
  });
  r.whole = {r.shared.device_bytes + r.scratch, r.shared.host_bytes};
  r.min_whole = {r.shared.device_bytes + r.min_scratch, r.shared.host_bytes};
  return r;
}

}  // namespace tessera
