// Where does the hardware put the CTAs of a persistent kernel's grid? The
// FA2 template's grids are the plan's queues (columns, X) by KV heads or head
// groups (rows, Y), two CTAs an SM, and when a step has fewer chunks than
// CTAs only the first A columns of every row are busy. This probe launches
// an X x Y grid of CTAs that each hold 100 KB of shared memory (two an SM
// on sm_90), records %smid per CTA, and counts the SMs the busy CTAs occupy
// when row y's queues start at column 0 (the plan's order), at column
// y X / Y (queue_of_cta in common/work_queue.cuh), and in queue-major order
// (CTA l = x + X y serves queue l / Y of row l % Y). Repeats show how much
// the placement varies from launch to launch.
//   nvcc -std=c++17 -arch=sm_90a -O3 bench/micro/cta_placement.cu -o /tmp/cta_placement && /tmp/cta_placement [X Y]
#include <cstdio>
#include <cstdlib>
#include <set>
#include <vector>

#include <cuda_runtime.h>

#include "cuda_check.cuh"

constexpr int kSmemBytes = 100 << 10;

// Every CTA stays resident ~1 ms, so the whole grid is placed before any
// CTA leaves.
__global__ void record_sm(int* sm_of_cta) {
  extern __shared__ char smem[];
  unsigned sm;
  asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
  if (threadIdx.x == 0) sm_of_cta[blockIdx.y * gridDim.x + blockIdx.x] = static_cast<int>(sm);
  const long long t0 = clock64();
  while (clock64() - t0 < 2000000) {
  }
  smem[threadIdx.x] = 1;
}

int main(int argc, char** argv) {
  const int X = argc > 2 ? std::atoi(argv[1]) : 33, Y = argc > 2 ? std::atoi(argv[2]) : 8;
  if (X < 1 || Y < 1) {
    std::fprintf(stderr, "usage: cta_placement [X Y] (X, Y >= 1)\n");
    return 2;
  }
  int sms = 0;
  CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  int* d = nullptr;
  CHECK(cudaMalloc(&d, sizeof(int) * X * Y));
  CHECK(cudaFuncSetAttribute(record_sm, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes));
  std::printf("# %d x %d grid, %d SMs; SMs holding the busy CTAs (A busy queues a row): plan order / "
              "rotated (y X / Y) / queue-major\n",
              X, Y, sms);
  std::vector<int> sm_of(X * Y);
  for (int rep = 0; rep < 5; ++rep) {
    record_sm<<<dim3(X, Y), 256, kSmemBytes>>>(d);
    CHECK(cudaGetLastError());
    CHECK(cudaMemcpy(sm_of.data(), d, sizeof(int) * X * Y, cudaMemcpyDeviceToHost));
    std::printf("launch %d:", rep);
    for (int A : {X / 4, X / 2, 3 * X / 4, X}) {
      if (A < 1) continue;
      std::set<int> plain, rotated, major;
      for (int y = 0; y < Y; ++y)
        for (int q = 0; q < A; ++q) {
          plain.insert(sm_of[y * X + q]);
          // queue q of row y runs on the CTA whose rotated column is q
          rotated.insert(sm_of[y * X + (q + X - static_cast<int>(static_cast<long long>(y) * X / Y % X)) % X]);
          major.insert(sm_of[q * Y + y]);  // CTA l = q Y + y serves queue q of row y
        }
      std::printf("  A=%d: %zu / %zu / %zu", A, plain.size(), rotated.size(), major.size());
    }
    std::printf("\n");
  }
  CHECK(cudaFree(d));
  return 0;
}
