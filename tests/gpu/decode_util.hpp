// Batch decode test helpers shared by the CUDA-core and tensor-core decode
// GPU tests: page tables over shuffled pools, random problems (host copies for
// the reference, device copies for the kernel), the paged CPU reference, and
// a run into poisoned outputs.
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <random>
#include <vector>

#include "gpu_util.hpp"
#include "tessera/api/decode.hpp"
#include "tessera/reference/attention.hpp"

namespace tessera::test {

struct Table {
  std::vector<int32_t> indptr{0}, indices, last, kv_lens;
  int64_t num_pages = 0;
};

// Pages scattered over a pool of `pool` pages.
inline Table make_table(const std::vector<int32_t>& kv_lens, int page_size, int64_t pool, std::mt19937_64& rng) {
  Table t;
  t.kv_lens = kv_lens;
  std::vector<int32_t> perm(pool);
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng);
  int64_t next = 0;
  for (int32_t kv : kv_lens) {
    const int pages = (kv + page_size - 1) / page_size;
    for (int p = 0; p < pages; ++p) t.indices.push_back(perm[next++]);
    t.indptr.push_back(static_cast<int32_t>(t.indices.size()));
    t.last.push_back(pages ? kv - (pages - 1) * page_size : 0);
  }
  t.num_pages = pool;
  return t;
}

inline int64_t pages_needed(const std::vector<int32_t>& kv_lens, int page_size) {
  int64_t n = 0;
  for (int32_t kv : kv_lens) n += (kv + page_size - 1) / page_size;
  return n;
}

struct DecodeCase {
  DType dt;
  int head_dim, group, page_size;
  KVLayout layout;
};

struct Problem {
  HostTensor k, v, q;
  DeviceTensor dk, dv, dq;
};

inline Problem make_problem(const DecodeCase& c, int64_t batch, int64_t pool, int64_t Hkv, uint64_t seed) {
  const int64_t D = c.head_dim, Hq = Hkv * c.group;
  std::vector<int64_t> shape = c.layout == KVLayout::kNHD ? std::vector<int64_t>{pool, c.page_size, Hkv, D}
                                                          : std::vector<int64_t>{pool, Hkv, c.page_size, D};
  Problem p{make_host(c.dt, shape), make_host(c.dt, shape), make_host(c.dt, {batch, Hq, D}), {}, {}, {}};
  fill_random(p.k, seed);
  fill_random(p.v, seed + 1);
  fill_random(p.q, seed + 2, -2.f, 2.f);
  p.dk = to_device(p.k);
  p.dv = to_device(p.v);
  p.dq = to_device(p.q);
  return p;
}

// Reference on the first t.kv_lens.size() query rows of p.q.
inline reference::Result reference_decode(const Problem& p, const Table& t, const DecodeCase& c) {
  PagedKVCache cache(PagedKVStorage(p.k.view, p.v.view, c.layout),
                     PageTable(t.indptr, t.indices, t.last, c.page_size, t.num_pages));
  const int64_t batch = static_cast<int64_t>(t.kv_lens.size());
  std::vector<int32_t> qo(batch + 1);
  std::iota(qo.begin(), qo.end(), 0);
  TensorView qv = p.q.view;
  qv.shape[0] = batch;
  return reference::attention_paged(qv, RaggedIndex(qo), cache);
}

struct Outputs {
  HostTensor o, lse;
};

inline Outputs run_decode(BatchDecode& dec, const Problem& p, const DecodeCase& c, int64_t batch) {
  const int64_t Hq = p.q.view.size(1), D = c.head_dim;
  Outputs out{make_host(c.dt, {batch, Hq, D}), make_host(DType::kFloat32, {batch, Hq})};
  auto d_o = poisoned_like(out.o), dlse = poisoned_like(out.lse);
  dec.run(p.dq.view, PagedKVStorage(p.dk.view, p.dv.view, c.layout), d_o.view, dlse.view);
  TESSERA_CUDA_CHECK(cudaDeviceSynchronize());
  out.o = to_host(d_o, out.o);
  out.lse = to_host(dlse, out.lse);
  return out;
}

inline Workspace decode_workspace(const AttentionSpec& spec, const TaskInfo& task, const DecodeOptions& opt = {}) {
  auto sizes = BatchDecode::workspace_size(spec, task, cuda::device_info(cuda::current_device()).sm_count, opt);
  return Workspace::allocate(sizes.device_bytes, sizes.host_bytes);
}

}  // namespace tessera::test
