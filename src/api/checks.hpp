// Validation shared by the API entry points (internal header).
#pragma once
#include <cstdint>
#include <string>

#include "tessera/abi/kv_view.cuh"
#include "tessera/api/attention.hpp"
#include "tessera/api/workspace.hpp"
#include "tessera/runtime/jit.hpp"
#include "tessera/core/tensor.hpp"
#include "tessera/formats/paged_kv.hpp"
#include "tessera/runtime/cuda.hpp"
#include "tessera/runtime/kernel_catalog.hpp"

namespace tessera::detail {

inline std::string str(int64_t v) { return std::to_string(v); }

// A CUDA tensor whose rows are 16-byte aligned vectors: last dim contiguous,
// data pointer and every other stride 16-byte aligned.
void check_cuda_vectors(const char* name, const TensorView& t);

// A 1-D contiguous int32 tensor on `dev` with fewer than 2^31 entries.
void check_index_vector(const char* name, const TensorView& t, const Device& dev);

// How far a page-table kernel may read one table: `given` (0: the view's
// own length `view_len`), at least view_len and at most 2^31 - 1, else
// InvalidArgument naming the option `name`.
int table_bound(const char* name, int64_t given, int64_t view_len);

// Blocks of a grid-stride kernel over `work` items, `threads` per block:
// enough for the work, at most 4096 (several waves on any current GPU keep a
// copy-like kernel bandwidth-bound; the loop covers the rest).
unsigned grid_stride_blocks(int64_t work, int threads);

void require_gpu(const char* what);
void check_launch(const char* what);

// (v_out, s_out) = (v_a, s_a) (+) (v_b, s_b) on the GPU for the rows whose
// mask byte is non-zero (the others untouched); v_out may alias v_a, and may
// be fp16 / bf16 where the states are fp32 (merge.cpp; CascadeAttention).
void merge_state_into(const TensorView& v_a, const TensorView& s_a, const TensorView& v_b, const TensorView& s_b,
                      const TensorView& v_out, const TensorView& s_out, const TensorView& mask, cudaStream_t stream,
                      bool pdl = false);

// q [rows, num_qo_heads, head_dim] of spec.q_dtype, o like q of spec.o_dtype,
// lse [rows, num_qo_heads] float32 (or undefined), all CUDA, one device.
// rows < 0: any number of rows. Shapes and dtypes are checked before devices,
// so the most specific complaint wins.
void check_q_o_lse(const AttentionSpec& spec, const TensorView& q, const TensorView& o, const TensorView& lse,
                   int64_t num_qo_heads, int64_t rows = -1);

// Paged KV storage against the task (dtype, heads, head_dim, page size,
// layout), the largest page index a plan names, and q's device.
void check_paged_storage(const PagedKVStorage& kv, const AttentionSpec& spec, const TaskInfo& task,
                         int64_t max_page_index, const Device& device);

// The workspace's device must be the tensors'.
void check_workspace_device(const Device& device, int workspace_device);

// 1/sqrt(head_dim) when sm_scale < 0.
float resolve_sm_scale(double sm_scale, int head_dim);
// RunOptions::v_scale as the kernels' o_scale (finite, else InvalidArgument).
float resolve_v_scale(double v_scale);

// A run's scales as a kernel takes them: sm_scale (resolve_sm_scale) times
// k_scale, o_scale = v_scale, and the scale tensors (1-element float32 CUDA
// tensors on `device`). `refuse_tensors`: the kernel family (named there)
// reads no scale tensors, so given ones are refused (InvalidArgument).
struct KernelScales {
  float sm_scale = 1.f, o_scale = 1.f;
  device::KVScaleTensors tensors;
};
KernelScales resolve_run_scales(const RunOptions& opt, int head_dim, const Device& device,
                                const char* refuse_tensors = nullptr, bool merges = false);
// RunOptions::merge_lse checked against o and lse (InvalidArgument naming
// merge_lse): its data, or null when undefined.
const float* merge_lse_arg(const RunOptions& opt, const TensorView& o, const TensorView& lse);
// log2(page_size) when a power of two, else -1 (kernels then divide).
int page_shift(int page_size);

inline bool has(const TensorView& t) { return t.defined() && t.data != nullptr; }

// CTA columns per KV head of a persistent grid: the SMs used (all, or at most
// max_sms > 0) times CTAs per SM, shared by the KV heads (grid.y).
int ctas_per_head(int num_kv_heads, int num_sms, int ctas_per_sm, int max_sms);

// Prefill's grid: ctas_per_group x groups CTAs (grid.y = group). One plan
// per head (group_heads false: groups = num_kv_heads) leaves sms *
// ctas_per_sm % num_kv_heads SMs idle (4 of an H100's 132 for 8, 16 or 32
// heads); gcd(num_kv_heads, CTAs) groups of num_kv_heads / groups heads each
// use them all, every group running the same plan over (request, head of the
// group) pairs.
struct HeadGroups {
  int ctas_per_group = 0, groups = 0;
};
HeadGroups head_groups(int num_kv_heads, bool group_heads, int num_sms, int ctas_per_sm, int max_sms);

struct PersistentKernel {
  const jit::LoadedKernel* kernel = nullptr;
  int ctas_per_head = 0;
  int ctas_per_sm = 0;  // from the occupancy, capped
};
// Loads `src` on `device`, raises its shared-memory limit (static shared
// memory counts against the 48 KB default too) and sizes the persistent grid
// from its occupancy, at most ctas_per_sm_cap CTAs per SM.
PersistentKernel load_persistent(const jit::KernelSource& src, int device, int threads, int smem_bytes,
                                 int ctas_per_sm_cap, int num_kv_heads, int max_sms, const char* what);
// How many clusters of a kernel compiled with __cluster_dims__ can be resident
// at once (clusters need their CTAs on SMs of one GPC, so fewer than
// SMs / cluster size may fit): a persistent grid must not exceed it.
int max_active_clusters(const jit::LoadedKernel& kernel, int threads, int smem_bytes, int cluster);

// The workspace must hold a wrapper's sections: throws InvalidArgument otherwise.
void check_workspace_size(const Workspace& ws, size_t device_bytes, size_t host_bytes);

// The largest k in [0, hi] with fits(k), where fits(0) holds and fits stays
// false once false (a layout's size grows with its partial rows): how many
// partial rows a caller's workspace holds.
template <typename Fits>
int64_t largest_fitting(int64_t hi, Fits fits) {
  int64_t lo = 0;
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo + 1) / 2;
    if (fits(mid)) lo = mid;
    else hi = mid - 1;
  }
  return lo;
}

}  // namespace tessera::detail
