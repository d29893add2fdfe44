// DLPack -> tessera::TensorView conversion for the Python bindings.
//
// Any object nanobind can import as an ndarray (anything with __dlpack__ such
// as torch tensors, or the buffer protocol such as numpy arrays) becomes a
// non-owning TensorView. The ndarray handle is kept in an `Arg` next to the
// view so the memory stays alive for the whole C++ call, and every rejection
// is a TypeError whose message starts with the argument's name, matching the
// "<name>: expected ..., got ..." style of the C++ checks.
#pragma once
#include <cuda_runtime_api.h>
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <cstdint>
#include <string>
#include <vector>

#include "tessera/core/tensor.hpp"

namespace tessera::python {

namespace nb = nanobind;

// A converted argument: the view plus the ndarray reference that keeps the
// producer's buffer alive while the view is in use.
struct Arg {
  nb::ndarray<nb::ro> array;
  TensorView view;
};

// The Python type name of obj, for messages ("ndarray", "Tensor", "list" ...).
inline std::string py_type_name(nb::handle obj) { return Py_TYPE(obj.ptr())->tp_name; }

// Maps a DLPack dtype to Tessera's; throws TypeError naming `name` otherwise.
inline DType to_dtype(const char* name, nb::dlpack::dtype dt) {
  using nb::dlpack::dtype_code;
  const auto code = static_cast<dtype_code>(dt.code);
  if (dt.lanes == 1) {
    if (code == dtype_code::Float && dt.bits == 16) return DType::kFloat16;
    if (code == dtype_code::Bfloat && dt.bits == 16) return DType::kBFloat16;
    if (code == dtype_code::Float && dt.bits == 32) return DType::kFloat32;
    if (code == dtype_code::Int && dt.bits == 32) return DType::kInt32;
    if (code == dtype_code::UInt && dt.bits == 8) return DType::kUInt8;
    if (code == dtype_code::Bool && dt.bits == 8) return DType::kBool;
    if (code == dtype_code::Float8_E4M3FN && dt.bits == 8) return DType::kFloat8E4M3;
    if (code == dtype_code::Float8_E5M2 && dt.bits == 8) return DType::kFloat8E5M2;
  }
  static const char* const kinds[] = {"int", "uint", "float", "opaque", "bfloat", "complex", "bool"};
  std::string got = dt.code < 7 ? kinds[dt.code] + std::to_string(dt.bits)
                                : "DLPack code " + std::to_string(dt.code) + " bits " + std::to_string(dt.bits);
  if (dt.lanes != 1) got += "x" + std::to_string(dt.lanes);
  throw nb::type_error((std::string(name) +
                        ": expected dtype float16, bfloat16, float32, float8_e4m3fn, float8_e5m2, int32, uint8 or "
                        "bool, got " + got)
                           .c_str());
}

// Maps a DLPack device to Tessera's: host memory or a CUDA device.
inline Device to_device(const char* name, int device_type, int device_id) {
  if (device_type == nb::device::cpu::value) return Device{DeviceType::kCPU, 0};
  if (device_type == nb::device::cuda::value) return Device{DeviceType::kCUDA, device_id};
  throw nb::type_error((std::string(name) + ": expected a CPU or CUDA tensor, got DLPack device type " +
                        std::to_string(device_type))
                           .c_str());
}

// Converts `obj` to a view. `writable`: the C++ side writes through it, so a
// read-only producer (e.g. a non-writeable numpy array) is rejected.
inline Arg to_arg(const char* name, nb::handle obj, bool writable = false) {
  Arg a;
  if (writable) {
    nb::ndarray<> rw;
    if (!nb::try_cast(obj, rw)) {
      if (nb::try_cast(obj, a.array))
        throw nb::type_error((std::string(name) + ": expected a writable tensor, got a read-only " + py_type_name(obj)).c_str());
      throw nb::type_error((std::string(name) + ": expected a tensor (DLPack or buffer protocol), got " + py_type_name(obj)).c_str());
    }
    a.array = nb::ndarray<nb::ro>(rw);
  } else if (!nb::try_cast(obj, a.array)) {
    throw nb::type_error((std::string(name) + ": expected a tensor (DLPack or buffer protocol), got " + py_type_name(obj)).c_str());
  }
  const auto& arr = a.array;
  const DType dt = to_dtype(name, arr.dtype());
  const Device dev = to_device(name, arr.device_type(), arr.device_id());
  std::vector<int64_t> shape(arr.ndim()), strides;
  for (size_t i = 0; i < arr.ndim(); ++i) shape[i] = static_cast<int64_t>(arr.shape(i));
  // DLPack allows a null strides pointer for compact row-major tensors; the
  // view treats empty strides the same way.
  if (arr.stride_ptr() != nullptr) {
    strides.assign(arr.stride_ptr(), arr.stride_ptr() + arr.ndim());
    // The stride of a size-1 dimension never affects an address, and
    // producers disagree on it (torch exports 1, numpy the row-major value).
    // Give it the row-major value so contiguity checks see what they expect.
    for (size_t i = arr.ndim(); i-- > 0;)
      if (shape[i] == 1) strides[i] = i + 1 < arr.ndim() ? strides[i + 1] * shape[i + 1] : 1;
  }
  a.view = TensorView(const_cast<void*>(arr.data()), dt, dev, std::move(shape), std::move(strides));
  return a;
}

// Optional argument: None becomes an undefined view (null data, no shape).
inline Arg to_optional_arg(const char* name, nb::handle obj, bool writable = false) {
  if (obj.is_none()) return Arg{};
  return to_arg(name, obj, writable);
}

inline cudaStream_t to_stream(uintptr_t handle) { return reinterpret_cast<cudaStream_t>(handle); }

}  // namespace tessera::python
