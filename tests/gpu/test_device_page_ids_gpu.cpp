// Page ids that stay on the GPU (api/page_ids.hpp): plan() given kv_indices
// as a CUDA tensor gives the same bits as plan() given the same ids on the
// host (decode on CUDA cores and on tensor cores, paged prefill on the FA2
// template and on the default kernel; page sizes 1 and 16; a buffer longer
// than the ids); CUDA-graph replay while the engine rewrites its device
// block table between steps; a bad id is raised, naming it, by the next
// call, and the wrapper works again after a good plan; argument errors.
#include <gtest/gtest.h>

#include <cstring>
#include <random>

#include "decode_util.hpp"
#include "prefill_util.hpp"

using namespace tessera;
using namespace tessera::test;

namespace {

// ids on the device as a 1-D int32 tensor, with `extra` trailing entries of
// junk (FlashInfer's fixed buffers are longer than a step's ids).
DeviceTensor device_ids(const std::vector<int32_t>& ids, int64_t extra = 0) {
  HostTensor h = make_host(DType::kInt32, {static_cast<int64_t>(ids.size()) + extra});
  std::memcpy(h.storage.data(), ids.data(), ids.size() * sizeof(int32_t));
  for (int64_t i = 0; i < extra; ++i) reinterpret_cast<int32_t*>(h.storage.data())[ids.size() + i] = -7;
  return to_device(h);
}

DecodeOptions decode_options(bool tensor_cores) {
  DecodeOptions opt;
  opt.use_tensor_cores = tensor_cores;
  opt.cuda_cores = !tensor_cores;
  return opt;
}

class DevicePageIdsDecode : public ::testing::TestWithParam<std::tuple<bool, int>> {};

TEST_P(DevicePageIdsDecode, SameBitsAsHostIds) {
  SKIP_WITHOUT_GPU();
  const auto [tc, page_size] = GetParam();
  const DecodeCase c{DType::kFloat16, 128, 4, page_size, KVLayout::kNHD};
  std::mt19937_64 rng(41 + page_size);
  auto [t, p, ref, spec, task] = make_sweep_problem(c, {0, 1, 700, 33, 5000, 129}, rng);
  Workspace ws = decode_workspace(spec, task, decode_options(tc));
  BatchDecode dec(spec, task, ws, decode_options(tc));
  const int64_t batch = static_cast<int64_t>(t.kv_lens.size());
  dec.plan(t.indptr, t.indices, t.last);
  Outputs host = run_decode(dec, p, c, batch);
  EXPECT_CLOSE(compare(to_doubles(host.o.view), ref.o), c.dt);
  DeviceTensor ids = device_ids(t.indices, 9);
  dec.plan(t.indptr, ids.view, t.last);
  Outputs dev = run_decode(dec, p, c, batch);
  EXPECT_TRUE(bitwise_equal(host.o, dev.o));
  EXPECT_TRUE(bitwise_equal(host.lse, dev.lse));
  dec.plan(t.indptr, t.indices, t.last);  // and back to host ids
  Outputs again = run_decode(dec, p, c, batch);
  EXPECT_TRUE(bitwise_equal(host.o, again.o));
}

// A bad id (past the storage, or negative) planned from the device is raised
// by the next run() once the GPU has met it, naming kv_indices and the id;
// no read leaves the storage (the memcheck subset runs this); a good plan
// then works again.
TEST_P(DevicePageIdsDecode, BadIdRaisedByTheNextCall) {
  SKIP_WITHOUT_GPU();
  const auto [tc, page_size] = GetParam();
  const DecodeCase c{DType::kFloat16, 128, 4, page_size, KVLayout::kHND};
  std::mt19937_64 rng(43 + page_size);
  auto [t, p, ref, spec, task] = make_sweep_problem(c, {90, 1, 300}, rng);
  Workspace ws = decode_workspace(spec, task, decode_options(tc));
  BatchDecode dec(spec, task, ws, decode_options(tc));
  const int64_t batch = static_cast<int64_t>(t.kv_lens.size());
  for (int32_t bad : {static_cast<int32_t>(t.num_pages), -3}) {
    SCOPED_TRACE("bad id " + std::to_string(bad));
    std::vector<int32_t> ids = t.indices;
    ids[ids.size() / 2] = bad;
    DeviceTensor d = device_ids(ids);
    dec.plan(t.indptr, d.view, t.last);  // plan() never reads the ids
    (void)run_decode(dec, p, c, batch);  // synchronizes
    const std::string msg = std::to_string(bad);
    EXPECT_THROW_MSG((void)run_decode(dec, p, c, batch), InvalidArgument, msg);
    dec.plan(t.indptr, t.indices, t.last);
    Outputs good = run_decode(dec, p, c, batch);
    EXPECT_CLOSE(compare(to_doubles(good.o.view), ref.o), c.dt);
  }
  // Raised by plan() too, if that is the next call.
  std::vector<int32_t> ids = t.indices;
  ids.back() = static_cast<int32_t>(t.num_pages) + 100;
  DeviceTensor d = device_ids(ids);
  dec.plan(t.indptr, d.view, t.last);
  (void)run_decode(dec, p, c, batch);
  EXPECT_THROW_MSG(dec.plan(t.indptr, t.indices, t.last), InvalidArgument, "kv_indices");
}

INSTANTIATE_TEST_SUITE_P(All, DevicePageIdsDecode, ::testing::Combine(::testing::Bool(), ::testing::Values(1, 16)));

TEST(DevicePageIdsDecodeExtra, CudaGraphReplayWhileTheTableChanges) {
  SKIP_WITHOUT_GPU();
  for (bool tc : {false, true}) {
    SCOPED_TRACE(tc ? "tensor cores" : "CUDA cores");
    check_cuda_graph_replay({DType::kFloat16, 128, 4, 16, KVLayout::kNHD}, decode_options(tc), /*with_lse=*/true,
                            /*zero_length_request=*/true, /*device_ids=*/true);
  }
}

TEST(DevicePageIdsDecodeExtra, ArgumentErrors) {
  SKIP_WITHOUT_GPU();
  const AttentionSpec spec;  // fp16, head_dim 128
  const TaskInfo task{8, 2, 16, KVLayout::kNHD, 4, 64};
  Workspace ws = decode_workspace(spec, task);
  BatchDecode dec(spec, task, ws);
  std::vector<int32_t> indptr = {0, 1, 3}, last = {4, 16};
  DeviceTensor ok = device_ids({0, 5, 2});
  HostTensor host_ids = make_host(DType::kInt32, {3});
  EXPECT_THROW_MSG(dec.plan(indptr, host_ids.view, last), TypeMismatch, "kv_indices");  // not on the GPU
  DeviceTensor wide = to_device(make_host(DType::kFloat32, {3}));
  EXPECT_THROW_MSG(dec.plan(indptr, wide.view, last), TypeMismatch, "kv_indices");
  DeviceTensor short_ids = device_ids({0, 5});
  EXPECT_THROW_MSG(dec.plan(indptr, short_ids.view, last), InvalidArgument, "kv_indices");
  DeviceTensor two_d = to_device(make_host(DType::kInt32, {3, 1}));
  EXPECT_THROW_MSG(dec.plan(indptr, two_d.view, last), InvalidArgument, "kv_indices");
  std::vector<int32_t> bad_last = {0, 16};  // a request with pages needs a non-empty last page
  EXPECT_THROW_MSG(dec.plan(indptr, ok.view, bad_last), InvalidArgument, "last_page_len");
  std::vector<int32_t> not_monotone = {0, 3, 1};
  EXPECT_THROW_MSG(dec.plan(not_monotone, ok.view, last), InvalidArgument, "indptr");
  dec.plan(indptr, ok.view, last);
  // The storage needs at least one page; the kernels check the rest.
  HostTensor q = make_host(DType::kFloat16, {2, 8, 128}), k0 = make_host(DType::kFloat16, {0, 16, 2, 128});
  auto dq = to_device(q), d_o = to_device(q), dk0 = to_device(k0), dv0 = to_device(k0);
  EXPECT_THROW_MSG(dec.run(dq.view, PagedKVStorage(dk0.view, dv0.view, KVLayout::kNHD), d_o.view, TensorView()),
                   InvalidArgument, "kv_indices");
  std::vector<int32_t> many_indptr = {0, 65}, many_last = {1};
  DeviceTensor many = device_ids(std::vector<int32_t>(65, 0));
  EXPECT_THROW_MSG(dec.plan(many_indptr, many.view, many_last), InvalidArgument, "max_pages");
}

// Paged prefill, on the FA2 template and on the default kernel (the Hopper
// one on sm_90): device ids give the host ids' bits, and a bad id is raised.
TEST(DevicePageIdsPrefill, SameBitsAsHostIdsAndBadIdRaised) {
  SKIP_WITHOUT_GPU();
  const DType dt = DType::kBFloat16;
  const int64_t Hkv = 2, Hq = 8, D = 128;
  for (int page_size : {1, 16})
    for (PrefillBackend backend : {PrefillBackend::kAuto, PrefillBackend::kFA2}) {
      SCOPED_TRACE("page " + std::to_string(page_size) + (backend == PrefillBackend::kFA2 ? " fa2" : " auto"));
      std::mt19937_64 rng(7 + page_size);
      const std::vector<int32_t> q_len = {0, 5, 1, 100, 37}, kv_len = {10, 0, 300, 190, 37};
      std::vector<int32_t> qo{0}, kv_lens;
      for (size_t r = 0; r < q_len.size(); ++r) qo.push_back(qo.back() + q_len[r]);
      const int64_t pool = pages_needed(kv_len, page_size) + 3;
      Table t = make_table(kv_len, page_size, pool, rng);
      const int64_t rows = qo.back();
      const PagedInputs in(dt, Hkv, Hq, D, page_size, pool, qo, t.indptr, t.indices, t.last, true, rng);
      const HostTensor &k = in.k, &v = in.v, &q = in.q;
      const reference::Result& ref = in.ref;
      const AttentionSpec spec{variants::causal(), dt, dt, dt, D};
      TaskInfo task{static_cast<int>(Hq), static_cast<int>(Hkv), page_size, KVLayout::kNHD, 8, 2 * pool};
      task.max_total_q = 256;
      PrefillOptions opt;
      opt.backend = backend;
      Workspace ws = prefill_workspace(spec, task, opt);
      BatchPrefill pre(spec, task, ws, opt);
      auto dk = to_device(k), dv = to_device(v), dq = to_device(q);
      PagedKVStorage kv(dk.view, dv.view, KVLayout::kNHD);
      auto run = [&](const TensorView& o, const TensorView& lse) { pre.run(dq.view, kv, o, lse); };
      pre.plan_paged(qo, t.indptr, t.indices, t.last);
      Out host = run_and_fetch(run, dt, rows, Hq, D);
      EXPECT_CLOSE(compare(to_doubles(host.o.view), ref.o), dt);
      DeviceTensor ids = device_ids(t.indices, 4);
      pre.plan_paged(qo, t.indptr, ids.view, t.last);
      Out dev = run_and_fetch(run, dt, rows, Hq, D);
      EXPECT_TRUE(bitwise_equal(host.o, dev.o));
      EXPECT_TRUE(bitwise_equal(host.lse, dev.lse));

      std::vector<int32_t> bad = t.indices;
      bad[bad.size() - 2] = static_cast<int32_t>(pool) + 5;
      DeviceTensor d_bad = device_ids(bad);
      pre.plan_paged(qo, t.indptr, d_bad.view, t.last);
      (void)run_and_fetch(run, dt, rows, Hq, D);
      EXPECT_THROW_MSG((void)run_and_fetch(run, dt, rows, Hq, D), InvalidArgument, std::to_string(pool + 5));
      pre.plan_paged(qo, t.indptr, ids.view, t.last);
      Out good = run_and_fetch(run, dt, rows, Hq, D);
      EXPECT_TRUE(bitwise_equal(host.o, good.o));
    }
}

}  // namespace
