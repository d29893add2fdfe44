// MLA kernel family on Hopper (sm_90a), the widener warpgroups of the
// 16-row form over fp8 latent caches: two of them walk the CTA's work queue
// as the producer does, widener h taking half h of every KV tile from the
// ring the producer copies into (MlaSm90RawRing): it widens the half into
// the tile's 16-bit stage once the consumer has freed it, gives the raw
// slot back, then fences its generic stores for the wgmmas' async proxy and
// arrives on the stage's full barrier (both wideners count). Warpgroups of
// their own, so that fence never waits for copies in flight (a proxy fence
// waits for all of the thread's memory operations, cp.async included), and
// two, so a tile's widening takes half as long once its stage is free.
#pragma once
#include "tessera/device/arch/wgmma.cuh"
#include "tessera/device/kernels/mla_sm90/producer.cuh"

namespace tessera {

#if defined(__CUDACC__) || defined(__CUDACC_RTC__)

template <typename T, typename DKV>
struct MlaSm90Widener {
  const MlaParams& p;
  MlaSm90Pipeline& pipe;
  MlaSm90NarrowFp8Storage& sm;
  MlaSm90RawRing& ring;

  int half;  // 0 or 1: the half of every tile this warpgroup widens

  __device__ __forceinline__ void run() {
    constexpr u32 STAGE_BYTES = kMlaSm90Blocks * kMlaSm90Keys * 128;
    const int tid = threadIdx.x % 128;
    const u32 kv_addr = smem_addr(&sm.kv[0][0][0]);
    WorkQueue<PrefillWorkItem, QueueLoad::kFirst, MlaParams> queue(p, blockIdx.x);
    RingPos<kMlaSm90Stages> kv_pos;
    unsigned tiles = 0;  // tiles taken so far: half h of tile n is the ring's entry 2 n + h
    for (int wi = queue.begin; wi < queue.end; ++wi) {
      const PrefillWorkItem& w = queue.take(wi);
      const int n_tiles = (w.kv_end - w.kv_start + kMlaSm90Keys - 1) / kMlaSm90Keys;
      for (int t = 0; t < n_tiles; ++t, kv_pos = kv_pos.next(), ++tiles) {
        const int s = kv_pos.index();
        const RingPos<kMlaSm90NarrowRawSlots> raw_pos{2 * tiles + static_cast<unsigned>(half)};
        const int slot = raw_pos.index();
        mbarrier_wait(smem_addr(&ring.full[slot]), raw_pos.phase());
        mbarrier_wait(smem_addr(&pipe.kv_empty[s]), kv_pos.phase() ^ 1);
        mla_sm90_widen_raw_half<T, DKV>(kv_addr + static_cast<u32>(s) * STAGE_BYTES, smem_addr(&sm.raw[slot][0]),
                                        tid, half, p.pe_scale);
        mbarrier_arrive(smem_addr(&ring.empty[slot]));  // release: this thread's reads of the slot are done
        fence_proxy_async();  // generic stores -> the wgmmas' async proxy
        mbarrier_arrive(smem_addr(&pipe.kv_full[s]));
      }
    }
  }
};

#endif

}  // namespace tessera
