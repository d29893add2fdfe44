// Parameter blocks of the attention-state merge kernels (plain data).
#pragma once
#include "tessera/abi/types.cuh"

namespace tessera {

// A set of attention states: v[(state, head, feat)] at
// v + state*v_stride_state + head*v_stride_head + feat, s at
// s + state*s_stride_state + head*s_stride_head (base-2 LSE, float).
struct StateSet {
  const void* v;
  const float* s;
  i64 v_stride_state, v_stride_head;
  i64 s_stride_state, s_stride_head;
};

struct StateOut {
  void* v;
  float* s;  // may be null (LSE not wanted)
  i64 v_stride_state, v_stride_head;
  i64 s_stride_state, s_stride_head;
};

// out = a (+) b, per (row, head). out may alias a (in place). When mask is
// non-null, rows with mask[row] == 0 are left as a (FlashInfer's
// merge_state_in_place mask).
struct MergePairParams {
  StateSet a, b;
  StateOut out;
  const unsigned char* mask;
  int num_rows, num_heads, head_dim;
};

// out[row] = (+) over the states of row: states indptr[row] .. indptr[row+1]
// when indptr is non-null, else row*states_per_row .. + states_per_row.
struct MergeManyParams {
  StateSet in;
  StateOut out;
  const int* indptr;
  int states_per_row;
  int num_rows, num_heads, head_dim;
};

}  // namespace tessera
