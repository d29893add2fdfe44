// Element types Tessera understands on the host side, with names used in
// error messages and in generated kernel source.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

namespace tessera {

enum class DType : uint8_t { kFloat16, kBFloat16, kFloat32, kInt32, kUInt8, kBool };

inline size_t dtype_size(DType t) {
  switch (t) {
    case DType::kFloat16:
    case DType::kBFloat16: return 2;
    case DType::kFloat32:
    case DType::kInt32: return 4;
    case DType::kUInt8:
    case DType::kBool: return 1;
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
  }
  return "?";
}

inline bool is_half_precision(DType t) { return t == DType::kFloat16 || t == DType::kBFloat16; }

// Host conversions (round to nearest even), used by the reference and tests.
float half_to_float(uint16_t h);
uint16_t float_to_half(float f);
float bf16_to_float(uint16_t h);
uint16_t float_to_bf16(float f);

// Reads element i of a buffer of type t as float (fp16/bf16/fp32 only).
float load_as_float(const void* base, DType t, size_t i);
// Writes v into element i of a buffer of type t (fp16/bf16/fp32 only).
void store_from_float(void* base, DType t, size_t i, float v);

}  // namespace tessera
