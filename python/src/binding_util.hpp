// Helpers shared by the binding files (bindings.cpp, bindings_variants.cpp).
#pragma once
#include <nanobind/nanobind.h>

#include <cstdint>
#include <span>
#include <string>

#include "tensor_convert.hpp"
#include "tessera/core/dtype.hpp"
#include "tessera/core/error.hpp"
#include "tessera/formats/paged_kv.hpp"

namespace tessera::python {

inline DType parse_dtype(const char* what, const std::string& s) {
  for (DType t : {DType::kFloat16, DType::kBFloat16, DType::kFloat32, DType::kInt32, DType::kUInt8, DType::kBool})
    if (s == dtype_name(t)) return t;
  throw TypeMismatch(std::string(what) + ": expected a dtype name (float16, bfloat16, float32, ...), got '" + s + "'");
}

// k: [pages, ...] (4-D, with v) or the interleaved [pages, 2, ...] (5-D, v None).
inline PagedKVStorage to_storage(const Arg& k, const Arg& v, bool has_v, KVLayout layout) {
  return has_v ? PagedKVStorage(k.view, v.view, layout) : PagedKVStorage(k.view, layout);
}

// A host int32 vector argument of plan() as a span over the caller's buffer
// (kept alive by the Arg).
inline std::span<const int32_t> host_ints(const char* name, const Arg& a) {
  check_dim(name, a.view, 1);
  check_dtype(name, a.view, DType::kInt32);
  check_device(name, a.view, Device{});
  check_contiguous(name, a.view);
  return {static_cast<const int32_t*>(a.view.data), static_cast<size_t>(a.view.size(0))};
}

// Defined in bindings_variants.cpp: variant specs, AttentionWrapper, RoPE ops, JIT cost.
void bind_variants(nanobind::module_& m);

}  // namespace tessera::python
