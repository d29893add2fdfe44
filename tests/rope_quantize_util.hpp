// A fused RoPE + fp8 quantize + paged append problem shared by the CPU and
// GPU tests of rope_quantize_fp8 (api/rope_quantize.hpp): random 16-bit
// q / k / v rows, a float32 cos/sin cache, shuffled pages, appended tokens
// in shuffled order plus padding tokens (batch index -1), every output and
// cache byte poisoned (0xFF) first, and the expected bytes computed here by
// logical indexing (page, slot, head, feature) with the reference math:
// RoPE in float32 with one rounding per operation, times the scale (one
// rounding), then float_to_fp8 (nearest even, saturating).
#pragma once
#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <vector>

#include "tessera/api/rope_quantize.hpp"
#include "tessera/formats/paged_kv.hpp"
#include "test_util.hpp"

namespace tessera::test {

struct RQCase {
  DType in = DType::kFloat16, out = DType::kFloat8E4M3;
  KVLayout layout = KVLayout::kNHD;
  bool mla = false;  // (ckv_cache, kpe_cache), k 2-D, no V
  bool interleave = false;
  int page_size = 16;
  int64_t qo_heads = 4, kv_heads = 2, rope_dim = 64, no_rope_dim = 64;
  float scale_q = 64.f, scale_kv = 0.5f;  // |8 * 64| > 448: e4m3 saturates
  float lo = -8.f, hi = 8.f;
  std::vector<int32_t> old_lens{0, 5, 16, 31, 100, 7}, add_lens{3, 1, 1, 2, 20, 1};
  int padding = 2;   // padded tokens (batch index -1) at the end
  int cache_rows = 300;
  int64_t max_batch = 0, max_indices = 0;  // RopeQuantizeOptions' table bounds (0: the views')
};

// The case's RopeQuantizeOptions.
inline RopeQuantizeOptions options(const RQCase& c) {
  RopeQuantizeOptions o;
  o.interleave = c.interleave;
  o.quant_scale_q = c.scale_q;
  o.quant_scale_kv = c.scale_kv;
  o.max_batch = c.max_batch;
  o.max_indices = c.max_indices;
  return o;
}

struct RQProblem {
  HostTensor q_rope, k_rope, q_nope, k_nope, v, cos_sin;
  HostTensor q_rope_out, q_nope_out, cache0, cache1;  // cache0/1: (k, v) or (ckv, kpe)
  std::vector<int32_t> pos_ids, batch_indices, positions, indptr{0}, indices;
  int64_t nnz = 0, num_pages = 0;
  static TensorView ints(const std::vector<int32_t>& x) {
    return TensorView(const_cast<int32_t*>(x.data()), DType::kInt32, Device{}, {static_cast<int64_t>(x.size())});
  }
};

inline HostTensor poisoned(DType t, std::vector<int64_t> shape) {
  HostTensor h = make_host(t, std::move(shape));
  std::fill(h.storage.begin(), h.storage.end(), uint8_t{0xFF});
  return h;
}

inline RQProblem make_rq_problem(const RQCase& c, uint64_t seed) {
  std::mt19937_64 rng(seed);
  RQProblem p;
  const int64_t batch = static_cast<int64_t>(c.old_lens.size());
  std::vector<int32_t> lens(batch);
  int64_t used = 0;
  for (int64_t b = 0; b < batch; ++b) {
    lens[b] = c.old_lens[b] + c.add_lens[b];
    used += (lens[b] + c.page_size - 1) / c.page_size;
  }
  p.num_pages = used + 3;  // spare pages nobody uses
  std::vector<int32_t> perm(p.num_pages);
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng);
  int64_t next = 0;
  std::vector<std::pair<int32_t, int32_t>> tokens;
  for (int64_t b = 0; b < batch; ++b) {
    const int32_t pages = (lens[b] + c.page_size - 1) / c.page_size;
    for (int32_t i = 0; i < pages; ++i) p.indices.push_back(perm[next++]);
    p.indptr.push_back(static_cast<int32_t>(p.indices.size()));
    for (int32_t pos = c.old_lens[b]; pos < lens[b]; ++pos) tokens.emplace_back(static_cast<int32_t>(b), pos);
  }
  std::shuffle(tokens.begin(), tokens.end(), rng);
  for (int i = 0; i < c.padding; ++i) tokens.emplace_back(-1, 0);
  p.nnz = static_cast<int64_t>(tokens.size());
  for (auto [b, pos] : tokens) {
    p.batch_indices.push_back(b);
    p.positions.push_back(pos);
    p.pos_ids.push_back((pos * 7 + 3) % c.cache_rows);  // RoPE positions differ from cache positions
  }
  const int64_t n = p.nnz, R = c.rope_dim, N = c.no_rope_dim, D = R + N, hk = c.kv_heads;
  auto rows = [&](int64_t heads, int64_t dim, bool k) {
    return c.mla && k ? std::vector<int64_t>{n, dim} : std::vector<int64_t>{n, heads, dim};
  };
  p.q_rope = make_host(c.in, rows(c.qo_heads, R, false));
  p.k_rope = make_host(c.in, rows(hk, R, true));
  p.q_nope = make_host(c.in, rows(c.qo_heads, N, false));
  p.k_nope = make_host(c.in, rows(hk, N, true));
  p.v = make_host(c.in, rows(hk, D, false));
  fill_random(p.q_rope, seed + 1, c.lo, c.hi);
  fill_random(p.k_rope, seed + 2, c.lo, c.hi);
  fill_random(p.q_nope, seed + 3, c.lo, c.hi);
  fill_random(p.k_nope, seed + 4, c.lo, c.hi);
  fill_random(p.v, seed + 5, c.lo, c.hi);
  p.cos_sin = make_host(DType::kFloat32, {c.cache_rows, R});
  for (int64_t r = 0; r < c.cache_rows; ++r)
    for (int64_t j = 0; j < R / 2; ++j) {
      const double a = static_cast<double>(r) * std::pow(1e4, -2.0 * static_cast<double>(j) / static_cast<double>(R));
      p.cos_sin.set(r * R + j, static_cast<float>(std::cos(a)));
      p.cos_sin.set(r * R + R / 2 + j, static_cast<float>(std::sin(a)));
    }
  p.q_rope_out = poisoned(c.out, {n, c.qo_heads, R});
  p.q_nope_out = poisoned(c.out, {n, c.qo_heads, N});
  if (c.mla) {
    p.cache0 = poisoned(c.out, {p.num_pages, c.page_size, N});
    p.cache1 = poisoned(c.out, {p.num_pages, c.page_size, R});
  } else {
    const std::vector<int64_t> shape = c.layout == KVLayout::kNHD ? std::vector<int64_t>{p.num_pages, c.page_size, hk, D}
                                                                 : std::vector<int64_t>{p.num_pages, hk, c.page_size, D};
    p.cache0 = poisoned(c.out, shape);
    p.cache1 = poisoned(c.out, shape);
  }
  return p;
}

