// Helpers shared by the prefill GPU tests: workspace sizing and a run whose
// outputs are poisoned first and fetched back to the host.
#pragma once
#include <random>
#include <vector>

#include "gpu_util.hpp"
#include "tessera/api/prefill.hpp"
#include "tessera/reference/attention.hpp"

namespace tessera::test {

inline Workspace prefill_workspace(const AttentionSpec& spec, const TaskInfo& task, const PrefillOptions& opt) {
  auto s = BatchPrefill::workspace_size(spec, task, cuda::device_info(cuda::current_device()).sm_count, opt);
  return Workspace::allocate(s.device_bytes, s.host_bytes);
}

struct Out {
  HostTensor o, lse;
};

// Random q ([qo.back(), Hq, D]), k and v (a pool of `pool` NHD pages of
// page_size tokens) and the reference result of the queries qo over the page
// table (kv_indptr, indices, last).
struct PagedInputs {
  HostTensor k, v, q;
  reference::Result ref;
  PagedInputs(DType dt, int64_t Hkv, int64_t Hq, int64_t D, int64_t page_size, int64_t pool,
              const std::vector<int32_t>& qo, const std::vector<int32_t>& kv_indptr,
              const std::vector<int32_t>& indices, const std::vector<int32_t>& last, bool causal,
              std::mt19937_64& rng)
      : k(make_host(dt, {pool, page_size, Hkv, D})), v(k), q(make_host(dt, {qo.back(), Hq, D})) {
    fill_random(k, rng());
    fill_random(v, rng());
    fill_random(q, rng(), -2.f, 2.f);
    reference::Options ro;
    ro.causal = causal;
    PagedKVCache cache(PagedKVStorage(k.view, v.view, KVLayout::kNHD),
                       PageTable(kv_indptr, indices, last, static_cast<int>(page_size), pool));
    ref = reference::attention_paged(q.view, RaggedIndex(qo), cache, ro);
  }
};

// run(o, lse) on NaN-poisoned outputs of [rows, hq, d] and [rows, hq].
template <typename RunFn>
Out run_and_fetch(RunFn run, DType dt, int64_t rows, int64_t hq, int64_t d) {
  Out out{make_host(dt, {rows, hq, d}), make_host(DType::kFloat32, {rows, hq})};
  auto d_o = poisoned_like(out.o), dlse = poisoned_like(out.lse);
  run(d_o.view, dlse.view);
  TESSERA_CUDA_CHECK(cudaDeviceSynchronize());
  out.o = to_host(d_o, out.o);
  out.lse = to_host(dlse, out.lse);
  return out;
}

// A causal ragged batch (qo / kv indptrs) with random q in [-2, 2], k and v
// of head dims d and dv, and its float64 reference.
struct CausalRaggedCase {
  HostTensor q, k, v;
  reference::Result ref;
};
inline CausalRaggedCase causal_ragged_case(DType dt, const std::vector<int32_t>& qo, const std::vector<int32_t>& kv,
                                           int64_t hq, int64_t hkv, int64_t d, int64_t dv, uint64_t seed) {
  std::mt19937_64 rng(seed);
  CausalRaggedCase c{make_host(dt, {qo.back(), hq, d}), make_host(dt, {kv.back(), hkv, d}),
                     make_host(dt, {kv.back(), hkv, dv}), {}};
  fill_random(c.q, rng(), -2.f, 2.f);
  fill_random(c.k, rng());
  fill_random(c.v, rng());
  reference::Options ro;
  ro.causal = true;
  c.ref = reference::attention_ragged(c.q.view, RaggedIndex(qo), c.k.view, c.v.view, RaggedIndex(kv), ro);
  return c;
}

}  // namespace tessera::test
