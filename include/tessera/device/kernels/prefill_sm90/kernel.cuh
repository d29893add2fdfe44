// Prefill (Hopper template, sm_90a), persistent warp-specialized kernel
// (paper §3.2 and Appendix B; the FA3 design): CTA (x, kv_head) runs the
// planner's work queue of (query tile x KV chunk) items with one producer
// warpgroup (Sm90Producer: TMA tile loads, or cp.async gathers from any KV
// source, into rings of shared-memory stages) and CTA_Q / 64 consumer
// warpgroups (Sm90Consumer:
// wgmma mainloop, softmax overlapped with the tensor cores, shared epilogue
// and split-KV merge). setmaxnreg moves registers from the producer, which
// only computes addresses, to the consumers, which hold S, P and O.
#pragma once
#include "tessera/device/arch/cluster.cuh"
#include "tessera/device/kernels/prefill_sm90/mainloop_consumer.cuh"
#include "tessera/device/kernels/prefill_sm90/mainloop_producer.cuh"

namespace tessera {

#if defined(__CUDACC__) || defined(__CUDACC_RTC__)

// Register split per thread (producer, consumer) for CONSUMERS consumer
// warpgroups and CTAS CTAs per SM: the whole 64K-register file, the
// producer keeping what its address arithmetic needs. ptxas fits each side
// into its setmaxnreg count: with one consumer warpgroup, 40 producer
// registers spilled 28-188 bytes, 64 none, and the consumer of a 64-row
// tile fits 192 (head dims 64 / 128).
template <int CONSUMERS, int CTAS>
struct Sm90Registers {
  static constexpr int PRODUCER = CONSUMERS == 2 ? 56 : 64;
  static constexpr int CONSUMER = CONSUMERS == 2 ? 224 : (CTAS == 2 ? 192 : 240);
  static_assert((PRODUCER + CONSUMERS * CONSUMER) * 128 * CTAS <= 65536, "register file");
};

template <int HEAD_DIM, int CTA_Q, int CTA_KV, typename Rings>
struct Sm90Shape {
  static constexpr int THREADS = 128 * (CTA_Q / 64 + 1);
  static constexpr int Q_ELEMS = CTA_Q * HEAD_DIM, KV_ELEMS = CTA_KV * HEAD_DIM;
  // Dynamic shared memory (mirrored by prefill_config on the host): the Q
  // buffers, the K and V stages, + 1024 bytes of alignment slack (wgmma's
  // swizzle repeats every 1024 bytes).
  static constexpr int SMEM_BYTES =
      2 * (Rings::Q_BUFS * Q_ELEMS + (Rings::K_STAGES + Rings::V_STAGES) * KV_ELEMS) + 1024;
};

// CLUSTER = 2: the CTAs of a cluster pair up on one work queue whose items
// are 2 * CTA_Q rows (the planner's query tile), each CTA taking one half
// (they swap halves every item): both stream the same K and V tiles,
// which each tile's TMA copies deliver to both CTAs at once (multicast), so
// L2 serves each tile once per pair. (Skipping every other K / V tile copy
// lifted 16k causal prefill from 564 to 616 TFLOP/s in a bound measurement:
// the kernels run at the power cap. The pairs,
// which halve only the L2 reads, measured within +-3% of single CTAs at
// 8k-16k and 5% slower at 1k, so they are opt-in: PrefillOptions::cluster.)
template <typename Variant, typename DQ, typename DKV, typename DO, int HEAD_DIM, int CTA_Q, int CTA_KV, int K_STAGES,
          int V_STAGES, int Q_BUFS, int CTAS_PER_SM, int CLUSTER, typename Params>
__device__ __forceinline__ void batch_prefill_sm90(const Params& p, const Sm90TensorMaps& tma) {
  using Rings = Sm90Rings<K_STAGES, V_STAGES, Q_BUFS>;
  using Shape = Sm90Shape<HEAD_DIM, CTA_Q, CTA_KV, Rings>;
  using Regs = Sm90Registers<CTA_Q / 64, CTAS_PER_SM>;
  static_assert(sizeof(DQ) == 2 && sizeof(DKV) == 2 && (sizeof(DO) == 2 || sizeof(DO) == 4),
                "16-bit q and kv; 16- or 32-bit o");
  static_assert(CTA_Q == 64 || CTA_Q == 128, "one or two consumer warpgroups of 64 query rows");
  static_assert(HEAD_DIM == 64 || HEAD_DIM == 128 || HEAD_DIM == 256, "wgmma tiles for head_dim 64, 128 and 256");
  static_assert(CLUSTER == 1 || CLUSTER == 2, "single CTAs or pairs");
  extern __shared__ uint4 smem_raw[];
  __shared__ Sm90Pipeline<Rings> pipe;
  __shared__ __align__(16) i64 row_offs[4 * CTA_KV];  // the producer's paged row-offset tables
  DKV* q_smem = reinterpret_cast<DKV*>((reinterpret_cast<size_t>(smem_raw) + 1023) & ~size_t(1023));
  DKV* k_smem = q_smem + Q_BUFS * Shape::Q_ELEMS;  // q is stored as DKV: the MMA needs one operand type
  DKV* v_smem = k_smem + K_STAGES * Shape::KV_ELEMS;
  using Producer = Sm90Producer<Variant, DKV, HEAD_DIM, CTA_Q, CTA_KV, Rings, CLUSTER, Params>;
  const bool kv_tma = Producer::uses_tma(tma) && p.kv.indices == nullptr;  // paged KV is gathered
  const bool q_tma = tma.q_on != 0;
  constexpr int kConsumers = Shape::THREADS - 128;
  if (threadIdx.x == 0) {
    pipe.init(kConsumers, CLUSTER == 1 ? kConsumers : CLUSTER * kConsumers / 32, kv_tma ? 1 : 128, q_tma ? 1 : 128);
    if constexpr (CLUSTER > 1) fence_mbarrier_init_cluster();
  }
  if constexpr (CLUSTER > 1) {
    cluster_sync();  // the peer's barriers exist before any copy or arrival reaches them
  } else {
    __syncthreads();
  }

  if (threadIdx.x < 128) {
    setmaxnreg_dec<Regs::PRODUCER>();
    Producer(p, pipe, q_smem, k_smem, v_smem, row_offs).run(tma, kv_tma, q_tma);
  } else {
    setmaxnreg_inc<Regs::CONSUMER>();
    Sm90Consumer<Variant, DKV, DO, HEAD_DIM, CTA_Q, CTA_KV, Rings, CLUSTER, Params>(p, pipe, q_smem, k_smem, v_smem).run();
  }
  // No CTA leaves while its peer may still copy into its shared memory or
  // arrive on its barriers.
  if constexpr (CLUSTER > 1) cluster_sync();
}

#endif

}  // namespace tessera
