// The device planner's shared-memory tables: per query tile its request,
// query tile, visible keys and rows, its first chunk at the current chunk
// size and (mid2) its split numbering; per request its first tile and
// longest chunk; per CTA its first queue slot and greedy chunk count; per
// chunk its sort keys, sorted minor key, CTA, rank there and queue slot; a
// few block-wide scalars.
// One layout function serves the host (the launch's dynamic shared memory)
// and the kernel (the pointers), so the two never disagree.
#pragma once
#include "tessera/abi/types.cuh"

namespace tessera::plan {

struct TablesLayout {
  // byte offsets; 8-byte arrays first
  u64 mid2, scalars, red, major, minor, order;
  u64 req, q_tile, begin, len, rows, chunk0, step, tile0, req_rank, cta_first, cta_count, owner, rank, queue, misc;
  u64 bytes;
  int sort_n;  // the sort's power-of-two length
};

#if defined(__CUDACC__) || defined(__CUDACC_RTC__)
__host__ __device__
#endif
inline TablesLayout tables_layout(int max_tiles, int max_batch, int ctas, int max_items) {
  TablesLayout l{};
  u64 at = 0;
  auto take = [&at](u64 bytes) {
    const u64 o = at;
    at += (bytes + 15) / 16 * 16;
    return o;
  };
  const u64 tiles = static_cast<u64>(max_tiles) + 1, reqs = static_cast<u64>(max_batch) + 1;
  const u64 ctas1 = static_cast<u64>(ctas) + 1, items = static_cast<u64>(max_items > 0 ? max_items : 1);
  l.sort_n = 1;
  while (static_cast<u64>(l.sort_n) < items) l.sort_n *= 2;
  l.mid2 = take(8 * tiles);
  l.scalars = take(8 * 8);
  l.red = take(8 * 33);
  l.major = take(8 * static_cast<u64>(l.sort_n));
  l.minor = take(8 * static_cast<u64>(l.sort_n));
  l.order = take(8 * items);
  l.req = take(4 * tiles);
  l.q_tile = take(4 * tiles);
  l.begin = take(4 * tiles);
  l.len = take(4 * tiles);
  l.rows = take(4 * tiles);
  l.chunk0 = take(4 * tiles);
  l.step = take(4 * tiles);
  l.tile0 = take(4 * reqs);
  l.req_rank = take(4 * reqs);
  l.cta_first = take(4 * ctas1);
  l.cta_count = take(4 * ctas1);
  l.owner = take(4 * items);
  l.rank = take(4 * items);
  l.queue = take(4 * items);
  l.misc = take(4 * 8);
  l.bytes = at;
  return l;
}

#if defined(__CUDACC__) || defined(__CUDACC_RTC__)
struct Tables {
  i64 *mid2, *scalars, *red;
  u64 *major, *minor, *order;
  int *req, *q_tile, *begin, *len, *rows, *chunk0, *step, *tile0, *req_rank, *cta_first, *cta_count, *owner, *rank, *queue,
      *misc;
  int sort_n;
};
__device__ __forceinline__ Tables tables_at(char* smem, const TablesLayout& l) {
  return {reinterpret_cast<i64*>(smem + l.mid2), reinterpret_cast<i64*>(smem + l.scalars),
          reinterpret_cast<i64*>(smem + l.red),
          reinterpret_cast<u64*>(smem + l.major),
          reinterpret_cast<u64*>(smem + l.minor), reinterpret_cast<u64*>(smem + l.order),
          reinterpret_cast<int*>(smem + l.req), reinterpret_cast<int*>(smem + l.q_tile),
          reinterpret_cast<int*>(smem + l.begin), reinterpret_cast<int*>(smem + l.len),
          reinterpret_cast<int*>(smem + l.rows), reinterpret_cast<int*>(smem + l.chunk0),
          reinterpret_cast<int*>(smem + l.step),
          reinterpret_cast<int*>(smem + l.tile0), reinterpret_cast<int*>(smem + l.req_rank),
          reinterpret_cast<int*>(smem + l.cta_first), reinterpret_cast<int*>(smem + l.cta_count),
          reinterpret_cast<int*>(smem + l.owner), reinterpret_cast<int*>(smem + l.rank),
          reinterpret_cast<int*>(smem + l.queue), reinterpret_cast<int*>(smem + l.misc), l.sort_n};
}
#endif

}  // namespace tessera::plan
