// Prefill (Hopper template), an optional timeline of one CTA for finding
// where the time between KV tiles and between work items goes: with
// TESSERA_SM90_DEFINES="TESSERA_SM90_TRACE=1" the first thread of each
// consumer warpgroup and of the producer in CTA (0, 0) stamp the SM clock at
// fixed points of their first work items into shared memory and print them
// when they finish (bench/prefill_trace.py reads the lines); with
// TESSERA_SM90_TRACE=2 the consumers stamp points of each KV tile of their
// first item instead; with TESSERA_SM90_TRACE=3 the first consumer thread of
// every CTA stamps the global timer at its start, when its first K tile has
// landed, after its last main loop and at its end (bench/decode_trace.py:
// where a short kernel's time goes across the grid). Off by default: no
// code, no shared memory.
#pragma once
#include "tessera/device/arch/numeric.cuh"

#ifndef TESSERA_SM90_TRACE
#define TESSERA_SM90_TRACE 0
#endif

namespace tessera {

#if defined(__CUDACC__) || defined(__CUDACC_RTC__)

struct Sm90Trace {
  static constexpr int ITEMS = 24, POINTS = 10;
  enum Role { kConsumer = 0, kProducer = 1, kConsumer1 = 2 };
  static constexpr bool kItems = TESSERA_SM90_TRACE == 1, kTiles = TESSERA_SM90_TRACE == 2;
  static constexpr bool kGrid = TESSERA_SM90_TRACE == 3;
  enum GridPoint { kStart = 0, kFirstK = 1, kLastLoop = 2, kEnd = 3 };

#if TESSERA_SM90_TRACE
  __device__ __forceinline__ static long long (&stamps())[3][ITEMS][POINTS] {
    __shared__ long long s[3][ITEMS][POINTS];
    return s;
  }
  __device__ __forceinline__ static bool tracer() {
    return blockIdx.x == 0 && blockIdx.y == 0 && threadIdx.x % 128 == 0;
  }
  // The consumer role of this thread's warpgroup.
  __device__ __forceinline__ static Role consumer() { return threadIdx.x < 256 ? kConsumer : kConsumer1; }
  // Item-level point (TRACE=1).
  __device__ __forceinline__ static void mark(Role role, int item, int point) {
    if constexpr (kItems) stamp(role, item, point);
  }
  // Tile-level point of the first item (TRACE=2): row = tile.
  __device__ __forceinline__ static void tile(int item, int t, int point) {
    if constexpr (kTiles) if (item == 0) stamp(consumer(), t, point);
  }
  __device__ __forceinline__ static void stamp(Role role, int item, int point) {
    if (tracer() && item < ITEMS) {
      long long c;
      asm volatile("mov.u64 %0, %%clock64;" : "=l"(c)::"memory");
      stamps()[role][item][point] = c;
    }
  }
  __device__ __forceinline__ static void value(Role role, int item, int point, long long v) {
    if constexpr (kItems) if (tracer() && item < ITEMS) stamps()[role][item][point] = v;
  }
  // Grid points (TRACE=3): every CTA, first consumer thread, global timer
  // (ns, comparable across SMs). kFirstK is kept from the first item only.
  __device__ __forceinline__ static long long (&grid_stamps())[4] {
    __shared__ long long g[4];
    return g;
  }
  __device__ __forceinline__ static void grid(int point, bool first = true) {
    if (kGrid && threadIdx.x == 128 && first) {
      long long t;
      asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)::"memory");
      grid_stamps()[point] = t;
    }
  }
  __device__ __forceinline__ static void grid_print(int items, int tiles) {
    if (!kGrid || threadIdx.x != 128) return;
    unsigned sm;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
    const long long* g = grid_stamps();
    printf("GRID %d %u %d %d %lld %lld %lld %lld\n", blockIdx.x, sm, items, tiles, g[0], g[1], g[2], g[3]);
  }
  // One line per item: role, item index, then the points.
  __device__ __forceinline__ static void print(Role role, int items) {
    if constexpr (!kItems && !kTiles) return;
    if (!tracer()) return;
    if (kTiles) items = ITEMS;
    for (int i = 0; i < items && i < ITEMS; ++i) {
      const long long* t = stamps()[role][i];
      printf("TRACE %d %d %lld %lld %lld %lld %lld %lld %lld %lld %lld %lld\n", static_cast<int>(role), i, t[0], t[1],
             t[2], t[3], t[4], t[5], t[6], t[7], t[8], t[9]);
    }
  }
#else
  __device__ __forceinline__ static Role consumer() { return kConsumer; }
  __device__ __forceinline__ static void mark(Role, int, int) {}
  __device__ __forceinline__ static void tile(int, int, int) {}
  __device__ __forceinline__ static void value(Role, int, int, long long) {}
  __device__ __forceinline__ static void print(Role, int) {}
  __device__ __forceinline__ static void grid(int, bool = true) {}
  __device__ __forceinline__ static void grid_print(int, int) {}
#endif
};

#endif

}  // namespace tessera
