// CPU attention-state merge. The defining property (paper §2.2): attention
// over a KV set equals the merge of attention over any partition of it. So
// partial states come from dense_attention on chunks of a KV set, and their
// merge is compared against dense_attention on the whole set.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>

#include "tessera/abi/merge_params.cuh"
#include "tessera/reference/attention.hpp"
#include "tessera/cpu/merge.hpp"
#include "test_util.hpp"

namespace tessera {
namespace {

using test::HostTensor;
using test::make_host;

const float kNaN = std::numeric_limits<float>::quiet_NaN();
const float kNegInfF = -std::numeric_limits<float>::infinity();

// Independent (row, head) attention problems over n_kv keys each.
struct Problem {
  int64_t N, H, D, n_kv;
  std::vector<double> q, k, v;  // q [N, H, D]; k, v [N, H, n_kv, D]

  Problem(int64_t n, int64_t h, int64_t d, int64_t kv, uint64_t seed) : N(n), H(h), D(d), n_kv(kv) {
    std::mt19937_64 rng(seed);
    std::uniform_real_distribution<double> dist(-2.0, 2.0);
    q.resize(N * H * D);
    k.resize(N * H * n_kv * D);
    v.resize(N * H * n_kv * D);
    for (auto* vec : {&q, &k, &v})
      for (double& x : *vec) x = dist(rng);
  }

