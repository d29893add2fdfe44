#include "tessera/api/cascade.hpp"

#include <algorithm>
#include <chrono>
#include <cstring>

#include "checks.hpp"
#include "tessera/api/merge.hpp"
#include "tessera/formats/paged_kv.hpp"
#include "tessera/formats/ragged.hpp"
#include "tessera/runtime/cuda.hpp"

namespace tessera {

using detail::str;

// A level: its BatchPrefill and the borrowed slice of the caller's workspace
// it plans into (heap-held, so the BatchPrefill's pointer to it survives moves).
struct CascadeAttention::Level {
  Workspace slice;
  BatchPrefill prefill;
  Level(void* dev, size_t dev_bytes, void* host, size_t host_bytes, int device, const AttentionSpec& spec,
        const TaskInfo& task, const PrefillOptions& opt)
      : slice(dev, dev_bytes, host, host_bytes, device), prefill(spec, task, slice, opt) {}
};

namespace {

constexpr size_t kAlign = 256;
size_t aligned(size_t x) { return (x + kAlign - 1) / kAlign * kAlign; }

void validate_levels(const std::vector<AttentionSpec>& specs, const TaskInfo& task) {
  if (specs.empty()) throw InvalidArgument("level_specs: expected at least one level, got 0");
  for (size_t i = 0; i < specs.size(); ++i) {
    const AttentionSpec& s = specs[i];
    validate_task(task, s);
    if (s.q_dtype != specs[0].q_dtype || s.kv_dtype != specs[0].kv_dtype || s.o_dtype != specs[0].o_dtype ||
        s.head_dim != specs[0].head_dim || s.vo_dim() != specs[0].vo_dim())
      throw InvalidArgument("level_specs[" + str(i) + "]: expected the dtypes and head_dim of level 0 (" +
                            specs[0].str() + "), got " + s.str());
    if (s.variant.custom_mask)
      throw InvalidArgument("level_specs[" + str(i) + "]: custom masks are not supported in a cascade");
  }
  if (task.max_batch < 1 || task.max_total_q < 1 || task.max_pages < 1)
    throw InvalidArgument("task: expected max_batch, max_total_q and max_pages >= 1 (they size every level's "
                          "workspace slice), got " + str(task.max_batch) + ", " + str(task.max_total_q) + ", " +
                          str(task.max_pages));
}

// Byte sizes of one level slice each, then the scratch states.
struct CascadeLayout {
  std::vector<WorkspaceSizes> levels;
  size_t split_scratch = 0, split_scratch_bytes = 0;  // the levels' shared split-KV scratch
  size_t state_o = 0, scratch_o = 0, scratch_lse = 0, own_lse = 0, row_mask = 0, host_row_mask = 0;
  WorkspaceSizes total;
  size_t ideal_device_bytes = 0, min_device_bytes = 0;  // with every partial state of split-KV, with none
};

// The specs the levels run: with several levels, fp32 outputs (their
// states are merged in fp32 and rounded once, into the caller's output).
std::vector<AttentionSpec> run_specs(std::vector<AttentionSpec> specs) {
  if (specs.size() > 1)
    for (AttentionSpec& s : specs) s.o_dtype = DType::kFloat32;
  return specs;
}

// device_bytes: the caller's workspace; below the ideal size the shared
// split-KV scratch shrinks to fit (down to no partial states), and each
// level's first plan sizes its partial states to it.
CascadeLayout cascade_layout(const std::vector<AttentionSpec>& user_specs, const TaskInfo& task, int num_sms,
                             const PrefillOptions& opt, size_t device_bytes = SIZE_MAX) {
  validate_levels(user_specs, task);
  const std::vector<AttentionSpec> specs = run_specs(user_specs);
  CascadeLayout l;
  size_t min_scratch = 0;
  // The levels run one after another on one stream, so their split-KV
  // scratch (merge counters, partial states: most of a BatchPrefill's
  // workspace) is one region; each level keeps only its plan sections.
  for (const AttentionSpec& s : specs) {
    WorkspaceSizes w = BatchPrefill::workspace_size_shared(s, task, num_sms, opt);
    w.device_bytes = aligned(w.device_bytes);
    w.host_bytes = aligned(w.host_bytes);
    l.total.device_bytes += w.device_bytes;
    l.total.host_bytes += w.host_bytes;
    l.levels.push_back(w);
    l.split_scratch_bytes = std::max(l.split_scratch_bytes, aligned(BatchPrefill::scratch_size(s, task, num_sms, opt)));
    min_scratch = std::max(min_scratch, aligned(BatchPrefill::min_scratch_size(s, task, num_sms, opt)));
  }
  const size_t rows = static_cast<size_t>(task.max_total_q) * task.num_qo_heads;
  // Several levels: the running state and each next level's output, fp32.
  const size_t state_bytes = specs.size() > 1 ? aligned(rows * specs[0].vo_dim() * sizeof(float)) : 0;
  const size_t others = l.total.device_bytes + 2 * state_bytes + 2 * aligned(rows * sizeof(float)) +
                        aligned(task.max_total_q);  // everything but the split-KV scratch
  l.ideal_device_bytes = others + l.split_scratch_bytes;
  l.min_device_bytes = others + min_scratch;
  if (device_bytes < l.ideal_device_bytes && device_bytes >= l.min_device_bytes)
    l.split_scratch_bytes = (device_bytes - others) / kAlign * kAlign;
  l.split_scratch = l.total.device_bytes;
  l.total.device_bytes += l.split_scratch_bytes;
  l.state_o = l.total.device_bytes;
  l.scratch_o = l.state_o + state_bytes;
  l.scratch_lse = l.scratch_o + state_bytes;
  l.own_lse = l.scratch_lse + aligned(rows * sizeof(float));
  l.row_mask = l.own_lse + aligned(rows * sizeof(float));
  l.total.device_bytes = l.row_mask + aligned(task.max_total_q);
  l.host_row_mask = l.total.host_bytes;
  l.total.host_bytes += aligned(task.max_total_q);
  return l;
}

int sm_count_for(int device) { return cuda::gpu_available() ? cuda::device_info(device).sm_count : 1; }

}  // namespace

std::array<CascadeLevel, 2> cascade_levels(const SharedPrefixSplit& split) {
  if (!split.split)
    throw InvalidArgument("split: expected a split with levels (split.split true: groups found that save at least "
                          "min_saved_pages page reads), got none");
  auto level = [](const PrefixLevel& l) {
    return CascadeLevel{l.qo_indptr, l.kv_indptr, l.kv_indices, l.kv_last_page_len};
  };
  return {level(split.shared), level(split.unique)};
}

CascadeAttention::Sizes CascadeAttention::workspace_size(const std::vector<AttentionSpec>& level_specs,
                                                         const TaskInfo& task, int num_sms, const PrefillOptions& opt) {
  return cascade_layout(level_specs, task, num_sms, opt).total;
}

CascadeAttention::Sizes CascadeAttention::min_workspace_size(const std::vector<AttentionSpec>& level_specs,
                                                             const TaskInfo& task, int num_sms,
                                                             const PrefillOptions& opt) {
  const CascadeLayout l = cascade_layout(level_specs, task, num_sms, opt);
  return {l.min_device_bytes, l.total.host_bytes};
}

CascadeAttention::CascadeAttention(std::vector<AttentionSpec> level_specs, TaskInfo task, Workspace& workspace,
                                   PrefillOptions opt)
    : task_(task), ws_(&workspace) {
  // Without a GPU the slices are sized for one SM: plan() stops at the first
  // level's kernel load with a clear error, after validating every level.
  const CascadeLayout l =
      cascade_layout(level_specs, task, sm_count_for(workspace.device()), opt, workspace.device_bytes());
  if (workspace.device_bytes() < l.min_device_bytes)
    throw InvalidArgument("workspace: expected at least " + str(l.min_device_bytes) + " device bytes (the minimum "
                          "for these bounds; " + str(l.ideal_device_bytes) + " hold every partial state of split-KV), "
                          "got " + str(workspace.device_bytes()));
  detail::check_workspace_size(workspace, l.total.device_bytes, l.total.host_bytes);
  spec0_ = level_specs[0];
  level_specs = run_specs(std::move(level_specs));
  char* dev = static_cast<char*>(workspace.device_ptr());
  char* host = static_cast<char*>(workspace.host_ptr());
  for (size_t i = 0; i < level_specs.size(); ++i) {
    levels_.push_back(std::make_unique<Level>(dev, l.levels[i].device_bytes, host, l.levels[i].host_bytes,
                                              workspace.device(), level_specs[i], task, opt));
    levels_.back()->prefill.use_shared_scratch(static_cast<char*>(workspace.device_ptr()) + l.split_scratch,
                                               l.split_scratch_bytes);
    dev += l.levels[i].device_bytes;
    host += l.levels[i].host_bytes;
  }
  row_mask_ = std::make_unique<Workspace>(static_cast<char*>(workspace.device_ptr()) + l.row_mask, aligned(task.max_total_q),
                                          static_cast<char*>(workspace.host_ptr()) + l.host_row_mask,
                                          aligned(task.max_total_q), workspace.device());
  state_o_ = l.state_o;
  scratch_o_ = l.scratch_o;
  scratch_lse_ = l.scratch_lse;
  own_lse_ = l.own_lse;
}

CascadeAttention::~CascadeAttention() = default;
CascadeAttention::CascadeAttention(CascadeAttention&&) noexcept = default;
CascadeAttention& CascadeAttention::operator=(CascadeAttention&&) noexcept = default;

const BatchPrefill& CascadeAttention::level(int i) const {
  if (i < 0 || i >= num_levels())
    throw InvalidArgument("level: expected 0 <= i < " + str(num_levels()) + ", got " + str(i));
  return levels_[i]->prefill;
}

void CascadeAttention::plan(std::span<const CascadeLevel> levels, cudaStream_t stream) {
  const auto t0 = std::chrono::steady_clock::now();
  if (static_cast<int>(levels.size()) != num_levels())
    throw InvalidArgument("levels: expected " + str(num_levels()) + " levels (one per level spec), got " +
                          str(levels.size()));
  // Every level covers the same query rows: checked for all before any plan,
  // so a bad step leaves the previous plan intact.
  int64_t total_q = -1;
  for (size_t i = 0; i < levels.size(); ++i) {
    const auto& ip = levels[i].qo_indptr;
    const std::string name = "levels[" + str(i) + "].qo_indptr";
    if (ip.empty()) throw InvalidArgument(name + ": expected groups + 1 elements, got 0");
    validate_indptr(name.c_str(), ip);
    if (i == 0) total_q = ip.back();
    if (ip.back() != total_q)
      throw InvalidArgument(name + ": expected the last entry to be the step's total query rows " + str(total_q) +
                            " (as level 0), got " + str(ip.back()));
    if (levels[i].kv_indptr.size() != ip.size())
      throw InvalidArgument("levels[" + str(i) + "].kv_indptr: expected " + str(ip.size()) +
                            " elements (like its qo_indptr), got " + str(levels[i].kv_indptr.size()));
    try {
      const CascadeLevel& lv = levels[i];  // device ids: lengths here, the ids in the kernels
      const PageIds ids = lv.kv_indices_device
                              ? detail::device_page_ids(*lv.kv_indices_device, lv.kv_indptr, ws_->device())
                              : PageIds::from_host(lv.kv_indices);
      (void)detail::check_page_ids(lv.kv_indptr, ids, lv.kv_last_page_len, task_.page_size, kv_lens_);
    } catch (const InvalidArgument& e) {
      throw InvalidArgument("levels[" + str(i) + "]: " + e.what());
    }
  }
  detail::require_gpu("CascadeAttention::plan");
  total_q_ = -1;  // a level that fails to plan leaves nothing to run
  for (size_t i = 0; i < levels.size(); ++i) {
    const CascadeLevel& lv = levels[i];
    try {
      if (lv.kv_indices_device)
        levels_[i]->prefill.plan_paged(lv.qo_indptr, lv.kv_indptr, *lv.kv_indices_device, lv.kv_last_page_len, stream);
      else
        levels_[i]->prefill.plan_paged(lv.qo_indptr, lv.kv_indptr, lv.kv_indices, lv.kv_last_page_len, stream);
    } catch (const InvalidArgument& e) {
      throw InvalidArgument("levels[" + str(i) + "]: " + e.what());
    }
  }
  // Rows the merges may change: the planned ones (a graph captured with
  // tensors of more rows replays correctly after a re-plan with fewer).
  row_mask_->stage_begin();
  std::memset(row_mask_->host_ptr(), 1, static_cast<size_t>(total_q));
  std::memset(static_cast<char*>(row_mask_->host_ptr()) + total_q, 0, static_cast<size_t>(task_.max_total_q - total_q));
  row_mask_->upload(static_cast<size_t>(task_.max_total_q), stream);
  total_q_ = total_q;
  plan_us_ = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
}

void CascadeAttention::plan_on_device(std::span<const DeviceBatch> levels, cudaStream_t stream) {
  if (static_cast<int>(levels.size()) != num_levels())
    throw InvalidArgument("levels: expected " + str(num_levels()) + " levels (one per level spec), got " +
                          str(levels.size()));
  for (size_t i = 0; i < levels.size(); ++i)
    if (!detail::has(levels[i].qo_indptr))
      throw InvalidArgument("levels[" + str(i) + "].qo_indptr: expected an int32 CUDA tensor (each level groups the "
                            "step's query rows)");
  detail::require_gpu("CascadeAttention::plan_on_device");
  total_q_ = -1;  // a level that fails to plan leaves nothing to run
  for (size_t i = 0; i < levels.size(); ++i) {
    // Level 0's buffers are checked by its own plan before a further level reads them.
    const detail::LevelRows rows =
        i == 0 ? detail::LevelRows{static_cast<unsigned char*>(row_mask_->device_ptr()), nullptr, nullptr}
               : detail::LevelRows{nullptr, static_cast<const int32_t*>(levels[0].batch_size.data),
                                   static_cast<const int32_t*>(levels[0].qo_indptr.data)};
    try {
      levels_[i]->prefill.plan_on_device(BatchPrefill::Source::kPaged, levels[i], 0, stream, rows);
    } catch (const InvalidArgument& e) {
      throw InvalidArgument("levels[" + str(i) + "]: " + e.what());
    }
  }
  total_q_ = task_.max_total_q;
  plan_us_ = 0;
}

void CascadeAttention::run(const TensorView& q, const PagedKVStorage& kv, const TensorView& o, const TensorView& lse,
                           cudaStream_t stream, const RunOptions& opt) const {
  if (total_q_ < 0) throw InvalidArgument("run: expected a successful plan() first");
  if (detail::has(opt.merge_lse))
    throw InvalidArgument("merge_lse: expected undefined: CascadeAttention merges its levels itself");
  detail::check_q_o_lse(spec0_, q, o, lse, task_.num_qo_heads);
  const int64_t rows = q.size(0);
  if (rows < total_q_)
    throw InvalidArgument("q: expected at least the planned total query length " + str(total_q_) + " rows, got " +
                          str(rows));
  if (rows > task_.max_total_q)
    throw InvalidArgument("q: " + str(rows) + " rows exceed the workspace bound max_total_q=" + str(task_.max_total_q));
  // The levels run on the planned rows; the merges cover all rows but change
  // only the planned ones (row mask), so a CUDA graph captured with tensors of
  // the largest step replays after any re-plan within the bounds.
  auto first = [this](TensorView t) {
    t.shape[0] = total_q_;
    return t;
  };
  char* base = static_cast<char*>(ws_->device_ptr());
  const Device dev = o.device;
  const int64_t hq = o.size(1), d = o.size(2);
  const TensorView state_lse = detail::has(lse) ? lse : TensorView(base + own_lse_, DType::kFloat32, dev, {rows, hq});
  // A level's failed plan on the GPU is raised by its run, named here.
  auto run_level = [&](size_t i, const TensorView& lo, const TensorView& llse) {
    try {
      levels_[i]->prefill.run(first(q), kv, first(lo), first(llse), stream, opt);
    } catch (const InvalidArgument& e) {
      throw InvalidArgument("levels[" + str(i) + "]: " + e.what());
    }
  };
  if (levels_.size() == 1) return run_level(0, o, state_lse);
  // Level 0 into the fp32 state, each next level into fp32 scratch merged
  // into it; the last merge writes o (16-bit: the only rounding).
  const TensorView state_o(base + state_o_, DType::kFloat32, dev, {rows, hq, d});
  run_level(0, state_o, state_lse);
  const TensorView tmp_o(base + scratch_o_, DType::kFloat32, dev, {rows, hq, d});
  const TensorView tmp_lse(base + scratch_lse_, DType::kFloat32, dev, {rows, hq});
  const TensorView mask(row_mask_->device_ptr(), DType::kUInt8, dev, {rows});
  for (size_t i = 1; i < levels_.size(); ++i) {
    run_level(i, tmp_o, tmp_lse);
    detail::merge_state_into(state_o, state_lse, tmp_o, tmp_lse, i + 1 == levels_.size() ? o : state_o, state_lse,
                             mask, stream, opt.pdl);
  }
}

}  // namespace tessera
