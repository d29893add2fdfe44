#include "checks.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

namespace tessera::detail {

void check_cuda_vectors(const char* name, const TensorView& t) {
  if (!t.device.is_cuda()) throw TypeMismatch(std::string(name) + ": expected a CUDA tensor, got " + t.device.str());
  check_last_dim_contiguous(name, t, 16 / static_cast<int64_t>(dtype_size(t.dtype)));
  if (reinterpret_cast<uintptr_t>(t.data) % 16 != 0)
    throw InvalidArgument(std::string(name) + ": expected a 16-byte aligned data pointer");
}

void check_index_vector(const char* name, const TensorView& t, const Device& dev) {
  check_dim(name, t, 1);
  check_dtype(name, t, DType::kInt32);
  check_contiguous(name, t);
  check_device(name, t, dev);
  if (t.size(0) > std::numeric_limits<int32_t>::max())
    throw InvalidArgument(std::string(name) + ": expected fewer than 2^31 entries, got " + std::to_string(t.size(0)));
}

int table_bound(const char* name, int64_t given, int64_t view_len) {
  if (given == 0) return static_cast<int>(view_len);
  if (given < view_len || given > std::numeric_limits<int32_t>::max())
    throw InvalidArgument(std::string(name) + ": expected 0 (the view's length) or a value in [" +
                          std::to_string(view_len) + ", 2^31 - 1] (entries the caller's buffer holds), got " +
                          std::to_string(given));
  return static_cast<int>(given);
}

unsigned grid_stride_blocks(int64_t work, int threads) {
  return static_cast<unsigned>(std::min<int64_t>((work + threads - 1) / threads, 4096));
}

void require_gpu(const char* what) {
  if (!cuda::gpu_available()) throw CudaError(std::string(what) + ": " + cuda::no_gpu_reason());
}

void check_launch(const char* what) {
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) cuda::throw_cuda_error(err, what, __FILE__, __LINE__);
}

void check_q_o_lse(const AttentionSpec& spec, const TensorView& q, const TensorView& o, const TensorView& lse,
                   int64_t num_qo_heads, int64_t rows) {
  check_dim("q", q, 3);
  check_dtype("q", q, spec.q_dtype);
  if (rows >= 0 && q.size(0) != rows)
    throw InvalidArgument("q: expected " + str(rows) + " rows (the lengths of the last plan), got " + str(q.size(0)));
  if (q.size(1) != num_qo_heads) throw InvalidArgument("q: expected " + str(num_qo_heads) + " heads, got " + str(q.size(1)));
  if (q.size(2) != spec.head_dim) throw InvalidArgument("q: expected head_dim " + str(spec.head_dim) + ", got " + str(q.size(2)));
  if (q.size(0) > INT32_MAX) throw InvalidArgument("q: expected fewer than 2^31 rows, got " + str(q.size(0)));
  check_shape("o", o, {q.size(0), q.size(1), spec.vo_dim()});  // o has v's head dim
  check_dtype("o", o, spec.o_dtype);
  if (has(lse)) {
    check_shape("lse", lse, {q.size(0), q.size(1)});
    check_dtype("lse", lse, DType::kFloat32);
    check_contiguous("lse", lse);
  }
  check_cuda_vectors("q", q);
  check_cuda_vectors("o", o);
  check_same_device("q", q, "o", o);
  if (has(lse)) check_same_device("q", q, "lse", lse);
}

