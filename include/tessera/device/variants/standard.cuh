// Plain softmax attention: every slot of VariantBase as it is.
#pragma once
#include "tessera/device/primitives/variant.cuh"

namespace tessera::variants {

struct StandardAttention : VariantBase {
  using VariantBase::VariantBase;
};

}  // namespace tessera::variants
