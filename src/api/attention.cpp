#include "tessera/api/attention.hpp"

#include <cmath>
#include <cstring>

#include "checks.hpp"
#include "tessera/abi/rowwise_params.cuh"
#include "tessera/abi/variant_extra.cuh"
#include "tessera/formats/ragged.hpp"
#include "tessera/runtime/variant_params.hpp"

namespace tessera {

using detail::str;

void validate_task(const TaskInfo& task, const AttentionSpec& spec) {
  validate_spec(spec);
  if (task.num_kv_heads < 1) throw InvalidArgument("num_kv_heads: expected >= 1, got " + str(task.num_kv_heads));
  if (task.num_qo_heads < 1) throw InvalidArgument("num_qo_heads: expected >= 1, got " + str(task.num_qo_heads));
  if (task.num_qo_heads % task.num_kv_heads != 0)
    throw InvalidArgument("num_qo_heads: expected a multiple of num_kv_heads (" + str(task.num_kv_heads) + "), got " +
                          str(task.num_qo_heads));
  if (task.page_size < 1) throw InvalidArgument("page_size: expected >= 1, got " + str(task.page_size));
  if (task.max_batch < 0 || task.max_pages < 0)
    throw InvalidArgument("max_batch/max_pages: expected >= 0 (0 = from the first plan)");
}

namespace {

RowwiseParams<NoExtra> rowwise_params(const TensorView& q, const TensorView& o, const TensorView& lse,
                                      const RunOptions& opt, int head_dim) {
  RowwiseParams<NoExtra> p{};
  p.q = q.data;
  p.o = o.data;
  p.lse = lse.defined() && lse.data ? static_cast<float*>(lse.data) : nullptr;
  p.q_stride_n = q.stride(0);
  p.q_stride_h = q.stride(1);
  p.o_stride_n = o.stride(0);
  p.o_stride_h = o.stride(1);
  p.total_q = static_cast<int>(q.size(0));
  p.num_qo_heads = static_cast<int>(q.size(1));
  const detail::KernelScales scales = detail::resolve_run_scales(opt, head_dim, q.device);
  p.sm_scale = scales.sm_scale;
  p.o_scale = scales.o_scale;
  p.kv_scales = scales.tensors;
  return p;
}

// Packs the parameters with the variant's extras (checked even when there
// is nothing to launch) and launches one CTA per (query row, head).
void launch_rowwise(const jit::LoadedKernel& k, const RowwiseParams<NoExtra>& p, const VariantSpec& variant,
                    const RunOptions& opt, const Device& device, cudaStream_t stream) {
  ParamBlock block;
  pack_params(block, ParamsKind::kRowwise, &p, variant, opt.extras, device);
  if (p.total_q == 0) return;
  dim3 grid(static_cast<unsigned>(p.total_q), static_cast<unsigned>(p.num_qo_heads));
  k.launch(grid, dim3(catalog::kRowwiseWarps * 32), 0, stream, block.data());
}

}  // namespace

// ------------------------------------------------------------------ BatchAttention
BatchAttention::BatchAttention(AttentionSpec spec, TaskInfo task, Workspace& workspace)
    : spec_(std::move(spec)), task_(task), ws_(&workspace) {
  validate_task(task_, spec_);
  source_ = catalog::attention_rowwise(spec_);
}

size_t BatchAttention::workspace_bytes(int64_t max_batch, int64_t max_pages) {
  WorkspaceLayout l;
  l.add(sizeof(int32_t) * (max_batch + 1));
  l.add(sizeof(int32_t) * (max_batch + 1));
  l.add(sizeof(int32_t) * max_batch);
  l.add(sizeof(int32_t) * std::max<int64_t>(max_pages, 1));
  return l.total();
}

void BatchAttention::plan(const PagedPlanInput& in, cudaStream_t stream) {
  // Host-side validation first: a bad plan must not touch the workspace.
  if (in.qo_indptr.size() < 1) throw InvalidArgument("qo_indptr: expected at least one element (batch + 1), got 0");
  const int64_t batch = static_cast<int64_t>(in.qo_indptr.size()) - 1;
  validate_indptr("qo_indptr", in.qo_indptr);
  if (static_cast<int64_t>(in.kv_indptr.size()) != batch + 1)
    throw InvalidArgument("kv_indptr: expected " + str(batch + 1) + " elements (like qo_indptr), got " +
                          str(static_cast<int64_t>(in.kv_indptr.size())));
  // The storage size is only known at run(): here indices must be >= 0; run()
  // checks the largest against the cache it is given.
  PageTable table({in.kv_indptr.begin(), in.kv_indptr.end()}, {in.kv_indices.begin(), in.kv_indices.end()},
                  {in.kv_last_page_len.begin(), in.kv_last_page_len.end()}, task_.page_size, INT32_MAX);
  const int64_t n_indices = static_cast<int64_t>(in.kv_indices.size());
  if (in.qo_indptr.back() > INT32_MAX) throw InvalidArgument("qo_indptr: total rows must be < 2^31");

  if (batch_ < 0) {  // first plan fixes the workspace sections
    if (task_.max_batch == 0) task_.max_batch = batch;
    if (task_.max_pages == 0) task_.max_pages = std::max<int64_t>(n_indices, 1);
    WorkspaceLayout l;
    off_qo_indptr_ = l.add(sizeof(int32_t) * (task_.max_batch + 1));
    off_kv_indptr_ = l.add(sizeof(int32_t) * (task_.max_batch + 1));
    off_last_ = l.add(sizeof(int32_t) * task_.max_batch);
    off_indices_ = l.add(sizeof(int32_t) * task_.max_pages);
    ws_bytes_ = l.total();
    if (ws_->device_bytes() < ws_bytes_ || ws_->host_bytes() < ws_bytes_)
      throw InvalidArgument("workspace: expected at least " + str(ws_bytes_) + " bytes (device and pinned host) for max_batch=" +
                            str(task_.max_batch) + ", max_pages=" + str(task_.max_pages) + ", got " +
                            str(ws_->device_bytes()) + " device and " + str(ws_->host_bytes()) + " host bytes");
  }
  if (batch > task_.max_batch)
    throw InvalidArgument("qo_indptr: batch size " + str(batch) + " exceeds the workspace bound max_batch=" +
                          str(task_.max_batch) + " fixed at the first plan()");
  if (n_indices > task_.max_pages)
    throw InvalidArgument("kv_indices: " + str(n_indices) + " pages exceed the workspace bound max_pages=" +
                          str(task_.max_pages) + " fixed at the first plan()");

  if (!kernel_) {
    detail::require_gpu("BatchAttention::plan");
    kernel_ = &jit::KernelCache::global().kernel(source_, ws_->device());
  }
  ws_->stage_begin();
  auto* host = static_cast<char*>(ws_->host_ptr());
  std::memcpy(host + off_qo_indptr_, in.qo_indptr.data(), sizeof(int32_t) * (batch + 1));
  std::memcpy(host + off_kv_indptr_, in.kv_indptr.data(), sizeof(int32_t) * (batch + 1));
  std::memcpy(host + off_last_, in.kv_last_page_len.data(), sizeof(int32_t) * batch);
  std::memcpy(host + off_indices_, in.kv_indices.data(), sizeof(int32_t) * n_indices);
  ws_->upload(ws_bytes_, stream);

  batch_ = batch;
  total_q_ = in.qo_indptr.back();
  max_page_index_ = -1;
  for (int32_t p : in.kv_indices) max_page_index_ = std::max<int64_t>(max_page_index_, p);
}

void BatchAttention::run(const TensorView& q, const PagedKVStorage& kv, const TensorView& o, const TensorView& lse,
                         cudaStream_t stream, const RunOptions& opt) const {
  if (batch_ < 0) throw InvalidArgument("run: expected plan() to be called first");
  detail::check_q_o_lse(spec_, q, o, lse, task_.num_qo_heads, total_q_);
  detail::check_paged_storage(kv, spec_, task_, max_page_index_, q.device);
  detail::check_workspace_device(q.device, ws_->device());

  auto p = rowwise_params(q, o, lse, opt, spec_.head_dim);
  auto* dev = static_cast<char*>(ws_->device_ptr());
  p.qo_indptr = reinterpret_cast<const int*>(dev + off_qo_indptr_);
  p.batch_size = static_cast<int>(batch_);
  p.kv = {kv.k().data, kv.v().data,
          reinterpret_cast<const int*>(dev + off_kv_indptr_),
          reinterpret_cast<const int*>(dev + off_indices_),
          reinterpret_cast<const int*>(dev + off_last_),
          kv.page_stride(), kv.head_stride(), kv.token_stride(), kv.page_size(), kv.num_kv_heads(), 0};
  if (batch_ == 0) return;
  cuda::DeviceGuard guard(ws_->device());
  launch_rowwise(*kernel_, p, spec_.variant, opt, q.device, stream);
  detail::check_launch("BatchAttention::run");
}

// ------------------------------------------------------------------ single_decode
void single_decode(const AttentionSpec& spec, const TensorView& q, const TensorView& k, const TensorView& v,
                   KVLayout layout, const TensorView& o, const TensorView& lse, cudaStream_t stream,
                   const RunOptions& opt) {
  validate_spec(spec);
  check_dim("q", q, 2);
  check_dim("k", k, 3);
  check_shape("v", v, {k.size(0), k.size(1), k.size(2)});
  check_dtype("k", k, spec.kv_dtype);
  check_dtype("v", v, spec.kv_dtype);
  if (k.stride(0) != v.stride(0) || k.stride(1) != v.stride(1))
    throw InvalidArgument("v: expected the same strides as k");
  const int64_t kv_len = layout == KVLayout::kNHD ? k.size(0) : k.size(1);
  const int64_t num_kv_heads = layout == KVLayout::kNHD ? k.size(1) : k.size(0);
  if (k.size(2) != spec.head_dim) throw InvalidArgument("k: expected head_dim " + str(spec.head_dim) + ", got " + str(k.size(2)));
  if (num_kv_heads < 1 || q.size(0) % num_kv_heads != 0)
    throw InvalidArgument("q: expected a number of heads that is a multiple of the KV heads (" + str(num_kv_heads) + "), got " +
                          str(q.size(0)));
  if (kv_len > INT32_MAX) throw InvalidArgument("k: expected fewer than 2^31 tokens");
  // View q/o [Hq, D] as one row: [1, Hq, D].
  TensorView q3(q.data, q.dtype, q.device, {1, q.size(0), q.size(1)}, {q.size(0) * q.stride(0), q.stride(0), q.stride(1)});
  check_dim("o", o, 2);
  TensorView o3(o.data, o.dtype, o.device, {1, o.size(0), o.size(1)}, {o.size(0) * o.stride(0), o.stride(0), o.stride(1)});
  TensorView lse2;
  if (lse.defined() && lse.data) {
    check_dim("lse", lse, 1);
    lse2 = TensorView(lse.data, lse.dtype, lse.device, {1, lse.size(0)});
  }
  detail::check_q_o_lse(spec, q3, o3, lse2, q.size(0));
  detail::check_cuda_vectors("k", k);
  detail::check_cuda_vectors("v", v);
  check_same_device("q", q, "k", k);
  check_same_device("q", q, "v", v);
  detail::require_gpu("single_decode");
  cuda::DeviceGuard guard(q.device.index);
  const auto& kernel = jit::KernelCache::global().kernel(catalog::attention_rowwise(spec), q.device.index);
  auto p = rowwise_params(q3, o3, lse2, opt, spec.head_dim);
  p.qo_indptr = nullptr;
  p.batch_size = 1;
  const int64_t token_stride = layout == KVLayout::kNHD ? k.stride(0) : k.stride(1);
  const int64_t head_stride = layout == KVLayout::kNHD ? k.stride(1) : k.stride(0);
  p.kv = {k.data, v.data, nullptr, nullptr, nullptr, 0, head_stride, token_stride,
          static_cast<int>(std::max<int64_t>(kv_len, 1)), static_cast<int>(num_kv_heads), static_cast<int>(kv_len)};
  launch_rowwise(kernel, p, spec.variant, opt, q.device, stream);
  detail::check_launch("single_decode");
}

}  // namespace tessera
