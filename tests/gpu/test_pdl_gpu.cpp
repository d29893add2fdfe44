// Programmatic dependent launch (RunOptions::pdl, sm_90): a decode or prefill
// run launched right behind the kernel that writes its inputs (the append of
// each request's newest K / V token, as in serving) must see them. Each trial
// re-zeroes those tokens, appends them on the stream and runs with PDL; the
// output must match the reference over the full cache, bit for bit the run
// without PDL; also from a CUDA graph of [append, run]. Both decode paths and
// both prefill templates.
#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <random>

#include "decode_util.hpp"
#include "prefill_util.hpp"
#include "tessera/api/append_kv.hpp"

using namespace tessera;
using namespace tessera::test;

namespace {

bool pdl_capable() { return cuda::device_info(cuda::current_device()).major >= 9; }

template <typename T>
DeviceTensor device_ints(const std::vector<T>& v) {
  HostTensor h = make_host(DType::kInt32, {static_cast<int64_t>(v.size())});
  for (size_t i = 0; i < v.size(); ++i) reinterpret_cast<int32_t*>(h.storage.data())[i] = static_cast<int32_t>(v[i]);
  return to_device(h);
}

// A paged NHD cache (p.k / p.v on the host) whose requests' last tokens are
// zeroed, and the append that writes them back.
struct AppendStep {
  HostTensor k_zeroed, v_zeroed;
  DeviceTensor dk, dv, ak, av, batch, pos, ids, indptr, last;

