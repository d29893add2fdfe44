// fp8 storage (OCP e4m3fn and e5m2, torch.float8_e4m3fn / float8_e5m2) and
// its conversions, for quantized KV caches: kernels load fp8 tiles (half the
// bytes of fp16) and widen them in registers right before the math.
//
// fp8 -> fp16 is exact for both formats, so values are widened in pairs to
// f16x2 words and then to float:
//   sm_89+  cvt.rn.f16x2.e4m3x2 / .e5m2x2, one instruction per pair;
//   sm_80   bit placement: an e5m2 byte is the top byte of the fp16 with the
//           same value; an e4m3 byte's exponent and mantissa shifted into an
//           fp16 read 2^-8 times the value (the exponent bias differs by 8),
//           which one exact f16x2 multiply by 256 corrects (subnormals too),
//           and the NaN code is patched to an fp16 NaN first.
// Both paths give the same values for every input (NaN for NaN).
//
// float -> fp8 (quantizing appends) rounds to nearest, ties to even, and
// saturates to the largest finite value (NaN stays NaN), as
// cvt.rn.satfinite on sm_89+; sm_80 computes the same rounding in software.
// The host's float_to_fp8 (core/dtype.hpp) is bit-exact with both.
#pragma once
#include "tessera/device/arch/numeric.cuh"

