#include "tessera/cpu/attention.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numbers>
#include <string>
#include <vector>

#include "tessera/cpu/rope.hpp"
#include "tessera/formats/ragged.hpp"

namespace tessera::cpu {

namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();
constexpr int kTile = 64;  // keys per online-softmax step

// Rows [first, first + n) of t [*, H, D] as float, [n][H][D].
std::vector<float> load_rows(const TensorView& t, int64_t first, int64_t n) {
  const int64_t H = t.size(1), D = t.size(2);
  std::vector<float> out(n * H * D);
  for (int64_t r = 0; r < n; ++r)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t d = 0; d < D; ++d)
        out[(r * H + h) * D + d] =
            load_as_float(t.data, t.dtype, static_cast<size_t>((first + r) * t.stride(0) + h * t.stride(1) + d * t.stride(2)));
  return out;
}

void check_inputs(const TensorView& q, std::span<const int32_t> qo, const TensorView& k, const TensorView& v,
                  std::span<const int32_t> kv, const AttentionOptions& opt, const TensorView& o, const TensorView& lse) {
  for (auto [name, t] : {std::pair{"q", &q}, {"k", &k}, {"v", &v}, {"o", &o}}) {
    check_device(name, *t, Device{});
    if (t == &k || t == &v)
      check_dtype_in(name, *t, {DType::kFloat16, DType::kBFloat16, DType::kFloat32, DType::kFloat8E4M3, DType::kFloat8E5M2});
    else
      check_dtype_in(name, *t, {DType::kFloat16, DType::kBFloat16, DType::kFloat32});
    check_dim(name, *t, 3);
  }
  if (v.dtype != k.dtype)
    throw TypeMismatch(std::string("v: expected the dtype of k (") + dtype_name(k.dtype) + "), got " + dtype_name(v.dtype));
  for (auto [name, x] : {std::pair{"k_scale", opt.k_scale}, {"v_scale", opt.v_scale}})
    if (!std::isfinite(x) || (name[0] == 'k' && !(x > 0)))
      throw InvalidArgument(std::string(name) + ": expected a " + (name[0] == 'k' ? "positive " : "") +
                            "finite value, got " + std::to_string(x));
  validate_indptr("qo_indptr", qo);
  validate_indptr("kv_indptr", kv);
  if (qo.size() != kv.size())
    throw InvalidArgument("kv_indptr: expected " + std::to_string(qo.size()) + " entries like qo_indptr, got " +
                          std::to_string(kv.size()));
  const int64_t rows = qo.empty() ? 0 : qo.back(), keys = kv.empty() ? 0 : kv.back();
  if (q.size(0) != rows) throw InvalidArgument("q: expected " + std::to_string(rows) + " rows, got " + q.shape_str());
  // v may have a head dim of its own (head_dim_vo); o has v's.
  if (v.size(0) != k.size(0) || v.size(1) != k.size(1))
    throw InvalidArgument("v: expected the rows and heads of k " + k.shape_str() + " (any head_dim_vo), got " +
                          v.shape_str());
  if (k.size(0) != keys) throw InvalidArgument("k: expected " + std::to_string(keys) + " rows, got " + k.shape_str());
  if (k.size(2) != q.size(2) || k.size(1) < 1 || q.size(1) % k.size(1) != 0)
    throw InvalidArgument("k: expected head_dim " + std::to_string(q.size(2)) + " and a head count dividing q's " +
                          std::to_string(q.size(1)) + ", got " + k.shape_str());
  if (o.size(0) != q.size(0) || o.size(1) != q.size(1) || o.size(2) != v.size(2))
    throw InvalidArgument("o: expected [" + std::to_string(q.size(0)) + ", " + std::to_string(q.size(1)) + ", " +
                          std::to_string(v.size(2)) + "] (q's rows and heads, v's head dim), got " + o.shape_str());
  if (lse.data) {
    check_shape("lse", lse, {q.size(0), q.size(1)});
    check_dtype("lse", lse, DType::kFloat32);
  }
  if (!opt.alibi_slopes.empty() && static_cast<int64_t>(opt.alibi_slopes.size()) != q.size(1))
    throw InvalidArgument("alibi_slopes: expected one slope per query head (" + std::to_string(q.size(1)) + "), got " +
                          std::to_string(opt.alibi_slopes.size()));
  if (opt.window_left < -1) throw InvalidArgument("window_left: expected -1 (off) or >= 0, got " + std::to_string(opt.window_left));
  int64_t mask_bytes = 0;
  for (size_t i = 0; i + 1 < qo.size(); ++i) mask_bytes += int64_t(qo[i + 1] - qo[i]) * (kv[i + 1] - kv[i]);
  if (!opt.custom_mask.empty() && static_cast<int64_t>(opt.custom_mask.size()) != mask_bytes)
    throw InvalidArgument("custom_mask: expected " + std::to_string(mask_bytes) + " bytes (sum of q_len x kv_len), got " +
                          std::to_string(opt.custom_mask.size()));
}

}  // namespace

