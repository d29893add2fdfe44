// AttentionWrapper: the generic plan/run wrapper of the paper's Listing 1.
// One object per (variant spec, task), kernels JIT-compiled for the spec,
// plan() once per step, run() per layer with the variant's extras by name:
//
//   AttentionSpec spec{variants::alibi(/*causal=*/true), DType::kFloat16, DType::kFloat16, DType::kFloat16, 128};
//   AttentionWrapper attn(spec, task, workspace);
//   attn.plan(qo_indptr, kv_indptr, kv_indices, kv_last_page_len, stream);   // once per step
//   VariantArgs args;
//   args.set("alibi_slopes", slopes);                                          // a float32 CUDA tensor
//   attn.run(q, PagedKVStorage(k_cache, v_cache, KVLayout::kNHD), o, lse, args, stream);
//
// It is a thin dispatcher over BatchDecode and BatchPrefill, with their
// contracts (workspace bounds from the task or the first plan, run()
// allocates nothing and never synchronizes, CUDA-graph capturable): a paged
// plan whose requests all have one query runs decode (BatchDecode; a BSR
// plan with Br = 1 too), anything else prefill (BatchPrefill over paged,
// ragged or BSR KV). With AttentionKind::kAuto the first plan decides and
// later plans must fit the same kind (a captured run() keeps its kernel);
// kDecode / kPrefill fix it up front.
//
// The custom-mask variant (variants::custom_mask(), prefill only) takes its
// byte offsets in plan (mask_indptr) and its packed bits as the tensor
// argument "packed_custom_mask" of run().
#pragma once
#include <cuda_runtime_api.h>

#include <memory>
#include <span>

#include "tessera/api/decode.hpp"
#include "tessera/api/prefill.hpp"
#include "tessera/runtime/variant_params.hpp"

namespace tessera {

enum class AttentionKind { kAuto, kDecode, kPrefill };

struct AttentionWrapperOptions {
  AttentionKind kind = AttentionKind::kAuto;
  DecodeOptions decode;    // when the wrapper runs decode
  PrefillOptions prefill;  // when it runs prefill
};

class AttentionWrapper {
 public:
  AttentionWrapper(AttentionSpec spec, TaskInfo task, Workspace& workspace, AttentionWrapperOptions opt = {});

  // Workspace for the kinds `opt` allows (kAuto: the larger of decode's and
  // prefill's; prefill needs task.max_total_q).
  static WorkspaceSizes workspace_size(const AttentionSpec& spec, const TaskInfo& task, int num_sms,
                                       const AttentionWrapperOptions& opt = {});
  // The smallest workspace accepted (less split-KV below workspace_size():
  // see BatchPrefill::min_workspace_size).
  static WorkspaceSizes min_workspace_size(const AttentionSpec& spec, const TaskInfo& task, int num_sms,
                                           const AttentionWrapperOptions& opt = {});

  // Paged KV: qo_indptr [batch + 1] over q's rows, kv_indptr in pages.
  void plan(std::span<const int32_t> qo_indptr, std::span<const int32_t> kv_indptr, std::span<const int32_t> kv_indices,
            std::span<const int32_t> kv_last_page_len, cudaStream_t stream = nullptr,
            std::span<const int32_t> mask_indptr = {});
  // Paged KV whose page ids stay on the GPU (api/page_ids.hpp): kv_indices a
  // 1-D int32 CUDA tensor on the workspace's device (no custom mask).
  void plan(std::span<const int32_t> qo_indptr, std::span<const int32_t> kv_indptr, const TensorView& kv_indices,
            std::span<const int32_t> kv_last_page_len, cudaStream_t stream = nullptr);
  // Ragged KV (prefill): kv_indptr counts rows of k / v.
  void plan_ragged(std::span<const int32_t> qo_indptr, std::span<const int32_t> kv_indptr, cudaStream_t stream = nullptr,
                   std::span<const int32_t> mask_indptr = {});
  // Block-sparse (Bc = task.page_size): decode when Br = 1 and the kind allows, else prefill.
  void plan_bsr(const BSRMatrix& bsr, cudaStream_t stream = nullptr);

  // Paged or BSR plans: kv is the page storage (BSR: [N / Bc, Bc, Hkv, D]).
  // q [rows, Hq, D]; o like q; lse [rows, Hq] float32 or undefined.
  void run(const TensorView& q, const PagedKVStorage& kv, const TensorView& o, const TensorView& lse,
           const VariantArgs& args = {}, cudaStream_t stream = nullptr, RunOptions opt = {}) const;
  // Ragged plans: k, v [total_kv, Hkv, D].
  void run_ragged(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& o,
                  const TensorView& lse, const VariantArgs& args = {}, cudaStream_t stream = nullptr,
                  RunOptions opt = {}) const;

  // kDecode or kPrefill once the first plan chose (or the options fixed it).
  AttentionKind kind() const { return kind_; }
  const AttentionSpec& spec() const { return spec_; }
  const BatchDecode* decode() const { return decode_.get(); }
  const BatchPrefill* prefill() const { return prefill_.get(); }

 private:
  // Fixes the kind at the first plan (`decode_ok`: this plan could run as
  // decode), builds its wrapper, and refuses a plan the fixed kind cannot run.
  void choose(bool decode_ok, const char* why_not);
  // The custom mask's bits (custom_mask variant) from args, checked.
  const TensorView* mask_arg(const VariantArgs& args) const;

  AttentionSpec spec_;
  TaskInfo task_;
  Workspace* ws_;
  AttentionWrapperOptions opt_;
  AttentionKind kind_;
  bool custom_mask_;
  std::unique_ptr<BatchDecode> decode_;
  std::unique_ptr<BatchPrefill> prefill_;
};

}  // namespace tessera
