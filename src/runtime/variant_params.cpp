#include "tessera/runtime/variant_params.hpp"

#include <cmath>
#include <cstring>
#include <limits>
#include <sstream>

#include "tessera/core/error.hpp"
#include "tessera/abi/rowwise_params.cuh"
#include "tessera/abi/decode_params.cuh"
#include "tessera/abi/prefill_params.cuh"
#include "tessera/abi/variant_extra.cuh"

namespace tessera {

// ---------------------------------------------------------------- VariantArgs
VariantArgs::Arg& VariantArgs::slot(std::string name) {
  for (Arg& a : args_)
    if (a.name == name) return a;
  args_.push_back(Arg{std::move(name), Kind::kFloat, 0, 0, TensorView()});
  return args_.back();
}

VariantArgs& VariantArgs::set(std::string name, double value) {
  Arg& a = slot(std::move(name));
  a.kind = Kind::kFloat;
  a.f = value;
  return *this;
}

VariantArgs& VariantArgs::set(std::string name, int64_t value) {
  Arg& a = slot(std::move(name));
  a.kind = Kind::kInt;
  a.i = value;
  return *this;
}

VariantArgs& VariantArgs::set(std::string name, const TensorView& tensor) {
  Arg& a = slot(std::move(name));
  a.kind = Kind::kTensor;
  a.t = tensor;
  return *this;
}

const VariantArgs::Arg* VariantArgs::find(std::string_view name) const {
  for (const Arg& a : args_)
    if (a.name == name) return &a;
  return nullptr;
}

// ---------------------------------------------------------------- layout
namespace {

constexpr size_t kPointerBytes = 8, kScalarBytes = 4;

size_t round_up(size_t x, size_t a) { return (x + a - 1) / a * a; }

// sizeof(Extra), without building the field list (launches must not allocate).
size_t extra_size(const VariantSpec& v) {
  if (v.tensors.empty() && v.scalars.empty()) return 0;
  return round_up(kPointerBytes * v.tensors.size() + kScalarBytes * v.scalars.size(), 8);
}

// An 8-aligned stand-in for Extra: XxxParams<Probe8> puts it where any
// 8-aligned Extra goes.
struct alignas(8) Probe8 {
  unsigned char bytes[8];
};

template <template <typename> class P>
ParamsLayout layout_of(size_t size) {
  static_assert(alignof(P<NoExtra>) == 8, "parameter blocks hold pointers");
  ParamsLayout l;
  l.head_bytes = offsetof(P<NoExtra>, extra);
  if (size == 0) {
    l.extra_offset = l.head_bytes;
    l.total = sizeof(P<NoExtra>);
  } else {
    l.extra_offset = offsetof(P<Probe8>, extra);
    l.total = l.extra_offset + size;  // size is a multiple of the block's alignment: no tail padding
  }
  return l;
}

const char* scalar_type(DType t) { return t == DType::kInt32 ? "int" : "float"; }

}  // namespace

ExtraLayout extra_layout(const VariantSpec& v) {
  ExtraLayout l;
  size_t off = 0;
  for (const ExtraParam& t : v.tensors) {
    l.fields.push_back({t.name, true, t.dtype, off});
    off += kPointerBytes;
  }
  for (const ExtraParam& s : v.scalars) {
    l.fields.push_back({s.name, false, s.dtype, off});
    off += kScalarBytes;
  }
  l.size = extra_size(v);
  return l;
}

std::string extra_struct_source(const VariantSpec& v) {
  if (v.tensors.empty() && v.scalars.empty()) return "typedef tessera::NoExtra Extra;\n";
  std::ostringstream os;
  os << "struct alignas(8) Extra {  // the variant's extras, read as params.extra.<name>\n";
  for (const ExtraParam& t : v.tensors) os << "  const " << dtype_device_name(t.dtype) << "* " << t.name << ";\n";
  for (const ExtraParam& s : v.scalars) os << "  " << scalar_type(s.dtype) << " " << s.name << ";\n";
  os << "};\n";
  return os.str();
}

ParamsKind params_kind(std::string_view t) {
  if (t == "PrefillParams") return ParamsKind::kPrefill;
  if (t == "DecodeParams") return ParamsKind::kDecode;
  if (t == "RowwiseParams") return ParamsKind::kRowwise;
  throw InvalidArgument("params_type: expected PrefillParams, DecodeParams or RowwiseParams, got " + std::string(t));
}

ParamsLayout params_layout(ParamsKind kind, const VariantSpec& v) {
  const size_t size = extra_size(v);
  switch (kind) {
    case ParamsKind::kPrefill: return layout_of<PrefillParams>(size);
    case ParamsKind::kDecode: return layout_of<DecodeParams>(size);
    case ParamsKind::kRowwise: return layout_of<RowwiseParams>(size);
  }
  return {};
}

// ---------------------------------------------------------------- packing
namespace {

std::string declared_extras(const VariantSpec& v) {
  std::string s;
  for (const auto* list : {&v.tensors, &v.scalars})
    for (const ExtraParam& e : *list) s += (s.empty() ? "" : ", ") + e.name;
  return s.empty() ? "none" : s;
}

const VariantArgs::Arg& require(const VariantSpec& v, const VariantArgs* args, const ExtraParam& e, bool tensor) {
  const VariantArgs::Arg* a = args ? args->find(e.name) : nullptr;
  if (a == nullptr)
    throw InvalidArgument(e.name + ": missing; variant " + v.name + " declares it as " +
                          (e.dtype == DType::kInt32 ? "an " : "a ") + dtype_name(e.dtype) +
                          (tensor ? " tensor" : " scalar") + " extra (pass it to run() by name)");
  return *a;
}

void write_scalar(unsigned char* dst, const VariantSpec& v, const VariantArgs* args, const ExtraParam& e) {
  const VariantArgs::Arg& a = require(v, args, e, false);
  if (a.kind == VariantArgs::Kind::kTensor)
    throw TypeMismatch(e.name + ": expected a " + dtype_name(e.dtype) + " scalar, got a tensor");
  if (e.dtype == DType::kInt32) {
    if (a.kind != VariantArgs::Kind::kInt)
      throw TypeMismatch(e.name + ": expected an int32 scalar, got a float (" + std::to_string(a.f) + ")");
    if (a.i < std::numeric_limits<int32_t>::min() || a.i > std::numeric_limits<int32_t>::max())
      throw InvalidArgument(e.name + ": expected a value in the int32 range, got " + std::to_string(a.i));
    const int32_t x = static_cast<int32_t>(a.i);
    std::memcpy(dst, &x, sizeof x);
  } else {
    const float x = a.kind == VariantArgs::Kind::kInt ? static_cast<float>(a.i) : static_cast<float>(a.f);
    std::memcpy(dst, &x, sizeof x);
  }
}

void write_tensor(unsigned char* dst, const VariantSpec& v, const VariantArgs* args, const ExtraParam& e,
                  const Device& device) {
  const VariantArgs::Arg& a = require(v, args, e, true);
  if (a.kind != VariantArgs::Kind::kTensor)
    throw TypeMismatch(e.name + ": expected a " + std::string(dtype_name(e.dtype)) + " tensor, got a scalar");
  check_dtype(e.name.c_str(), a.t, e.dtype);
  check_device(e.name.c_str(), a.t, device);
  check_contiguous(e.name.c_str(), a.t);
  const void* p = a.t.data;
  std::memcpy(dst, &p, sizeof p);
}

}  // namespace

void pack_params(ParamBlock& out, ParamsKind kind, const void* head, const VariantSpec& v, const VariantArgs* args,
                 const Device& device) {
  const ParamsLayout l = params_layout(kind, v);
  if (l.total > kMaxParamBytes)
    throw InvalidArgument("variant: " + v.name + "'s parameter block needs " + std::to_string(l.total) +
                          " bytes, over the " + std::to_string(kMaxParamBytes) + "-byte launch limit");
  // Unknown names first: a misspelt extra is then reported as such rather
  // than as the declared one it was meant to be being missing.
  if (args)
    for (const VariantArgs::Arg& a : args->args()) {
      bool known = false;
      for (const auto* list : {&v.tensors, &v.scalars})
        for (const ExtraParam& e : *list) known = known || e.name == a.name;
      if (!known)
        throw InvalidArgument(a.name + ": not an extra of variant " + v.name + " (its extras: " + declared_extras(v) + ")");
    }
  std::memset(out.bytes, 0, l.total);
  std::memcpy(out.bytes, head, l.head_bytes);
  unsigned char* extra = out.bytes + l.extra_offset;
  size_t off = 0;
  for (const ExtraParam& e : v.tensors) {
    write_tensor(extra + off, v, args, e, device);
    off += kPointerBytes;
  }
  for (const ExtraParam& e : v.scalars) {
    write_scalar(extra + off, v, args, e);
    off += kScalarBytes;
  }
  out.size = l.total;
}

}  // namespace tessera
