// GPU merge kernels against the CPU merge (itself tested against recomputed
// attention in tests/cpu/test_merge_cpu.cpp), on random states with LSE gaps
// of hundreds, empty states (-inf with NaN values), fp16/bf16/fp32.
#include <gtest/gtest.h>

#include <random>

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
}

}  // namespace
