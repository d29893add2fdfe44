// Views of KV storage as kernels see them. Plain structs (no device code) so
// the host can fill them and pass them inside kernel parameter blocks.
#pragma once
#include "tessera/abi/types.cuh"

namespace tessera {
namespace device {

// A paged KV cache as kernels see it. Token `pos` of request `b` lives in
// storage page indices[indptr[b] + pos / page_size], slot pos % page_size; its
// head h vector starts at element page*page_stride + h*head_stride +
// slot*token_stride of k (or v). Strides cover NHD, HND and interleaved K/V.
// Two special cases need no page table:
//  * ragged KV (indices null): indptr counts tokens, request b's tokens are the
//    rows indptr[b] .. indptr[b+1] of one [total_kv, H, D] tensor;
//  * one contiguous request (indptr null): single_len tokens from row 0.
struct PagedKV {
  const void* k;
  const void* v;
  const int* indptr;         // [batch + 1]
  const int* indices;        // [indptr[batch]]
  const int* last_page_len;  // [batch]
  i64 page_stride;
  i64 head_stride;
  i64 token_stride;
  int page_size;
  int num_kv_heads;
  int single_len;  // used only when indptr is null
  // Page-id checks on the GPU (page_error non-null): page tables that stay in
  // device memory are never read by the host, so the kernels check each id
  // against the storage's num_pages. A bad id is recorded in page_error
  // (pinned host memory: [0] = 1, [1] = the id, [2] = num_pages; the wrapper
  // raises it at its next call); its rows read as zeros (or, in the Hopper
  // kernel's table, as page 0), never out of bounds. BatchDecode and
  // BatchPrefill always ask for the checks (host ids too: they cost nothing
  // measurable, and a captured graph keeps its parameters across plans);
  // null skips them.
  int num_pages = 0;
  int* page_error = nullptr;
  // V's own strides, for K and V of different layouts: separate K [.., 192]
  // and V [.., 128] tensors (head_dim_qk != head_dim_vo), or V read as its
  // first or second 256 features of 512-wide rows. Only the FA2 prefill
  // loader reads them, and only in its unequal-dims instantiations; every
  // other kernel (decode, Hopper prefill, row-wise) takes K and V of one
  // layout and addresses V with K's strides. Hosts that give one layout fill
  // them equal to K's.
  i64 v_page_stride = 0;
  i64 v_head_stride = 0;
  i64 v_token_stride = 0;
};

// Dequantization scales of a quantized (fp8) KV cache given as 1-element
// float32 device tensors (FlashInfer's k_scale / v_scale as tensors): the
// kernel reads them at run time, so a captured CUDA graph picks up new values
// at every replay. k multiplies the softmax scale, v the output (both folded
// into factors the kernel applies anyway; see read_run_scales). Null: 1.
// Scalar scales never come here: the host folds them into sm_scale / o_scale.
struct KVScaleTensors {
  const float* k = nullptr;
  const float* v = nullptr;
};

}  // namespace device
}  // namespace tessera
