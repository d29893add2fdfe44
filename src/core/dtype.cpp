// Host fp16 / bf16 / fp8 <-> float conversions, bit-exact with the device's
// cvt.rn.* instructions (round to nearest, ties to even; fp8 saturating as
// cvt.rn.satfinite), so the reference and the tests see exactly the values a
// kernel would store.
#include "tessera/core/dtype.hpp"

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>
#include <string>

#include "tessera/core/error.hpp"

namespace tessera {

namespace {

constexpr uint32_t kF32SignMask = 0x80000000u;
constexpr uint32_t kF32AbsMask = 0x7fffffffu;
constexpr uint32_t kF32Inf = 0x7f800000u;

// Shifts `mant` right by `shift` (1..31) rounding to nearest, ties to even.
uint32_t shift_right_rne(uint32_t mant, int shift) {
  uint32_t kept = mant >> shift;
  uint32_t rem = mant & ((1u << shift) - 1u);
  uint32_t half = 1u << (shift - 1);
  if (rem > half || (rem == half && (kept & 1u))) ++kept;
  return kept;
}

[[noreturn]] void unsupported(DType t) {
  throw TypeMismatch(std::string("dtype: expected float16, bfloat16, float32, float8_e4m3fn or float8_e5m2, got ") +
                     dtype_name(t));
}

// An fp8 format: mantissa bits, exponent bias, the largest finite code.
// e4m3 (fn) has no infinities and one NaN code per sign (0x7f); e5m2 is
// IEEE-like (exponent 31: infinity or NaN).
struct Fp8Format {
  int mant, bias;
  uint8_t max_code;
};

Fp8Format fp8_format(DType t) {
  if (t == DType::kFloat8E4M3) return {3, 7, 0x7e};
  if (t == DType::kFloat8E5M2) return {2, 15, 0x7b};
  unsupported(t);
}

}  // namespace

float half_to_float(uint16_t h) {
  uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  uint32_t bits;
  if (exp == 0x1f) {
    // Inf / NaN: keep the payload in the top mantissa bits (quiet bit stays quiet).
    bits = sign | kF32Inf | (mant << 13);
  } else if (exp != 0) {
    bits = sign | ((exp + (127 - 15)) << 23) | (mant << 13);
  } else {
    // Zero or subnormal: value = mant * 2^-24, exactly representable in float.
    float mag = std::ldexp(static_cast<float>(mant), -24);
    bits = sign | std::bit_cast<uint32_t>(mag);
  }
  return std::bit_cast<float>(bits);
}

uint16_t float_to_half(float f) {
  uint32_t x = std::bit_cast<uint32_t>(f);
  uint16_t sign = static_cast<uint16_t>((x & kF32SignMask) >> 16);
  uint32_t a = x & kF32AbsMask;
  if (a > kF32Inf) {
    // NaN: force the quiet bit so a payload living only in the low bits
    // cannot collapse into infinity.
    return static_cast<uint16_t>(sign | 0x7e00u | ((a >> 13) & 0x3ffu));
  }
  // 65520 is the midpoint between 65504 (max half, odd mantissa) and 2^16:
  // ties-to-even rounds it, and everything above, to infinity.
  if (a >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);
  if (a >= 0x38800000u) {
    // Normal half (>= 2^-14). Rebias the exponent, then round away 13 bits;
    // a mantissa carry correctly bumps the exponent.
    uint32_t rebased = a - ((127u - 15u) << 23);
    return static_cast<uint16_t>(sign | shift_right_rne(rebased, 13));
  }
  // 2^-25 is the midpoint between 0 and the smallest subnormal 2^-24; it
  // rounds to even (zero), as does everything below it.
  if (a <= 0x33000000u) return sign;
  // Subnormal half: the value in units of 2^-24 is mant * 2^(e - 126), with
  // the implicit leading one restored; e <= 112 so the shift is 14..24.
  uint32_t e = a >> 23;
  uint32_t mant = (a & 0x7fffffu) | 0x800000u;
  return static_cast<uint16_t>(sign | shift_right_rne(mant, static_cast<int>(126u - e)));
}

float bf16_to_float(uint16_t h) { return std::bit_cast<float>(static_cast<uint32_t>(h) << 16); }

uint16_t float_to_bf16(float f) {
  uint32_t x = std::bit_cast<uint32_t>(f);
  if ((x & kF32AbsMask) > kF32Inf) {
    // NaN: truncate and set the quiet bit so the result stays a NaN.
    return static_cast<uint16_t>((x >> 16) | 0x0040u);
  }
  // bf16 is the top half of a float; adding 0x7fff plus the lowest kept bit
  // rounds to nearest-even, and overflow carries naturally into infinity.
  uint32_t rounded = x + 0x7fffu + ((x >> 16) & 1u);
  return static_cast<uint16_t>(rounded >> 16);
}

float fp8_to_float(uint8_t x, DType t) {
  const Fp8Format f = fp8_format(t);
  const bool neg = x & 0x80u;
  const int exp = (x & 0x7f) >> f.mant, mant = x & ((1 << f.mant) - 1);
  const int max_exp = (1 << (7 - f.mant)) - 1;
  if (t == DType::kFloat8E4M3 && (x & 0x7f) == 0x7f) return std::numeric_limits<float>::quiet_NaN();
  if (t == DType::kFloat8E5M2 && exp == max_exp)
    return mant ? std::numeric_limits<float>::quiet_NaN() : (neg ? -INFINITY : INFINITY);
  // Subnormal: mant * 2^(1 - bias - mant_bits); normal: (2^mant_bits + mant) * 2^(exp - bias - mant_bits).
  const float mag = exp == 0 ? std::ldexp(static_cast<float>(mant), 1 - f.bias - f.mant)
                             : std::ldexp(static_cast<float>((1 << f.mant) + mant), exp - f.bias - f.mant);
  return neg ? -mag : mag;
}

float fp8_max(DType t) { return fp8_to_float(fp8_format(t).max_code, t); }

uint8_t float_to_fp8(float x, DType t) {
  const Fp8Format f = fp8_format(t);
  if (std::isnan(x)) return 0x7f;
  const uint8_t sign = std::signbit(x) ? 0x80 : 0;
  const double a = std::fabs(static_cast<double>(x));
  if (a >= fp8_max(t)) return sign | f.max_code;  // satfinite, infinities included
  if (a == 0) return sign;
  // The spacing of representable values around a: 2^(e - mant) for a in
  // [2^e, 2^(e+1)), subnormals sharing the smallest normal exponent's.
  int e2 = 0;
  std::frexp(a, &e2);  // a = fr * 2^e2, fr in [0.5, 1)
  const int e = std::max(e2 - 1, 1 - f.bias);
  const double q = std::nearbyint(std::ldexp(a, f.mant - e));  // exact scaling; ties to even
  // q in [0, 2^(mant+1)]: the sum carries into the exponent field by itself,
  // and a subnormal (e = 1 - bias, q < 2^mant) lands in exponent field 0.
  const int code = ((e + f.bias) << f.mant) + static_cast<int>(q) - (1 << f.mant);
  return sign | static_cast<uint8_t>(std::min<int>(code, f.max_code));
}

float load_as_float(const void* base, DType t, size_t i) {
  switch (t) {
    case DType::kFloat16: return half_to_float(static_cast<const uint16_t*>(base)[i]);
    case DType::kBFloat16: return bf16_to_float(static_cast<const uint16_t*>(base)[i]);
    case DType::kFloat32: return static_cast<const float*>(base)[i];
    case DType::kFloat8E4M3:
    case DType::kFloat8E5M2: return fp8_to_float(static_cast<const uint8_t*>(base)[i], t);
    default: unsupported(t);
  }
}

void store_from_float(void* base, DType t, size_t i, float v) {
  switch (t) {
    case DType::kFloat16: static_cast<uint16_t*>(base)[i] = float_to_half(v); return;
    case DType::kBFloat16: static_cast<uint16_t*>(base)[i] = float_to_bf16(v); return;
    case DType::kFloat32: static_cast<float*>(base)[i] = v; return;
    case DType::kFloat8E4M3:
    case DType::kFloat8E5M2: static_cast<uint8_t*>(base)[i] = float_to_fp8(v, t); return;
    default: unsupported(t);
  }
}

}  // namespace tessera
