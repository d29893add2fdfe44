// ldmatrix (sm_75+): a warp loads 8x8 16-bit matrices from shared memory into
// the fragment layout the tensor cores expect. Lane i supplies the row address
// of row (i % 8) of matrix (i / 8); each lane receives one 32-bit register per
// matrix. The .trans form transposes each 8x8 matrix (V as a B operand).
#pragma once
#include "tessera/device/arch/cp_async.cuh"

namespace tessera {

#if defined(__CUDACC__) || defined(__CUDACC_RTC__)

// Shared-space byte addresses (32-bit): the form hot loops should use, so
// per-thread offsets cost one register each instead of a 64-bit pointer.
__device__ __forceinline__ void ldmatrix_x4(u32 (&r)[4], u32 row_addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(row_addr));
}

__device__ __forceinline__ void ldmatrix_x4_trans(u32 (&r)[4], u32 row_addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(row_addr));
}

// stmatrix (sm_90+): the inverse of ldmatrix_x4, lane i giving the address of
// row (i % 8) of matrix (i / 8) and register j of matrix j.
__device__ __forceinline__ void stmatrix_x4(u32 row_addr, const u32 (&r)[4]) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1,%2,%3,%4};\n" ::"r"(row_addr), "r"(r[0]), "r"(r[1]),
               "r"(r[2]), "r"(r[3]));
#else
  __trap();
#endif
}

__device__ __forceinline__ void ldmatrix_x4(u32 (&r)[4], const void* row_addr) { ldmatrix_x4(r, smem_addr(row_addr)); }
__device__ __forceinline__ void ldmatrix_x4_trans(u32 (&r)[4], const void* row_addr) {
  ldmatrix_x4_trans(r, smem_addr(row_addr));
}

#endif

}  // namespace tessera
