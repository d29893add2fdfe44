// Vectorized global/shared memory access: N elements of an 8-, 16- or 32-bit
// type moved in one instruction of N*sizeof(T) bytes (2 to 16; wider runs are
// split into 16-byte accesses), converted to/from float registers; fp8 is
// widened in packed pairs (arch/fp8.cuh). Callers guarantee alignment to the
// access width (16 bytes for the wider runs).
#pragma once
#include "tessera/device/arch/fp8.cuh"
#include "tessera/device/arch/numeric.cuh"

namespace tessera {

#if defined(__CUDACC__) || defined(__CUDACC_RTC__)

// Raw bytes of one vector access.
template <int BYTES> struct VecBits;
template <> struct VecBits<2> { typedef u16 type; };
template <> struct VecBits<4> { typedef u32 type; };
template <> struct VecBits<8> { typedef uint2 type; };
template <> struct VecBits<16> { typedef uint4 type; };

// Loads N consecutive elements of T at p into float registers.
template <int N, typename T>
__device__ __forceinline__ void load_vec(const T* p, float (&out)[N]) {
  constexpr int kBytes = N * static_cast<int>(sizeof(T));
  if constexpr (kBytes > 16) {
    static_assert(kBytes % 16 == 0, "wide vector accesses are whole 16-byte pieces");
    constexpr int kPiece = 16 / static_cast<int>(sizeof(T));
#pragma unroll
    for (int c = 0; c < N / kPiece; ++c) load_vec<kPiece>(p + c * kPiece, reinterpret_cast<float(&)[kPiece]>(out[c * kPiece]));
  } else if constexpr (is_fp8<T>) {
    static_assert(kBytes == 2 || kBytes == 4 || kBytes == 8 || kBytes == 16, "vector access must be 2, 4, 8 or 16 bytes");
    union { typename VecBits<kBytes>::type raw; u32 words[(kBytes + 3) / 4]; } u;
    if constexpr (kBytes == 2) u.words[0] = 0;  // the upper half is widened and dropped
    u.raw = *reinterpret_cast<const typename VecBits<kBytes>::type*>(p);
    if constexpr (kBytes == 2) {
      float f[4];
      fp8x4_to_float<T>(u.words[0], f);
      out[0] = f[0];
      out[1] = f[1];
    } else {
#pragma unroll
      for (int w = 0; w < kBytes / 4; ++w) fp8x4_to_float<T>(u.words[w], &out[4 * w]);
    }
  } else {
    static_assert(kBytes == 4 || kBytes == 8 || kBytes == 16, "vector access must be 4, 8 or 16 bytes");
    union { typename VecBits<kBytes>::type raw; T elem[N]; } u;
    u.raw = *reinterpret_cast<const typename VecBits<kBytes>::type*>(p);
#pragma unroll
    for (int i = 0; i < N; ++i) out[i] = to_float(u.elem[i]);
  }
}

// Stores N float registers as consecutive elements of T (16- or 32-bit) at p.
template <int N, typename T>
__device__ __forceinline__ void store_vec(T* p, const float (&in)[N]) {
  constexpr int kBytes = N * static_cast<int>(sizeof(T));
  if constexpr (kBytes > 16) {
    static_assert(kBytes % 16 == 0, "wide vector accesses are whole 16-byte pieces");
    constexpr int kPiece = 16 / static_cast<int>(sizeof(T));
#pragma unroll
    for (int c = 0; c < N / kPiece; ++c)
      store_vec<kPiece>(p + c * kPiece, reinterpret_cast<const float(&)[kPiece]>(in[c * kPiece]));
  } else {
    static_assert(kBytes == 4 || kBytes == 8 || kBytes == 16, "vector access must be 4, 8 or 16 bytes");
    union { typename VecBits<kBytes>::type raw; T elem[N]; } u;
#pragma unroll
    for (int i = 0; i < N; ++i) u.elem[i] = from_float<T>(in[i]);
    *reinterpret_cast<typename VecBits<kBytes>::type*>(p) = u.raw;
  }
}

// The raw 16 bytes at p (16-byte aligned), converted later by unpack_vec:
// a kernel that keeps its loads raw can issue all of them before the first
// conversion waits on one.
__device__ __forceinline__ uint4 load16(const void* p) { return *reinterpret_cast<const uint4*>(p); }

// The 16 bytes of raw as N = 16 / sizeof(T) float registers.
template <int N, typename T>
__device__ __forceinline__ void unpack_vec(const uint4& raw, float (&out)[N]) {
  static_assert(N * sizeof(T) == 16, "a 16-byte vector");
  union { uint4 raw; T elem[N]; } u;
  u.raw = raw;
#pragma unroll
  for (int i = 0; i < N; ++i) out[i] = to_float(u.elem[i]);
}

// Two floats as two consecutive 16-bit elements of T, in one 32-bit word.
template <typename T>
__device__ __forceinline__ u32 pack_pair(float x, float y) {
  static_assert(sizeof(T) == 2, "16-bit element type");
  union { u32 raw; T elem[2]; } u;
  u.elem[0] = from_float<T>(x);
  u.elem[1] = from_float<T>(y);
  return u.raw;
}

#endif

}  // namespace tessera
