// FlashInfer's sliding window: the query at bottom-right-aligned position p
// sees keys kv_idx >= p - WindowLeft. Declared (VariantBase::window_left)
// rather than written as a mask, so only tiles crossing the window's left
// edge pay for it and the planners never load the keys left of it. A
// composing template: SlidingWindow<W> alone, or on top of another variant
// (SlidingWindow<W, SoftCap<bits>>, a Gemma-2 layer); causal comes from the
// spec's declaration.
#pragma once
#include "tessera/device/variants/standard.cuh"

namespace tessera::variants {

template <int WindowLeft, typename Base = StandardAttention>
struct SlidingWindow : Base {
  static_assert(WindowLeft >= 0, "a window keeps WindowLeft >= 0 keys left of the diagonal");
  using Base::Base;
  static constexpr int window_left = WindowLeft;
};

}  // namespace tessera::variants
