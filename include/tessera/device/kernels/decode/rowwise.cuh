// Row-wise attention on CUDA cores: one CTA computes one (query row, query
// head) against the row's request in a paged KV cache. This is the first,
// simple and correct kernel of the skeleton (query tile 1); it serves single
// decode (contiguous KV = one page), batch decode and, slowly, prefill rows.
// Speed comes with the decode issue's tiled, pipelined kernel.
//
// Work split: each warp takes every NUM_WARPS-th KV token; inside a warp, lane
// l owns features [l*VEC, (l+1)*VEC) of the head dimension (VEC = D/32, so one
// 4/8/16-byte access per lane per token, 2/4/8 bytes of an fp8 cache). Warps
// keep private online-softmax states, merged in a fixed order at the end
// (deterministic).
#pragma once
#include "tessera/device/arch/vector_io.cuh"
#include "tessera/device/arch/warp.cuh"
#include "tessera/abi/rowwise_params.cuh"
#include "tessera/device/primitives/kv_view.cuh"
#include "tessera/device/primitives/attention_state.cuh"
#include "tessera/device/primitives/ragged.cuh"
#include "tessera/device/primitives/variant_traits.cuh"

namespace tessera {

#if defined(__CUDACC__) || defined(__CUDACC_RTC__)

template <typename Variant, typename DQ, typename DKV, typename DO, int HEAD_DIM, int NUM_WARPS, typename Params>
__device__ __forceinline__ void attention_rowwise(const Params& p) {
  static_assert(HEAD_DIM % 64 == 0, "head_dim must be 64, 128 or 256");
  constexpr int VEC = HEAD_DIM / 32;
  __shared__ float s_m[NUM_WARPS], s_d[NUM_WARPS];
  __shared__ float s_o[NUM_WARPS][HEAD_DIM];

  const int row = blockIdx.x, qo_head = blockIdx.y;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  // A null qo_indptr means one request owning every query row.
  const int b = p.qo_indptr ? find_request(p.qo_indptr, p.batch_size, row) : 0;
  const int qo_idx = p.qo_indptr ? row - p.qo_indptr[b] : row;
  const int qo_len = p.qo_indptr ? p.qo_indptr[b + 1] - p.qo_indptr[b] : p.total_q;
  const int kv_len = device::kv_len(p.kv, b);
  const int group = p.num_qo_heads / p.kv.num_kv_heads;
  const int kv_head = qo_head / group;
  const int feat0 = lane * VEC;
  Variant variant(p, b, qo_len, kv_len);
  const device::RunScales scales = device::read_run_scales(p);  // K's scale in sm_scale, V's in o_scale

  float q[VEC];
  const DQ* q_row = static_cast<const DQ*>(p.q) + row * p.q_stride_n + qo_head * p.q_stride_h;
  load_vec<VEC>(q_row + feat0, q);
  transform_query_vec<Variant, HEAD_DIM>(variant, p, q, q_row, feat0, b, qo_idx, qo_head);

  OnlineSoftmax st;
  st.init();
  float o[VEC];
#pragma unroll
  for (int i = 0; i < VEC; ++i) o[i] = 0.f;

  const DKV* k_base = static_cast<const DKV*>(p.kv.k);
  const DKV* v_base = static_cast<const DKV*>(p.kv.v);
  // Declared masks as a key range: up to the diagonal, from the window's start.
  const int diag = diagonal_key(qo_idx, variant.qo_len, kv_len);
  const int kv_stop = Variant::causal ? min(kv_len, diag + 1) : kv_len;
  const int kv_first = Variant::window_left >= 0 ? max(0, window_first_key<Variant>(diag)) : 0;
  for (int t = kv_first + warp; t < kv_stop; t += NUM_WARPS) {
    if (!variant.LogitsMask(p, b, qo_idx, t, qo_head, kv_head)) continue;  // warp-uniform
    const i64 off = device::kv_offset(p.kv, b, t, kv_head);
    if (off < 0) continue;  // a page id that failed its check (warp-uniform)
    float k[VEC], v[VEC];
    load_vec<VEC>(k_base + off + feat0, k);
    load_vec<VEC>(v_base + off + feat0, v);
    transform_key_vec<Variant, HEAD_DIM>(variant, p, k, k_base + off, feat0, b, t, kv_head);
    float dot = 0.f;
#pragma unroll
    for (int i = 0; i < VEC; ++i) dot += q[i] * k[i];
    float logit = warp_sum(dot) * scales.sm_scale;
    logit = variant.LogitsTransform(p, logit, b, qo_idx, t, qo_head, kv_head);
    if (Variant::use_softmax) {
      float2 f = st.update(logit * kLog2e);
#pragma unroll
      for (int i = 0; i < VEC; ++i) o[i] = o[i] * f.x + f.y * variant.ValueTransform(p, v[i], b, t, kv_head, feat0 + i);
    } else {
#pragma unroll
      for (int i = 0; i < VEC; ++i) o[i] += logit * variant.ValueTransform(p, v[i], b, t, kv_head, feat0 + i);
    }
  }

  // Merge the warps' partial states in warp order.
  if (lane == 0) { s_m[warp] = st.m; s_d[warp] = st.d; }
#pragma unroll
  for (int i = 0; i < VEC; ++i) s_o[warp][feat0 + i] = o[i];
  __syncthreads();
  if (warp == 0) {
    OnlineSoftmax acc;
    acc.init();
    float out[VEC];
#pragma unroll
    for (int i = 0; i < VEC; ++i) out[i] = 0.f;
    for (int w = 0; w < NUM_WARPS; ++w) {
      if (Variant::use_softmax) {
        float2 f = acc.merge(s_m[w], s_d[w]);
#pragma unroll
        for (int i = 0; i < VEC; ++i) out[i] = merge_value(out[i], f.x, s_o[w][feat0 + i], f.y);
      } else {
#pragma unroll
        for (int i = 0; i < VEC; ++i) out[i] += s_o[w][feat0 + i];
      }
    }
    const float inv = ((Variant::use_softmax && !acc.empty()) ? 1.f / acc.d : 1.f) * scales.o_scale;  // and the output scale
#pragma unroll
    for (int i = 0; i < VEC; ++i) {
      float val = (Variant::use_softmax && acc.empty()) ? 0.f : out[i] * inv;
      out[i] = variant.OutputTransform(p, val, b, qo_idx, qo_head, feat0 + i);
    }
    store_vec<VEC>(static_cast<DO*>(p.o) + row * p.o_stride_n + qo_head * p.o_stride_h + feat0, out);
    if (p.lse != nullptr && lane == 0)
      p.lse[static_cast<i64>(row) * p.num_qo_heads + qo_head] = Variant::use_softmax ? acc.lse() : 0.f;
  }
}

#endif

}  // namespace tessera
