// The kernel catalogue: turns a kernel family + configuration + variant into a
// JIT KernelSource (generated translation unit), and lists every built-in
// kernel so CI and `tessera compile` can precompile them all.
#pragma once
#include <string>
#include <vector>

#include "tessera/core/dtype.hpp"
#include "tessera/runtime/jit.hpp"

namespace tessera {

// A variant as code: `code` defines `struct <name> : tessera::VariantBase`
// overriding any functor slots (see device/primitives/variant.cuh). Built-in
// variants are specs of exactly this form.
struct VariantSpec {
  std::string name;
  std::string code;
  bool operator==(const VariantSpec&) const = default;
};

namespace variants {
VariantSpec standard();  // plain softmax attention
VariantSpec causal();    // bottom-right aligned causal mask
}  // namespace variants

// What a kernel computes: the variant, data types and head dimension.
struct AttentionSpec {
  VariantSpec variant = variants::standard();
  DType q_dtype = DType::kFloat16;
  DType kv_dtype = DType::kFloat16;
  DType o_dtype = DType::kFloat16;
  int head_dim = 128;
  bool operator==(const AttentionSpec&) const = default;
  std::string str() const;  // e.g. "standard/q=float16/kv=float16/o=float16/d=128"
};
// Validates dtypes (fp16/bf16) and head_dim (64/128/256); throws InvalidArgument / TypeMismatch.
void validate_spec(const AttentionSpec& spec);

namespace catalog {
constexpr int kRowwiseWarps = 4;
// Row-wise (query tile 1, CUDA cores) attention over a paged KV cache.
jit::KernelSource attention_rowwise(const AttentionSpec& spec);
// State merges; dtype of the values (fp16, bf16, fp32).
jit::KernelSource merge_pair(DType v_dtype);
jit::KernelSource merge_many(DType v_dtype);
// Every built-in kernel (all dtypes, head dims and built-in variants).
std::vector<jit::KernelSource> builtin_kernels();
}  // namespace catalog

}  // namespace tessera
