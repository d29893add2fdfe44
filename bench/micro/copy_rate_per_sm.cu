// How fast can one SM stream paged K / V rows into shared memory, by
// cp.async (16 lanes x 16 bytes a 256-byte row, as the 8-row decode tile's
// producer copies) or by bulk copies (cp.async.bulk, one 256-byte row an
// instruction, completing on the stage's mbarrier)? Each CTA (128 threads)
// streams 64-key tiles (64 K rows + 64 V rows, 32 KB) of scattered 16-row
// pages whose rows are 2 KB apart (one head of an NHD page of 8 heads)
// through a ring of STAGES stages, with nothing consuming them, on 1, 132
// (one an SM) or 264 (two an SM) CTAs; and by bulk copies of whole pages
// (HND pages: a head's 16 rows are 4 KB in a row, 8 copies a tile), and by
// the TMA (a 2-D tensor map over the NHD rows, one 16-row box a page of a
// head, 8 boxes a tile). Prints the rate a grid and an SM.
//   nvcc -std=c++17 -arch=sm_90a -O3 bench/micro/copy_rate_per_sm.cu -o /tmp/copy_rate_per_sm -lcuda && /tmp/copy_rate_per_sm
#include <cstdio>

#include <cuda.h>
#include <cuda_runtime.h>

#include "cuda_check.cuh"

typedef unsigned u32;
constexpr int kThreads = 128, kRows = 128, kRowBytes = 256, kStageBytes = kRows * kRowBytes;
constexpr long kRowStride = 2048, kTilesPerCta = 64, kRowsPerCta = kTilesPerCta * 64;

__device__ __forceinline__ u32 smem_u32(const void* p) { return static_cast<u32>(__cvta_generic_to_shared(p)); }

// Waits until the mbarrier at `bar` completes the phase of parity `parity`.
__device__ __forceinline__ void wait_parity(u32 bar, u32 parity) {
  asm volatile(
      "{\n .reg .pred done;\n wait_%=:\n mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      " @!done bra wait_%=;\n}\n" ::"r"(bar), "r"(parity) : "memory");
}

// Token row g of the cache: page g / 16 scattered over `pages`, slot g % 16.
__device__ __forceinline__ long row_offset(long g, long pages) {
  return (((g / 16) * 7919) % pages * 16 + g % 16) * kRowStride;
}

// BULK 0: cp.async, thread l copies chunk l % 16 of rows l / 16 + 8 i (XOR
// swizzled), STAGES - 1 tiles in flight (wait_group). BULK 1: thread l bulk-
// copies row l of the tile (K rows 0-63, V rows 64-127), STAGES tiles in
// flight (one mbarrier a stage, 32 KB of transactions). BULK 2: as 1, but
// threads 0-7 each bulk-copy a 4 KB page block (HND: 32 KB pages of 8 heads).
// BULK 3: as 2, but threads 0-7 each load a 16-row box of NHD rows by the TMA.
struct Maps {
  CUtensorMap k, v;
};
template <int BULK, int STAGES>
__global__ void __launch_bounds__(kThreads) stream(const char* __restrict__ k, const char* __restrict__ v, long pages,
                                                   int* sink, const __grid_constant__ Maps maps) {
  extern __shared__ __align__(128) char smem[];
  __shared__ __align__(8) unsigned long long bar[STAGES];
  const int t = threadIdx.x;
  const long row0 = static_cast<long>(blockIdx.x) * kRowsPerCta;
  if (BULK && t == 0) {
    for (int s = 0; s < STAGES; ++s)
      asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;\n" ::"r"(smem_u32(&bar[s])));
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncthreads();
  for (long tile = 0; tile < kTilesPerCta; ++tile) {
    const int s = static_cast<int>(tile % STAGES);
    char* stage = smem + s * kStageBytes;
    if constexpr (BULK) {
      const u32 b = smem_u32(&bar[s]);
      if (tile >= STAGES) {  // the stage's previous tile has landed
        const u32 parity = static_cast<u32>((tile / STAGES - 1) & 1);
        wait_parity(b, parity);
      }
      if (t == 0)
        asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(b), "r"(kStageBytes) : "memory");
      __syncthreads();
      if (BULK == 1) {
        const long g = row0 + tile * 64 + (t % 64);
        const char* src = (t < 64 ? k : v) + row_offset(g, pages);
        asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n"
                     ::"r"(smem_u32(stage + t * kRowBytes)), "l"(src), "r"(kRowBytes), "r"(b) : "memory");
      } else if (BULK == 3 && t < 8) {
        const long page = (row0 + tile * 64) / 16 + t % 4;
        const int row = static_cast<int>((page * 7919) % pages * 16);
        asm volatile(
            "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];\n"
            ::"r"(smem_u32(stage + t * 16 * kRowBytes)), "l"(t < 4 ? &maps.k : &maps.v), "r"(0), "r"(row), "r"(b)
            : "memory");
      } else if (t < 8) {
        const long page = (row0 + tile * 64) / 16 + t % 4;
        const char* src = (t < 4 ? k : v) + (page * 7919) % pages * 16 * kRowStride;
        asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n"
                     ::"r"(smem_u32(stage + t * 16 * kRowBytes)), "l"(src), "r"(16 * kRowBytes), "r"(b) : "memory");
      }
    } else {
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        const int row = t / 16 + 8 * i, chunk = t % 16;
        const long g = row0 + tile * 64 + row;
        const long off = row_offset(g, pages) + chunk * 16;
        const u32 dk = smem_u32(stage + row * kRowBytes + ((chunk ^ (row % 8)) * 16));
        asm volatile("cp.async.cg.shared.global.L2::128B [%0], [%1], 16;\n" ::"r"(dk), "l"(k + off));
        asm volatile("cp.async.cg.shared.global.L2::128B [%0], [%1], 16;\n" ::"r"(dk + 64 * kRowBytes), "l"(v + off));
      }
      asm volatile("cp.async.commit_group;\n" ::);
      asm volatile("cp.async.wait_group %0;\n" ::"n"(STAGES - 1));
    }
  }
  if constexpr (BULK) {
    for (long tile = kTilesPerCta - STAGES; tile < kTilesPerCta; ++tile) {
      const u32 b = smem_u32(&bar[tile % STAGES]);
      const u32 parity = static_cast<u32>((tile / STAGES) & 1);
      wait_parity(b, parity);
    }
  } else {
    asm volatile("cp.async.wait_group 0;\n" ::);
  }
  __syncthreads();
  if (t == 0 && smem[5] == 123) sink[0] = 1;  // keeps the copies
}

