// Compiled by nvcc at build time (never run): instantiates every device
// template the JIT instantiates, so nvcc and NVRTC both accept the sources.
// The host/device ABI headers come first, each on its own.
#include "tessera/abi/append_kv_params.cuh"
#include "tessera/abi/decode_params.cuh"
#include "tessera/abi/kv_view.cuh"
#include "tessera/abi/mask_trim_params.cuh"
#include "tessera/abi/merge_params.cuh"
#include "tessera/abi/prefill_params.cuh"
#include "tessera/abi/rope_params.cuh"
#include "tessera/abi/rowwise_params.cuh"
#include "tessera/abi/shared_memory.cuh"
#include "tessera/abi/tensor_map.cuh"
#include "tessera/abi/types.cuh"
#include "tessera/abi/variant_extra.cuh"
#include "tessera/device/kernels/decode/rowwise.cuh"
#include "tessera/device/kernels/merge/merge_states.cuh"

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
__global__ void merge_pair_flat_k(const tessera::MergePairParams p) { tessera::merge_pair<T, T, 1, true>(p); }
template <typename T>
__global__ void merge_many_k(const tessera::MergeManyParams p) { tessera::merge_many<T>(p); }

template __global__ void rowwise<StandardAttention, tessera::half_t, 64>(const P);
template __global__ void rowwise<StandardAttention, tessera::bf16_t, 128>(const P);
template __global__ void rowwise<CausalAttention, tessera::half_t, 256>(const P);
template __global__ void rowwise<NoSoftmax, tessera::bf16_t, 128>(const P);
// fp8 KV caches (2-, 4- and 8-byte fp8 vectors).
template <typename V, typename T, typename KV, int D>
__global__ void rowwise_fp8(const P p) { tessera::attention_rowwise<V, T, KV, T, D, 4>(p); }
template __global__ void rowwise_fp8<StandardAttention, tessera::half_t, tessera::fp8_e4m3_t, 64>(const P);
template __global__ void rowwise_fp8<CausalAttention, tessera::bf16_t, tessera::fp8_e5m2_t, 128>(const P);
template __global__ void rowwise_fp8<StandardAttention, tessera::half_t, tessera::fp8_e5m2_t, 256>(const P);
template __global__ void merge_pair_k<tessera::half_t>(const tessera::MergePairParams);
template __global__ void merge_pair_k<tessera::bf16_t>(const tessera::MergePairParams);
template __global__ void merge_pair_k<float>(const tessera::MergePairParams);
template __global__ void merge_pair_flat_k<tessera::half_t>(const tessera::MergePairParams);
template __global__ void merge_many_k<tessera::half_t>(const tessera::MergeManyParams);
template __global__ void merge_many_k<tessera::bf16_t>(const tessera::MergeManyParams);
template __global__ void merge_many_k<float>(const tessera::MergeManyParams);

// Batch decode: head-group fusion shapes for group sizes 1, 4, 8 and 32.
#include "tessera/device/kernels/decode/kernel.cuh"
using DP = tessera::DecodeParams<tessera::NoExtra>;
template <typename V, typename T, int D, int G, int TILE>
__global__ void decode_k(const DP p) { tessera::batch_decode<V, T, T, T, D, G, 128, TILE, 4>(p); }
template __global__ void decode_k<StandardAttention, tessera::half_t, 128, 1, 32>(const DP);
template __global__ void decode_k<StandardAttention, tessera::bf16_t, 64, 4, 64>(const DP);
template __global__ void decode_k<StandardAttention, tessera::half_t, 256, 8, 16>(const DP);
template __global__ void decode_k<NoSoftmax, tessera::half_t, 128, 32, 32>(const DP);
// fp8 KV: 16 features a lane, 16-bit q / o.
template <typename V, typename T, typename KV, int D, int G, int TILE>
__global__ void decode_fp8_k(const DP p) { tessera::batch_decode<V, T, KV, T, D, G, 128, TILE, 2>(p); }
template __global__ void decode_fp8_k<StandardAttention, tessera::half_t, tessera::fp8_e4m3_t, 128, 4, 64>(const DP);
template __global__ void decode_fp8_k<StandardAttention, tessera::bf16_t, tessera::fp8_e5m2_t, 64, 1, 128>(const DP);
template __global__ void decode_fp8_k<StandardAttention, tessera::half_t, tessera::fp8_e5m2_t, 256, 8, 32>(const DP);

