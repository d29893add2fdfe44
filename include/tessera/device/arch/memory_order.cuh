// GPU-scope ordering for flags that CTAs pass each other (PTX memory model).
#pragma once

namespace tessera {

#if defined(__CUDACC__) || defined(__CUDACC_RTC__)

// Orders the thread's earlier memory accesses before its later ones at GPU
// scope, and by cumulativity those of the threads it met at a barrier before
// it: one thread's fence after a group barrier publishes the whole group's
// stores before its flag (release), and one fence after a flag was seen
// makes what it guards visible to the group behind the next barrier
// (acquire). This is how a cooperative grid barrier orders a CTA; it costs
// one thread a fence, not every thread the sequentially consistent fence
// __threadfence() is.
__device__ __forceinline__ void fence_acq_rel_gpu() { asm volatile("fence.acq_rel.gpu;\n" ::: "memory"); }

#endif

}  // namespace tessera
