// CPU reference attention. The three public entry points (ragged, paged, BSR)
// only differ in how they find the keys a query row may see, so each one
// reduces its format to "groups": a set of query rows sharing one list of KV
// tokens (as element offsets), plus an optional per-row visibility mask.
// One core then does the math in double. Softmax is evaluated directly in
// base 2 here, while dense_attention uses natural exp/log; the two agreeing
// is part of what the tests check.
#include "tessera/reference/attention.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numbers>
#include <string>

namespace tessera::reference {

namespace {

constexpr double kLog2e = 1.4426950408889634074;
constexpr double kNegInf = -std::numeric_limits<double>::infinity();

std::string str(int64_t x) { return std::to_string(x); }

void check_rope(const RopeOptions& r, int64_t head_dim) {
  const int64_t dim = r.rotary_dim < 0 ? head_dim : r.rotary_dim;
  if (dim < 2 || dim > head_dim || dim % 2 != 0)
    throw InvalidArgument("rotary_dim: expected an even number in [2, head_dim=" + str(head_dim) + "] (or < 0 for all), got " +
                          str(r.rotary_dim));
  if (!(r.rope_scale > 0.0) || !std::isfinite(r.rope_scale))
    throw InvalidArgument("rope_scale: expected a finite value > 0, got " + std::to_string(r.rope_scale));
  if (!(r.rope_theta > 0.0) || !std::isfinite(r.rope_theta))
    throw InvalidArgument("rope_theta: expected a finite value > 0, got " + std::to_string(r.rope_theta));
  if (r.llama31 && !(r.low_freq_factor > 0.0 && r.high_freq_factor > r.low_freq_factor && r.old_context_len > 0.0))
    throw InvalidArgument("low_freq_factor: expected 0 < low_freq_factor < high_freq_factor and old_context_len > 0");
}

// Where the tokens of one group live: token j's head h vector starts at
// k_base + k_off[j] + h * k_head_stride (elements), likewise for V.
struct KVSource {
  const void* k = nullptr;
  const void* v = nullptr;
  DType k_dtype = DType::kFloat32, v_dtype = DType::kFloat32;
  int64_t k_head_stride = 0, v_head_stride = 0;
  int64_t k_dim_stride = 1, v_dim_stride = 1;
};

struct Token {
  int64_t k_off, v_off;
};

// Everything about q the core needs, validated once.
struct QueryInfo {
  const TensorView* q;
  int64_t heads, head_dim, kv_heads;
  double sm_scale;
  int64_t v_head_dim = 0;  // V's and the output's (head_dim_vo)
};

double read(const void* base, DType t, int64_t off) { return load_as_float(base, t, static_cast<size_t>(off)); }

double sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }

// Computes rows [row_begin, row_begin + n_rows) of the result from `tokens`:
// the queries and keys of request `request` (its positions: query r at
// r + n_kv - n_rows, token j at j). visible (if non-null) is row-major
// [n_rows, tokens.size()].
void attend_group(const QueryInfo& qi, const KVSource& src, const std::vector<Token>& tokens, int64_t request,
                  int64_t row_begin, int64_t n_rows, const uint8_t* visible, const Options& opt, Result& out) {
  const int64_t n_kv = static_cast<int64_t>(tokens.size());
  const int64_t D = qi.head_dim, DV = qi.v_head_dim, Hkv = qi.kv_heads, group = qi.heads / qi.kv_heads;
  if (n_rows == 0) return;
  // Convert this group's K and V once: [n_kv, Hkv, D] and [n_kv, Hkv, DV] in double.
  std::vector<double> kd(n_kv * Hkv * D), vd(n_kv * Hkv * DV);
  for (int64_t j = 0; j < n_kv; ++j)
    for (int64_t h = 0; h < Hkv; ++h) {
      // Dequantized: the stored value times its tensor's scale (exact in double).
      for (int64_t d = 0; d < D; ++d)
        kd[(j * Hkv + h) * D + d] =
            read(src.k, src.k_dtype, tokens[j].k_off + h * src.k_head_stride + d * src.k_dim_stride) * opt.k_scale;
      for (int64_t d = 0; d < DV; ++d)
        vd[(j * Hkv + h) * DV + d] =
            read(src.v, src.v_dtype, tokens[j].v_off + h * src.v_head_stride + d * src.v_dim_stride) * opt.v_scale;
    }
  if (opt.rope)
    for (int64_t j = 0; j < n_kv; ++j)
      for (int64_t h = 0; h < Hkv; ++h) rope_rotate(&kd[(j * Hkv + h) * D], D, static_cast<double>(j), *opt.rope);

  const TensorView& q = *qi.q;
  std::vector<double> qrow(D), score(n_kv);
  for (int64_t r = 0; r < n_rows; ++r) {
    const int64_t row = row_begin + r;
    const uint8_t* vis = visible ? visible + r * n_kv : nullptr;
    for (int64_t h = 0; h < qi.heads; ++h) {
      const int64_t hk = h / group;
      for (int64_t d = 0; d < D; ++d)
        qrow[d] = read(q.data, q.dtype, row * q.stride(0) + h * q.stride(1) + d * q.stride(2));
      const int64_t q_pos = r + n_kv - n_rows;
      if (opt.rope) rope_rotate(qrow.data(), D, static_cast<double>(q_pos), *opt.rope);
      // Scores in base 2: s = logit * log2(e), so softmax weights are 2^(s - max).
      double max_s = kNegInf;
      for (int64_t j = 0; j < n_kv; ++j) {
        if (vis && !vis[j]) continue;
        const double* kj = &kd[(j * Hkv + hk) * D];
        double dot = 0.0;
        for (int64_t d = 0; d < D; ++d) dot += qrow[d] * kj[d];
        double logit = dot * qi.sm_scale;
        if (opt.logits_soft_cap > 0.0) logit = opt.logits_soft_cap * std::tanh(logit / opt.logits_soft_cap);
        if (!opt.alibi_slopes.empty()) logit += opt.alibi_slopes[h] * static_cast<double>(j - q_pos);
        if (opt.logits_fn) logit = opt.logits_fn(logit, LogitContext{request, r, j, h, hk, n_rows, n_kv});
        score[j] = opt.flash_sigmoid ? sigmoid(logit * opt.sigmoid_scale + opt.sigmoid_bias) : logit * kLog2e;
        max_s = std::max(max_s, score[j]);
      }
      double* o = &out.o[(row * qi.heads + h) * DV];
      if (opt.flash_sigmoid) {  // weights are the sigmoids themselves; no normalization, lse = 0
        for (int64_t j = 0; j < n_kv; ++j) {
          if (vis && !vis[j]) continue;
          const double* vj = &vd[(j * Hkv + hk) * DV];
          for (int64_t d = 0; d < DV; ++d) o[d] += score[j] * vj[d];
        }
        continue;
      }
      if (max_s == kNegInf) continue;  // nothing visible: O stays 0, LSE -inf
      double denom = 0.0;
      for (int64_t j = 0; j < n_kv; ++j) {
        if (vis && !vis[j]) continue;
        const double p = std::exp2(score[j] - max_s);
        denom += p;
        const double* vj = &vd[(j * Hkv + hk) * DV];
        for (int64_t d = 0; d < DV; ++d) o[d] += p * vj[d];
      }
      for (int64_t d = 0; d < DV; ++d) o[d] /= denom;
      out.lse[row * qi.heads + h] = max_s + std::log2(denom);
    }
  }
}

void check_host_float(const char* name, const TensorView& t) {
  check_device(name, t, Device{});
  check_dtype_in(name, t, {DType::kFloat16, DType::kBFloat16, DType::kFloat32});
}

// K / V: also fp8 (read exactly, then times Options::k_scale / v_scale).
void check_host_kv(const char* name, const TensorView& t) {
  check_device(name, t, Device{});
  check_dtype_in(name, t, {DType::kFloat16, DType::kBFloat16, DType::kFloat32, DType::kFloat8E4M3, DType::kFloat8E5M2});
}

// Validates q [total, Hq, D] against the KV head count / dim; fills QueryInfo.
QueryInfo check_query(const TensorView& q, int64_t total_rows, const char* rows_what, int64_t kv_heads,
                      int64_t kv_head_dim, const char* kv_name, const Options& opt) {
  check_host_float("q", q);
  check_dim("q", q, 3);
  if (q.size(0) != total_rows)
    throw InvalidArgument("q: expected " + str(total_rows) + " rows (" + rows_what + "), got shape " + q.shape_str());
  if (q.size(2) < 1) throw InvalidArgument("q: expected head_dim >= 1, got shape " + q.shape_str());
  if (q.size(2) != kv_head_dim)
    throw InvalidArgument("q: expected head_dim " + str(kv_head_dim) + " (that of " + kv_name + "), got shape " +
                          q.shape_str());
  if (kv_heads < 1) throw InvalidArgument(std::string(kv_name) + ": expected num_kv_heads >= 1, got 0");
  if (q.size(1) % kv_heads != 0 || q.size(1) == 0)
    throw InvalidArgument("q: expected num_qo_heads to be a positive multiple of num_kv_heads=" + str(kv_heads) +
                          ", got " + str(q.size(1)));
  if (!(opt.logits_soft_cap >= 0.0))
    throw InvalidArgument("logits_soft_cap: expected >= 0, got " + std::to_string(opt.logits_soft_cap));
  if (!std::isfinite(opt.logits_soft_cap))
    throw InvalidArgument("logits_soft_cap: expected a finite value, got " + std::to_string(opt.logits_soft_cap));
  if (opt.window_left < -1)
    throw InvalidArgument("window_left: expected -1 (off) or >= 0, got " + std::to_string(opt.window_left));
  if (opt.sink_size < 0) throw InvalidArgument("sink_size: expected >= 0, got " + std::to_string(opt.sink_size));
  if (!opt.alibi_slopes.empty() && static_cast<int64_t>(opt.alibi_slopes.size()) != q.size(1))
    throw InvalidArgument("alibi_slopes: expected one slope per query head (" + str(q.size(1)) + "), got " +
                          str(static_cast<int64_t>(opt.alibi_slopes.size())));
  if (opt.rope) check_rope(*opt.rope, q.size(2));
  for (auto [name, x] : {std::pair{"k_scale", opt.k_scale}, {"v_scale", opt.v_scale}})
    if (!std::isfinite(x)) throw InvalidArgument(std::string(name) + ": expected a finite value, got " + std::to_string(x));
  QueryInfo qi{&q, q.size(1), q.size(2), kv_heads, opt.sm_scale, q.size(2)};
  if (qi.sm_scale < 0.0) qi.sm_scale = 1.0 / std::sqrt(static_cast<double>(qi.head_dim));  // head_dim_qk's
  return qi;
}

// v [N, Hkv, DV]: k's rows and heads, any head dim of its own (head_dim_vo).
void check_v_shape(const TensorView& k, const TensorView& v) {
  if (v.size(0) != k.size(0) || v.size(1) != k.size(1) || v.size(2) < 1)
    throw InvalidArgument("v: expected the rows and heads of k " + k.shape_str() + " (any head_dim_vo), got " +
                          v.shape_str());
}

Result make_result(const QueryInfo& qi, const Options& opt) {
  Result r;
  r.rows = qi.q->size(0);
  r.heads = qi.heads;
  r.head_dim = qi.v_head_dim;  // the output's
  r.o.assign(r.rows * r.heads * r.head_dim, 0.0);
  r.lse.assign(r.rows * r.heads, opt.flash_sigmoid ? 0.0 : kNegInf);  // no softmax: no LSE, reported as 0
  return r;
}

// Shared by ragged and paged: both are "request i: q_len queries over kv_len
// keys", with causal / custom masks defined per request.
class RequestMasks {
 public:
  RequestMasks(const RaggedIndex& qo, const std::vector<int64_t>& kv_lens, const Options& opt) : opt_(opt) {
    if (opt.custom_mask.empty()) return;
    int64_t need = 0;
    for (int64_t i = 0; i < qo.num_sequences(); ++i) need += int64_t{qo.length(i)} * kv_lens[i];
    if (static_cast<int64_t>(opt.custom_mask.size()) != need)
      throw InvalidArgument("custom_mask: expected " + str(need) + " entries (sum of q_len * kv_len), got " +
                            str(static_cast<int64_t>(opt.custom_mask.size())));
  }
  bool any() const { return opt_.causal || !opt_.custom_mask.empty() || opt_.window_left >= 0; }
  // Fills the [q_len, kv_len] visibility block of the next request (in order).
  void next(int64_t q_len, int64_t kv_len, std::vector<uint8_t>& vis) {
    vis.assign(q_len * kv_len, 1);
    if (!opt_.custom_mask.empty()) {
      for (int64_t i = 0; i < q_len * kv_len; ++i) vis[i] = opt_.custom_mask[mask_pos_ + i] != 0;
      mask_pos_ += q_len * kv_len;
    }
    if (opt_.causal) {
      for (int64_t i = 0; i < q_len; ++i)
        for (int64_t j = i + kv_len - q_len + 1; j < kv_len; ++j)
          if (j >= 0) vis[i * kv_len + j] = 0;
    }
    if (opt_.window_left >= 0) {
      for (int64_t i = 0; i < q_len; ++i)
        for (int64_t j = opt_.sink_size; j < std::min(kv_len, i + kv_len - q_len - opt_.window_left); ++j)
          vis[i * kv_len + j] = 0;
    }
  }

