#include "tessera/runtime/kernel_catalog.hpp"

#include <algorithm>
#include <cctype>
#include <sstream>

#include "tessera/abi/shared_memory.cuh"
#include "tessera/core/error.hpp"
#include "tessera/runtime/mla_catalog.hpp"
#include "tessera/runtime/prefill_catalog.hpp"
#include "tessera/runtime/variant_params.hpp"

namespace tessera {

std::string AttentionSpec::str() const {
  std::ostringstream os;
  os << variant.name << "/q=" << dtype_name(q_dtype) << "/kv=" << dtype_name(kv_dtype) << "/o=" << dtype_name(o_dtype)
     << "/d=" << head_dim;
  if (!dims_equal()) os << "/dvo=" << vo_dim();  // equal dims keep their old text (kernel sources, cache keys)
  return os.str();
}

bool supported_head_dims(int qk, int vo) {
  if (qk == vo) return qk == 64 || qk == 128 || qk == 256 || qk == 512;
  return qk == 192 && vo == 128;
}

void require_head_dim_up_to_256(const AttentionSpec& spec, const char* kernel) {
  if (!spec.dims_equal())
    throw InvalidArgument("head_dim_vo: " + std::string(kernel) + " needs head_dim_vo = head_dim_qk (" +
                          std::to_string(spec.head_dim) + "), got " + std::to_string(spec.vo_dim()) +
                          "; unequal head dims run on the tensor-core prefill kernel (BatchPrefill, backend fa2)");
  if (spec.head_dim > 256)
    throw InvalidArgument("head_dim: " + std::string(kernel) + " takes 64, 128 or 256, got " +
                          std::to_string(spec.head_dim) +
                          " (head_dim 512 runs on the tensor-core prefill kernel: BatchPrefill, BatchDecode's "
                          "tensor-core path)");
}

void validate_spec(const AttentionSpec& spec) {
  auto half = [](DType t) { return t == DType::kFloat16 || t == DType::kBFloat16; };
  if (!half(spec.q_dtype))
    throw TypeMismatch(std::string("q_dtype: expected float16 or bfloat16, got ") + dtype_name(spec.q_dtype) +
                       (is_fp8(spec.q_dtype) ? " (fp8 is for the KV cache: kv_dtype; queries stay 16-bit)" : ""));
  if (!half(spec.kv_dtype) && !is_fp8(spec.kv_dtype))
    throw TypeMismatch(std::string("kv_dtype: expected float16, bfloat16, float8_e4m3fn or float8_e5m2, got ") +
                       dtype_name(spec.kv_dtype));
  if (!half(spec.o_dtype) && spec.o_dtype != DType::kFloat32)  // fp32: the tensor-core prefill kernels only
    throw TypeMismatch(std::string("o_dtype: expected float16, bfloat16 or float32, got ") + dtype_name(spec.o_dtype));
  if (spec.head_dim_vo < 0)
    throw InvalidArgument("head_dim_vo: expected 0 (= head_dim) or a head dim, got " + std::to_string(spec.head_dim_vo));
  if (!supported_head_dims(spec.head_dim, spec.vo_dim())) {
    if (spec.dims_equal())
      throw InvalidArgument("head_dim: expected " + std::string(kSupportedHeadDims) + ", got " +
                            std::to_string(spec.head_dim));
    throw InvalidArgument("head_dim_qk, head_dim_vo: expected " + std::string(kSupportedHeadDims) + ", got " +
                          std::to_string(spec.head_dim) + " / " + std::to_string(spec.vo_dim()));
  }
  validate_variant(spec.variant);
}

static bool is_identifier(const std::string& s) {
  if (s.empty() || std::isdigit(static_cast<unsigned char>(s[0]))) return false;
  for (char c : s)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_')) return false;
  return true;
}

// A variant is user code or a built-in's headers and struct, never both.
static void validate_variant_source(const VariantSpec& v) {
  if (v.headers.empty()) {
    if (!v.struct_name.empty())
      throw InvalidArgument("variant.struct_name: expected empty without headers (user variants name their struct in "
                            "`name`), got '" + v.struct_name + "'");
    return;
  }
  if (!v.code.empty())
    throw InvalidArgument("variant.code: expected empty for a built-in variant (" + v.name + " names its headers)");
  if (v.struct_name.empty()) throw InvalidArgument("variant.struct_name: expected the struct of built-in variant " + v.name);
  static const std::string kDir = "tessera/device/variants/";
  for (const std::string& h : v.headers) {
    const bool embedded = std::any_of(jit::embedded_headers().begin(), jit::embedded_headers().end(),
                                      [&](const auto& e) { return e.first == h; });
    if (h.rfind(kDir, 0) != 0 || !embedded)
      throw InvalidArgument("variant.headers: expected built-in variant headers (" + kDir + "*.cuh), got '" + h + "'");
  }
}

void validate_variant(const VariantSpec& v) {
  if (!is_identifier(v.name)) throw InvalidArgument("variant.name: expected a C++ identifier, got '" + v.name + "'");
  std::vector<std::string> seen;
  for (const auto* list : {&v.tensors, &v.scalars})
    for (const ExtraParam& e : *list) {
      if (!is_identifier(e.name) || e.name.rfind("__", 0) == 0)
        throw InvalidArgument("variant." + std::string(list == &v.tensors ? "tensors" : "scalars") +
                              ": expected C++ identifiers as extra names, got '" + e.name + "'");
      if (std::find(seen.begin(), seen.end(), e.name) != seen.end())
        throw InvalidArgument(e.name + ": declared twice among the extras of variant " + v.name);
      seen.push_back(e.name);
    }
  for (const ExtraParam& e : v.scalars)
    if (e.dtype != DType::kFloat32 && e.dtype != DType::kInt32)
      throw TypeMismatch(e.name + ": expected a float32 or int32 scalar type, got " + dtype_name(e.dtype));
  validate_variant_source(v);
  const ParamsLayout largest = params_layout(ParamsKind::kPrefill, v);
  if (largest.total > kMaxParamBytes)
    throw InvalidArgument("variant: the extras of " + v.name + " need a " + std::to_string(largest.total) +
                          "-byte parameter block, over the " + std::to_string(kMaxParamBytes) + "-byte launch limit");
}

namespace catalog {

// fp32 outputs come from the tensor-core prefill kernels only.
static void require_half_output(const AttentionSpec& spec, const char* kernel) {
  if (spec.o_dtype != DType::kFloat16 && spec.o_dtype != DType::kBFloat16)
    throw TypeMismatch(std::string("o_dtype: expected float16 or bfloat16 for ") + kernel + ", got " +
                       dtype_name(spec.o_dtype) + " (float32 outputs: the tensor-core prefill kernels)");
}

// The custom mask's bits live in PrefillParams only: say so instead of
// failing in NVRTC on a missing member.
static void require_non_mask_variant(const AttentionSpec& spec, const char* kernel) {
  if (spec.variant.custom_mask)
    throw InvalidArgument(std::string("variant: custom_mask runs on the tensor-core prefill kernel (BatchPrefill) only, not ") +
                          kernel);
}

std::string dtype_tag(DType t) {
  switch (t) {
    case DType::kFloat16: return "f16";
    case DType::kBFloat16: return "bf16";
    case DType::kFloat32: return "f32";
    case DType::kFloat8E4M3: return "e4m3";
    case DType::kFloat8E5M2: return "e5m2";
    default: return "x";
  }
}

void require_16bit_kv(const AttentionSpec& spec, const char* kernel) {
  if (is_fp8(spec.kv_dtype))
    throw TypeMismatch(std::string("kv_dtype: ") + dtype_name(spec.kv_dtype) + " KV caches are not supported by " +
                       kernel + " yet; expected float16 or bfloat16 (fp8 caches run on batch / single decode, "
                       "BatchAttention, and batch / single prefill on backend fa2)");
}

// The parts of a generated kernel around the variant's code. ns: the
// variant's namespace; spec_struct: the struct the kernel is instantiated
// with (the spec's flags on top of the variant's).
static std::string generated_checks(const AttentionSpec& spec, const char* params_type,
                                    const std::string& ns = "tessera_variant",
                                    const std::string& spec_struct = "tessera_spec_variant") {
  const VariantSpec& v = spec.variant;
  const ParamsLayout l = params_layout(params_kind(params_type), v);
  const std::string P = std::string("tessera::") + params_type + "<" + ns + "::Extra>";
  std::ostringstream os;
  os << "// The spec's use_softmax / causal on top of the code's.\n"
     << "struct " << spec_struct << " : " << ns << "::" << v.name << " {\n"
     << "  using " << ns << "::" << v.name << "::" << v.name << ";\n"
     << "  static constexpr bool use_softmax = " << (v.use_softmax ? "true" : "false") << " && " << ns << "::" << v.name
     << "::use_softmax;\n"
     << "  static constexpr bool causal = " << (v.causal ? "true" : "false") << " || " << ns << "::" << v.name
     << "::causal;\n"
     << "};\n"
     << "// The host packs the parameters with this layout (runtime/variant_params.hpp).\n"
     << "static_assert(sizeof(" << P << ") == " << l.total;
  if (!v.tensors.empty() || !v.scalars.empty())  // an 8-aligned Extra ends the block: its offset follows
    os << " && sizeof(" << P << ") - sizeof(" << ns << "::Extra) == " << l.extra_offset;
  os << ", \"kernel parameter layout differs from the host's\");\n";
  return os.str();
}

// The variant's namespace: head dim, Extra, and the user's code (with #line,
// so compile errors point at the user's lines) or the built-in's struct.
static std::string variant_namespace(const AttentionSpec& spec, const std::string& ns) {
  std::ostringstream src;
  src << "namespace " << ns << " {\n"
      << "constexpr int kHeadDim = " << spec.head_dim << ";\n"
      << extra_struct_source(spec.variant);
  if (spec.variant.headers.empty())
    src << "#line 1 \"variant:" << spec.variant.name << "\"\n" << spec.variant.code << "\n";
  else
    src << "using " << spec.variant.name << " = " << spec.variant.struct_name << ";\n";
  src << "}  // namespace " << ns << "\n";
  return src.str();
}

// The template arguments of an attention kernel function after the variant:
// DQ, DKV, DO, head dim, then the kernel's own.
static std::string kernel_arguments(const AttentionSpec& spec, const std::string& template_tail) {
  return std::string(dtype_device_name(spec.q_dtype)) + ", " + dtype_device_name(spec.kv_dtype) + ", " +
         dtype_device_name(spec.o_dtype) + ", " + std::to_string(spec.head_dim) + ", " + template_tail;
}

jit::KernelSource attention_source(const AttentionSpec& spec, const std::string& entry, const std::string& comment,
                                   const char* header, const char* params_type, const char* fn, int threads,
                                   const std::string& template_tail, int min_blocks,
                                   const std::string& second_param, int cluster) {
  const std::string second_arg =
      second_param.empty() ? std::string() : ", " + second_param.substr(second_param.find_last_of(' ') + 1);
  validate_variant(spec.variant);
  std::ostringstream src;
  src << "// Generated by tessera: " << comment << ", " << spec.str() << "\n"
      << "#include \"tessera/device/primitives/rope.cuh\"\n"  // for RoPE variants
      << "#include \"" << header << "\"\n";
  for (const std::string& h : spec.variant.headers) src << "#include \"" << h << "\"\n";  // a built-in variant
  src << variant_namespace(spec, "tessera_variant")
      << "#line 1 \"generated:" << entry << "\"\n"
      << generated_checks(spec, params_type)
      << "extern \"C\" __global__ void "
      << (cluster > 1 ? "__cluster_dims__(" + std::to_string(cluster) + ", 1, 1) " : std::string())
      << "__launch_bounds__(" << threads
      << (min_blocks > 0 ? ", " + std::to_string(min_blocks) : std::string()) << ") " << entry << "(const tessera::" << params_type
      << "<tessera_variant::Extra> p" << (second_param.empty() ? "" : ", const __grid_constant__ " + second_param) << ") {\n"
      << "  tessera::" << fn << "<tessera_spec_variant, " << kernel_arguments(spec, template_tail) << ">(p" << second_arg
      << ");\n"
      << "}\n";
  return {entry, src.str(), {}};
}

jit::KernelSource attention_pair_source(const AttentionSpec& first, const std::string& first_tail,
                                        const AttentionSpec& second, const std::string& second_tail,
                                        const std::string& entry, const std::string& comment, const char* header,
                                        const char* params_type, const char* fn, int threads, int min_blocks,
                                        const char* kernel_struct) {
  validate_variant(first.variant);
  validate_variant(second.variant);
  std::ostringstream src;
  src << "// Generated by tessera: " << comment << ", " << first.str() << " | " << second.str() << "\n"
      << "#include \"tessera/device/primitives/rope.cuh\"\n"
      << "#include \"" << header << "\"\n";
  for (const AttentionSpec* s : {&first, &second})
    for (const std::string& h : s->variant.headers) src << "#include \"" << h << "\"\n";
  src << variant_namespace(first, "tessera_variant_first") << variant_namespace(second, "tessera_variant_second")
      << "#line 1 \"generated:" << entry << "\"\n"
      << generated_checks(first, params_type, "tessera_variant_first", "tessera_spec_first")
      << generated_checks(second, params_type, "tessera_variant_second", "tessera_spec_second")
      << "// CTA (x, group) walks queue x of each plan whose grid holds it.\n"
      << "extern \"C\" __global__ void __launch_bounds__(" << threads
      << (min_blocks > 0 ? ", " + std::to_string(min_blocks) : std::string()) << ") " << entry << "(const tessera::"
      << params_type << "<tessera_variant_first::Extra> p, const tessera::" << params_type
      << "<tessera_variant_second::Extra> p2, ";
  if (kernel_struct == nullptr) {  // one kernel function per plan
    src << "int ctas_first, int ctas_second) {\n"
        << "  if (blockIdx.x < ctas_first) tessera::" << fn << "<tessera_spec_first, "
        << kernel_arguments(first, first_tail) << ">(p, ctas_first);\n"
        << "  if (blockIdx.x < ctas_second) tessera::" << fn << "<tessera_spec_second, "
        << kernel_arguments(second, second_tail) << ">(p2, ctas_second);\n";
  } else {  // one function over both plans' kernel structs (and their tensor maps)
    auto kernel = [&](const char* spec, const AttentionSpec& s, const std::string& tail, const char* ns) {
      return std::string("tessera::") + kernel_struct + "<" + spec + ", " + kernel_arguments(s, tail) + ", tessera::" +
             params_type + "<" + ns + "::Extra>>";
    };
    src << "const __grid_constant__ tessera::Sm90TensorMaps tma, const __grid_constant__ tessera::Sm90TensorMaps tma2, "
        << "int ctas_first, int ctas_second) {\n"
        << "  tessera::" << fn << "<" << kernel("tessera_spec_first", first, first_tail, "tessera_variant_first")
        << ", " << kernel("tessera_spec_second", second, second_tail, "tessera_variant_second")
        << ">(p, tma, ctas_first, p2, tma2, ctas_second);\n";
  }
  src << "}\n";
  return {entry, src.str(), {}};
}

jit::KernelSource attention_rowwise(const AttentionSpec& spec) {
  validate_spec(spec);
  require_head_dim_up_to_256(spec, "the row-wise kernel (single_decode, BatchAttention)");
  require_non_mask_variant(spec, "the row-wise kernel");
  require_half_output(spec, "the row-wise kernel");
  const std::string entry = "tessera_rowwise_" + spec.variant.name + "_" + dtype_tag(spec.q_dtype) + "_" +
                            dtype_tag(spec.kv_dtype) + "_" + dtype_tag(spec.o_dtype) + "_d" + std::to_string(spec.head_dim);
  return attention_source(spec, entry, "row-wise attention", "tessera/device/kernels/decode/rowwise.cuh",
                          "RowwiseParams", "attention_rowwise", kRowwiseWarps * 32, std::to_string(kRowwiseWarps));
}

DecodeConfig decode_config(const AttentionSpec& spec, int group, int tile, int stages, int heads_per_thread) {
  validate_spec(spec);
  require_head_dim_up_to_256(spec, "batch decode on CUDA cores");
  require_non_mask_variant(spec, "batch decode");
  require_half_output(spec, "batch decode on CUDA cores");
  if (group < 1 || group > 64) throw InvalidArgument("group: expected 1..64 query heads per KV head, got " + std::to_string(group));
  DecodeConfig c;
  const int elem = static_cast<int>(dtype_size(spec.kv_dtype));
  if (tile < 0 || stages < 0 || stages == 1) throw InvalidArgument("tile/stages: expected 0 (heuristic), tile >= 1, stages >= 2");
  if (heads_per_thread < 0 || heads_per_thread > 4)
    throw InvalidArgument("heads_per_thread: expected 0 (heuristic) or 1..4, got " + std::to_string(heads_per_thread));
  // fp8 caches: 2 query heads per thread. Widening fp8 costs registers per
  // head group, and at 4 heads the kernel held fewer CTAs per SM; 2 measured
  // 7-13% faster on GQA 32/8 (bench/decode.py --fp8, the fp8-h2 rows).
  c.heads_per_thread = heads_per_thread ? heads_per_thread : (is_fp8(spec.kv_dtype) ? 2 : 4);
  c.tile = tile ? tile : std::max(16, 16384 / (spec.head_dim * elem * 2));
  c.stages = stages ? stages : 2;  // 2 x 16 KB: more CTAs per SM beat deeper pipelines (bench/decode_sweep.py)
  // The kernel's own geometry (DecodeShape; abi/shared_memory.cuh).
  const DecodeGeometry g0 = decode_geometry(elem, spec.head_dim, group, c.min_threads, c.tile, c.stages, c.heads_per_thread);
  // Every thread copies whole chunks and every token group whole tokens.
  if (c.tile % (g0.ty * g0.tz) != 0) c.tile = (c.tile + g0.ty * g0.tz - 1) / (g0.ty * g0.tz) * (g0.ty * g0.tz);
  const DecodeGeometry g = decode_geometry(elem, spec.head_dim, group, c.min_threads, c.tile, c.stages, c.heads_per_thread);
  c.threads = g.threads;
  c.smem_bytes = g.smem_bytes;
  c.ctas_per_sm = std::max(1, std::min({(227 * 1024) / (c.smem_bytes + 1024), 2048 / c.threads, 8}));
  return c;
}

jit::KernelSource batch_decode(const AttentionSpec& spec, int group, int tile, int stages, int heads_per_thread) {
  const DecodeConfig c = decode_config(spec, group, tile, stages, heads_per_thread);
  std::ostringstream entry, tail;
  entry << "tessera_decode_" << spec.variant.name << "_" << dtype_tag(spec.q_dtype) << "_" << dtype_tag(spec.kv_dtype) << "_"
        << dtype_tag(spec.o_dtype) << "_d" << spec.head_dim << "_g" << group << "_t" << c.tile << "_s" << c.stages;
  if (c.heads_per_thread != 4) entry << "_h" << c.heads_per_thread;
  tail << group << ", " << c.min_threads << ", " << c.tile << ", " << c.stages << ", " << c.heads_per_thread;
  return attention_source(spec, entry.str(), "batch decode, group " + std::to_string(group),
                          "tessera/device/kernels/decode/kernel.cuh", "DecodeParams", "batch_decode", c.threads, tail.str());
}

// out: the output values' type when it differs from the states' (merge_pair:
// fp32 states into a 16-bit output); per_lane: the layout (merge_states.cuh);
// flat: merge_pair over flat state sets (abi/merge_params.cuh).
static jit::KernelSource merge_source(const char* kind, const char* params, DType t, DType out, int per_lane,
                                      bool flat = false) {
  if (t != DType::kFloat16 && t != DType::kBFloat16 && t != DType::kFloat32)
    throw TypeMismatch(std::string("v: expected float16, bfloat16 or float32, got ") + dtype_name(t));
  if (out != t && (t != DType::kFloat32 || (out != DType::kFloat16 && out != DType::kBFloat16)))
    throw TypeMismatch(std::string("v_out: expected ") + dtype_name(t) +
                       (t == DType::kFloat32 ? ", float16 or bfloat16" : "") + ", got " + dtype_name(out));
  if (per_lane != 1 && per_lane != 2 && per_lane != 4)
    throw InvalidArgument("per_lane: expected 1, 2 or 4 vectors per lane, got " + std::to_string(per_lane));
  std::string entry = std::string("tessera_") + kind + "_" + dtype_tag(t);
  if (out != t) entry.append("_").append(dtype_tag(out));
  if (per_lane != 1) entry.append("_x").append(std::to_string(per_lane));
  if (flat) entry.append("_flat");
  std::string types = dtype_device_name(t);
  if (std::string(kind) == "merge_pair") types.append(", ").append(dtype_device_name(out));
  types.append(", ").append(std::to_string(per_lane));
  if (flat) types.append(", true");
  std::ostringstream src;
  src << "// Generated by tessera: " << kind << " over " << dtype_name(t) << " values, " << per_lane
      << " vector(s) per lane\n"
      << "#include \"tessera/device/kernels/merge/merge_states.cuh\"\n"
      << "extern \"C\" __global__ void __launch_bounds__(tessera::kMergeThreads) " << entry << "(const tessera::"
      << params << " p) {\n"
      << "  tessera::" << kind << "<" << types << ">(p);\n"
      << "}\n";
  return {entry, src.str(), {}};
}

jit::KernelSource merge_pair(DType t, DType out, int per_lane, bool flat) {
  return merge_source("merge_pair", "MergePairParams", t, out, per_lane, flat);
}
jit::KernelSource merge_pair(DType t) { return merge_pair(t, t); }
jit::KernelSource merge_many(DType t, int per_lane) { return merge_source("merge_many", "MergeManyParams", t, t, per_lane); }

jit::KernelSource append_paged_kv(DType t) { return append_paged_kv(t, t); }

jit::KernelSource append_paged_kv(DType rows, DType cache) {
  if (!is_half_precision(cache) && !is_fp8(cache))
    throw TypeMismatch(std::string("kv: expected float16, bfloat16, float8_e4m3fn or float8_e5m2, got ") +
                       dtype_name(cache));
  if (rows != cache && !(is_half_precision(rows) && is_fp8(cache)))
    throw TypeMismatch(std::string("append_key: expected the cache's dtype ") + dtype_name(cache) +
                       (is_fp8(cache) ? " or float16 / bfloat16 (quantized on the way)" : "") + ", got " +
                       dtype_name(rows));
  const bool quantize = rows != cache;
  const std::string entry = "tessera_append_paged_kv_" + (quantize ? dtype_tag(rows) + "_to_" : "") + dtype_tag(cache);
  std::ostringstream src;
  src << "// Generated by tessera: paged-KV append of " << dtype_name(rows) << " rows into " << dtype_name(cache)
      << " storage\n"
      << "#include \"tessera/device/kernels/page/append_kv.cuh\"\n"
      << "extern \"C\" __global__ void __launch_bounds__(tessera::kAppendThreads) " << entry
      << "(const tessera::AppendKVParams p) {\n";
  if (quantize)
    src << "  tessera::append_paged_kv_quantize<" << dtype_device_name(rows) << ", " << dtype_device_name(cache) << ">(p);\n";
  else
    src << "  tessera::append_paged_kv<" << dtype_device_name(cache) << ">(p);\n";
  src << "}\n";
  return {entry, src.str(), {}};
}

jit::KernelSource trim_masked_items() {
  const std::string entry = "tessera_trim_masked_items";
  std::ostringstream src;
  src << "// Generated by tessera: custom-mask work items trimmed to their visible KV tiles\n"
      << "#include \"tessera/device/kernels/page/mask_trim.cuh\"\n"
      << "extern \"C\" __global__ void __launch_bounds__(tessera::kMaskTrimThreads) " << entry
      << "(const tessera::MaskTrimParams p) {\n"
      << "  tessera::trim_masked_items(p);\n"
      << "}\n";
  return {entry, src.str(), {}};
}

jit::KernelSource device_planner() {
  const std::string entry = "tessera_device_plan";
  std::ostringstream src;
  src << "// Generated by tessera: a step's work queues planned on the GPU\n"
      << "#include \"tessera/device/kernels/plan/kernel.cuh\"\n"
      << "extern \"C\" __global__ void __launch_bounds__(tessera::kDevicePlanThreads) " << entry
      << "(const __grid_constant__ tessera::DevicePlanParams p) {\n"
      << "  extern __shared__ __align__(16) char smem[];\n"
      << "  tessera::plan::plan_step(p, smem);\n"
      << "}\n";
  return {entry, src.str(), {}};
}

jit::KernelSource apply_rope(DType t, int head_dim, bool interleave, RopeMode mode) {
  if (t != DType::kFloat16 && t != DType::kBFloat16)
    throw TypeMismatch(std::string("q: expected float16 or bfloat16, got ") + dtype_name(t));
  if (head_dim != 64 && head_dim != 128 && head_dim != 256)
    throw InvalidArgument("head_dim: expected 64, 128 or 256, got " + std::to_string(head_dim));
  const char* mode_tag = nullptr;
  const char* mode_name = nullptr;
  switch (mode) {
    case RopeMode::kLinear: mode_tag = "", mode_name = "kLinear"; break;
    case RopeMode::kLlama31: mode_tag = "_llama31", mode_name = "kLlama31"; break;
    case RopeMode::kCosSinCache: mode_tag = "_cos_sin_cache", mode_name = "kCosSinCache"; break;
    default: throw InvalidArgument("mode: expected a RopeMode, got " + std::to_string(static_cast<int>(mode)));
  }
  const std::string entry = "tessera_apply_rope_" + dtype_tag(t) + "_d" + std::to_string(head_dim) +
                            (interleave ? "_interleave" : "") + mode_tag;
  std::ostringstream src;
  src << "// Generated by tessera: RoPE over " << dtype_name(t) << " rows of head_dim " << head_dim
      << (interleave ? ", interleaved pairs" : ", half-split pairs") << ", angles " << mode_name << "\n"
      << "#include \"tessera/device/kernels/page/rope.cuh\"\n"
      << "extern \"C\" __global__ void __launch_bounds__(tessera::kRopeThreads) " << entry
      << "(const tessera::RopeParams p) {\n"
      << "  tessera::apply_rope<" << dtype_device_name(t) << ", " << head_dim << ", " << (interleave ? "true" : "false")
      << ", tessera::RopeMode::" << mode_name << ">(p);\n"
      << "}\n";
  return {entry, src.str(), {}};
}

jit::KernelSource rope_quantize_fp8(DType rows, DType quant, bool interleave) {
  if (rows != DType::kFloat16 && rows != DType::kBFloat16)
    throw TypeMismatch(std::string("q_rope: expected float16 or bfloat16, got ") + dtype_name(rows));
  if (!is_fp8(quant))
    throw TypeMismatch(std::string("quantize_dtype: expected float8_e4m3fn or float8_e5m2, got ") + dtype_name(quant));
  const std::string entry = "tessera_rope_quantize_" + dtype_tag(rows) + "_to_" + dtype_tag(quant) +
                            (interleave ? "_interleave" : "");
  std::ostringstream src;
  src << "// Generated by tessera: RoPE (cos/sin cache) + fp8 quantize (+ paged append) of " << dtype_name(rows)
      << " rows into " << dtype_name(quant) << (interleave ? ", interleaved pairs" : ", half-split pairs") << "\n"
      << "#include \"tessera/device/kernels/page/rope_quantize.cuh\"\n"
      << "extern \"C\" __global__ void __launch_bounds__(tessera::kRopeQuantizeThreads) " << entry
      << "(const tessera::RopeQuantizeParams p) {\n"
      << "  tessera::rope_quantize_fp8<" << dtype_device_name(rows) << ", " << dtype_device_name(quant) << ", "
      << (interleave ? "true" : "false") << ">(p);\n"
      << "}\n";
  return {entry, src.str(), {}};
}

std::vector<jit::KernelSource> builtin_kernels() {
  std::vector<jit::KernelSource> out;
  // Merges of head_dim 64-256: one vector per lane, two for fp32 at 256.
  // Contiguous states are flat (abi/merge_params.cuh); strided ones are rarer.
  for (DType t : {DType::kFloat16, DType::kBFloat16, DType::kFloat32}) {
    for (bool flat : {true, false}) out.push_back(merge_pair(t, t, 1, flat));
    out.push_back(merge_many(t));
  }
  out.push_back(merge_pair(DType::kFloat32, DType::kFloat32, 2, true));
  out.push_back(merge_many(DType::kFloat32, 2));
  for (DType t : {DType::kFloat16, DType::kBFloat16})  // cascades
    for (int per_lane : {1, 2}) out.push_back(merge_pair(DType::kFloat32, t, per_lane, true));
  for (const VariantSpec& v : {variants::standard(), variants::causal()})
    for (DType t : {DType::kFloat16, DType::kBFloat16})
      for (int d : {64, 128, 256}) out.push_back(attention_rowwise({v, t, t, t, d}));
  for (DType t : {DType::kFloat16, DType::kBFloat16})
    for (int d : {64, 128, 256})
      for (int g : {1, 4, 8}) out.push_back(batch_decode({variants::standard(), t, t, t, d}, g));
  // fp8 KV caches: 16-bit queries and outputs, fp8 K / V.
  for (DType t : {DType::kFloat16, DType::kBFloat16})
    for (DType kv : {DType::kFloat8E4M3, DType::kFloat8E5M2}) {
      for (int d : {64, 128, 256}) {
        out.push_back(attention_rowwise({variants::standard(), t, kv, t, d}));
        for (int g : {1, 4, 8}) out.push_back(batch_decode({variants::standard(), t, kv, t, d}, g));
      }
      out.push_back(append_paged_kv(t, kv));
    }
  for (DType t : {DType::kFloat16, DType::kBFloat16, DType::kFloat8E4M3, DType::kFloat8E5M2})
    out.push_back(append_paged_kv(t));
  out.push_back(trim_masked_items());
  out.push_back(device_planner());
  for (DType t : {DType::kFloat16, DType::kBFloat16})
    for (int d : {64, 128, 256})
      for (bool interleave : {false, true})
        for (RopeMode m : {RopeMode::kLinear, RopeMode::kLlama31, RopeMode::kCosSinCache})
          out.push_back(apply_rope(t, d, interleave, m));
  for (DType t : {DType::kFloat16, DType::kBFloat16})  // fused RoPE + fp8 quantize (+ paged append)
    for (DType q : {DType::kFloat8E4M3, DType::kFloat8E5M2})
      for (bool interleave : {false, true}) out.push_back(rope_quantize_fp8(t, q, interleave));
  for (auto& k : builtin_mla_kernels()) out.push_back(std::move(k));  // MLA (device/kernels/mla/)
  return out;
}

}  // namespace catalog
}  // namespace tessera
