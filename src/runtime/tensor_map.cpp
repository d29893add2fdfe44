#include "tessera/runtime/tensor_map.hpp"

#include <cuda.h>
#include <cuda_runtime.h>
#include <cudaTypedefs.h>


namespace tessera::tma {

static_assert(sizeof(TensorMap) == sizeof(CUtensorMap) && alignof(TensorMap) == alignof(CUtensorMap),
              "TensorMap mirrors CUtensorMap");

namespace {

PFN_cuTensorMapEncodeTiled_v12000 encoder() {
  static PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult status{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault, &status) !=
            cudaSuccess ||
        status != cudaDriverEntryPointSuccess)
      p = nullptr;
    (void)cudaGetLastError();  // a missing entry point is not an error of the caller's next call
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(p);
  }();
  return fn;
}

// A 16-bit tensor of RANK dims (dims[0] = head_dim, contiguous; the others
// with byte strides in elements `strides`), read in boxes `box` into
// 128-byte-swizzled shared memory. The checks every map needs: base 16-byte
// aligned, head_dim whole 64-feature boxes, dims and boxes in range, strides
// positive multiples of 16 bytes below 2^40 bytes.
template <int RANK>
bool encode_tiled(TensorMap& out, const void* base, const int64_t (&dims)[RANK], const int64_t (&strides)[RANK - 1],
                  const int64_t (&box)[RANK]) {
  constexpr int64_t kElem = 2;  // fp16 / bf16
  if (base == nullptr || reinterpret_cast<uintptr_t>(base) % 16 != 0 || dims[0] % 64 != 0) return false;
  cuuint64_t gdims[RANK], gstrides[RANK - 1];
  cuuint32_t gbox[RANK], elem_strides[RANK];
  for (int i = 0; i < RANK; ++i) {
    if (dims[i] <= 0 || dims[i] > (int64_t{1} << 31) || box[i] < 1 || box[i] > 256) return false;
    gdims[i] = static_cast<cuuint64_t>(dims[i]);
    gbox[i] = static_cast<cuuint32_t>(box[i]);
    elem_strides[i] = 1;
  }
  for (int i = 0; i < RANK - 1; ++i) {
    const int64_t bytes = strides[i] * kElem;
    if (bytes <= 0 || bytes % 16 != 0 || bytes >= (int64_t{1} << 40)) return false;
    gstrides[i] = static_cast<cuuint64_t>(bytes);
  }
  auto encode = encoder();
  if (encode == nullptr) return false;
  const CUresult r = encode(reinterpret_cast<CUtensorMap*>(&out), CU_TENSOR_MAP_DATA_TYPE_UINT16, RANK,
                            const_cast<void*>(base), gdims, gstrides, gbox, elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
                            CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                            CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  return r == CUDA_SUCCESS;
}

}  // namespace

bool encode_kv_tiles(TensorMap& out, const void* base, int64_t tokens, int64_t heads, int64_t head_dim,
                     int64_t token_stride, int64_t head_stride, int box_rows) {
  return encode_tiled<3>(out, base, {head_dim, tokens, heads}, {token_stride, head_stride}, {64, box_rows, 1});
}

bool encode_q_tiles(TensorMap& out, const void* base, int64_t tokens, int64_t kv_heads, int64_t group,
                    int64_t head_dim, int64_t token_stride, int64_t head_stride, int box_rows) {
  if (group <= 0 || box_rows % group != 0) return false;
  return encode_tiled<4>(out, base, {head_dim, group, kv_heads, tokens},
                         {head_stride, head_stride * group, token_stride}, {64, group, 1, box_rows / group});
}

}  // namespace tessera::tma
