// apply_rope / apply_rope_pos_ids on host tensors (the CPU path) against a
// naive rotation written here, in and out of place, partial rotary_dim, both
// layouts, and argument errors that name the argument. Also the
// AttentionWrapper's checks that need no GPU.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

#include "fake_workspace.hpp"
#include "tessera/api/attention_wrapper.hpp"
#include "tessera/api/rope.hpp"
#include "test_util.hpp"

namespace tessera {
namespace {

using test::HostTensor;
using test::make_host;

// x' [a] = x[a] cos - x[b] sin, x'[b] = x[b] cos + x[a] sin for each pair (a, b).
double naive_rotated(const HostTensor& x, int64_t n, int64_t h, int64_t d, double pos, const RopeOptions& o) {
  const int64_t D = x.view.size(2), rd = o.rotary_dim < 0 ? D : o.rotary_dim;
  auto at = [&](int64_t f) { return static_cast<double>(test::load(x.view, {n, h, f})); };
  if (d >= rd) return at(d);
  const int64_t j = o.interleave ? d / 2 : d % (rd / 2);
  const bool first = o.interleave ? d % 2 == 0 : d < rd / 2;
  const int64_t partner = o.interleave ? d ^ 1 : (first ? d + rd / 2 : d - rd / 2);
  const double angle = pos / o.rope_scale * std::pow(o.rope_theta, -2.0 * j / rd);
  return first ? at(d) * std::cos(angle) - at(partner) * std::sin(angle)
               : at(d) * std::cos(angle) + at(partner) * std::sin(angle);
}

void expect_rotated(const HostTensor& in, const HostTensor& out, const std::vector<int32_t>& pos, const RopeOptions& o) {
  const double tol = in.view.dtype == DType::kBFloat16 ? 1e-2 : 2e-3;  // one rounding to the dtype
  for (int64_t n = 0; n < in.view.size(0); ++n)
    for (int64_t h = 0; h < in.view.size(1); ++h)
      for (int64_t d = 0; d < in.view.size(2); ++d) {
        const double want = naive_rotated(in, n, h, d, pos[n], o);
        ASSERT_NEAR(test::load(out.view, {n, h, d}), want, tol * std::max(1.0, std::abs(want)))
            << "row " << n << " head " << h << " feature " << d;
      }
}

struct RopeCase {
  DType dt;
  int D, rotary_dim;
  bool interleave;
  double scale, theta;
};

class RopeCpu : public ::testing::TestWithParam<RopeCase> {};

TEST_P(RopeCpu, PosIdsAndIndptrMatchNaive) {
  const RopeCase c = GetParam();
  const RopeOptions o{c.rotary_dim, c.interleave, c.scale, c.theta};
  std::mt19937_64 rng(c.D + c.rotary_dim);
  const int64_t nnz = 9;
  HostTensor q = make_host(c.dt, {nnz, 4, c.D}), k = make_host(c.dt, {nnz, 2, c.D});
  test::fill_random(q, rng(), -2, 2);
  test::fill_random(k, rng(), -2, 2);
  const std::vector<int32_t> pos{0, 1, 7, 100, 2047, 3, 3, 12345, 42};
  HostTensor pos_t = make_host(DType::kInt32, {nnz});
  std::memcpy(pos_t.storage.data(), pos.data(), sizeof(int32_t) * nnz);
  HostTensor qo = q, ko = k;
  apply_rope_pos_ids(q.view, k.view, qo.view, ko.view, pos_t.view, o);
  expect_rotated(q, qo, pos, o);
  expect_rotated(k, ko, pos, o);

  // Requests [0, 4), [4, 4), [4, 9) at offsets 10, 0, 500; in place.
  const std::vector<int32_t> indptr{0, 4, 4, 9}, offsets{10, 0, 500};
  HostTensor ip = make_host(DType::kInt32, {4}), off = make_host(DType::kInt32, {3});
  std::memcpy(ip.storage.data(), indptr.data(), sizeof(int32_t) * 4);
  std::memcpy(off.storage.data(), offsets.data(), sizeof(int32_t) * 3);
  HostTensor qi = q, ki = k;
  apply_rope(qi.view, ki.view, qi.view, ki.view, ip.view, off.view, o);
  const std::vector<int32_t> pos2{10, 11, 12, 13, 500, 501, 502, 503, 504};
  expect_rotated(q, qi, pos2, o);
  expect_rotated(k, ki, pos2, o);

  // k with zero heads: q alone.
  HostTensor none = make_host(c.dt, {nnz, 0, c.D}), qz = q;
  apply_rope_pos_ids(q.view, none.view, qz.view, none.view, pos_t.view, o);
  expect_rotated(q, qz, pos, o);
}

INSTANTIATE_TEST_SUITE_P(Layouts, RopeCpu,
                         ::testing::Values(RopeCase{DType::kFloat16, 128, -1, false, 1.0, 1e4},
                                           RopeCase{DType::kFloat16, 128, -1, true, 1.0, 1e4},
                                           RopeCase{DType::kBFloat16, 64, 32, false, 4.0, 5e5},
                                           RopeCase{DType::kFloat16, 256, 64, true, 1.0, 1e6}),
                         [](const auto& info) {
                           const RopeCase& c = info.param;
                           return std::string(dtype_name(c.dt)) + "_d" + std::to_string(c.D) + "_rd" +
                                  std::to_string(c.rotary_dim < 0 ? c.D : c.rotary_dim) +
                                  (c.interleave ? "_interleave" : "_half");
                         });

TEST(RopeCpu, RejectsBadArguments) {
  HostTensor q = make_host(DType::kFloat16, {3, 4, 128}), k = make_host(DType::kFloat16, {3, 2, 128});
  HostTensor pos = make_host(DType::kInt32, {3}), qo = q, ko = k;
  EXPECT_NO_THROW(apply_rope_pos_ids(q.view, k.view, qo.view, ko.view, pos.view));
  HostTensor kb = make_host(DType::kBFloat16, {3, 2, 128});
  EXPECT_THROW_MSG(apply_rope_pos_ids(q.view, kb.view, qo.view, kb.view, pos.view), TypeMismatch, "k");
  HostTensor k4 = make_host(DType::kFloat16, {4, 2, 128});
  EXPECT_THROW_MSG(apply_rope_pos_ids(q.view, k4.view, qo.view, k4.view, pos.view), InvalidArgument, "k");
  EXPECT_THROW_MSG(apply_rope_pos_ids(q.view, k.view, ko.view, ko.view, pos.view), InvalidArgument, "q_rope");
  HostTensor q32 = make_host(DType::kFloat32, {3, 4, 128});
  EXPECT_THROW_MSG(apply_rope_pos_ids(q32.view, k.view, q32.view, ko.view, pos.view), TypeMismatch, "q");
  HostTensor q96 = make_host(DType::kFloat16, {3, 4, 96}), k96 = make_host(DType::kFloat16, {3, 2, 96});
  EXPECT_THROW_MSG(apply_rope_pos_ids(q96.view, k96.view, q96.view, k96.view, pos.view), InvalidArgument, "head_dim");
  RopeOptions o;
  o.rotary_dim = 24;
  EXPECT_THROW_MSG(apply_rope_pos_ids(q.view, k.view, qo.view, ko.view, pos.view, o), InvalidArgument, "rotary_dim");
  o = RopeOptions();
  o.rope_theta = 0;
  EXPECT_THROW_MSG(apply_rope_pos_ids(q.view, k.view, qo.view, ko.view, pos.view, o), InvalidArgument, "rope_theta");
  o = RopeOptions();
  o.rope_scale = std::nan("");
  EXPECT_THROW_MSG(apply_rope_pos_ids(q.view, k.view, qo.view, ko.view, pos.view, o), InvalidArgument, "rope_scale");
  HostTensor pos2 = make_host(DType::kInt32, {2}), posf = make_host(DType::kFloat32, {3});
  EXPECT_THROW_MSG(apply_rope_pos_ids(q.view, k.view, qo.view, ko.view, pos2.view), InvalidArgument, "pos_ids");
  EXPECT_THROW_MSG(apply_rope_pos_ids(q.view, k.view, qo.view, ko.view, posf.view), TypeMismatch, "pos_ids");
  HostTensor ip = make_host(DType::kInt32, {2}), off = make_host(DType::kInt32, {1});
  EXPECT_THROW_MSG(apply_rope(q.view, k.view, qo.view, ko.view, ip.view, off.view), InvalidArgument, "indptr");  // [0, 0] != 3 rows
  HostTensor off2 = make_host(DType::kInt32, {2});
  EXPECT_THROW_MSG(apply_rope(q.view, k.view, qo.view, ko.view, ip.view, off2.view), InvalidArgument, "offsets");
}

TEST(AttentionWrapperCpu, ChecksWithoutAGpu) {
  test::FakeWorkspace fw;
  TaskInfo task{8, 2, 16, KVLayout::kNHD, 4, 64};
  task.max_total_q = 64;
  const AttentionSpec mask{variants::custom_mask(), DType::kFloat16, DType::kFloat16, DType::kFloat16, 128};
  AttentionWrapperOptions decode_only;
  decode_only.kind = AttentionKind::kDecode;
  EXPECT_THROW_MSG(AttentionWrapper(mask, task, fw.ws, decode_only), InvalidArgument, "kind");
  const AttentionSpec alibi{variants::alibi(true), DType::kFloat16, DType::kFloat16, DType::kFloat16, 128};
  AttentionWrapper dec(alibi, task, fw.ws, decode_only);
  EXPECT_EQ(dec.kind(), AttentionKind::kDecode);
  EXPECT_NE(dec.decode(), nullptr);
  const std::vector<int32_t> qo{0, 2, 3}, kv{0, 1, 2};
  EXPECT_THROW_MSG(dec.plan_ragged(qo, kv), InvalidArgument, "ragged KV runs on the prefill kernels");
  EXPECT_THROW_MSG(dec.plan(qo, kv, std::vector<int32_t>{0, 1}, std::vector<int32_t>{1, 1}), InvalidArgument,
                   "qo_indptr: a request has a query length other than 1");
  EXPECT_THROW_MSG(dec.run(TensorView(), PagedKVStorage(), TensorView(), TensorView()), InvalidArgument, "plan");
  AttentionWrapper autow(alibi, task, fw.ws);
  EXPECT_EQ(autow.kind(), AttentionKind::kAuto);
  EXPECT_THROW_MSG(autow.run_ragged(TensorView(), TensorView(), TensorView(), TensorView(), TensorView()),
                   InvalidArgument, "plan_ragged");
  TaskInfo bad = task;
  bad.num_qo_heads = 3;
  EXPECT_THROW_MSG(AttentionWrapper(alibi, bad, fw.ws), InvalidArgument, "num_qo_heads");
  // Workspace: auto covers both kinds, each fixed kind its own.
  AttentionWrapperOptions prefill_only;
  prefill_only.kind = AttentionKind::kPrefill;
  const auto a = AttentionWrapper::workspace_size(alibi, task, 132);
  const auto d = AttentionWrapper::workspace_size(alibi, task, 132, decode_only);
  const auto p = AttentionWrapper::workspace_size(alibi, task, 132, prefill_only);
  EXPECT_EQ(a.device_bytes, std::max(d.device_bytes, p.device_bytes));
  EXPECT_EQ(d.device_bytes, BatchDecode::workspace_size(alibi, task, 132).device_bytes);
}

}  // namespace
}  // namespace tessera