// Reference math, kept apart so no FMA contraction can join the roundings.
inline float rq_mul(float a, float b) {
  volatile float r = a * b;
  return r;
}
inline float rq_rope(float x, float partner, float c, float s, bool first) {
  const float a = rq_mul(x, c), b = rq_mul(partner, s);
  volatile float r = first ? a - b : a + b;
  return r;
}

// Feature d of row values `x` (dim features), rotated when rope.
inline uint8_t rq_expect(const RQCase& c, const RQProblem& p, const std::vector<float>& x, int64_t d, bool rope,
                         int32_t pos, float scale) {
  float y = x[d];
  if (rope) {
    const int64_t R = c.rope_dim, half = R / 2;
    const bool first = c.interleave ? d % 2 == 0 : d < half;
    const int64_t j = c.interleave ? d / 2 : d % half;
    const int64_t partner = c.interleave ? (d ^ 1) : (first ? d + half : d - half);
    y = rq_rope(x[d], x[partner], p.cos_sin.get(pos * R + j), p.cos_sin.get(pos * R + half + j), first);
  }
  return float_to_fp8(rq_mul(y, scale), c.out);
}

// The row (token i, head h) of an input as floats (2-D inputs: one head).
inline std::vector<float> rq_row(const HostTensor& t, int64_t i, int64_t h) {
  const int64_t dim = t.view.size(-1);
  std::vector<float> x(dim);
  for (int64_t d = 0; d < dim; ++d)
    x[d] = t.view.dim() == 2 ? load(t.view, {i, d}) : load(t.view, {i, h, d});
  return x;
}

