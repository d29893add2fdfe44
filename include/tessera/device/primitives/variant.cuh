// Attention variants: the functor slots of the kernel skeleton (paper §3.2.3).
//
// A variant is a struct deriving from VariantBase that overrides any subset of
// the slots below. Kernels construct one variant object per (request, tile)
// with the kernel parameters, so a variant may precompute per-request values
// in its constructor (VariantBase keeps qo_len and kv_len). Every slot takes
// the kernel parameter block first (the variant's extra scalars and tensors
// live in params.extra), then the value, then the position indices:
//
//   QueryTransform (params, q, batch_idx, qo_idx, qo_head_idx, feat_idx) -> float
//   KeyTransform   (params, k, batch_idx, kv_idx, kv_head_idx, feat_idx) -> float
//     or, with `pairing` set (transforms that mix two features, e.g. RoPE),
//   QueryTransform (params, q, q_partner, batch_idx, qo_idx, qo_head_idx, feat_idx) -> float
//   KeyTransform   (params, k, k_partner, batch_idx, kv_idx, kv_head_idx, feat_idx) -> float
//     where the partner is the untransformed feature feat_idx ^ 1 (Pairing::
//     kAdjacent) or feat_idx ^ (head_dim / 2) (Pairing::kHalves) of the same row.
//   ValueTransform (params, v, batch_idx, kv_idx, kv_head_idx, feat_idx) -> float
//   LogitsTransform(params, logit, batch_idx, qo_idx, kv_idx, qo_head_idx, kv_head_idx) -> float
//   LogitsMask     (params, batch_idx, qo_idx, kv_idx, qo_head_idx, kv_head_idx) -> bool (true = keep)
//   LogitsMaskBits (params, batch_idx, qo_idx, kv_idx, qo_head_idx, kv_head_idx) -> u32, optional
//                beside LogitsMask: bit j answers LogitsMask for key kv_idx + j,
//                j < 32 (bits for keys past the request's end are ignored). The
//                tensor-core prefill kernels then ask once per 32 keys instead
//                of once per key (a packed custom mask: 2 word loads instead of
//                32 byte loads); every other kernel keeps calling LogitsMask.
//   OutputTransform(params, o, batch_idx, qo_idx, qo_head_idx, feat_idx) -> float
//   use_softmax: true  -> O = softmax(logits) V, LSE reported (base 2);
//                false -> O = sum_j logit_j V_j (e.g. FlashSigmoid), LSE = 0.
//   causal:      true  -> also mask keys after the bottom-right-aligned
//                diagonal (kv_idx > qo_idx + kv_len - qo_len). Declared rather
//                than written as a LogitsMask so kernels test it only on tiles
//                that cross the diagonal and skip the tiles above it.
//   window_left: >= 0 -> also mask keys left of the sliding window
//                (kv_idx < qo_idx + kv_len - qo_len - window_left); -1 = none.
//                Declared for the same reason: only tiles crossing the
//                window's left edge pay for the mask (and the planners, told
//                by VariantSpec::window_left, never load the keys left of it).
//
// The logit handed to LogitsTransform is q.k * sm_scale. qo_idx / kv_idx are
// positions within the request. Indices are ints; feat_idx is the position
// along the head dimension. A JIT-generated kernel also defines, in the
// variant's namespace, `Extra` (the variant's extra scalars and tensor
// pointers, read as params.extra.<name>) and `kHeadDim`.
#pragma once
#include "tessera/abi/variant_extra.cuh"
#include "tessera/device/arch/numeric.cuh"

namespace tessera {

#if defined(__CUDACC__) || defined(__CUDACC_RTC__)
#define TESSERA_VARIANT_FN __device__ __forceinline__
#else
#define TESSERA_VARIANT_FN inline
#endif

// How the Q/K transform slots see the head dimension. Pairwise transforms
// get each feature together with its partner, read before either is
// transformed, so a kernel can apply them in place (one thread owns a pair).
enum class Pairing : int {
  kNone,      // element-wise slots
  kAdjacent,  // features f and f ^ 1 (interleaved RoPE)
  kHalves,    // features f and f ^ (head_dim / 2) (half-split RoPE)
};

// Distance (as an XOR mask) between a feature and its partner.
template <Pairing P, int HEAD_DIM>
struct PairStride {
  static constexpr int value = P == Pairing::kAdjacent ? 1 : (P == Pairing::kHalves ? HEAD_DIM / 2 : 0);
};

struct VariantBase {
  static constexpr bool use_softmax = true;
  static constexpr bool causal = false;
  static constexpr int window_left = -1;
  static constexpr Pairing pairing = Pairing::kNone;
  int qo_len;
  int kv_len;

  template <typename Params>
  TESSERA_VARIANT_FN VariantBase(const Params&, int /*batch_idx*/, int qo_len_, int kv_len_)
      : qo_len(qo_len_), kv_len(kv_len_) {}

  template <typename Params>
  TESSERA_VARIANT_FN float QueryTransform(const Params&, float q, int, int, int, int) const { return q; }
  template <typename Params>
  TESSERA_VARIANT_FN float KeyTransform(const Params&, float k, int, int, int, int) const { return k; }
  // Pair forms (called instead of the above when pairing != kNone).
  template <typename Params>
  TESSERA_VARIANT_FN float QueryTransform(const Params&, float q, float, int, int, int, int) const { return q; }
  template <typename Params>
  TESSERA_VARIANT_FN float KeyTransform(const Params&, float k, float, int, int, int, int) const { return k; }
  template <typename Params>
  TESSERA_VARIANT_FN float ValueTransform(const Params&, float v, int, int, int, int) const { return v; }
  template <typename Params>
  TESSERA_VARIANT_FN float LogitsTransform(const Params&, float logit, int, int, int, int, int) const {
    return logit;
  }
  template <typename Params>
  TESSERA_VARIANT_FN bool LogitsMask(const Params&, int, int, int, int, int) const { return true; }
  template <typename Params>
  TESSERA_VARIANT_FN u32 LogitsMaskBits(const Params&, int, int, int, int, int) const { return ~0u; }
  template <typename Params>
  TESSERA_VARIANT_FN float OutputTransform(const Params&, float o, int, int, int, int) const { return o; }
};

// The declared masks' one rule, in key positions. Bottom-right alignment puts
// query qo_idx of a request (qo_len queries, kv_len keys) on the diagonal key
// diag = qo_idx + kv_len - qo_len: a causal variant keeps keys <= diag, a
// window keeps keys >= window_first_key<Variant>(diag). Every kernel and
// mask test goes through these, so the rule is written once.
TESSERA_VARIANT_FN int diagonal_key(int qo_idx, int qo_len, int kv_len) { return qo_idx + kv_len - qo_len; }
template <typename Variant>
TESSERA_VARIANT_FN int window_first_key(int diag) {
  return diag - Variant::window_left;
}

}  // namespace tessera
