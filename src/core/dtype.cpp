// Host fp16 / bf16 <-> float conversions, bit-exact with the device's
// cvt.rn.* instructions (round to nearest, ties to even), so the reference and
// the tests see exactly the values a kernel would store.
#include "tessera/core/dtype.hpp"

#include <bit>
#include <cmath>
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
  throw TypeMismatch(std::string("dtype: expected float16, bfloat16 or float32, got ") + dtype_name(t));
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

float load_as_float(const void* base, DType t, size_t i) {
  switch (t) {
    case DType::kFloat16: return half_to_float(static_cast<const uint16_t*>(base)[i]);
    case DType::kBFloat16: return bf16_to_float(static_cast<const uint16_t*>(base)[i]);
    case DType::kFloat32: return static_cast<const float*>(base)[i];
    default: unsupported(t);
  }
}

void store_from_float(void* base, DType t, size_t i, float v) {
  switch (t) {
    case DType::kFloat16: static_cast<uint16_t*>(base)[i] = float_to_half(v); return;
    case DType::kBFloat16: static_cast<uint16_t*>(base)[i] = float_to_bf16(v); return;
    case DType::kFloat32: static_cast<float*>(base)[i] = v; return;
    default: unsupported(t);
  }
}

}  // namespace tessera