  // State of (n, h) over keys [lo, hi): O [D] and base-2 LSE.
  void state(int64_t n, int64_t h, int64_t lo, int64_t hi, std::vector<double>& o, double& lse) const {
    const int64_t base = (n * H + h) * n_kv;
    std::vector<double> qq(q.begin() + (n * H + h) * D, q.begin() + (n * H + h + 1) * D);
    std::vector<double> kk(k.begin() + (base + lo) * D, k.begin() + (base + hi) * D);
    std::vector<double> vv(v.begin() + (base + lo) * D, v.begin() + (base + hi) * D);
    std::vector<double> l;
    reference::dense_attention(qq, kk, vv, 1, hi - lo, D, -1.0, {}, o, l);
    lse = l[0];
  }
};

// Writes state (o, lse) at [n, (s,) h] of v / s (s float32).
void put(HostTensor& v, HostTensor& s, std::initializer_list<int64_t> idx, const std::vector<double>& o, double lse) {
  std::vector<int64_t> base(idx);
  for (int64_t d = 0; d < static_cast<int64_t>(o.size()); ++d) {
    std::vector<int64_t> full = base;
    full.push_back(d);
    int64_t off = 0;
    for (size_t i = 0; i < full.size(); ++i) off += full[i] * v.view.stride(static_cast<int64_t>(i));
    v.set(static_cast<size_t>(off), static_cast<float>(o[d]));
  }
  int64_t off = 0, i = 0;
  for (int64_t x : idx) off += x * s.view.stride(i++);
  s.set(static_cast<size_t>(off), static_cast<float>(lse));
}

// Checks v_out / s_out row (n, h) against the whole-set state of `p`.
void expect_whole(const Problem& p, const HostTensor& v_out, const HostTensor& s_out, int64_t n, int64_t h,
                  double tol) {
  std::vector<double> o;
  double lse;
  p.state(n, h, 0, p.n_kv, o, lse);
  for (int64_t d = 0; d < p.D; ++d)
    EXPECT_NEAR(test::load(v_out.view, {n, h, d}), o[d], tol) << "n=" << n << " h=" << h << " d=" << d;
  EXPECT_NEAR(test::load(s_out.view, {n, h}), lse, tol) << "n=" << n << " h=" << h;
}

TEST(MergeCpu, MergeStateEqualsWholeRecompute) {
  const int64_t N = 4, H = 3, D = 16, n_kv = 12;
  Problem p(N, H, D, n_kv, 11);
  for (DType vt : {DType::kFloat32, DType::kFloat16}) {
    SCOPED_TRACE(dtype_name(vt));
    HostTensor va = make_host(vt, {N, H, D}), vb = make_host(vt, {N, H, D}), vo = make_host(vt, {N, H, D});
    HostTensor sa = make_host(DType::kFloat32, {N, H}), sb = make_host(DType::kFloat32, {N, H}),
               so = make_host(DType::kFloat32, {N, H});
    for (int64_t n = 0; n < N; ++n)
      for (int64_t h = 0; h < H; ++h) {
        // Split points include 0 and n_kv: one side is then an empty state.
        const int64_t split = (n * H + h) % (n_kv + 1);
        std::vector<double> o;
        double lse;
        p.state(n, h, 0, split, o, lse);
        if (split == 0) o.assign(D, kNaN);  // an empty state's value is garbage
        put(va, sa, {n, h}, o, lse);
        p.state(n, h, split, n_kv, o, lse);
        put(vb, sb, {n, h}, o, lse);
      }
    cpu::merge_state(va.view, sa.view, vb.view, sb.view, vo.view, so.view);
    const double tol = vt == DType::kFloat32 ? 1e-5 : 3e-3;
    for (int64_t n = 0; n < N; ++n)
      for (int64_t h = 0; h < H; ++h) expect_whole(p, vo, so, n, h, tol);
  }
}

TEST(MergeCpu, LseDifferencesOfHundredsStayExact) {
  HostTensor va = make_host(DType::kFloat32, {4, 1, 2}), vb = make_host(DType::kFloat32, {4, 1, 2});
  HostTensor vo = make_host(DType::kFloat32, {4, 1, 2});
  HostTensor sa = make_host(DType::kFloat32, {4, 1}), sb = make_host(DType::kFloat32, {4, 1}),
             so = make_host(DType::kFloat32, {4, 1});
  const float a_vals[] = {1, 2, 3, 4, 5, 6, 7, 8}, b_vals[] = {-1, -2, -3, -4, -5, -6, -7, -8};
  for (int i = 0; i < 8; ++i) va.set(i, a_vals[i]), vb.set(i, b_vals[i]);
  // Row 0: a dominates by 300 (2^1000 would overflow any float); row 1: b by
  // 300 at negative scale; row 2: equal huge scales; row 3: b larger by 1.
  const float s_a[] = {1000, -500, 20000, 5000}, s_b[] = {700, -200, 20000, 5001};
  for (int i = 0; i < 4; ++i) sa.set(i, s_a[i]), sb.set(i, s_b[i]);
  cpu::merge_state(va.view, sa.view, vb.view, sb.view, vo.view, so.view);
  EXPECT_EQ(vo.get(0), 1.0f);
  EXPECT_EQ(vo.get(1), 2.0f);
  EXPECT_EQ(so.get(0), 1000.0f);
  EXPECT_EQ(vo.get(2), -3.0f);
  EXPECT_EQ(vo.get(3), -4.0f);
  EXPECT_EQ(so.get(1), -200.0f);
  EXPECT_FLOAT_EQ(vo.get(4), 0.0f);  // (5 + -5) / 2
  EXPECT_FLOAT_EQ(so.get(2), 20001.0f);
  EXPECT_FLOAT_EQ(vo.get(6), (7.0f - 2 * 7.0f) / 3);  // weights 1/3, 2/3
  EXPECT_FLOAT_EQ(so.get(3), static_cast<float>(5000 + std::log2(3.0)));
}

TEST(MergeCpu, EmptyStatesContributeNothing) {
  HostTensor va = make_host(DType::kBFloat16, {2, 1, 3}), vb = make_host(DType::kBFloat16, {2, 1, 3});
  HostTensor vo = make_host(DType::kBFloat16, {2, 1, 3});
  HostTensor sa = make_host(DType::kFloat32, {2, 1}), sb = make_host(DType::kFloat32, {2, 1}),
             so = make_host(DType::kFloat32, {2, 1});
  for (int i = 0; i < 6; ++i) va.set(i, kNaN), vb.set(i, 0.5f * i);
  vb.set(3, kNaN);  // row 1: both empty, both garbage
  sa.set(0, kNegInfF), sb.set(0, 3.5f);
  sa.set(1, kNegInfF), sb.set(1, kNegInfF);
  for (int i = 0; i < 3; ++i) vo.set(3 + i, 9.0f);  // must be overwritten with 0
  cpu::merge_state(va.view, sa.view, vb.view, sb.view, vo.view, so.view);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(vo.get(i), 0.5f * i);
  EXPECT_EQ(so.get(0), 3.5f);
  for (int i = 3; i < 6; ++i) EXPECT_EQ(vo.get(i), 0.0f);
  EXPECT_EQ(so.get(1), kNegInfF);
}

TEST(MergeCpu, InPlaceAndWithoutLseOutput) {
  const int64_t N = 3, H = 2, D = 8;
  HostTensor va = make_host(DType::kFloat16, {N, H, D}), vb = make_host(DType::kFloat16, {N, H, D});
  HostTensor sa = make_host(DType::kFloat32, {N, H}), sb = make_host(DType::kFloat32, {N, H});
  test::fill_random(va, 1);
  test::fill_random(vb, 2);
  test::fill_random(sa, 3, -5, 5);
  test::fill_random(sb, 4, -5, 5);
  HostTensor vo = make_host(DType::kFloat16, {N, H, D}), so = make_host(DType::kFloat32, {N, H});
  cpu::merge_state(va.view, sa.view, vb.view, sb.view, vo.view, so.view);
  HostTensor vo2 = make_host(DType::kFloat16, {N, H, D});
  cpu::merge_state(va.view, sa.view, vb.view, sb.view, vo2.view, TensorView{});  // s_out undefined
  cpu::merge_state(va.view, sa.view, vb.view, sb.view, va.view, sa.view);         // v_out == v_a, s_out == s_a
  EXPECT_EQ(va.storage, vo.storage);
  EXPECT_EQ(vo2.storage, vo.storage);
  EXPECT_EQ(sa.storage, so.storage);
  bool changed = false;  // guard: the merge really did something
  for (size_t i = 0; i < vb.storage_elems(); ++i) changed |= vo.get(i) != vb.get(i);
  EXPECT_TRUE(changed);
}

// Splits p's keys of every (n, h) into S chunks (some empty) stored as
// v [N, S, H, D], s [N, S, H]. Chunk c covers [bounds[c], bounds[c+1]).
TEST(MergeCpu, MergeStatesFixedCount) {
  const int64_t N = 3, S = 5, H = 2, D = 8, n_kv = 10;
  Problem p(N, H, D, n_kv, 21);
  const int64_t bounds[S + 1] = {0, 3, 3, 7, 10, 10};
  HostTensor v = make_host(DType::kFloat32, {N, S, H, D}), s = make_host(DType::kFloat32, {N, S, H});
  for (int64_t n = 0; n < N; ++n)
    for (int64_t c = 0; c < S; ++c)
      for (int64_t h = 0; h < H; ++h) {
        std::vector<double> o;
        double lse;
        p.state(n, h, bounds[c], bounds[c + 1], o, lse);
        if (bounds[c] == bounds[c + 1]) o.assign(D, kNaN);
        put(v, s, {n, c, h}, o, lse);
      }
  HostTensor vo = make_host(DType::kFloat32, {N, H, D}), so = make_host(DType::kFloat32, {N, H});
  cpu::merge_states(v.view, s.view, vo.view, so.view);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t h = 0; h < H; ++h) expect_whole(p, vo, so, n, h, 1e-5);

