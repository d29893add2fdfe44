// Shared-memory footprints of the kernels whose launch size the host
// computes: one constexpr definition, evaluated by the kernels (at compile
// time, with their template arguments) for their buffer offsets and by the
// host catalogs (kernel_catalog.cpp, prefill_catalog.cpp) for the launch's
// dynamic shared memory and occupancy, so the two cannot drift.
#pragma once

namespace tessera {

// ---------------------------------------------------------------- batch decode
// Thread layout and pipeline of the CUDA-core decode kernel (x fastest): TX
// lanes cover the head dimension, VEC elements (16 bytes) each; TY groups
// split the GROUP query heads, HPT heads per thread; TZ groups split a tile's
// tokens. Dynamic shared memory: STAGES stages of a K and a V tile.
struct DecodeGeometry {
  int vec, tx, hpt, ty, tz, threads;
  int smem_bytes;
};
constexpr DecodeGeometry decode_geometry(int elem_bytes, int head_dim, int group, int min_threads, int tile,
                                         int stages) {
  DecodeGeometry g{};
  g.vec = 16 / elem_bytes;
  g.tx = head_dim / g.vec;
  g.hpt = group % 4 == 0 ? 4 : group % 3 == 0 ? 3 : group % 2 == 0 ? 2 : 1;
  g.ty = group / g.hpt;
  g.tz = g.tx * g.ty >= min_threads ? 1 : min_threads / (g.tx * g.ty);
  g.threads = g.tx * g.ty * g.tz;
  g.smem_bytes = stages * 2 * tile * head_dim * elem_bytes;
  return g;
}

// ------------------------------------------------------- Hopper batch prefill
// Dynamic shared memory of the warp-specialized kernel: the Q buffers, then
// the K stages, then the V stages, 16-bit elements, from the first 1024-byte
// boundary of the dynamic window (wgmma's 128-byte swizzle repeats every 1024
// bytes, and every buffer is a multiple of 1024 bytes); the launch asks for
// the rings plus 1024 bytes of alignment slack.
constexpr int kSm90SmemAlign = 1024;
// Bound on the kernel's static shared memory (pipeline barriers, the
// producer's four paged row-offset tables of up to 128 rows, the consumers'
// kilobyte of ones for the tensor-core row sums, 1024-aligned, and the merge
// flag), which the host adds for occupancy. The kernel checks its own against
// it (prefill_sm90/kernel.cuh).
constexpr int kSm90StaticSmemBound = 7168;
struct Sm90SmemLayout {
  int q_offset, k_offset, v_offset;  // bytes from the aligned base
  int ring_bytes;                    // Q buffers + K stages + V stages
  int dynamic_bytes;                 // what the launch asks for
};
constexpr Sm90SmemLayout sm90_smem_layout(int head_dim, int cta_q, int cta_kv, int k_stages, int v_stages,
                                          int q_bufs) {
  Sm90SmemLayout l{};
  const int q_tile = cta_q * head_dim * 2, kv_tile = cta_kv * head_dim * 2;
  l.q_offset = 0;
  l.k_offset = q_bufs * q_tile;
  l.v_offset = l.k_offset + k_stages * kv_tile;
  l.ring_bytes = l.v_offset + v_stages * kv_tile;
  l.dynamic_bytes = l.ring_bytes + kSm90SmemAlign;
  return l;
}

}  // namespace tessera
