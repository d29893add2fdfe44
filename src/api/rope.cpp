// apply_rope / apply_rope_pos_ids (linear or Llama 3.1 frequencies) and
// apply_rope_pos_ids_cos_sin_cache: shared validation, then the CPU path
// (cpu/rope.hpp) for host tensors or one JIT kernel launch for CUDA tensors.
#include "tessera/api/rope.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "checks.hpp"
#include "tessera/abi/rope_params.cuh"
#include "tessera/formats/ragged.hpp"
#include "tessera/cpu/rope.hpp"
#include "tessera/runtime/jit.hpp"
#include "tessera/runtime/kernel_catalog.hpp"

namespace tessera {

using detail::str;

namespace {

constexpr int kThreads = 256;  // must match kRopeThreads (device/kernels/rope.cuh)

void check_head_rows(const char* name, const TensorView& t, const Device& dev) {
  check_dim(name, t, 3);
  check_dtype_in(name, t, {DType::kFloat16, DType::kBFloat16});
  check_device(name, t, dev);
  if (dev.is_cuda()) detail::check_cuda_vectors(name, t);
  else check_last_dim_contiguous(name, t);
}

void check_out(const char* name, const TensorView& out, const char* in_name, const TensorView& in) {
  if (out.shape != in.shape)
    throw InvalidArgument(std::string(name) + ": expected the shape of " + in_name + " " + in.shape_str() + ", got " +
                          out.shape_str());
  if (out.dtype != in.dtype)
    throw TypeMismatch(std::string(name) + ": expected the dtype of " + in_name + " (" + dtype_name(in.dtype) + "), got " +
                       dtype_name(out.dtype));
  check_head_rows(name, out, in.device);
}

void check_index(const char* name, const TensorView& t, int64_t size, const Device& dev) {
  detail::check_index_vector(name, t, dev);
  if (t.size(0) != size)
    throw InvalidArgument(std::string(name) + ": expected " + str(size) + " entries, got " + str(t.size(0)));
}

// Validates q, k and their outputs.
void check_rows(const TensorView& q, const TensorView& k, const TensorView& q_rope, const TensorView& k_rope) {
  check_head_rows("q", q, q.device);
  check_head_rows("k", k, q.device);
  if (k.dtype != q.dtype)
    throw TypeMismatch(std::string("k: expected the dtype of q (") + dtype_name(q.dtype) + "), got " + dtype_name(k.dtype));
  if (k.size(0) != q.size(0) || k.size(2) != q.size(2))
    throw InvalidArgument("k: expected [nnz=" + str(q.size(0)) + ", num_k_heads, head_dim=" + str(q.size(2)) + "] like q, got " +
                          k.shape_str());
  const int64_t d = q.size(2);
  if (d != 64 && d != 128 && d != 256) throw InvalidArgument("q: expected head_dim 64, 128 or 256, got " + q.shape_str());
  if (q.size(0) > std::numeric_limits<int32_t>::max()) throw InvalidArgument("q: expected fewer than 2^31 rows");
  check_out("q_rope", q_rope, "q", q);
  check_out("k_rope", k_rope, "k", k);
}

void check_positive(const char* name, double v) {
  if (!(v > 0.0) || !std::isfinite(v))
    throw InvalidArgument(std::string(name) + ": expected a finite value > 0, got " + std::to_string(v));
}

// Validates the tensors and options; returns the rotary dimension.
int check_common(const TensorView& q, const TensorView& k, const TensorView& q_rope, const TensorView& k_rope,
                 const RopeOptions& opt) {
  check_rows(q, k, q_rope, k_rope);
  const int64_t d = q.size(2);
  const int64_t rd = opt.rotary_dim < 0 ? d : opt.rotary_dim;
  if (rd < 16 || rd > d || rd % 16 != 0)
    throw InvalidArgument("rotary_dim: expected a multiple of 16 in [16, head_dim=" + str(d) + "] (or < 0 for all), got " +
                          str(opt.rotary_dim));
  check_positive("rope_scale", opt.rope_scale);
  check_positive("rope_theta", opt.rope_theta);
  if (opt.llama31) {
    check_positive("low_freq_factor", opt.low_freq_factor);
    check_positive("high_freq_factor", opt.high_freq_factor);
    if (!(opt.high_freq_factor > opt.low_freq_factor))
      throw InvalidArgument("high_freq_factor: expected a value > low_freq_factor=" + std::to_string(opt.low_freq_factor) +
                            ", got " + std::to_string(opt.high_freq_factor));
    check_positive("old_context_len", opt.old_context_len);
  }
  return static_cast<int>(rd);
}

std::vector<double> cpu_rates(const RopeOptions& opt, int rotary_dim) {
  return opt.llama31 ? cpu::rope_rates_llama31(opt.rope_scale, opt.rope_theta, rotary_dim, opt.low_freq_factor,
                                               opt.high_freq_factor, opt.old_context_len)
                     : cpu::rope_rates(opt.rope_scale, opt.rope_theta, rotary_dim);
}

// p: the mode's own fields (smooth_a / smooth_b, cos_sin_cache) already set.
void launch(RopeParams p, RopeMode mode, const TensorView& q, const TensorView& k, const TensorView& q_rope,
            const TensorView& k_rope, const int* pos_ids, const int* indptr, const int* offsets, int64_t batch,
            bool interleave, int rotary_dim, cudaStream_t stream) {
  detail::require_gpu("apply_rope");
  check_same_device("q", q, "k", k);
  p.q = q.data;
  p.k = k.data;
  p.q_out = q_rope.data;
  p.k_out = k_rope.data;
  p.q_stride_n = q.stride(0), p.q_stride_h = q.stride(1);
  p.k_stride_n = k.stride(0), p.k_stride_h = k.stride(1);
  p.qo_stride_n = q_rope.stride(0), p.qo_stride_h = q_rope.stride(1);
  p.ko_stride_n = k_rope.stride(0), p.ko_stride_h = k_rope.stride(1);
  p.pos_ids = pos_ids;
  p.indptr = indptr;
  p.offsets = offsets;
  p.nnz = q.size(0);
  p.batch = static_cast<int>(batch);
  p.num_q_heads = static_cast<int>(q.size(1));
  p.num_k_heads = static_cast<int>(k.size(1));
  p.rotary_dim = rotary_dim;
  const int64_t total = p.nnz * (p.num_q_heads + p.num_k_heads) * (q.size(2) / 8);
  if (total == 0) return;
  cuda::DeviceGuard guard(q.device.index);
  const auto& kernel = jit::KernelCache::global().kernel(
      catalog::apply_rope(q.dtype, static_cast<int>(q.size(2)), interleave, mode), q.device.index);
  kernel.launch(dim3(detail::grid_stride_blocks(total, kThreads)), dim3(kThreads), 0, stream, &p);
  detail::check_launch("apply_rope");
}

// The computed modes' parameters (linear or Llama 3.1).
RopeParams freq_params(const RopeOptions& opt, RopeMode& mode) {
  RopeParams p{};
  p.rope_scale = static_cast<float>(opt.rope_scale);
  p.rope_theta = static_cast<float>(opt.rope_theta);
  mode = opt.llama31 ? RopeMode::kLlama31 : RopeMode::kLinear;
  if (opt.llama31) {
    const double band = opt.high_freq_factor - opt.low_freq_factor;
    p.smooth_a = static_cast<float>(opt.old_context_len / band);
    p.smooth_b = static_cast<float>(-opt.low_freq_factor / band);
  }
  return p;
}

}  // namespace

void apply_rope_pos_ids(const TensorView& q, const TensorView& k, const TensorView& q_rope, const TensorView& k_rope,
                        const TensorView& pos_ids, const RopeOptions& opt, cudaStream_t stream) {
  const int rd = check_common(q, k, q_rope, k_rope, opt);
  check_index("pos_ids", pos_ids, q.size(0), q.device);
  if (q.device.is_cuda()) {
    RopeMode mode;
    const RopeParams p = freq_params(opt, mode);
    launch(p, mode, q, k, q_rope, k_rope, static_cast<const int*>(pos_ids.data), nullptr, nullptr, 0, opt.interleave, rd,
           stream);
    return;
  }
  const int32_t* ids = static_cast<const int32_t*>(pos_ids.data);
  const std::vector<int64_t> pos(ids, ids + q.size(0));
  const cpu::RopeAngles angles = cpu::rope_angles(cpu_rates(opt, rd));
  cpu::rotate_rows(q, q_rope, pos, opt.interleave, rd, angles);
  cpu::rotate_rows(k, k_rope, pos, opt.interleave, rd, angles);
}

void apply_rope(const TensorView& q, const TensorView& k, const TensorView& q_rope, const TensorView& k_rope,
                const TensorView& indptr, const TensorView& offsets, const RopeOptions& opt, cudaStream_t stream) {
  const int rd = check_common(q, k, q_rope, k_rope, opt);
  check_dim("indptr", indptr, 1);
  if (indptr.size(0) < 1) throw InvalidArgument("indptr: expected batch + 1 >= 1 entries, got 0");
  const int64_t batch = indptr.size(0) - 1;
  check_index("indptr", indptr, batch + 1, q.device);
  check_index("offsets", offsets, batch, q.device);
  if (batch == 0 && q.size(0) > 0) throw InvalidArgument("indptr: expected at least one request for " + str(q.size(0)) + " rows");
  if (q.device.is_cuda()) {
    // The GPU copies are not read back (that would synchronize): a row
    // outside indptr's range takes the first or last request's offset.
    RopeMode mode;
    const RopeParams p = freq_params(opt, mode);
    launch(p, mode, q, k, q_rope, k_rope, nullptr, static_cast<const int*>(indptr.data),
           static_cast<const int*>(offsets.data), batch, opt.interleave, rd, stream);
    return;
  }
  const int32_t* ip = static_cast<const int32_t*>(indptr.data);
  const int32_t* off = static_cast<const int32_t*>(offsets.data);
  validate_indptr("indptr", {ip, static_cast<size_t>(batch + 1)});
  if (ip[batch] != q.size(0))
    throw InvalidArgument("indptr: expected indptr[batch] = " + str(q.size(0)) + " (rows of q), got " + str(ip[batch]));
  std::vector<int64_t> pos(q.size(0));
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t n = ip[b]; n < ip[b + 1]; ++n) pos[n] = off[b] + (n - ip[b]);
  const cpu::RopeAngles angles = cpu::rope_angles(cpu_rates(opt, rd));
  cpu::rotate_rows(q, q_rope, pos, opt.interleave, rd, angles);
  cpu::rotate_rows(k, k_rope, pos, opt.interleave, rd, angles);
}

