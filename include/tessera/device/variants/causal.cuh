// Bottom-right aligned causal attention: the last query sees every key.
// Declared (VariantBase::causal) rather than written as a mask, so kernels
// skip the tiles above the diagonal and test it only on tiles crossing it.
#pragma once
#include "tessera/device/primitives/variant.cuh"

namespace tessera::variants {

struct CausalAttention : VariantBase {
  using VariantBase::VariantBase;
  static constexpr bool causal = true;
};

}  // namespace tessera::variants
