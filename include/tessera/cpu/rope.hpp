// Rotary embedding on the CPU: the execution path of apply_rope /
// apply_rope_pos_ids for host tensors and of the CPU attention's fused RoPE
// (tessera::cpu, the library's CPU path; the tests check it against their
// own formula).
#pragma once
#include <span>
#include <vector>

#include "tessera/core/tensor.hpp"

namespace tessera::cpu {

// Pair j of the first rotary_dim features, (j, j + rotary_dim / 2) or
// interleaved (2j, 2j + 1), turns by pos * rates[j] radians, rates[j] =
// rope_theta^(-2j / rotary_dim) / rope_scale.
std::vector<double> rope_rates(double rope_scale, double rope_theta, int rotary_dim);
void rotate_row(float* x, std::span<const double> rates, double pos, bool interleave);

// Rotates the rows of x [N, H, D] (fp16 / bf16), row n at position pos[n],
// into out (same shape; may alias x). Arguments are checked by the caller.
void rotate_rows(const TensorView& x, const TensorView& out, std::span<const int64_t> pos, bool interleave,
                 double rope_scale, double rope_theta, int rotary_dim);

}  // namespace tessera::cpu