template <int BULK, int STAGES>
void run(int ctas, const char* k, const char* v, long pages, int* sink, int sms, const Maps& maps) {
  auto kernel = stream<BULK, STAGES>;
  const int smem = STAGES * kStageBytes;
  CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  cudaEvent_t a, b;
  CHECK(cudaEventCreate(&a));
  CHECK(cudaEventCreate(&b));
  kernel<<<ctas, kThreads, smem>>>(k, v, pages, sink, maps);  // warm-up
  CHECK(cudaGetLastError());
  constexpr int kReps = 20;
  CHECK(cudaEventRecord(a));
  for (int i = 0; i < kReps; ++i) kernel<<<ctas, kThreads, smem>>>(k, v, pages, sink, maps);
  CHECK(cudaEventRecord(b));
  CHECK(cudaEventSynchronize(b));
  float ms = 0;
  CHECK(cudaEventElapsedTime(&ms, a, b));
  const double us = ms * 1e3 / kReps, bytes = double(ctas) * kTilesPerCta * kStageBytes;
  const int busy_sms = ctas < sms ? ctas : sms;
  std::printf("%-9s stages %d  %3d CTAs: %8.1f us  %7.2f TB/s  %6.1f GB/s an SM\n", BULK == 3 ? "tma box" : BULK == 2 ? "bulk page" : BULK ? "bulk row" : "cp.async",
              STAGES, ctas, us, bytes / us * 1e-6, bytes / us * 1e-3 / busy_sms);
  CHECK(cudaEventDestroy(a));
  CHECK(cudaEventDestroy(b));
}

int main() {
  int sms = 0;
  CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  const long rows = 264 * kRowsPerCta, pages = rows / 16;
  const size_t bytes = static_cast<size_t>(rows) * kRowStride;
  char *k, *v;
  int* sink;
  CHECK(cudaMalloc(&k, bytes));
  CHECK(cudaMalloc(&v, bytes));
  CHECK(cudaMalloc(&sink, 4));
  CHECK(cudaMemset(k, 1, bytes));
  CHECK(cudaMemset(v, 2, bytes));
  // The NHD rows as a 2-D fp16 tensor: 128 features x rows, rows 2 KB apart.
  Maps maps;
  for (int i = 0; i < 2; ++i) {
    const cuuint64_t dims[2] = {128, static_cast<cuuint64_t>(rows)}, strides[1] = {kRowStride};
    const cuuint32_t box[2] = {128, 16}, unit[2] = {1, 1};
    if (cuTensorMapEncodeTiled(i ? &maps.v : &maps.k, CU_TENSOR_MAP_DATA_TYPE_FLOAT16, 2, i ? v : k, dims, strides,
                               box, unit, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_NONE,
                               CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) != CUDA_SUCCESS) {
      std::fprintf(stderr, "cuTensorMapEncodeTiled failed\n");
      return 1;
    }
  }
  for (int ctas : {1, sms, 2 * sms}) {
    run<0, 3>(ctas, k, v, pages, sink, sms, maps);
    run<1, 3>(ctas, k, v, pages, sink, sms, maps);
    run<2, 3>(ctas, k, v, pages, sink, sms, maps);
    run<3, 3>(ctas, k, v, pages, sink, sms, maps);
    if (ctas <= sms) {
      run<0, 6>(ctas, k, v, pages, sink, sms, maps);
      run<2, 6>(ctas, k, v, pages, sink, sms, maps);
      run<3, 6>(ctas, k, v, pages, sink, sms, maps);
    }
  }
  CHECK(cudaFree(k));
  CHECK(cudaFree(v));
  CHECK(cudaFree(sink));
  return 0;
}
