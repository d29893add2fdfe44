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

}  // namespace

bool encode_kv_tiles(TensorMap& out, const void* base, int64_t tokens, int64_t heads, int64_t head_dim,
                     int64_t token_stride, int64_t head_stride, int box_rows) {
  constexpr int64_t kElem = 2;  // fp16 / bf16
  const auto addr = reinterpret_cast<uintptr_t>(base);
  if (base == nullptr || addr % 16 != 0 || head_dim % 64 != 0 || tokens <= 0 || heads <= 0) return false;
  const int64_t strides[2] = {token_stride * kElem, head_stride * kElem};
  for (int64_t s : strides)
    if (s <= 0 || s % 16 != 0 || s >= (int64_t{1} << 40)) return false;
  if (tokens > (int64_t{1} << 31) || box_rows < 1 || box_rows > 256) return false;
  auto encode = encoder();
  if (encode == nullptr) return false;
  const cuuint64_t dims[3] = {static_cast<cuuint64_t>(head_dim), static_cast<cuuint64_t>(tokens),
                              static_cast<cuuint64_t>(heads)};
  const cuuint64_t global_strides[2] = {static_cast<cuuint64_t>(strides[0]), static_cast<cuuint64_t>(strides[1])};
  const cuuint32_t box[3] = {64, static_cast<cuuint32_t>(box_rows), 1};
  const cuuint32_t elem_strides[3] = {1, 1, 1};
  const CUresult r = encode(reinterpret_cast<CUtensorMap*>(&out), CU_TENSOR_MAP_DATA_TYPE_UINT16, 3,
                            const_cast<void*>(base), dims, global_strides, box, elem_strides,
                            CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                            CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  return r == CUDA_SUCCESS;
}

bool encode_q_tiles(TensorMap& out, const void* base, int64_t tokens, int64_t kv_heads, int64_t group,
                    int64_t head_dim, int64_t token_stride, int64_t head_stride, int box_rows) {
  constexpr int64_t kElem = 2;  // fp16 / bf16
  const auto addr = reinterpret_cast<uintptr_t>(base);
  if (base == nullptr || addr % 16 != 0 || head_dim % 64 != 0 || tokens <= 0 || kv_heads <= 0 || group <= 0)
    return false;
  if (group > 256 || box_rows % group != 0 || box_rows / group < 1 || box_rows / group > 256) return false;
  const int64_t strides[3] = {head_stride * kElem, head_stride * group * kElem, token_stride * kElem};
  for (int64_t s : strides)
    if (s <= 0 || s % 16 != 0 || s >= (int64_t{1} << 40)) return false;
  if (tokens > (int64_t{1} << 31)) return false;
  auto encode = encoder();
  if (encode == nullptr) return false;
  const cuuint64_t dims[4] = {static_cast<cuuint64_t>(head_dim), static_cast<cuuint64_t>(group),
                              static_cast<cuuint64_t>(kv_heads), static_cast<cuuint64_t>(tokens)};
  const cuuint64_t global_strides[3] = {static_cast<cuuint64_t>(strides[0]), static_cast<cuuint64_t>(strides[1]),
                                        static_cast<cuuint64_t>(strides[2])};
  const cuuint32_t box[4] = {64, static_cast<cuuint32_t>(group), 1, static_cast<cuuint32_t>(box_rows / group)};
  const cuuint32_t elem_strides[4] = {1, 1, 1, 1};
  const CUresult r = encode(reinterpret_cast<CUtensorMap*>(&out), CU_TENSOR_MAP_DATA_TYPE_UINT16, 4,
                            const_cast<void*>(base), dims, global_strides, box, elem_strides,
                            CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                            CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  return r == CUDA_SUCCESS;
}

}  // namespace tessera::tma
