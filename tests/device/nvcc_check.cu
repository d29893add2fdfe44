// Compiled by nvcc at build time (never run): instantiates every device
// template the JIT instantiates, so nvcc and NVRTC both accept the sources.
#include "tessera/device/kernels/attention_rowwise.cuh"
#include "tessera/device/kernels/merge_states.cuh"

namespace {
struct StandardAttention : tessera::VariantBase {
  using tessera::VariantBase::VariantBase;
};
struct CausalAttention : tessera::VariantBase {
  using tessera::VariantBase::VariantBase;
  template <typename Params>
  __device__ bool LogitsMask(const Params&, int, int qo_idx, int kv_idx, int, int) const {
    return kv_idx <= qo_idx + (kv_len - qo_len);
  }
};
struct NoSoftmax : tessera::VariantBase {
  using tessera::VariantBase::VariantBase;
  static constexpr bool use_softmax = false;
};
using P = tessera::RowwiseParams<tessera::NoExtra>;
}  // namespace

template <typename V, typename T, int D>
__global__ void rowwise(const P p) { tessera::attention_rowwise<V, T, T, T, D, 4>(p); }
template <typename T>
__global__ void merge_pair_k(const tessera::MergePairParams p) { tessera::merge_pair<T>(p); }
template <typename T>
__global__ void merge_many_k(const tessera::MergeManyParams p) { tessera::merge_many<T>(p); }

template __global__ void rowwise<StandardAttention, tessera::half_t, 64>(const P);
template __global__ void rowwise<StandardAttention, tessera::bf16_t, 128>(const P);
template __global__ void rowwise<CausalAttention, tessera::half_t, 256>(const P);
template __global__ void rowwise<NoSoftmax, tessera::bf16_t, 128>(const P);
template __global__ void merge_pair_k<tessera::half_t>(const tessera::MergePairParams);
template __global__ void merge_pair_k<tessera::bf16_t>(const tessera::MergePairParams);
template __global__ void merge_pair_k<float>(const tessera::MergePairParams);
template __global__ void merge_many_k<tessera::half_t>(const tessera::MergeManyParams);
template __global__ void merge_many_k<tessera::bf16_t>(const tessera::MergeManyParams);
template __global__ void merge_many_k<float>(const tessera::MergeManyParams);

// Batch decode: head-group fusion shapes for group sizes 1, 4, 8 and 32.
#include "tessera/device/kernels/decode.cuh"
using DP = tessera::DecodeParams<tessera::NoExtra>;
template <typename V, typename T, int D, int G, int TILE>
__global__ void decode_k(const DP p) { tessera::batch_decode<V, T, T, T, D, G, 128, TILE, 4>(p); }
template __global__ void decode_k<StandardAttention, tessera::half_t, 128, 1, 32>(const DP);
template __global__ void decode_k<StandardAttention, tessera::bf16_t, 64, 4, 64>(const DP);
template __global__ void decode_k<StandardAttention, tessera::half_t, 256, 8, 16>(const DP);
template __global__ void decode_k<NoSoftmax, tessera::half_t, 128, 32, 32>(const DP);

// Paged-KV append: raw 16-byte copies of fp16 and bf16 rows.
#include "tessera/device/kernels/append_kv.cuh"
template <typename T>
__global__ void append_kv_k(const tessera::AppendKVParams p) { tessera::append_paged_kv<T>(p); }
template __global__ void append_kv_k<tessera::half_t>(const tessera::AppendKVParams);
template __global__ void append_kv_k<tessera::bf16_t>(const tessera::AppendKVParams);

// Prefill: the FA2 template's four query tile shapes and the Hopper
// warp-specialized template (two consumer warpgroups, and one with two CTAs
// per SM).
#include "tessera/device/kernels/prefill.cuh"
#include "tessera/device/kernels/prefill_sm90.cuh"
using PP = tessera::PrefillParams<tessera::NoExtra>;
template <typename V, typename T, int D, int CQ, int CKV, int WQ, int WK>
__global__ void prefill_k(const PP p) { tessera::batch_prefill<V, T, T, T, D, CQ, CKV, WQ, WK, 2>(p); }
template <typename V, typename T, int D, int CQ, int CKV, int CTAS>
__global__ void __launch_bounds__(128 * (CQ / 64 + 1), CTAS) prefill_sm90_k(const PP p) {
  tessera::batch_prefill_sm90<V, T, T, T, D, CQ, CKV, 2, CTAS>(p);
}
template __global__ void prefill_sm90_k<CausalAttention, tessera::half_t, 128, 128, 128, 1>(const PP);
template __global__ void prefill_sm90_k<StandardAttention, tessera::bf16_t, 64, 128, 128, 1>(const PP);
template __global__ void prefill_sm90_k<StandardAttention, tessera::half_t, 128, 64, 64, 2>(const PP);
template __global__ void prefill_k<CausalAttention, tessera::half_t, 128, 16, 64, 1, 4>(const PP);
template __global__ void prefill_k<CausalAttention, tessera::half_t, 128, 32, 64, 2, 2>(const PP);
template __global__ void prefill_k<CausalAttention, tessera::half_t, 128, 64, 64, 4, 1>(const PP);
template __global__ void prefill_k<StandardAttention, tessera::bf16_t, 128, 128, 64, 8, 1>(const PP);
template __global__ void prefill_k<StandardAttention, tessera::half_t, 256, 64, 32, 4, 1>(const PP);
template __global__ void prefill_k<StandardAttention, tessera::half_t, 64, 128, 64, 8, 1>(const PP);

// Custom mask (variants::custom_mask(), same code): a LogitsMask reading the
// packed bits through PrefillParams, on both templates.
namespace {
struct CustomMaskAttention : tessera::VariantBase {
  const tessera::u8* mask;
  template <typename Params>
  __device__ __forceinline__ CustomMaskAttention(const Params& p, int batch_idx, int qo_len_, int kv_len_)
      : tessera::VariantBase(p, batch_idx, qo_len_, kv_len_), mask(p.custom_mask + p.mask_indptr[batch_idx]) {}
  template <typename Params>
  __device__ __forceinline__ bool LogitsMask(const Params&, int, int qo_idx, int kv_idx, int, int) const {
    const long long bit = static_cast<long long>(qo_idx) * kv_len + kv_idx;
    return (mask[bit >> 3] >> (bit & 7)) & 1;
  }
};
}  // namespace
template __global__ void prefill_k<CustomMaskAttention, tessera::half_t, 128, 64, 64, 4, 1>(const PP);
template __global__ void prefill_sm90_k<CustomMaskAttention, tessera::bf16_t, 128, 128, 128, 1>(const PP);
