// Host side of the TMA: tensor maps (CUtensorMap) for tile loads, encoded
// through the driver entry point the CUDA runtime hands out, so the library
// does not link the driver library itself.
#pragma once
#include <cstdint>

#include "tessera/abi/tensor_map.cuh"

namespace tessera::tma {

// A rank-3 map over a 16-bit [heads][tokens][head_dim] view with any token
// and head strides (elements), read in boxes of 64 features x box_rows
// tokens x 1 head into 128-byte-swizzled shared memory (the wgmma operand
// layout). Returns false where the TMA cannot describe the view (base not
// 16-byte aligned, strides not multiples of 16 bytes, no driver support):
// callers fall back to cp.async gathers.
bool encode_kv_tiles(TensorMap& out, const void* base, int64_t tokens, int64_t heads, int64_t head_dim,
                     int64_t token_stride, int64_t head_stride, int box_rows);

// A rank-4 map over a 16-bit query tensor [tokens][kv_heads * group][head_dim]
// (token and head strides in elements) read in boxes of 64 features x the
// group's heads x 1 kv head x box_rows / group tokens: box_rows fused query
// rows (row = token * group + head in group), the Hopper kernel's Q tile.
// False where the TMA cannot describe it (as above, or group not dividing
// box_rows).
bool encode_q_tiles(TensorMap& out, const void* base, int64_t tokens, int64_t kv_heads, int64_t group,
                    int64_t head_dim, int64_t token_stride, int64_t head_stride, int box_rows);

}  // namespace tessera::tma
