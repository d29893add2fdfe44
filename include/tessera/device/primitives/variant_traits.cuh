// Compile-time questions about a variant, so kernels only pay for the slots a
// variant actually overrides. A slot inherited from VariantBase has the type
// "pointer to member of VariantBase"; an overriding one names the variant.
#pragma once
#include "tessera/device/primitives/variant.cuh"

namespace tessera {

template <typename A, typename B> struct SameType { static constexpr bool value = false; };
template <typename A> struct SameType<A, A> { static constexpr bool value = true; };

template <typename V, typename P>
struct VariantTraits {
  static constexpr bool query_transform =
      !SameType<decltype(&V::template QueryTransform<P>), float (VariantBase::*)(const P&, float, int, int, int, int) const>::value;
  static constexpr bool key_transform =
      !SameType<decltype(&V::template KeyTransform<P>), float (VariantBase::*)(const P&, float, int, int, int, int) const>::value;
  static constexpr bool value_transform =
      !SameType<decltype(&V::template ValueTransform<P>), float (VariantBase::*)(const P&, float, int, int, int, int) const>::value;
  static constexpr bool logits_transform =
      !SameType<decltype(&V::template LogitsTransform<P>),
                float (VariantBase::*)(const P&, float, int, int, int, int, int) const>::value;
  static constexpr bool logits_mask =
      !SameType<decltype(&V::template LogitsMask<P>), bool (VariantBase::*)(const P&, int, int, int, int, int) const>::value;
};

}  // namespace tessera
