#include "tessera/runtime/prefill_catalog.hpp"

#include <algorithm>
#include <initializer_list>
#include <sstream>
#include <string>
#include <utility>

#include "tessera/abi/shared_memory.cuh"
#include "tessera/core/error.hpp"

namespace tessera::catalog {

int choose_cta_q(double avg_fused_q_len) {
  for (int t : {16, 32, 64}) if (avg_fused_q_len <= t) return t;
  return 128;
}

// Whether the variant's code or, for a built-in, its headers mention any of
// `words`. A textual check, used only to pick a kernel form that is correct
// for every variant: a mention in a comment only costs speed.
static bool variant_mentions(const VariantSpec& v, std::initializer_list<const char*> words) {
  auto mentions = [&](const std::string& text) {
    for (const char* w : words)
      if (text.find(w) != std::string::npos) return true;
    return false;
  };
  if (mentions(v.code)) return true;
  for (const std::string& h : v.headers)
    for (const auto& [name, text] : jit::embedded_headers())
      if (name == h && mentions(text)) return true;
  return false;
}

// Whether the variant defines any per-element functor (QueryTransform,
// KeyTransform, ValueTransform, LogitsTransform, LogitsMask, OutputTransform):
// picks a tile size.
static bool has_element_functors(const VariantSpec& v) { return variant_mentions(v, {"Transform", "LogitsMask"}); }

// Whether the variant may transform K or V rows: with an fp8 cache, the FA2
// template then widens the staged rows into 16-bit tiles for the transform
// (Fa2KvTiles::kFp8Widened); the kernel refuses to compile a transform on
// tiles widened in registers.
static bool transforms_kv(const VariantSpec& v) { return variant_mentions(v, {"KeyTransform", "ValueTransform"}); }

bool keys_as_rows_supported(const AttentionSpec& spec) {
  const bool cache = is_fp8(spec.kv_dtype) || spec.kv_dtype == spec.q_dtype;  // fp8, or 16-bit as q
  return cache && spec.dims_equal() && spec.head_dim <= 256 && !transforms_kv(spec.variant) &&
         !variant_mentions(spec.variant, {"LogitsMaskBits"});
}

// The fields of `tile` that are set (0 keeps the heuristic's choice), each
// range-checked; the caller checks that the result fits the kernel.
static void apply_tile(PrefillConfig& c, const PrefillTile& tile) {
  for (auto [name, v] : {std::pair{"tile.cta_kv", tile.cta_kv}, {"tile.warps_q", tile.warps_q},
                         {"tile.warps_kv", tile.warps_kv}, {"tile.stages", tile.stages}})
    if (v < 0) throw InvalidArgument(std::string(name) + ": expected >= 0 (0: the heuristic's choice), got " + std::to_string(v));
  if (tile.stages == 1) throw InvalidArgument("tile.stages: expected 0 (heuristic) or >= 2 (a pipeline), got 1");
  if (tile.cta_kv % 16) throw InvalidArgument("tile.cta_kv: expected a multiple of 16, got " + std::to_string(tile.cta_kv));
  if (tile.cta_kv) c.cta_kv = tile.cta_kv;
  if (tile.warps_q) c.warps_q = tile.warps_q;
  if (tile.warps_kv) c.warps_kv = tile.warps_kv;
  if (tile.stages) c.stages = tile.stages;
}

// The FA2 template's static requirements on a tile (prefill_sm80/mainloop.cuh,
// prefill_sm80/kernel.cuh, common/tiles.cuh), checked here so a bad override
// is an InvalidArgument rather than a compile error.
static void check_fa2_tile(const PrefillConfig& c, bool fp8) {
  auto fail = [&](const char* field, const std::string& why) {
    throw InvalidArgument(std::string(field) + ": " + why + " (query tile " + std::to_string(c.cta_q) + ", KV tile " +
                          std::to_string(c.cta_kv) + ", warps " + std::to_string(c.warps_q) + " x " +
                          std::to_string(c.warps_kv) + ", " + std::to_string(c.stages) + " stages)");
  };
  const int qk = c.head_dim_qk, vo = c.head_dim_vo;
  if (c.cta_q == 8 ? c.warps_q != 1 : c.cta_q % (16 * c.warps_q) != 0)
    fail("tile.warps_q", "each warp takes whole 16-row m-tiles (one warp along an 8-row tile): expected cta_q a "
                         "multiple of 16 x warps_q; set cta_q to pin the query tile");
  if (c.cta_kv % (16 * c.warps_kv)) fail("tile.warps_kv", "expected cta_kv a multiple of 16 x warps_kv");
  if (c.threads > 1024)
    fail(c.cta_q == 8 ? "tile.warps_kv" : "tile.warps_q",
         c.cta_q == 8 ? "expected warps_kv <= 28 (a producer warpgroup joins them; 1024 threads)"
                      : "expected warps_q x warps_kv <= 32 (1024 threads)");
  if (c.cta_q == 8) {
    // The producer copies whole rows per pass of its 128 threads and its
    // table pair holds the rows of two tiles (static shared memory).
    if (c.cta_kv % 32) fail("tile.cta_kv", "8-row tiles: expected a multiple of 32");
    if (c.warps_kv % c.kv_heads || c.cta_kv % (16 * c.warps_kv / c.kv_heads))
      fail("tile.warps_kv", "8-row tiles of " + std::to_string(c.kv_heads) + " KV heads: expected warps_kv a multiple "
                            "of the heads and cta_kv a multiple of 16 x the warps of a head");
    if (c.smem_bytes > 227 * 1024)
      fail("tile", "needs " + std::to_string(c.smem_bytes) + " bytes of shared memory (at most 232448)");
    return;
  }
  // 16-byte chunks per row: the loaders copy whole rows per pass (an fp8
  // row has half the chunks of a 16-bit one).
  const int chunks = qk / 8, kv_chunks = fp8 ? qk / 16 : chunks;
  if (c.cta_kv * kv_chunks % c.threads || (c.cta_q * chunks >= c.threads && c.cta_q * chunks % c.threads))
    fail("tile.cta_kv", "each tile must split into whole rows per pass of the " + std::to_string(c.threads) + " threads");
  // Unequal dims: 8 threads a row, each thread's rows threads / 8 apart, a
  // multiple of 8 (common/tiles.cuh, KVTileLoader's SPLIT copies).
  const int rows_per_pass = c.threads / 8;
  if (qk != vo && (c.threads % 64 || (c.cta_kv % rows_per_pass && rows_per_pass % c.cta_kv)))
    fail("tile.cta_kv", "unequal head dims copy rows " + std::to_string(rows_per_pass) + " apart: expected warps_q x "
                        "warps_kv even and cta_kv a multiple or divisor of " + std::to_string(rows_per_pass));
  if (c.warps_kv > 1 && c.warps_kv * c.cta_q * (vo + 2) * 4 > c.smem_bytes)
    fail("tile.warps_kv", "the KV-warp merge scratch does not fit the tile buffers");
  if (c.kv_tiles == Fa2KvTiles::kFp8 && c.threads / 32 * 16 * 36 * 4 > c.smem_bytes)
    fail("tile", "the fp8 output reorder scratch (2304 bytes a warp) does not fit the tile buffers");
  if (c.smem_bytes > 227 * 1024)
    fail("tile", "needs " + std::to_string(c.smem_bytes) + " bytes of shared memory (at most 232448)");
}

int prefill_launch_vo(const AttentionSpec& spec) { return spec.vo_dim() == 512 ? 256 : spec.vo_dim(); }

bool hopper_supported(const AttentionSpec& spec, int cta_q) {
  // An fp8 cache's staging ring does not fit beside the 128-row tile's
  // stages at head dim 256 (232 KB), so that tile runs on the FA2 template.
  if (is_fp8(spec.kv_dtype) && spec.head_dim == 256 && cta_q == 128) return false;
  return spec.dims_equal() && (spec.head_dim == 64 || spec.head_dim == 128 || spec.head_dim == 256) &&
         (cta_q == 64 || cta_q == 128);
}

void check_fp8_mma(const AttentionSpec& spec, bool hopper) {
  if (!is_fp8(spec.kv_dtype))
    throw InvalidArgument(std::string("fp8_mma: fp8 tensor cores need an fp8 kv_dtype (float8_e4m3fn or float8_e5m2), "
                                      "got ") + dtype_name(spec.kv_dtype));
  if (spec.head_dim != 128 || !spec.dims_equal())
    throw InvalidArgument("fp8_mma: fp8 tensor cores take head_dim 128 (head_dim_vo equal), got head_dim " +
                          std::to_string(spec.head_dim) +
                          (spec.dims_equal() ? "" : ", head_dim_vo " + std::to_string(spec.vo_dim())));
  if (transforms_kv(spec.variant))
    throw InvalidArgument("fp8_mma: variant " + spec.variant.name + " transforms K or V rows (e.g. fused RoPE), which "
                          "fp8 tensor cores read from the cache as they are; expected a variant without "
                          "KeyTransform / ValueTransform");
  if (!hopper)
    throw InvalidArgument("fp8_mma: fp8 tensor cores run on the Hopper prefill kernel (sm_90a, backend auto or fa3, "
                          "query tiles of 64 or 128 rows), not on the FA2 template");
}

// The tiles that take two KV heads a CTA: 8-row FA2 tiles of an fp8 cache at
// head dim 128 (the head counts decide the rest, keys_kv_heads).
static bool takes_kv_head_pairs(const AttentionSpec& spec, int cta_q, bool hopper) {
  return cta_q == 8 && !hopper && is_fp8(spec.kv_dtype) && spec.head_dim == 128 && spec.dims_equal();
}

int keys_kv_heads(const AttentionSpec& spec, int cta_q, bool hopper, int num_qo_heads, int num_kv_heads) {
  const bool pairs = takes_kv_head_pairs(spec, cta_q, hopper) && num_kv_heads % 2 == 0 &&
                     2 * (num_qo_heads / num_kv_heads) <= 8;
  return pairs ? 2 : 1;
}

PrefillConfig prefill_config(const AttentionSpec& spec, int cta_q, bool hopper, const PrefillTile& tile,
                             bool fp8_mma, int kv_heads) {
  validate_spec(spec);
  if (kv_heads != 1 && (kv_heads != 2 || !takes_kv_head_pairs(spec, cta_q, hopper)))
    throw InvalidArgument("kv_heads: expected 1, or 2 for 8-row tiles of an fp8 cache at head dim 128, got " +
                          std::to_string(kv_heads));
  if (fp8_mma) check_fp8_mma(spec, hopper);
  // fp8 caches (e4m3 / e5m2, 16-bit q): both templates stage the fp8 rows
  // and widen them to q's type in shared memory before the MMAs.
  const bool fp8 = is_fp8(spec.kv_dtype);
  if (!fp8 && spec.q_dtype != spec.kv_dtype)
    throw TypeMismatch(std::string("q_dtype: the tensor-core prefill kernel needs q_dtype == kv_dtype (") +
                       dtype_name(spec.kv_dtype) + ") or an fp8 kv_dtype, got " + dtype_name(spec.q_dtype));
  if (fp8 && (!spec.dims_equal() || spec.head_dim > 256))
    throw TypeMismatch(std::string("kv_dtype: ") + dtype_name(spec.kv_dtype) + " caches on the tensor-core prefill "
                       "kernel take equal head dims of 64, 128 or 256, got head_dim " + std::to_string(spec.head_dim) +
                       (spec.dims_equal() ? "" : ", head_dim_vo " + std::to_string(spec.vo_dim())));
  PrefillConfig c;
  c.cta_q = cta_q;
  c.head_dim_qk = spec.head_dim;
  c.head_dim_vo = spec.vo_dim();
  if (hopper) {
    if (!hopper_supported(spec, cta_q))
      throw InvalidArgument("backend: the Hopper prefill kernel needs head_dim 64, 128 or 256 (head_dim_vo equal) and a "
                            "query tile of 64 or 128 rows, got head_dim " + std::to_string(spec.head_dim) +
                            (spec.dims_equal() ? "" : ", head_dim_vo " + std::to_string(spec.vo_dim())) + ", tile " +
                            std::to_string(cta_q) + "; head_dim 512 and unequal head dims run on backend fa2");
    // Warp-specialized (prefill_sm90/kernel.cuh): one producer warpgroup plus one
    // consumer warpgroup per 64 query rows. 128-row tiles: 128-token KV
    // tiles, 2 stages, one CTA per SM (FA3's choice for head_dim 128; S and
    // O of 64 x 128 each fit the consumers' 224 registers). 64-row tiles:
    // 64-token KV tiles at head_dim 128 so two CTAs share an SM and their
    // consumer warpgroups overlap each other's softmax. Head dim 256: 64-token
    // KV tiles (a 64-row slice of O already takes 128 registers per consumer
    // thread, and a K or V stage 32 KB), one CTA per SM.
    c.hopper = true;
    c.warps_q = cta_q / 16;
    c.warps_kv = 1;
    // fp8 tensor cores: 128-key tiles (V^T's rows are 128 keys, one
    // 128-byte swizzle row), one CTA per SM.
    c.fp8_mma = fp8_mma;
    c.cta_kv = spec.head_dim == 256 ? 64 : cta_q == 128 || spec.head_dim == 64 || fp8_mma ? 128 : 64;
    c.stages = 2;
    if (tile.warps_q || tile.warps_kv)
      throw InvalidArgument("tile.warps_q, tile.warps_kv: the Hopper kernel's warp layout is fixed (one consumer "
                            "warpgroup per 64 query rows); expected 0, or backend fa2");
    apply_tile(c, tile);
    if (c.cta_kv != 64 && c.cta_kv != 128)
      throw InvalidArgument("tile.cta_kv: the Hopper kernel takes 64 or 128, got " + std::to_string(c.cta_kv) +
                            " (backend fa2 takes other KV tiles)");
    if (fp8_mma && c.cta_kv != 128)
      throw InvalidArgument("tile.cta_kv: fp8 tensor cores (fp8_mma) take 128-key tiles, got " +
                            std::to_string(c.cta_kv));
    c.threads = 128 * (cta_q / 64 + 1);
    // Ring depths: V gets one stage more than K (it is consumed a step later
    // and released only after P V: with 2 V stages the consumers waited on V
    // ~13 times per tile, ncu) where it fits, then a second Q buffer if it
    // still fits.
    c.v_stages = c.stages + 1;
    c.q_bufs = 2;
    // The kernel's own layout (abi/shared_memory.cuh): Q buffers, K and V
    // stages and the alignment slack, + its static shared memory's bound.
    // fp8 caches add their staging tiles (so at head dim 128 the 128-row
    // tile keeps two V stages).
    auto bytes = [&](int q_bufs) {
      return sm90_smem_layout(spec.head_dim, c.cta_q, c.cta_kv, c.stages, c.v_stages, q_bufs,
                              fp8 ? kSm90Fp8StagingTiles : 0, fp8_mma)
          .dynamic_bytes;
    };
    const int static_bytes = kSm90StaticSmemBound;
    // 64-row tiles aim at two CTAs per SM (their consumers hide each other's
    // softmax), 128-row ones and head dim 256 (a 64-row tile alone needs
    // 192 KB) at one.
    const bool two_ctas = cta_q == 64 && spec.head_dim <= 128 && !fp8_mma;
    auto fits = [&](int q_bufs) {
      const int per = bytes(q_bufs) + static_bytes;
      return per <= 227 * 1024 && (!two_ctas || 2 * per <= 228 * 1024);
    };
    if (c.q_bufs == 2 && !fits(2)) c.q_bufs = 1;
    if (!fits(1) && c.v_stages > c.stages) --c.v_stages;  // head dim 256 at 128 x 64
    c.smem_bytes = bytes(c.q_bufs);
    const int per_cta = c.smem_bytes + static_bytes;
    c.ctas_per_sm = two_ctas && 2 * per_cta <= 228 * 1024 ? 2 : 1;
    if (per_cta > 227 * 1024)
      throw InvalidArgument("tile: the Hopper tile needs " + std::to_string(per_cta) +
                            " bytes of shared memory (at most 232448)");
    return c;
  }
  // Head dim 512: the 512 / 256 kernel, twice (PrefillConfig::vo_split).
  if (c.head_dim_qk == 512 && c.head_dim_vo == 512) {
    c.head_dim_vo = 256;
    c.vo_split = 2;
    // Each launch numbers its V / O columns 0..255: a per-column value or
    // output transform would see the second half's columns as the first's.
    if (spec.variant.code.find("ValueTransform") != std::string::npos ||
        spec.variant.code.find("OutputTransform") != std::string::npos)
      throw InvalidArgument("variant: " + spec.variant.name + " defines a ValueTransform / OutputTransform, which head_dim "
                            "512 does not take yet (it runs as two launches over 256 value features each)");
  }
  const int qk = c.head_dim_qk, vo = c.head_dim_vo;
  // Four warps. Small tiles split the KV tile over warps; large ones give each
  // warp 32 rows (two m-tiles) so every K/V fragment read from shared memory
  // feeds two mma's. A VO of 256 keeps 16 rows per warp: 32 rows of O would
  // need 256 accumulator registers. (Registers follow VO: Q and K fragments
  // are read from shared memory one 16-feature k-step at a time.)
  switch (cta_q) {
    case 8:  // keys as the mma's rows (prefill_sm80/mainloop_keys.cuh)
      if (!keys_as_rows_supported(spec))
        throw InvalidArgument("cta_q: 8-row query tiles take fp8 caches or 16-bit ones of q's dtype (equal head dims) "
                              "with variants that leave K / V rows as stored and define no LogitsMaskBits; got kv_dtype " +
                              std::string(dtype_name(spec.kv_dtype)) + ", variant " + spec.variant.name +
                              "; expected cta_q 16, 32, 64 or 128");
      c.warps_q = 1; c.warps_kv = 4; break;
    case 16: c.warps_q = 1; c.warps_kv = 4; break;
    case 32: c.warps_q = 2; c.warps_kv = 2; break;
    case 64: c.warps_q = 4; c.warps_kv = 1; break;
    case 128: c.warps_q = vo == 256 ? 8 : 4; c.warps_kv = 1; break;
    default: throw InvalidArgument("cta_q: expected 8 (fp8 caches), 16, 32, 64 or 128, got " + std::to_string(cta_q));
  }
  // Keep S small where O is large: a VO-256 row of O takes 128 accumulator
  // registers, and 32 rows x 128 features per warp as many. At the latter,
  // 64-token KV tiles still fit 255 registers without spills for variants
  // without per-element functors (halving the per-tile softmax and barrier
  // overhead: H100 Table-1 setting 195 / 271 / 282 -> 212 / 294 / 308
  // TFLOP/s at 1k / 4k / 16k, bench/prefill_sweep.py), while a LogitsMask,
  // LogitsTransform or Q/K transform spills inside the loop there.
  // An fp8 cache takes the 32-token tile there too: its widening pass adds
  // shared-memory traffic per KV tile, and the smaller tile keeps two CTAs
  // per SM (H100, Table-1 shape at 1k / 4k: 160 / 212 -> 196 / 271 TFLOP/s).
  const bool rows32_d128 = vo == 128 && cta_q / c.warps_q == 32;
  const bool big_o = vo == 256 || (rows32_d128 && (has_element_functors(spec.variant) || fp8));
  c.cta_kv = big_o && c.warps_kv == 1 ? 32 : 64;
  // Wider Q / K rows than V's: shared memory, not registers, bounds the tile
  // (not tuned on a GPU yet). QK 512: a 64-token stage is 96 KB (K 64 KB +
  // V 32 KB), so only the 16-row tile (its 4 KV warps need 64 keys) takes
  // 64 keys (208 KB in all), the 128-row one (a 128 KB Q tile) 16. QK 192:
  // the 128-row tile takes 32 keys (88 KB: two CTAs per SM; 64 keys would
  // need 128 KB, one CTA).
  if (qk == 512) c.cta_kv = cta_q == 16 ? 64 : cta_q == 128 ? 16 : 32;
  if (qk == 192 && cta_q == 128) c.cta_kv = 32;
  // 8-row tiles: a producer warpgroup streams a ring of three stages
  // (prefill_sm80/kernel_keys.cuh): of 128 keys for fp8 caches, which kept
  // the HBM busier than six of 64 keys or two of 128 or 192; of 64 for
  // 16-bit ones (the same bytes). Head dim 256: two 64-key stages.
  // Two KV heads a CTA: stages of 64 keys (the same bytes), two math warps a head.
  if (cta_q == 8 && qk <= 128) c.cta_kv = fp8 ? 128 / kv_heads : 64;
  c.stages = cta_q == 8 && qk <= 128 ? 3 : 2;
  c.kv_heads = kv_heads;
  apply_tile(c, tile);
  c.threads = 32 * c.warps_q * c.warps_kv + (cta_q == 8 ? kFa2KeysProducerThreads : 0);
  if (fp8) c.kv_tiles = transforms_kv(spec.variant) ? Fa2KvTiles::kFp8Widened : Fa2KvTiles::kFp8;
  // fp8 on 16-row tiles (decode): up to 128 registers, so four CTAs share
  // an SM (a few bytes of spills at head dim 128): more warps hide the
  // loads' latency (H100, GQA 32/8 64 x 4096 decode: 249 -> 213 us).
  if (c.kv_tiles == Fa2KvTiles::kFp8 && c.cta_q == 16 && c.cta_kv == 64 && c.warps_kv == 4 && c.stages == 2 &&
      vo <= 128)
    c.min_blocks = 4;
  // The kernel's own size (abi/shared_memory.cuh, PrefillShape::SMEM_BYTES).
  c.smem_bytes = c.cta_q == 8 ? fa2_keys_smem_bytes(qk, c.cta_kv, c.warps_kv, c.stages, fp8 ? 1 : 2, c.kv_heads)
                              : fa2_smem_bytes(qk, vo, c.cta_q, c.cta_kv, c.stages, c.kv_tiles);
  // 8-row tiles: two CTAs an SM of 256 threads leave the math its ~128
  // registers (a cap of 96 spilled).
  if (c.cta_q == 8 && vo <= 128) c.min_blocks = std::max(1, std::min(2, (227 * 1024) / (c.smem_bytes + 2048)));
  check_fa2_tile(c, fp8);
  c.ctas_per_sm = std::max(1, std::min((227 * 1024) / (c.smem_bytes + 1024), 2048 / c.threads));
  return c;
}

// The name of a prefill kernel after "tessera_prefill_": variant, dtypes,
// head dims and tile (the FA2 template's warps and stages too).
static std::string prefill_name(const AttentionSpec& spec, const PrefillConfig& c) {
  std::ostringstream entry;
  entry << spec.variant.name << "_";
  // An fp8 cache's kernel also names q's type (the mma's); 16-bit ones keep their names.
  if (is_fp8(spec.kv_dtype)) entry << dtype_tag(spec.q_dtype);
  entry << dtype_tag(spec.kv_dtype) << "_" << dtype_tag(spec.o_dtype)
        << "_d" << c.head_dim_qk;
  if (c.head_dim_vo != c.head_dim_qk) entry << "v" << c.head_dim_vo;  // e.g. _d192v128, _d512v256
  entry << "_q" << c.cta_q << "_kv" << c.cta_kv;
  if (!c.hopper) entry << "_w" << c.warps_q << "x" << c.warps_kv << "_s" << c.stages;
  if (c.kv_tiles == Fa2KvTiles::kFp8Widened) entry << "_wide";
  if (!c.hopper && c.min_blocks) entry << "_c" << c.min_blocks;
  if (c.kv_heads > 1) entry << "_h" << c.kv_heads;
  if (c.fp8_mma) entry << "_f8mma";
  return entry.str();
}

// The FA2 template's arguments after the head dim: <..., HEAD_DIM_QK,
// HEAD_DIM_VO, tile ...>, and the spec it is generated for (head dim 512:
// the 512 / 256 kernel).
static std::string fa2_tail(const PrefillConfig& c) {
  std::ostringstream tail;
  tail << c.head_dim_vo << ", " << c.cta_q << ", " << c.cta_kv << ", " << c.warps_q << ", " << c.warps_kv << ", "
       << c.stages
       << (c.kv_tiles == Fa2KvTiles::kFp8Widened ? ", true" : c.kv_heads > 1 ? ", false" : "");
  if (c.kv_heads > 1) tail << ", " << c.kv_heads;
  return tail.str();
}
static AttentionSpec fa2_kernel_spec(const AttentionSpec& spec, const PrefillConfig& c) {
  AttentionSpec kernel_spec = spec;
  kernel_spec.head_dim_vo = c.head_dim_vo == c.head_dim_qk ? 0 : c.head_dim_vo;
  return kernel_spec;
}

jit::KernelSource batch_prefill(const AttentionSpec& spec, int cta_q, bool hopper, int cluster, const PrefillTile& tile,
                                bool fp8_mma, int kv_heads) {
  const PrefillConfig c = prefill_config(spec, cta_q, hopper, tile, fp8_mma, kv_heads);
  if (cluster != 1 && (!hopper || cluster != 2))
    throw InvalidArgument("cluster: expected 1, or 2 with the Hopper kernel, got " + std::to_string(cluster));
  if (cluster != 1 && fp8_mma)
    throw InvalidArgument("cluster: fp8 tensor cores (fp8_mma) run single CTAs, got clusters of " +
                          std::to_string(cluster));
  std::ostringstream entry, tail;
  entry << "tessera_prefill_" << prefill_name(spec, c);
  if (c.hopper) {
    // The warp-specialized kernel: its register split (setmaxnreg) needs the
    // register cap that __launch_bounds__(threads, ctas_per_sm) sets.
    entry << "_k" << c.stages << "v" << c.v_stages << "q" << c.q_bufs << "_c" << c.ctas_per_sm
          << (cluster > 1 ? "_x" + std::to_string(cluster) : std::string()) << "_sm90ws";
    tail << c.cta_q << ", " << c.cta_kv << ", " << c.stages << ", " << c.v_stages << ", " << c.q_bufs << ", "
         << c.ctas_per_sm << ", " << cluster << ", " << (c.fp8_mma ? "true" : "false");
    return attention_source(spec, entry.str(), "batch prefill (Hopper warp-specialized template), tile " +
                                std::to_string(c.cta_q) + "x" + std::to_string(c.cta_kv),
                            "tessera/device/kernels/prefill_sm90/kernel.cuh", "PrefillParams", "batch_prefill_sm90",
                            c.threads, tail.str(), c.ctas_per_sm, "tessera::Sm90TensorMaps tma", cluster);
  }
  return attention_source(fa2_kernel_spec(spec, c), entry.str(), "batch prefill (FA2 template), tile " +
                              std::to_string(c.cta_q) + "x" + std::to_string(c.cta_kv),
                          "tessera/device/kernels/prefill_sm80/kernel.cuh", "PrefillParams", "batch_prefill", c.threads,
                          fa2_tail(c), c.min_blocks);
}

jit::KernelSource batch_prefill_pair(const AttentionSpec& first, const PrefillConfig& first_config,
                                     const AttentionSpec& second, const PrefillConfig& second_config) {
  if (first_config.hopper != second_config.hopper)
    throw InvalidArgument("backend: a pair of prefills in one launch runs on one template; expected both on the FA2 "
                          "template or both on the Hopper kernel");
  for (const PrefillConfig* c : {&first_config, &second_config}) {
    if (c->vo_split != 1)
      throw InvalidArgument("head_dim: a pair of prefills in one launch takes head dims up to 256, got 512");
    if (c->cluster != 1)
      throw InvalidArgument("cluster: a pair of prefills in one launch runs single CTAs, got clusters of " +
                            std::to_string(c->cluster));
    if (c->fp8_mma)
      throw InvalidArgument("fp8_mma: a pair of prefills in one launch runs 16-bit tensor cores; expected fp8_mma off");
  }
  if (first_config.threads != second_config.threads)
    throw InvalidArgument("tile: a pair of prefills in one launch needs tiles of as many threads, got " +
                          std::to_string(first_config.threads) + " and " + std::to_string(second_config.threads));
  const std::string entry =
      "tessera_prefill_pair_" + prefill_name(first, first_config) + "__" + prefill_name(second, second_config);
  if (first_config.hopper) {
    // The warp-specialized kernels split the register file by CTAs per SM
    // (__launch_bounds__ sets the cap): both plans must agree.
    if (first_config.ctas_per_sm != second_config.ctas_per_sm)
      throw InvalidArgument("tile: a pair of Hopper prefills needs tiles of as many CTAs per SM, got " +
                            std::to_string(first_config.ctas_per_sm) + " and " +
                            std::to_string(second_config.ctas_per_sm));
    auto tail = [](const PrefillConfig& c) {
      return std::to_string(c.cta_q) + ", " + std::to_string(c.cta_kv) + ", " + std::to_string(c.stages) + ", " +
             std::to_string(c.v_stages) + ", " + std::to_string(c.q_bufs) + ", " + std::to_string(c.ctas_per_sm) +
             ", 1, false";
    };
    return attention_pair_source(first, tail(first_config), second, tail(second_config), entry + "_sm90ws",
                                 "two batch prefills in one launch (Hopper warp-specialized template)",
                                 "tessera/device/kernels/prefill_sm90/pair.cuh", "PrefillParams",
                                 "batch_prefill_sm90_pair", first_config.threads, first_config.ctas_per_sm,
                                 "Sm90PrefillKernel");
  }
  return attention_pair_source(fa2_kernel_spec(first, first_config), fa2_tail(first_config),
                               fa2_kernel_spec(second, second_config), fa2_tail(second_config), entry,
                               "two batch prefills in one launch (FA2 template)",
                               "tessera/device/kernels/prefill_sm80/kernel.cuh", "PrefillParams", "batch_prefill",
                               first_config.threads);
}

std::vector<jit::KernelSource> builtin_prefill_kernels(const VariantSpec& v) {
  std::vector<jit::KernelSource> out;
  for (DType t : {DType::kFloat16, DType::kBFloat16})
    for (int d : {64, 128, 256})
      for (int q : {16, 32, 64, 128}) {
        const AttentionSpec spec{v, t, t, t, d};
        out.push_back(batch_prefill(spec, q));
        if (hopper_supported(spec, q)) out.push_back(batch_prefill(spec, q, true));
      }
  return out;
}

std::vector<jit::KernelSource> builtin_prefill_kernels() {
  std::vector<jit::KernelSource> out;
  for (const VariantSpec& v : {variants::standard(), variants::causal(), variants::custom_mask()})
    for (auto& k : builtin_prefill_kernels(v)) out.push_back(std::move(k));
  // Head dim 512 (Gemma 3) on the 16-row tile decode takes and the 128-row
  // tile long prefills take, and DeepSeek's 192 / 128 on the 64- and
  // 128-row tiles; other tiles compile at first use.
  for (const VariantSpec& v : {variants::standard(), variants::causal()})
    for (DType t : {DType::kFloat16, DType::kBFloat16}) {
      const AttentionSpec d512{v, t, t, t, 512}, mla{v, t, t, t, 192, 128};
      for (int q : {16, 128}) out.push_back(batch_prefill(d512, q));
      for (int q : {64, 128}) out.push_back(batch_prefill(mla, q));
    }
  return out;
}

}  // namespace tessera::catalog
