// Helpers shared by the CPU reference's own tests (test_reference*.cpp):
// logical K/V per request, expected results built head by head from a naive
// formula, and an element-wise comparison that reports the first mismatches.
#pragma once
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "tessera/reference/attention.hpp"
#include "test_util.hpp"

namespace tessera::test {

inline const double kNegInf = -std::numeric_limits<double>::infinity();

// Per-request logical K/V: [kv_len, Hkv, D] doubles (values as stored).
struct LogicalKV {
  std::vector<std::vector<double>> k, v;
};

// Expected result built per request and qo head by
// fn(request, qh [nq, D], kh [nk, D], vh [nk, D], nq, nk, D, o, lse), with the
// head's K/V taken from its KV head (GQA).
template <typename Fn>
inline reference::Result expected_per_head(const TensorView& q, const RaggedIndex& qo, const LogicalKV& kv, int64_t Hkv, Fn fn) {
  const int64_t Hq = q.size(1), D = q.size(2), group = Hq / Hkv;
  const std::vector<double> qd = test::to_doubles(q);
  reference::Result r;
  r.rows = q.size(0);
  r.heads = Hq;
  r.head_dim = D;
  r.o.assign(r.rows * Hq * D, 0.0);
  r.lse.assign(r.rows * Hq, 0.0);
  for (int64_t i = 0; i < qo.num_sequences(); ++i) {
    const int64_t nq = qo.length(i), nk = static_cast<int64_t>(kv.k[i].size()) / (Hkv * D);
    for (int64_t h = 0; h < Hq; ++h) {
      std::vector<double> qh(nq * D), kh(nk * D), vh(nk * D), o, lse;
      for (int64_t a = 0; a < nq; ++a)
        for (int64_t d = 0; d < D; ++d) qh[a * D + d] = qd[((qo.begin(i) + a) * Hq + h) * D + d];
      for (int64_t j = 0; j < nk; ++j)
        for (int64_t d = 0; d < D; ++d) {
          kh[j * D + d] = kv.k[i][(j * Hkv + h / group) * D + d];
          vh[j * D + d] = kv.v[i][(j * Hkv + h / group) * D + d];
        }
      fn(i, qh, kh, vh, nq, nk, D, o, lse);
      for (int64_t a = 0; a < nq; ++a) {
        const int64_t row = qo.begin(i) + a;
        for (int64_t d = 0; d < D; ++d) r.o[(row * Hq + h) * D + d] = o[a * D + d];
        r.lse[row * Hq + h] = lse[a];
      }
    }
  }
  return r;
}

inline void expect_same(const reference::Result& got, const reference::Result& want, double tol = 1e-10) {
  ASSERT_EQ(got.rows, want.rows);
  ASSERT_EQ(got.heads, want.heads);
  ASSERT_EQ(got.head_dim, want.head_dim);
  int bad = 0;
  for (size_t i = 0; i < want.o.size() && bad < 5; ++i)
    if (!(std::abs(got.o[i] - want.o[i]) <= tol)) {
      ADD_FAILURE() << "o[" << i << "] = " << got.o[i] << ", want " << want.o[i];
      ++bad;
    }
  for (size_t i = 0; i < want.lse.size() && bad < 10; ++i) {
    const bool both_empty = got.lse[i] == kNegInf && want.lse[i] == kNegInf;
    if (!both_empty && !(std::abs(got.lse[i] - want.lse[i]) <= tol)) {
      ADD_FAILURE() << "lse[" << i << "] = " << got.lse[i] << ", want " << want.lse[i];
      ++bad;
    }
  }
}

}  // namespace tessera::test
