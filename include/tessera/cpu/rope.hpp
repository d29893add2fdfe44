// Rotary embedding on the CPU: the execution path of apply_rope /
// apply_rope_pos_ids (and their Llama 3.1 and cos/sin cache forms) for host
// tensors and of the CPU attention's fused RoPE (tessera::cpu, the library's
// CPU path; the tests check it against their own formula).
#pragma once
#include <functional>
#include <span>
#include <vector>

#include "tessera/core/tensor.hpp"

namespace tessera::cpu {

// Pair j of the first rotary_dim features, (j, j + rotary_dim / 2) or
// interleaved (2j, 2j + 1), turns by pos * rates[j] radians, rates[j] =
// rope_theta^(-2j / rotary_dim) / rope_scale.
std::vector<double> rope_rates(double rope_scale, double rope_theta, int rotary_dim);
// The same under Llama 3.1 scaling: a pair of wavelength w = 2 pi /
// rope_theta^(-2j / rotary_dim) keeps its frequency when w < old_context_len
// / high_freq_factor, is divided by rope_scale when w > old_context_len /
// low_freq_factor, and blends the two in between (linearly in
// old_context_len / w between low_freq_factor and high_freq_factor).
std::vector<double> rope_rates_llama31(double rope_scale, double rope_theta, int rotary_dim, double low_freq_factor,
                                       double high_freq_factor, double old_context_len);
void rotate_row(float* x, std::span<const double> rates, double pos, bool interleave);
// Turns pair j of x by the angle of cosine cos[j] and sine sin[j], j < cos.size().
void rotate_row(float* x, std::span<const double> cos, std::span<const double> sin, bool interleave);

// Fills cos[j] and sin[j] (j < rotary_dim / 2) for the row at position pos.
using RopeAngles = std::function<void(int64_t pos, std::span<double> cos, std::span<double> sin)>;
// Angles pos * rates[j].
RopeAngles rope_angles(std::vector<double> rates);

// Rotates the first rotary_dim features of the rows of x [N, H, D] (fp16 /
// bf16), row n at position pos[n], into out (same shape; may alias x).
// Arguments are checked by the caller.
void rotate_rows(const TensorView& x, const TensorView& out, std::span<const int64_t> pos, bool interleave,
                 int rotary_dim, const RopeAngles& angles);
void rotate_rows(const TensorView& x, const TensorView& out, std::span<const int64_t> pos, bool interleave,
                 double rope_scale, double rope_theta, int rotary_dim);

}  // namespace tessera::cpu
