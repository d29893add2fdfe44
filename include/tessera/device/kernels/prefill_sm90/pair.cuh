// Two planned batch prefills on the Hopper template in one persistent launch
// (api/prefill_pair.hpp; POD-Attention's fusion of a prompt's prefill chunk
// with a decode batch). The warp specialization is set up once: the
// producer warpgroup loads the first plan's queue, then the second's; the
// consumer warpgroups compute them in the same order. Each plan has its own
// pipeline barriers, so neither inherits the other's ring positions, and
// all threads meet between the plans: the second plan's first loads reuse
// the shared-memory buffers only after the first plan's last tile was
// consumed. A CTA past one plan's grid skips it.
#pragma once
#include "tessera/device/kernels/prefill_sm90/kernel.cuh"

namespace tessera {

#if defined(__CUDACC__) || defined(__CUDACC_RTC__)

// First, Second: Sm90PrefillKernel instantiations of as many threads and the
// same register split, single CTAs (no clusters).
template <typename First, typename Second>
__device__ __forceinline__ void batch_prefill_sm90_pair(const typename First::ParamsType& p, const Sm90TensorMaps& tma,
                                                        int ctas_first, const typename Second::ParamsType& p2,
                                                        const Sm90TensorMaps& tma2, int ctas_second) {
  static_assert(First::THREADS == Second::THREADS, "both plans' tiles take as many threads");
  static_assert(First::Regs::PRODUCER == Second::Regs::PRODUCER && First::Regs::CONSUMER == Second::Regs::CONSUMER,
                "both plans split the register file alike");
  extern __shared__ uint4 smem_raw[];
  __shared__ Sm90Pipeline<typename First::Rings> pipe;
  __shared__ Sm90Pipeline<typename Second::Rings> pipe2;
  constexpr int kRowOffsets =
      First::kRowOffsets > Second::kRowOffsets ? First::kRowOffsets : Second::kRowOffsets;
  __shared__ __align__(16) i64 row_offs[kRowOffsets];
  const typename First::Buffers buf = First::buffers(smem_raw);
  const typename Second::Buffers buf2 = Second::buffers(smem_raw);
  const bool kv_tma = First::kv_by_tma(p, tma), q_tma = tma.q_on != 0;
  const bool kv_tma2 = Second::kv_by_tma(p2, tma2), q_tma2 = tma2.q_on != 0;
  if (threadIdx.x == 0) {
    First::init_pipeline(pipe, kv_tma, q_tma);
    Second::init_pipeline(pipe2, kv_tma2, q_tma2);
  }
  __syncthreads();
  using Producer = typename First::Producer;
  using Producer2 = typename Second::Producer;
  using Consumer = typename First::Consumer;
  using Consumer2 = typename Second::Consumer;
  const bool first = blockIdx.x < ctas_first, second = blockIdx.x < ctas_second;
  if (threadIdx.x < 128) {
    setmaxnreg_dec<First::Regs::PRODUCER>();
    if (first) Producer(p, pipe, buf.q, buf.k, buf.v, buf.staging, row_offs).run(tma, kv_tma, q_tma);
    named_barrier_sync(kSm90PairBar, First::THREADS);  // the first plan's tiles are consumed
    if (second) Producer2(p2, pipe2, buf2.q, buf2.k, buf2.v, buf2.staging, row_offs).run(tma2, kv_tma2, q_tma2);
  } else {
    setmaxnreg_inc<First::Regs::CONSUMER>();
    if (first) Consumer(p, pipe, buf.q, buf.k, buf.v, buf.q8).run();
    named_barrier_sync(kSm90PairBar, First::THREADS);
    if (second) Consumer2(p2, pipe2, buf2.q, buf2.k, buf2.v, buf2.q8).run();
  }
}

#endif

}  // namespace tessera
