// TensorView: a non-owning description of a strided tensor (pointer, dtype,
// device, shape, strides in elements). It is what crosses the API boundary:
// the C++ API and the Python bindings (via DLPack) both speak it, and the
// check_* helpers turn contract violations into errors that name the argument.
#pragma once
#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

#include "tessera/core/dtype.hpp"
#include "tessera/core/error.hpp"

namespace tessera {

enum class DeviceType : uint8_t { kCPU, kCUDA };

struct Device {
  DeviceType type = DeviceType::kCPU;
  int index = 0;
  bool operator==(const Device& o) const { return type == o.type && index == o.index; }
  bool is_cuda() const { return type == DeviceType::kCUDA; }
  std::string str() const;
};

struct TensorView {
  void* data = nullptr;
  DType dtype = DType::kFloat32;
  Device device{};
  std::vector<int64_t> shape;
  std::vector<int64_t> strides;  // in elements; empty means contiguous row-major

  TensorView() = default;
  TensorView(void* d, DType t, Device dev, std::vector<int64_t> shp, std::vector<int64_t> str = {});

  int64_t dim() const { return static_cast<int64_t>(shape.size()); }
  int64_t size(int64_t i) const;   // negative i counts from the end
  int64_t stride(int64_t i) const;
  int64_t numel() const;
  bool is_contiguous() const;
  bool defined() const { return data != nullptr || numel() == 0; }
  std::string shape_str() const;

  template <typename T>
  T* ptr() const { return static_cast<T*>(data); }
};

// Validation helpers: each throws InvalidArgument / TypeMismatch with a
// message of the form "<name>: expected ..., got ...".
void check_dim(const char* name, const TensorView& t, int64_t ndim);
void check_shape(const char* name, const TensorView& t, std::initializer_list<int64_t> shape);
void check_dtype(const char* name, const TensorView& t, DType dt);
void check_dtype_in(const char* name, const TensorView& t, std::initializer_list<DType> dts);
void check_device(const char* name, const TensorView& t, const Device& dev);
void check_contiguous(const char* name, const TensorView& t);
// Last dimension contiguous (stride 1) and every other stride a multiple of
// `align_elems` (so 16-byte vector loads stay aligned).
void check_last_dim_contiguous(const char* name, const TensorView& t, int64_t align_elems = 1);
void check_same_device(const char* name_a, const TensorView& a, const char* name_b, const TensorView& b);

}  // namespace tessera
