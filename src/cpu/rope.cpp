#include "tessera/cpu/rope.hpp"

#include <cmath>

namespace tessera::cpu {

std::vector<double> rope_rates(double rope_scale, double rope_theta, int rotary_dim) {
  std::vector<double> rates(rotary_dim / 2);
  for (size_t j = 0; j < rates.size(); ++j) rates[j] = std::pow(rope_theta, -2.0 * double(j) / rotary_dim) / rope_scale;
  return rates;
}

void rotate_row(float* x, std::span<const double> rates, double pos, bool interleave) {
  const size_t half = rates.size();
  for (size_t j = 0; j < half; ++j) {
    float& a = x[interleave ? 2 * j : j];
    float& b = x[interleave ? 2 * j + 1 : j + half];
    const double angle = pos * rates[j], cos_t = std::cos(angle), sin_t = std::sin(angle), xa = a, xb = b;
    a = static_cast<float>(xa * cos_t - xb * sin_t);
    b = static_cast<float>(xb * cos_t + xa * sin_t);
  }
}

void rotate_rows(const TensorView& x, const TensorView& out, std::span<const int64_t> pos, bool interleave,
                 double rope_scale, double rope_theta, int rotary_dim) {
  const int64_t H = x.size(1), D = x.size(2);
  const std::vector<double> rates = rope_rates(rope_scale, rope_theta, rotary_dim);
  std::vector<float> buf(D);  // a row read whole first: out may alias x
  for (int64_t n = 0; n < x.size(0); ++n)
    for (int64_t h = 0; h < H; ++h) {
      const int64_t in_at = n * x.stride(0) + h * x.stride(1), out_at = n * out.stride(0) + h * out.stride(1);
      for (int64_t d = 0; d < D; ++d) buf[d] = load_as_float(x.data, x.dtype, static_cast<size_t>(in_at + d));
      rotate_row(buf.data(), rates, static_cast<double>(pos[n]), interleave);
      for (int64_t d = 0; d < D; ++d) store_from_float(out.data, out.dtype, static_cast<size_t>(out_at + d), buf[d]);
    }
}

}  // namespace tessera::cpu
