// GPU merge kernels against the CPU merge (itself tested against recomputed
// attention in tests/cpu/test_merge_cpu.cpp), on random states with LSE gaps
// of hundreds, empty states (-inf with NaN values), fp16/bf16/fp32; and the
// corners of the kernels' layout (abi/merge_params.cuh): rows per warp step
// and per thread that the row count leaves partly filled, 1, 2 or 4 vectors
// per lane, strided views, the fp32-state cascade merge into 16 bits.
#include <gtest/gtest.h>

#include <cstring>
#include <random>

#include "../../src/api/checks.hpp"  // detail::merge_state_into (the cascade's merge)
#include "gpu_util.hpp"
#include "tessera/api/merge.hpp"
#include "tessera/cpu/merge.hpp"

using namespace tessera;
using namespace tessera::test;

namespace {

// Random scales: mostly moderate, some hundreds apart, some empty (-inf).
HostTensor random_scales(std::vector<int64_t> shape, uint64_t seed) {
  HostTensor s = make_host(DType::kFloat32, shape);
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> mod(-8.f, 8.f);
  for (size_t i = 0; i < s.storage_elems(); ++i) {
    const int kind = static_cast<int>(rng() % 10);
    s.set(i, kind == 0 ? -INFINITY : kind == 1 ? mod(rng) + 300.f : kind == 2 ? mod(rng) - 300.f : mod(rng));
  }
  return s;
}

// Values of empty states are NaN: they must never leak into the result.
void poison_empty(HostTensor& v, const HostTensor& s, int64_t head_dim) {
  for (size_t i = 0; i < s.storage_elems(); ++i)
    if (std::isinf(s.get(i)))
      for (int64_t d = 0; d < head_dim; ++d) v.set(i * head_dim + d, NAN);
}

class MergeGpu : public ::testing::TestWithParam<std::tuple<DType, int>> {};

TEST_P(MergeGpu, PairAndInPlace) {
  SKIP_WITHOUT_GPU();
  const auto [dt, D] = GetParam();
  const int64_t N = 37, H = 5;
  HostTensor va = make_host(dt, {N, H, D}), vb = make_host(dt, {N, H, D});
  fill_random(va, 1);
  fill_random(vb, 2);
  HostTensor sa = random_scales({N, H}, 3), sb = random_scales({N, H}, 4);
  poison_empty(va, sa, D);
  poison_empty(vb, sb, D);
  HostTensor ref_v = make_host(dt, {N, H, D}), ref_s = make_host(DType::kFloat32, {N, H});
  cpu::merge_state(va.view, sa.view, vb.view, sb.view, ref_v.view, ref_s.view);

  auto dva = to_device(va), dsa = to_device(sa), dvb = to_device(vb), dsb = to_device(sb);
  auto dvo = poisoned_like(ref_v), dso = poisoned_like(ref_s);
  merge_state(dva.view, dsa.view, dvb.view, dsb.view, dvo.view, dso.view);
  TESSERA_CUDA_CHECK(cudaDeviceSynchronize());
  EXPECT_CLOSE(compare(to_doubles(to_host(dvo, ref_v).view), to_doubles(ref_v.view)), dt);
  EXPECT_CLOSE(compare(to_doubles(to_host(dso, ref_s).view), to_doubles(ref_s.view)), DType::kFloat32);

  // In place with a mask: masked-out rows keep a's state bit for bit.
  HostTensor mask = make_host(DType::kUInt8, {N});
  for (int64_t r = 0; r < N; ++r) static_cast<uint8_t*>(mask.view.data)[r] = r % 3 != 0;
  auto dmask = to_device(mask);
  merge_state_in_place(dva.view, dsa.view, dvb.view, dsb.view, dmask.view);
  TESSERA_CUDA_CHECK(cudaDeviceSynchronize());
  HostTensor got_v = to_host(dva, va), got_s = to_host(dsa, sa);
  for (int64_t r = 0; r < N; ++r)
    for (int64_t h = 0; h < H; ++h) {
      const bool merged = r % 3 != 0;
      const float s_exp = merged ? ref_s.get(r * H + h) : sa.get(r * H + h);
      const float s_got = got_s.get(r * H + h);
      if (std::isinf(s_exp)) EXPECT_EQ(s_got, s_exp);
      else EXPECT_NEAR(s_got, s_exp, 1e-4 * std::max(1.f, std::abs(s_exp)));
      for (int64_t d = 0; d < D; ++d) {
        const size_t i = (r * H + h) * D + d;
        if (merged) EXPECT_NEAR(got_v.get(i), ref_v.get(i), tolerance(dt) * 2) << r << "," << h << "," << d;
        else if (!std::isnan(va.get(i))) EXPECT_EQ(got_v.get(i), va.get(i));
      }
    }
}

TEST_P(MergeGpu, ManyFixedAndRagged) {
  SKIP_WITHOUT_GPU();
  const auto [dt, D] = GetParam();
  const int64_t N = 23, S = 6, H = 3;
  HostTensor v = make_host(dt, {N, S, H, D});
  fill_random(v, 7);
  HostTensor s = random_scales({N, S, H}, 8);
  poison_empty(v, s, D);
  HostTensor ref_v = make_host(dt, {N, H, D}), ref_s = make_host(DType::kFloat32, {N, H});
  cpu::merge_states(v.view, s.view, ref_v.view, ref_s.view);
  auto dv = to_device(v), ds = to_device(s), dvo = poisoned_like(ref_v), dso = poisoned_like(ref_s);
  merge_states(dv.view, ds.view, dvo.view, dso.view);
  TESSERA_CUDA_CHECK(cudaDeviceSynchronize());
  EXPECT_CLOSE(compare(to_doubles(to_host(dvo, ref_v).view), to_doubles(ref_v.view)), dt);
  EXPECT_CLOSE(compare(to_doubles(to_host(dso, ref_s).view), to_doubles(ref_s.view)), DType::kFloat32);

  // Ragged: rows with 0, 1 and many states.
  std::vector<int32_t> counts = {0, 1, 5, 0, 9, 2, 1, 13};
  HostTensor indptr = make_host(DType::kInt32, {static_cast<int64_t>(counts.size()) + 1});
  auto* ip = static_cast<int32_t*>(indptr.view.data);
  for (size_t i = 0; i < counts.size(); ++i) ip[i + 1] = ip[i] + counts[i];
  const int64_t total = ip[counts.size()], rows = static_cast<int64_t>(counts.size());
  HostTensor rv = make_host(dt, {total, H, D});
  fill_random(rv, 9);
  HostTensor rs = random_scales({total, H}, 10);
  poison_empty(rv, rs, D);
  HostTensor rref_v = make_host(dt, {rows, H, D}), rref_s = make_host(DType::kFloat32, {rows, H});
  cpu::merge_states_ragged(rv.view, rs.view, indptr.view, rref_v.view, rref_s.view);
  auto drv = to_device(rv), drs = to_device(rs), dip = to_device(indptr);
  auto drvo = poisoned_like(rref_v), drso = poisoned_like(rref_s);
  merge_states_ragged(drv.view, drs.view, dip.view, drvo.view, drso.view);
  TESSERA_CUDA_CHECK(cudaDeviceSynchronize());
  EXPECT_CLOSE(compare(to_doubles(to_host(drvo, rref_v).view), to_doubles(rref_v.view)), dt);
  EXPECT_CLOSE(compare(to_doubles(to_host(drso, rref_s).view), to_doubles(rref_s.view)), DType::kFloat32);
}

INSTANTIATE_TEST_SUITE_P(All, MergeGpu,
                         ::testing::Combine(::testing::Values(DType::kFloat16, DType::kBFloat16, DType::kFloat32),
                                            ::testing::Values(64, 128, 256)));

// [N, H, D] values (and [N, H] scales): contiguous; padded between heads
// (head stride 2D, row stride 2HD, still flat: the row stride is H head
// strides, abi/merge_params.cuh); or padded between heads and rows (head
// stride 2D, row stride (2H + 1) D, not flat). Scales likewise.
enum class Layout { kContiguous, kPaddedFlat, kStrided };
HostTensor values(DType dt, int64_t N, int64_t H, int64_t D, Layout layout) {
  if (layout == Layout::kPaddedFlat) return make_host_strided(dt, {N, H, D}, {2 * H * D, 2 * D, 1});
  if (layout == Layout::kStrided) return make_host_strided(dt, {N, H, D}, {(2 * H + 1) * D, 2 * D, 1});
  return make_host(dt, {N, H, D});
}
HostTensor scales(int64_t N, int64_t H, Layout layout) {
  if (layout == Layout::kPaddedFlat) return make_host_strided(DType::kFloat32, {N, H}, {2 * H, 2});
  if (layout == Layout::kStrided) return make_host_strided(DType::kFloat32, {N, H}, {2 * H + 3, 2});
  return make_host(DType::kFloat32, {N, H});
}

// Random scales through the view (any strides) with the empty-state corners
// pinned: row 0 has a empty, row 1 b empty, row 2 both; empty values are NaN.
void fill_pair(HostTensor& va, HostTensor& sa, HostTensor& vb, HostTensor& sb, uint64_t seed) {
  const int64_t N = va.view.size(0), H = va.view.size(1), D = va.view.size(2);
  fill_random(va, seed);
  fill_random(vb, seed + 1);
  HostTensor ra = random_scales({N, H}, seed + 2), rb = random_scales({N, H}, seed + 3);
  for (int64_t r = 0; r < N; ++r)
    for (int64_t h = 0; h < H; ++h) {
      float a = ra.get(r * H + h), b = rb.get(r * H + h);
      if (r == 0) a = -INFINITY;
      if (r == 1) b = -INFINITY;
      if (r == 2) a = b = -INFINITY;
      store(sa.view, {r, h}, a);
      store(sb.view, {r, h}, b);
      for (int64_t d = 0; d < D; ++d) {
        if (std::isinf(a)) store(va.view, {r, h, d}, NAN);
        if (std::isinf(b)) store(vb.view, {r, h, d}, NAN);
      }
    }
}

class MergeGpuLayout : public ::testing::TestWithParam<std::tuple<DType, int, int64_t, Layout>> {};

// merge_state, then merge_state_in_place with a mask, on N rows of 3 heads.
// The second merge_state writes to another layout than its inputs', so flat
// and non-flat sets meet in one call (the non-flat kernel's case).
TEST_P(MergeGpuLayout, PairAndInPlace) {
  SKIP_WITHOUT_GPU();
  const auto [dt, D, N, layout] = GetParam();
  const int64_t H = 3;
  HostTensor va = values(dt, N, H, D, layout), vb = values(dt, N, H, D, layout);
  HostTensor sa = scales(N, H, layout), sb = scales(N, H, layout);
  fill_pair(va, sa, vb, sb, 40 + N);
  HostTensor ref_v = make_host(dt, {N, H, D}), ref_s = make_host(DType::kFloat32, {N, H});
  cpu::merge_state(va.view, sa.view, vb.view, sb.view, ref_v.view, ref_s.view);

  auto dva = to_device(va), dsa = to_device(sa), dvb = to_device(vb), dsb = to_device(sb);
  HostTensor out_v = values(dt, N, H, D, layout), out_s = scales(N, H, layout);
  auto dvo = poisoned_like(out_v), dso = poisoned_like(out_s);
  merge_state(dva.view, dsa.view, dvb.view, dsb.view, dvo.view, dso.view);
  // Without the LSE output: the values alone, into the other layout.
  HostTensor out_v2 = values(dt, N, H, D, layout == Layout::kStrided ? Layout::kContiguous : Layout::kStrided);
  auto dvo2 = poisoned_like(out_v2);
  merge_state(dva.view, dsa.view, dvb.view, dsb.view, dvo2.view, TensorView());
  TESSERA_CUDA_CHECK(cudaDeviceSynchronize());
  const auto ref_vd = to_doubles(ref_v.view), ref_sd = to_doubles(ref_s.view);
  EXPECT_CLOSE(compare(to_doubles(to_host(dvo, out_v).view), ref_vd), dt);
  EXPECT_CLOSE(compare(to_doubles(to_host(dso, out_s).view), ref_sd), DType::kFloat32);
  EXPECT_CLOSE(compare(to_doubles(to_host(dvo2, out_v2).view), ref_vd), dt);
  if (N > 2) {  // both empty: zeros and -inf
    HostTensor got = to_host(dvo, out_v), got_s = to_host(dso, out_s);
    for (int64_t h = 0; h < H; ++h) {
      EXPECT_EQ(load(got_s.view, {2, h}), -INFINITY);
      for (int64_t d = 0; d < D; ++d) EXPECT_EQ(load(got.view, {2, h, d}), 0.f);
    }
  }

  // In place, every third row masked out: those keep a's bits.
  HostTensor mask = make_host(DType::kUInt8, {N});
  for (int64_t r = 0; r < N; ++r) static_cast<uint8_t*>(mask.view.data)[r] = r % 3 != 1;
  auto dmask = to_device(mask);
  merge_state_in_place(dva.view, dsa.view, dvb.view, dsb.view, dmask.view);
  TESSERA_CUDA_CHECK(cudaDeviceSynchronize());
  HostTensor got_v = to_host(dva, va), got_s = to_host(dsa, sa);
  std::vector<double> got, want, got_lse, want_lse;  // the merged rows
  const size_t es = dtype_size(dt);
  for (int64_t r = 0; r < N; ++r)
    for (int64_t h = 0; h < H; ++h) {
      if (r % 3 == 1) {
        EXPECT_EQ(std::memcmp(&got_s.storage[offset_of(got_s.view, {r, h}) * 4],
                              &sa.storage[offset_of(sa.view, {r, h}) * 4], 4), 0) << r << "," << h;
        EXPECT_EQ(std::memcmp(&got_v.storage[offset_of(got_v.view, {r, h, 0}) * es],
                              &va.storage[offset_of(va.view, {r, h, 0}) * es], D * es), 0) << r << "," << h;
        continue;
      }
      got_lse.push_back(load(got_s.view, {r, h}));
      want_lse.push_back(load(ref_s.view, {r, h}));
      for (int64_t d = 0; d < D; ++d) {
        got.push_back(load(got_v.view, {r, h, d}));
        want.push_back(load(ref_v.view, {r, h, d}));
      }
    }
  EXPECT_CLOSE(compare(got, want), dt);
  EXPECT_CLOSE(compare(got_lse, want_lse), DType::kFloat32);
}

// merge_states over 1 .. 9 states per row (blocks of 4 loads: full, partial,
// several), odd row counts, empty states and all-empty rows.
TEST_P(MergeGpuLayout, ManyStates) {
  SKIP_WITHOUT_GPU();
  const auto [dt, D, N, layout] = GetParam();
  if (layout != Layout::kContiguous) GTEST_SKIP() << "merge_states: makes its own contiguous states, so one layout runs";
  const int64_t H = 3;
  for (int64_t S : {1, 2, 4, 5, 9}) {
    HostTensor v = make_host(dt, {N, S, H, D});
    fill_random(v, 60 + S);
    HostTensor s = random_scales({N, S, H}, 70 + S);
    for (int64_t j = 0; j < S; ++j) s.set(j * H + 1, -INFINITY);  // row 0, head 1: every state empty
    poison_empty(v, s, D);
    HostTensor ref_v = make_host(dt, {N, H, D}), ref_s = make_host(DType::kFloat32, {N, H});
    cpu::merge_states(v.view, s.view, ref_v.view, ref_s.view);
    auto dv = to_device(v), ds = to_device(s), dvo = poisoned_like(ref_v), dso = poisoned_like(ref_s);
    merge_states(dv.view, ds.view, dvo.view, dso.view);
    TESSERA_CUDA_CHECK(cudaDeviceSynchronize());
    SCOPED_TRACE("states " + std::to_string(S));
    HostTensor got_v = to_host(dvo, ref_v), got_s = to_host(dso, ref_s);
    EXPECT_CLOSE(compare(to_doubles(got_v.view), to_doubles(ref_v.view)), dt);
    EXPECT_CLOSE(compare(to_doubles(got_s.view), to_doubles(ref_s.view)), DType::kFloat32);
    EXPECT_EQ(got_s.get(1), -INFINITY);
    for (int64_t d = 0; d < D; ++d) EXPECT_EQ(got_v.get(D + d), 0.f);
  }
}

INSTANTIATE_TEST_SUITE_P(Layout, MergeGpuLayout,
                         ::testing::Combine(::testing::Values(DType::kFloat16, DType::kBFloat16, DType::kFloat32),
                                            ::testing::Values(64, 128, 256), ::testing::Values<int64_t>(1, 3, 1001),
                                            ::testing::Values(Layout::kContiguous, Layout::kPaddedFlat,
                                                              Layout::kStrided)));

// The cascade's merge: fp32 states into a 16-bit output (1 and 2 vectors per
// lane), in place on the LSE.
TEST(MergeGpuCascade, Fp32StatesIntoHalfOutput) {
  SKIP_WITHOUT_GPU();
  for (DType out_dt : {DType::kFloat16, DType::kBFloat16})
    for (int64_t D : {64, 128, 256}) {
      const int64_t N = 45, H = 5;
      HostTensor va = make_host(DType::kFloat32, {N, H, D}), vb = make_host(DType::kFloat32, {N, H, D});
      HostTensor sa = make_host(DType::kFloat32, {N, H}), sb = make_host(DType::kFloat32, {N, H});
      fill_pair(va, sa, vb, sb, 90 + D);
      HostTensor ref_v = make_host(DType::kFloat32, {N, H, D}), ref_s = make_host(DType::kFloat32, {N, H});
      cpu::merge_state(va.view, sa.view, vb.view, sb.view, ref_v.view, ref_s.view);
      auto dva = to_device(va), dsa = to_device(sa), dvb = to_device(vb), dsb = to_device(sb);
      HostTensor out = make_host(out_dt, {N, H, D});
      auto dout = poisoned_like(out);
      detail::merge_state_into(dva.view, dsa.view, dvb.view, dsb.view, dout.view, dsa.view, TensorView(), nullptr);
      TESSERA_CUDA_CHECK(cudaDeviceSynchronize());
      SCOPED_TRACE(std::string(dtype_name(out_dt)) + " D=" + std::to_string(D));
      EXPECT_CLOSE(compare(to_doubles(to_host(dout, out).view), to_doubles(ref_v.view)), out_dt);
      EXPECT_CLOSE(compare(to_doubles(to_host(dsa, sa).view), to_doubles(ref_s.view)), DType::kFloat32);
    }
}

// Merges launched with programmatic dependent launch, each reading what the
// one before it wrote (pair, pair, in place, then merge_states over the
// result): each waits for the kernel before it, so the chain matches the
// CPU chain and is bitwise the chain launched plainly. Large enough that
// the next merge's CTAs start while the one before still runs.
TEST(MergeGpuPdl, ChainedMergesSeeEachOthersResults) {
  SKIP_WITHOUT_GPU();
  const int64_t N = 4096, H = 8, D = 128;
  const DType dt = DType::kFloat16;
  HostTensor va = make_host(dt, {N, H, D}), vb = make_host(dt, {N, H, D}), vc = make_host(dt, {N, H, D});
  fill_random(va, 21);
  fill_random(vb, 22);
  fill_random(vc, 23);
  HostTensor sa = random_scales({N, H}, 24), sb = random_scales({N, H}, 25), sc = random_scales({N, H}, 26);
  poison_empty(va, sa, D);
  poison_empty(vb, sb, D);
  poison_empty(vc, sc, D);
  // CPU: x = a (+) b; y = x (+) c; y (+)= a; z = merge_states(y as one state a row).
  HostTensor xv = make_host(dt, {N, H, D}), xs = make_host(DType::kFloat32, {N, H});
  HostTensor yv = make_host(dt, {N, H, D}), ys = make_host(DType::kFloat32, {N, H});
  HostTensor zv = make_host(dt, {N, H, D}), zs = make_host(DType::kFloat32, {N, H});
  cpu::merge_state(va.view, sa.view, vb.view, sb.view, xv.view, xs.view);
  cpu::merge_state(xv.view, xs.view, vc.view, sc.view, yv.view, ys.view);
  cpu::merge_state(yv.view, ys.view, va.view, sa.view, yv.view, ys.view);
  zv = yv;
  zs = ys;
  auto dva = to_device(va), dsa = to_device(sa), dvb = to_device(vb), dsb = to_device(sb);
  auto dvc = to_device(vc), dsc = to_device(sc);
  auto run = [&](bool pdl) {
    auto dxv = poisoned_like(xv), dxs = poisoned_like(xs), dyv = poisoned_like(yv), dys = poisoned_like(ys);
    auto dzv = poisoned_like(zv), dzs = poisoned_like(zs);
    merge_state(dva.view, dsa.view, dvb.view, dsb.view, dxv.view, dxs.view, nullptr, pdl);
    merge_state(dxv.view, dxs.view, dvc.view, dsc.view, dyv.view, dys.view, nullptr, pdl);
    merge_state_in_place(dyv.view, dys.view, dva.view, dsa.view, TensorView(), nullptr, pdl);
    const TensorView states(dyv.view.data, dt, dyv.view.device, {N, 1, H, D});
    const TensorView scales(dys.view.data, DType::kFloat32, dys.view.device, {N, 1, H});
    merge_states(states, scales, dzv.view, dzs.view, nullptr, pdl);
    TESSERA_CUDA_CHECK(cudaDeviceSynchronize());
    return std::pair{to_host(dzv, zv), to_host(dzs, zs)};
  };
  const auto [plain_v, plain_s] = run(false);
  const auto [pdl_v, pdl_s] = run(true);
  EXPECT_CLOSE(compare(to_doubles(pdl_v.view), to_doubles(zv.view)), dt);
  EXPECT_CLOSE(compare(to_doubles(pdl_s.view), to_doubles(zs.view)), DType::kFloat32);
  EXPECT_EQ(std::memcmp(pdl_v.view.data, plain_v.view.data, N * H * D * dtype_size(dt)), 0);
  EXPECT_EQ(std::memcmp(pdl_s.view.data, plain_s.view.data, N * H * sizeof(float)), 0);
}

TEST(MergeGpuErrors, BadInputs) {
  SKIP_WITHOUT_GPU();
  HostTensor v = make_host(DType::kFloat16, {4, 2, 64}), s = make_host(DType::kFloat32, {4, 2});
  auto dv = to_device(v), ds = to_device(s), dv2 = to_device(v), ds2 = to_device(s);
  // Mixed devices.
  EXPECT_THROW_MSG(merge_state(dv.view, ds.view, v.view, s.view, dv2.view, ds2.view), TypeMismatch, "v_b");
  // Non-monotone device indptr is caught on the host copy.
  HostTensor ip = make_host(DType::kInt32, {3});
  static_cast<int32_t*>(ip.view.data)[1] = 3;
  static_cast<int32_t*>(ip.view.data)[2] = 2;
  auto dip = to_device(ip);
  HostTensor out = make_host(DType::kFloat16, {2, 2, 64}), outs = make_host(DType::kFloat32, {2, 2});
  auto dout = to_device(out), douts = to_device(outs);
  EXPECT_THROW_MSG(merge_states_ragged(dv.view, ds.view, dip.view, dout.view, douts.view), InvalidArgument, "indptr");
  // Strides the 16-byte vectors cannot follow: a head stride of 68 fp16
  // elements, an offset data pointer.
  HostTensor odd = make_host_strided(DType::kFloat16, {4, 2, 64}, {136, 68, 1});
  auto dodd = to_device(odd);
  EXPECT_THROW_MSG(merge_state(dodd.view, ds.view, dv.view, ds.view, dv2.view, ds2.view), InvalidArgument,
                   "v_a: expected every stride to be a multiple of 8");
  TensorView shifted = dv.view;
  shifted.data = static_cast<char*>(shifted.data) + 2;
  EXPECT_THROW_MSG(merge_state(dv2.view, ds.view, shifted, ds.view, dv2.view, ds2.view), InvalidArgument,
                   "v_b: expected a 16-byte aligned data pointer");
  // A row of 1032 fp16 values is not a power-of-two count of vectors.
  HostTensor wide = make_host(DType::kFloat16, {1, 1, 1032}), ws = make_host(DType::kFloat32, {1, 1});
  auto dwide = to_device(wide), dws = to_device(ws);
  EXPECT_THROW_MSG(merge_state(dwide.view, dws.view, dwide.view, dws.view, dwide.view, dws.view), InvalidArgument,
                   "head_dim");
}

}  // namespace
