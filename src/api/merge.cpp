// Public merge API: validation, then the CPU implementation for host tensors
// or the JIT merge kernels for CUDA tensors.
#include "tessera/api/merge.hpp"

#include <algorithm>
#include <limits>
#include <vector>

#include "checks.hpp"
#include "tessera/abi/merge_params.cuh"
#include "tessera/formats/ragged.hpp"
#include "tessera/cpu/merge.hpp"
#include "tessera/runtime/jit.hpp"
#include "tessera/runtime/kernel_catalog.hpp"

namespace tessera {

using detail::str;

namespace {

void check_values(const char* name, const TensorView& v, int64_t ndim) {
  check_dim(name, v, ndim);
  check_dtype_in(name, v, {DType::kFloat16, DType::kBFloat16, DType::kFloat32});
  const int64_t d = v.size(-1);
  const int64_t vec = 16 / static_cast<int64_t>(dtype_size(v.dtype));
  // A row is d / vec 16-byte vectors spread evenly over the lanes of one warp
  // (abi/merge_params.cuh): a power of two, at most kMergeMaxVectors.
  if (d < vec || d % vec != 0 || kMergeMaxVectors % (d / vec) != 0)
    throw InvalidArgument(std::string(name) + ": expected head_dim a multiple of " + str(vec) + " dividing " +
                          str(kMergeMaxVectors * vec) + " (e.g. 64, 128, 256), got " + str(d));
  if (v.device.is_cuda()) detail::check_cuda_vectors(name, v);
  else check_last_dim_contiguous(name, v);
}

void check_scales(const char* name, const TensorView& s, std::initializer_list<int64_t> shape, const TensorView& v) {
  check_shape(name, s, shape);
  check_dtype(name, s, DType::kFloat32);
  check_same_device(name, s, "v", v);
}

bool wants(const TensorView& t) { return t.defined() && t.data != nullptr; }

StateSet state_set(const TensorView& v, const TensorView& s, int state_dim) {
  return {v.data, static_cast<const float*>(s.data), v.stride(state_dim), v.stride(-2), s.stride(state_dim), s.stride(-1)};
}
StateOut state_out(const TensorView& v, const TensorView& s) {
  StateOut o{v.data, nullptr, v.stride(0), v.stride(1), 0, 0};
  if (wants(s)) {
    o.s = static_cast<float*>(s.data);
    o.s_stride_state = s.stride(0);
    o.s_stride_head = s.stride(1);
  }
  return o;
}

// A state set is flat when its row stride is heads times its head stride, for
// values and LSEs alike, and the head strides fit 31 bits
// (abi/merge_params.cuh): the flat merge kernel addresses it by row index.
bool flat_strides(i64 stride_state, i64 stride_head, i64 heads) {
  return stride_head >= 0 && stride_head <= std::numeric_limits<int32_t>::max() && stride_state == heads * stride_head;
}
// Set: StateSet or StateOut (an output may leave its LSEs out).
template <typename Set>
bool flat(const Set& x, i64 heads) {
  return flat_strides(x.v_stride_state, x.v_stride_head, heads) &&
         (x.s == nullptr || flat_strides(x.s_stride_state, x.s_stride_head, heads));
}

// 16-byte vectors per row of head_dim values of type t.
int merge_vectors(int64_t head_dim, DType t) { return static_cast<int>(head_dim * dtype_size(t) / 16); }

// steps: rows per thread (merge_pair_steps for merge_pair, 1 for merge_many).
template <typename Params>
void launch(const jit::KernelSource& src, const TensorView& like, Params& p, int steps, cudaStream_t stream,
            bool pdl, const char* what) {
  const int64_t rows = static_cast<int64_t>(p.num_rows) * p.num_heads;
  if (rows == 0) return;
  if (rows > std::numeric_limits<int32_t>::max())
    throw InvalidArgument(std::string(what) + ": expected fewer than 2^31 (row, head) pairs, got " + str(rows));
  p.heads = fast_divisor(p.num_heads);  // rows > 0, so num_heads >= 1
  detail::require_gpu(what);
  cuda::DeviceGuard guard(like.device.index);
  const auto& k = jit::KernelCache::global().kernel(src, like.device.index);
  const int64_t per_block = merge_rows_per_block(merge_vectors(p.head_dim, like.dtype), steps);
  k.launch(dim3(static_cast<unsigned>((rows + per_block - 1) / per_block)), dim3(kMergeThreads), 0, stream, &p, pdl);
  detail::check_launch(what);
}

void check_pair(const TensorView& v_a, const TensorView& s_a, const TensorView& v_b, const TensorView& s_b) {
  check_values("v_a", v_a, 3);
  const int64_t n = v_a.size(0), h = v_a.size(1), d = v_a.size(2);
  check_shape("v_b", v_b, {n, h, d});
  check_dtype("v_b", v_b, v_a.dtype);
  check_same_device("v_a", v_a, "v_b", v_b);
  check_values("v_b", v_b, 3);
  check_scales("s_a", s_a, {n, h}, v_a);
  check_scales("s_b", s_b, {n, h}, v_a);
}

// An output state for pair (v_a, s_a): same shape and device (its dtype is
// the caller's to check).
void check_out(const TensorView& v_a, const TensorView& v_out, const TensorView& s_out) {
  check_shape("v_out", v_out, {v_a.size(0), v_a.size(1), v_a.size(2)});
  check_same_device("v_a", v_a, "v_out", v_out);
  check_values("v_out", v_out, 3);
  if (wants(s_out)) check_scales("s_out", s_out, {v_a.size(0), v_a.size(1)}, v_a);
}

// A row mask (uint8 / bool [rows], contiguous, on v's device), if given.
void check_mask(const TensorView& mask, const TensorView& v) {
  if (!wants(mask)) return;
  check_shape("mask", mask, {v.size(0)});
  check_dtype_in("mask", mask, {DType::kUInt8, DType::kBool});
  check_same_device("mask", mask, "v", v);
  check_contiguous("mask", mask);
}

// (v_out, s_out) = (v_a, s_a) (+) (v_b, s_b) on the GPU, masked rows left alone.
void launch_pair(const TensorView& v_a, const TensorView& s_a, const TensorView& v_b, const TensorView& s_b,
                 const TensorView& v_out, const TensorView& s_out, const TensorView& mask, cudaStream_t stream,
                 bool pdl, const char* what) {
  MergePairParams p{state_set(v_a, s_a, 0), state_set(v_b, s_b, 0), state_out(v_out, s_out),
                    wants(mask) ? static_cast<const unsigned char*>(mask.data) : nullptr,
                    static_cast<int>(v_a.size(0)), static_cast<int>(v_a.size(1)), static_cast<int>(v_a.size(2)), {}};
  const int per_lane = merge_per_lane(merge_vectors(v_a.size(2), v_a.dtype));
  const bool flat_sets = flat(p.a, p.num_heads) && flat(p.b, p.num_heads) && flat(p.out, p.num_heads);
  launch(catalog::merge_pair(v_a.dtype, v_out.dtype, per_lane, flat_sets), v_a, p, merge_pair_steps(per_lane), stream,
         pdl, what);
}

}  // namespace

namespace detail {

// A cascade's merges (GPU): fp32 states, the last one written straight into
// the caller's 16-bit output, so the levels' outputs are rounded once.
void merge_state_into(const TensorView& v_a, const TensorView& s_a, const TensorView& v_b, const TensorView& s_b,
                      const TensorView& v_out, const TensorView& s_out, const TensorView& mask, cudaStream_t stream,
                      bool pdl) {
  check_pair(v_a, s_a, v_b, s_b);
  check_out(v_a, v_out, s_out);  // the dtype pair: catalog::merge_pair
  check_mask(mask, v_a);
  require_gpu("merge_state_into");
  launch_pair(v_a, s_a, v_b, s_b, v_out, s_out, mask, stream, pdl, "merge_state_into");
}

}  // namespace detail

void merge_state(const TensorView& v_a, const TensorView& s_a, const TensorView& v_b, const TensorView& s_b,
                 const TensorView& v_out, const TensorView& s_out, cudaStream_t stream, bool pdl) {
  check_pair(v_a, s_a, v_b, s_b);
  check_out(v_a, v_out, s_out);
  check_dtype("v_out", v_out, v_a.dtype);
  if (!v_a.device.is_cuda()) return cpu::merge_state(v_a, s_a, v_b, s_b, v_out, s_out);
  launch_pair(v_a, s_a, v_b, s_b, v_out, s_out, TensorView(), stream, pdl, "merge_state");
}

void merge_state_in_place(const TensorView& v, const TensorView& s, const TensorView& v_other,
                          const TensorView& s_other, const TensorView& mask, cudaStream_t stream, bool pdl) {
  check_pair(v, s, v_other, s_other);
  check_mask(mask, v);
  if (!v.device.is_cuda()) {
    if (!wants(mask)) return cpu::merge_state(v, s, v_other, s_other, v, s);
    // Row by row through the same CPU merge, skipping masked-out rows.
    const auto* m = static_cast<const uint8_t*>(mask.data);
    for (int64_t r = 0; r < v.size(0); ++r) {
      if (!m[r]) continue;
      auto row = [r](const TensorView& t) {
        std::vector<int64_t> shape(t.shape.begin(), t.shape.end()), strides;
        shape[0] = 1;
        for (int64_t i = 0; i < t.dim(); ++i) strides.push_back(t.stride(i));
        return TensorView(static_cast<char*>(t.data) + r * t.stride(0) * dtype_size(t.dtype), t.dtype, t.device, shape,
                          strides);
      };
      cpu::merge_state(row(v), row(s), row(v_other), row(s_other), row(v), row(s));
    }
    return;
  }
  launch_pair(v, s, v_other, s_other, v, s, mask, stream, pdl, "merge_state_in_place");
}

void merge_states(const TensorView& v, const TensorView& s, const TensorView& v_out, const TensorView& s_out,
                  cudaStream_t stream, bool pdl) {
  check_values("v", v, 4);
  const int64_t n = v.size(0), S = v.size(1), h = v.size(2), d = v.size(3);
  check_scales("s", s, {n, S, h}, v);
  check_shape("v_out", v_out, {n, h, d});
  check_dtype("v_out", v_out, v.dtype);
  check_same_device("v", v, "v_out", v_out);
  check_values("v_out", v_out, 3);
  if (wants(s_out)) check_scales("s_out", s_out, {n, h}, v);
  if (!v.device.is_cuda()) return cpu::merge_states(v, s, v_out, s_out);
  // State (row, j) is state row*S + j of a [n*S, h, d] set: needs
  // stride(0) == S * stride(1), which holds for contiguous leading dims.
  // (A size-1 dim's stride never matters: with S == 1 any layout works.)
  if (S > 1 && v.stride(0) != S * v.stride(1))
    throw InvalidArgument("v: expected dims 0 and 1 to be contiguous with each other (stride(0) == num_states * stride(1))");
  if (S > 1 && s.stride(0) != S * s.stride(1))
    throw InvalidArgument("s: expected dims 0 and 1 to be contiguous with each other (stride(0) == num_states * stride(1))");
  StateSet in = state_set(v, s, 1);
  if (S == 1) {  // state index == row index
    in.v_stride_state = v.stride(0);
    in.s_stride_state = s.stride(0);
  }
  MergeManyParams p{in, state_out(v_out, s_out), nullptr, static_cast<int>(S),
                    static_cast<int>(n), static_cast<int>(h), static_cast<int>(d), {}};
  launch(catalog::merge_many(v.dtype, merge_per_lane(merge_vectors(d, v.dtype))), v, p, 1, stream, pdl, "merge_states");
}

void merge_states_ragged(const TensorView& v, const TensorView& s, const TensorView& indptr, const TensorView& v_out,
                         const TensorView& s_out, cudaStream_t stream, bool pdl) {
  check_values("v", v, 3);
  const int64_t total = v.size(0), h = v.size(1), d = v.size(2);
  check_scales("s", s, {total, h}, v);
  check_dim("indptr", indptr, 1);
  check_dtype("indptr", indptr, DType::kInt32);
  check_contiguous("indptr", indptr);
  check_same_device("indptr", indptr, "v", v);
  if (indptr.size(0) < 1) throw InvalidArgument("indptr: expected at least one element (rows + 1), got 0");
  const int64_t n = indptr.size(0) - 1;
  check_shape("v_out", v_out, {n, h, d});
  check_dtype("v_out", v_out, v.dtype);
  check_same_device("v", v, "v_out", v_out);
  check_values("v_out", v_out, 3);
  if (wants(s_out)) check_scales("s_out", s_out, {n, h}, v);
  // indptr decides every read address, so it is validated on the host even
  // when it lives on the GPU (a small synchronous copy).
  std::vector<int32_t> host(static_cast<size_t>(n + 1));
  if (indptr.device.is_cuda())
    TESSERA_CUDA_CHECK(cudaMemcpy(host.data(), indptr.data, host.size() * sizeof(int32_t), cudaMemcpyDeviceToHost));
  else
    std::copy_n(static_cast<const int32_t*>(indptr.data), host.size(), host.begin());
  validate_indptr("indptr", host, total);
  if (!v.device.is_cuda()) return cpu::merge_states_ragged(v, s, indptr, v_out, s_out);
  MergeManyParams p{state_set(v, s, 0), state_out(v_out, s_out), static_cast<const int*>(indptr.data), 0,
                    static_cast<int>(n), static_cast<int>(h), static_cast<int>(d), {}};
  launch(catalog::merge_many(v.dtype, merge_per_lane(merge_vectors(d, v.dtype))), v, p, 1, stream, pdl,
         "merge_states_ragged");
}

}  // namespace tessera
