// Prefill (Hopper template), the shared-memory pipeline between the producer
// warpgroup and the consumer warpgroups: mbarriers of the Q buffers and of
// each K and V stage, and the running position in those rings. The rings
// have their own depths: V is consumed a step later than K (P V runs with
// the next tile's Q K^T) and released only after it, so it needs one stage
// more to stay ahead of the consumers.
// K and V have separate barriers so a consumer can start S = Q K^T while V is
// still landing, and release K as soon as S is done (FA3's schedule).
#pragma once
#include "tessera/device/arch/cp_async.cuh"
#include "tessera/device/arch/mbarrier.cuh"

namespace tessera {

#if defined(__CUDACC__) || defined(__CUDACC_RTC__)

// Named barriers (0 is __syncthreads).
constexpr int kSm90ConsumersBar = 1;  // all consumer warpgroups (epilogue merge)
constexpr int kSm90QueryBar = 4;      // 4, 5: one consumer warpgroup (query transform)
constexpr int kSm90ProducerBar = 6;   // the producer warpgroup (key / value transforms)
constexpr int kSm90PairBar = 7;       // every thread, between two plans of one launch (prefill_sm90/pair.cuh)

// Ring depths of the Hopper prefill pipeline: K stages, V stages, Q buffers.
template <int K, int V, int Q>
struct Sm90Rings {
  static constexpr int K_STAGES = K, V_STAGES = V, Q_BUFS = Q;
  static_assert(K >= 2 && V >= 2 && (Q == 1 || Q == 2), "at least double-buffered K and V, one or two Q buffers");
};

template <typename Rings>
struct Sm90Pipeline {
  static constexpr int KS = Rings::K_STAGES, VS = Rings::V_STAGES, QB = Rings::Q_BUFS;
  u64 q_full[QB], q_empty[QB];
  u64 k_full[KS], k_empty[KS], v_full[VS], v_empty[VS];

  // Full barriers count the producer warpgroup's 128 arrivals (one per
  // thread, when its copies landed), or for tiles loaded by the TMA one
  // arrival with the tile's bytes; Q's empty ones every consumer thread's;
  // K's and V's `kv_consumers` (every consumer thread's, or in a cluster one
  // per consumer warp of every CTA: each CTA's copy lands in all of them).
  __device__ __forceinline__ void init(int q_consumers, int kv_consumers, int kv_producers, int q_producers) {
    for (int i = 0; i < QB; ++i) {
      mbarrier_init(smem_addr(&q_full[i]), q_producers);
      mbarrier_init(smem_addr(&q_empty[i]), q_consumers);
    }
    for (int i = 0; i < KS; ++i) {
      mbarrier_init(smem_addr(&k_full[i]), kv_producers);
      mbarrier_init(smem_addr(&k_empty[i]), kv_consumers);
    }
    for (int i = 0; i < VS; ++i) {
      mbarrier_init(smem_addr(&v_full[i]), kv_producers);
      mbarrier_init(smem_addr(&v_empty[i]), kv_consumers);
    }
  }
};

// Shared addresses of the pipeline's barriers from one base (layout of
// Sm90Pipeline), so loops add small constants instead of converting a
// generic pointer per barrier.
template <typename Rings>
struct Sm90Barriers {
  static constexpr int KS = Rings::K_STAGES, VS = Rings::V_STAGES, QB = Rings::Q_BUFS;
  u32 base;
  __device__ __forceinline__ explicit Sm90Barriers(Sm90Pipeline<Rings>& p) : base(smem_addr(&p)) {}
  __device__ __forceinline__ u32 q_full(int i) const { return base + 8 * i; }
  __device__ __forceinline__ u32 q_empty(int i) const { return base + 8 * (QB + i); }
  __device__ __forceinline__ u32 k_full(int s) const { return base + 8 * (2 * QB + s); }
  __device__ __forceinline__ u32 k_empty(int s) const { return base + 8 * (2 * QB + KS + s); }
  __device__ __forceinline__ u32 v_full(int s) const { return base + 8 * (2 * QB + 2 * KS + s); }
  __device__ __forceinline__ u32 v_empty(int s) const { return base + 8 * (2 * QB + 2 * KS + VS + s); }
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
