// Element types Tessera understands on the host side, with names used in
// error messages and in generated kernel source.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

namespace tessera {

// kFloat8E4M3 / kFloat8E5M2: OCP fp8 (torch.float8_e4m3fn: no infinities,
// 448 the largest finite value; torch.float8_e5m2: IEEE-like, 57344), the
// storage of quantized KV caches (see is_fp8 and validate_spec).
enum class DType : uint8_t { kFloat16, kBFloat16, kFloat32, kInt32, kUInt8, kBool, kFloat8E4M3, kFloat8E5M2 };

inline size_t dtype_size(DType t) {
  switch (t) {
    case DType::kFloat16:
    case DType::kBFloat16: return 2;
    case DType::kFloat32:
    case DType::kInt32: return 4;
    case DType::kUInt8:
    case DType::kBool:
    case DType::kFloat8E4M3:
    case DType::kFloat8E5M2: return 1;
  }
  return 0;
}

inline const char* dtype_name(DType t) {
  switch (t) {
    case DType::kFloat16: return "float16";
    case DType::kBFloat16: return "bfloat16";
    case DType::kFloat32: return "float32";
    case DType::kInt32: return "int32";
    case DType::kUInt8: return "uint8";
    case DType::kBool: return "bool";
    // torch's names, so Python's dtype strings and the C++ names agree.
    case DType::kFloat8E4M3: return "float8_e4m3fn";
    case DType::kFloat8E5M2: return "float8_e5m2";
  }
  return "?";
}

// The device-side storage type name (see device/arch/numeric.cuh).
inline const char* dtype_device_name(DType t) {
  switch (t) {
    case DType::kFloat16: return "tessera::half_t";
    case DType::kBFloat16: return "tessera::bf16_t";
    case DType::kFloat32: return "float";
    case DType::kInt32: return "int";
    case DType::kUInt8:
    case DType::kBool: return "unsigned char";
    case DType::kFloat8E4M3: return "tessera::fp8_e4m3_t";
    case DType::kFloat8E5M2: return "tessera::fp8_e5m2_t";
  }
  return "?";
}

inline bool is_half_precision(DType t) { return t == DType::kFloat16 || t == DType::kBFloat16; }
inline bool is_fp8(DType t) { return t == DType::kFloat8E4M3 || t == DType::kFloat8E5M2; }

// Host conversions (round to nearest even), used by the reference and tests.
float half_to_float(uint16_t h);
uint16_t float_to_half(float f);
float bf16_to_float(uint16_t h);
uint16_t float_to_bf16(float f);

// Host fp8 <-> float conversions. fp8 -> float is exact. float -> fp8 rounds
// to nearest, ties to even, and saturates: a finite value (or infinity)
// beyond the largest finite fp8 value becomes that value, as the device's
// cvt.rn.satfinite does; NaN becomes the positive NaN code 0x7f. Bit-exact
// with the kernels that write fp8 (append_paged_kv_cache).
float fp8_to_float(uint8_t x, DType t);
uint8_t float_to_fp8(float f, DType t);
// The largest finite value of an fp8 type (448 for e4m3, 57344 for e5m2).
float fp8_max(DType t);

// Reads element i of a buffer of type t as float (fp16/bf16/fp32/fp8 only).
float load_as_float(const void* base, DType t, size_t i);
// Writes v into element i of a buffer of type t (fp16/bf16/fp32/fp8 only;
// fp8 saturates, see float_to_fp8).
void store_from_float(void* base, DType t, size_t i, float v);

}  // namespace tessera
