// Ragged (indptr) lookups shared by kernels that map a flat row to its request.
#pragma once

namespace tessera {

#if defined(__CUDACC__) || defined(__CUDACC_RTC__)

// Index of the request holding row `row` (indptr [batch + 1] is non-decreasing).
__device__ __forceinline__ int find_request(const int* indptr, int batch, int row) {
  int lo = 0, hi = batch - 1;
  while (lo < hi) {  // last b with indptr[b] <= row, skipping empty requests
    int mid = (lo + hi + 1) >> 1;
    if (indptr[mid] <= row) lo = mid; else hi = mid - 1;
  }
  return lo;
}

#endif

}  // namespace tessera