// Paged-KV append: raw 16-byte copies of fp16, bf16 and fp8 rows; 16-bit
// rows quantized into fp8 caches.
#include "tessera/device/kernels/page/append_kv.cuh"
template <typename T>
__global__ void append_kv_k(const tessera::AppendKVParams p) { tessera::append_paged_kv<T>(p); }
template __global__ void append_kv_k<tessera::half_t>(const tessera::AppendKVParams);
template __global__ void append_kv_k<tessera::bf16_t>(const tessera::AppendKVParams);
template __global__ void append_kv_k<tessera::fp8_e4m3_t>(const tessera::AppendKVParams);
template <typename T, typename C>
__global__ void append_q_k(const tessera::AppendKVParams p) { tessera::append_paged_kv_quantize<T, C>(p); }
template __global__ void append_q_k<tessera::half_t, tessera::fp8_e4m3_t>(const tessera::AppendKVParams);
template __global__ void append_q_k<tessera::bf16_t, tessera::fp8_e5m2_t>(const tessera::AppendKVParams);

// Prefill: the FA2 template's four query tile shapes and the Hopper
// warp-specialized template (two consumer warpgroups, and one with two CTAs
// per SM).
#include "tessera/device/kernels/prefill_sm80/kernel.cuh"
#include "tessera/device/kernels/prefill_sm90/kernel.cuh"
using PP = tessera::PrefillParams<tessera::NoExtra>;
template <typename V, typename T, int D, int CQ, int CKV, int WQ, int WK, int DV = D>
__global__ void prefill_k(const PP p) { tessera::batch_prefill<V, T, T, T, D, DV, CQ, CKV, WQ, WK, 2>(p); }
template <typename V, typename T, int D, int CQ, int CKV, int CTAS>
__global__ void __launch_bounds__(128 * (CQ / 64 + 1), CTAS) prefill_sm90_k(const PP p,
                                                                           const __grid_constant__ tessera::Sm90TensorMaps tma) {
  tessera::batch_prefill_sm90<V, T, T, T, D, CQ, CKV, 2, 3, 1, CTAS, 1>(p, tma);
}
// The CTA-pair kernel (TMA multicast of K / V within a cluster of 2;
// clusters exist from sm_90).
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
#define TESSERA_PAIR_DIMS
#else
#define TESSERA_PAIR_DIMS __cluster_dims__(2, 1, 1)
#endif
__global__ void TESSERA_PAIR_DIMS __launch_bounds__(384, 1)
    prefill_sm90_pair_k(const PP p, const __grid_constant__ tessera::Sm90TensorMaps tma) {
  tessera::batch_prefill_sm90<CausalAttention, tessera::half_t, tessera::half_t, tessera::half_t, 128, 128, 128, 2, 3, 1, 1, 2>(
      p, tma);
}
template __global__ void prefill_sm90_k<CausalAttention, tessera::half_t, 128, 128, 128, 1>(const PP, const __grid_constant__ tessera::Sm90TensorMaps);
template __global__ void prefill_sm90_k<StandardAttention, tessera::bf16_t, 64, 128, 128, 1>(const PP, const __grid_constant__ tessera::Sm90TensorMaps);
template __global__ void prefill_sm90_k<StandardAttention, tessera::half_t, 128, 64, 64, 2>(const PP, const __grid_constant__ tessera::Sm90TensorMaps);
// An fp8 cache on the Hopper template (staged and widened by the producer).
template <typename V, typename T, typename KV, int D, int CQ, int CKV, int VS, int CTAS>
__global__ void __launch_bounds__(128 * (CQ / 64 + 1), CTAS) prefill_sm90_fp8_k(
    const PP p, const __grid_constant__ tessera::Sm90TensorMaps tma) {
  tessera::batch_prefill_sm90<V, T, KV, T, D, CQ, CKV, 2, VS, 1, CTAS, 1>(p, tma);
}
template __global__ void prefill_sm90_fp8_k<CausalAttention, tessera::half_t, tessera::fp8_e4m3_t, 128, 128, 128, 2, 1>(
    const PP, const __grid_constant__ tessera::Sm90TensorMaps);
template __global__ void prefill_sm90_fp8_k<StandardAttention, tessera::bf16_t, tessera::fp8_e5m2_t, 128, 64, 64, 2, 2>(
    const PP, const __grid_constant__ tessera::Sm90TensorMaps);
