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
// Then the same nodes as Tessera loads its kernels: compiled by NVRTC and
// loaded with cudaLibraryLoadData (a cudaKernel_t per node, as
// LoadedKernel launches them), with and without a prefill kernel's launch
// shape (132 x 384 threads, 200 KB of dynamic shared memory).
// Prints one line per combination: host us of the launch alone.
//   nvcc -std=c++17 -arch=sm_90a -O3 bench/micro/graph_launch.cu -lnvrtc -o /tmp/graph_launch && /tmp/graph_launch
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include <cuda_runtime.h>
#include <nvrtc.h>

#include "cuda_check.cuh"

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

// The node kernel of `capture`, compiled at run time and loaded as a library.
const char* kNodeSource = R"(
struct Block { unsigned char b[1024]; };
extern "C" __global__ void node(const Block p, int* out) {
  extern __shared__ int smem[];
  asm volatile("griddepcontrol.wait;" ::: "memory");
  if (threadIdx.x == 0 && blockIdx.x == 0 && p.b[0] == 255) *out = smem[0];
  asm volatile("griddepcontrol.launch_dependents;");
}
)";

cudaKernel_t load_library_node() {
  nvrtcProgram prog;
  if (nvrtcCreateProgram(&prog, kNodeSource, "node.cu", 0, nullptr, nullptr) != NVRTC_SUCCESS) std::exit(1);
  const char* opts[] = {"--gpu-architecture=sm_90a", "-std=c++17"};
  if (nvrtcCompileProgram(prog, 2, opts) != NVRTC_SUCCESS) {
    std::fprintf(stderr, "nvrtc failed\n");
    std::exit(1);
  }
  size_t n = 0;
  nvrtcGetCUBINSize(prog, &n);
  std::vector<char> cubin(n);
  nvrtcGetCUBIN(prog, cubin.data());
  nvrtcDestroyProgram(&prog);
  cudaLibrary_t lib;
  CHECK(cudaLibraryLoadData(&lib, cubin.data(), nullptr, nullptr, 0, nullptr, nullptr, 0));
  cudaKernel_t k;
  CHECK(cudaLibraryGetKernel(&k, lib, "node"));
  return k;
}

cudaGraphExec_t capture_library(cudaStream_t s, cudaKernel_t k, bool prefill_shape, int* out) {
  cudaGraph_t g;
  CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  Block<1024> p{};
  void* args[] = {&p, &out};
  for (int i = 0; i < 33; ++i) {
    cudaLaunchConfig_t cfg{};
    cfg.gridDim = dim3(132);
    cfg.blockDim = dim3(prefill_shape ? 384 : 128);
    cfg.dynamicSmemBytes = prefill_shape ? 200 << 10 : 0;
    cfg.stream = s;
    cudaLaunchAttribute attr{};
    attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr.val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = &attr;
    cfg.numAttrs = 1;
    CHECK(cudaLaunchKernelExC(&cfg, reinterpret_cast<const void*>(k), args));
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
  int dev_id = 0;
  CHECK(cudaGetDevice(&dev_id));
  const cudaKernel_t k = load_library_node();
  CHECK(cudaKernelSetAttributeForDevice(k, cudaFuncAttributeMaxDynamicSharedMemorySize, 200 << 10, dev_id));
  for (bool prefill_shape : {false, true}) {
    cudaGraphExec_t g = capture_library(s, k, prefill_shape, out);
    CHECK(cudaGraphLaunch(g, s));  // upload
    CHECK(cudaStreamSynchronize(s));
    for (bool after_busy : {false, true}) {
      std::vector<double> us;
      for (int r = 0; r < 50; ++r) {
        if (after_busy) busy<<<1, 32, 0, s>>>(two_ms);
        CHECK(cudaStreamSynchronize(s));
        const auto t0 = std::chrono::steady_clock::now();
        CHECK(cudaGraphLaunch(g, s));
        us.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
      }
      CHECK(cudaStreamSynchronize(s));
      std::sort(us.begin(), us.end());
      std::printf("library kernels (NVRTC), params 1024 B, pdl 1, %s, GPU just idle %d: launch %.1f us host (median of "
                  "50)\n",
                  prefill_shape ? "132 x 384 threads, 200 KB smem" : "132 x 128 threads, no smem", after_busy,
                  us[us.size() / 2]);
    }
    CHECK(cudaGraphExecDestroy(g));
  }
  return 0;
}