void check_paged_storage(const PagedKVStorage& kv, const AttentionSpec& spec, const TaskInfo& task,
                         int64_t max_page_index, const Device& device) {
  if (kv.dtype() != spec.kv_dtype)
    throw TypeMismatch(std::string("kv: expected dtype ") + dtype_name(spec.kv_dtype) + ", got " + dtype_name(kv.dtype()));
  if (kv.num_kv_heads() != task.num_kv_heads)
    throw InvalidArgument("kv: expected " + str(task.num_kv_heads) + " KV heads, got " + str(kv.num_kv_heads()));
  if (kv.head_dim() != spec.head_dim) throw InvalidArgument("kv: expected head_dim " + str(spec.head_dim) + ", got " + str(kv.head_dim()));
  if (kv.v_head_dim() != spec.vo_dim())
    throw InvalidArgument("v: expected head_dim_vo " + str(spec.vo_dim()) + ", got " + str(kv.v_head_dim()));
  if (kv.page_size() != task.page_size)
    throw InvalidArgument("kv: expected page_size " + str(task.page_size) + ", got " + str(kv.page_size()));
  if (kv.layout() != task.layout)
    throw InvalidArgument(std::string("kv: expected layout ") + kv_layout_name(task.layout) + ", got " + kv_layout_name(kv.layout()));
  if (max_page_index >= kv.num_pages())
    throw InvalidArgument("kv_indices: page index " + str(max_page_index) + " is out of range for a cache of " +
                          str(kv.num_pages()) + " pages");
  if (!(kv.device() == device)) throw TypeMismatch("kv: expected device " + device.str() + ", got " + kv.device().str());
  check_cuda_vectors("kv", kv.k());
  check_cuda_vectors("v", kv.v());
}

void check_workspace_device(const Device& device, int workspace_device) {
  if (device.index != workspace_device)
    throw TypeMismatch("q: expected the workspace's device cuda:" + str(workspace_device) + ", got " + device.str());
}

float resolve_sm_scale(double sm_scale, int head_dim) {
  // Kernels take the row maximum of raw scores and scale it afterwards, which
  // needs a positive, finite scale (negative values select the default).
  if (sm_scale == 0 || !std::isfinite(sm_scale))
    throw InvalidArgument("sm_scale: expected a positive finite value (or < 0 for 1/sqrt(head_dim)), got " +
                          std::to_string(sm_scale));
  return sm_scale < 0 ? static_cast<float>(1.0 / std::sqrt(static_cast<double>(head_dim))) : static_cast<float>(sm_scale);
}

float resolve_v_scale(double v_scale) {
  if (!std::isfinite(v_scale) || !std::isfinite(static_cast<float>(v_scale)))
    throw InvalidArgument("v_scale: expected a finite value, got " + std::to_string(v_scale));
  return static_cast<float>(v_scale);
}

namespace {

const float* scale_tensor(const char* name, const TensorView& t, const Device& device, const char* refuse) {
  if (!has(t)) return nullptr;
  if (refuse)
    throw InvalidArgument(std::string(name) + ": scale tensors are not read by " + refuse +
                          " yet; pass the scale as a float (k_scale / v_scale)");
  check_dtype(name, t, DType::kFloat32);
  if (t.numel() != 1) throw InvalidArgument(std::string(name) + ": expected a 1-element tensor, got shape " + t.shape_str());
  check_device(name, t, device);
  return static_cast<const float*>(t.data);
}

}  // namespace

KernelScales resolve_run_scales(const RunOptions& opt, int head_dim, const Device& device, const char* refuse_tensors,
                                bool merges) {
  if (has(opt.merge_lse) && !merges)
    throw InvalidArgument("merge_lse: expected undefined: only the tensor-core kernels (BatchPrefill, BatchDecode "
                          "with tensor cores) merge into o");
  if (opt.pdl_defer_wait && !(merges && opt.pdl && has(opt.merge_lse)))
    throw InvalidArgument("pdl_defer_wait: expected pdl and merge_lse with it, on a tensor-core kernel (it defers the "
                          "wait for the kernel before, a level whose state this run merges into o)");
  if (!(opt.k_scale > 0) || !std::isfinite(opt.k_scale))
    throw InvalidArgument("k_scale: expected a positive finite value, got " + std::to_string(opt.k_scale));
  KernelScales s;
  const double sm = resolve_sm_scale(opt.sm_scale, head_dim) * opt.k_scale;
  if (!(sm > 0) || !std::isfinite(static_cast<float>(sm)))
    throw InvalidArgument("k_scale: the softmax scale times k_scale, " + std::to_string(sm) +
                          ", is not a positive float32");
  s.sm_scale = static_cast<float>(sm);
  s.o_scale = resolve_v_scale(opt.v_scale);
  s.tensors.k = scale_tensor("k_scale_tensor", opt.k_scale_tensor, device, refuse_tensors);
  s.tensors.v = scale_tensor("v_scale_tensor", opt.v_scale_tensor, device, refuse_tensors);
  return s;
}