  // S = 0: nothing to merge, every row is empty.
  HostTensor v0 = make_host(DType::kFloat32, {N, 0, H, D}), s0 = make_host(DType::kFloat32, {N, 0, H});
  cpu::merge_states(v0.view, s0.view, vo.view, so.view);
  for (size_t i = 0; i < vo.storage_elems(); ++i) EXPECT_EQ(vo.get(i), 0.0f);
  for (size_t i = 0; i < so.storage_elems(); ++i) EXPECT_EQ(so.get(i), kNegInfF);
}

TEST(MergeCpu, MergeStatesRagged) {
  const int64_t H = 2, D = 8, n_kv = 9;
  // Row 0: 3 chunks, row 1: none, row 2: 1 chunk (whole), row 3: 4 chunks.
  const std::vector<int32_t> indptr_vals{0, 3, 3, 4, 8};
  const std::vector<std::vector<int64_t>> bounds{{0, 2, 2, 9}, {}, {0, 9}, {0, 1, 4, 8, 9}};
  const int64_t N = 4, total = 8;
  Problem p(N, H, D, n_kv, 31);
  HostTensor v = make_host(DType::kBFloat16, {total, H, D}), s = make_host(DType::kFloat32, {total, H});
  for (int64_t n = 0; n < N; ++n)
    for (size_t c = 0; c + 1 < bounds[n].size(); ++c)
      for (int64_t h = 0; h < H; ++h) {
        std::vector<double> o;
        double lse;
        p.state(n, h, bounds[n][c], bounds[n][c + 1], o, lse);
        put(v, s, {indptr_vals[n] + static_cast<int64_t>(c), h}, o, lse);
      }
  HostTensor indptr = make_host(DType::kInt32, {N + 1});
  std::copy(indptr_vals.begin(), indptr_vals.end(), indptr.view.ptr<int32_t>());
  HostTensor vo = make_host(DType::kFloat32, {N, H, D}), so = make_host(DType::kFloat32, {N, H});
  test::fill_random(vo, 5);  // garbage that row 1 must overwrite
  cpu::merge_states_ragged(v.view, s.view, indptr.view, vo.view, so.view);
  for (int64_t n : {0, 2, 3})
    for (int64_t h = 0; h < H; ++h) expect_whole(p, vo, so, n, h, 2e-2);  // bf16 partial values
  for (int64_t h = 0; h < H; ++h) {
    EXPECT_EQ(test::load(so.view, {1, h}), kNegInfF);
    for (int64_t d = 0; d < D; ++d) EXPECT_EQ(test::load(vo.view, {1, h, d}), 0.0f);
  }
}

// The merge kernels find a row's token as fast_divide(row, heads): it must be
// floor division for every row below 2^31, for every head count.
TEST(MergeCpu, FastDivideIsFloorDivision) {
  std::mt19937_64 rng(7);
  std::vector<int> divisors;
  for (int d = 1; d <= 1100; ++d) divisors.push_back(d);
  for (int e = 11; e <= 30; ++e)
    for (int delta : {-1, 0, 1}) divisors.push_back((1 << e) + delta);
  divisors.push_back(std::numeric_limits<int32_t>::max());
  const int top = std::numeric_limits<int32_t>::max();
  for (int d : divisors) {
    const FastDivisor f = fast_divisor(d);
    std::vector<int> xs = {0, 1, d - 1, d, top, top - 1, top - (top % d), top - (top % d) - 1};
    if (d < top / 3) for (int m : {2, 3}) xs.insert(xs.end(), {m * d - 1, m * d, m * d + 1});
    for (int i = 0; i < 200; ++i) xs.push_back(static_cast<int>(rng() % (static_cast<uint64_t>(top) + 1)));
    for (int x : xs) {
      if (x < 0) continue;
      ASSERT_EQ(fast_divide(x, f), x / d) << "x " << x << ", d " << d;
    }
  }
}

TEST(MergeCpu, RejectsBadInput) {
  HostTensor v = make_host(DType::kFloat16, {2, 3, 8}), s = make_host(DType::kFloat32, {2, 3});
  HostTensor vo = make_host(DType::kFloat16, {2, 3, 8}), so = make_host(DType::kFloat32, {2, 3});
  HostTensor v_short = make_host(DType::kFloat16, {2, 3, 4});
  HostTensor s_half = make_host(DType::kFloat16, {2, 3}), s_bad = make_host(DType::kFloat32, {3, 2});
  HostTensor v_int = make_host(DType::kInt32, {2, 3, 8});
  TensorView v_gpu = v.view;
  v_gpu.device = Device{DeviceType::kCUDA, 0};
  using cpu::merge_state;
  EXPECT_THROW_MSG(merge_state(v.view, s.view, v_short.view, s.view, vo.view, so.view), InvalidArgument,
                   "v_b: expected shape [2, 3, 8]");
  EXPECT_THROW_MSG(merge_state(v.view, s_half.view, v.view, s.view, vo.view, so.view), TypeMismatch, "s_a");
  EXPECT_THROW_MSG(merge_state(v.view, s.view, v.view, s_bad.view, vo.view, so.view), InvalidArgument, "s_b");
  EXPECT_THROW_MSG(merge_state(v.view, s.view, v.view, s.view, v_short.view, so.view), InvalidArgument, "v_out");
  EXPECT_THROW_MSG(merge_state(v.view, s.view, v.view, s.view, vo.view, s_bad.view), InvalidArgument, "s_out");
  EXPECT_THROW_MSG(merge_state(v_gpu, s.view, v.view, s.view, vo.view, so.view), TypeMismatch, "v_a: expected device cpu");
  EXPECT_THROW_MSG(merge_state(v_int.view, s.view, v.view, s.view, vo.view, so.view), TypeMismatch, "v_a: expected dtype");

  HostTensor v4 = make_host(DType::kFloat32, {2, 4, 3, 8}), s3 = make_host(DType::kFloat32, {2, 4, 3});
  EXPECT_NO_THROW(cpu::merge_states(v4.view, s3.view, vo.view, so.view));
  EXPECT_THROW_MSG(cpu::merge_states(v.view, s3.view, vo.view, so.view), InvalidArgument, "v: expected a 4-D");
  EXPECT_THROW_MSG(cpu::merge_states(v4.view, s.view, vo.view, so.view), InvalidArgument, "s: expected shape [2, 4, 3]");

  HostTensor ip = make_host(DType::kInt32, {3});
  auto set_ip = [&](int32_t a, int32_t b, int32_t c) {
    ip.view.ptr<int32_t>()[0] = a, ip.view.ptr<int32_t>()[1] = b, ip.view.ptr<int32_t>()[2] = c;
  };
  set_ip(0, 1, 2);
  EXPECT_NO_THROW(cpu::merge_states_ragged(v.view, s.view, ip.view, vo.view, so.view));
  set_ip(0, 2, 1);
  EXPECT_THROW_MSG(cpu::merge_states_ragged(v.view, s.view, ip.view, vo.view, so.view), InvalidArgument,
                   "indptr: expected non-decreasing");
  set_ip(0, 1, 1);
  EXPECT_THROW_MSG(cpu::merge_states_ragged(v.view, s.view, ip.view, vo.view, so.view), InvalidArgument,
                   "indptr: expected last value == 2");
  HostTensor ip_u8 = make_host(DType::kUInt8, {3});
  EXPECT_THROW_MSG(cpu::merge_states_ragged(v.view, s.view, ip_u8.view, vo.view, so.view), TypeMismatch, "indptr");
  HostTensor ip4 = make_host(DType::kInt32, {4});
  EXPECT_THROW_MSG(cpu::merge_states_ragged(v.view, s.view, ip4.view, vo.view, so.view), InvalidArgument,
                   "v_out: expected shape [3, 3, 8]");
}

}  // namespace
}  // namespace tessera
