// Prefill (Hopper template, sm_90a), persistent warp-specialized kernel
// (paper §3.2 and Appendix B; the FA3 design): CTA (x, kv_head) runs the
// planner's work queue of (query tile x KV chunk) items with one producer
// warpgroup (Sm90Producer: TMA tile loads, or cp.async gathers from any KV
// source, into rings of shared-memory stages) and CTA_Q / 64 consumer
// warpgroups (Sm90Consumer:
// wgmma mainloop, softmax overlapped with the tensor cores, shared epilogue
// and split-KV merge). setmaxnreg moves registers from the producer, which
// only computes addresses, to the consumers, which hold S, P and O.
// Composed as FlashAttention-3's hopper/ kernel: Sm90PrefillKernel owns the
// shared memory and assembles the mainloop (mainloop_producer.cuh,
// mainloop_consumer.cuh over pipeline.cuh and mma.cuh), the epilogue
// (common/epilogue.cuh) and the scheduler (common/work_queue.cuh).
#pragma once
#include "tessera/abi/shared_memory.cuh"
#include "tessera/device/arch/cluster.cuh"
#include "tessera/device/kernels/prefill_sm90/mainloop_consumer.cuh"
#include "tessera/device/kernels/prefill_sm90/mainloop_producer.cuh"

namespace tessera {

#if defined(__CUDACC__) || defined(__CUDACC_RTC__)

// Register split per thread (producer, consumer) for CONSUMERS consumer
// warpgroups and CTAS CTAs per SM: all of the CTA's launch registers
// (launch_registers), the producer keeping what its address arithmetic
// needs. ptxas fits each side into its setmaxnreg count: with one consumer
// warpgroup, 40 producer registers spilled 28-188 bytes, 64 none, and the
// consumer of a 64-row tile fits 192 (head dims 64 / 128).
template <int CONSUMERS, int CTAS>
struct Sm90Registers {
  static constexpr int PRODUCER = CONSUMERS == 2 ? 56 : 64;
  static constexpr int CONSUMER = CONSUMERS == 2 ? 224 : (CTAS == 2 ? 192 : 240);
  static constexpr int THREADS = 128 * (1 + CONSUMERS);
  static_assert((PRODUCER + CONSUMERS * CONSUMER) * 128 <= launch_registers(THREADS, CTAS) * THREADS,
                "the split must fit the CTA's launch registers, or setmaxnreg.inc waits forever");
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
// FP8_MMA (fp8 caches, PrefillOptions::fp8_mma): both GEMMs on fp8 tensor
// cores, q (as two e4m3 terms) and P rounded to e4m3 in the kernel
// (mainloop_consumer.cuh).
template <typename Variant, typename DQ, typename DKV, typename DO, int HEAD_DIM, int CTA_Q, int CTA_KV, int K_STAGES,
          int V_STAGES, int Q_BUFS, int CTAS_PER_SM, int CLUSTER, bool FP8_MMA, typename Params>
struct Sm90PrefillKernel {
  using Rings = Sm90Rings<K_STAGES, V_STAGES, Q_BUFS>;
  using Regs = Sm90Registers<CTA_Q / 64, CTAS_PER_SM>;
  // Mainloop: the producer's loads and the consumers' MMAs and softmax; the
  // consumers end each item with the epilogue (common/epilogue.cuh). Both
  // walk the planner's queue with the scheduler of every persistent kernel
  // (common/work_queue.cuh).
  // The tiles' (and the MMAs') 16-bit type: the cache's, or q's for an fp8
  // cache, which the producer widens into it.
  using T = typename Fp8Operand<DQ, DKV>::type;
  static constexpr bool kFp8 = is_fp8<DKV>;
  static constexpr int kStaging = kFp8 ? kSm90Fp8StagingTiles : 0;
  using Producer = Sm90Producer<Variant, T, DKV, HEAD_DIM, CTA_Q, CTA_KV, Rings, CLUSTER, kStaging, FP8_MMA, Params>;
  using Consumer = Sm90Consumer<Variant, T, DO, HEAD_DIM, CTA_Q, CTA_KV, Rings, CLUSTER, kFp8, DKV, FP8_MMA, Params>;
  static constexpr int THREADS = 128 * (CTA_Q / 64 + 1);
  // The dynamic shared memory: the same layout the host sizes the launch by.
  static constexpr Sm90SmemLayout kSmem =
      sm90_smem_layout(HEAD_DIM, CTA_Q, CTA_KV, K_STAGES, V_STAGES, Q_BUFS, kStaging, FP8_MMA);
  static_assert(sizeof(DQ) == 2 && (sizeof(DKV) == 2 || kFp8) && (sizeof(DO) == 2 || sizeof(DO) == 4),
                "16-bit q, 16-bit or fp8 kv; 16- or 32-bit o");
  static_assert(CTA_Q == 64 || CTA_Q == 128, "one or two consumer warpgroups of 64 query rows");
  static_assert(HEAD_DIM == 64 || HEAD_DIM == 128 || HEAD_DIM == 256, "wgmma tiles for head_dim 64, 128 and 256");
  static_assert(CLUSTER == 1 || CLUSTER == 2, "single CTAs or pairs");
  static_assert(!FP8_MMA || kFp8, "fp8 tensor cores read an fp8 cache");
  static_assert(sizeof(Sm90Pipeline<Rings>) + 4 * CTA_KV * sizeof(i64) + 2 * kSm90SmemAlign + sizeof(int) <=
                    kSm90StaticSmemBound,
                "static shared memory within the bound the host assumes");

