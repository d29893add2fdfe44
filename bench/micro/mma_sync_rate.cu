// How fast can mma.sync (m16n8k16, fp16 in, fp32 accumulate) drive an H100's
// tensor cores, and what does softmax-like ALU work beside it cost? The FA2
// template's ceiling on Hopper. Every CTA (one per SM) runs WARPS warps; the
// first `active` of them issue chains of 16 independent HMMAs (an S tile of
// 32 x 64 per warp, as the template's QK step), with operands in registers
// (no shared memory), the rest run NOISE: 1 FFMA chains, 2 MUFU.EX2, 3 a
// softmax-like mix. Prints cycles per HMMA per warp (and, without noise, the
// SM-wide TFLOP/s). H100 (bench/results/mma-sync-rate-*): 6.2 cycles per
// HMMA with one warp per scheduler (608 TFLOP/s), 630-639 TFLOP/s with 2-4;
// an FFMA stream on the scheduler's other warp triples the HMMA's cycles
// (18.5), EX2 makes them 9.0 and a softmax mix 10.7.
//   nvcc -std=c++17 -arch=sm_90a -O3 -I include bench/micro/mma_sync_rate.cu -o /tmp/mma_rate && /tmp/mma_rate
#include <cstdio>
#include <cuda_runtime.h>

#include "tessera/device/arch/mma.cuh"

#include "rate_common.cuh"

using namespace tessera;

constexpr int kIters = 4096;  // groups of 16 HMMAs per warp
constexpr int kAcc = 16;


__global__ void __launch_bounds__(512) rate(int active, long long* cycles, float* sink, int noise, long long noise_cycles) {
  const int warp = threadIdx.x / 32;
  if (warp >= active) {
    if (noise != 0) run_noise(noise, noise_cycles, sink);
    return;
  }
  float d[kAcc][4];
  for (int i = 0; i < kAcc; ++i)
    for (int e = 0; e < 4; ++e) d[i][e] = 0.f;
  u32 a[4], b[2];
  for (int i = 0; i < 4; ++i) a[i] = ((threadIdx.x * 4 + i) * 2654435761u ^ 0x5bd1e995u * (i + 1)) & 0xbfffbfffu;
  for (int i = 0; i < 2; ++i) b[i] = ((threadIdx.x * 2 + i) * 2246822519u ^ 0x27d4eb2fu * (i + 3)) & 0xbfffbfffu;
  const long long t0 = clock64();
  for (int it = 0; it < kIters; ++it) {
#pragma unroll
    for (int i = 0; i < kAcc; ++i) mma_16816(d[i], a, b, half_t{});
  }
  const long long t1 = clock64();
  float s = 0.f;
  for (int i = 0; i < kAcc; ++i)
    for (int e = 0; e < 4; ++e) s += d[i][e];
  if (threadIdx.x == 0 && blockIdx.x == 0) cycles[0] = t1 - t0;
  if (s == 12345.f) sink[threadIdx.x] = s;
}

void run(int warps, int active, int sms, long long* dcyc, float* sink, int noise, long long noise_cycles) {
  rate<<<sms, 32 * warps>>>(active, dcyc, sink, noise, noise_cycles);
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  cudaEventRecord(e0);
  rate<<<sms, 32 * warps>>>(active, dcyc, sink, noise, noise_cycles);
  cudaEventRecord(e1);
  if (cudaEventSynchronize(e1) != cudaSuccess) {
    printf("error: %s\n", cudaGetErrorString(cudaGetLastError()));
    return;
  }
  float ms = 0;
  cudaEventElapsedTime(&ms, e0, e1);
  long long cyc = 0;
  cudaMemcpy(&cyc, dcyc, sizeof(cyc), cudaMemcpyDeviceToHost);
  const double hmmas = double(kIters) * kAcc;  // per warp
  const double flops = hmmas * 16 * 8 * 16 * 2 * active * sms;
  // With noise, the kernel's time is the noise warps' (a fixed number of
  // cycles): only the HMMA warps' own cycles say anything.
  if (noise == 0)
    printf("warps %2d hmma warps %2d          : %6.2f cycles / HMMA / warp, %6.1f TFLOP/s\n", warps, active,
           double(cyc) / hmmas, flops / (ms * 1e-3) / 1e12);
  else
    printf("warps %2d hmma warps %2d noise %d: %6.2f cycles / HMMA / warp\n", warps, active, noise, double(cyc) / hmmas);
}

int main() {
  const RateBuffers buf;
  const int sms = buf.sms;
  long long* dcyc = buf.cycles;
  float* sink = buf.sink;
  for (int w : {4, 8, 12, 16}) run(w, w, sms, dcyc, sink, 0, 0);
  // Half the warps issue HMMAs, the other half ALU work (ping-pong: one
  // group's GEMMs beside the other's softmax).
  for (int noise = 1; noise <= 3; ++noise) {
    run(8, 4, sms, dcyc, sink, noise, 4096LL * 16 * 8);
    run(8, 4, sms, dcyc, sink, noise, 4096LL * 16 * 16);
  }
  return 0;
}
