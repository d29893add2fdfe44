#include "tessera/reference/mla.hpp"

#include <cmath>
#include <limits>
#include <string>

#include "tessera/core/error.hpp"

namespace tessera::reference {

namespace {
std::string str(int64_t x) { return std::to_string(x); }
double read(const TensorView& t, int64_t off) { return load_as_float(t.data, t.dtype, static_cast<size_t>(off)); }
void host_3d(const char* name, const TensorView& t) {
  check_dtype_in(name, t, {DType::kFloat16, DType::kBFloat16, DType::kFloat32});
  check_dim(name, t, 3);
  check_last_dim_contiguous(name, t);
  if (t.device.is_cuda()) throw TypeMismatch(std::string(name) + ": expected a host tensor, got a CUDA one");
}
}  // namespace

Result mla_paged(const TensorView& q_nope, const TensorView& q_pe, const TensorView& ckv_cache,
                 const TensorView& kpe_cache, std::span<const int32_t> qo_indptr, std::span<const int32_t> kv_indptr,
                 std::span<const int32_t> kv_indices, std::span<const int32_t> kv_lens, bool causal,
                 double sm_scale) {
  host_3d("q_nope", q_nope);
  host_3d("q_pe", q_pe);
  host_3d("ckv_cache", ckv_cache);
  host_3d("kpe_cache", kpe_cache);
  const int64_t total_q = q_nope.size(0), H = q_nope.size(1), dc = q_nope.size(2), dr = q_pe.size(2);
  check_shape("q_pe", q_pe, {total_q, H, dr});
  const int64_t pages = ckv_cache.size(0), page_size = ckv_cache.size(1);
  check_shape("ckv_cache", ckv_cache, {pages, page_size, dc});
  check_shape("kpe_cache", kpe_cache, {pages, page_size, dr});
  if (page_size < 1) throw InvalidArgument("ckv_cache: expected page_size >= 1");
  validate_indptr("qo_indptr", qo_indptr);
  validate_indptr("kv_indptr", kv_indptr);
  const int64_t batch = static_cast<int64_t>(qo_indptr.size()) - 1;
  if (qo_indptr.empty() || qo_indptr.back() != total_q)
    throw InvalidArgument("qo_indptr: expected batch + 1 entries ending at q_nope's rows (" + str(total_q) + ")");
  if (static_cast<int64_t>(kv_indptr.size()) != batch + 1)
    throw InvalidArgument("kv_indptr: expected " + str(batch + 1) + " entries, got " + str(kv_indptr.size()));
  if (static_cast<int64_t>(kv_lens.size()) != batch)
    throw InvalidArgument("kv_lens: expected " + str(batch) + " entries, got " + str(kv_lens.size()));
  if (static_cast<int64_t>(kv_indices.size()) < kv_indptr.back())
    throw InvalidArgument("kv_indices: expected at least kv_indptr[batch] = " + str(kv_indptr.back()) + " entries");
  for (int64_t i = 0; i < batch; ++i) {
    const int64_t n = kv_indptr[i + 1] - kv_indptr[i];
    if (kv_lens[i] < 0 || kv_lens[i] > n * page_size)
      throw InvalidArgument("kv_lens: request " + str(i) + " has " + str(kv_lens[i]) + " tokens, its " + str(n) +
                            " pages hold at most " + str(n * page_size));
    for (int64_t k = kv_indptr[i]; k < kv_indptr[i + 1]; ++k)
      if (kv_indices[k] < 0 || kv_indices[k] >= pages)
        throw InvalidArgument("kv_indices: expected page ids in [0, " + str(pages) + "), got kv_indices[" + str(k) +
                              "]=" + str(kv_indices[k]));
  }
  const double scale = sm_scale < 0 ? 1.0 / std::sqrt(static_cast<double>(dc + dr)) : sm_scale;
  constexpr double kLog2e = 1.4426950408889634074;
  Result r;
  r.rows = total_q;
  r.heads = H;
  r.head_dim = dc;
  r.o.assign(total_q * H * dc, 0.0);
  r.lse.assign(total_q * H, -std::numeric_limits<double>::infinity());
  std::vector<double> logits, ckv, kpe, qn(dc), qp(dr);
  for (int64_t i = 0; i < batch; ++i) {
    const int64_t qo_len = qo_indptr[i + 1] - qo_indptr[i], kv_len = kv_lens[i];
    // The request's latent rows, once.
    ckv.assign(kv_len * dc, 0.0);
    kpe.assign(kv_len * dr, 0.0);
    for (int64_t t = 0; t < kv_len; ++t) {
      const int64_t page = kv_indices[kv_indptr[i] + t / page_size], slot = t % page_size;
      for (int64_t c = 0; c < dc; ++c)
        ckv[t * dc + c] = read(ckv_cache, page * ckv_cache.stride(0) + slot * ckv_cache.stride(1) + c);
      for (int64_t c = 0; c < dr; ++c)
        kpe[t * dr + c] = read(kpe_cache, page * kpe_cache.stride(0) + slot * kpe_cache.stride(1) + c);
    }
    for (int64_t j = 0; j < qo_len; ++j) {
      const int64_t row = qo_indptr[i] + j;
      const int64_t visible = causal ? std::min<int64_t>(kv_len, std::max<int64_t>(0, j + kv_len - qo_len + 1)) : kv_len;
      for (int64_t h = 0; h < H; ++h) {
        for (int64_t c = 0; c < dc; ++c) qn[c] = read(q_nope, row * q_nope.stride(0) + h * q_nope.stride(1) + c);
        for (int64_t c = 0; c < dr; ++c) qp[c] = read(q_pe, row * q_pe.stride(0) + h * q_pe.stride(1) + c);
        if (visible == 0) continue;
        logits.assign(visible, 0.0);
        double mx = -std::numeric_limits<double>::infinity();
        for (int64_t t = 0; t < visible; ++t) {
          double s = 0;
          for (int64_t c = 0; c < dc; ++c) s += qn[c] * ckv[t * dc + c];
          for (int64_t c = 0; c < dr; ++c) s += qp[c] * kpe[t * dr + c];
          logits[t] = s * scale * kLog2e;  // base 2
          mx = std::max(mx, logits[t]);
        }
        double sum = 0;
        for (int64_t t = 0; t < visible; ++t) sum += (logits[t] = std::exp2(logits[t] - mx));
        double* o = &r.o[(row * H + h) * dc];
        for (int64_t t = 0; t < visible; ++t)
          for (int64_t c = 0; c < dc; ++c) o[c] += logits[t] / sum * ckv[t * dc + c];
        r.lse[row * H + h] = mx + std::log2(sum);
      }
    }
  }
  return r;
}

}  // namespace tessera::reference