// fp8 tensor cores (PrefillOptions::fp8_mma): q and P quantized, K and V^T fp8 stages.
template <typename V, typename T, typename KV, int CQ>
__global__ void __launch_bounds__(128 * (CQ / 64 + 1), 1) prefill_sm90_fp8_mma_k(
    const PP p, const __grid_constant__ tessera::Sm90TensorMaps tma) {
  tessera::batch_prefill_sm90<V, T, KV, T, 128, CQ, 128, 2, 2, 1, 1, 1, true>(p, tma);
}
template __global__ void prefill_sm90_fp8_mma_k<CausalAttention, tessera::half_t, tessera::fp8_e4m3_t, 128>(
    const PP, const __grid_constant__ tessera::Sm90TensorMaps);
template __global__ void prefill_sm90_fp8_mma_k<StandardAttention, tessera::bf16_t, tessera::fp8_e5m2_t, 64>(
    const PP, const __grid_constant__ tessera::Sm90TensorMaps);
template __global__ void prefill_k<CausalAttention, tessera::half_t, 128, 16, 64, 1, 4>(const PP);
template __global__ void prefill_k<CausalAttention, tessera::half_t, 128, 32, 64, 2, 2>(const PP);
template __global__ void prefill_k<CausalAttention, tessera::half_t, 128, 64, 64, 4, 1>(const PP);
template __global__ void prefill_k<StandardAttention, tessera::bf16_t, 128, 128, 64, 8, 1>(const PP);
template __global__ void prefill_k<StandardAttention, tessera::half_t, 256, 64, 32, 4, 1>(const PP);
template __global__ void prefill_k<StandardAttention, tessera::half_t, 64, 128, 64, 8, 1>(const PP);
// Unequal head dims: DeepSeek's 192 / 128, and the 512 / 256 kernel head dim
// 512 runs twice.
template __global__ void prefill_k<CausalAttention, tessera::half_t, 192, 64, 64, 4, 1, 128>(const PP);
template __global__ void prefill_k<StandardAttention, tessera::bf16_t, 192, 16, 64, 1, 4, 128>(const PP);
template __global__ void prefill_k<CausalAttention, tessera::half_t, 512, 16, 64, 1, 4, 256>(const PP);
template __global__ void prefill_k<StandardAttention, tessera::bf16_t, 512, 128, 16, 8, 1, 256>(const PP);

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
template __global__ void prefill_sm90_k<CustomMaskAttention, tessera::bf16_t, 128, 128, 128, 1>(const PP, const __grid_constant__ tessera::Sm90TensorMaps);

// Variant extras and pairwise Q/K transforms (fused RoPE): decode and the
// row-wise kernel apply them in registers, the tile helpers in shared memory
// (what the prefill kernels call), on both swizzled layouts; the standalone
// RoPE kernel shares the rotation math.
#include "tessera/device/kernels/page/rope.cuh"
namespace {
struct alignas(8) RopeExtra {
  float rope_scale, rope_theta;
};
struct PairRope : tessera::VariantBase {
  static constexpr tessera::Pairing pairing = tessera::Pairing::kHalves;
  tessera::RopeFreqs freqs;
  template <typename Params>
  __device__ PairRope(const Params& p, int b, int qo_len_, int kv_len_)
      : tessera::VariantBase(p, b, qo_len_, kv_len_), freqs(p.extra.rope_scale, p.extra.rope_theta, 128) {}
  template <typename Params>
  __device__ float QueryTransform(const Params&, float q, float partner, int, int qo_idx, int, int feat) const {
    return tessera::rope_rotate<false>(freqs, q, partner, qo_idx + kv_len - qo_len, feat, 128);
  }
  template <typename Params>
  __device__ float KeyTransform(const Params&, float k, float partner, int, int kv_idx, int, int feat) const {
    return tessera::rope_rotate<false>(freqs, k, partner, kv_idx, feat, 128);
  }
};
struct ScaleV : tessera::VariantBase {
  using tessera::VariantBase::VariantBase;
  template <typename Params>
  __device__ float ValueTransform(const Params&, float v, int, int, int, int) const { return 2.f * v; }
};
using DPR = tessera::DecodeParams<RopeExtra>;
using RPR = tessera::RowwiseParams<RopeExtra>;
using PPR = tessera::PrefillParams<RopeExtra>;
}  // namespace
static_assert(tessera::VariantTraits<PairRope, DPR>::query_transform && tessera::VariantTraits<PairRope, DPR>::key_transform,
              "pair-form overrides are detected");
static_assert(!tessera::VariantTraits<PairRope, DPR>::value_transform && !tessera::VariantTraits<PairRope, DPR>::logits_mask,
              "slots a pair variant does not override stay off");
