// Helpers shared by the prefill GPU tests: workspace sizing and a run whose
// outputs are poisoned first and fetched back to the host.
#pragma once
#include "gpu_util.hpp"
#include "tessera/api/prefill.hpp"

namespace tessera::test {

inline Workspace prefill_workspace(const AttentionSpec& spec, const TaskInfo& task, const PrefillOptions& opt) {
  auto s = BatchPrefill::workspace_size(spec, task, cuda::device_info(cuda::current_device()).sm_count, opt);
  return Workspace::allocate(s.device_bytes, s.host_bytes);
}

struct Out {
  HostTensor o, lse;
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

}  // namespace tessera::test
