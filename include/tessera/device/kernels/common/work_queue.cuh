// The planner's work queues as the persistent kernels walk them: which
// request and KV head a prefill work item (abi/prefill_params.cuh) covers.
#pragma once
#include "tessera/abi/prefill_params.cuh"
#include "tessera/device/primitives/packed_mask.cuh"  // for the custom-mask variant
#include "tessera/device/primitives/kv_view.cuh"

namespace tessera {

#if defined(__CUDACC__) || defined(__CUDACC_RTC__)
// The request and KV head a work item of CTA group blockIdx.y covers.
template <typename Params>
__device__ __forceinline__ int item_request(const Params& p, const PrefillWorkItem& w) {
  return p.heads_per_group == 1 ? w.request : w.request / p.heads_per_group;
}
template <typename Params>
__device__ __forceinline__ int item_kv_head(const Params& p, const PrefillWorkItem& w) {
  return p.heads_per_group == 1 ? blockIdx.y : blockIdx.y * p.heads_per_group + w.request % p.heads_per_group;
}
#endif

}  // namespace tessera
