// Catalogue entries of the tensor-core prefill kernel (FA2 template): the tile
// configurations the paper's heuristic chooses between (§3.2.2), and the JIT
// source of one configuration.
#pragma once
#include "tessera/abi/shared_memory.cuh"
#include "tessera/runtime/kernel_catalog.hpp"

namespace tessera {

struct PrefillConfig {
  int cta_q = 64;    // fused query rows per CTA: 16, 32, 64 or 128 (8: fp8 caches, keys as the mma's rows)
  int cta_kv = 64;   // KV tokens per tile
  int warps_q = 4;   // warps along the query tile (16 rows each)
  int warps_kv = 1;  // warps along the KV tile
  int stages = 2;    // cp.async pipeline depth (Hopper: of the K ring)
  int v_stages = 2;  // Hopper: V ring depth
  int q_bufs = 1;    // Hopper: Q buffers (2: the next item's Q loads during this one)
  int threads = 128;
  int smem_bytes = 0;
  int ctas_per_sm = 1;  // from shared memory (occupancy may lower it)
  bool hopper = false;  // wgmma mainloop (sm_90a), else the FA2 mma.sync one
  int cluster = 1;      // Hopper: CTAs per cluster sharing K / V tiles (1 or 2)
  // The kernel's head dims: the spec's, except head dim 512, which runs the
  // 512 / 256 kernel vo_split = 2 times, each launch over 256 features of V
  // and O (registers and shared memory like head dim 256; the softmax, hence
  // LSE, is the same in both).
  int head_dim_qk = 128, head_dim_vo = 128;
  int vo_split = 1;
  // FA2 template: how K / V tiles are held (fp8 caches: widened in
  // registers, or into 16-bit tiles for variants that transform K / V).
  Fa2KvTiles kv_tiles = Fa2KvTiles::k16Bit;
  int min_blocks = 0;  // FA2: __launch_bounds__'s CTAs per SM (a register cap; 0: none)
  bool fp8_mma = false;  // Hopper, fp8 caches: both GEMMs on fp8 tensor cores (PrefillOptions::fp8_mma)
  // 8-row tiles: adjacent KV heads per CTA (keys_kv_heads), their rows side
  // by side in each stage; the plan and the kernel's group see
  // num_kv_heads / kv_heads heads of kv_heads x group query rows.
  int kv_heads = 1;
};

// Tile override for experts (PrefillOptions::tile): each field 0 keeps the
// heuristic's choice. The FA2 template takes any layout that satisfies its
// static requirements (checked with InvalidArgument naming the field); the
// Hopper kernel takes cta_kv 64 or 128 and stages (its K ring; V gets one
// more where it fits), its warps being fixed by the query tile.
struct PrefillTile {
  int cta_kv = 0;    // KV tokens per tile (a multiple of 16)
  int warps_q = 0;   // FA2: warps along the query tile (16 rows each)
  int warps_kv = 0;  // FA2: warps along the KV tile
  int stages = 0;    // pipeline depth, >= 2
  bool operator==(const PrefillTile&) const = default;
};

namespace catalog {
// Step 1 of the heuristic: the smallest query tile covering the average fused
// query length (query length x group size under head-group fusion).
int choose_cta_q(double avg_fused_q_len);
// Step 2: KV tile and warp layout for that query tile from register and
// shared-memory limits of the head dimension.
// hopper: the sm_90a wgmma mainloop (warpgroups of 64 query rows); needs
// hopper_supported(). tile: the caller's override (see PrefillTile).
// fp8_mma: the Hopper kernel's fp8 tensor-core form (check_fp8_mma).
// kv_heads: see PrefillConfig::kv_heads (from keys_kv_heads).
PrefillConfig prefill_config(const AttentionSpec& spec, int cta_q, bool hopper = false, const PrefillTile& tile = {},
                             bool fp8_mma = false, int kv_heads = 1);
// KV heads per CTA for the 8-row tiles: 2 for fp8 caches at head dim 128
// when two heads' query rows fill a tile (group <= 4, an even head count),
// so a CTA reads 256 contiguous bytes of each token row where its head's
// rows are 128 bytes between the other heads' (NHD), which the DRAM serves
// at a higher rate (docs/performance.md, "Decode on tensor cores"); else 1.
int keys_kv_heads(const AttentionSpec& spec, int cta_q, bool hopper, int num_qo_heads, int num_kv_heads);
// Whether the FA2 template's 8-row query tiles (keys as the mma's rows) take
// this spec: an fp8 cache or a 16-bit one of q's dtype, equal head dims up
// to 256, a variant that leaves K / V rows as stored and defines no
// LogitsMaskBits.
bool keys_as_rows_supported(const AttentionSpec& spec);
// What PrefillOptions::fp8_mma needs (InvalidArgument naming fp8_mma): an
// fp8 cache, head dim 128, a variant that leaves K / V rows as they are,
// and the Hopper kernel.
void check_fp8_mma(const AttentionSpec& spec, bool hopper);
// Equal head dims 64 / 128 / 256 and 64- or 128-row query tiles; unequal
// dims and head dim 512 run on the FA2 template.
bool hopper_supported(const AttentionSpec& spec, int cta_q);
// V / O features per launch of the spec's prefill kernel: head_dim_vo, but
// 256 for head dim 512 (PrefillConfig::vo_split launches). Sizes the
// split-KV partial states.
int prefill_launch_vo(const AttentionSpec& spec);
// cluster 2 (Hopper only): the CTA-pair kernel (prefill_sm90/kernel.cuh, CLUSTER).
jit::KernelSource batch_prefill(const AttentionSpec& spec, int cta_q, bool hopper = false, int cluster = 1,
                                const PrefillTile& tile = {}, bool fp8_mma = false, int kv_heads = 1);
// Two prefill kernels in one persistent launch (attention_pair_source): CTAs
// walk the first plan's queue, then the second's. Configurations from
// prefill_config on one template (both FA2, or both Hopper with as many
// CTAs per SM), single CTAs, head dims up to 256, of equal thread counts
// (InvalidArgument naming backend / cluster / head_dim / tile).
jit::KernelSource batch_prefill_pair(const AttentionSpec& first, const PrefillConfig& first_config,
                                     const AttentionSpec& second, const PrefillConfig& second_config);
// Every prefill kernel of one variant: fp16/bf16, head dims 64/128/256, each
// query tile, and the Hopper template where it applies; for the standard
// and causal variants also head dim 512 and 192 / 128 (FA2).
std::vector<jit::KernelSource> builtin_prefill_kernels(const VariantSpec& variant);
// Those of the built-in variants (standard, causal, custom mask).
std::vector<jit::KernelSource> builtin_prefill_kernels();
}  // namespace catalog

}  // namespace tessera
