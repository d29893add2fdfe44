// CPU reference attention with double accumulation: the oracle every GPU test
// compares against. Deliberately simple (no tiling, no online softmax): scores
// are materialized per query row, then softmax in double.
//
// Tensors are host TensorViews of float16 / bfloat16 / float32 (K and V also
// fp8: float8_e4m3fn, float8_e5m2) with the last dimension contiguous. Queries are ragged: q [total_q, num_qo_heads, head_dim]
// with qo indptr; qo head h reads KV head h / (num_qo_heads / num_kv_heads).
// LSE is returned in base 2 (see device/primitives/attention_state.cuh);
// a row that sees no key gets O = 0 and LSE = -inf.
#pragma once
#include <cstdint>
#include <functional>
#include <optional>
#include <vector>

#include "tessera/core/tensor.hpp"
#include "tessera/formats/bsr.hpp"
#include "tessera/formats/paged_kv.hpp"
#include "tessera/formats/ragged.hpp"

namespace tessera::reference {

// Llama-style rotary embedding (see device/primitives/rope.cuh for the
// formula): the first rotary_dim features (all when < 0), pairs (j, j +
// rotary_dim / 2) or, interleaved, (2j, 2j + 1); pair j turns by
// pos / rope_scale * rope_theta^(-2j / rotary_dim) radians.
struct RopeOptions {
  bool interleave = false;
  double rope_scale = 1.0;
  double rope_theta = 1e4;
  int64_t rotary_dim = -1;
  // Llama 3.1 (Hugging Face's "llama3" rope_type): with wavelength w = 2 pi /
  // rope_theta^(-2j / rotary_dim), a pair keeps its frequency when w <
  // old_context_len / high_freq_factor, divides it by rope_scale when w >
  // old_context_len / low_freq_factor, and in between takes (1 - t) / rope_scale
  // + t of it, t = (old_context_len / w - low_freq_factor) / (high_freq_factor
  // - low_freq_factor).
  bool llama31 = false;
  double low_freq_factor = 1.0, high_freq_factor = 4.0, old_context_len = 8192.0;
};
// Rotates x[0 .. head_dim) (in place) as a row at position pos.
void rope_rotate(double* x, int64_t head_dim, double pos, const RopeOptions& opt);

// Where a logit sits, for Options::logits_fn. q_pos = qo_idx + kv_len - qo_len.
struct LogitContext {
  int64_t request, qo_idx, kv_idx, qo_head, kv_head, qo_len, kv_len;
};

struct Options {
  double sm_scale = -1.0;  // < 0: 1/sqrt(head_dim)
  // Causal, bottom-right aligned: query i of a request with q_len queries and
  // kv_len keys sees keys j <= i + kv_len - q_len.
  bool causal = false;
  // Custom mask: per request a row-major [q_len, kv_len] block of 0/1 bytes,
  // blocks concatenated in request order (FlashInfer's unpacked custom_mask).
  // Empty = no custom mask. Combined with causal by AND when both are set.
  std::vector<uint8_t> custom_mask;
  double logits_soft_cap = 0.0;  // > 0: logit = cap * tanh(logit / cap) (after sm_scale)
  // Sliding window (FlashInfer's window_left): >= 0: query i of a request sees
  // keys j >= i + kv_len - q_len - window_left; -1 = off. ANDed with causal
  // and the custom mask. Ragged and paged only.
  int window_left = -1;
  // Attention sink (Streaming-LLM), with window_left >= 0: keys j < sink_size
  // stay visible whatever the window says.
  int sink_size = 0;
  // ALiBi: logit += alibi_slopes[qo_head] * (kv_idx - q_pos) after the soft
  // cap, q_pos = qo_idx + kv_len - q_len. Empty = off; else one per qo head.
  std::vector<double> alibi_slopes;
  // Fused RoPE: q rotated at q_pos, k at kv_idx (its position in the request),
  // before q.k.
  std::optional<RopeOptions> rope;
  // Any further logits transform (a user variant's), applied last.
  std::function<double(double logit, const LogitContext&)> logits_fn;
  // FlashSigmoid: no softmax; o = sum over visible keys of
  // sigmoid(logit * sigmoid_scale + sigmoid_bias) v, lse = 0 for every row.
  bool flash_sigmoid = false;
  double sigmoid_scale = 1.0, sigmoid_bias = 0.0;
  // Dequantization scales (an fp8 cache's): K and V are read as stored value
  // times k_scale / v_scale, then everything runs on those values.
  double k_scale = 1.0, v_scale = 1.0;
};

struct Result {
  int64_t rows = 0, heads = 0, head_dim = 0;  // head_dim: the output's, V's (head_dim_vo)
  std::vector<double> o;    // [rows, heads, head_dim]
  std::vector<double> lse;  // [rows, heads], base 2
  double at(int64_t r, int64_t h, int64_t d) const { return o[(r * heads + h) * head_dim + d]; }
  double lse_at(int64_t r, int64_t h) const { return lse[r * heads + h]; }
};

// Ragged KV: k, v [total_kv, num_kv_heads, head_dim] with kv indptr (v may
// have a head dim of its own, head_dim_vo: o has it too); request i
// has queries qo[i] and keys/values kv[i].
Result attention_ragged(const TensorView& q, const RaggedIndex& qo, const TensorView& k,
                        const TensorView& v, const RaggedIndex& kv, const Options& opt = {});

// Paged KV cache (host storage).
Result attention_paged(const TensorView& q, const RaggedIndex& qo, const PagedKVCache& cache,
                       const Options& opt = {});

// Block-sparse: q [M, Hq, D]; k, v [N, Hkv, D]; query row m attends to the
// valid columns of its block row (in block order). The BSR matrix is the mask:
// `causal`, `custom_mask` and `window_left` are not allowed here (InvalidArgument).
// Position-dependent options (ALiBi, RoPE, logits_fn) see each block row as a
// request of Br queries over the keys it gathers, in block order (as the
// BatchPrefill kernels do).
Result attention_bsr(const TensorView& q, const BSRMatrix& bsr, const TensorView& k,
                     const TensorView& v, const Options& opt = {});

// Naive dense attention for one head of one request, straight from the
// formula (used to test the reference itself): q [n_q, d], k/v [n_kv, d],
// mask [n_q, n_kv] (1 = visible, empty = all visible). Returns O [n_q, d] and
// base-2 LSE [n_q].
void dense_attention(const std::vector<double>& q, const std::vector<double>& k,
                     const std::vector<double>& v, int64_t n_q, int64_t n_kv, int64_t d,
                     double sm_scale, const std::vector<uint8_t>& mask, std::vector<double>& o,
                     std::vector<double>& lse);

// apply_rope / apply_rope_pos_ids reference: x [nnz, heads, head_dim]
// (host, fp16/bf16/fp32) rotated row by row at positions pos[nnz]; returns
// [nnz, heads, head_dim] doubles.
std::vector<double> apply_rope(const TensorView& x, const std::vector<int64_t>& pos, const RopeOptions& opt);
// apply_rope_pos_ids_cos_sin_cache reference: pair j of a row at position p
// turns by the angle whose cosine is cache[p * rotary_dim + j] and sine
// cache[p * rotary_dim + rotary_dim / 2 + j] (cache [max_pos, rotary_dim]).
std::vector<double> apply_rope_cos_sin(const TensorView& x, const std::vector<int64_t>& pos,
                                       const std::vector<double>& cache, int64_t rotary_dim, bool interleave);

}  // namespace tessera::reference