 private:
  const Options& opt_;
  int64_t mask_pos_ = 0;
};

}  // namespace

namespace {

// Turns pair j of x by cos[j], sin[j], j < half.
void turn_pairs(double* x, int64_t half, bool interleave, const double* cos, const double* sin) {
  for (int64_t j = 0; j < half; ++j) {
    double& a = interleave ? x[2 * j] : x[j];
    double& b = interleave ? x[2 * j + 1] : x[j + half];
    const double a0 = a, b0 = b;
    a = a0 * cos[j] - b0 * sin[j];
    b = b0 * cos[j] + a0 * sin[j];
  }
}

}  // namespace

void rope_rotate(double* x, int64_t head_dim, double pos, const RopeOptions& opt) {
  const int64_t dim = opt.rotary_dim < 0 ? head_dim : opt.rotary_dim, half = dim / 2;
  std::vector<double> c(half), s(half);
  for (int64_t j = 0; j < half; ++j) {
    double freq = std::pow(opt.rope_theta, -2.0 * static_cast<double>(j) / dim);
    if (!opt.llama31) {
      freq /= opt.rope_scale;
    } else {
      const double wavelen = 2 * std::numbers::pi / freq;
      if (wavelen > opt.old_context_len / opt.low_freq_factor) {
        freq /= opt.rope_scale;
      } else if (wavelen >= opt.old_context_len / opt.high_freq_factor) {
        const double t = (opt.old_context_len / wavelen - opt.low_freq_factor) /
                         (opt.high_freq_factor - opt.low_freq_factor);
        freq = (1 - t) * freq / opt.rope_scale + t * freq;
      }
    }
    c[j] = std::cos(pos * freq), s[j] = std::sin(pos * freq);
  }
  turn_pairs(x, half, opt.interleave, c.data(), s.data());
}

