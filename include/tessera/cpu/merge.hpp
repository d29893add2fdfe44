// Attention-state merge on the CPU (paper §2.2), base-2 LSE: the execution
// path of the public merge API for host tensors (tessera::cpu, the library's
// CPU path; tessera::reference is the tests' oracle). Tested against the
// reference's attention over the union of the merged key sets.
#pragma once
#include "tessera/core/tensor.hpp"

namespace tessera::cpu {

// v_* [N, H, D] (fp16/bf16/fp32), s_* [N, H] float32. Writes v_out, s_out
// (s_out may be an undefined view). v_out may alias v_a.
void merge_state(const TensorView& v_a, const TensorView& s_a, const TensorView& v_b,
                 const TensorView& s_b, const TensorView& v_out, const TensorView& s_out);

// v [N, S, H, D], s [N, S, H] -> v_out [N, H, D], s_out [N, H].
void merge_states(const TensorView& v, const TensorView& s, const TensorView& v_out,
                  const TensorView& s_out);

// Ragged: v [total, H, D], s [total, H], indptr [N+1] (host int32) ->
// v_out [N, H, D], s_out [N, H].
void merge_states_ragged(const TensorView& v, const TensorView& s, const TensorView& indptr,
                         const TensorView& v_out, const TensorView& s_out);

}  // namespace tessera::cpu
