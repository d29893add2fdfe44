// Programmatic dependent launch (sm_90): a kernel launched with the
// programmatic-stream-serialization attribute may start while the kernel
// before it on the stream is still running. It must wait (grid_dependency_wait)
// before it reads anything that kernel may write or writes anything it may
// read; until then it can only set itself up and read what was complete
// before that kernel started (e.g. a plan's workspace). A kernel signals
// (grid_dependency_launch_dependents) when the kernel after it may start.
// Both are no-ops without the attribute, and before sm_90.
#pragma once

namespace tessera {

#if defined(__CUDACC__) || defined(__CUDACC_RTC__)

__device__ __forceinline__ void grid_dependency_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}

__device__ __forceinline__ void grid_dependency_launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" :::);
#endif
}

#endif

}  // namespace tessera
