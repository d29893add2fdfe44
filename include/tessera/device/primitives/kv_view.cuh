// Device side of the KV views (abi/kv_view.cuh): page-id checks, request
// lengths and element offsets of a token's row.
#pragma once
#include "tessera/abi/kv_view.cuh"
#include "tessera/device/arch/numeric.cuh"

namespace tessera {
namespace device {

#if defined(__CUDACC__) || defined(__CUDACC_RTC__)
// The softmax and output scales of a run: the parameter block's, times the
// KV scale tensors' current values (KVScaleTensors). Read once per CTA,
// after grid_dependency_wait (a previous kernel may write the tensors).
struct RunScales {
  float sm_scale, o_scale;
};
template <typename Params>
__device__ __forceinline__ RunScales read_run_scales(const Params& p) {
  return {p.kv_scales.k ? p.sm_scale * __ldg(p.kv_scales.k) : p.sm_scale,
          p.kv_scales.v ? p.o_scale * __ldg(p.kv_scales.v) : p.o_scale};
}

// A page id read from the table: itself when in [0, num_pages) or unchecked,
// else -1 after recording it (see PagedKV::page_error).
__device__ __forceinline__ int check_page(const PagedKV& kv, int id) {
  if (kv.page_error != nullptr &&
      static_cast<unsigned>(id) >= static_cast<unsigned>(kv.num_pages)) {
    volatile int* e = kv.page_error;
    e[1] = id;
    e[2] = kv.num_pages;
    __threadfence_system();
    e[0] = 1;
    return -1;
  }
  return id;
}
__device__ __forceinline__ int page_id(const PagedKV& kv, int idx) { return check_page(kv, kv.indices[idx]); }

// Request length from its indptr entries (and last page length, paged KV):
// kernels that load the entries ahead of time compute the length later.
__device__ __forceinline__ int kv_len_from(const PagedKV& kv, int begin, int end, int last_page) {
  if (kv.indptr == nullptr) return kv.single_len;
  const int n = end - begin;
  if (kv.indices == nullptr) return n;
  return n == 0 ? 0 : (n - 1) * kv.page_size + last_page;
}
__device__ __forceinline__ int kv_len(const PagedKV& kv, int b) {
  if (kv.indptr == nullptr) return kv.single_len;
  const int begin = kv.indptr[b], end = kv.indptr[b + 1];
  return kv_len_from(kv, begin, end, kv.indices != nullptr && end > begin ? kv.last_page_len[b] : 0);
}
// Element offset of (token pos of request b, head h).
__device__ __forceinline__ i64 kv_offset(const PagedKV& kv, int b, int pos, int h) {
  if (kv.indptr == nullptr) return pos * kv.token_stride + h * kv.head_stride;
  if (kv.indices == nullptr) return static_cast<i64>(kv.indptr[b] + pos) * kv.token_stride + h * kv.head_stride;
  const int page = page_id(kv, kv.indptr[b] + pos / kv.page_size);
  if (page < 0) return -1;
  return static_cast<i64>(page) * kv.page_stride + h * kv.head_stride + (pos % kv.page_size) * kv.token_stride;
}
// Fast path of kv_offset for kernels that hoist the request's indptr entry
// (page_base = indptr[b]) and know log2(page_size) (shift, or -1). Element
// offset of token `pos` (of the request whose pages start at
// indices[page_base], or whose rows start at page_base for ragged KV) for KV
// head h; -1 for a page id that failed its check.
// In two steps for kernels that load page ids ahead of their use: the
// table entry of token pos, unchecked (0 for ragged or single KV), then the
// offset from it.
__device__ __forceinline__ int kv_table_entry(const device::PagedKV& kv, int page_base, int pos, int shift) {
  if (kv.indptr == nullptr || kv.indices == nullptr) return 0;
  return kv.indices[page_base + (shift >= 0 ? pos >> shift : pos / kv.page_size)];
}
__device__ __forceinline__ i64 kv_token_offset_from(const device::PagedKV& kv, int page_base, int pos, int h, int shift,
                                                    int entry) {
  if (kv.indptr == nullptr) return pos * kv.token_stride + h * kv.head_stride;
  if (kv.indices == nullptr) return static_cast<i64>(page_base + pos) * kv.token_stride + h * kv.head_stride;
  const int slot = shift >= 0 ? pos & ((1 << shift) - 1) : pos % kv.page_size;
  const int page = check_page(kv, entry);
  if (page < 0) return -1;
  return static_cast<i64>(page) * kv.page_stride + h * kv.head_stride + slot * kv.token_stride;
}
__device__ __forceinline__ i64 kv_token_offset(const device::PagedKV& kv, int page_base, int pos, int h, int shift) {
  return kv_token_offset_from(kv, page_base, pos, h, shift, kv_table_entry(kv, page_base, pos, shift));
}

#endif

}  // namespace device
}  // namespace tessera