  using ParamsType = Params;
  static constexpr int kRowOffsets = 4 * CTA_KV;  // the producer's paged row-offset tables

  // The dynamic shared memory's buffers, in the aligned window of smem_raw.
  // q is stored as T: the MMA needs one operand type (FP8_MMA: K and V are
  // fp8 stages behind these pointers, and q8 the quantized Q tile).
  struct Buffers {
    T *q, *k, *v;
    u8* staging;  // fp8 caches only
    u8* q8;       // FP8_MMA only
  };
  __device__ __forceinline__ static Buffers buffers(uint4* smem_raw) {
    static_assert(kSmem.q_offset == 0, "the Q buffers open the aligned window");
    char* base = reinterpret_cast<char*>((reinterpret_cast<size_t>(smem_raw) + (kSm90SmemAlign - 1)) &
                                         ~size_t(kSm90SmemAlign - 1));
    return {reinterpret_cast<T*>(base), reinterpret_cast<T*>(base + kSmem.k_offset),
            reinterpret_cast<T*>(base + kSmem.v_offset), reinterpret_cast<u8*>(base + kSmem.staging_offset),
            reinterpret_cast<u8*>(base + kSmem.q8_offset)};
  }
  // Whether the producer loads K / V (contiguous KV only: paged KV is
  // gathered) and Q with the TMA.
  __device__ __forceinline__ static bool kv_by_tma(const Params& p, const Sm90TensorMaps& tma) {
    return Producer::uses_tma(tma) && p.kv.indices == nullptr;
  }
  // Thread 0: the pipeline's barriers, counting the arrivals of this launch's loads.
  __device__ __forceinline__ static void init_pipeline(Sm90Pipeline<Rings>& pipe, bool kv_tma, bool q_tma) {
    constexpr int kConsumers = THREADS - 128;
    pipe.init(kConsumers, CLUSTER == 1 ? kConsumers : CLUSTER * kConsumers / 32, kv_tma ? 1 : 128, q_tma ? 1 : 128);
  }

  __device__ __forceinline__ static void run(const Params& p, const Sm90TensorMaps& tma) {
    extern __shared__ uint4 smem_raw[];
    __shared__ Sm90Pipeline<Rings> pipe;
    __shared__ __align__(16) i64 row_offs[kRowOffsets];
    const Buffers buf = buffers(smem_raw);
    const bool kv_tma = kv_by_tma(p, tma);
    const bool q_tma = tma.q_on != 0;
    if (threadIdx.x == 0) {
      init_pipeline(pipe, kv_tma, q_tma);
      if constexpr (CLUSTER > 1) fence_mbarrier_init_cluster();
    }
    if constexpr (CLUSTER > 1) {
      cluster_sync();  // the peer's barriers exist before any copy or arrival reaches them
    } else {
      __syncthreads();
    }

    if (threadIdx.x < 128) {
      setmaxnreg_dec<Regs::PRODUCER>();
      Producer(p, pipe, buf.q, buf.k, buf.v, buf.staging, row_offs).run(tma, kv_tma, q_tma);
    } else {
      setmaxnreg_inc<Regs::CONSUMER>();
      Consumer(p, pipe, buf.q, buf.k, buf.v, buf.q8).run();
    }
    // No CTA leaves while its peer may still copy into its shared memory or
    // arrive on its barriers.
    if constexpr (CLUSTER > 1) cluster_sync();
  }
};

// The JIT's entry point (runtime/prefill_catalog.cpp).
template <typename Variant, typename DQ, typename DKV, typename DO, int HEAD_DIM, int CTA_Q, int CTA_KV, int K_STAGES,
          int V_STAGES, int Q_BUFS, int CTAS_PER_SM, int CLUSTER, bool FP8_MMA = false, typename Params>
__device__ __forceinline__ void batch_prefill_sm90(const Params& p, const Sm90TensorMaps& tma) {
  Sm90PrefillKernel<Variant, DQ, DKV, DO, HEAD_DIM, CTA_Q, CTA_KV, K_STAGES, V_STAGES, Q_BUFS, CTAS_PER_SM, CLUSTER,
                    FP8_MMA, Params>::run(p, tma);
}

#endif

}  // namespace tessera
