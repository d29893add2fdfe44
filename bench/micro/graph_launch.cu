// What does the host pay to launch a CUDA graph of one decode step's shape?
// A graph of 33 kernel nodes (a planner and 32 attention layers), timed on
// the host around cudaGraphLaunch (median of 50 launches, the stream
// synchronized before each), with
//   params  each node's parameter block: 16 bytes, or 1 KB (a prefill
//           kernel's parameters and tensor maps);
//   pdl     nodes captured with programmatic dependent launch, or plain;
//   copy    a 256 KB pinned host-to-device copy queued just before the launch
//           (a step's page ids), or none;
//   idle    back to back after the synchronization, or after a 2 ms GPU task
//           queued before it was synchronized (the GPU just went idle).
// Prints one line per combination: host us of the launch alone.
//   nvcc -std=c++17 -arch=sm_90a -O3 bench/micro/graph_launch.cu -o /tmp/graph_launch && /tmp/graph_launch
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include <cuda_runtime.h>

#define CHECK(x)                                                                          \
  do {                                                                                    \
    cudaError_t e_ = (x);                                                                 \
    if (e_ != cudaSuccess) {                                                              \
      std::fprintf(stderr, "%s failed: %s (line %d)\n", #x, cudaGetErrorString(e_), __LINE__); \
      std::exit(1);                                                                       \
    }                                                                                     \
  } while (0)

template <int BYTES>
struct Block {
  unsigned char b[BYTES];
};

template <int BYTES>
__global__ void node(const Block<BYTES> p, int* out) {
  asm volatile("griddepcontrol.wait;" ::: "memory");
  if (threadIdx.x == 0 && blockIdx.x == 0 && p.b[0] == 255) *out = 1;
  asm volatile("griddepcontrol.launch_dependents;");
}

__global__ void busy(long long cycles) {
  const long long t0 = clock64();
  while (clock64() - t0 < cycles) {
  }
}

template <int BYTES>
cudaGraphExec_t capture(cudaStream_t s, bool pdl, int* out) {
  cudaGraph_t g;
  CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  Block<BYTES> p{};
  for (int i = 0; i < 33; ++i) {
    cudaLaunchConfig_t cfg{};
    cfg.gridDim = dim3(132);
    cfg.blockDim = dim3(128);
    cfg.stream = s;
    cudaLaunchAttribute attr{};
    attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr.val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = &attr;
    cfg.numAttrs = pdl ? 1 : 0;
    CHECK(cudaLaunchKernelEx(&cfg, node<BYTES>, p, out));
  }
  CHECK(cudaStreamEndCapture(s, &g));
  cudaGraphExec_t e;
  CHECK(cudaGraphInstantiate(&e, g, 0));
  CHECK(cudaGraphDestroy(g));
  return e;
}

int main() {
  cudaStream_t s;
  CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  int* out;
  CHECK(cudaMalloc(&out, sizeof(int)));
  void *host, *dev;
  CHECK(cudaMallocHost(&host, 256 << 10));
  CHECK(cudaMalloc(&dev, 256 << 10));
  int khz = 0;
  CHECK(cudaDeviceGetAttribute(&khz, cudaDevAttrClockRate, 0));
  const long long two_ms = static_cast<long long>(khz) * 2;
  for (int bytes : {16, 1024})
    for (bool pdl : {false, true}) {
      cudaGraphExec_t g = bytes == 16 ? capture<16>(s, pdl, out) : capture<1024>(s, pdl, out);
      CHECK(cudaGraphLaunch(g, s));  // upload
      CHECK(cudaStreamSynchronize(s));
      for (bool copy : {false, true})
        for (bool after_busy : {false, true}) {
          std::vector<double> us;
          for (int r = 0; r < 50; ++r) {
            if (after_busy) busy<<<1, 32, 0, s>>>(two_ms);
            CHECK(cudaStreamSynchronize(s));
            if (copy) CHECK(cudaMemcpyAsync(dev, host, 256 << 10, cudaMemcpyHostToDevice, s));
            const auto t0 = std::chrono::steady_clock::now();
            CHECK(cudaGraphLaunch(g, s));
            us.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
          }
          CHECK(cudaStreamSynchronize(s));
          std::sort(us.begin(), us.end());
          std::printf("params %4d B, pdl %d, 256 KB copy before %d, GPU just idle %d: launch %.1f us host (median of 50)\n",
                      bytes, pdl, copy, after_busy, us[us.size() / 2]);
        }
      CHECK(cudaGraphExecDestroy(g));
    }
  return 0;
}
