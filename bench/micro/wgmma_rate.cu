// How fast can one warpgroup drive the tensor cores? Times chains of
// m64n128k16 wgmmas (fp16, fp32 accumulate) issued by 1 or 2 warpgroups of
// every CTA (one CTA per SM), with A from shared memory (SS, like S = Q K^T)
// or registers (RS, like O += P V), one accumulator chain or two interleaved.
// Also: one warpgroup's wgmmas while another runs FFMA / EX2 / softmax-like
// ALU work. Prints cycles per wgmma per warpgroup and the SM-wide TFLOP/s.
//   nvcc -std=c++17 -arch=sm_90a -O3 -I include bench/micro/wgmma_rate.cu -o /tmp/wgmma_rate && /tmp/wgmma_rate
#include <cstdio>
#include <cuda_runtime.h>

#include "tessera/device/arch/wgmma.cuh"

#include "rate_common.cuh"

using namespace tessera;

constexpr int kIters = 2048;  // groups of 8 wgmmas per warpgroup
__device__ int g_random_data = 0;

// NOISE 0: the warpgroups that issue no wgmma do nothing; 1-3: rate_common.cuh.

// NOISE 4: one thread spins on an mbarrier that never completes (a waiting
// producer); 5: one thread streams 32 KB bulk copies (global -> shared, as the
// TMA's K / V loads do) into the upper 16 KB of shared memory, back to back.
__device__ void noise_barrier_or_bulk(int kind, u32 smem_base, const void* src, long long until) {
  __shared__ __align__(8) unsigned long long bar;
  const u32 b = static_cast<u32>(__cvta_generic_to_shared(&bar));
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(b), "r"(1) : "memory");
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  u32 phase = 0;
  while (clock64() < until) {
    if (kind == 5) {
      for (int i = 0; i < 2; ++i) {
        asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(b), "r"(16384) : "memory");
        asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(
                         smem_base + 49152),
                     "l"(src), "r"(16384), "r"(b)
                     : "memory");
        u32 done = 0;
        while (!done)
          asm volatile("{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
                       : "=r"(done)
                       : "r"(b), "r"(phase)
                       : "memory");
        phase ^= 1;
      }
    } else {
      u32 done = 0;
      asm volatile("{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
                   : "=r"(done)
                   : "r"(b), "r"(1u)
                   : "memory");
      if (done) break;  // never: nothing arrives
    }
  }
}

// N8 (row sums, prefill_sm90/mma.cuh): 1 adds eight m64n8k16 RS wgmmas (P
// times ones) after each group of 8; 2 issues only those.
template <bool RS, int CHAINS, int N8 = 0>
__global__ void __launch_bounds__(384) rate(int active_wgs, long long* cycles, float* sink, int noise, const void* src) {
#if defined(__CUDA_ARCH__) && TESSERA_HAS_WGMMA
  extern __shared__ __align__(1024) unsigned char smem[];
  const int wg = threadIdx.x / 128;
  // Operands near 1.0 (few toggling bits) or random fp16 in (-2, 2) (random
  // data: every multiplier bit toggles, as with real keys and queries).
  for (int i = threadIdx.x; i < 64 * 1024 / 4; i += blockDim.x) {
    u32 h = i * 2654435761u;
    h ^= h >> 15;
    h *= 2246822519u;
    h ^= h >> 13;
    reinterpret_cast<u32*>(smem)[i] = g_random_data ? (h & 0xbfffbfffu) : 0x3c003c00u ^ (h & 0x03ff03ffu);
  }
  fence_proxy_async();
  __syncthreads();
  if (wg >= active_wgs) {
    if (noise >= 4) {
      if (wg == 2 && threadIdx.x % 128 == 0)
        noise_barrier_or_bulk(noise, static_cast<u32>(__cvta_generic_to_shared(smem)), src,
                              clock64() + static_cast<long long>(kIters) * 8 * 70);
      return;
    }
    if (noise == 0 || wg == 2) return;
    // Busy ALU work on the other warpgroup for about as long as the wgmmas take.
    run_noise(noise, static_cast<long long>(kIters) * 8 * 70, sink);
    return;
  }
  const u32 base = static_cast<u32>(__cvta_generic_to_shared(smem));
  const u64 a_desc = wgmma_desc(base + wg * 8192, 16, 1024);
  const u64 b_desc = wgmma_desc(base + 32768, 16, 1024);
  float d0[64], d1[64], d8[4] = {0.f, 0.f, 0.f, 0.f};
  for (int i = 0; i < 64; ++i) d0[i] = d1[i] = 0.f;
  u32 a[4] = {0x3c003c00u, 0x3c003c00u ^ threadIdx.x, 0x3c003c00u, 0x3c003c00u};
  if (g_random_data)
    for (int i = 0; i < 4; ++i) a[i] = ((threadIdx.x * 4 + i) * 2654435761u ^ 0x5bd1e995u * (i + 1)) & 0xbfffbfffu;
  const long long t0 = clock64();
  for (int it = 0; it < kIters; ++it) {
    wgmma_fence();
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      if constexpr (N8 == 2) {
        wgmma_rs(d8, a, b_desc + 2 * k, 1, half_t{}, WgmmaN<8>{});
        continue;
      }
      if constexpr (RS) wgmma_rs_tb(d0, a, b_desc + 2 * k, 1, half_t{}, WgmmaN<128>{});
      else wgmma_ss(d0, a_desc + 2 * k, b_desc + 2 * k, 1, half_t{}, WgmmaN<128>{});
      if constexpr (CHAINS == 2) wgmma_ss(d1, a_desc + 2 * k + 64, b_desc + 2 * k + 64, 1, half_t{}, WgmmaN<128>{});
    }
    if constexpr (N8 == 1)
#pragma unroll
      for (int k = 0; k < 8; ++k) wgmma_rs(d8, a, b_desc + 2 * k, 1, half_t{}, WgmmaN<8>{});
    wgmma_commit();
    wgmma_wait<0>();
    wgmma_keep(d8);
    wgmma_keep(d0);
    wgmma_keep(d1);
  }
  const long long t1 = clock64();
  float s = 0.f;
  for (int i = 0; i < 64; ++i) s += d0[i] + d1[i];
  s += d8[0];
  if (threadIdx.x % 128 == 0 && blockIdx.x == 0) cycles[wg] = t1 - t0;
  if (s == 12345.f) sink[threadIdx.x] = s;