std::vector<double> apply_rope_cos_sin(const TensorView& x, const std::vector<int64_t>& pos,
                                       const std::vector<double>& cache, int64_t rotary_dim, bool interleave) {
  check_host_float("x", x);
  check_dim("x", x, 3);
  const int64_t H = x.size(1), D = x.size(2);
  if (rotary_dim < 2 || rotary_dim > D || rotary_dim % 2 != 0)
    throw InvalidArgument("rotary_dim: expected an even number in [2, head_dim=" + str(D) + "], got " + str(rotary_dim));
  if (static_cast<int64_t>(pos.size()) != x.size(0))
    throw InvalidArgument("pos: expected one position per row (" + str(x.size(0)) + ")");
  const int64_t rows = static_cast<int64_t>(cache.size()) / rotary_dim;
  std::vector<double> out(x.size(0) * H * D);
  for (int64_t n = 0; n < x.size(0); ++n) {
    if (pos[n] < 0 || pos[n] >= rows)
      throw InvalidArgument("pos: expected positions in [0, " + str(rows) + "), got " + str(pos[n]));
    const double* row = &cache[pos[n] * rotary_dim];
    for (int64_t h = 0; h < H; ++h) {
      double* o = &out[(n * H + h) * D];
      for (int64_t d = 0; d < D; ++d) o[d] = read(x.data, x.dtype, n * x.stride(0) + h * x.stride(1) + d * x.stride(2));
      turn_pairs(o, rotary_dim / 2, interleave, row, row + rotary_dim / 2);
    }
  }
  return out;
}

