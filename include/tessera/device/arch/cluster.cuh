// Thread-block clusters (sm_90): CTAs of one cluster run at once on
// neighbouring SMs, see each other's shared memory and barriers (distributed
// shared memory), and can receive one TMA copy together (multicast). A kernel
// gets its cluster shape from __cluster_dims__ at compile time.
#pragma once
#include "tessera/device/arch/numeric.cuh"

namespace tessera {

#if defined(__CUDACC__) || defined(__CUDACC_RTC__)

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
// This CTA's index within its cluster.
__device__ __forceinline__ int cluster_rank() {
  u32 r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(r));
  return static_cast<int>(r);
}

// Every thread of every CTA of the cluster arrives and waits (release /
// acquire): shared-memory writes before it are visible to the whole cluster.
__device__ __forceinline__ void cluster_sync() {
  asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;\n" ::: "memory");
}

// Makes mbarrier.init visible to the other CTAs of the cluster (before a
// cluster_sync), so their remote arrivals and multicast copies find it.
__device__ __forceinline__ void fence_mbarrier_init_cluster() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}

// The cluster-window address of shared address `addr` in CTA `rank`.
__device__ __forceinline__ u32 cluster_map(u32 addr, int rank) {
  u32 out;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(out) : "r"(addr), "r"(rank));
  return out;
}

// One arrival (release at cluster scope) on a barrier given by its cluster-
// window address, which may be another CTA's.
__device__ __forceinline__ void mbarrier_arrive_cluster(u32 cluster_addr) {
  asm volatile("mbarrier.arrive.shared::cluster.b64 _, [%0];\n" ::"r"(cluster_addr) : "memory");
}
#else
__device__ __forceinline__ int cluster_rank() { return 0; }
__device__ __forceinline__ void cluster_sync() {}
__device__ __forceinline__ void fence_mbarrier_init_cluster() {}
__device__ __forceinline__ u32 cluster_map(u32 addr, int) { return addr; }
__device__ __forceinline__ void mbarrier_arrive_cluster(u32) {}
#endif

#endif

}  // namespace tessera
