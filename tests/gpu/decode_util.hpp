// Batch decode test helpers shared by the CUDA-core and tensor-core decode
// GPU tests: page tables over shuffled pools, random problems (host copies for
// the reference, device copies for the kernel), the paged CPU reference, a run
// into poisoned outputs, and the checks both paths share (reference match and
// determinism, BSR input, CUDA-graph replay, bad run() input).
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <random>
#include <string>
#include <tuple>
#include <utility>
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

// The decode sweeps' parameters: dtype, head_dim, group, page_size, layout.
using DecodeSweepParam = std::tuple<DType, int, int, int, KVLayout>;

inline DecodeCase decode_case(const DecodeSweepParam& param) {
  const auto [dt, D, group, page_size, layout] = param;
  return DecodeCase{dt, D, group, page_size, layout};
}

// A sweep problem: requests of `lens` over a shuffled pool (5 spare pages),
// 2 KV heads, its reference, and the spec and task (max_batch 32, max_pages
// 4x the pool) to run it with.
struct SweepProblem {
  Table t;
  Problem p;
  reference::Result ref;
  AttentionSpec spec;
  TaskInfo task;
};

inline SweepProblem make_sweep_problem(const DecodeCase& c, const std::vector<int32_t>& lens, std::mt19937_64& rng) {
  const int64_t Hkv = 2, Hq = Hkv * c.group;
  const int64_t batch = static_cast<int64_t>(lens.size()), pool = pages_needed(lens, c.page_size) + 5;
  Table t = make_table(lens, c.page_size, pool, rng);
  Problem p = make_problem(c, batch, pool, Hkv, rng());
  auto ref = reference_decode(p, t, c);
  const AttentionSpec spec{variants::standard(), c.dt, c.dt, c.dt, c.head_dim};
  TaskInfo task{static_cast<int>(Hq), static_cast<int>(Hkv), c.page_size, c.layout, 32, 4 * pool};
  return SweepProblem{std::move(t), std::move(p), std::move(ref), spec, task};
}

// Runs a planned `dec` against the reference, then checks that a second run of
// the same plan and a run after an identical re-plan are bitwise equal.
inline void check_matches_and_deterministic(BatchDecode& dec, const Problem& p, const Table& t, const DecodeCase& c,
                                            const reference::Result& ref) {
  const int64_t batch = static_cast<int64_t>(t.kv_lens.size());
  Outputs a = run_decode(dec, p, c, batch);
  EXPECT_CLOSE(compare(to_doubles(a.o.view), ref.o), c.dt);
  EXPECT_CLOSE(compare(to_doubles(a.lse.view), ref.lse), DType::kFloat16);
  Outputs b = run_decode(dec, p, c, batch);  // same plan, second run
  EXPECT_TRUE(bitwise_equal(a.o, b.o));
  EXPECT_TRUE(bitwise_equal(a.lse, b.lse));
  dec.plan(t.indptr, t.indices, t.last);  // an identical second plan
  Outputs d = run_decode(dec, p, c, batch);
  EXPECT_TRUE(bitwise_equal(a.o, d.o));
  EXPECT_TRUE(bitwise_equal(a.lse, d.lse));
}

// BSR input (Br = 1, Bc = page_size) matches the paged reference (o, and lse
// when `check_lse`); a BSR matrix with Br = 2 is refused.
inline void check_bsr_input(const DecodeCase& c, const std::vector<int32_t>& lens, int num_qo_heads,
                            const DecodeOptions& opt, bool check_lse) {
  const int64_t batch = static_cast<int64_t>(lens.size()), Hkv = 2;
  std::mt19937_64 rng(3);
  const int64_t pool = pages_needed(lens, c.page_size) + 3;
  Table t = make_table(lens, c.page_size, pool, rng);
  Problem p = make_problem(c, batch, pool, Hkv, 77);
  auto ref = reference_decode(p, t, c);
  BSRMatrix bsr(batch, pool * c.page_size, 1, c.page_size, t.indptr, t.indices, t.last);
  const AttentionSpec spec{variants::standard(), c.dt, c.dt, c.dt, c.head_dim};
  TaskInfo task{num_qo_heads, static_cast<int>(Hkv), c.page_size, c.layout, 8, pool};
  Workspace ws = decode_workspace(spec, task, opt);
  BatchDecode dec(spec, task, ws, opt);
  dec.plan(bsr);
  Outputs a = run_decode(dec, p, c, batch);
  EXPECT_CLOSE(compare(to_doubles(a.o.view), ref.o), c.dt);
  if (check_lse) EXPECT_CLOSE(compare(to_doubles(a.lse.view), ref.lse), DType::kFloat16);
  BSRMatrix wrong(4, pool * c.page_size, 2, c.page_size, {0, 1, 2}, {0, 1});
  EXPECT_THROW_MSG(dec.plan(wrong), InvalidArgument, "Br");
}

