// Compile-time questions about a variant, so kernels only pay for the slots a
// variant actually overrides, and the calls that pick a Q/K transform's
// element-wise or pairwise form (see Pairing in variant.cuh).
//
// A slot inherited from VariantBase is a member of VariantBase; an overriding
// one is a member of the variant. QueryTransform and KeyTransform have two
// overloads each (element and pair form), so the owner is found by deducing
// the class of a member pointer of one exact signature.
#pragma once
#include "tessera/device/arch/vector_io.cuh"
#include "tessera/device/primitives/variant.cuh"

namespace tessera {

template <typename A, typename B> struct SameType { static constexpr bool value = false; };
template <typename A> struct SameType<A, A> { static constexpr bool value = true; };

// SlotOwner<P>::xxx(&V::template Slot<P>) has the type of the class that
// declares the overload of that signature (never called, only decltype'd).
template <typename P>
struct SlotOwner {
  template <typename C> static C element(float (C::*)(const P&, float, int, int, int, int) const);
  template <typename C> static C pair(float (C::*)(const P&, float, float, int, int, int, int) const);
  template <typename C> static C logits(float (C::*)(const P&, float, int, int, int, int, int) const);
  template <typename C> static C mask(bool (C::*)(const P&, int, int, int, int, int) const);
  template <typename C> static C mask_bits(u32 (C::*)(const P&, int, int, int, int, int) const);
};

// Whether V overrides QueryTransform / KeyTransform in the form its pairing
// selects (only that form is ever looked up: a pair variant need not have an
// element form and vice versa).
template <typename V, typename P, Pairing PAIRING = V::pairing>
struct QKOverride {
  static constexpr bool query = !SameType<decltype(SlotOwner<P>::pair(&V::template QueryTransform<P>)), VariantBase>::value;
  static constexpr bool key = !SameType<decltype(SlotOwner<P>::pair(&V::template KeyTransform<P>)), VariantBase>::value;
};
template <typename V, typename P>
struct QKOverride<V, P, Pairing::kNone> {
  static constexpr bool query = !SameType<decltype(SlotOwner<P>::element(&V::template QueryTransform<P>)), VariantBase>::value;
  static constexpr bool key = !SameType<decltype(SlotOwner<P>::element(&V::template KeyTransform<P>)), VariantBase>::value;
};

template <typename V, typename P>
struct VariantTraits {
  static constexpr bool query_transform = QKOverride<V, P>::query;
  static constexpr bool key_transform = QKOverride<V, P>::key;
  static constexpr bool value_transform =
      !SameType<decltype(SlotOwner<P>::element(&V::template ValueTransform<P>)), VariantBase>::value;
  static constexpr bool logits_transform =
      !SameType<decltype(SlotOwner<P>::logits(&V::template LogitsTransform<P>)), VariantBase>::value;
  static constexpr bool logits_mask = !SameType<decltype(SlotOwner<P>::mask(&V::template LogitsMask<P>)), VariantBase>::value;
  // LogitsMaskBits counts only beside a LogitsMask of the variant's own.
  static constexpr bool logits_mask_bits =
      logits_mask && !SameType<decltype(SlotOwner<P>::mask_bits(&V::template LogitsMaskBits<P>)), VariantBase>::value;
};

#if defined(__CUDACC__) || defined(__CUDACC_RTC__)
// The transformed value of feature `feat` of a query (key) row whose partner
// feature holds `partner` (ignored by element-wise variants).
template <typename V, typename P>
__device__ __forceinline__ float apply_query_transform(const V& v, const P& p, float x, float partner, int b, int qo_idx,
                                                       int qo_head, int feat) {
  if constexpr (V::pairing == Pairing::kNone) return v.QueryTransform(p, x, b, qo_idx, qo_head, feat);
  else return v.QueryTransform(p, x, partner, b, qo_idx, qo_head, feat);
}
template <typename V, typename P>
__device__ __forceinline__ float apply_key_transform(const V& v, const P& p, float x, float partner, int b, int kv_idx,
                                                     int kv_head, int feat) {
  if constexpr (V::pairing == Pairing::kNone) return v.KeyTransform(p, x, b, kv_idx, kv_head, feat);
  else return v.KeyTransform(p, x, partner, b, kv_idx, kv_head, feat);
}

// Q/K transforms of the features [feat0, feat0 + VEC) of one row that a
// thread holds in registers (decode and row-wise kernels). `row` points at
// the row's feature 0 in memory (global or shared): a kHalves pairing reads
// the partner features from there; kAdjacent partners are in x itself.
template <Pairing PAIRING, int HEAD_DIM, int VEC, typename T>
__device__ __forceinline__ void load_partners(const float (&x)[VEC], const T* row, int feat0, float (&partner)[VEC]) {
  if constexpr (PAIRING == Pairing::kHalves) {
    static_assert((HEAD_DIM / 2) % VEC == 0, "a vector's partners must form one vector");
    load_vec<VEC>(row + (feat0 ^ (HEAD_DIM / 2)), partner);
  } else {
    static_assert(PAIRING == Pairing::kNone || VEC % 2 == 0, "adjacent pairs must lie in one vector");
#pragma unroll
    for (int i = 0; i < VEC; ++i) partner[i] = x[PAIRING == Pairing::kAdjacent ? (i ^ 1) : i];
  }
}
// KEY: KeyTransform at (kv_idx = idx, kv_head = head), else QueryTransform at (qo_idx, qo_head).
template <bool KEY, typename V, int HEAD_DIM, int VEC, typename T, typename P>
__device__ __forceinline__ void transform_vec(const V& v, const P& p, float (&x)[VEC], const T* row, int feat0, int b,
                                              int idx, int head) {
  float partner[VEC];
  load_partners<V::pairing, HEAD_DIM>(x, row, feat0, partner);
#pragma unroll
  for (int i = 0; i < VEC; ++i)
    x[i] = KEY ? apply_key_transform(v, p, x[i], partner[i], b, idx, head, feat0 + i)
               : apply_query_transform(v, p, x[i], partner[i], b, idx, head, feat0 + i);
}
template <typename V, int HEAD_DIM, int VEC, typename T, typename P>
__device__ __forceinline__ void transform_query_vec(const V& v, const P& p, float (&x)[VEC], const T* row, int feat0,
                                                    int b, int qo_idx, int qo_head) {
  transform_vec<false, V, HEAD_DIM>(v, p, x, row, feat0, b, qo_idx, qo_head);
}
template <typename V, int HEAD_DIM, int VEC, typename T, typename P>
__device__ __forceinline__ void transform_key_vec(const V& v, const P& p, float (&x)[VEC], const T* row, int feat0,
                                                  int b, int kv_idx, int kv_head) {
  transform_vec<true, V, HEAD_DIM>(v, p, x, row, feat0, b, kv_idx, kv_head);
}
#endif

}  // namespace tessera