void attention_ragged(const TensorView& q, std::span<const int32_t> qo, const TensorView& k, const TensorView& v,
                      std::span<const int32_t> kv, const AttentionOptions& opt, const TensorView& o,
                      const TensorView& lse) {
  check_inputs(q, qo, k, v, kv, opt, o, lse);
  const int64_t Hq = q.size(1), Hkv = k.size(1), D = q.size(2), DV = v.size(2), group = Hq / Hkv;
  const double scale = (opt.sm_scale < 0 ? 1.0 / std::sqrt(static_cast<double>(D)) : opt.sm_scale) * opt.k_scale;
  const std::vector<double> rates = opt.rope ? rope_rates(opt.rope_scale, opt.rope_theta, static_cast<int>(D))
                                             : std::vector<double>{};
  const uint8_t* mask = opt.custom_mask.empty() ? nullptr : opt.custom_mask.data();
  std::vector<float> acc(DV), s(kTile);
  for (size_t req = 0; req + 1 < qo.size(); ++req) {
    const int64_t q0 = qo[req], q_len = qo[req + 1] - q0, kv_len = kv[req + 1] - kv[req];
    std::vector<float> qs = load_rows(q, q0, q_len), ks = load_rows(k, kv[req], kv_len), vs = load_rows(v, kv[req], kv_len);
    for (int64_t i = 0; opt.rope && i < q_len; ++i)
      for (int64_t h = 0; h < Hq; ++h) rotate_row(&qs[(i * Hq + h) * D], rates, double(i + kv_len - q_len), false);
    for (int64_t j = 0; opt.rope && j < kv_len; ++j)
      for (int64_t h = 0; h < Hkv; ++h) rotate_row(&ks[(j * Hkv + h) * D], rates, double(j), false);
    for (int64_t i = 0; i < q_len; ++i) {
      const int64_t pos = i + kv_len - q_len;  // the query's position among the keys
      const int64_t lo = opt.window_left >= 0 ? std::max<int64_t>(0, pos - opt.window_left) : 0;
      const int64_t hi = opt.causal ? std::min(kv_len, pos + 1) : kv_len;
      const uint8_t* row_mask = mask ? mask + i * kv_len : nullptr;
      for (int64_t h = 0; h < Hq; ++h) {
        const float* qr = &qs[(i * Hq + h) * D];
        float m = kNegInf, l = 0.f;
        std::fill(acc.begin(), acc.end(), 0.f);
        for (int64_t t0 = lo; t0 < hi; t0 += kTile) {  // online softmax, base 2
          const int64_t n = std::min<int64_t>(kTile, hi - t0);
          float tile_max = kNegInf;
          for (int64_t j = 0; j < n; ++j) {
            s[j] = kNegInf;
            if (row_mask && !row_mask[t0 + j]) continue;
            const float* kr = &ks[((t0 + j) * Hkv + h / group) * D];
            float dot = 0.f;
            for (int64_t d = 0; d < D; ++d) dot += qr[d] * kr[d];
            double logit = dot * scale;
            if (!opt.alibi_slopes.empty()) logit += opt.alibi_slopes[h] * static_cast<double>(t0 + j - i);
            if (opt.logits_soft_cap > 0) logit = opt.logits_soft_cap * std::tanh(logit / opt.logits_soft_cap);
            s[j] = static_cast<float>(logit * std::numbers::log2e);
            tile_max = std::max(tile_max, s[j]);
          }
          if (tile_max == kNegInf) continue;
          const float m_new = std::max(m, tile_max), rescale = std::exp2(m - m_new);
          l *= rescale;
          for (float& a : acc) a *= rescale;
          for (int64_t j = 0; j < n; ++j) {
            if (s[j] == kNegInf) continue;
            const float p = std::exp2(s[j] - m_new);
            const float* vr = &vs[((t0 + j) * Hkv + h / group) * DV];
            l += p;
            for (int64_t d = 0; d < DV; ++d) acc[d] += p * vr[d];
          }
          m = m_new;
        }
        const int64_t row = q0 + i;
        for (int64_t d = 0; d < DV; ++d)
          store_from_float(o.data, o.dtype, static_cast<size_t>(row * o.stride(0) + h * o.stride(1) + d * o.stride(2)),
                           l > 0 ? static_cast<float>(acc[d] / l * opt.v_scale) : 0.f);
        if (lse.data)
          static_cast<float*>(lse.data)[row * lse.stride(0) + h * lse.stride(1)] = l > 0 ? m + std::log2(l) : kNegInf;
      }
    }
    if (mask) mask += q_len * kv_len;
  }
}

}  // namespace tessera::cpu
