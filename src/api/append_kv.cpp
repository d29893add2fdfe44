// append_paged_kv_cache: validation shared by both paths, then plain loops on
// the CPU (host tensors, every index checked first) or one JIT copy (or
// quantizing) kernel on the GPU (indices guarded on the device; see
// append_kv.hpp for why).
#include "tessera/api/append_kv.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "checks.hpp"
#include "tessera/abi/append_kv_params.cuh"
#include "tessera/formats/ragged.hpp"
#include "tessera/runtime/jit.hpp"
#include "tessera/runtime/kernel_catalog.hpp"

namespace tessera {

using detail::str;

namespace {

constexpr int kThreads = 256;          // must match kAppendThreads (device/kernels/append_kv.cuh)

// dim: the row width of the cache the rows go to (K's head_dim or V's).
void check_rows(const char* name, const TensorView& t, const PagedKVStorage& kv, int64_t dim) {
  check_dim(name, t, 3);
  check_shape(name, t, {-1, kv.num_kv_heads(), dim});
  const bool quantize = is_fp8(kv.dtype()) && is_half_precision(t.dtype);
  if (t.dtype != kv.dtype() && !quantize)
    throw TypeMismatch(std::string(name) + ": expected the cache's dtype " + dtype_name(kv.dtype()) +
                       (is_fp8(kv.dtype()) ? " or float16 / bfloat16 (quantized on the way)" : "") + ", got " +
                       dtype_name(t.dtype));
  check_device(name, t, kv.device());
  if (kv.device().is_cuda()) detail::check_cuda_vectors(name, t);
  else check_last_dim_contiguous(name, t);
}

const int32_t* ints(const TensorView& t) { return static_cast<const int32_t*>(t.data); }

// The scales a quantizing append divides by, as given: the floats, and the
// tensors' device pointers (host pointers on the CPU path).
struct Scales {
  float k = 1.f, v = 1.f;
  const float* k_tensor = nullptr;
  const float* v_tensor = nullptr;
};

const float* scale_tensor(const char* name, const TensorView& t, const Device& dev) {
  if (!t.defined() || t.data == nullptr) return nullptr;
  check_dtype(name, t, DType::kFloat32);
  if (t.numel() != 1) throw InvalidArgument(std::string(name) + ": expected a 1-element tensor, got shape " + t.shape_str());
  check_device(name, t, dev);
  return static_cast<const float*>(t.data);
}

// Scales of a quantizing append (positive, finite floats; tensors on the
// cache's device); the defaults for a copy of the cache's own dtype.
Scales check_scales(const AppendOptions& opt, bool quantize, const Device& dev) {
  Scales s;
  for (auto [name, x] : {std::pair{"k_scale", opt.k_scale}, {"v_scale", opt.v_scale}}) {
    if (!quantize && x != 1.0)
      throw InvalidArgument(std::string(name) + ": only an append of 16-bit rows into an fp8 cache is scaled; "
                            "expected 1.0, got " + std::to_string(x));
    if (!(x > 0) || !std::isfinite(static_cast<float>(x)))
      throw InvalidArgument(std::string(name) + ": expected a positive finite float32 value, got " + std::to_string(x));
  }
  s.k = static_cast<float>(opt.k_scale);
  s.v = static_cast<float>(opt.v_scale);
  s.k_tensor = scale_tensor("k_scale_tensor", opt.k_scale_tensor, dev);
  s.v_tensor = scale_tensor("v_scale_tensor", opt.v_scale_tensor, dev);
  if (!quantize && (s.k_tensor || s.v_tensor))
    throw InvalidArgument(std::string(s.k_tensor ? "k_scale_tensor" : "v_scale_tensor") +
                          ": only an append of 16-bit rows into an fp8 cache is scaled");
  return s;
}

// Row h of token i of `rows`, stored into the cache at element offset `to`:
// a byte copy, or quantized (value / scale, rounded as the GPU does).
void store_row(const TensorView& rows, int64_t i, int64_t h, void* cache, DType cache_dtype, int64_t to, int64_t D,
               float scale) {
  const size_t in = dtype_size(rows.dtype), out = dtype_size(cache_dtype);
  const char* src = static_cast<const char*>(rows.data) + (i * rows.stride(0) + h * rows.stride(1)) * in;
  char* dst = static_cast<char*>(cache) + to * out;
  if (rows.dtype == cache_dtype) {
    std::memcpy(dst, src, static_cast<size_t>(D) * out);
    return;
  }
  for (int64_t d = 0; d < D; ++d)
    reinterpret_cast<uint8_t*>(dst)[d] = float_to_fp8(load_as_float(src, rows.dtype, static_cast<size_t>(d)) / scale,
                                                      cache_dtype);
}

// The CPU path: validates every index before writing anything, so a bad call
// leaves the cache untouched.
void append_cpu(const TensorView& key, const TensorView& value, const TensorView& batch_indices,
                const TensorView& positions, const PagedKVStorage& kv, const TensorView& kv_indices,
                const TensorView& kv_indptr, const TensorView& kv_last_page_len, const Scales& sc) {
  const int64_t nnz = key.size(0), batch = kv_indptr.size(0) - 1, num_indices = kv_indices.size(0);
  const int32_t* indptr = ints(kv_indptr);
  const int32_t* last = ints(kv_last_page_len);
  const int32_t* pages = ints(kv_indices);
  const int32_t* bidx = ints(batch_indices);
  const int32_t* pos = ints(positions);
  const int64_t ps = kv.page_size();
  validate_indptr("kv_indptr", {indptr, static_cast<size_t>(batch + 1)});
  if (indptr[batch] > num_indices)
    throw InvalidArgument("kv_indptr: expected kv_indptr[" + str(batch) + "] <= " + str(num_indices) +
                          " (entries in kv_indices), got " + str(indptr[batch]));
  for (int64_t b = 0; b < batch; ++b) {
    const int32_t lo = indptr[b + 1] > indptr[b] ? 1 : 0;
    if (last[b] < lo || last[b] > ps)
      throw InvalidArgument("kv_last_page_len: expected values in [" + str(lo) + ", " + str(ps) +
                            "] (page_size), got kv_last_page_len[" + str(b) + "]=" + str(last[b]));
  }
  std::vector<int64_t> dst(static_cast<size_t>(nnz));  // each token's kv_indices entry
  for (int64_t i = 0; i < nnz; ++i) {
    const int64_t b = bidx[i];
    if (b < 0 || b >= batch)
      throw InvalidArgument("batch_indices: expected values in [0, " + str(batch) + ") (requests in kv_indptr), got " +
                            "batch_indices[" + str(i) + "]=" + str(b));
    const int64_t num_pages = indptr[b + 1] - indptr[b];
    const int64_t len = num_pages == 0 ? 0 : (num_pages - 1) * ps + last[b];
    if (pos[i] < 0 || pos[i] >= len)
      throw InvalidArgument("positions: expected values in [0, " + str(len) + ") (the length of request " + str(b) +
                            " after the append), got positions[" + str(i) + "]=" + str(pos[i]));
    const int64_t j = indptr[b] + pos[i] / ps;
    if (pages[j] < 0 || pages[j] >= kv.num_pages())
      throw InvalidArgument("kv_indices: expected page indices in [0, " + str(kv.num_pages()) +
                            ") (pages in the cache), got kv_indices[" + str(j) + "]=" + str(pages[j]));
    dst[i] = j;
  }
  // As the kernel: the float scale times the tensor's value, in float.
  const float k_scale = sc.k_tensor ? sc.k * *sc.k_tensor : sc.k, v_scale = sc.v_tensor ? sc.v * *sc.v_tensor : sc.v;
  for (int64_t i = 0; i < nnz; ++i) {
    const int64_t page = pages[dst[i]], slot = pos[i] % ps;
    for (int64_t h = 0; h < kv.num_kv_heads(); ++h) {
      store_row(key, i, h, kv.k().data, kv.dtype(), kv.offset(page, h, slot), kv.head_dim(), k_scale);
      store_row(value, i, h, kv.v().data, kv.dtype(), kv.v_offset(page, h, slot), kv.v_head_dim(), v_scale);
    }
  }
}

}  // namespace

void append_paged_kv_cache(const TensorView& append_key, const TensorView& append_value,
                           const TensorView& batch_indices, const TensorView& positions, const PagedKVStorage& kv,
                           const TensorView& kv_indices, const TensorView& kv_indptr,
                           const TensorView& kv_last_page_len, cudaStream_t stream, const AppendOptions& opt) {
  const Device dev = kv.device();
  check_rows("append_key", append_key, kv, kv.head_dim());
  check_rows("append_value", append_value, kv, kv.v_head_dim());
  if (append_value.dtype != append_key.dtype)
    throw TypeMismatch(std::string("append_value: expected the dtype of append_key (") + dtype_name(append_key.dtype) +
                       "), got " + dtype_name(append_value.dtype));
  const bool quantize = append_key.dtype != kv.dtype();
  const Scales sc = check_scales(opt, quantize, dev);
  const int64_t nnz = append_key.size(0);
  check_shape("append_value", append_value, {nnz, kv.num_kv_heads(), kv.v_head_dim()});
  detail::check_index_vector("batch_indices", batch_indices, dev);
  detail::check_index_vector("positions", positions, dev);
  detail::check_index_vector("kv_indices", kv_indices, dev);
  detail::check_index_vector("kv_indptr", kv_indptr, dev);
  detail::check_index_vector("kv_last_page_len", kv_last_page_len, dev);
  check_shape("batch_indices", batch_indices, {nnz});
  check_shape("positions", positions, {nnz});
  if (kv_indptr.size(0) < 1) throw InvalidArgument("kv_indptr: expected batch + 1 >= 1 entries, got 0");
  const int64_t batch = kv_indptr.size(0) - 1;
  check_shape("kv_last_page_len", kv_last_page_len, {batch});
  if (kv.num_pages() > std::numeric_limits<int32_t>::max())
    throw InvalidArgument("kv: expected fewer than 2^31 pages, got " + str(kv.num_pages()));
  // Checked on both paths; only the kernel reads past the views.
  const int max_batch = detail::table_bound("max_batch", opt.max_batch, batch);
  const int max_indices = detail::table_bound("max_indices", opt.max_indices, kv_indices.size(0));

  if (!dev.is_cuda())
    return append_cpu(append_key, append_value, batch_indices, positions, kv, kv_indices, kv_indptr, kv_last_page_len,
                      sc);

  detail::check_cuda_vectors("kv", kv.k());
  detail::check_cuda_vectors("kv", kv.v());
  if (nnz == 0) return;
  AppendKVParams p{};
  p.append_k = append_key.data;
  p.append_v = append_value.data;
  p.k_stride_n = append_key.stride(0);
  p.k_stride_h = append_key.stride(1);
  p.v_stride_n = append_value.stride(0);
  p.v_stride_h = append_value.stride(1);
  p.k = kv.k().data;
  p.v = kv.v().data;
  p.page_stride = kv.page_stride();
  p.head_stride = kv.head_stride();
  p.token_stride = kv.token_stride();
  p.v_page_stride = kv.v_page_stride();
  p.v_head_stride = kv.v_head_stride();
  p.v_token_stride = kv.v_token_stride();
  p.batch_indices = ints(batch_indices);
  p.positions = ints(positions);
  p.kv_indices = ints(kv_indices);
  p.kv_indptr = ints(kv_indptr);
  p.kv_last_page_len = ints(kv_last_page_len);
  p.nnz = nnz;
  p.batch = max_batch;
  p.num_indices = max_indices;
  p.num_pages = static_cast<int>(kv.num_pages());
  p.page_size = kv.page_size();
  p.num_heads = kv.num_kv_heads();
  p.head_dim = kv.head_dim();
  p.v_head_dim = kv.v_head_dim();
  p.k_scale = sc.k;
  p.v_scale = sc.v;
  p.k_scale_ptr = sc.k_tensor;
  p.v_scale_ptr = sc.v_tensor;
  // One thread per 16-byte vector of the wider of the K and V rows.
  const int64_t width = std::max(kv.head_dim(), kv.v_head_dim());
  const int64_t vecs = nnz * kv.num_kv_heads() * (width / (16 / static_cast<int64_t>(dtype_size(kv.dtype()))));
  const unsigned blocks = detail::grid_stride_blocks(vecs, kThreads);
  detail::require_gpu("append_paged_kv_cache");
  cuda::DeviceGuard guard(dev.index);
  const auto& kernel = jit::KernelCache::global().kernel(catalog::append_paged_kv(append_key.dtype, kv.dtype()), dev.index);
  kernel.launch(dim3(blocks), dim3(kThreads), 0, stream, &p);
  detail::check_launch("append_paged_kv_cache");
}

}  // namespace tessera
