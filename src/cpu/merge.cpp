// CPU merge of attention states (paper §2.2) with base-2 LSE, computed in
// double. The merge only ever exponentiates LSE *differences* (against the
// max), so states whose scales differ by hundreds merge without overflow,
// and a state with lse = -inf is skipped outright so that whatever its value
// holds (often uninitialized memory or NaN) cannot leak into the result.
#include "tessera/cpu/merge.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "tessera/formats/ragged.hpp"

namespace tessera::cpu {

namespace {

constexpr double kNegInf = -std::numeric_limits<double>::infinity();

std::string str(int64_t x) { return std::to_string(x); }

double read(const TensorView& t, int64_t off) { return load_as_float(t.data, t.dtype, static_cast<size_t>(off)); }
void write(const TensorView& t, int64_t off, double x) {
  store_from_float(t.data, t.dtype, static_cast<size_t>(off), static_cast<float>(x));
}

// Merges `count` states of one (row, head). lse_of(i) gives state i's LSE and
// value_of(i, d) its value; results go to o[0..D) and the returned LSE.
template <typename LseOf, typename ValueOf>
double merge_row(int64_t count, int64_t D, LseOf lse_of, ValueOf value_of, std::vector<double>& o) {
  o.assign(D, 0.0);
  double m = kNegInf;
  for (int64_t i = 0; i < count; ++i) m = std::max(m, lse_of(i));
  if (m == kNegInf) return kNegInf;  // every state empty (or none): O = 0
  double denom = 0.0;
  for (int64_t i = 0; i < count; ++i) {
    const double s = lse_of(i);
    if (s == kNegInf) continue;
    const double w = std::exp2(s - m);
    denom += w;
    if (w == 0.0) continue;  // underflowed weight: contributes nothing (as on the GPU)
    for (int64_t d = 0; d < D; ++d) o[d] += w * value_of(i, d);
  }
  for (int64_t d = 0; d < D; ++d) o[d] /= denom;
  return m + std::log2(denom);
}

void check_value(const char* name, const TensorView& t, int64_t ndim) {
  check_device(name, t, Device{});
  check_dtype_in(name, t, {DType::kFloat16, DType::kBFloat16, DType::kFloat32});
  check_dim(name, t, ndim);
}

void check_lse(const char* name, const TensorView& t) {
  check_device(name, t, Device{});
  check_dtype(name, t, DType::kFloat32);
}

void check_same_shape(const char* name, const TensorView& t, const char* ref_name, const std::vector<int64_t>& shape,
                      const std::string& shape_str) {
  if (t.shape != shape)
    throw InvalidArgument(std::string(name) + ": expected shape " + shape_str + " (from " + ref_name + "), got " +
                          t.shape_str());
}

// Checks v_out [N, H, D] / s_out [N, H] (s_out optional); returns {N, H, D}.
void check_outputs(const TensorView& v_out, const TensorView& s_out, int64_t N, int64_t H, int64_t D,
                   const char* n_from) {
  check_value("v_out", v_out, 3);
  if (v_out.size(0) != N || v_out.size(1) != H || v_out.size(2) != D)
    throw InvalidArgument("v_out: expected shape [" + str(N) + ", " + str(H) + ", " + str(D) + "] (from " + n_from +
                          "), got " + v_out.shape_str());
  if (!s_out.defined()) return;
  check_lse("s_out", s_out);
  check_shape("s_out", s_out, {N, H});
}

void store_row(const TensorView& v_out, const TensorView& s_out, int64_t n, int64_t h, const std::vector<double>& o,
               double lse) {
  const int64_t base = n * v_out.stride(0) + h * v_out.stride(1);
  for (int64_t d = 0; d < static_cast<int64_t>(o.size()); ++d) write(v_out, base + d * v_out.stride(2), o[d]);
  if (s_out.defined()) write(s_out, n * s_out.stride(0) + h * s_out.stride(1), lse);
}

}  // namespace

void merge_state(const TensorView& v_a, const TensorView& s_a, const TensorView& v_b, const TensorView& s_b,
                 const TensorView& v_out, const TensorView& s_out) {
  check_value("v_a", v_a, 3);
  check_value("v_b", v_b, 3);
  check_same_shape("v_b", v_b, "v_a", v_a.shape, v_a.shape_str());
  const int64_t N = v_a.size(0), H = v_a.size(1), D = v_a.size(2);
  check_lse("s_a", s_a);
  check_shape("s_a", s_a, {N, H});
  check_lse("s_b", s_b);
  check_shape("s_b", s_b, {N, H});
  check_outputs(v_out, s_out, N, H, D, "v_a");

  const TensorView* vs[2] = {&v_a, &v_b};
  const TensorView* ss[2] = {&s_a, &s_b};
  std::vector<double> o;
  for (int64_t n = 0; n < N; ++n)
    for (int64_t h = 0; h < H; ++h) {
      // Both inputs are fully read before the row is written, which is what
      // makes v_out == v_a (and s_out == s_a) safe.
      auto lse_of = [&](int64_t i) { return read(*ss[i], n * ss[i]->stride(0) + h * ss[i]->stride(1)); };
      auto value_of = [&](int64_t i, int64_t d) {
        const TensorView& t = *vs[i];
        return read(t, n * t.stride(0) + h * t.stride(1) + d * t.stride(2));
      };
      const double lse = merge_row(2, D, lse_of, value_of, o);
      store_row(v_out, s_out, n, h, o, lse);
    }
}

void merge_states(const TensorView& v, const TensorView& s, const TensorView& v_out, const TensorView& s_out) {
  check_value("v", v, 4);
  const int64_t N = v.size(0), S = v.size(1), H = v.size(2), D = v.size(3);
  check_lse("s", s);
  check_shape("s", s, {N, S, H});
  check_outputs(v_out, s_out, N, H, D, "v");

  std::vector<double> o;
  for (int64_t n = 0; n < N; ++n)
    for (int64_t h = 0; h < H; ++h) {
      auto lse_of = [&](int64_t i) { return read(s, n * s.stride(0) + i * s.stride(1) + h * s.stride(2)); };
      auto value_of = [&](int64_t i, int64_t d) {
        return read(v, n * v.stride(0) + i * v.stride(1) + h * v.stride(2) + d * v.stride(3));
      };
      const double lse = merge_row(S, D, lse_of, value_of, o);
      store_row(v_out, s_out, n, h, o, lse);
    }
}

void merge_states_ragged(const TensorView& v, const TensorView& s, const TensorView& indptr, const TensorView& v_out,
                         const TensorView& s_out) {
  check_value("v", v, 3);
  const int64_t total = v.size(0), H = v.size(1), D = v.size(2);
  check_lse("s", s);
  check_shape("s", s, {total, H});
  check_device("indptr", indptr, Device{});
  check_dtype("indptr", indptr, DType::kInt32);
  check_dim("indptr", indptr, 1);
  if (indptr.size(0) < 1)
    throw InvalidArgument("indptr: expected at least 1 entry (N + 1), got shape " + indptr.shape_str());
  const int64_t N = indptr.size(0) - 1;
  check_outputs(v_out, s_out, N, H, D, "indptr size - 1");

  std::vector<int32_t> ptr(N + 1);
  for (int64_t i = 0; i <= N; ++i) ptr[i] = indptr.ptr<const int32_t>()[i * indptr.stride(0)];
  validate_indptr("indptr", ptr, total);

  std::vector<double> o;
  for (int64_t n = 0; n < N; ++n)
    for (int64_t h = 0; h < H; ++h) {
      const int64_t first = ptr[n];
      auto lse_of = [&](int64_t i) { return read(s, (first + i) * s.stride(0) + h * s.stride(1)); };
      auto value_of = [&](int64_t i, int64_t d) {
        return read(v, (first + i) * v.stride(0) + h * v.stride(1) + d * v.stride(2));
      };
      const double lse = merge_row(ptr[n + 1] - first, D, lse_of, value_of, o);
      store_row(v_out, s_out, n, h, o, lse);
    }
}

}  // namespace tessera::cpu
