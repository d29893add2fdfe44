#include "tessera/runtime/prefill_catalog.hpp"

#include <algorithm>
#include <sstream>

#include "tessera/core/error.hpp"

namespace tessera::catalog {

int choose_cta_q(double avg_fused_q_len) {
  for (int t : {16, 32, 64}) if (avg_fused_q_len <= t) return t;
  return 128;
}

PrefillConfig prefill_config(const AttentionSpec& spec, int cta_q) {
  validate_spec(spec);
  if (spec.q_dtype != spec.kv_dtype)
    throw TypeMismatch(std::string("q_dtype: the tensor-core prefill kernel needs q_dtype == kv_dtype (") +
                       dtype_name(spec.kv_dtype) + "), got " + dtype_name(spec.q_dtype));
  PrefillConfig c;
  c.cta_q = cta_q;
  switch (cta_q) {  // four warps (eight for 128 rows), split over rows first
    case 16: c.warps_q = 1; c.warps_kv = 4; break;
    case 32: c.warps_q = 2; c.warps_kv = 2; break;
    case 64: c.warps_q = 4; c.warps_kv = 1; break;
    case 128: c.warps_q = 8; c.warps_kv = 1; break;
    default: throw InvalidArgument("cta_q: expected 16, 32, 64 or 128, got " + std::to_string(cta_q));
  }
  // A head_dim-256 row of O takes 128 accumulator registers: keep S small.
  c.cta_kv = spec.head_dim == 256 && c.warps_kv == 1 ? 32 : 64;
  c.stages = 2;
  c.threads = 32 * c.warps_q * c.warps_kv;
  c.smem_bytes = 2 * (c.cta_q * spec.head_dim + c.stages * 2 * c.cta_kv * spec.head_dim);
  c.ctas_per_sm = std::max(1, std::min((227 * 1024) / (c.smem_bytes + 1024), 2048 / c.threads));
  return c;
}

jit::KernelSource batch_prefill(const AttentionSpec& spec, int cta_q) {
  const PrefillConfig c = prefill_config(spec, cta_q);
  std::ostringstream entry, tail;
  entry << "tessera_prefill_" << spec.variant.name << "_" << dtype_tag(spec.kv_dtype) << "_" << dtype_tag(spec.o_dtype)
        << "_d" << spec.head_dim << "_q" << c.cta_q << "_kv" << c.cta_kv;
  tail << c.cta_q << ", " << c.cta_kv << ", " << c.warps_q << ", " << c.warps_kv << ", " << c.stages;
  return attention_source(spec, entry.str(), "batch prefill (FA2 template), tile " + std::to_string(c.cta_q) + "x" +
                          std::to_string(c.cta_kv), "tessera/device/kernels/prefill.cuh", "PrefillParams",
                          "batch_prefill", c.threads, tail.str());
}

std::vector<jit::KernelSource> builtin_prefill_kernels() {
  std::vector<jit::KernelSource> out;
  for (const VariantSpec& v : {variants::standard(), variants::causal()})
    for (DType t : {DType::kFloat16, DType::kBFloat16})
      for (int d : {64, 128, 256})
        for (int q : {16, 32, 64, 128}) out.push_back(batch_prefill({v, t, t, t, d}, q));
  return out;
}

}  // namespace tessera::catalog
