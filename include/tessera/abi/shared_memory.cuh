// Shared-memory footprints of the kernels whose launch size the host
// computes: one constexpr definition, evaluated by the kernels (at compile
// time, with their template arguments) for their buffer offsets and by the
// host catalogs (kernel_catalog.cpp, prefill_catalog.cpp) for the launch's
// dynamic shared memory and occupancy, so the two cannot drift.
#pragma once

namespace tessera {

// ---------------------------------------------------------------- batch decode
// Thread layout and pipeline of the CUDA-core decode kernel (x fastest): TX
// lanes cover the head dimension, VEC elements (16 bytes of KV: 8 fp16, 16
// fp8) each; TY groups split the GROUP query heads, HPT heads per thread; TZ
// groups split a tile's tokens. Dynamic shared memory: STAGES stages of a K
// and a V tile, and at least the end-of-chunk merge scratch (TZ x GROUP
// states of m, d and HEAD_DIM floats), which reuses it: fp8's narrow rows
// mean more token groups, whose scratch can outgrow two 16 KB stages.
struct DecodeGeometry {
  int vec, tx, hpt, ty, tz, threads;
  int smem_bytes;
};
// max_hpt caps HPT (the largest of 4, 3, 2, 1 dividing GROUP): fewer heads
// per thread hold fewer q / O registers (16-feature fp8 vectors double
// them) at the price of widening each K / V vector once per head group.
constexpr DecodeGeometry decode_geometry(int elem_bytes, int head_dim, int group, int min_threads, int tile,
                                         int stages, int max_hpt = 4) {
  DecodeGeometry g{};
  g.vec = 16 / elem_bytes;
  g.tx = head_dim / g.vec;
  g.hpt = 1;
  for (int h = 4; h > 1; --h)
    if (g.hpt == 1 && h <= max_hpt && group % h == 0) g.hpt = h;
  g.ty = group / g.hpt;
  g.tz = g.tx * g.ty >= min_threads ? 1 : min_threads / (g.tx * g.ty);
  g.threads = g.tx * g.ty * g.tz;
  const int pipeline = stages * 2 * tile * head_dim * elem_bytes;
  const int merge = g.tz * group * (2 + head_dim) * 4;
  g.smem_bytes = pipeline > merge ? pipeline : merge;
  return g;
}

// ---------------------------------------------------------- FA2 batch prefill
// How the FA2 template (prefill_sm80/kernel.cuh) holds its K / V tiles:
//   k16Bit       16-bit caches: STAGES stages of 16-bit K and V tiles;
//   kFp8         fp8 caches: STAGES stages of the raw fp8 rows, which the
//                mainloop reads and widens in registers (no 16-bit copy);
//   kFp8Widened  fp8 caches of variants that transform K or V in shared
//                memory (fused RoPE): the fp8 stages, and 16-bit stages each
//                thread widens its own copied rows into.
enum class Fa2KvTiles { k16Bit, kFp8, kFp8Widened };

// Dynamic shared memory of the FA2 template: the 16-bit Q tile, then the
// 16-bit K / V stages (k16Bit, kFp8Widened), then the fp8 stages (kFp8,
// kFp8Widened; one per pipeline stage, as loads run STAGES - 1 tiles ahead
// of the mainloop).
// 8-row FA2 tiles (fp8 caches): the threads of their producer warpgroup,
// beside the math warps (prefill_sm80/kernel_keys.cuh). Fewer threads keep
// too few copies in flight to stream the cache at the HBM rate.
constexpr int kFa2KeysProducerThreads = 128;

// Their dynamic shared memory: a scratch for the item's Q tile (16-bit), then
// for the KV-warp merge (each math warp but the first: its 32 lanes' O^T,
// m and d) and the state's move to the row layout (8 rows of head_dim + 4
// floats); then the K / V stages (kv_bytes a cache element), which the
// producer fills for the next item while the math warps end this one.
constexpr int fa2_keys_scratch_bytes(int head_dim, int warps_kv) {
  const int q = 2 * 8 * head_dim, merge = (warps_kv - 1) * 32 * (head_dim / 4 + 4) * 4, move = 8 * (head_dim + 4) * 4;
  const int most = q > merge ? q : merge;
  return most > move ? most : move;
}
// kv_heads: adjacent KV heads a CTA reads side by side (each stage holds
// every head's K rows, then every head's V rows).
constexpr int fa2_keys_smem_bytes(int head_dim, int cta_kv, int warps_kv, int stages, int kv_bytes, int kv_heads = 1) {
  return fa2_keys_scratch_bytes(head_dim, warps_kv) + stages * kv_heads * cta_kv * 2 * head_dim * kv_bytes;
}

constexpr int fa2_smem_bytes(int head_dim_qk, int head_dim_vo, int cta_q, int cta_kv, int stages, Fa2KvTiles kv) {
  const int stage_elems = cta_kv * (head_dim_qk + head_dim_vo);
  return 2 * cta_q * head_dim_qk + (kv == Fa2KvTiles::kFp8 ? 0 : 2 * stages * stage_elems) +
         (kv == Fa2KvTiles::k16Bit ? 0 : stages * stage_elems);
}

// ------------------------------------------------------- Hopper batch prefill
// Dynamic shared memory of the warp-specialized kernel: the Q buffers, then
// the K stages, then the V stages, 16-bit elements (then an fp8 cache's
// staging tiles), from the first 1024-byte
// boundary of the dynamic window (wgmma's 128-byte swizzle repeats every 1024
// bytes, and every buffer is a multiple of 1024 bytes); the launch asks for
// the rings plus 1024 bytes of alignment slack. With fp8 tensor cores
// (fp8_mma) the K and V stages hold fp8 (K as the cache's rows, V
// transposed) and the staging tiles are followed by the fp8 Q tiles (q's
// e4m3 rounding and its residual).
constexpr int kSm90SmemAlign = 1024;
// Bound on the kernel's static shared memory (pipeline barriers, the
// producer's four paged row-offset tables of up to 128 rows, the consumers'
// kilobyte of ones for the tensor-core row sums, 1024-aligned, and the merge
// flag), which the host adds for occupancy. The kernel checks its own against
// it (prefill_sm90/kernel.cuh).
constexpr int kSm90StaticSmemBound = 7168;
struct Sm90SmemLayout {
  int q_offset, k_offset, v_offset;  // bytes from the aligned base
  int staging_offset;                // fp8 caches: the staging tiles, after the V stages
  int q8_offset;                     // fp8_mma: the two quantized Q tiles, after the staging tiles
  int ring_bytes;                    // all of the above
  int dynamic_bytes;                 // what the launch asks for
};
// staging: fp8 caches' staging tiles (cta_kv x head_dim bytes each; the
// producer copies the fp8 rows there and widens them into the 16-bit stages,
// or with fp8_mma transposes V's into the fp8 V stages).
constexpr Sm90SmemLayout sm90_smem_layout(int head_dim, int cta_q, int cta_kv, int k_stages, int v_stages,
                                          int q_bufs, int staging = 0, bool fp8_mma = false) {
  Sm90SmemLayout l{};
  const int q_tile = cta_q * head_dim * 2, kv_tile = cta_kv * head_dim * (fp8_mma ? 1 : 2);
  l.q_offset = 0;
  l.k_offset = q_bufs * q_tile;
  l.v_offset = l.k_offset + k_stages * kv_tile;
  l.staging_offset = l.v_offset + v_stages * kv_tile;
  l.q8_offset = l.staging_offset + staging * cta_kv * head_dim;
  l.ring_bytes = l.q8_offset + (fp8_mma ? 2 * cta_q * head_dim : 0);
  l.dynamic_bytes = l.ring_bytes + kSm90SmemAlign;
  return l;
}
// fp8 caches' staging tiles: two, so one tile's copies are in flight while
// the previous one is widened (three measured no faster: the widening's
// shared-memory traffic, not the copies' latency, bounds the fp8 kernel).
constexpr int kSm90Fp8StagingTiles = 2;

}  // namespace tessera
