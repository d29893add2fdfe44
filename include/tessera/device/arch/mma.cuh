// Tensor-core matrix multiply-accumulate, m16n8k16 (sm_80+): D = A * B + D
// with fp16 or bf16 operands and fp32 accumulators.
//
// Fragment layouts (lane = 4 * group + quad, group = lane / 4, quad = lane % 4):
//   A (16x16, row-major) 4 regs: a0 = A[g][2q..2q+1], a1 = A[g+8][2q..], a2 = A[g][2q+8..], a3 = A[g+8][2q+8..]
//   B (16x8, "col-major": n-th column is a row of K) 2 regs: b0 = B[2q..2q+1][g], b1 = B[2q+8..][g]
//   C/D (16x8) 4 floats: c0,c1 = C[g][2q..2q+1], c2,c3 = C[g+8][2q..2q+1]
// A C fragment of two adjacent n-tiles, packed to 16-bit pairs, is exactly an
// A fragment of the next product (how P feeds P*V without shared memory).
#pragma once
#include "tessera/device/arch/numeric.cuh"

namespace tessera {

#if defined(__CUDACC__) || defined(__CUDACC_RTC__)

template <typename T> struct MmaType;
template <> struct MmaType<half_t> { static constexpr const char* name = "f16"; };
template <> struct MmaType<bf16_t> { static constexpr const char* name = "bf16"; };

__device__ __forceinline__ void mma_16816(float (&d)[4], const u32 (&a)[4], const u32 (&b)[2], half_t) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

__device__ __forceinline__ void mma_16816(float (&d)[4], const u32 (&a)[4], const u32 (&b)[2], bf16_t) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// The transpose of an 8x8 matrix of 16-bit values held one pair a lane in
// the C layout above (lane holds row g, columns 2q, 2q + 1): lane gets row
// g, columns 2q, 2q + 1 of the transpose (sm_75+). It turns a C fragment of
// keys x rows into the B fragment of the next product over those keys.
__device__ __forceinline__ u32 movmatrix_trans(u32 x) {
  u32 d;
  asm volatile("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;\n" : "=r"(d) : "r"(x));
  return d;
}

#endif

}  // namespace tessera