static_assert(!tessera::VariantTraits<StandardAttention, DP>::query_transform &&
                  !tessera::VariantTraits<StandardAttention, DP>::key_transform,
              "the base's element and pair forms are not overrides");
static_assert(tessera::VariantTraits<ScaleV, DP>::value_transform && !tessera::VariantTraits<ScaleV, DP>::key_transform,
              "element-form overrides are detected");
template <typename V, typename T>
__global__ void decode_pair_k(const DPR p) { tessera::batch_decode<V, T, T, T, 128, 4, 128, 32, 2>(p); }
template __global__ void decode_pair_k<PairRope, tessera::half_t>(const DPR);
template __global__ void decode_pair_k<PairRope, tessera::bf16_t>(const DPR);
__global__ void rowwise_pair_k(const RPR p) { tessera::attention_rowwise<PairRope, tessera::half_t, tessera::half_t, tessera::half_t, 128, 4>(p); }
template <template <int, int> class Layout>
__global__ void tile_transforms_k(const PPR p, int tid, int nthreads) {
  __shared__ __align__(1024) tessera::half_t tile[64 * 128];
  const PairRope v(p, 0, 64, 64);
  tessera::transform_q_tile<PairRope, 128, 64, Layout>(v, p, tile, tid, nthreads, 0, 32, 0, 0, 1, 0, 64);
  tessera::transform_kv_tile<PairRope, true, 128, 64, Layout>(v, p, tile, tid, nthreads, 0, 64, 0, 0, 64, 0);
  tessera::transform_kv_tile<PairRope, false, 128, 64, Layout>(v, p, tile, tid, nthreads, 32, 64, 0, 0, 64, 0);
}
template __global__ void tile_transforms_k<tessera::RowSwizzle>(const PPR, int, int);
template __global__ void tile_transforms_k<tessera::Swizzle128>(const PPR, int, int);
template <typename T, int D, bool IL, tessera::RopeMode M>
__global__ void rope_k(const tessera::RopeParams p) { tessera::apply_rope<T, D, IL, M>(p); }
template __global__ void rope_k<tessera::half_t, 128, false, tessera::RopeMode::kLinear>(const tessera::RopeParams);
template __global__ void rope_k<tessera::bf16_t, 64, true, tessera::RopeMode::kLinear>(const tessera::RopeParams);
template __global__ void rope_k<tessera::half_t, 256, true, tessera::RopeMode::kLlama31>(const tessera::RopeParams);
template __global__ void rope_k<tessera::bf16_t, 128, false, tessera::RopeMode::kCosSinCache>(const tessera::RopeParams);
template __global__ void rope_k<tessera::half_t, 64, true, tessera::RopeMode::kCosSinCache>(const tessera::RopeParams);

// The built-in variants (device/variants/*.cuh, what the JIT includes by
// name): each instantiated in a kernel over a parameter block carrying every
// built-in's extras, so nvcc type-checks the structs and their slots.
#include "tessera/device/variants/alibi.cuh"
#include "tessera/device/variants/attention_sink.cuh"
#include "tessera/device/variants/causal.cuh"
#include "tessera/device/variants/custom_mask.cuh"
#include "tessera/device/variants/flash_sigmoid.cuh"
#include "tessera/device/variants/rope.cuh"
#include "tessera/device/variants/sliding_window.cuh"
#include "tessera/device/variants/soft_cap.cuh"
#include "tessera/device/variants/standard.cuh"
namespace {
struct alignas(8) BuiltinExtras {
  const float* alibi_slopes;
  float sigmoid_scale, sigmoid_bias;
  int sink_size, window_left;
  float rope_scale, rope_theta;
};
using RPB = tessera::RowwiseParams<BuiltinExtras>;
namespace tv = tessera::variants;
}  // namespace
static_assert(tv::float_from_bits(0x41f00000u) == 30.f && tv::float_from_bits(0x3a83126fu) == 1e-3f &&
                  tv::float_from_bits(0x00000001u) == 1e-45f && tv::float_from_bits(0x7f7fffffu) == 3.4028234663852886e38f,
              "soft cap bits decode exactly (normal, subnormal, largest)");
static_assert(tv::SlidingWindow<64, tv::SoftCap<0x41f00000u>>::window_left == 64 && !tv::FlashSigmoid::use_softmax &&
                  tv::CausalAttention::causal && tv::AttentionSink::causal,
              "declared flags");
