// Fused Llama-style RoPE on q (at q_pos = qo_idx + kv_len - qo_len) and k (at
// kv_idx) before q.k, over the whole head dimension, with the rotation of
// device/primitives/rope.cuh. Pairs: Pairing::kHalves (j, j + HeadDim / 2) or
// Pairing::kAdjacent (2j, 2j + 1, interleaved). Extra float32 scalars
// rope_scale, rope_theta. Base: the variant it rotates for (e.g. a custom mask).
#pragma once
#include "tessera/device/primitives/rope.cuh"
#include "tessera/device/primitives/variant.cuh"

namespace tessera::variants {

template <Pairing P, int HeadDim, typename Base = VariantBase>
struct Rope : Base {
  static_assert(P == Pairing::kHalves || P == Pairing::kAdjacent, "RoPE rotates pairs of features");
  static constexpr Pairing pairing = P;
  static constexpr bool kInterleave = P == Pairing::kAdjacent;
  RopeFreqs freqs;
  template <typename Params>
  __device__ __forceinline__ Rope(const Params& p, int b, int qo_len_, int kv_len_)
      : Base(p, b, qo_len_, kv_len_), freqs(p.extra.rope_scale, p.extra.rope_theta, HeadDim) {}
  template <typename Params>
  __device__ __forceinline__ float QueryTransform(const Params&, float q, float partner, int, int qo_idx, int,
                                                  int feat) const {
    return rope_rotate<kInterleave>(freqs, q, partner, qo_idx + this->kv_len - this->qo_len, feat, HeadDim);
  }
  template <typename Params>
  __device__ __forceinline__ float KeyTransform(const Params&, float k, float partner, int, int kv_idx, int,
                                                int feat) const {
    return rope_rotate<kInterleave>(freqs, k, partner, kv_idx, feat, HeadDim);
  }
};

}  // namespace tessera::variants
