// The `extra` block of a kernel parameter struct when the variant declares no
// extra scalars or tensors (XxxParams<NoExtra>); the host sizes the fixed
// head of every parameter block with it (runtime/variant_params.hpp).
#pragma once

namespace tessera {

struct NoExtra {
  int unused;
};

}  // namespace tessera