void apply_rope_pos_ids_cos_sin_cache(const TensorView& q, const TensorView& k, const TensorView& q_rope,
                                      const TensorView& k_rope, const TensorView& cos_sin_cache,
                                      const TensorView& pos_ids, bool interleave, cudaStream_t stream) {
  check_rows(q, k, q_rope, k_rope);
  check_dim("cos_sin_cache", cos_sin_cache, 2);
  if (cos_sin_cache.dtype != DType::kFloat32)
    throw TypeMismatch(std::string("cos_sin_cache: expected float32, got ") + dtype_name(cos_sin_cache.dtype));
  check_device("cos_sin_cache", cos_sin_cache, q.device);
  check_last_dim_contiguous("cos_sin_cache", cos_sin_cache);
  const int64_t d = q.size(2), rd = cos_sin_cache.size(1), rows = cos_sin_cache.size(0);
  if (rd < 16 || rd > d || rd % 16 != 0)
    throw InvalidArgument("cos_sin_cache: expected [max_pos, rotary_dim] with rotary_dim a multiple of 16 in [16, head_dim=" +
                          str(d) + "], got " + cos_sin_cache.shape_str());
  if (rows > 0 && cos_sin_cache.stride(0) < rd)
    throw InvalidArgument("cos_sin_cache: expected rows that do not overlap, got row stride " +
                          str(cos_sin_cache.stride(0)));
  check_index("pos_ids", pos_ids, q.size(0), q.device);
  if (q.device.is_cuda()) {
    RopeParams p{};
    p.rope_scale = p.rope_theta = 1.f;
    p.cos_sin_cache = static_cast<const float*>(cos_sin_cache.data);
    p.cache_stride = cos_sin_cache.stride(0);
    p.cache_rows = rows;
    launch(p, RopeMode::kCosSinCache, q, k, q_rope, k_rope, static_cast<const int*>(pos_ids.data), nullptr, nullptr, 0,
           interleave, static_cast<int>(rd), stream);
    return;
  }
  const int32_t* ids = static_cast<const int32_t*>(pos_ids.data);
  const std::vector<int64_t> pos(ids, ids + q.size(0));
  for (int64_t n = 0; n < q.size(0); ++n)
    if (pos[n] < 0 || pos[n] >= rows)
      throw InvalidArgument("pos_ids: expected positions in [0, " + str(rows) + ") (rows of cos_sin_cache), got " +
                            str(pos[n]) + " at " + str(n));
  const float* cache = static_cast<const float*>(cos_sin_cache.data);
  const int64_t row_stride = cos_sin_cache.stride(0), half = rd / 2;
  const cpu::RopeAngles angles = [=](int64_t at, std::span<double> cos, std::span<double> sin) {
    const float* row = cache + at * row_stride;
    for (int64_t j = 0; j < half; ++j) cos[j] = row[j], sin[j] = row[half + j];
  };
  cpu::rotate_rows(q, q_rope, pos, interleave, static_cast<int>(rd), angles);
  cpu::rotate_rows(k, k_rope, pos, interleave, static_cast<int>(rd), angles);
}

}  // namespace tessera
