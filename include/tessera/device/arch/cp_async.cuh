// Ampere-style asynchronous global->shared copies (cp.async, sm_80+): 16-byte
// copies that bypass registers, grouped into commit groups that the consumer
// waits on. A copy whose predicate is false writes zeros instead, so a tile
// past the end of a sequence never holds stale data (no NaN * 0 surprises).
#pragma once
#include "tessera/device/arch/numeric.cuh"

namespace tessera {

#if defined(__CUDACC__) || defined(__CUDACC_RTC__)

// Shared-memory address of a generic pointer into shared memory (pure: the
// compiler may reuse it).
__device__ __forceinline__ u32 smem_addr(const void* p) {
  u32 addr;
  asm("{ .reg .u64 a; cvta.to.shared.u64 a, %1; cvt.u32.u64 %0, a; }" : "=r"(addr) : "l"(p));
  return addr;
}

// 16 bytes at a shared-memory address (32-bit, as smem_addr gives): loads
// and stores that keep no 64-bit generic pointer live (register-lean warps).
__device__ __forceinline__ uint4 ld_shared_16(u32 addr) {
  uint4 v;
  asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];\n" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "r"(addr));
  return v;
}
__device__ __forceinline__ void st_shared_16(u32 addr, const uint4& v) {
  asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};\n" ::"r"(addr), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w));
}
__device__ __forceinline__ u32 ld_shared_u32(u32 addr) {
  u32 v;
  asm volatile("ld.shared.b32 %0, [%1];" : "=r"(v) : "r"(addr));
  return v;
}
__device__ __forceinline__ uint2 ld_shared_u32x2(u32 addr) {
  uint2 v;
  asm volatile("ld.shared.v2.b32 {%0, %1}, [%2];" : "=r"(v.x), "=r"(v.y) : "r"(addr));
  return v;
}

// 16 bytes global -> shared, cached in L2 only (streaming KV is read once).
__device__ __forceinline__ void cp_async_16(void* smem, const void* gmem, bool pred) {
  const int src_bytes = pred ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(smem)), "l"(gmem), "r"(src_bytes));
}

// The same with a shared-memory address (for loops that step it themselves).
__device__ __forceinline__ void cp_async_16(u32 smem, const void* gmem, bool pred) {
  const int src_bytes = pred ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem), "l"(gmem), "r"(src_bytes));
}

// The same, but a false predicate ignores the source (cp.async's
// ignore-src: zeros, nothing read), so its address need not be valid and
// the caller selects none. WHOLE_LINE asks the L2 to fetch the chunk's whole
// 128-byte line from DRAM at once (cp.async's L2::128B prefetch size), for
// copies whose line the CTA reads all of.
template <bool WHOLE_LINE = false>
__device__ __forceinline__ void cp_async_16_or_zeros(u32 smem, const void* gmem, bool pred) {
  if constexpr (WHOLE_LINE)
    asm volatile(
        "{\n .reg .pred skip;\n setp.eq.u32 skip, %2, 0;\n cp.async.cg.shared.global.L2::128B [%0], [%1], 16, skip;\n}\n" ::"r"(
            smem),
        "l"(gmem), "r"(static_cast<u32>(pred)));
  else
    asm volatile(
        "{\n .reg .pred skip;\n setp.eq.u32 skip, %2, 0;\n cp.async.cg.shared.global [%0], [%1], 16, skip;\n}\n" ::"r"(smem),
        "l"(gmem), "r"(static_cast<u32>(pred)));
}

// 4 bytes global -> shared through L1 (small tables such as page ids).
__device__ __forceinline__ void cp_async_4(void* smem, const void* gmem, bool pred) {
  const int src_bytes = pred ? 4 : 0;
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(smem_addr(smem)), "l"(gmem), "r"(src_bytes));
}

__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }

// Waits until at most N of this thread's commit groups are still in flight.
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

// Waits for all of this thread's copies, committed or not.
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_all;\n" ::: "memory"); }

// Makes the mbarrier at shared address `bar` receive one arrival when all of
// this thread's earlier cp.async copies have landed (without raising its
// expected count: a barrier fed this way by N threads is initialized with N).
// Lets a producer warp stream tiles without waiting for its own copies.
__device__ __forceinline__ void cp_async_arrive_noinc(u32 bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(bar) : "memory");
}

#endif

}  // namespace tessera