  AppendStep(const Problem& p, const Table& t, int page_size) : k_zeroed(p.k), v_zeroed(p.v) {
    const int64_t hkv = p.k.view.size(2), d = p.k.view.size(3);
    const size_t row = static_cast<size_t>(hkv * d) * dtype_size(p.k.view.dtype);
    std::vector<int32_t> b_idx, positions;
    for (size_t b = 0; b < t.kv_lens.size(); ++b)
      if (t.kv_lens[b] > 0) {
        b_idx.push_back(static_cast<int32_t>(b));
        positions.push_back(t.kv_lens[b] - 1);
      }
    HostTensor hk = make_host(p.k.view.dtype, {static_cast<int64_t>(b_idx.size()), hkv, d}), hv = hk;
    for (size_t i = 0; i < b_idx.size(); ++i) {
      const int32_t pos = positions[i];
      const int64_t page = t.indices[t.indptr[b_idx[i]] + pos / page_size];
      const size_t at = static_cast<size_t>(page * page_size + pos % page_size) * row;
      std::memcpy(hk.storage.data() + i * row, p.k.storage.data() + at, row);
      std::memcpy(hv.storage.data() + i * row, p.v.storage.data() + at, row);
      std::memset(k_zeroed.storage.data() + at, 0, row);
      std::memset(v_zeroed.storage.data() + at, 0, row);
    }
    dk = to_device(k_zeroed);
    dv = to_device(v_zeroed);
    ak = to_device(hk);
    av = to_device(hv);
    batch = device_ints(b_idx);
    pos = device_ints(positions);
    ids = device_ints(t.indices);
    indptr = device_ints(t.indptr);
    last = device_ints(t.last);
  }
  PagedKVStorage storage() const { return PagedKVStorage(dk.view, dv.view, KVLayout::kNHD); }
  void rezero() {
    dk.buf.upload(k_zeroed.storage.data(), k_zeroed.storage.size());
    dv.buf.upload(v_zeroed.storage.data(), v_zeroed.storage.size());
  }
  void append(cudaStream_t stream) const {
    append_paged_kv_cache(ak.view, av.view, batch.view, pos.view, storage(), ids.view, indptr.view, last.view, stream);
  }
};

// run(storage, o, lse, stream, pdl) on poisoned outputs of `like_o` / `like_lse`:
// three trials of [re-zero, append, run with PDL] on a stream, then the same
// from a captured graph; each must equal `want` (a run without PDL over the
// full cache) bit for bit.
using RunFn = std::function<void(const PagedKVStorage&, const TensorView&, const TensorView&, cudaStream_t, bool)>;
void check_after_append(AppendStep& step, const RunFn& run, const HostTensor& like_o, const HostTensor& like_lse,
                        const HostTensor& want_o, const HostTensor& want_lse) {
  cudaStream_t stream;
  TESSERA_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  auto d_o = poisoned_like(like_o), dlse = poisoned_like(like_lse);
  for (int trial = 0; trial < 3; ++trial) {
    SCOPED_TRACE("trial " + std::to_string(trial));
    step.rezero();
    d_o.buf.fill(0xFF);
    dlse.buf.fill(0xFF);
    step.append(stream);
    run(step.storage(), d_o.view, dlse.view, stream, true);
    TESSERA_CUDA_CHECK(cudaStreamSynchronize(stream));
    EXPECT_TRUE(bitwise_equal(to_host(d_o, like_o), want_o));
    EXPECT_TRUE(bitwise_equal(to_host(dlse, like_lse), want_lse));
  }
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  TESSERA_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  step.append(stream);
  run(step.storage(), d_o.view, dlse.view, stream, true);
  TESSERA_CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
  TESSERA_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  for (int replay = 0; replay < 2; ++replay) {
    SCOPED_TRACE("graph replay " + std::to_string(replay));
    step.rezero();
    d_o.buf.fill(0xFF);
    TESSERA_CUDA_CHECK(cudaGraphLaunch(exec, stream));
    TESSERA_CUDA_CHECK(cudaStreamSynchronize(stream));
    EXPECT_TRUE(bitwise_equal(to_host(d_o, like_o), want_o));
  }
  TESSERA_CUDA_CHECK(cudaGraphExecDestroy(exec));
  TESSERA_CUDA_CHECK(cudaGraphDestroy(graph));
  TESSERA_CUDA_CHECK(cudaStreamDestroy(stream));
}

class PdlDecode : public ::testing::TestWithParam<bool> {};

TEST_P(PdlDecode, SeesTheAppendBeforeIt) {
  SKIP_WITHOUT_GPU();
  if (!pdl_capable()) GTEST_SKIP() << "skipped: programmatic dependent launch needs sm_90";
  const bool tc = GetParam();
  const DecodeCase c{DType::kFloat16, 128, 4, 16, KVLayout::kNHD};
  std::mt19937_64 rng(17 + tc);
  auto [t, p, ref, spec, task] = make_sweep_problem(c, {1, 300, 2000, 64, 4097, 17}, rng);
  DecodeOptions opt;
  opt.use_tensor_cores = tc;
  opt.cuda_cores = !tc;
  Workspace ws = decode_workspace(spec, task, opt);
  BatchDecode dec(spec, task, ws, opt);
  dec.plan(t.indptr, t.indices, t.last);
  const int64_t batch = static_cast<int64_t>(t.kv_lens.size());
  Outputs want = run_decode(dec, p, c, batch);  // no PDL, full cache
  EXPECT_CLOSE(compare(to_doubles(want.o.view), ref.o), c.dt);
  AppendStep step(p, t, c.page_size);
  check_after_append(
      step,
      [&](const PagedKVStorage& kv, const TensorView& o, const TensorView& lse, cudaStream_t s, bool pdl) {
        RunOptions ro;
        ro.pdl = pdl;
        dec.run(p.dq.view, kv, o, lse, s, ro);
      },
      want.o, want.lse, want.o, want.lse);
}

INSTANTIATE_TEST_SUITE_P(All, PdlDecode, ::testing::Bool());

class PdlPrefill : public ::testing::TestWithParam<PrefillBackend> {};

TEST_P(PdlPrefill, SeesTheAppendBeforeIt) {
  SKIP_WITHOUT_GPU();
  if (!pdl_capable()) GTEST_SKIP() << "skipped: programmatic dependent launch needs sm_90";
  const DType dt = DType::kBFloat16;
  const int D = 128, P = 16;
  const int64_t Hkv = 2, Hq = 8;
  std::mt19937_64 rng(23);
  const std::vector<int32_t> q_len = {5, 1, 100, 37}, kv_len = {10, 300, 190, 37};
  std::vector<int32_t> qo{0};
  for (int32_t n : q_len) qo.push_back(qo.back() + n);
  const int64_t pool = pages_needed(kv_len, P) + 3;
  Table t = make_table(kv_len, P, pool, rng);
  Problem prob = make_problem({dt, D, 4, P, KVLayout::kNHD}, qo.back(), pool, Hkv, 31);
  const AttentionSpec spec{variants::causal(), dt, dt, dt, D};
  TaskInfo task{static_cast<int>(Hq), static_cast<int>(Hkv), P, KVLayout::kNHD, 8, 2 * pool};
  task.max_total_q = 256;
  PrefillOptions opt;
  opt.backend = GetParam();
  Workspace ws = prefill_workspace(spec, task, opt);
  BatchPrefill pre(spec, task, ws, opt);
  pre.plan_paged(qo, t.indptr, t.indices, t.last);
  auto run = [&](const PagedKVStorage& kv, const TensorView& o, const TensorView& lse, cudaStream_t s, bool pdl) {
    RunOptions ro;
    ro.pdl = pdl;
    pre.run(prob.dq.view, kv, o, lse, s, ro);
  };
  Out want = run_and_fetch([&](const TensorView& o, const TensorView& lse) {
    run(PagedKVStorage(prob.dk.view, prob.dv.view, KVLayout::kNHD), o, lse, nullptr, false);
  }, dt, qo.back(), Hq, D);
  reference::Options ro;
  ro.causal = true;
  PagedKVCache cache(PagedKVStorage(prob.k.view, prob.v.view, KVLayout::kNHD),
                     PageTable(t.indptr, t.indices, t.last, P, pool));
  EXPECT_CLOSE(compare(to_doubles(want.o.view), reference::attention_paged(prob.q.view, RaggedIndex(qo), cache, ro).o),
               dt);
  AppendStep step(prob, t, P);
  check_after_append(step, run, want.o, want.lse, want.o, want.lse);
}

INSTANTIATE_TEST_SUITE_P(All, PdlPrefill, ::testing::Values(PrefillBackend::kAuto, PrefillBackend::kFA2));

}  // namespace
