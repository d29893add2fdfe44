// Opaque CUtensorMap (128 bytes, 128-aligned as CUDA 13 declares it): the
// host encodes it (runtime/tensor_map.hpp), the Hopper kernel reads it from a
// __grid_constant__ parameter (device/arch/tma.cuh); neither needs the driver
// header.
#pragma once

namespace tessera {

struct alignas(128) TensorMap {
  unsigned long long bits[16];
};

}  // namespace tessera
