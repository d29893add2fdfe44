// CPU reference of multi-head latent attention (DeepSeek-style MLA with
// absorbed weights), double accumulation: the oracle of the MLA tests.
// Expanded attention over the latent KV, straight from the formula: for
// request i, its query j (of qo_len) and head h, key t < kv_len sees
//   logit_t = sm_scale * (q_nope[j, h] . ckv[t] + q_pe[j, h] . kpe[t])
// (causal: only t <= j + kv_len - qo_len, bottom-right aligned), and
//   o[j, h] = sum_t softmax(logit)_t ckv[t],  lse = log2 sum_t 2^(logit_t log2 e).
// A row that sees no key gets o = 0 and lse = -inf.
#pragma once
#include <cstdint>
#include <span>

#include "tessera/core/tensor.hpp"
#include "tessera/reference/attention.hpp"

namespace tessera::reference {

// Host tensors (float16 / bfloat16 / float32, last dim contiguous):
// q_nope [total_q, H, dc], q_pe [total_q, H, dr], ckv_cache [pages,
// page_size, dc], kpe_cache [pages, page_size, dr]; request i has queries
// qo_indptr[i] .. qo_indptr[i + 1], pages kv_indices[kv_indptr[i] ..
// kv_indptr[i + 1]) and kv_lens[i] tokens (which those pages hold).
// sm_scale < 0: 1 / sqrt(dc + dr). Returns o [total_q, H, dc] and lse
// [total_q, H]. InvalidArgument naming the argument on inconsistent input.
Result mla_paged(const TensorView& q_nope, const TensorView& q_pe, const TensorView& ckv_cache,
                 const TensorView& kpe_cache, std::span<const int32_t> qo_indptr, std::span<const int32_t> kv_indptr,
                 std::span<const int32_t> kv_indices, std::span<const int32_t> kv_lens, bool causal,
                 double sm_scale = -1.0);

}  // namespace tessera::reference
