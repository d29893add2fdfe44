#include "tessera/runtime/prefill_catalog.hpp"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <sstream>

#include "tessera/core/error.hpp"

namespace tessera::catalog {

int choose_cta_q(double avg_fused_q_len) {
  for (int t : {16, 32, 64}) if (avg_fused_q_len <= t) return t;
  return 128;
}

// Whether the variant defines any per-element functor (QueryTransform,
// KeyTransform, ValueTransform, LogitsTransform, LogitsMask, OutputTransform)
// in its code or, for a built-in, its headers. A textual check, used only to
// pick a tile size: every tile size is correct for every variant, and a
// mention in a comment only costs speed.
static bool has_element_functors(const VariantSpec& v) {
  auto mentions = [](const std::string& text) {
    return text.find("Transform") != std::string::npos || text.find("LogitsMask") != std::string::npos;
  };
  if (mentions(v.code)) return true;
  for (const std::string& h : v.headers)
    for (const auto& [name, text] : jit::embedded_headers())
      if (name == h && mentions(text)) return true;
  return false;
}

// Tuning override, "cta_kv,warps_q,warps_kv,stages" (benchmarks and sweeps
// only; zero fields keep the heuristic's choice).
static void apply_override(PrefillConfig& c) {
  const char* env = std::getenv("TESSERA_PREFILL_TILE");
  if (env == nullptr || *env == 0) return;
  int v[4] = {0, 0, 0, 0};
  if (std::sscanf(env, "%d,%d,%d,%d", &v[0], &v[1], &v[2], &v[3]) != 4)
    throw InvalidArgument(std::string("TESSERA_PREFILL_TILE: expected \"cta_kv,warps_q,warps_kv,stages\", got ") + env);
  PrefillConfig t = c;
  if (v[0]) t.cta_kv = v[0];
  if (v[1]) t.warps_q = v[1];
  if (v[2]) t.warps_kv = v[2];
  if (v[3]) t.stages = v[3];
  if (t.stages < 2) throw InvalidArgument(std::string("TESSERA_PREFILL_TILE: stages must be >= 2, got ") + env);
  // Applies to the query tiles it fits (workspace sizing visits all of them).
  if (t.cta_q % (16 * t.warps_q) == 0 && t.cta_kv % (16 * t.warps_kv) == 0) c = t;
}

bool hopper_supported(const AttentionSpec& spec, int cta_q) {
  return (spec.head_dim == 64 || spec.head_dim == 128 || spec.head_dim == 256) && (cta_q == 64 || cta_q == 128);
}

PrefillConfig prefill_config(const AttentionSpec& spec, int cta_q, bool hopper) {
  validate_spec(spec);
  if (spec.q_dtype != spec.kv_dtype)
    throw TypeMismatch(std::string("q_dtype: the tensor-core prefill kernel needs q_dtype == kv_dtype (") +
                       dtype_name(spec.kv_dtype) + "), got " + dtype_name(spec.q_dtype));
  PrefillConfig c;
  c.cta_q = cta_q;
  if (hopper) {
    if (!hopper_supported(spec, cta_q))
      throw InvalidArgument("backend: the Hopper prefill kernel needs head_dim 64, 128 or 256 and a query tile of 64 or 128 rows, got head_dim " +
                            std::to_string(spec.head_dim) + ", tile " + std::to_string(cta_q));
    // Warp-specialized (prefill_sm90.cuh): one producer warpgroup plus one
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
    c.cta_kv = spec.head_dim == 256 ? 64 : cta_q == 128 || spec.head_dim == 64 ? 128 : 64;
    c.stages = 2;
    apply_override(c);
    c.warps_q = cta_q / 16;  // the override may change only the KV tile and the stages here
    c.warps_kv = 1;
    if (c.cta_kv != 64 && c.cta_kv != 128) c.cta_kv = 128;
    c.threads = 128 * (cta_q / 64 + 1);
    // Ring depths: V gets one stage more than K (it is consumed a step later
    // and released only after P V: with 2 V stages the consumers waited on V
    // ~13 times per tile, ncu) where it fits, then a second Q buffer if it
    // still fits.
    c.v_stages = c.stages + 1;
    c.q_bufs = 2;
    bool rings_forced = false;
    if (const char* env = std::getenv("TESSERA_SM90_RINGS"); env && *env) {  // experiments: "k,v,q"
      if (std::sscanf(env, "%d,%d,%d", &c.stages, &c.v_stages, &c.q_bufs) != 3 || c.stages < 2 || c.v_stages < 2 ||
          c.q_bufs < 1 || c.q_bufs > 2)
        throw InvalidArgument(std::string("TESSERA_SM90_RINGS: expected \"k_stages,v_stages,q_bufs\" (>= 2, >= 2, 1 or 2), got ") + env);
      rings_forced = true;
    }
    // Mirror of Sm90Shape: Q buffers, K and V stages, + 1024 bytes of
    // alignment slack; + the static pipeline barriers, 4 x CTA_KV paged row
    // offsets and the consumers' kilobyte of ones (1024-byte aligned).
    auto bytes = [&](int q_bufs) {
      return 2 * (q_bufs * c.cta_q * spec.head_dim + (c.stages + c.v_stages) * c.cta_kv * spec.head_dim) + 1024;
    };
    const int static_bytes = 7168;
    // 64-row tiles aim at two CTAs per SM (their consumers hide each other's
    // softmax), 128-row ones and head dim 256 (a 64-row tile alone needs
    // 192 KB) at one.
    const bool two_ctas = cta_q == 64 && spec.head_dim <= 128;
    auto fits = [&](int q_bufs) {
      const int per = bytes(q_bufs) + static_bytes;
      return per <= 227 * 1024 && (!two_ctas || 2 * per <= 228 * 1024);
    };
    if (c.q_bufs == 2 && !fits(2)) c.q_bufs = 1;
    if (!rings_forced && !fits(1) && c.v_stages > c.stages) --c.v_stages;  // head dim 256 at 128 x 64
    c.smem_bytes = bytes(c.q_bufs);
    const int per_cta = c.smem_bytes + static_bytes;
    c.ctas_per_sm = two_ctas && 2 * per_cta <= 228 * 1024 ? 2 : 1;
    if (per_cta > 227 * 1024)
      throw InvalidArgument("TESSERA_PREFILL_TILE: the Hopper tile needs " + std::to_string(per_cta) +
                            " bytes of shared memory (at most 232448)");
    return c;
  }
  // Four warps. Small tiles split the KV tile over warps; large ones give each
  // warp 32 rows (two m-tiles) so every K/V fragment read from shared memory
  // feeds two mma's. head_dim 256 keeps 16 rows per warp: 32 rows of O would
  // need 256 accumulator registers.
  switch (cta_q) {
    case 16: c.warps_q = 1; c.warps_kv = 4; break;
    case 32: c.warps_q = 2; c.warps_kv = 2; break;
    case 64: c.warps_q = 4; c.warps_kv = 1; break;
    case 128: c.warps_q = spec.head_dim == 256 ? 8 : 4; c.warps_kv = 1; break;
    default: throw InvalidArgument("cta_q: expected 16, 32, 64 or 128, got " + std::to_string(cta_q));
  }
  // Keep S small where O is large: a head_dim-256 row of O takes 128
  // accumulator registers, and 32 rows x 128 features per warp as many. At
  // the latter, 64-token KV tiles still fit 255 registers without spills
  // for variants without per-element functors (halving the per-tile softmax
  // and barrier overhead: H100 Table-1 setting 195 / 271 / 282 -> 212 / 294 /
  // 308 TFLOP/s at 1k / 4k / 16k, bench/prefill_sweep.py), while a LogitsMask,
  // LogitsTransform or Q/K transform spills inside the loop there.
  const bool rows32_d128 = spec.head_dim == 128 && cta_q / c.warps_q == 32;
  const bool big_o = spec.head_dim == 256 || (rows32_d128 && has_element_functors(spec.variant));
  c.cta_kv = big_o && c.warps_kv == 1 ? 32 : 64;
  c.stages = 2;
  apply_override(c);
  c.threads = 32 * c.warps_q * c.warps_kv;
  c.smem_bytes = 2 * (c.cta_q * spec.head_dim + c.stages * 2 * c.cta_kv * spec.head_dim);
  c.ctas_per_sm = std::max(1, std::min((227 * 1024) / (c.smem_bytes + 1024), 2048 / c.threads));
  return c;
}

namespace {
// Experiments only: space-separated -D options from environment variable
// `var` for a kernel's compile-time switches; they are part of the cache key.
void add_defines(jit::KernelSource& src, const char* var) {
  if (const char* defs = std::getenv(var)) {
    std::istringstream in(defs);
    for (std::string d; in >> d;) src.options.push_back("-D" + d);
  }
}
}  // namespace

jit::KernelSource batch_prefill(const AttentionSpec& spec, int cta_q, bool hopper, int cluster) {
  const PrefillConfig c = prefill_config(spec, cta_q, hopper);
  if (cluster != 1 && (!hopper || cluster != 2))
    throw InvalidArgument("cluster: expected 1, or 2 with the Hopper kernel, got " + std::to_string(cluster));
  std::ostringstream entry, tail;
  entry << "tessera_prefill_" << spec.variant.name << "_" << dtype_tag(spec.kv_dtype) << "_" << dtype_tag(spec.o_dtype)
        << "_d" << spec.head_dim << "_q" << c.cta_q << "_kv" << c.cta_kv;
  if (c.hopper) {
    // The warp-specialized kernel: its register split (setmaxnreg) needs the
    // register cap that __launch_bounds__(threads, ctas_per_sm) sets.
    entry << "_k" << c.stages << "v" << c.v_stages << "q" << c.q_bufs << "_c" << c.ctas_per_sm
          << (cluster > 1 ? "_x" + std::to_string(cluster) : std::string()) << "_sm90ws";
    tail << c.cta_q << ", " << c.cta_kv << ", " << c.stages << ", " << c.v_stages << ", " << c.q_bufs << ", "
         << c.ctas_per_sm << ", " << cluster;
    jit::KernelSource src = attention_source(spec, entry.str(), "batch prefill (Hopper warp-specialized template), tile " +
                                             std::to_string(c.cta_q) + "x" + std::to_string(c.cta_kv),
                                             "tessera/device/kernels/prefill_sm90.cuh", "PrefillParams",
                                             "batch_prefill_sm90", c.threads, tail.str(), c.ctas_per_sm,
                                             "tessera::Sm90TensorMaps tma", cluster);
    // Experiments only: extra -D options for the Hopper kernel's switches
    // (e.g. TESSERA_SM90_PINGPONG=0), space separated; part of the cache key.
    add_defines(src, "TESSERA_SM90_DEFINES");
    return src;
  }
  entry << "_w" << c.warps_q << "x" << c.warps_kv << "_s" << c.stages;
  tail << c.cta_q << ", " << c.cta_kv << ", " << c.warps_q << ", " << c.warps_kv << ", " << c.stages;
  jit::KernelSource src = attention_source(spec, entry.str(), "batch prefill (FA2 template), tile " +
                                           std::to_string(c.cta_q) + "x" + std::to_string(c.cta_kv),
                                           "tessera/device/kernels/prefill.cuh", "PrefillParams", "batch_prefill",
                                           c.threads, tail.str());
  add_defines(src, "TESSERA_PREFILL_DEFINES");  // experiments, as above (e.g. TESSERA_PREFILL_WIDE_STORE=0)
  return src;
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
  return out;
}

}  // namespace tessera::catalog