namespace tessera {

struct fp8_e4m3_t { u8 bits; };
struct fp8_e5m2_t { u8 bits; };
template <typename T> constexpr bool is_fp8 = false;
template <> constexpr bool is_fp8<fp8_e4m3_t> = true;
template <> constexpr bool is_fp8<fp8_e5m2_t> = true;

// Format constants (mantissa bits, exponent bias, largest finite code and value).
template <typename T> struct Fp8Traits;
template <> struct Fp8Traits<fp8_e4m3_t> {
  static constexpr bool kE4M3 = true;
  static constexpr int kMant = 3, kBias = 7;
  static constexpr u32 kMaxCode = 0x7e;
  static constexpr float kMax = 448.f;
};
template <> struct Fp8Traits<fp8_e5m2_t> {
  static constexpr bool kE4M3 = false;
  static constexpr int kMant = 2, kBias = 15;
  static constexpr u32 kMaxCode = 0x7b;
  static constexpr float kMax = 57344.f;
};

// The tensor-core operand type of a kernel with q of DQ and a cache of DKV:
// DKV for 16-bit caches, q's type for fp8 ones (widened on the way in).
template <typename DQ, typename DKV, bool = is_fp8<DKV>>
struct Fp8Operand {
  using type = DKV;
};
template <typename DQ, typename DKV>
struct Fp8Operand<DQ, DKV, true> {
  using type = DQ;
};

#if defined(__CUDACC__) || defined(__CUDACC_RTC__)

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
#define TESSERA_FP8_CVT 1  // this target has the fp8 cvt instructions
#else
#define TESSERA_FP8_CVT 0
#endif

__device__ __forceinline__ u32 byte_perm(u32 a, u32 b, u32 sel) {
  u32 d;
  asm("prmt.b32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(sel));
  return d;
}

// Bytes 0, 1 of x (selector 0x1404), or 2, 3 (0x3424), as the high bytes of
// the two 16-bit halves of a word, low byte first.
template <u32 SEL>
__device__ __forceinline__ u32 fp8_pair_high_bytes(u32 x) {
  return byte_perm(x, 0u, SEL);
}

// Elements 0, 1 (lo) and 2, 3 (hi) of four fp8 values packed in x (element
// i in byte i) as f16x2 words, element 0 / 2 in the low half.
template <typename T>
__device__ __forceinline__ void fp8x4_to_f16x2(u32 x, u32& lo, u32& hi) {
  static_assert(is_fp8<T>, "fp8 element type");
#if TESSERA_FP8_CVT
  if constexpr (Fp8Traits<T>::kE4M3)
    asm("{.reg .b16 l, h;\n mov.b32 {l, h}, %2;\n cvt.rn.f16x2.e4m3x2 %0, l;\n cvt.rn.f16x2.e4m3x2 %1, h;}"
        : "=r"(lo), "=r"(hi) : "r"(x));
  else
    asm("{.reg .b16 l, h;\n mov.b32 {l, h}, %2;\n cvt.rn.f16x2.e5m2x2 %0, l;\n cvt.rn.f16x2.e5m2x2 %1, h;}"
        : "=r"(lo), "=r"(hi) : "r"(x));
#else
  const u32 y0 = fp8_pair_high_bytes<0x1404>(x), y1 = fp8_pair_high_bytes<0x3424>(x);
  if constexpr (!Fp8Traits<T>::kE4M3) {
    lo = y0;
    hi = y1;
  } else {
    auto widen = [](u32 y) {
      // Sign in place, exponent and mantissa one bit lower: 2^-8 x the value.
      u32 h = (y & 0x80008000u) | ((y & 0x7f007f00u) >> 1);
      // 0x7f (exponent and mantissa all ones) is e4m3's NaN: +1 carries into
      // bit 15 of exactly those halves, which then get an fp16 NaN pattern.
      const u32 nan = ((y & 0x7f007f00u) + 0x01000100u) & 0x80008000u;
      h |= (nan >> 15) * 0x7e00u;
      u32 r;
      asm("mul.rn.f16x2 %0, %1, %2;" : "=r"(r) : "r"(h), "r"(0x5c005c00u));  // x 256 (2^8), exact
      return r;
    };
    lo = widen(y0);
    hi = widen(y1);
  }
#endif
}

// Four fp8 values packed in x as two 16-bit pairs of type H (half_t: the
// f16x2 words above; bf16_t: through float, exact since every e4m3 / e5m2
// value is a bf16 value), for tensor-core operands of q's type. A float
// holding an fp8 value has at most 4 significant bits, so its top 16 bits
// are that value's bf16: one byte permute packs a pair (a rounding
// conversion would cost a pass through the conversion unit per pair).
template <typename T, typename H>
__device__ __forceinline__ void fp8x4_to_16x2(u32 x, u32& lo, u32& hi) {
  fp8x4_to_f16x2<T>(x, lo, hi);
  if constexpr (!is_fp16<H>) {
    auto to_bf16x2 = [](u32 w) {
      float a, b;
      unpack2(w, a, b, half_t{});
      return byte_perm(__float_as_uint(a), __float_as_uint(b), 0x7632);  // a's top half low, b's high
    };
    lo = to_bf16x2(lo);
    hi = to_bf16x2(hi);
  }
}

// Four fp8 values packed in x (element i in byte i) as floats.
template <typename T>
__device__ __forceinline__ void fp8x4_to_float(u32 x, float* out) {
  u32 lo, hi;
  fp8x4_to_f16x2<T>(x, lo, hi);
  unpack2(lo, out[0], out[1], half_t{});
  unpack2(hi, out[2], out[3], half_t{});
}

template <typename T>
__device__ __forceinline__ float fp8_to_float(T x) {
  float f[4];
  fp8x4_to_float<T>(x.bits, f);
  return f[0];
}
__device__ __forceinline__ float to_float(fp8_e4m3_t x) { return fp8_to_float(x); }
__device__ __forceinline__ float to_float(fp8_e5m2_t x) { return fp8_to_float(x); }

// One float as fp8 bits (low byte of the result), rounded to nearest even and
// saturated; the sm_80 path of float_to_fp8x2.
template <typename T>
__device__ __forceinline__ u32 float_to_fp8_soft(float x) {
  using F = Fp8Traits<T>;
  if (x != x) return 0x7fu;
  const u32 sign = (__float_as_uint(x) >> 24) & 0x80u;
  const float a = fabsf(x);
  if (a >= F::kMax) return sign | F::kMaxCode;
  // The spacing of fp8 values around a is 2^(e - kMant), e = floor(log2 a),
  // subnormals sharing the smallest normal exponent 1 - kBias; scaling a by a
  // power of two is exact, so one round-to-nearest-even gives the code.
  const int e = max(static_cast<int>((__float_as_uint(a) >> 23) & 0xffu) - 127, 1 - F::kBias);
  const float scaled = a * __uint_as_float(static_cast<u32>(F::kMant - e + 127) << 23);
  const int code = ((e + F::kBias) << F::kMant) + __float2int_rn(scaled) - (1 << F::kMant);
  return sign | min(static_cast<u32>(code), F::kMaxCode);
}

// Two floats as two fp8 values, a in the low byte of the result's low 16 bits.
template <typename T>
__device__ __forceinline__ u32 float_to_fp8x2(float a, float b) {
  static_assert(is_fp8<T>, "fp8 element type");
#if TESSERA_FP8_CVT
  u16 r;
  // The first source goes to the upper byte.
  if constexpr (Fp8Traits<T>::kE4M3) asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(r) : "f"(b), "f"(a));
  else asm("cvt.rn.satfinite.e5m2x2.f32 %0, %1, %2;" : "=h"(r) : "f"(b), "f"(a));
  return r;
#else
  return float_to_fp8_soft<T>(a) | (float_to_fp8_soft<T>(b) << 8);
#endif
}

#endif

}  // namespace tessera
