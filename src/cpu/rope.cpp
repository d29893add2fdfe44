#include "tessera/cpu/rope.hpp"

#include <cmath>
#include <numbers>

namespace tessera::cpu {

std::vector<double> rope_rates(double rope_scale, double rope_theta, int rotary_dim) {
  std::vector<double> rates(rotary_dim / 2);
  for (size_t j = 0; j < rates.size(); ++j) rates[j] = std::pow(rope_theta, -2.0 * double(j) / rotary_dim) / rope_scale;
  return rates;
}

std::vector<double> rope_rates_llama31(double rope_scale, double rope_theta, int rotary_dim, double low_freq_factor,
                                       double high_freq_factor, double old_context_len) {
  std::vector<double> rates = rope_rates(1.0, rope_theta, rotary_dim);
  for (double& f : rates) {
    const double ratio = old_context_len * f / (2 * std::numbers::pi);  // old_context_len / wavelength
    if (ratio >= high_freq_factor) continue;
    if (ratio <= low_freq_factor) {
      f /= rope_scale;
      continue;
    }
    const double smooth = (ratio - low_freq_factor) / (high_freq_factor - low_freq_factor);
    f = (1 - smooth) * f / rope_scale + smooth * f;
  }
  return rates;
}

void rotate_row(float* x, std::span<const double> cos, std::span<const double> sin, bool interleave) {
  const size_t half = cos.size();
  for (size_t j = 0; j < half; ++j) {
    float& a = x[interleave ? 2 * j : j];
    float& b = x[interleave ? 2 * j + 1 : j + half];
    const double xa = a, xb = b;
    a = static_cast<float>(xa * cos[j] - xb * sin[j]);
    b = static_cast<float>(xb * cos[j] + xa * sin[j]);
  }
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

RopeAngles rope_angles(std::vector<double> rates) {
  return [rates = std::move(rates)](int64_t pos, std::span<double> cos, std::span<double> sin) {
    for (size_t j = 0; j < rates.size(); ++j) {
      const double angle = static_cast<double>(pos) * rates[j];
      cos[j] = std::cos(angle), sin[j] = std::sin(angle);
    }
  };
}

void rotate_rows(const TensorView& x, const TensorView& out, std::span<const int64_t> pos, bool interleave,
                 int rotary_dim, const RopeAngles& angles) {
  const int64_t H = x.size(1), D = x.size(2);
  std::vector<float> buf(D);  // a row read whole first: out may alias x
  std::vector<double> cos(rotary_dim / 2), sin(rotary_dim / 2);
  for (int64_t n = 0; n < x.size(0); ++n) {
    angles(pos[n], cos, sin);
    for (int64_t h = 0; h < H; ++h) {
      const int64_t in_at = n * x.stride(0) + h * x.stride(1), out_at = n * out.stride(0) + h * out.stride(1);
      for (int64_t d = 0; d < D; ++d) buf[d] = load_as_float(x.data, x.dtype, static_cast<size_t>(in_at + d));
      rotate_row(buf.data(), cos, sin, interleave);
      for (int64_t d = 0; d < D; ++d) store_from_float(out.data, out.dtype, static_cast<size_t>(out_at + d), buf[d]);
    }
  }
}

void rotate_rows(const TensorView& x, const TensorView& out, std::span<const int64_t> pos, bool interleave,
                 double rope_scale, double rope_theta, int rotary_dim) {
  rotate_rows(x, out, pos, interleave, rotary_dim, rope_angles(rope_rates(rope_scale, rope_theta, rotary_dim)));
}

}  // namespace tessera::cpu
