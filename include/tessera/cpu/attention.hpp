// Attention on the CPU for host tensors: the execution path of the Python
// single_prefill / single_decode functions for CPU inputs (tessera::cpu, the
// library's CPU path; tessera::reference is the tests' float64 oracle, which
// the tests compare this against). Like the kernels it accumulates in float
// with an online softmax over KV tiles.
#pragma once
#include <cstdint>
#include <span>

#include "tessera/core/tensor.hpp"

namespace tessera::cpu {

struct AttentionOptions {
  double sm_scale = -1.0;        // < 0: 1 / sqrt(head_dim)
  bool causal = false;           // bottom-right aligned: query i sees keys j <= i + kv_len - q_len
  int window_left = -1;          // >= 0: and keys j >= i + kv_len - q_len - window_left only
  double logits_soft_cap = 0.0;  // > 0: logits become cap * tanh(logit / cap)
  // Per request a row-major [q_len, kv_len] block of 0/1 bytes, blocks in
  // request order (empty: no custom mask).
  std::span<const uint8_t> custom_mask;
  bool rope = false;  // ROPE_LLAMA on q (at its position) and k (at its index), all features
  double rope_scale = 1.0, rope_theta = 1e4;
  // One slope per query head (empty: no ALiBi): logit += slope * (j - i),
  // i the query's index in its request, j the key's (FlashInfer's ALiBi,
  // variants::PosEncoding::kAlibi); applied before the soft cap.
  std::span<const float> alibi_slopes;
  // Dequantization scales of K and V (an fp8 cache's): k_scale multiplies the
  // softmax scale, v_scale the output, as on the GPU (RunOptions).
  double k_scale = 1.0, v_scale = 1.0;
};

// q [rows, Hq, D], k [keys, Hkv, D], v [keys, Hkv, DV] (fp16, bf16 or fp32;
// k / v also fp8, widened exactly; any strides; DV = D but for unequal head
// dims, e.g. 192 / 128), requests given by qo_indptr / kv_indptr. Writes o
// [rows, Hq, DV] (any float dtype) and lse [rows, Hq] (float32, base 2; may
// be undefined). Rows that see no key get o = 0 and lse = -inf.
void attention_ragged(const TensorView& q, std::span<const int32_t> qo_indptr, const TensorView& k,
                      const TensorView& v, std::span<const int32_t> kv_indptr, const AttentionOptions& opt,
                      const TensorView& o, const TensorView& lse);

}  // namespace tessera::cpu
