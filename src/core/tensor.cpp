// TensorView bookkeeping and the check_* helpers. Every failure names the
// argument and states expected vs. actual, because these messages are what a
// Python user sees when they pass the wrong tensor.
#include "tessera/core/tensor.hpp"

#include <sstream>
#include <string>

namespace tessera {

namespace {

std::string join(const std::vector<int64_t>& xs) {
  std::ostringstream os;
  os << '[';
  for (size_t i = 0; i < xs.size(); ++i) os << (i ? ", " : "") << xs[i];
  os << ']';
  return os.str();
}

std::vector<int64_t> row_major_strides(const std::vector<int64_t>& shape) {
  std::vector<int64_t> strides(shape.size());
  int64_t running = 1;
  for (size_t i = shape.size(); i-- > 0;) {
    strides[i] = running;
    running *= shape[i];
  }
  return strides;
}

// The strides actually in effect (a view may leave them empty = row-major).
std::vector<int64_t> effective_strides(const TensorView& t) {
  return t.strides.empty() ? row_major_strides(t.shape) : t.strides;
}

std::string describe(const TensorView& t) {
  return std::to_string(t.dim()) + "-D tensor " + t.shape_str();
}

}  // namespace

std::string Device::str() const {
  return type == DeviceType::kCUDA ? "cuda:" + std::to_string(index) : std::string("cpu");
}

TensorView::TensorView(void* d, DType t, Device dev, std::vector<int64_t> shp, std::vector<int64_t> str)
    : data(d), dtype(t), device(dev), shape(std::move(shp)), strides(std::move(str)) {
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] < 0)
      throw InvalidArgument("shape: expected non-negative sizes, got " + join(shape));
  }
  if (strides.empty()) {
    strides = row_major_strides(shape);
  } else if (strides.size() != shape.size()) {
    throw InvalidArgument("strides: expected " + std::to_string(shape.size()) + " entries (one per dim of " +
                          join(shape) + "), got " + std::to_string(strides.size()));
  }
}

// Normalizes a possibly negative dimension index, or throws.
static int64_t wrap_dim(const TensorView& t, int64_t i) {
  int64_t n = t.dim();
  if (i < -n || i >= n)
    throw InvalidArgument("dim: expected an index in [" + std::to_string(-n) + ", " + std::to_string(n) +
                          ") for shape " + t.shape_str() + ", got " + std::to_string(i));
  return i < 0 ? i + n : i;
}

int64_t TensorView::size(int64_t i) const { return shape[wrap_dim(*this, i)]; }

int64_t TensorView::stride(int64_t i) const {
  int64_t d = wrap_dim(*this, i);
  // A view built by aggregate-style assignment may leave strides empty,
  // which the struct documents as "contiguous row-major".
  if (strides.empty()) return row_major_strides(shape)[d];
  return strides[d];
}

int64_t TensorView::numel() const {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  return n;
}

bool TensorView::is_contiguous() const {
  if (strides.empty() || numel() == 0) return true;
  // Like PyTorch, the stride of a size-1 dim is irrelevant to the layout.
  int64_t expected = 1;
  for (size_t i = shape.size(); i-- > 0;) {
    if (shape[i] != 1 && strides[i] != expected) return false;
    expected *= shape[i];
  }
  return true;
}

std::string TensorView::shape_str() const { return join(shape); }

void check_dim(const char* name, const TensorView& t, int64_t ndim) {
  if (t.dim() != ndim)
    throw InvalidArgument(std::string(name) + ": expected a " + std::to_string(ndim) + "-D tensor, got " +
                          describe(t));
}

void check_shape(const char* name, const TensorView& t, std::initializer_list<int64_t> shape) {
  std::vector<int64_t> want(shape);
  bool ok = want.size() == t.shape.size();
  for (size_t i = 0; ok && i < want.size(); ++i) ok = want[i] < 0 || want[i] == t.shape[i];
  if (!ok) {
    // -1 entries are wildcards; print them as '*' so the message reads naturally.
    std::ostringstream os;
    os << '[';
    for (size_t i = 0; i < want.size(); ++i) {
      os << (i ? ", " : "");
      if (want[i] < 0) os << '*'; else os << want[i];
    }
    os << ']';
    throw InvalidArgument(std::string(name) + ": expected shape " + os.str() + ", got " + t.shape_str());
  }
}

void check_dtype(const char* name, const TensorView& t, DType dt) {
  if (t.dtype != dt)
    throw TypeMismatch(std::string(name) + ": expected dtype " + dtype_name(dt) + ", got " + dtype_name(t.dtype));
}

void check_dtype_in(const char* name, const TensorView& t, std::initializer_list<DType> dts) {
  std::string list;
  for (DType d : dts) {
    if (d == t.dtype) return;
    list += (list.empty() ? "" : ", ") + std::string(dtype_name(d));
  }
  throw TypeMismatch(std::string(name) + ": expected dtype one of {" + list + "}, got " + dtype_name(t.dtype));
}

void check_device(const char* name, const TensorView& t, const Device& dev) {
  if (!(t.device == dev))
    throw TypeMismatch(std::string(name) + ": expected device " + dev.str() + ", got " + t.device.str());
}

void check_contiguous(const char* name, const TensorView& t) {
  if (!t.is_contiguous())
    throw InvalidArgument(std::string(name) + ": expected a contiguous tensor, got shape " + t.shape_str() +
                          " with strides " + join(effective_strides(t)));
}

void check_last_dim_contiguous(const char* name, const TensorView& t, int64_t align_elems) {
  if (t.dim() == 0) throw InvalidArgument(std::string(name) + ": expected at least 1 dim, got a 0-D tensor");
  if (t.size(-1) > 1 && t.stride(-1) != 1)
    throw InvalidArgument(std::string(name) + ": expected stride 1 in the last dim, got strides " +
                          join(effective_strides(t)) + " for shape " + t.shape_str());
  if (align_elems <= 1) return;
  for (int64_t i = 0; i + 1 < t.dim(); ++i) {
    if (t.size(i) > 1 && t.stride(i) % align_elems != 0)
      throw InvalidArgument(std::string(name) + ": expected every stride to be a multiple of " +
                            std::to_string(align_elems) + " elements, got stride " +
                            std::to_string(t.stride(i)) + " in dim " + std::to_string(i) + " (strides " +
                            join(effective_strides(t)) + ")");
  }
}

void check_same_device(const char* name_a, const TensorView& a, const char* name_b, const TensorView& b) {
  if (!(a.device == b.device))
    throw TypeMismatch(std::string(name_b) + ": expected the same device as " + name_a + " (" + a.device.str() +
                       "), got " + b.device.str());
}

}  // namespace tessera
