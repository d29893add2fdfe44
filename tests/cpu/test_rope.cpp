// apply_rope / apply_rope_pos_ids (linear and Llama 3.1 frequencies) and
// apply_rope_pos_ids_cos_sin_cache on host tensors (the CPU path) against a
// naive rotation written here, in and out of place, partial rotary_dim, both
// layouts, and argument errors that name the argument. Also the
// AttentionWrapper's checks that need no GPU.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>

#include "fake_workspace.hpp"
#include "tessera/api/attention_wrapper.hpp"
#include "tessera/api/rope.hpp"
#include "test_util.hpp"

namespace tessera {
namespace {

using test::HostTensor;
using test::make_host;

// Radians per position of pair j (Llama 3.1: Hugging Face's "llama3" rope_type, by wavelength).
double naive_freq(int64_t j, int64_t rd, const RopeOptions& o) {
  const double f = std::pow(o.rope_theta, -2.0 * j / rd);
  if (!o.llama31) return f / o.rope_scale;
  const double wavelen = 2 * 3.14159265358979323846 / f;
  if (wavelen < o.old_context_len / o.high_freq_factor) return f;
  if (wavelen > o.old_context_len / o.low_freq_factor) return f / o.rope_scale;
  const double t = (o.old_context_len / wavelen - o.low_freq_factor) / (o.high_freq_factor - o.low_freq_factor);
  return (1 - t) * f / o.rope_scale + t * f;
}

// cos and sin of pair j at position pos: computed from o, or read from a
// cos/sin cache [rows, rd] when one is given.
struct NaiveAngles {
  RopeOptions o;
  const std::vector<float>* cache = nullptr;
  int64_t cache_rd = 0;
  void at(int64_t j, int64_t rd, double pos, double& c, double& s) const {
    if (cache != nullptr) {
      const size_t row = static_cast<size_t>(pos) * cache_rd;
      c = (*cache)[row + j], s = (*cache)[row + cache_rd / 2 + j];
      return;
    }
    const double angle = pos * naive_freq(j, rd, o);
    c = std::cos(angle), s = std::sin(angle);
  }
};

// x' [a] = x[a] cos - x[b] sin, x'[b] = x[b] cos + x[a] sin for each pair (a, b).
double naive_rotated(const HostTensor& x, int64_t n, int64_t h, int64_t d, double pos, const NaiveAngles& an) {
  const RopeOptions& o = an.o;
  const int64_t D = x.view.size(2), rd = an.cache ? an.cache_rd : o.rotary_dim < 0 ? D : o.rotary_dim;
  auto at = [&](int64_t f) { return static_cast<double>(test::load(x.view, {n, h, f})); };
  if (d >= rd) return at(d);
  const int64_t j = o.interleave ? d / 2 : d % (rd / 2);
  const bool first = o.interleave ? d % 2 == 0 : d < rd / 2;
  const int64_t partner = o.interleave ? d ^ 1 : (first ? d + rd / 2 : d - rd / 2);
  double c, s;
  an.at(j, rd, pos, c, s);
  return first ? at(d) * c - at(partner) * s : at(d) * c + at(partner) * s;
}

void expect_rotated(const HostTensor& in, const HostTensor& out, const std::vector<int32_t>& pos, const NaiveAngles& an) {
  const double tol = in.view.dtype == DType::kBFloat16 ? 1e-2 : 2e-3;  // one rounding to the dtype
  for (int64_t n = 0; n < in.view.size(0); ++n)
    for (int64_t h = 0; h < in.view.size(1); ++h)
      for (int64_t d = 0; d < in.view.size(2); ++d) {
        const double want = naive_rotated(in, n, h, d, pos[n], an);
        ASSERT_NEAR(test::load(out.view, {n, h, d}), want, tol * std::max(1.0, std::abs(want)))
            << "row " << n << " head " << h << " feature " << d;
      }
}
void expect_rotated(const HostTensor& in, const HostTensor& out, const std::vector<int32_t>& pos, const RopeOptions& o) {
  expect_rotated(in, out, pos, NaiveAngles{o});
}

struct RopeCase {
  DType dt;
  int D, rotary_dim;
  bool interleave;
  double scale, theta;
  bool llama31 = false;
};

class RopeCpu : public ::testing::TestWithParam<RopeCase> {};

TEST_P(RopeCpu, PosIdsAndIndptrMatchNaive) {
  const RopeCase c = GetParam();
  RopeOptions o{c.rotary_dim, c.interleave, c.scale, c.theta};
  o.llama31 = c.llama31;
  o.low_freq_factor = 1.5, o.high_freq_factor = 6.0, o.old_context_len = 4096;  // not the defaults
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
                                           RopeCase{DType::kFloat16, 256, 64, true, 1.0, 1e6},
                                           // Llama 3.1: pairs in all three bands (kept, blended, scaled).
                                           RopeCase{DType::kFloat16, 128, -1, false, 8.0, 5e5, true},
                                           RopeCase{DType::kBFloat16, 64, 48, true, 4.0, 1e5, true},
                                           RopeCase{DType::kFloat16, 256, 128, false, 32.0, 5e5, true}),
                         [](const auto& info) {
                           const RopeCase& c = info.param;
                           return std::string(dtype_name(c.dt)) + "_d" + std::to_string(c.D) + "_rd" +
                                  std::to_string(c.rotary_dim < 0 ? c.D : c.rotary_dim) +
                                  (c.interleave ? "_interleave" : "_half") + (c.llama31 ? "_llama31" : "");
                         });

// The Llama 3.1 frequencies differ from the linear ones exactly in the
// bands they should: the pairs of short wavelength keep rope_scale = 1's.
TEST(RopeCpu, Llama31BandsAgainstLinear) {
  const int64_t nnz = 2, D = 128;
  HostTensor q = make_host(DType::kFloat16, {nnz, 1, D}), none = make_host(DType::kFloat16, {nnz, 0, D});
  std::mt19937_64 rng(7);
  test::fill_random(q, rng(), -2, 2);
  HostTensor pos_t = make_host(DType::kInt32, {nnz});
  const std::vector<int32_t> pos{3000, 77777};
  std::memcpy(pos_t.storage.data(), pos.data(), sizeof(int32_t) * nnz);
  RopeOptions llama;  // FlashInfer's defaults: rope_scale 8, theta 5e5, factors 1 and 4, 8192
  llama.llama31 = true, llama.rope_scale = 8, llama.rope_theta = 5e5;
  RopeOptions unscaled = llama, scaled = llama;
  unscaled.llama31 = scaled.llama31 = false;
  unscaled.rope_scale = 1;
  HostTensor ql = q, qu = q, qs = q;
  apply_rope_pos_ids(q.view, none.view, ql.view, none.view, pos_t.view, llama);
  apply_rope_pos_ids(q.view, none.view, qu.view, none.view, pos_t.view, unscaled);
  apply_rope_pos_ids(q.view, none.view, qs.view, none.view, pos_t.view, scaled);
  for (int64_t n = 0; n < nnz; ++n)
    for (int64_t j = 0; j < D / 2; ++j) {
      const double wavelen = 2 * 3.14159265358979323846 / std::pow(5e5, -2.0 * j / D);
      const HostTensor& same = wavelen < 2048 ? qu : wavelen > 8192 ? qs : ql;
      for (int64_t f : {j, j + D / 2}) EXPECT_EQ(test::load(ql.view, {n, 0, f}), test::load(same.view, {n, 0, f})) << j;
    }
}

TEST(RopeCpu, CosSinCacheMatchesNaive) {
  for (const bool interleave : {false, true})
    for (const int64_t rd : {int64_t{128}, int64_t{64}}) {
      const int64_t nnz = 6, D = 128, rows = 40;
      std::mt19937_64 rng(rd + interleave);
      HostTensor q = make_host(DType::kBFloat16, {nnz, 3, D}), k = make_host(DType::kBFloat16, {nnz, 1, D});
      test::fill_random(q, rng(), -2, 2);
      test::fill_random(k, rng(), -2, 2);
      // Any values, not unit (cos, sin) pairs: a misread column shows.
      std::vector<float> cache(rows * rd);
      std::uniform_real_distribution<float> u(-1.5f, 1.5f);
      for (float& v : cache) v = u(rng);
      HostTensor cache_t = make_host(DType::kFloat32, {rows, rd});
      std::memcpy(cache_t.storage.data(), cache.data(), sizeof(float) * cache.size());
      const std::vector<int32_t> pos{0, 39, 5, 5, 17, 1};
      HostTensor pos_t = make_host(DType::kInt32, {nnz});
      std::memcpy(pos_t.storage.data(), pos.data(), sizeof(int32_t) * nnz);
      NaiveAngles an;
      an.o.interleave = interleave;
      an.cache = &cache, an.cache_rd = rd;
      HostTensor qo = make_host(DType::kBFloat16, {nnz, 3, D}), ko = make_host(DType::kBFloat16, {nnz, 1, D});
      apply_rope_pos_ids_cos_sin_cache(q.view, k.view, qo.view, ko.view, cache_t.view, pos_t.view, interleave);
      expect_rotated(q, qo, pos, an);
      expect_rotated(k, ko, pos, an);
      HostTensor qi = q, ki = k;  // in place
      apply_rope_pos_ids_cos_sin_cache(qi.view, ki.view, qi.view, ki.view, cache_t.view, pos_t.view, interleave);
      expect_rotated(q, qi, pos, an);
      expect_rotated(k, ki, pos, an);
    }
}

TEST(RopeCpu, CosSinCacheRejectsBadArguments) {
  HostTensor q = make_host(DType::kFloat16, {3, 4, 128}), k = make_host(DType::kFloat16, {3, 2, 128}), qo = q, ko = k;
  HostTensor pos = make_host(DType::kInt32, {3});  // zeros
  HostTensor cache = make_host(DType::kFloat32, {8, 64});
  EXPECT_NO_THROW(apply_rope_pos_ids_cos_sin_cache(q.view, k.view, qo.view, ko.view, cache.view, pos.view));
  HostTensor c16 = make_host(DType::kFloat16, {8, 64});
  EXPECT_THROW_MSG(apply_rope_pos_ids_cos_sin_cache(q.view, k.view, qo.view, ko.view, c16.view, pos.view), TypeMismatch,
                   "cos_sin_cache: expected float32");
  HostTensor c1 = make_host(DType::kFloat32, {512});
  EXPECT_THROW_MSG(apply_rope_pos_ids_cos_sin_cache(q.view, k.view, qo.view, ko.view, c1.view, pos.view), InvalidArgument,
                   "cos_sin_cache");
  for (int64_t bad_rd : {24, 256, 8}) {
    HostTensor c = make_host(DType::kFloat32, {8, bad_rd});
    EXPECT_THROW_MSG(apply_rope_pos_ids_cos_sin_cache(q.view, k.view, qo.view, ko.view, c.view, pos.view),
                     InvalidArgument, "cos_sin_cache: expected [max_pos, rotary_dim]");
  }
  HostTensor far = make_host(DType::kInt32, {3});
  reinterpret_cast<int32_t*>(far.storage.data())[2] = 8;  // one past the cache
  EXPECT_THROW_MSG(apply_rope_pos_ids_cos_sin_cache(q.view, k.view, qo.view, ko.view, cache.view, far.view),
                   InvalidArgument, "pos_ids: expected positions in [0, 8)");
  reinterpret_cast<int32_t*>(far.storage.data())[2] = -1;
  EXPECT_THROW_MSG(apply_rope_pos_ids_cos_sin_cache(q.view, k.view, qo.view, ko.view, cache.view, far.view),
                   InvalidArgument, "pos_ids");
  HostTensor pos2 = make_host(DType::kInt32, {2});
  EXPECT_THROW_MSG(apply_rope_pos_ids_cos_sin_cache(q.view, k.view, qo.view, ko.view, cache.view, pos2.view),
                   InvalidArgument, "pos_ids");
  HostTensor q96 = make_host(DType::kFloat16, {3, 4, 96}), k96 = make_host(DType::kFloat16, {3, 2, 96});
  EXPECT_THROW_MSG(apply_rope_pos_ids_cos_sin_cache(q96.view, k96.view, q96.view, k96.view, cache.view, pos.view),
                   InvalidArgument, "head_dim");
  EXPECT_THROW_MSG(apply_rope_pos_ids_cos_sin_cache(q.view, k.view, ko.view, ko.view, cache.view, pos.view),
                   InvalidArgument, "q_rope");
}

TEST(RopeCpu, Llama31RejectsBadFactors) {
  HostTensor q = make_host(DType::kFloat16, {3, 4, 128}), k = make_host(DType::kFloat16, {3, 2, 128}), qo = q, ko = k;
  HostTensor pos = make_host(DType::kInt32, {3});
  RopeOptions o;
  o.llama31 = true;
  EXPECT_NO_THROW(apply_rope_pos_ids(q.view, k.view, qo.view, ko.view, pos.view, o));
  o.low_freq_factor = 0;
  EXPECT_THROW_MSG(apply_rope_pos_ids(q.view, k.view, qo.view, ko.view, pos.view, o), InvalidArgument, "low_freq_factor");
  o.low_freq_factor = 4;  // == high_freq_factor: no band
  EXPECT_THROW_MSG(apply_rope_pos_ids(q.view, k.view, qo.view, ko.view, pos.view, o), InvalidArgument, "high_freq_factor");
  o.low_freq_factor = 1, o.high_freq_factor = std::numeric_limits<double>::infinity();
  EXPECT_THROW_MSG(apply_rope_pos_ids(q.view, k.view, qo.view, ko.view, pos.view, o), InvalidArgument, "high_freq_factor");
  o.high_freq_factor = 4, o.old_context_len = -8192;
  EXPECT_THROW_MSG(apply_rope_pos_ids(q.view, k.view, qo.view, ko.view, pos.view, o), InvalidArgument, "old_context_len");
  o.old_context_len = 8192, o.rope_scale = 0;
  HostTensor ip = make_host(DType::kInt32, {2}), off = make_host(DType::kInt32, {1});
  reinterpret_cast<int32_t*>(ip.storage.data())[1] = 3;
  EXPECT_THROW_MSG(apply_rope(q.view, k.view, qo.view, ko.view, ip.view, off.view, o), InvalidArgument, "rope_scale");
}

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