std::vector<double> apply_rope(const TensorView& x, const std::vector<int64_t>& pos, const RopeOptions& opt) {
  check_host_float("x", x);
  check_dim("x", x, 3);
  check_rope(opt, x.size(2));
  if (static_cast<int64_t>(pos.size()) != x.size(0))
    throw InvalidArgument("pos: expected one position per row (" + str(x.size(0)) + "), got " +
                          str(static_cast<int64_t>(pos.size())));
  const int64_t H = x.size(1), D = x.size(2);
  std::vector<double> out(x.size(0) * H * D);
  for (int64_t n = 0; n < x.size(0); ++n)
    for (int64_t h = 0; h < H; ++h) {
      double* row = &out[(n * H + h) * D];
      for (int64_t d = 0; d < D; ++d) row[d] = read(x.data, x.dtype, n * x.stride(0) + h * x.stride(1) + d * x.stride(2));
      rope_rotate(row, D, static_cast<double>(pos[n]), opt);
    }
  return out;
}

Result attention_ragged(const TensorView& q, const RaggedIndex& qo, const TensorView& k, const TensorView& v,
                        const RaggedIndex& kv, const Options& opt) {
  check_host_kv("k", k);
  check_host_kv("v", v);
  check_dim("k", k, 3);
  check_dim("v", v, 3);
  check_v_shape(k, v);
  if (k.size(0) != kv.total())
    throw InvalidArgument("k: expected " + str(kv.total()) + " rows (kv indptr total), got shape " + k.shape_str());
  if (kv.num_sequences() != qo.num_sequences())
    throw InvalidArgument("kv: expected " + str(qo.num_sequences()) + " sequences (as many as qo), got " +
                          str(kv.num_sequences()));
  QueryInfo qi = check_query(q, qo.total(), "qo indptr total", k.size(1), k.size(2), "k", opt);
  qi.v_head_dim = v.size(2);

  std::vector<int64_t> kv_lens(kv.num_sequences());
  for (int64_t i = 0; i < kv.num_sequences(); ++i) kv_lens[i] = kv.length(i);
  RequestMasks masks(qo, kv_lens, opt);

  Result out = make_result(qi, opt);
  KVSource src{k.data, v.data, k.dtype, v.dtype, k.stride(1), v.stride(1), k.stride(2), v.stride(2)};
  std::vector<Token> tokens;
  std::vector<uint8_t> vis;
  for (int64_t i = 0; i < qo.num_sequences(); ++i) {
    tokens.clear();
    for (int64_t j = kv.begin(i); j < kv.begin(i) + kv.length(i); ++j) tokens.push_back({j * k.stride(0), j * v.stride(0)});
    if (masks.any()) masks.next(qo.length(i), kv.length(i), vis);
    attend_group(qi, src, tokens, i, qo.begin(i), qo.length(i), masks.any() ? vis.data() : nullptr, opt, out);
  }
  return out;
}

