// The configurations a BatchPrefill's first plan may choose (internal
// header: prefill.cpp validates the tile override with it, and
// prefill_workspace.cpp sizes the workspace for the largest of them).
#pragma once
#include "tessera/api/prefill.hpp"
#include "tessera/runtime/prefill_catalog.hpp"

namespace tessera::detail {

// Calls fn(config) for every configuration a first plan may choose under
// opt: each query tile (only opt.cta_q if set) on each backend, with
// opt.tile applied where opt.backend allows that backend. Also how the tile
// and fp8_mma are validated before any plan (the GPU's arch: at the first).
template <typename Fn>
void each_candidate(const AttentionSpec& spec, const PrefillOptions& opt, Fn fn) {
  if (opt.fp8_mma) catalog::check_fp8_mma(spec, opt.backend != PrefillBackend::kFA2);
  for (int q : {8, 16, 32, 64, 128}) {
    if (opt.cta_q ? q != opt.cta_q : q == 8) continue;  // 8-row tiles only when asked for
    for (bool hopper : {false, true}) {
      if (hopper && !catalog::hopper_supported(spec, q)) continue;
      const bool allowed = opt.backend == PrefillBackend::kAuto || hopper == (opt.backend == PrefillBackend::kFA3);
      fn(catalog::prefill_config(spec, q, hopper, allowed ? opt.tile : PrefillTile{}, hopper && opt.fp8_mma));
    }
  }
}

}  // namespace tessera::detail