#endif
}

template <bool RS, int CHAINS, int N8 = 0>
void run(const char* name, int wgs, int sms, long long* dcyc, float* sink, int noise = 0, const void* src = nullptr) {
  auto k = rate<RS, CHAINS, N8>;
  cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, 65536);
  k<<<sms, 384, 65536>>>(wgs, dcyc, sink, noise, src);
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  cudaEventRecord(e0);
  k<<<sms, 384, 65536>>>(wgs, dcyc, sink, noise, src);
  cudaEventRecord(e1);
  if (cudaEventSynchronize(e1) != cudaSuccess) { printf("%s: %s\n", name, cudaGetErrorString(cudaGetLastError())); return; }
  float ms = 0;
  cudaEventElapsedTime(&ms, e0, e1);
  long long cyc[3] = {0, 0, 0};
  cudaMemcpy(cyc, dcyc, sizeof(cyc), cudaMemcpyDeviceToHost);
  const double wgmmas = double(kIters) * 8 * CHAINS;  // per warpgroup
  const double flops = wgmmas * 64 * 128 * 16 * 2 * wgs * sms;
  printf("%-22s wgs %d noise %d: %6.1f cycles / wgmma / warpgroup, %6.1f TFLOP/s\n", name, wgs, noise,
         double(cyc[0]) / wgmmas, flops / (ms * 1e-3) / 1e12);
}

int main() {
  const RateBuffers buf;
  const int sms = buf.sms;
  long long* dcyc = buf.cycles;
  float* sink = buf.sink;
  // Row-sum companions: 8 x m64n8k16 after 8 x m64n128k16 (RS), or alone
  // (cycles still per m64n128k16-sized slot: 8 per group).
  for (int wgs = 1; wgs <= 2; ++wgs) {
    run<true, 1, 1>("RS + 8 n8", wgs, sms, dcyc, sink);
    run<true, 1, 2>("n8 only", wgs, sms, dcyc, sink);
  }
  for (int wgs = 1; wgs <= 3; ++wgs) {
    run<false, 1>("SS one chain", wgs, sms, dcyc, sink);
    run<true, 1>("RS one chain", wgs, sms, dcyc, sink);
    run<false, 2>("SS two chains", wgs, sms, dcyc, sink);
  }
  // One warpgroup's wgmmas while the second runs ALU work (the ping-pong
  // situation: one warpgroup's GEMMs beside the other's softmax).
  void* src;
  cudaMalloc(&src, 1 << 20);
  cudaMemset(src, 0, 1 << 20);
  for (int noise = 1; noise <= 5; ++noise) {
    run<false, 1>("SS one chain", 1, sms, dcyc, sink, noise, src);
    run<true, 1>("RS one chain", 1, sms, dcyc, sink, noise, src);
  }
  // Both warpgroups issuing while the bulk copies stream (the no-turn kernel).
  run<false, 1>("SS one chain", 2, sms, dcyc, sink, 5, src);
  // Random operands (real data toggles every multiplier bit).
  const int one = 1;
  cudaMemcpyToSymbol(g_random_data, &one, sizeof(one));
  printf("random operands:\n");
  for (int wgs = 1; wgs <= 2; ++wgs) {
    run<false, 1>("SS one chain", wgs, sms, dcyc, sink);
    run<true, 1>("RS one chain", wgs, sms, dcyc, sink);
  }
  run<false, 1>("SS one chain", 1, sms, dcyc, sink, 3, src);
  return 0;
}
