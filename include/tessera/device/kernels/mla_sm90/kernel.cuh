// MLA kernel family on Hopper (sm_90a): a persistent, warp-specialized
// kernel for DeepSeek-style latent attention (H query heads over one latent
// KV head, K = ckv | kpe, V = ckv). One CTA per SM walks the planner's
// queue of (64 fused rows x KV chunk) items, the same plan as the mma.sync
// kernel (mla/kernel.cuh) with 64-row tiles:
//   * the producer warpgroup (producer.cuh) gathers Q and the KV tiles
//     through the page table into two stages of 64 keys x 576 features;
//   * two consumer warpgroups (consumer.cuh) share each tile: S by halves of
//     the keys, O by halves of the latent columns, P exchanged through
//     shared memory, so the 64 x 512 fp32 output fits their registers;
//   * the epilogue writes o / lse or a partial state, and a split tile's
//     chunks are merged by its last writer or, for many chunks, by all of
//     its CTAs (common/cooperative_merge.cuh), deterministically.
// setmaxnreg moves registers from the producer to the consumers, whose O
// alone takes 128 a thread.
#pragma once
#include "tessera/device/kernels/mla_sm90/consumer.cuh"

namespace tessera {

#if defined(__CUDACC__) || defined(__CUDACC_RTC__)

struct MlaSm90Registers {
  static constexpr int PRODUCER = 56, CONSUMER = 224;
  static_assert((PRODUCER + 2 * CONSUMER) * 128 <= launch_registers(kMlaSm90Threads, 1) * kMlaSm90Threads,
                "the split must fit the CTA's launch registers (a producer of 64 here hangs the consumers' setmaxnreg)");
};

// T: q's element type (fp16 or bf16), also the tiles' and the MMAs'; DKV:
// the caches' (T, or fp8 e4m3 / e5m2); DO: o's. CAUSAL: bottom-right aligned
// causal mask among a request's new tokens.
template <typename T, typename DKV, typename DO, bool CAUSAL>
__device__ __forceinline__ void batch_mla_sm90(const MlaParams& p) {
  constexpr bool kFp8 = is_fp8<DKV>;
  static_assert(sizeof(T) == 2 && sizeof(DO) == 2, "16-bit q and o");
  static_assert(kFp8 || sizeof(DKV) == 2, "16-bit caches of q's type, or fp8");
  extern __shared__ uint4 smem_raw[];
  __shared__ MlaSm90Pipeline pipe;
  __shared__ MlaSm90Exchange ex;
  auto& sm = *reinterpret_cast<MlaSm90Storage<kFp8>*>(
      (reinterpret_cast<size_t>(smem_raw) + 1023) & ~static_cast<size_t>(1023));  // wgmma's swizzle atoms
  if (threadIdx.x == 0) pipe.init(kMlaSm90Threads - 128);
  __syncthreads();
  if (threadIdx.x < 128) {
    setmaxnreg_dec<MlaSm90Registers::PRODUCER>();
    MlaSm90Producer<T, DKV>{p, pipe, sm}.run();
  } else {
    setmaxnreg_inc<MlaSm90Registers::CONSUMER>();
    MlaSm90Consumer<T, DKV, DO, CAUSAL>{p, pipe, sm, ex}.run();
  }
}

#endif

}  // namespace tessera
