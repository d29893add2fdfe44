// rope_quantize_fp8 and its paged-append forms: shared validation, then
// plain loops on the CPU (host tensors, every index checked first) or one JIT
// kernel launch (device/kernels/page/rope_quantize.cuh) for CUDA tensors.
#include "tessera/api/rope_quantize.hpp"

#include <cmath>
#include <limits>
#include <vector>

#include "checks.hpp"
#include "tessera/abi/rope_quantize_params.cuh"
#include "tessera/formats/ragged.hpp"
#include "tessera/runtime/jit.hpp"
#include "tessera/runtime/kernel_catalog.hpp"

namespace tessera {

using detail::str;

namespace {

constexpr int kThreads = 256;  // must match kRopeQuantizeThreads (device/kernels/page/rope_quantize.cuh)

// Rows of one input or output: [nnz, heads, dim], or [nnz, dim] (one head).
struct Rows {
  TensorView t;
  int64_t heads = 0, dim = 0, stride_n = 0, stride_h = 0;
  bool present() const { return dim > 0; }
};

// t undefined: an absent part (dim 0). heads / dim < 0: any.
Rows rows_of(const char* name, const TensorView& t, bool allow_2d, int64_t nnz, int64_t heads, int64_t dim,
             const Device& dev) {
  Rows r;
  if (!t.defined()) {
    if (dim > 0) throw InvalidArgument(std::string(name) + ": expected a tensor of " + str(dim) + " features, got none");
    return r;
  }
  if (!(t.dim() == 3 || (allow_2d && t.dim() == 2)))
    throw InvalidArgument(std::string(name) + ": expected " + (allow_2d ? "2 or 3" : "3") + " dimensions, got shape " +
                          t.shape_str());
  r.t = t;
  const bool three = t.dim() == 3;
  r.heads = three ? t.size(1) : 1;
  r.dim = t.size(-1);
  if (t.size(0) != nnz || (heads >= 0 && r.heads != heads) || (dim >= 0 && r.dim != dim))
    throw InvalidArgument(std::string(name) + ": expected [nnz=" + str(nnz) + ", " +
                          (heads >= 0 ? "heads=" + str(heads) : std::string("heads")) + ", " +
                          (dim >= 0 ? "dim=" + str(dim) : std::string("dim")) + "], got " + t.shape_str());
  check_device(name, t, dev);
  if (t.numel() > 0) {
    if (dev.is_cuda()) detail::check_cuda_vectors(name, t);
    else check_last_dim_contiguous(name, t);
  }
  r.stride_n = t.stride(0);
  r.stride_h = three ? t.stride(1) : 0;
  return r;
}

void check_in_dtype(const char* name, const Rows& r, DType want) {
  if (r.t.defined() && r.t.dtype != want)
    throw TypeMismatch(std::string(name) + ": expected the dtype of q_rope (" + dtype_name(want) + "), got " +
                       dtype_name(r.t.dtype));
}

// The checked inputs and q / k outputs of every form.
struct Problem {
  Rows q_rope, k_rope, q_nope, k_nope, v, q_rope_out, q_nope_out, k_rope_out, k_nope_out;
  int64_t nnz = 0, rope_dim = 0, no_rope_dim = 0;
  DType in = DType::kFloat16, out = DType::kFloat8E4M3;
  const float* cache = nullptr;
  int64_t cache_rows = 0, cache_stride = 0;
  float scale_q = 1.f, scale_kv = 1.f;
  bool interleave = false;
};

float check_scale(const char* name, double x) {
  const float f = static_cast<float>(x);
  if (!std::isfinite(f)) throw InvalidArgument(std::string(name) + ": expected a finite float32 value, got " + std::to_string(x));
  return f;
}

Rows check_out(const char* name, const TensorView& t, const Rows& in, const Device& dev, DType& fp8, bool& have) {
  if (!in.present()) {  // no features: nothing is written (an empty output may be given)
    if (t.defined() && t.numel() > 0)
      throw InvalidArgument(std::string(name) + ": expected no features (its input has none), got " + t.shape_str());
    return {};
  }
  Rows r = rows_of(name, t, true, in.t.size(0), in.heads, in.dim, dev);
  if (t.dim() != in.t.dim()) throw InvalidArgument(std::string(name) + ": expected the shape of its input " + in.t.shape_str() + ", got " + t.shape_str());
  if (!is_fp8(t.dtype))
    throw TypeMismatch(std::string(name) + ": expected float8_e4m3fn or float8_e5m2, got " + dtype_name(t.dtype));
  if (have && t.dtype != fp8)
    throw TypeMismatch(std::string(name) + ": expected the quantized dtype " + dtype_name(fp8) + " of every output, got " +
                       dtype_name(t.dtype));
  fp8 = t.dtype, have = true;
  return r;
}

// Inputs, cos/sin cache, pos_ids, q outputs (and k outputs when k_outs).
Problem check_problem(const TensorView& q_rope, const TensorView& k_rope, const TensorView& q_nope,
                      const TensorView& k_nope, const TensorView& cos_sin_cache, const TensorView& pos_ids,
                      const TensorView& q_rope_out, const TensorView& q_nope_out, const TensorView* k_rope_out,
                      const TensorView* k_nope_out, bool k_2d, const RopeQuantizeOptions& opt) {
  Problem p;
  const Device dev = q_rope.device;
  check_dim("q_rope", q_rope, 3);
  p.nnz = q_rope.size(0);
  if (p.nnz > std::numeric_limits<int32_t>::max()) throw InvalidArgument("q_rope: expected fewer than 2^31 rows");
  p.q_rope = rows_of("q_rope", q_rope, false, p.nnz, -1, -1, dev);
  check_dtype_in("q_rope", q_rope, {DType::kFloat16, DType::kBFloat16});
  p.in = q_rope.dtype;
  p.rope_dim = p.q_rope.dim;
  if (p.rope_dim < 16 || p.rope_dim % 16 != 0)
    throw InvalidArgument("q_rope: expected rope_dim a positive multiple of 16, got " + q_rope.shape_str());
  if (k_2d && k_rope.defined() && k_rope.dim() != 2)
    throw InvalidArgument("k_rope: expected [nnz, rope_dim] (MLA), got " + k_rope.shape_str());
  if (!k_2d && k_rope.defined() && k_rope.dim() != 3)
    throw InvalidArgument("k_rope: expected [nnz, num_kv_heads, rope_dim], got " + k_rope.shape_str());
  p.k_rope = rows_of("k_rope", k_rope, true, p.nnz, -1, p.rope_dim, dev);
  if (!p.k_rope.t.defined()) throw InvalidArgument("k_rope: expected a tensor, got none");
  p.q_nope = rows_of("q_nope", q_nope, false, p.nnz, p.q_rope.heads, -1, dev);
  p.no_rope_dim = p.q_nope.dim;
  if (p.no_rope_dim % 16 != 0)
    throw InvalidArgument("q_nope: expected no_rope_dim a multiple of 16, got " + q_nope.shape_str());
  if (k_nope.defined() && k_nope.dim() != k_rope.dim())
    throw InvalidArgument("k_nope: expected " + str(k_rope.dim()) + " dimensions like k_rope, got " + k_nope.shape_str());
  if (!k_nope.defined() || k_nope.numel() > 0 || p.no_rope_dim > 0)
    p.k_nope = rows_of("k_nope", k_nope, true, p.nnz, p.k_rope.heads, p.no_rope_dim, dev);
  check_in_dtype("k_rope", p.k_rope, p.in);
  check_in_dtype("q_nope", p.q_nope, p.in);
  check_in_dtype("k_nope", p.k_nope, p.in);
  if (p.k_rope.heads < 1) throw InvalidArgument("k_rope: expected at least one head, got " + k_rope.shape_str());

  check_dim("cos_sin_cache", cos_sin_cache, 2);
  if (cos_sin_cache.dtype != DType::kFloat32)
    throw TypeMismatch(std::string("cos_sin_cache: expected float32, got ") + dtype_name(cos_sin_cache.dtype));
  check_device("cos_sin_cache", cos_sin_cache, dev);
  check_last_dim_contiguous("cos_sin_cache", cos_sin_cache);
  if (cos_sin_cache.size(1) != p.rope_dim)
    throw InvalidArgument("cos_sin_cache: expected [max_pos, rope_dim=" + str(p.rope_dim) + "], got " +
                          cos_sin_cache.shape_str());
  p.cache = static_cast<const float*>(cos_sin_cache.data);
  p.cache_rows = cos_sin_cache.size(0);
  p.cache_stride = p.cache_rows > 0 ? cos_sin_cache.stride(0) : p.rope_dim;
  detail::check_index_vector("pos_ids", pos_ids, dev);
  check_shape("pos_ids", pos_ids, {p.nnz});

  bool have = false;
  p.q_rope_out = check_out("q_rope_out", q_rope_out, p.q_rope, dev, p.out, have);
  if (k_rope_out) p.k_rope_out = check_out("k_rope_out", *k_rope_out, p.k_rope, dev, p.out, have);
  p.q_nope_out = check_out("q_nope_out", q_nope_out, p.q_nope, dev, p.out, have);
  if (k_nope_out) p.k_nope_out = check_out("k_nope_out", *k_nope_out, p.k_nope, dev, p.out, have);
  p.scale_q = check_scale("quant_scale_q", opt.quant_scale_q);
  p.scale_kv = check_scale("quant_scale_kv", opt.quant_scale_kv);
  p.interleave = opt.interleave;
  return p;
}

// ------------------------------------------------------------------ CPU path
// One rounding per operation, as the kernel: a float product is exact in
// double, so rounding it to float once is IEEE float multiplication.
float mul_rn(float a, float b) { return static_cast<float>(static_cast<double>(a) * static_cast<double>(b)); }

const int32_t* ints(const TensorView& t) { return static_cast<const int32_t*>(t.data); }

// Row (i, h) of `r` as floats; rotated (first rope_dim features) when rope.
void quantize_row(const Problem& p, const Rows& r, int64_t i, int64_t h, bool rope, int pos, float scale, uint8_t* dst) {
  std::vector<float> x(r.dim);
  const char* src = static_cast<const char*>(r.t.data) + (i * r.stride_n + h * r.stride_h) * dtype_size(p.in);
  for (int64_t d = 0; d < r.dim; ++d) x[d] = load_as_float(src, p.in, static_cast<size_t>(d));
  std::vector<float> y = x;
  if (rope) {
    const float* row = p.cache + static_cast<int64_t>(pos) * p.cache_stride;
    const int64_t half = p.rope_dim / 2;
    for (int64_t f = 0; f < p.rope_dim; ++f) {
      const int64_t j = p.interleave ? f / 2 : f % half;
      const bool first = p.interleave ? f % 2 == 0 : f < half;
      const int64_t partner = p.interleave ? (f ^ 1) : (first ? f + half : f - half);
      const float a = mul_rn(x[f], row[j]), b = mul_rn(x[partner], row[half + j]);
      y[f] = first ? a - b : a + b;
    }
  }
  for (int64_t d = 0; d < r.dim; ++d) dst[d] = float_to_fp8(mul_rn(y[d], scale), p.out);
}

// K / V destination of the CPU path: element offset of row (i, h).
struct HostDst {
  uint8_t* base = nullptr;
  int64_t stride_n = 0, stride_h = 0, page_stride = 0, token_stride = 0;
  int64_t at(int64_t i, int64_t h, int64_t page, int64_t slot) const {
    return (page < 0 ? i * stride_n : page * page_stride + slot * token_stride) + h * stride_h;
  }
};

struct HostTable {
  std::vector<int64_t> page, slot;  // per token; page -1: unpaged, -2: padding
};

void run_cpu(const Problem& p, const TensorView& pos_ids, const HostDst& k_rope_dst, const HostDst& k_nope_dst,
             const HostDst& v_dst, const HostTable& table) {
  const int32_t* pos = ints(pos_ids);
  for (int64_t i = 0; i < p.nnz; ++i)
    if (pos[i] < 0 || pos[i] >= p.cache_rows)
      throw InvalidArgument("pos_ids: expected positions in [0, " + str(p.cache_rows) + ") (rows of cos_sin_cache), got " +
                            str(pos[i]) + " at " + str(i));
  auto out_row = [&](const Rows& r, int64_t i, int64_t h) {
    return static_cast<uint8_t*>(r.t.data) + i * r.stride_n + h * r.stride_h;
  };
  for (int64_t i = 0; i < p.nnz; ++i) {
    const int64_t page = table.page.empty() ? -1 : table.page[i], slot = table.page.empty() ? 0 : table.slot[i];
    if (page == -2) continue;
    for (int64_t h = 0; h < p.q_rope.heads; ++h) {
      quantize_row(p, p.q_rope, i, h, true, pos[i], p.scale_q, out_row(p.q_rope_out, i, h));
      if (p.q_nope.present()) quantize_row(p, p.q_nope, i, h, false, 0, p.scale_q, out_row(p.q_nope_out, i, h));
    }
    for (int64_t h = 0; h < p.k_rope.heads; ++h) {
      quantize_row(p, p.k_rope, i, h, true, pos[i], p.scale_kv, k_rope_dst.base + k_rope_dst.at(i, h, page, slot));
      if (p.k_nope.present())
        quantize_row(p, p.k_nope, i, h, false, 0, p.scale_kv, k_nope_dst.base + k_nope_dst.at(i, h, page, slot));
      if (p.v.present()) quantize_row(p, p.v, i, h, false, 0, p.scale_kv, v_dst.base + v_dst.at(i, h, page, slot));
    }
  }
}

// ------------------------------------------------------------------ paging
struct Table {
  const TensorView *kv_indices, *kv_indptr, *batch_indices, *positions;
  int64_t num_pages = 0;
  int page_size = 0;
  int max_batch = 0, max_indices = 0;  // how far the kernel reads kv_indptr / kv_indices (check_table)
};

// Also resolves the kernel's read bounds (checked on both paths).
void check_table(Table& t, int64_t nnz, const Device& dev, const RopeQuantizeOptions& opt) {
  detail::check_index_vector("kv_indices", *t.kv_indices, dev);
  detail::check_index_vector("kv_indptr", *t.kv_indptr, dev);
  detail::check_index_vector("batch_indices", *t.batch_indices, dev);
  detail::check_index_vector("positions", *t.positions, dev);
  check_shape("batch_indices", *t.batch_indices, {nnz});
  check_shape("positions", *t.positions, {nnz});
  if (t.kv_indptr->size(0) < 1) throw InvalidArgument("kv_indptr: expected batch + 1 >= 1 entries, got 0");
  if (t.num_pages > std::numeric_limits<int32_t>::max())
    throw InvalidArgument("kv: expected fewer than 2^31 pages, got " + str(t.num_pages));
  t.max_batch = detail::table_bound("max_batch", opt.max_batch, t.kv_indptr->size(0) - 1);
  t.max_indices = detail::table_bound("max_indices", opt.max_indices, t.kv_indices->size(0));
}

// Every token's (page, slot) on the host, all indices checked first.
HostTable host_table(const Table& t, int64_t nnz) {
  const int64_t batch = t.kv_indptr->size(0) - 1, num_indices = t.kv_indices->size(0);
  const int32_t *indptr = ints(*t.kv_indptr), *pages = ints(*t.kv_indices);
  const int32_t *bidx = ints(*t.batch_indices), *pos = ints(*t.positions);
  validate_indptr("kv_indptr", {indptr, static_cast<size_t>(batch + 1)});
  if (indptr[batch] > num_indices)
    throw InvalidArgument("kv_indptr: expected kv_indptr[" + str(batch) + "] <= " + str(num_indices) +
                          " (entries in kv_indices), got " + str(indptr[batch]));
  HostTable h;
  h.page.assign(nnz, -2);
  h.slot.assign(nnz, 0);
  for (int64_t i = 0; i < nnz; ++i) {
    const int64_t b = bidx[i];
    if (b < 0) continue;  // padding
    if (b >= batch)
      throw InvalidArgument("batch_indices: expected values < " + str(batch) + " (requests in kv_indptr) or < 0 (padding), got " +
                            "batch_indices[" + str(i) + "]=" + str(b));
    const int64_t len = static_cast<int64_t>(indptr[b + 1] - indptr[b]) * t.page_size;
    if (pos[i] < 0 || pos[i] >= len)
      throw InvalidArgument("positions: expected values in [0, " + str(len) + ") (the pages of request " + str(b) +
                            "), got positions[" + str(i) + "]=" + str(pos[i]));
    const int64_t j = indptr[b] + pos[i] / t.page_size;
    if (pages[j] < 0 || pages[j] >= t.num_pages)
      throw InvalidArgument("kv_indices: expected page indices in [0, " + str(t.num_pages) + ") (pages in the cache), got " +
                            "kv_indices[" + str(j) + "]=" + str(pages[j]));
    h.page[i] = pages[j];
    h.slot[i] = pos[i] % t.page_size;
  }
  return h;
}

// ------------------------------------------------------------------ GPU path
RopeQuantizeDst dst_of(void* ptr, int64_t stride_n, int64_t stride_h, int64_t page_stride, int64_t token_stride) {
  return RopeQuantizeDst{ptr, stride_n, stride_h, page_stride, token_stride};
}

void launch(const Problem& pr, const TensorView& pos_ids, const RopeQuantizeDst& k_rope_dst,
            const RopeQuantizeDst& k_nope_dst, const RopeQuantizeDst& v_dst, const Table* table, cudaStream_t stream) {
  RopeQuantizeParams p{};
  p.q_rope = pr.q_rope.t.data, p.k_rope = pr.k_rope.t.data;
  p.q_nope = pr.q_nope.t.data, p.k_nope = pr.k_nope.t.data;
  p.v = pr.v.present() ? pr.v.t.data : nullptr;
  p.q_rope_stride_n = pr.q_rope.stride_n, p.q_rope_stride_h = pr.q_rope.stride_h;
  p.k_rope_stride_n = pr.k_rope.stride_n, p.k_rope_stride_h = pr.k_rope.stride_h;
  p.q_nope_stride_n = pr.q_nope.stride_n, p.q_nope_stride_h = pr.q_nope.stride_h;
  p.k_nope_stride_n = pr.k_nope.stride_n, p.k_nope_stride_h = pr.k_nope.stride_h;
  p.v_stride_n = pr.v.stride_n, p.v_stride_h = pr.v.stride_h;
  p.q_rope_out = pr.q_rope_out.t.data, p.q_nope_out = pr.q_nope_out.t.data;
  p.q_rope_out_stride_n = pr.q_rope_out.stride_n, p.q_rope_out_stride_h = pr.q_rope_out.stride_h;
  p.q_nope_out_stride_n = pr.q_nope_out.stride_n, p.q_nope_out_stride_h = pr.q_nope_out.stride_h;
  p.k_rope_dst = k_rope_dst, p.k_nope_dst = k_nope_dst, p.v_dst = v_dst;
  p.cos_sin_cache = pr.cache, p.cache_stride = pr.cache_stride, p.cache_rows = pr.cache_rows;
  p.pos_ids = ints(pos_ids);
  if (table) {
    p.batch_indices = ints(*table->batch_indices), p.positions = ints(*table->positions);
    p.kv_indices = ints(*table->kv_indices), p.kv_indptr = ints(*table->kv_indptr);
    p.batch = table->max_batch;
    p.num_indices = table->max_indices;
    p.num_pages = static_cast<int>(table->num_pages), p.page_size = table->page_size;
  }
  p.nnz = pr.nnz;
  p.num_qo_heads = static_cast<int>(pr.q_rope.heads), p.num_kv_heads = static_cast<int>(pr.k_rope.heads);
  p.rope_dim = static_cast<int>(pr.rope_dim), p.no_rope_dim = static_cast<int>(pr.no_rope_dim);
  p.quant_scale_q = pr.scale_q, p.quant_scale_kv = pr.scale_kv;
  const int64_t chunks = (p.num_qo_heads + p.num_kv_heads) * (pr.rope_dim + pr.no_rope_dim) / 8 +
                         (p.v ? p.num_kv_heads * (pr.rope_dim + pr.no_rope_dim) / 8 : 0);
  const int64_t total = pr.nnz * chunks;
  if (total == 0) return;
  detail::require_gpu("rope_quantize_fp8");
  const Device dev = pr.q_rope.t.device;
  cuda::DeviceGuard guard(dev.index);
  const auto& kernel = jit::KernelCache::global().kernel(catalog::rope_quantize_fp8(pr.in, pr.out, pr.interleave), dev.index);
  kernel.launch(dim3(detail::grid_stride_blocks(total, kThreads)), dim3(kThreads), 0, stream, &p);
  detail::check_launch("rope_quantize_fp8");
}

uint8_t* bytes(const TensorView& t) { return static_cast<uint8_t*>(t.data); }

}  // namespace

void rope_quantize_fp8(const TensorView& q_rope, const TensorView& k_rope, const TensorView& q_nope,
                       const TensorView& k_nope, const TensorView& cos_sin_cache, const TensorView& pos_ids,
                       const TensorView& q_rope_out, const TensorView& k_rope_out, const TensorView& q_nope_out,
                       const TensorView& k_nope_out, const RopeQuantizeOptions& opt, cudaStream_t stream) {
  const Problem p = check_problem(q_rope, k_rope, q_nope, k_nope, cos_sin_cache, pos_ids, q_rope_out, q_nope_out,
                                  &k_rope_out, &k_nope_out, k_rope.defined() && k_rope.dim() == 2, opt);
  if (opt.max_batch != 0 || opt.max_indices != 0)
    throw InvalidArgument(std::string(opt.max_batch ? "max_batch" : "max_indices") +
                          ": expected 0, only the paged forms read a page table");
  if (!q_rope.device.is_cuda()) {
    const HostDst kr{bytes(k_rope_out), p.k_rope_out.stride_n, p.k_rope_out.stride_h};
    const HostDst kn{bytes(k_nope_out), p.k_nope_out.stride_n, p.k_nope_out.stride_h};
    return run_cpu(p, pos_ids, kr, kn, {}, {});
  }
  launch(p, pos_ids, dst_of(k_rope_out.data, p.k_rope_out.stride_n, p.k_rope_out.stride_h, 0, 0),
         dst_of(k_nope_out.data, p.k_nope_out.stride_n, p.k_nope_out.stride_h, 0, 0), {}, nullptr, stream);
}

void rope_quantize_fp8_append_paged_kv_cache(const TensorView& q_rope, const TensorView& k_rope,
                                             const TensorView& q_nope, const TensorView& k_nope, const TensorView& v,
                                             const TensorView& cos_sin_cache, const TensorView& pos_ids,
                                             const PagedKVStorage& kv, const TensorView& kv_indices,
                                             const TensorView& kv_indptr, const TensorView& batch_indices,
                                             const TensorView& positions, const TensorView& q_rope_out,
                                             const TensorView& q_nope_out, const RopeQuantizeOptions& opt,
                                             cudaStream_t stream) {
  Problem p = check_problem(q_rope, k_rope, q_nope, k_nope, cos_sin_cache, pos_ids, q_rope_out, q_nope_out, nullptr,
                            nullptr, false, opt);
  const Device dev = q_rope.device;
  if (!v.defined()) throw InvalidArgument("v: GQA / MHA expects a V tensor (only MLA passes none)");
  p.v = rows_of("v", v, false, p.nnz, p.k_rope.heads, p.rope_dim + p.no_rope_dim, dev);
  check_in_dtype("v", p.v, p.in);
  if (kv.dtype() != p.out)
    throw TypeMismatch(std::string("kv: expected the quantized dtype ") + dtype_name(p.out) + " (q_rope_out's), got " +
                       dtype_name(kv.dtype()));
  if (!(kv.device() == dev)) throw InvalidArgument("kv: expected a cache on " + dev.str() + ", got " + kv.device().str());
  if (kv.head_dim() != p.rope_dim + p.no_rope_dim || kv.v_head_dim() != kv.head_dim() || kv.num_kv_heads() != p.k_rope.heads)
    throw InvalidArgument("kv: expected num_kv_heads=" + str(p.k_rope.heads) + " and head_dim=" +
                          str(p.rope_dim + p.no_rope_dim) + " (rope_dim + no_rope_dim) for K and V, got " +
                          str(kv.num_kv_heads()) + " heads of " + str(kv.head_dim()) + " / " + str(kv.v_head_dim()));
  Table table{&kv_indices, &kv_indptr, &batch_indices, &positions, kv.num_pages(), kv.page_size()};
  check_table(table, p.nnz, dev, opt);
  if (!dev.is_cuda()) {
    const HostTable ht = host_table(table, p.nnz);
    const HostDst kr{bytes(kv.k()), 0, kv.head_stride(), kv.page_stride(), kv.token_stride()};
    const HostDst kn{bytes(kv.k()) + p.rope_dim, 0, kv.head_stride(), kv.page_stride(), kv.token_stride()};
    const HostDst vd{bytes(kv.v()), 0, kv.v_head_stride(), kv.v_page_stride(), kv.v_token_stride()};
    return run_cpu(p, pos_ids, kr, kn, vd, ht);
  }
  detail::check_cuda_vectors("kv", kv.k());
  detail::check_cuda_vectors("kv", kv.v());
  launch(p, pos_ids, dst_of(kv.k().data, 0, kv.head_stride(), kv.page_stride(), kv.token_stride()),
         dst_of(bytes(kv.k()) + p.rope_dim, 0, kv.head_stride(), kv.page_stride(), kv.token_stride()),
         dst_of(kv.v().data, 0, kv.v_head_stride(), kv.v_page_stride(), kv.v_token_stride()), &table, stream);
}

void rope_quantize_fp8_append_paged_mla_cache(const TensorView& q_rope, const TensorView& k_rope,
                                              const TensorView& q_nope, const TensorView& k_nope,
                                              const TensorView& cos_sin_cache, const TensorView& pos_ids,
                                              const TensorView& ckv_cache, const TensorView& kpe_cache,
                                              const TensorView& kv_indices, const TensorView& kv_indptr,
                                              const TensorView& batch_indices, const TensorView& positions,
                                              const TensorView& q_rope_out, const TensorView& q_nope_out,
                                              const RopeQuantizeOptions& opt, cudaStream_t stream) {
  const Problem p = check_problem(q_rope, k_rope, q_nope, k_nope, cos_sin_cache, pos_ids, q_rope_out, q_nope_out,
                                  nullptr, nullptr, true, opt);
  const Device dev = q_rope.device;
  int64_t num_pages = 0, page_size = 0;
  for (auto [name, c, dim] : {std::tuple{"ckv_cache", &ckv_cache, p.no_rope_dim}, {"kpe_cache", &kpe_cache, p.rope_dim}}) {
    check_dim(name, *c, 3);
    if (c->dtype != p.out)
      throw TypeMismatch(std::string(name) + ": expected the quantized dtype " + dtype_name(p.out) + " (q_rope_out's), got " +
                         dtype_name(c->dtype));
    check_device(name, *c, dev);
    if (c == &ckv_cache) num_pages = c->size(0), page_size = c->size(1);
    if (c->size(0) != num_pages || c->size(1) != page_size || c->size(2) != dim)
      throw InvalidArgument(std::string(name) + ": expected [num_pages=" + str(num_pages) + ", page_size=" + str(page_size) +
                            ", " + str(dim) + "], got " + c->shape_str());
    if (c->numel() > 0) {
      if (dev.is_cuda()) detail::check_cuda_vectors(name, *c);
      else check_last_dim_contiguous(name, *c);
    }
  }
  if (page_size < 1 || page_size > std::numeric_limits<int32_t>::max())
    throw InvalidArgument("ckv_cache: expected a page size >= 1, got " + ckv_cache.shape_str());
  Table table{&kv_indices, &kv_indptr, &batch_indices, &positions, num_pages, static_cast<int>(page_size)};
  check_table(table, p.nnz, dev, opt);
  const int64_t cs0 = ckv_cache.stride(0), cs1 = ckv_cache.stride(1), ks0 = kpe_cache.stride(0), ks1 = kpe_cache.stride(1);
  if (!dev.is_cuda()) {
    const HostTable ht = host_table(table, p.nnz);
    return run_cpu(p, pos_ids, HostDst{bytes(kpe_cache), 0, 0, ks0, ks1}, HostDst{bytes(ckv_cache), 0, 0, cs0, cs1}, {}, ht);
  }
  launch(p, pos_ids, dst_of(kpe_cache.data, 0, 0, ks0, ks1), dst_of(ckv_cache.data, 0, 0, cs0, cs1), {}, &table, stream);
}

}  // namespace tessera