// Captures run() for three layers once (max_batch 16 rows, 8 query heads over
// 2 KV heads, page size 16) and replays the graph across steps whose lengths
// and batch change, re-planning between replays; each replay's leading `batch`
// rows of o (and of lse when `with_lse`, which also passes lse to the captured
// runs) must match the reference. With `zero_length_request` every step holds
// an empty request besides the long, split one. With `device_ids` the page
// ids come from a fixed device buffer that each step rewrites, as a serving
// engine's block table (api/page_ids.hpp).
inline void check_cuda_graph_replay(const DecodeCase& c, const DecodeOptions& opt, bool with_lse,
                                    bool zero_length_request, bool device_ids = false) {
  const int64_t Hkv = 2, Hq = Hkv * c.group, D = c.head_dim, max_batch = 16, layers = 3;
  std::mt19937_64 rng(11);
  const int64_t pool = 16 * (6000 / 16 + 2);
  const AttentionSpec spec{variants::standard(), c.dt, c.dt, c.dt, c.head_dim};
  TaskInfo task{static_cast<int>(Hq), static_cast<int>(Hkv), c.page_size, c.layout, max_batch, pool};
  Workspace ws = decode_workspace(spec, task, opt);
  BatchDecode dec(spec, task, ws, opt);

  std::vector<Problem> layer;
  for (int l = 0; l < layers; ++l) layer.push_back(make_problem(c, max_batch, pool, Hkv, 100 + l));
  HostTensor o_like = make_host(c.dt, {max_batch, Hq, D}), lse_like = make_host(DType::kFloat32, {max_batch, Hq});
  std::vector<DeviceTensor> outs, lses;
  for (int l = 0; l < layers; ++l) {
    outs.push_back(poisoned_like(o_like));
    if (with_lse) lses.push_back(poisoned_like(lse_like));
  }
  // Captured with max_batch rows; a later step of fewer requests writes the
  // leading rows of o and lse only.
  auto step_lens = [&](int step) {
    std::vector<int32_t> lens(step == 0 ? max_batch : 5 + step * 3);
    for (auto& x : lens) x = static_cast<int32_t>(rng() % 900);
    if (zero_length_request) lens[(step + 1) % lens.size()] = 0;
    lens[step % lens.size()] = 3000 + step * 500;  // one long request, split
    return lens;
  };
  auto leading = [](const HostTensor& h, int64_t rows) {
    TensorView v = h.view;
    v.shape[0] = rows;
    return to_doubles(v);
  };
  cudaStream_t stream;
  TESSERA_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cuda::DeviceBuffer table(sizeof(int32_t) * pool);
  auto plan = [&](const Table& t) {
    if (!device_ids) return dec.plan(t.indptr, t.indices, t.last, stream);
    TESSERA_CUDA_CHECK(cudaMemcpyAsync(table.get(), t.indices.data(), sizeof(int32_t) * t.indices.size(),
                                       cudaMemcpyHostToDevice, stream));
    const TensorView ids(table.get(), DType::kInt32, Device{DeviceType::kCUDA, cuda::current_device()}, {pool});
    dec.plan(t.indptr, ids, t.last, stream);
    TESSERA_CUDA_CHECK(cudaStreamSynchronize(stream));  // t.indices is pageable host memory
  };
  std::vector<int32_t> lens0 = step_lens(0);
  Table t0 = make_table(lens0, c.page_size, pool, rng);
  plan(t0);
  TESSERA_CUDA_CHECK(cudaStreamSynchronize(stream));

  cudaGraph_t graph;
  cudaGraphExec_t exec;
  TESSERA_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  for (int l = 0; l < layers; ++l)
    dec.run(layer[l].dq.view, PagedKVStorage(layer[l].dk.view, layer[l].dv.view, c.layout), outs[l].view,
            with_lse ? lses[l].view : TensorView(), stream);
  TESSERA_CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
  TESSERA_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));

  for (int step = 0; step < 4; ++step) {
    SCOPED_TRACE("step " + std::to_string(step));
    Table t = step == 0 ? t0 : make_table(step_lens(step), c.page_size, pool, rng);
    if (step > 0) plan(t);
    for (auto& o : outs) o.buf.fill(0xFF);
    for (auto& lse : lses) lse.buf.fill(0xFF);  // fill() waits for the memset
    TESSERA_CUDA_CHECK(cudaGraphLaunch(exec, stream));
    TESSERA_CUDA_CHECK(cudaStreamSynchronize(stream));
    const int64_t batch = static_cast<int64_t>(t.kv_lens.size());
    for (int l = 0; l < layers; ++l) {
      auto ref = reference_decode(layer[l], t, c);
      EXPECT_CLOSE(compare(leading(to_host(outs[l], o_like), batch), ref.o), c.dt);
      if (with_lse) EXPECT_CLOSE(compare(leading(to_host(lses[l], lse_like), batch), ref.lse), DType::kFloat16);
    }
  }
  TESSERA_CUDA_CHECK(cudaGraphExecDestroy(exec));
  TESSERA_CUDA_CHECK(cudaGraphDestroy(graph));
  TESSERA_CUDA_CHECK(cudaStreamDestroy(stream));
}

// The run() checks common to both paths, for a `dec` planned over pages
// {0, 5, 2} of two requests (fp16, 8 query heads over 2 KV heads, head_dim
// 128, page size 16, NHD): `q` and `dq` are its [2, 8, 128] query on host and
// device, `kv` storage that holds page 5, `o` an output like q.
inline void expect_run_rejects_bad_input(const BatchDecode& dec, const HostTensor& q, const DeviceTensor& dq,
                                         const PagedKVStorage& kv, const TensorView& o) {
  HostTensor k_small = make_host(DType::kFloat16, {5, 16, 2, 128});  // page 5 is out of range
  auto dks = to_device(k_small), dvs = to_device(k_small);
  EXPECT_THROW_MSG(dec.run(dq.view, PagedKVStorage(dks.view, dvs.view, KVLayout::kNHD), o, TensorView()),
                   InvalidArgument, "kv_indices");
  HostTensor q3 = make_host(DType::kFloat16, {3, 8, 128});
  auto dq3 = to_device(q3), do3 = to_device(q3);
  EXPECT_THROW_MSG(dec.run(dq3.view, kv, do3.view, TensorView()), InvalidArgument, "q");
  EXPECT_THROW_MSG(dec.run(q.view, kv, o, TensorView()), TypeMismatch, "q");  // host q
}

}  // namespace tessera::test
