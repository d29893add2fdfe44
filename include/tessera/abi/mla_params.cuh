// Parameter block, tile shapes and shared storage of the MLA kernel family
// (DeepSeek-style multi-head latent attention with absorbed weights; see
// device/kernels/mla/kernel.cuh). Plain data shared by host and device.
//
// MLA decode is attention of H query heads over ONE latent KV head:
//   K = concat(ckv[512], kpe[64]) (576 features), V = ckv (K's first 512),
//   q = concat(q_nope[512], q_pe[64]),
// each read from its own tensor: the caches are paged, ckv_cache [pages,
// page_size, 512] and kpe_cache [pages, page_size, 64]. The kernel copies a
// token's ckv and kpe rows side by side into one 576-wide shared row, so K
// and V are one shared-memory tile.
#pragma once
#include "tessera/abi/prefill_params.cuh"

namespace tessera {

constexpr int kMlaDimCkv = 512;                       // latent (compressed KV) features: V and O
constexpr int kMlaDimKpe = 64;                        // decoupled RoPE features
constexpr int kMlaDimQK = kMlaDimCkv + kMlaDimKpe;    // q.k features
constexpr int kMlaRowBytes = kMlaDimQK * 2;           // a 16-bit shared row of Q or K

// The work items are the tensor-core prefill kernels' (PrefillWorkItem: a
// query tile of CTA_Q fused rows, f = query * H + head, against a KV chunk),
// planned by Planner::plan_prefill with group = H and one KV head.
struct MlaParams {
  const void* q_nope;  // [total_q, H, 512]
  const void* q_pe;    // [total_q, H, 64]
  i64 q_nope_stride_n, q_nope_stride_h;
  i64 q_pe_stride_n, q_pe_stride_h;
  void* o;     // [total_q, H, 512]
  float* lse;  // [total_q, H] base-2 LSE, or null
  i64 o_stride_n, o_stride_h;
  const void* ckv;  // [pages, page_size, 512]
  const void* kpe;  // [pages, page_size, 64]
  i64 ckv_page_stride, ckv_token_stride;
  i64 kpe_page_stride, kpe_token_stride;
  const int* kv_indices;  // page ids; request b's start at work item kv_begin
  int page_size;
  int page_shift;  // log2(page_size), or -1
  // Page-id checks as PagedKV's (abi/kv_view.cuh): an id outside [0,
  // num_pages) is recorded in page_error (pinned) and its rows read as zeros.
  int num_pages;
  int* page_error;
  const int* work_indptr;
  const PrefillWorkItem* work_items;
  const PrefillWorkItem* first_items;
  float* partial_o;    // [slots, CTA_Q, 512]
  float* partial_lse;  // [slots, CTA_Q]
  int* counters;       // [split tiles], zero between runs
  u64* merge_words;    // [split tiles], zero between runs (cooperative merges, common/cooperative_merge.cuh)
  int num_qo_heads;    // H
  int group;           // = H: fused rows per query position (one KV head)
  int heads_per_group; // 1 (the work queue's request field is the request)
  float sm_scale;
  float o_scale;
  // fp8 caches (Hopper kernel): kpe's dequantization scale over ckv's. ckv's
  // own scale is folded into sm_scale and o_scale; this multiplies the
  // widened kpe values. 1 for 16-bit caches.
  float pe_scale;
};

// Shape of one kernel configuration: CTA_Q fused rows in WARPS_Q row groups
// of 16, each row group WARPS_D warps wide. Within a row group, warp d
// computes S for keys [d * CTA_KV / WARPS_D, ...) of the tile (all 576
// features), the group exchanges row maxima and P through shared memory,
// and warp d then accumulates O's columns [d * 512 / WARPS_D, ...) over the
// whole tile: no work is repeated, and O takes 2048 / WARPS_D registers a
// thread.
template <int CTA_Q_, int CTA_KV_, int WARPS_D_, int STAGES_>
struct MlaShape {
  static constexpr int CTA_Q = CTA_Q_, CTA_KV = CTA_KV_, WARPS_D = WARPS_D_, STAGES = STAGES_;
  static constexpr int WARPS_Q = CTA_Q / 16;
  static constexpr int THREADS = 32 * WARPS_Q * WARPS_D;
  static constexpr int KV_PER_WARP = CTA_KV / WARPS_D;  // S columns a warp computes
  static constexpr int NT_S = KV_PER_WARP / 8;
  static constexpr int D_PER_WARP = kMlaDimCkv / WARPS_D;  // O columns a warp accumulates
  static constexpr int NT_O = D_PER_WARP / 8;
  static constexpr int P_LD = CTA_KV + 8;  // P rows padded by 16 bytes: ldmatrix rows in distinct banks
  static_assert(CTA_Q % 16 == 0 && KV_PER_WARP % 16 == 0 && D_PER_WARP % 16 == 0, "whole mma tiles per warp");
};

// Dynamic shared memory of one configuration (16-bit elements as u16).
// Offsets are multiples of 16 bytes (cp.async, ldmatrix).
template <typename Shape>
struct MlaSharedStorage {
  u16 q[Shape::CTA_Q * kMlaDimQK];                     // Q tile: fused rows, RowSwizzle of 576
  u16 kv[Shape::STAGES][Shape::CTA_KV * kMlaDimQK];    // K tiles (V = their first 512 features)
  u16 p[Shape::CTA_Q * Shape::P_LD];                   // P of the current tile, 16-bit
  float red[Shape::WARPS_D][Shape::CTA_Q];             // per-warp row maxima, then row sums
};

// The configurations the catalogue builds, by query tile: 16 and 32 rows
// (H = 16 / 32 at one query) take four warps a row group and 64-key tiles;
// 64 rows (H >= 64) two warps a row group and 32-key tiles in three stages
// (a 64-key tile there would not fit beside the 72 KB Q tile).
template <int CTA_Q>
struct MlaConfigFor;
template <>
struct MlaConfigFor<16> {
  using Shape = MlaShape<16, 64, 4, 2>;
};
template <>
struct MlaConfigFor<32> {
  using Shape = MlaShape<32, 64, 4, 2>;
};
template <>
struct MlaConfigFor<64> {
  using Shape = MlaShape<64, 32, 2, 3>;
};

// The Hopper kernel (device/kernels/mla_sm90/): a 64-row query tile against
// 64-key KV tiles in two stages, both consumer warpgroups on every tile.
// Tiles are 128-byte-swizzled wgmma operands: nine column blocks of [64
// rows][64 features] (a block is 8 KB, 1024-byte aligned); P holds the
// tile's 64 x 64 weights, each warpgroup's 32 keys in its half.
constexpr int kMlaSm90Rows = 64;     // fused rows per query tile
constexpr int kMlaSm90Keys = 64;     // keys per KV tile (32 per consumer warpgroup for S)
constexpr int kMlaSm90Stages = 2;    // what fits beside the 72 KB Q tile
constexpr int kMlaSm90Threads = 384; // a producer warpgroup and two consumers
constexpr int kMlaSm90Blocks = kMlaDimQK / 64;
// 16-bit caches: the KV tiles are the stages. fp8 caches (e4m3 / e5m2): two
// stages of raw fp8 rows (576 bytes: ckv then kpe), which the consumers widen
// into one 16-bit working tile, so each fp8 stage goes back as soon as it is
// widened. Both layouts take 224 KB; q, kv and p start at the same offsets.
template <bool kFp8>
struct MlaSm90Storage;
template <>
struct MlaSm90Storage<false> {
  u16 q[kMlaSm90Blocks][kMlaSm90Rows * 64];
  u16 kv[kMlaSm90Stages][kMlaSm90Blocks][kMlaSm90Keys * 64];
  u16 p[kMlaSm90Rows * kMlaSm90Keys];
};
template <>
struct MlaSm90Storage<true> {
  u16 q[kMlaSm90Blocks][kMlaSm90Rows * 64];
  u16 kv[1][kMlaSm90Blocks][kMlaSm90Keys * 64];
  u16 p[kMlaSm90Rows * kMlaSm90Keys];
  u8 raw[kMlaSm90Stages][kMlaSm90Keys * kMlaDimQK];
};
static_assert(sizeof(MlaSm90Storage<true>) == sizeof(MlaSm90Storage<false>), "one launch size for both");
// Dynamic shared memory of a launch: the storage and the slack that aligns
// it to 1024 bytes.
constexpr int kMlaSm90SmemBytes = static_cast<int>(sizeof(MlaSm90Storage<false>)) + 1024;

// The Hopper kernel's 16-row form (device/kernels/mla_sm90/consumer_narrow.cuh):
// at most 16 fused rows a query tile (H x q_len <= 16, tensor-parallel
// decode), one consumer warpgroup computing S^T = K Q^T and O^T = V^T P^T
// with the rows as the wgmmas' N = 16, so no padded rows are multiplied.
// Q takes 16 rows (nine [16][64] blocks), P^T one [16][64] block; the KV
// stages are the 64-row kernel's 16-bit ones (fp8 caches widened into them
// by two widener warpgroups). Its pair form takes 32-row query tiles (H x
// q_len <= 32: MTP decode at H = 16, tensor-parallel 4 at H = 32) on two
// such consumers, rows 16c.. of the tile for consumer c, both on every KV
// stage, so the cache is read once for 32 rows.
constexpr int kMlaSm90NarrowRows = 16;
constexpr int kMlaSm90NarrowThreads = 256;  // a producer warpgroup and one consumer
constexpr int kMlaSm90PairRows = 2 * kMlaSm90NarrowRows;
constexpr int kMlaSm90PairThreads = 384;  // a producer warpgroup and two consumers
template <int CONSUMERS>
struct MlaSm90NarrowStorageN {
  u16 q[kMlaSm90Blocks][CONSUMERS * kMlaSm90NarrowRows * 64];
  u16 kv[kMlaSm90Stages][kMlaSm90Blocks][kMlaSm90Keys * 64];
  u16 p[CONSUMERS][kMlaSm90NarrowRows * kMlaSm90Keys];
};
using MlaSm90NarrowStorage = MlaSm90NarrowStorageN<1>;
using MlaSm90PairStorage = MlaSm90NarrowStorageN<2>;
constexpr int kMlaSm90NarrowSmemBytes = static_cast<int>(sizeof(MlaSm90NarrowStorage)) + 1024;
constexpr int kMlaSm90PairSmemBytes = static_cast<int>(sizeof(MlaSm90PairStorage)) + 1024;
// fp8 caches on the 16-row form: the same, and a ring of raw half tiles (32
// rows of 576 bytes: ckv, then kpe) that the producer copies into and two
// widener warpgroups widen out of; three keep a tile and a half of copies in
// flight.
constexpr int kMlaSm90NarrowFp8Threads = 512;  // producer, consumer, two wideners
constexpr int kMlaSm90NarrowRawSlots = 3;
constexpr int kMlaSm90NarrowRawRows = kMlaSm90Keys / 2;
struct MlaSm90NarrowFp8Storage : MlaSm90NarrowStorage {
  u8 raw[kMlaSm90NarrowRawSlots][kMlaSm90NarrowRawRows * kMlaDimQK];
};
constexpr int kMlaSm90NarrowFp8SmemBytes = static_cast<int>(sizeof(MlaSm90NarrowFp8Storage)) + 1024;
template <bool kFp8, int CONSUMERS = 1>
struct MlaSm90NarrowStorageFor {
  using type = MlaSm90NarrowStorageN<CONSUMERS>;
};
template <>
struct MlaSm90NarrowStorageFor<true, 1> {
  using type = MlaSm90NarrowFp8Storage;
};

}  // namespace tessera