// The expected outputs and caches: `p` with every write applied.
inline RQProblem rq_expected(const RQCase& c, const RQProblem& p) {
  RQProblem e = p;
  const int64_t R = c.rope_dim, N = c.no_rope_dim, D = R + N, ps = c.page_size, hk = c.kv_heads;
  auto put = [](HostTensor& t, int64_t at, uint8_t b) { t.storage[static_cast<size_t>(at)] = b; };
  for (int64_t i = 0; i < p.nnz; ++i) {
    const int32_t b = p.batch_indices[i], pos = p.positions[i], rp = p.pos_ids[i];
    if (b < 0) continue;  // padding: nothing written
    for (int64_t h = 0; h < c.qo_heads; ++h) {
      const auto qr = rq_row(p.q_rope, i, h), qn = rq_row(p.q_nope, i, h);
      for (int64_t d = 0; d < R; ++d) put(e.q_rope_out, (i * c.qo_heads + h) * R + d, rq_expect(c, p, qr, d, true, rp, c.scale_q));
      for (int64_t d = 0; d < N; ++d) put(e.q_nope_out, (i * c.qo_heads + h) * N + d, rq_expect(c, p, qn, d, false, rp, c.scale_q));
    }
    const int64_t page = p.indices[p.indptr[b] + pos / ps], slot = pos % ps;
    for (int64_t h = 0; h < (c.mla ? 1 : hk); ++h) {
      const auto kr = rq_row(p.k_rope, i, h), kn = rq_row(p.k_nope, i, h);
      if (c.mla) {
        for (int64_t d = 0; d < N; ++d) put(e.cache0, (page * ps + slot) * N + d, rq_expect(c, p, kn, d, false, rp, c.scale_kv));
        for (int64_t d = 0; d < R; ++d) put(e.cache1, (page * ps + slot) * R + d, rq_expect(c, p, kr, d, true, rp, c.scale_kv));
        continue;
      }
      const auto vr = rq_row(p.v, i, h);
      const int64_t row = c.layout == KVLayout::kNHD ? ((page * ps + slot) * hk + h) * D : ((page * hk + h) * ps + slot) * D;
      for (int64_t d = 0; d < R; ++d) put(e.cache0, row + d, rq_expect(c, p, kr, d, true, rp, c.scale_kv));
      for (int64_t d = 0; d < N; ++d) put(e.cache0, row + R + d, rq_expect(c, p, kn, d, false, rp, c.scale_kv));
      for (int64_t d = 0; d < D; ++d) put(e.cache1, row + d, rq_expect(c, p, vr, d, false, rp, c.scale_kv));
    }
  }
  return e;
}

// Byte-for-byte comparison of the four outputs, reporting the first mismatch of each.
inline void expect_same_rq(const RQProblem& got, const RQProblem& want) {
  const std::pair<const char*, std::pair<const HostTensor*, const HostTensor*>> outs[] = {
      {"q_rope_out", {&got.q_rope_out, &want.q_rope_out}}, {"q_nope_out", {&got.q_nope_out, &want.q_nope_out}},
      {"cache0", {&got.cache0, &want.cache0}}, {"cache1", {&got.cache1, &want.cache1}}};
  for (const auto& [name, t] : outs) {
    const auto& a = t.first->storage;
    const auto& b = t.second->storage;
    ASSERT_EQ(a.size(), b.size()) << name;
    size_t bad = 0, first = a.size();
    for (size_t k = 0; k < a.size(); ++k)
      if (a[k] != b[k]) bad++, first = std::min(first, k);
    EXPECT_EQ(bad, 0u) << name << ": " << bad << " bytes differ, first at " << first << " (got 0x" << std::hex
                       << (first < a.size() ? int{a[first]} : 0) << ", want 0x" << (first < a.size() ? int{b[first]} : 0)
                       << std::dec << ")";
  }
}

}  // namespace tessera::test
