// Small helpers shared by the CPU and GPU tests: owning host tensors, random
// fills that round through the tensor's dtype (so every consumer sees the
// exact stored values), strided element access, and an assertion that an
// expression throws a given Tessera error whose message names the argument.
#pragma once
#include <gtest/gtest.h>

#include <cstdint>
#include <exception>
#include <functional>
#include <random>
#include <string>
#include <typeinfo>
#include <vector>

#include "tessera/core/dtype.hpp"
#include "tessera/core/error.hpp"
#include "tessera/core/tensor.hpp"

namespace tessera::test {

// A host buffer plus a view of it. Copies re-point the view at the copy's own
// buffer (a plain memberwise copy would alias the original).
struct HostTensor {
  std::vector<uint8_t> storage;
  TensorView view;

  HostTensor() = default;
  HostTensor(const HostTensor& o) : storage(o.storage), view(o.view) { rebind_from(o); }
  HostTensor& operator=(const HostTensor& o) {
    if (this != &o) {
      storage = o.storage;
      view = o.view;
      rebind_from(o);
    }
    return *this;
  }
  HostTensor(HostTensor&&) noexcept = default;  // vector moves keep their buffer
  HostTensor& operator=(HostTensor&&) noexcept = default;

  size_t storage_elems() const { return storage.size() / dtype_size(view.dtype); }
  // Flat access by storage element index (row-major for contiguous tensors).
  float get(size_t i) const { return load_as_float(storage.data(), view.dtype, i); }
  void set(size_t i, float x) { store_from_float(storage.data(), view.dtype, i, x); }

 private:
  void rebind_from(const HostTensor& o) {
    if (o.view.data != nullptr)
      view.data = storage.data() + (static_cast<const uint8_t*>(o.view.data) - o.storage.data());
  }
};

// Element offset of a multi-index under the view's strides.
inline int64_t offset_of(const TensorView& t, std::initializer_list<int64_t> idx) {
  int64_t off = 0, i = 0;
  for (int64_t x : idx) off += x * t.stride(i++);
  return off;
}
inline float load(const TensorView& t, std::initializer_list<int64_t> idx) {
  return load_as_float(t.data, t.dtype, static_cast<size_t>(offset_of(t, idx)));
}
inline void store(const TensorView& t, std::initializer_list<int64_t> idx, float x) {
  store_from_float(t.data, t.dtype, static_cast<size_t>(offset_of(t, idx)), x);
}

// Zero-filled, contiguous, on the CPU.
inline HostTensor make_host(DType dtype, std::vector<int64_t> shape) {
  HostTensor t;
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  t.storage.assign(static_cast<size_t>(n) * dtype_size(dtype), 0);
  t.view = TensorView(t.storage.data(), dtype, Device{}, std::move(shape));
  return t;
}

// Zero-filled with explicit (non-negative) strides; the buffer covers the
// largest offset the strides reach, so padding between rows is allocated.
inline HostTensor make_host_strided(DType dtype, std::vector<int64_t> shape, std::vector<int64_t> strides) {
  HostTensor t;
  int64_t last = 0;
  bool empty = false;
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] == 0) empty = true;
    else last += (shape[i] - 1) * strides[i];
  }
  t.storage.assign(empty ? 0 : static_cast<size_t>(last + 1) * dtype_size(dtype), 0);
  t.view = TensorView(t.storage.data(), dtype, Device{}, std::move(shape), std::move(strides));
  return t;
}

// Uniform values in [lo, hi), stored through the dtype's rounding. Fills the
// whole buffer (padding included). Float dtypes only.
inline void fill_random(HostTensor& t, uint64_t seed, float lo = -1.f, float hi = 1.f) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  const size_t n = t.storage_elems();
  for (size_t i = 0; i < n; ++i) t.set(i, dist(rng));
}

// Reads a whole tensor (row-major logical order) into doubles.
inline std::vector<double> to_doubles(const TensorView& t) {
  std::vector<double> out(static_cast<size_t>(t.numel()));
  std::vector<int64_t> idx(t.shape.size(), 0);
  for (size_t flat = 0; flat < out.size(); ++flat) {
    int64_t off = 0;
    for (size_t d = 0; d < idx.size(); ++d) off += idx[d] * t.stride(static_cast<int64_t>(d));
    out[flat] = load_as_float(t.data, t.dtype, static_cast<size_t>(off));
    for (size_t d = idx.size(); d-- > 0;) {  // odometer increment
      if (++idx[d] < t.shape[d]) break;
      idx[d] = 0;
    }
  }
  return out;
}

// Passes when fn() throws exactly an Exc whose what() contains `needle`.
template <typename Exc>
::testing::AssertionResult throws_with(const std::function<void()>& fn, const std::string& needle) {
  try {
    fn();
  } catch (const Exc& e) {
    if (std::string(e.what()).find(needle) != std::string::npos) return ::testing::AssertionSuccess();
    return ::testing::AssertionFailure() << "message \"" << e.what() << "\" does not contain \"" << needle << "\"";
  } catch (const std::exception& e) {
    return ::testing::AssertionFailure() << "threw " << typeid(e).name() << " (\"" << e.what() << "\"), expected "
                                         << typeid(Exc).name();
  }
  return ::testing::AssertionFailure() << "did not throw; expected " << typeid(Exc).name();
}

}  // namespace tessera::test

// EXPECT_THROW for Tessera errors that also checks the message names `needle`
// (usually the argument). Usage: EXPECT_THROW_MSG(f(x), InvalidArgument, "x");
#define EXPECT_THROW_MSG(stmt, Exc, needle) \
  EXPECT_TRUE(::tessera::test::throws_with<Exc>([&]() { stmt; }, needle))