static_assert(tessera::VariantTraits<tv::SlidingWindow<64, tv::SoftCap<0x41f00000u>>, RPB>::logits_transform,
              "the composing template keeps its base's slots");
template <typename V>
__global__ void rowwise_builtin_k(const RPB p) { tessera::attention_rowwise<V, tessera::half_t, tessera::half_t, tessera::half_t, 128, 4>(p); }
template __global__ void rowwise_builtin_k<tv::StandardAttention>(const RPB);
template __global__ void rowwise_builtin_k<tv::CausalAttention>(const RPB);
template __global__ void rowwise_builtin_k<tv::SlidingWindow<64, tv::SoftCap<0x41f00000u>>>(const RPB);
template __global__ void rowwise_builtin_k<tv::Alibi>(const RPB);
template __global__ void rowwise_builtin_k<tv::FlashSigmoid>(const RPB);
template __global__ void rowwise_builtin_k<tv::AttentionSink>(const RPB);
template __global__ void rowwise_builtin_k<tv::Rope<tessera::Pairing::kHalves, 128>>(const RPB);
template __global__ void rowwise_builtin_k<tv::Rope<tessera::Pairing::kAdjacent, 128>>(const RPB);
template __global__ void prefill_k<tv::CustomMaskAttention, tessera::bf16_t, 128, 64, 64, 4, 1>(const PP);

// MLA (DeepSeek-style latent attention): the three query-tile shapes, causal
// and not, fp16 and bf16.
#include "tessera/device/kernels/mla/kernel.cuh"
template <typename T, int CQ, bool C>
__global__ void __launch_bounds__(tessera::MlaConfigFor<CQ>::Shape::THREADS, 1) mla_k(const tessera::MlaParams p) {
  tessera::batch_mla<T, T, CQ, C>(p);
}
template __global__ void mla_k<tessera::half_t, 16, false>(const tessera::MlaParams);
template __global__ void mla_k<tessera::bf16_t, 32, true>(const tessera::MlaParams);
template __global__ void mla_k<tessera::half_t, 64, true>(const tessera::MlaParams);

// The Hopper MLA kernel: 64-row, 16-row and pair tiles, 16-bit and fp8 caches.
#include "tessera/device/kernels/mla_sm90/consumer_narrow.cuh"
#include "tessera/device/kernels/mla_sm90/kernel.cuh"
template <typename T, typename DKV, bool C>
__global__ void __launch_bounds__(tessera::kMlaSm90Threads, 1) mla_sm90_k(const tessera::MlaParams p) {
  tessera::batch_mla_sm90<T, DKV, T, C>(p);
}
template __global__ void mla_sm90_k<tessera::half_t, tessera::half_t, false>(const tessera::MlaParams);
template __global__ void mla_sm90_k<tessera::bf16_t, tessera::fp8_e4m3_t, true>(const tessera::MlaParams);
template <typename T, typename DKV, bool C>
__global__ void __launch_bounds__(tessera::is_fp8<DKV> ? tessera::kMlaSm90NarrowFp8Threads
                                                       : tessera::kMlaSm90NarrowThreads,
                                   1) mla_sm90_narrow_k(const tessera::MlaParams p) {
  tessera::batch_mla_sm90_narrow<T, DKV, T, C>(p);
}
template __global__ void mla_sm90_narrow_k<tessera::half_t, tessera::half_t, false>(const tessera::MlaParams);
template __global__ void mla_sm90_narrow_k<tessera::bf16_t, tessera::bf16_t, true>(const tessera::MlaParams);
template __global__ void mla_sm90_narrow_k<tessera::bf16_t, tessera::fp8_e4m3_t, false>(const tessera::MlaParams);
template __global__ void mla_sm90_narrow_k<tessera::half_t, tessera::fp8_e5m2_t, true>(const tessera::MlaParams);
template <typename T, bool C>
__global__ void __launch_bounds__(tessera::kMlaSm90PairThreads, 1) mla_sm90_pair_k(const tessera::MlaParams p) {
  tessera::batch_mla_sm90_narrow<T, T, T, C, 2>(p);
}
template __global__ void mla_sm90_pair_k<tessera::bf16_t, true>(const tessera::MlaParams);

// The device planner (one block per step).
#include "tessera/device/kernels/plan/kernel.cuh"
__global__ void __launch_bounds__(tessera::kDevicePlanThreads) device_plan_k(const tessera::DevicePlanParams p) {
  extern __shared__ __align__(16) char smem[];
  tessera::plan::plan_step(p, smem);
}
