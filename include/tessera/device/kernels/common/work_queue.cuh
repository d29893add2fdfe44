// The planner's work queues as the persistent kernels walk them. CTA (or
// cluster) x of a persistent kernel runs items work_indptr[x] ..
// work_indptr[x + 1] of work_items in order (abi/decode_params.cuh,
// abi/prefill_params.cuh); WorkQueue is that walk, for every kernel.
#pragma once
#include "tessera/abi/decode_params.cuh"
#include "tessera/abi/prefill_params.cuh"
#include "tessera/device/primitives/packed_mask.cuh"  // for the custom-mask variant
#include "tessera/device/primitives/kv_view.cuh"

namespace tessera {

#if defined(__CUDACC__) || defined(__CUDACC_RTC__)

// Where a queue's items come from:
//  kPlain: each item from work_items when its turn comes;
//  kFirst: the first item from first_items[queue] (a copy the planner keeps
//    beside work_indptr, so it is loaded together with the queue bounds
//    instead of after them), the rest from work_items;
//  kAhead: as kFirst, and item wi + 1 is loaded when item wi is taken, so
//    an item's loads are in flight during the previous item's tiles.
enum class QueueLoad { kPlain, kFirst, kAhead };

// One CTA's (or cluster's) queue of the parameter block p (work_indptr,
// work_items and, unless kPlain, first_items). Walk it as
//   for (int wi = q.begin; wi < q.end; ++wi) { const Item w = q.take(wi); ... }
// taking every item once, in order (kAhead relies on it). The item array is
// read from the parameters at each take, as a kernel reads any parameter.
template <typename Item, QueueLoad LOAD, typename Params>
struct WorkQueue {
  const Params& p;
  int begin, end;  // the queue's items in p.work_items
  Item held;       // kFirst: the first item; kAhead: the next one

  // queue: blockIdx.x, or its cluster's index (a cluster's CTAs share one
  // queue), in the type the kernel computes it in.
  template <typename Index>
  __device__ __forceinline__ WorkQueue(const Params& p_, Index queue)
      : p(p_), begin(p_.work_indptr[queue]), end(p_.work_indptr[queue + 1]), held(first_of(p_, queue)) {}
  // The queue's first item (kFirst, kAhead; before the walk), for set-up
  // work that may start before the loop.
  __device__ __forceinline__ const Item& first() const { return held; }
  template <typename Index>
  __device__ __forceinline__ static Item first_of(const Params& p, Index queue) {
    if constexpr (LOAD == QueueLoad::kPlain) {
      return Item{};  // unused
    } else {
      return p.first_items[queue];
    }
  }
  // Item wi: a reference into the parameters' arrays (kPlain, kFirst; the
  // caller copies it once), or the item loaded a step ahead (kAhead).
  __device__ __forceinline__ decltype(auto) take(int wi) {
    if constexpr (LOAD == QueueLoad::kPlain) {
      return (p.work_items[wi]);
    } else if constexpr (LOAD == QueueLoad::kFirst) {
      return (wi == begin ? held : p.work_items[wi]);
    } else {
      const Item w = held;
      if (wi + 1 < end) held = p.work_items[wi + 1];
      return w;
    }
  }
};

// The queue CTA (blockIdx.x, blockIdx.y) walks in a grid of several CTAs an
// SM whose columns are the plan's queues and whose rows run that one plan
// for different KV heads (or head groups). When a step has fewer chunks than
// CTAs, the busy queues are the first columns of every row, and the hardware
// places the same columns of different rows on the same SMs, so a short
// decode step ran on far fewer SMs than it had busy CTAs. Row y's queues
// therefore start at column y X / Y, which spreads the rows' busy CTAs over
// the grid (docs/performance.md, "Decode on tensor cores"). Results do not
// depend on it: a queue's items and their order are the plan's. queues:
// the plan's columns, which the CTAs x < queues serve; the grid is wider in
// a launch of two plans (prefill_sm90/pair.cuh, api/prefill_pair.hpp).
__device__ __forceinline__ int queue_of_cta(int queues) {
  return static_cast<int>((blockIdx.x + static_cast<unsigned long long>(blockIdx.y) * queues / gridDim.y) % queues);
}

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