Result attention_paged(const TensorView& q, const RaggedIndex& qo, const PagedKVCache& cache, const Options& opt) {
  const PagedKVStorage& st = cache.storage;
  const PageTable& table = cache.table;
  check_device("cache", st.k(), Device{});
  if (table.num_requests() != qo.num_sequences())
    throw InvalidArgument("cache: expected " + str(qo.num_sequences()) + " requests (as many as qo), got " +
                          str(table.num_requests()));
  QueryInfo qi = check_query(q, qo.total(), "qo indptr total", st.num_kv_heads(), st.head_dim(), "cache", opt);
  qi.v_head_dim = st.v_head_dim();

  std::vector<int64_t> kv_lens(table.num_requests());
  for (int64_t i = 0; i < table.num_requests(); ++i) kv_lens[i] = table.kv_len(i);
  RequestMasks masks(qo, kv_lens, opt);

  Result out = make_result(qi, opt);
  // K at the storage's strides, V at its own (K's but for a V of another head_dim).
  KVSource src{st.k().data, st.v().data, st.dtype(), st.dtype(), st.head_stride(), st.v_head_stride(), 1, 1};
  std::vector<Token> tokens;
  std::vector<uint8_t> vis;
  for (int64_t i = 0; i < qo.num_sequences(); ++i) {
    tokens.clear();
    for (int64_t pos = 0; pos < kv_lens[i]; ++pos) {
      const int32_t page = table.page_of(i, pos), slot = table.slot_of(pos);
      tokens.push_back({st.offset(page, 0, slot), st.v_offset(page, 0, slot)});
    }
    if (masks.any()) masks.next(qo.length(i), kv_lens[i], vis);
    attend_group(qi, src, tokens, i, qo.begin(i), qo.length(i), masks.any() ? vis.data() : nullptr, opt, out);
  }
  return out;
}

