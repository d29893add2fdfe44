// Prefill (Hopper template), the shared-memory pipeline between the producer
// warpgroup and the consumer warpgroups: mbarriers of the double-buffered Q
// tile and of each K and V stage, and the running position in those rings.
// K and V have separate barriers so a consumer can start S = Q K^T while V is
// still landing, and release K as soon as S is done (FA3's schedule).
#pragma once
#include "tessera/device/arch/cp_async.cuh"
#include "tessera/device/arch/mbarrier.cuh"

namespace tessera {

#if defined(__CUDACC__) || defined(__CUDACC_RTC__)

// Named barriers (0 is __syncthreads).
constexpr int kSm90ConsumersBar = 1;  // all consumer warpgroups (epilogue merge)
constexpr int kSm90PingPongBar = 2;   // 2, 3: consumer warpgroup 0 / 1 may issue its GEMMs
constexpr int kSm90QueryBar = 4;      // 4, 5: one consumer warpgroup (query transform)
constexpr int kSm90ProducerBar = 6;   // the producer warpgroup (key / value transforms)

template <int STAGES>
struct Sm90Pipeline {
  u64 q_full[2], q_empty[2];
  u64 k_full[STAGES], k_empty[STAGES], v_full[STAGES], v_empty[STAGES];

  // Full barriers count the producer warpgroup's 128 arrivals (one per
  // thread, when its copies landed); empty ones every consumer thread's.
  __device__ __forceinline__ void init(int consumer_threads) {
    for (int i = 0; i < 2; ++i) {
      mbarrier_init(smem_addr(&q_full[i]), 128);
      mbarrier_init(smem_addr(&q_empty[i]), consumer_threads);
    }
    for (int i = 0; i < STAGES; ++i) {
      mbarrier_init(smem_addr(&k_full[i]), 128);
      mbarrier_init(smem_addr(&v_full[i]), 128);
      mbarrier_init(smem_addr(&k_empty[i]), consumer_threads);
      mbarrier_init(smem_addr(&v_empty[i]), consumer_threads);
    }
  }
};

// Shared addresses of the pipeline's barriers from one base (layout of
// Sm90Pipeline), so loops add small constants instead of converting a
// generic pointer per barrier.
template <int STAGES>
struct Sm90Barriers {
  u32 base;
  __device__ __forceinline__ explicit Sm90Barriers(Sm90Pipeline<STAGES>& p) : base(smem_addr(&p)) {}
  __device__ __forceinline__ u32 q_full(int i) const { return base + 8 * i; }
  __device__ __forceinline__ u32 q_empty(int i) const { return base + 16 + 8 * i; }
  __device__ __forceinline__ u32 k_full(int s) const { return base + 32 + 8 * s; }
  __device__ __forceinline__ u32 k_empty(int s) const { return base + 32 + 8 * (STAGES + s); }
  __device__ __forceinline__ u32 v_full(int s) const { return base + 32 + 8 * (2 * STAGES + s); }
  __device__ __forceinline__ u32 v_empty(int s) const { return base + 32 + 8 * (3 * STAGES + s); }
};

// Position in a ring of N buffers used in order: buffer index and the parity
// of its current use (a consumer waits for "full" with `phase`, a producer for
// "empty" with `phase ^ 1`, which a fresh barrier grants at once).
template <int N>
struct RingPos {
  unsigned count = 0;
  __device__ __forceinline__ int index() const { return static_cast<int>(count % N); }
  __device__ __forceinline__ u32 phase() const { return (count / N) & 1; }
  __device__ __forceinline__ RingPos next() const { return RingPos{count + 1}; }
};

#endif

}  // namespace tessera
