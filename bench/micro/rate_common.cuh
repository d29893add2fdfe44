// Shared by the rate microbenchmarks (wgmma_rate.cu, mma_sync_rate.cu): what
// the warps that issue no tensor-core work do meanwhile (NOISE: 1 FFMA
// chains, 2 MUFU.EX2 chains, 3 a softmax-like mix of FMNMX, FFMA, EX2, FADD),
// and the buffers every run needs.
#pragma once

__device__ __forceinline__ float noise_step(int kind, float x, float y) {
  if (kind == 1) return fmaf(x, 1.0001f, y);
  if (kind == 2) return exp2f(x * -0.5f);
  return fmaxf(x, y) + exp2f(fmaf(x, 0.5f, -y));
}

// Eight independent chains of noise_step(kind) for `cycles` clock cycles; the
// result is kept alive through `sink` (written only if it is 12345).
__device__ __forceinline__ void run_noise(int kind, long long cycles, float* sink) {
  float x[8];
  for (int i = 0; i < 8; ++i) x[i] = threadIdx.x * 0.001f + i;
  const long long t0 = clock64();
  while (clock64() - t0 < cycles) {
#pragma unroll
    for (int r = 0; r < 32; ++r)
#pragma unroll
      for (int i = 0; i < 8; ++i) x[i] = noise_step(kind, x[i], x[(i + 1) % 8]);
  }
  float s = 0.f;
  for (int i = 0; i < 8; ++i) s += x[i];
  if (s == 12345.f) sink[threadIdx.x] = s;
}

// What every rate run needs: the SM count, a few long longs for the first
// CTA's cycle counts, and the sink.
struct RateBuffers {
  int sms = 0;
  long long* cycles = nullptr;
  float* sink = nullptr;
  RateBuffers() {
    cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
    cudaMalloc(&cycles, 64);
    cudaMalloc(&sink, 1 << 16);
  }
};
