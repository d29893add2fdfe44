// How fast do wgmmas with both operands in shared memory (SS, like S = Q K^T)
// run at each N? Every CTA (one per SM) has 1 or 2 warpgroups issuing chains
// of m64nNk16 (fp16, fp32 accumulate), N = 32 / 64 / 128 / 256, with their A
// tiles apart or one A tile shared (as the MLA 64-row tile's two warpgroups
// share Q). An SS wgmma reads A (64 x 16) and B (N x 16) from shared memory
// for 64 x N x 16 multiply-adds, so small N asks more bytes per FLOP of the
// shared-memory pipe. Prints cycles per wgmma per warpgroup and the SM-wide
// TFLOP/s; the RS rows (A from registers) are the reference without A reads.
//   nvcc -std=c++17 -gencode=arch=compute_90a,code=sm_90a -O3 -I include bench/micro/wgmma_n_rate.cu -o /tmp/wgmma_n_rate
#include <cstdio>
#include <cuda_runtime.h>

#include "tessera/device/arch/wgmma.cuh"

#include "rate_common.cuh"

using namespace tessera;

constexpr int kIters = 2048;  // groups per warpgroup, each 8 x 128 / N wgmmas (the same FLOPs whatever N)

template <int N, bool RS>
__device__ __forceinline__ void issue(float (&d)[N / 2], u64 a_desc, const u32 (&a)[4], u64 b_desc) {
  if constexpr (RS) {
    if constexpr (N == 256) wgmma_rs_tb(d, a, b_desc, 1, half_t{}, WgmmaN<256>{});
    else wgmma_rs_tb(d, a, b_desc, 1, half_t{}, WgmmaN<N>{});
  } else {
    if constexpr (N == 256) wgmma_ss_tb(d, a_desc, b_desc, 1, half_t{}, WgmmaN<256>{});
    else wgmma_ss(d, a_desc, b_desc, 1, half_t{}, WgmmaN<N>{});
  }
}

template <int N, bool RS, bool SHARED_A>
__global__ void __launch_bounds__(256) rate(int active_wgs, long long* cycles, float* sink) {
#if defined(__CUDA_ARCH__) && TESSERA_HAS_WGMMA
  extern __shared__ __align__(1024) unsigned char smem[];
  const int wg = threadIdx.x / 128;
  for (int i = threadIdx.x; i < 64 * 1024 / 4; i += blockDim.x) {  // random fp16 in (-2, 2)
    u32 h = i * 2654435761u;
    h ^= h >> 15;
    h *= 2246822519u;
    h ^= h >> 13;
    reinterpret_cast<u32*>(smem)[i] = h & 0xbfffbfffu;
  }
  fence_proxy_async();
  __syncthreads();
  if (wg >= active_wgs) return;
  const u32 base = static_cast<u32>(__cvta_generic_to_shared(smem));
  const u64 a_desc = wgmma_desc(base + (SHARED_A ? 0 : wg * 8192), 16, 1024);
  const u64 b_desc = wgmma_desc(base + 32768, 16, 1024);
  float d[N / 2];
  for (int i = 0; i < N / 2; ++i) d[i] = 0.f;
  u32 a[4];
  for (int i = 0; i < 4; ++i) a[i] = ((threadIdx.x * 4 + i) * 2654435761u ^ 0x5bd1e995u * (i + 1)) & 0xbfffbfffu;
  const long long t0 = clock64();
  for (int it = 0; it < kIters; ++it) {
    wgmma_fence();
#pragma unroll
    for (int k = 0; k < 8 * 128 / N; ++k) issue<N, RS>(d, a_desc + 2 * (k % 8), a, b_desc + 2 * (k % 8));
    wgmma_commit();
    wgmma_wait<0>();
    wgmma_keep(d);
  }
  const long long t1 = clock64();
  float s = 0.f;
  for (int i = 0; i < N / 2; ++i) s += d[i];
  if (threadIdx.x % 128 == 0 && blockIdx.x == 0) cycles[wg] = t1 - t0;
  if (s == 12345.f) sink[threadIdx.x] = s;
#endif
}

template <int N, bool RS, bool SHARED_A>
void run(int wgs, const RateBuffers& buf) {
  auto k = rate<N, RS, SHARED_A>;
  cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, 65536);
  k<<<buf.sms, 256, 65536>>>(wgs, buf.cycles, buf.sink);
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  cudaEventRecord(e0);
  k<<<buf.sms, 256, 65536>>>(wgs, buf.cycles, buf.sink);
  cudaEventRecord(e1);
  if (cudaEventSynchronize(e1) != cudaSuccess) {
    printf("N %d: %s\n", N, cudaGetErrorString(cudaGetLastError()));
    return;
  }
  float ms = 0;
  cudaEventElapsedTime(&ms, e0, e1);
  long long cyc[2] = {0, 0};
  cudaMemcpy(cyc, buf.cycles, sizeof(cyc), cudaMemcpyDeviceToHost);
  const double wgmmas = double(kIters) * 8 * 128 / N;  // per warpgroup
  const double flops = wgmmas * 64 * N * 16 * 2 * wgs * buf.sms;
  printf("%s m64n%-3dk16 wgs %d%s: %6.1f cycles / wgmma / warpgroup, %5.1f FLOP/cycle/SM, %6.1f TFLOP/s\n",
         RS ? "RS" : "SS", N, wgs, SHARED_A && wgs > 1 ? " (one A)" : "        ", double(cyc[0]) / wgmmas,
         64.0 * N * 16 * 2 * wgs / (double(cyc[0]) / wgmmas), flops / (ms * 1e-3) / 1e12);
}

int main() {
  const RateBuffers buf;
  for (int wgs = 1; wgs <= 2; ++wgs) {
    run<32, false, false>(wgs, buf);
    run<64, false, false>(wgs, buf);
    run<128, false, false>(wgs, buf);
    run<256, false, false>(wgs, buf);
  }
  run<32, false, true>(2, buf);
  run<64, false, true>(2, buf);
  for (int wgs = 1; wgs <= 2; ++wgs) {
    run<64, true, false>(wgs, buf);
    run<256, true, false>(wgs, buf);
  }
  return 0;
}