const float* merge_lse_arg(const RunOptions& opt, const TensorView& o, const TensorView& lse) {
  const TensorView& m = opt.merge_lse;
  if (!has(m)) return nullptr;
  const int64_t rows = o.size(0), heads = o.size(1);
  check_dtype("merge_lse", m, DType::kFloat32);
  check_device("merge_lse", m, o.device);
  check_shape("merge_lse", m, {rows, heads});
  check_contiguous("merge_lse", m);
  if (has(lse)) {
    const char *a = static_cast<const char*>(m.data), *b = static_cast<const char*>(lse.data);
    const int64_t bytes = rows * heads * static_cast<int64_t>(sizeof(float));
    if (a < b + bytes && b < a + bytes)
      throw InvalidArgument("merge_lse: expected memory apart from lse (it is read while lse is written)");
  }
  return static_cast<const float*>(m.data);
}

int page_shift(int page_size) {
  return (page_size & (page_size - 1)) == 0 ? __builtin_ctz(static_cast<unsigned>(page_size)) : -1;
}

// CTAs of a persistent grid: the SMs used times CTAs per SM.
static int grid_ctas(int num_sms, int ctas_per_sm, int max_sms) {
  return std::max(1, (max_sms > 0 ? std::min(max_sms, num_sms) : num_sms) * ctas_per_sm);
}

int ctas_per_head(int num_kv_heads, int num_sms, int ctas_per_sm, int max_sms) {
  return std::max(1, grid_ctas(num_sms, ctas_per_sm, max_sms) / num_kv_heads);
}

HeadGroups head_groups(int num_kv_heads, bool group_heads, int num_sms, int ctas_per_sm, int max_sms) {
  const int ctas = grid_ctas(num_sms, ctas_per_sm, max_sms);
  const int groups = group_heads ? std::gcd(num_kv_heads, ctas) : num_kv_heads;
  return {std::max(1, ctas / groups), groups};
}

PersistentKernel load_persistent(const jit::KernelSource& src, int device, int threads, int smem_bytes,
                                 int ctas_per_sm_cap, int num_kv_heads, int max_sms, const char* what) {
  require_gpu(what);
  cuda::DeviceGuard guard(device);
  PersistentKernel pk;
  pk.kernel = &jit::KernelCache::global().kernel(src, device);
  pk.kernel->set_max_dynamic_smem(smem_bytes);
  int occ = 0;
  TESSERA_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(
      &occ, reinterpret_cast<const void*>(pk.kernel->handle()), threads, smem_bytes));
  if (occ < 1) throw CudaError(std::string(what) + ": the kernel cannot run with its tile configuration on this GPU");
  pk.ctas_per_sm = std::min(occ, ctas_per_sm_cap);
  pk.ctas_per_head = ctas_per_head(num_kv_heads, cuda::device_info(device).sm_count, pk.ctas_per_sm, max_sms);
  return pk;
}

int max_active_clusters(const jit::LoadedKernel& kernel, int threads, int smem_bytes, int cluster) {
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = dim3(cluster);
  cfg.blockDim = dim3(threads);
  cfg.dynamicSmemBytes = smem_bytes;
  int n = 0;
  TESSERA_CUDA_CHECK(cudaOccupancyMaxActiveClusters(&n, reinterpret_cast<const void*>(kernel.handle()), &cfg));
  return n;
}

void check_workspace_size(const Workspace& ws, size_t device_bytes, size_t host_bytes) {
  if (ws.device_bytes() < device_bytes || ws.host_bytes() < host_bytes)
    throw InvalidArgument("workspace: expected at least " + str(device_bytes) + " device bytes and " + str(host_bytes) +
                          " pinned host bytes, got " + str(ws.device_bytes()) + " and " + str(ws.host_bytes()));
}

}  // namespace tessera::detail
