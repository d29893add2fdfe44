// Parameter block and work items of the persistent tensor-core prefill
// kernels (FA2 and Hopper templates). Plain data shared by host and device.
#pragma once
#include "tessera/abi/tensor_map.cuh"
#include "tessera/abi/kv_view.cuh"

namespace tessera {

// One unit of work: query tile `q_tile` of `request` (CTA_Q fused rows, a
// fused row being (query position, head of the KV head's group), paper
// Appendix A) against KV tokens [kv_start, kv_end); the request field also
// names the KV head within the CTA group (item_request / item_kv_head in
// device/kernels/common/work_queue.cuh).
// The request's bounds ride along (filled by the wrapper from the host
// arrays it uploads anyway), so an item starts without dependent loads of
// qo_indptr / kv_indptr / last_page_len: on a short decode step each such
// round trip delayed every CTA's first KV tile (bench/decode_trace.py).
struct PrefillWorkItem {
  int request;
  int q_tile;
  int kv_start, kv_end;
  int partial_slot;  // -1: the tile is not split, write the output directly
  int first_slot;    // the tile's chunk 0 slot (its chunks are consecutive)
  int num_chunks;
  int counter;       // merge counter of a split tile (index into counters / head groups)
  int qo_begin, qo_len;  // the request's queries: qo_indptr[b], its length
  int kv_begin, kv_len;  // kv_indptr[b] (first page, or first token of ragged KV), its KV length in tokens
};

// Tensor maps for the Hopper kernel's TMA loads (a second,
// __grid_constant__ kernel parameter), boxes of 64 features into
// 128-byte-swizzled shared memory:
// * k, v: contiguous K and V, rank 3 (head_dim, token, kv head), boxes of
//   CTA_KV tokens of one head. kv_on = 0: the producer gathers with cp.async
//   instead (paged / BSR KV, key or value transforms, strides the TMA cannot
//   describe).
// * q: rank 4 (head_dim, head in group, kv head, token), boxes of the group's
//   heads x CTA_Q / group tokens of one kv head: exactly a fused query tile
//   (row f = token * group + head). q_on = 0: cp.async (the group does not
//   divide CTA_Q, short queries such as decode, odd strides).
struct Sm90TensorMaps {
  TensorMap k, v, q;
  int kv_on, q_on;
};

template <typename Extra>
struct PrefillParams {
  const void* q;  // [total_q, num_qo_heads, head_dim]
  void* o;        // [total_q, num_qo_heads, head_dim]
  float* lse;     // [total_q, num_qo_heads] base-2 LSE, or null
  // Null, or merge into o instead of overwriting it: o already holds an
  // attention state of these rows whose base-2 LSE is merge_lse
  // [total_q, num_qo_heads] (never the lse buffer: it is read while lse is
  // written). o gets the merge of that state and this attention's, lse (when
  // given) the merged LSE; rows that see no key here keep o.
  const float* merge_lse;
  i64 q_stride_n, q_stride_h;
  i64 o_stride_n, o_stride_h;
  const int* qo_indptr;  // [batch + 1]
  device::PagedKV kv;
  const int* work_indptr;
  const PrefillWorkItem* work_items;
  // CTA x's first item again (a zero item where it has none): loaded
  // together with work_indptr instead of after it.
  const PrefillWorkItem* first_items;
  float* partial_o;    // [slots, head groups, CTA_Q, head_dim]
  float* partial_lse;  // [slots, head groups, CTA_Q]
  int* counters;       // [split tiles * head groups], zero between runs
  u64* merge_words;    // [split tiles * head groups], zero between runs (common/cooperative_merge.cuh)
  int num_qo_heads;
  int group;  // num_qo_heads / num_kv_heads
  // KV heads per CTA group (grid.y): a work item's request field is
  // b * heads_per_group + h, for request b and KV head blockIdx.y *
  // heads_per_group + h (see item_request / item_kv_head).
  int heads_per_group;
  int page_shift;
  // Programmatic dependent launch behind another level of the same
  // attention (RunOptions::pdl_defer_wait): the kernel before writes only
  // o and merge_lse, so the Hopper kernel streams and computes before its
  // grid-dependency wait and waits only before its epilogues. Other
  // kernels wait at their start either way.
  int defer_grid_wait;
  float sm_scale;
  // Output scale (FlashInfer's v_scale: V's dequantization scale): O is
  // multiplied by it where the epilogue normalizes rows, before the
  // variant's OutputTransform; LSE is unchanged.
  float o_scale = 1.f;
  // An fp8 cache's k_scale / v_scale as device tensors (null: none), read
  // at run time by the FA2 template's fp8 instantiations only.
  device::KVScaleTensors kv_scales;
  // Custom mask (variants::custom_mask(), else null): request b's
  // [qo_len, kv_len] boolean mask, row-major, packed 8 positions per byte
  // with little bit order (numpy packbits(bitorder="little")), starting at
  // byte custom_mask[mask_indptr[b]].
  const u8* custom_mask;
  const int* mask_indptr;  // [batch + 1] byte offsets
  i64 custom_mask_bytes;   // the buffer's size (LogitsMaskBits reads whole words, never past it)
  Extra extra;  // keep last
};

}  // namespace tessera
