// The kernel catalogue: turns a kernel family + configuration + variant into a
// JIT KernelSource (generated translation unit), and lists every built-in
// kernel so CI and `tessera compile` can precompile them all.
#pragma once
#include <string>
#include <vector>

#include "tessera/abi/rope_params.cuh"
#include "tessera/core/dtype.hpp"
#include "tessera/runtime/jit.hpp"

namespace tessera {

// An extra parameter of a variant: a scalar (float32 or int32) or a tensor
// (any dtype; its device pointer). Values are passed to run() by name (see
// VariantArgs in runtime/variant_params.hpp).
struct ExtraParam {
  std::string name;  // a C++ identifier, unique within the variant
  DType dtype;
  bool operator==(const ExtraParam&) const = default;
};

// A variant: a struct deriving from tessera::VariantBase that overrides any
// functor slots (see device/primitives/variant.cuh), given one of two ways:
// - user code: `code` defines `struct <name> : tessera::VariantBase` (one
//   string, e.g. a file's contents); `headers` and `struct_name` are empty.
// - a built-in: `code` is empty, `headers` names the device headers that
//   define it (embedded for NVRTC, under tessera/device/variants/) and
//   `struct_name` the struct, e.g. "tessera::variants::SoftCap<0x41f00000u>"
//   (a type in the scope of the generated namespace, so it may use kHeadDim).
//
// The JIT turns the extras into `struct Extra` in the variant's namespace:
// the tensors as `const T* <name>` (in order), then the scalars as `float` /
// `int` (in order); the code reads them as params.extra.<name>. It also
// defines `constexpr int kHeadDim`. use_softmax = false or causal = true
// take effect whether the spec or the code says so; the host schedules
// causally (skipping tiles above the diagonal) only when the spec says so.
struct VariantSpec {
  std::string name;  // a C++ identifier: the struct's name in the kernel and in kernel names
  std::string code;
  std::vector<ExtraParam> scalars = {};
  std::vector<ExtraParam> tensors = {};
  bool use_softmax = true;
  bool causal = false;
  // A sliding window the variant's LogitsMask implements (keys >= bottom-right
  // position - window_left), declared so the planners skip the keys left of
  // it instead of loading and masking them; -1: none.
  int window_left = -1;
  // Reads FlashInfer's packed custom mask (PrefillParams::custom_mask; prefill
  // kernels only): custom_mask() and the plan-option variants built on it.
  bool custom_mask = false;
  std::vector<std::string> headers = {};  // built-ins: include names of their device headers
  std::string struct_name = {};           // built-ins: the struct the kernel instantiates
  bool operator==(const VariantSpec&) const = default;
};

namespace variants {
VariantSpec standard();  // plain softmax attention
VariantSpec causal();    // bottom-right aligned causal mask
// The built-ins (device/variants/*.cuh). Specs naming the same struct with
// the same flags and extras compile to the same kernels.
//
// FlashInfer's custom mask: a bit per (query, key) of each request, packed
// (see BatchPrefill::plan_paged / run with a mask). Prefill kernels only.
VariantSpec custom_mask();
// FlashInfer's logits soft cap: logit = cap * tanh(logit / cap), where the
// logit is q.k * sm_scale. `cap` (> 0, finite) is baked into the struct and
// the name (one kernel per value); `causal` adds the bottom-right causal mask.
VariantSpec soft_cap(float cap, bool causal = false);
// FlashInfer's sliding window: a query at bottom-right-aligned position
// p = qo_idx + kv_len - qo_len sees keys kv_idx >= p - window_left (>= 0);
// with `causal` also kv_idx <= p. Baked into the struct and name like soft_cap.
VariantSpec sliding_window(int window_left, bool causal = false);
// The variant FlashInfer's plan() options select: standard() or causal() for
// the defaults (window_left = -1, logits_soft_cap = 0), else the sliding
// window and / or soft cap above, combined in one spec when both are set.
// logits_soft_cap: 0 = off, else finite > 0; window_left: -1 = off, else >= 0.
// pos_encoding: FlashInfer's pos_encoding_mode. kRopeLlama adds rope(false,
// causal)'s fused RoPE (extras rope_scale, rope_theta at run()); kAlibi adds
// FlashInfer's ALiBi bias, slope * (kv_idx - qo_idx) with qo_idx the query's
// index among the request's new tokens (QueryIndexAlibi in
// device/variants/alibi.cuh; extra tensor alibi_slopes float32
// [num_qo_heads]). Either combines with a window and a soft cap (the cap
// applies to the encoded logit). custom_mask: the options apply on top of
// custom_mask() (not with causal: a causal part belongs in the mask).
enum class PosEncoding { kNone, kRopeLlama, kAlibi };
VariantSpec from_plan_options(bool causal, int window_left = -1, float logits_soft_cap = 0.f,
                              PosEncoding pos_encoding = PosEncoding::kNone, bool custom_mask = false);
// True for variants whose spec declares causal (BatchPrefill schedules them
// with causal tile clipping).
bool is_causal(const VariantSpec& v);

// ALiBi (Press et al.): logit += alibi_slopes[qo_head] * (kv_idx - q_pos),
// q_pos = qo_idx + kv_len - qo_len (bottom-right aligned), after sm_scale.
// Extra tensor alibi_slopes: float32 [num_qo_heads] (alibi_slopes() below
// gives the paper's).
VariantSpec alibi(bool causal = false);
// The standard ALiBi slopes of `num_heads` heads: 2^(-8 (h + 1) / n) for a
// power of two n; otherwise those of the nearest lower power of two m,
// followed by every other slope of 2m.
std::vector<float> alibi_slopes(int num_heads);
// FlashSigmoid (Ramapuram et al.): no softmax, o = sum_j sigmoid(logit_j *
// sigmoid_scale + sigmoid_bias) v_j over visible keys (logit = q.k *
// sm_scale), lse reported as 0. Extra float32 scalars sigmoid_scale, sigmoid_bias.
VariantSpec flash_sigmoid(bool causal = false);
// Attention sink (Streaming-LLM): the query at q_pos sees keys kv_idx <
// sink_size and keys q_pos - window_left <= kv_idx, causal (kv_idx <= q_pos).
// Extra int32 scalars sink_size, window_left (>= 0).
VariantSpec attention_sink();
// Fused Llama-style RoPE on q and k before q.k (see device/primitives/rope.cuh):
// q at q_pos = qo_idx + kv_len - qo_len, k at kv_idx, over the whole head
// dimension, pairs half-split (interleave = false) or adjacent. Extra float32
// scalars rope_scale, rope_theta. Every kernel family (the tensor-core
// prefill kernels through the pairwise tile transforms).
VariantSpec rope(bool interleave = false, bool causal = false);
}  // namespace variants

// What a kernel computes: the variant, data types and head dimensions.
// head_dim is q's and k's (head_dim_qk); head_dim_vo v's and o's, 0 (or
// equal) for the same. Unequal dims (FlashInfer's head_dim_qk /
// head_dim_vo): DeepSeek-style prefill, 192 / 128, on the FA2 prefill
// template only.
struct AttentionSpec {
  VariantSpec variant = variants::standard();
  DType q_dtype = DType::kFloat16;
  DType kv_dtype = DType::kFloat16;
  DType o_dtype = DType::kFloat16;
  int head_dim = 128;
  int head_dim_vo = 0;
  int vo_dim() const { return head_dim_vo ? head_dim_vo : head_dim; }
  bool dims_equal() const { return vo_dim() == head_dim; }
  bool operator==(const AttentionSpec&) const = default;
  // e.g. "standard/q=float16/kv=float16/o=float16/d=128" (".../d=192/dvo=128" for unequal dims)
  std::string str() const;
};
// Validates dtypes (q and o fp16/bf16, o also fp32; KV fp16/bf16 or fp8, see
// require_16bit_kv), head dims (supported_head_dims) and the variant (name
// and extras: identifiers, unique, scalar dtypes float32/int32, parameter
// block within the launch limit); throws InvalidArgument / TypeMismatch.
void validate_spec(const AttentionSpec& spec);
// The (head_dim_qk, head_dim_vo) pairs any kernel takes: equal 64, 128, 256
// or 512, and 192 / 128. Which kernel runs which is the catalog's: the
// CUDA-core decode and row-wise kernels take 64 / 128 / 256 (a warp's row
// holds at most 256 16-bit features), the Hopper prefill kernel equal 64 /
// 128 / 256, the FA2 prefill template all of them.
bool supported_head_dims(int head_dim_qk, int head_dim_vo);
constexpr const char* kSupportedHeadDims = "64, 128, 256 or 512 (head_dim_qk = head_dim_vo), or head_dim_qk 192 with head_dim_vo 128";
// Throws InvalidArgument naming `kernel` unless the spec's dims are equal 64,
// 128 or 256 (the kernels other than the FA2 prefill template).
void require_head_dim_up_to_256(const AttentionSpec& spec, const char* kernel);
void validate_variant(const VariantSpec& variant);

// Tile configuration of the batch-decode kernel (see device/kernels/decode*.cuh),
// chosen by decode_config() from head dim, group size and data type.
struct DecodeConfig {
  int min_threads = 128;
  int tile = 32;    // KV tokens per pipeline stage
  int stages = 2;   // pipeline depth
  int heads_per_thread = 4;  // at most this many query heads per thread (abi/shared_memory.cuh)
  int threads = 0;  // derived: the kernel's block size
  int smem_bytes = 0;
  int ctas_per_sm = 0;  // from shared memory and threads (occupancy may lower it)
};

namespace catalog {
constexpr int kRowwiseWarps = 4;
// The translation unit of an attention kernel: includes `header`, puts the
// variant's code in namespace tessera_variant (with #line so compile errors
// point at the user's lines) or, for a built-in, includes its headers and
// names its struct there (`using <name> = <struct_name>;`), and defines the extern "C" entry
// `entry(const params_type<Extra> p)` calling
// `fn<Variant, DQ, DKV, DO, head_dim, template_tail>(p)`; min_blocks > 0 asks
// the compiler to fit that many CTAs per SM (__launch_bounds__).
// second_param: an optional second kernel parameter ("Type name"), passed on
// to fn as its second argument (the Hopper prefill kernel's tensor maps).
// cluster > 1: the kernel runs in clusters of that many CTAs along x
// (__cluster_dims__).
jit::KernelSource attention_source(const AttentionSpec& spec, const std::string& entry, const std::string& comment,
                                   const char* header, const char* params_type, const char* fn, int threads,
                                   const std::string& template_tail, int min_blocks = 0,
                                   const std::string& second_param = "", int cluster = 1);
// Two kernels' bodies in one persistent launch: the entry
// `entry(const params_type<Extra1> p, const params_type<Extra2> p2, int
// ctas_first, int ctas_second)` runs fn<first's variant, ..., first_tail>(p)
// on CTAs x < ctas_first, then fn<second's ..., second_tail>(p2) on CTAs x <
// ctas_second, each variant in its own namespace. Both bodies take
// `threads` threads; min_blocks as for attention_source. kernel_struct
// (the Hopper kernel's): the entry also takes two Sm90TensorMaps after p2
// and calls fn<kernel_struct<first's ..., Params1>, kernel_struct<second's
// ..., Params2>>(p, tma, ctas_first, p2, tma2, ctas_second).
jit::KernelSource attention_pair_source(const AttentionSpec& first, const std::string& first_tail,
                                        const AttentionSpec& second, const std::string& second_tail,
                                        const std::string& entry, const std::string& comment, const char* header,
                                        const char* params_type, const char* fn, int threads, int min_blocks = 0,
                                        const char* kernel_struct = nullptr);
// Short dtype tag for kernel names: f16, bf16, f32, e4m3, e5m2.
std::string dtype_tag(DType t);
// An fp8 KV cache (kv_dtype float8_e4m3fn / float8_e5m2, with 16-bit q and o)
// is read by the CUDA-core decode kernels (batch_decode, attention_rowwise)
// and the FA2 prefill template (prefill_config: equal head dims up to 256);
// every other kernel family calls this first and refuses it with a
// TypeMismatch naming kv_dtype and `kernel`.
void require_16bit_kv(const AttentionSpec& spec, const char* kernel);
// Heuristic: a tile of ~16 KB of K+V per stage, 2 stages, 128 threads or more:
// 32 KB of shared memory lets 7 CTAs share an SM, which on an H100 covered HBM
// latency better than deeper pipelines (see bench/decode_sweep.py).
// tile / stages / heads_per_thread (1..4) > 0 override the heuristic
// (tuning, benchmarks).
DecodeConfig decode_config(const AttentionSpec& spec, int group, int tile = 0, int stages = 0, int heads_per_thread = 0);
// Persistent batch decode with head-group fusion for `group` query heads per KV head.
jit::KernelSource batch_decode(const AttentionSpec& spec, int group, int tile = 0, int stages = 0,
                               int heads_per_thread = 0);
// Row-wise (query tile 1, CUDA cores) attention over a paged KV cache.
jit::KernelSource attention_rowwise(const AttentionSpec& spec);
// State merges; dtype of the values (fp16, bf16, fp32). per_lane: 16-byte
// vectors of a row per lane, merge_per_lane(head_dim * elem / 16) (1, 2 or 4;
// abi/merge_params.cuh): one kernel per layout keeps each one's registers low.
// flat: merge_pair's kernel for flat state sets (abi/merge_params.cuh).
jit::KernelSource merge_pair(DType v_dtype);
jit::KernelSource merge_pair(DType v_dtype, DType out_dtype, int per_lane = 1,
                             bool flat = false);  // out: fp32 states into 16 bits
jit::KernelSource merge_many(DType v_dtype, int per_lane = 1);
// Paged-KV append of rows of the cache's dtype (a raw copy; fp16, bf16, fp8).
jit::KernelSource append_paged_kv(DType kv_dtype);
// Paged-KV append of `rows` (fp16 / bf16) into a `cache` of fp8, quantized
// on the way (divided by the scale, rounded with saturation); rows == cache
// is the raw copy above.
jit::KernelSource append_paged_kv(DType rows, DType cache);
// Custom masks: a plan's work items trimmed to their visible KV tiles (BatchPrefill::run).
jit::KernelSource trim_masked_items();
// The device planner (device/kernels/plan/): one block plans a step from
// lengths in device memory (runtime/device_planner.hpp).
jit::KernelSource device_planner();
// Standalone RoPE over fp16 / bf16 rows of head_dim 64, 128 or 256; mode:
// where the angles come from (linear, Llama 3.1 or a cos/sin cache).
jit::KernelSource apply_rope(DType dtype, int head_dim, bool interleave, RopeMode mode = RopeMode::kLinear);
// Fused RoPE (float32 cos/sin cache) + fp8 quantize of fp16 / bf16 q / k / v
// rows, optionally appended to a paged fp8 cache (abi/rope_quantize_params.cuh).
jit::KernelSource rope_quantize_fp8(DType rows, DType quant, bool interleave);
// Every built-in kernel (all dtypes, head dims and built-in variants), the
// MLA family (runtime/mla_catalog.hpp) included; the prefill kernels are
// builtin_prefill_kernels().
std::vector<jit::KernelSource> builtin_kernels();
}  // namespace catalog

}  // namespace tessera