Result attention_bsr(const TensorView& q, const BSRMatrix& bsr, const TensorView& k, const TensorView& v,
                     const Options& opt) {
  if (opt.causal)
    throw InvalidArgument("opt.causal: expected false for BSR attention (the BSR matrix is the mask), got true");
  if (!opt.custom_mask.empty())
    throw InvalidArgument("opt.custom_mask: expected empty for BSR attention (the BSR matrix is the mask), got " +
                          str(static_cast<int64_t>(opt.custom_mask.size())) + " entries");
  if (opt.window_left != -1)
    throw InvalidArgument("opt.window_left: expected -1 for BSR attention (the BSR matrix is the mask), got " +
                          std::to_string(opt.window_left));
  check_host_kv("k", k);
  check_host_kv("v", v);
  check_dim("k", k, 3);
  check_dim("v", v, 3);
  check_v_shape(k, v);
  if (k.size(0) != bsr.cols())
    throw InvalidArgument("k: expected " + str(bsr.cols()) + " rows (BSR columns N), got shape " + k.shape_str());
  QueryInfo qi = check_query(q, bsr.rows(), "BSR rows M", k.size(1), k.size(2), "k", opt);
  qi.v_head_dim = v.size(2);

  Result out = make_result(qi, opt);
  KVSource src{k.data, v.data, k.dtype, v.dtype, k.stride(1), v.stride(1), k.stride(2), v.stride(2)};
  const int64_t Bc = bsr.block_cols();
  std::vector<Token> tokens;
  for (int64_t r = 0; r < bsr.num_block_rows(); ++r) {
    tokens.clear();
    const int64_t kv_len = bsr.row_kv_len(r);
    for (int32_t b = bsr.indptr()[r]; b < bsr.indptr()[r + 1]; ++b)
      for (int64_t c = 0; c < Bc && static_cast<int64_t>(tokens.size()) < kv_len; ++c) {
        const int64_t col = int64_t{bsr.indices()[b]} * Bc + c;
        tokens.push_back({col * k.stride(0), col * v.stride(0)});
      }
    attend_group(qi, src, tokens, r, r * bsr.block_rows(), bsr.block_rows(), nullptr, opt, out);
  }
  return out;
}

void dense_attention(const std::vector<double>& q, const std::vector<double>& k, const std::vector<double>& v,
                     int64_t n_q, int64_t n_kv, int64_t d, double sm_scale, const std::vector<uint8_t>& mask,
                     std::vector<double>& o, std::vector<double>& lse) {
  if (n_q < 0 || n_kv < 0 || d < 1)
    throw InvalidArgument("n_q, n_kv, d: expected n_q >= 0, n_kv >= 0, d >= 1, got " + str(n_q) + ", " + str(n_kv) +
                          ", " + str(d));
  auto check_size = [](const char* name, size_t got, int64_t want) {
    if (static_cast<int64_t>(got) != want)
      throw InvalidArgument(std::string(name) + ": expected " + str(want) + " entries, got " +
                            str(static_cast<int64_t>(got)));
  };
  check_size("q", q.size(), n_q * d);
  check_size("k", k.size(), n_kv * d);
  check_size("v", v.size(), n_kv * d);
  if (!mask.empty()) check_size("mask", mask.size(), n_q * n_kv);
  if (sm_scale < 0.0) sm_scale = 1.0 / std::sqrt(static_cast<double>(d));

  o.assign(n_q * d, 0.0);
  lse.assign(n_q, kNegInf);
  std::vector<double> logits(n_kv);
  for (int64_t i = 0; i < n_q; ++i) {
    auto visible = [&](int64_t j) { return mask.empty() || mask[i * n_kv + j] != 0; };
    double m = kNegInf;
    for (int64_t j = 0; j < n_kv; ++j) {
      double dot = 0.0;
      for (int64_t c = 0; c < d; ++c) dot += q[i * d + c] * k[j * d + c];
      logits[j] = dot * sm_scale;
      if (visible(j)) m = std::max(m, logits[j]);
    }
    if (m == kNegInf) continue;
    // softmax(x)_j = e^(x_j - m) / sum e^(x - m); natural lse = m + ln(sum).
    double sum = 0.0;
    for (int64_t j = 0; j < n_kv; ++j)
      if (visible(j)) sum += std::exp(logits[j] - m);
    for (int64_t j = 0; j < n_kv; ++j) {
      if (!visible(j)) continue;
      const double p = std::exp(logits[j] - m) / sum;
      for (int64_t c = 0; c < d; ++c) o[i * d + c] += p * v[j * d + c];
    }
    lse[i] = (m + std::log(sum)) / std::log(2.0);
  }
}

}  // namespace tessera::reference
