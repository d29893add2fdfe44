// Parameter block and work items of the persistent batch-decode kernel.
// Plain data: the planner (host) writes the work queues into the workspace and
// the host fills DecodeParams with fixed workspace addresses, so a captured
// CUDA graph stays valid while plan() rewrites the queues between replays.
#pragma once
#include "tessera/abi/kv_view.cuh"

namespace tessera {

// One unit of work: KV tokens [kv_start, kv_end) of `request`, for the KV head
// given by blockIdx.y (every head shares the plan).
struct DecodeWorkItem {
  int request;
  int kv_start, kv_end;
  int partial_slot;  // where this chunk's partial state goes; -1: the request is
                     // not split, write the output directly (split-K writethrough)
  int first_slot;    // slot of the request's chunk 0 (its chunks are consecutive)
  int num_chunks;
};

template <typename Extra>
struct DecodeParams {
  const void* q;  // [batch, num_qo_heads, head_dim]
  void* o;        // [batch, num_qo_heads, head_dim]
  float* lse;     // [batch, num_qo_heads] base-2 LSE, or null
  i64 q_stride_n, q_stride_h;
  i64 o_stride_n, o_stride_h;
  device::PagedKV kv;
  const int* work_indptr;  // [ctas_per_head + 1]: CTA x runs items [work_indptr[x], work_indptr[x+1])
  const DecodeWorkItem* work_items;
  float* partial_o;    // [slots, num_qo_heads, head_dim] normalized partial outputs
  float* partial_lse;  // [slots, num_qo_heads]
  int* counters;       // [max_batch * num_kv_heads] finished chunks per (request, KV head); kept at 0 between runs
  int num_qo_heads;
  int page_shift;  // log2(page_size) if a power of two, else -1
  float sm_scale;
  // Output scale (FlashInfer's v_scale: V's dequantization scale): O is
  // multiplied by it where the epilogue normalizes rows, before the
  // variant's OutputTransform; LSE is unchanged.
  float o_scale = 1.f;
  device::KVScaleTensors kv_scales;  // fp8 caches' scales as device tensors (null: none)
  Extra extra;  // the variant's own scalars / tensor pointers; keep last
};

}  // namespace tessera
