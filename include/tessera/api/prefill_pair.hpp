// Two planned batch prefills in one persistent launch: POD-Attention's
// fusion (FlashInfer's PODWithPagedKVCacheWrapper), typically a prompt's
// prefill chunk (compute bound) beside a decode batch (memory bound) of the
// same layer, so decode items stream KV on SMs whose other CTAs are busy on
// the tensor cores, and the step pays one launch and one tail.
//
//   BatchPrefill prefill(spec_p, task_p, ws_p, {.cta_q = 64});   // same tile shape on both sides:
//   BatchPrefill decode(spec_d, task_d, ws_d, {.cta_q = 64});    // here the Hopper kernel's 64-row tiles
//   prefill.plan_ragged(...);  decode.plan_paged(...);   // each step
//   PrefillPair pod(prefill, decode);                    // once, after the first plans
//   pod.run({.q = q_p, .k = k_p, .v = v_p, .o = o_p},
//           {.q = q_d, .kv = &cache, .o = o_d}, stream);  // every layer
//
// Each wrapper keeps its own plan, variant (mask, window, RoPE, soft cap,
// scales), KV source and workspace; CTA x walks x's queue of the first plan,
// then of the second, so the outputs are those of the two wrappers' own
// run()s, bit for bit. Both run on the FA2 template (prefill_sm80/kernel.cuh:
// one kernel function per plan) or both on the Hopper kernel
// (prefill_sm90/pair.cuh: one warp specialization over both plans). run()
// allocates nothing and never synchronizes (capturable, like the wrappers'
// runs).
#pragma once
#include <cuda_runtime_api.h>

#include "tessera/api/prefill.hpp"

namespace tessera {

// One wrapper's part of a PrefillPair::run: the arguments of its run()
// (paged or BSR plans: kv) or run_ragged() (ragged plans: k, v), the packed
// custom mask for custom-mask wrappers, and its run options.
struct PrefillRunArgs {
  TensorView q;
  const PagedKVStorage* kv = nullptr;
  TensorView k, v;
  TensorView packed_custom_mask;
  TensorView o, lse;
  RunOptions opt;
};

class PrefillPair {
 public:
  // Both wrappers planned at least once (their tiles are fixed then), on one
  // template (FA2 for both, or the Hopper kernel for both with as many CTAs
  // per SM), single CTAs (no PrefillOptions::cluster pairs), same device and
  // head groups, tiles of as many threads, head dims up to 256, workspaces
  // apart: else InvalidArgument naming what differs. Loads (JIT-compiling if
  // needed) the fused kernel. The wrappers must outlive the pair; re-plan
  // them freely.
  PrefillPair(const BatchPrefill& first, const BatchPrefill& second);

  // The wrappers' latest plans in one launch on `stream`; `first`'s
  // RunOptions::pdl applies to the launch. Each part is checked as its
  // wrapper's run() checks it.
  void run(const PrefillRunArgs& first, const PrefillRunArgs& second, cudaStream_t stream = nullptr) const;

  const jit::KernelSource& kernel_source() const { return source_; }

 private:
  const BatchPrefill* first_;
  const BatchPrefill* second_;
  jit::KernelSource source_;
  const jit::LoadedKernel* kernel_ = nullptr;
  int smem_bytes_ = 0;
};

}  // namespace tessera
