// The shared level behind AutoSharedPrefix (api/shared_prefix.hpp), which
// BatchDecode and BatchPrefill own when the option is on: the detection, the
// shared level's prefill wrapper, the unique level's LSE, and their slice of
// the owner's workspace (its tail; the owner keeps the rest).
#pragma once
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "tessera/api/prefill.hpp"
#include "tessera/api/shared_prefix.hpp"
#include "tessera/formats/shared_prefix.hpp"

namespace tessera::detail {

class SharedPrefixLevel {
 public:
  // InvalidArgument naming shared_prefix for what the option does not
  // combine with (see api/shared_prefix.hpp); rows: the largest step's query
  // rows (decode: max_batch, prefill: max_total_q). No GPU needed.
  static void check(const AttentionSpec& spec, const TaskInfo& task, int64_t rows, const AutoSharedPrefix& opt,
                    const PlannerOptions& planner);
  // The level's part of the owner's workspace, ideal or minimal.
  static WorkspaceSizes sizes(const AttentionSpec& spec, const TaskInfo& task, int64_t rows, int num_sms,
                              const PlannerOptions& planner, int max_sms, bool minimum);
  // The owner's sizes plus the level's.
  static WorkspaceSizes add(WorkspaceSizes own, WorkspaceSizes level);

  // Takes the tail of `workspace` (the level's ideal size when the owner's
  // minimum fits beside it, else its minimum); own() is the rest, for the
  // owner. The caller has check()ed the arguments (before sizing its own part).
  SharedPrefixLevel(const AttentionSpec& spec, const TaskInfo& task, int64_t rows, const AutoSharedPrefix& opt,
                    const PlannerOptions& planner, int max_sms, Workspace& workspace, WorkspaceSizes own_min);
  // BatchPrefill's: rows = task.max_total_q, the wrapper's minimum from its own sizes.
  static std::unique_ptr<SharedPrefixLevel> for_prefill(const AttentionSpec& spec, const TaskInfo& task,
                                                        const PrefillOptions& opt, Workspace& workspace);
  // BatchPrefill::workspace_size / min_workspace_size with the option: its own plus the level's.
  static WorkspaceSizes prefill_sizes(const AttentionSpec& spec, const TaskInfo& task, int num_sms,
                                      const PrefillOptions& opt, bool minimum);
  ~SharedPrefixLevel();
  Workspace& own() { return *own_; }

  // Finds the step's groups and plans the shared level when they changed;
  // returns the unique level for the owner to plan on its own kernel
  // (valid until the next plan). qo_indptr empty: decode.
  const PrefixLevel& plan(std::span<const int32_t> kv_indptr, std::span<const int32_t> kv_indices,
                          std::span<const int32_t> kv_last_page_len, std::span<const int32_t> qo_indptr,
                          cudaStream_t stream);
  // Before the owner's launch: what run() refuses with the option.
  static void check_run(const RunOptions& opt);
  // Where the owner's kernel writes the unique level's LSE: [rows, Hq] float32.
  TensorView unique_lse(int64_t rows) const;
  // After the owner's launch: the shared level merged into o (and the
  // merged LSE into lse when defined).
  void merge(const TensorView& q, const PagedKVStorage& kv, const TensorView& o, const TensorView& lse,
             cudaStream_t stream, const RunOptions& opt) const;
  const SharedPrefixStats& stats() const { return stats_; }

  // What a refused plan / run form says (InvalidArgument naming shared_prefix).
  [[noreturn]] static void refuse(const std::string& what);

 private:
  TaskInfo task_;
  int64_t rows_ = 0;  // the largest step's query rows
  SharedPrefixOptions find_;
  SharedPrefixSplit split_;
  std::unique_ptr<Workspace> own_, slice_;
  float* lse_ = nullptr;
  int device_ = 0;
  std::unique_ptr<BatchPrefill> level_;
  PrefixLevel last_;  // the shared level planned last
  bool planned_ = false;
  SharedPrefixStats stats_;
};

}  // namespace tessera::detail
