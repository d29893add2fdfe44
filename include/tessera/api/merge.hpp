// Attention-state merge (paper §2.2), on the GPU for CUDA tensors and on the
// CPU for host tensors. Values v are [rows, heads, head_dim] of fp16 / bf16 /
// fp32 (last dim contiguous); scales s are float32 base-2 LSE [rows, heads].
// An empty state (s = -inf) contributes nothing.
//
// pdl: programmatic dependent launch (sm_90+, ignored before and on the
// CPU), as RunOptions::pdl: the merge's CTAs start while the kernel before
// it on the stream ends, compute their addresses, and wait for it before
// their first load; they let the kernel after them start once they have
// waited. A merge behind the attention kernels whose states it joins then
// pays no launch gap.
#pragma once
#include <cuda_runtime_api.h>

#include "tessera/core/tensor.hpp"

namespace tessera {

// (v_out, s_out) = (v_a, s_a) (+) (v_b, s_b). s_out may be undefined.
void merge_state(const TensorView& v_a, const TensorView& s_a, const TensorView& v_b, const TensorView& s_b,
                 const TensorView& v_out, const TensorView& s_out, cudaStream_t stream = nullptr, bool pdl = false);

// (v, s) <- (v, s) (+) (v_other, s_other); rows whose mask byte is 0 are kept
// as they are (mask: uint8/bool [rows] or undefined).
void merge_state_in_place(const TensorView& v, const TensorView& s, const TensorView& v_other,
                          const TensorView& s_other, const TensorView& mask, cudaStream_t stream = nullptr,
                          bool pdl = false);

// v [rows, num_states, heads, D], s [rows, num_states, heads] -> v_out [rows, heads, D], s_out [rows, heads].
void merge_states(const TensorView& v, const TensorView& s, const TensorView& v_out, const TensorView& s_out,
                  cudaStream_t stream = nullptr, bool pdl = false);

// Ragged count of states per row: v [total, heads, D], s [total, heads],
// indptr int32 [rows + 1] on the same device -> v_out [rows, heads, D], s_out [rows, heads].
void merge_states_ragged(const TensorView& v, const TensorView& s, const TensorView& indptr,
                         const TensorView& v_out, const TensorView& s_out, cudaStream_t stream = nullptr,
                         bool pdl = false);

}  // namespace tessera
