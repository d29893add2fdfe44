#include "tessera/api/attention_wrapper.hpp"

#include <algorithm>

#include "checks.hpp"

namespace tessera {

using detail::str;

namespace {

constexpr const char* kMaskArg = "packed_custom_mask";

const char* kind_name(AttentionKind k) {
  return k == AttentionKind::kDecode ? "decode" : k == AttentionKind::kPrefill ? "prefill" : "auto";
}

}  // namespace

AttentionWrapper::AttentionWrapper(AttentionSpec spec, TaskInfo task, Workspace& workspace, AttentionWrapperOptions opt)
    : spec_(std::move(spec)), task_(task), ws_(&workspace), opt_(opt), kind_(opt.kind),
      custom_mask_(spec_.variant.custom_mask) {
  validate_task(task_, spec_);
  if (custom_mask_ && kind_ == AttentionKind::kDecode)
    throw InvalidArgument("kind: the custom_mask variant runs on the prefill kernels only; use kPrefill or kAuto");
  // A fixed kind builds its wrapper now, so the spec and options are checked
  // at construction; kAuto waits for the first plan.
  if (kind_ == AttentionKind::kDecode) decode_ = std::make_unique<BatchDecode>(spec_, task_, *ws_, opt_.decode);
  if (kind_ == AttentionKind::kPrefill) prefill_ = std::make_unique<BatchPrefill>(spec_, task_, *ws_, opt_.prefill);
}

namespace {

// The larger of the decode and prefill wrappers' sizes (ideal or minimum) for the kinds `opt` allows.
WorkspaceSizes sizes(const AttentionSpec& spec, const TaskInfo& task, int num_sms, const AttentionWrapperOptions& opt,
                     bool minimum) {
  WorkspaceSizes s;
  auto widen = [&](const WorkspaceSizes& w) {
    s.device_bytes = std::max(s.device_bytes, w.device_bytes);
    s.host_bytes = std::max(s.host_bytes, w.host_bytes);
  };
  const bool mask = spec.variant.custom_mask;
  if (opt.kind != AttentionKind::kPrefill && !mask)
    widen(minimum ? BatchDecode::min_workspace_size(spec, task, num_sms, opt.decode)
                  : BatchDecode::workspace_size(spec, task, num_sms, opt.decode));
  if (opt.kind != AttentionKind::kDecode)
    widen(minimum ? BatchPrefill::min_workspace_size(spec, task, num_sms, opt.prefill)
                  : BatchPrefill::workspace_size(spec, task, num_sms, opt.prefill));
  return s;
}

}  // namespace

WorkspaceSizes AttentionWrapper::workspace_size(const AttentionSpec& spec, const TaskInfo& task, int num_sms,
                                                const AttentionWrapperOptions& opt) {
  return sizes(spec, task, num_sms, opt, false);
}

WorkspaceSizes AttentionWrapper::min_workspace_size(const AttentionSpec& spec, const TaskInfo& task, int num_sms,
                                                    const AttentionWrapperOptions& opt) {
  return sizes(spec, task, num_sms, opt, true);
}

namespace {

// Whether every request has exactly one query (qo_indptr = 0, 1, ..., batch):
// such plans run decode.
bool one_query_each(std::span<const int32_t> qo_indptr) {
  if (qo_indptr.empty()) throw InvalidArgument("qo_indptr: expected batch + 1 elements, got 0");
  bool one = qo_indptr[0] == 0;
  for (size_t i = 0; one && i + 1 < qo_indptr.size(); ++i) one = qo_indptr[i + 1] - qo_indptr[i] == 1;
  return one;
}

}  // namespace

void AttentionWrapper::choose(bool decode_ok, const char* why_not) {
  if (kind_ == AttentionKind::kAuto) {
    kind_ = decode_ok && !custom_mask_ ? AttentionKind::kDecode : AttentionKind::kPrefill;
    if (kind_ == AttentionKind::kDecode) decode_ = std::make_unique<BatchDecode>(spec_, task_, *ws_, opt_.decode);
    else prefill_ = std::make_unique<BatchPrefill>(spec_, task_, *ws_, opt_.prefill);
    return;
  }
  if (kind_ == AttentionKind::kDecode && !decode_ok)
    throw InvalidArgument(std::string(why_not) + "; this AttentionWrapper runs decode (" +
                          (opt_.kind == AttentionKind::kAuto ? "chosen at its first plan" : "its options say so") +
                          "): construct one with AttentionKind::kPrefill for such plans");
}

void AttentionWrapper::plan(std::span<const int32_t> qo_indptr, std::span<const int32_t> kv_indptr,
                            std::span<const int32_t> kv_indices, std::span<const int32_t> kv_last_page_len,
                            cudaStream_t stream, std::span<const int32_t> mask_indptr) {
  choose(one_query_each(qo_indptr) && mask_indptr.empty(),
         mask_indptr.empty() ? "qo_indptr: a request has a query length other than 1" : "mask_indptr: masks need prefill");
  if (kind_ == AttentionKind::kDecode) {
    if (kv_indptr.size() != qo_indptr.size())
      throw InvalidArgument("kv_indptr: expected " + str(static_cast<int64_t>(qo_indptr.size())) +
                            " elements (like qo_indptr), got " + str(static_cast<int64_t>(kv_indptr.size())));
    decode_->plan(kv_indptr, kv_indices, kv_last_page_len, stream);
  } else if (custom_mask_ || !mask_indptr.empty()) {  // BatchPrefill says which side is missing
    prefill_->plan_paged(qo_indptr, kv_indptr, kv_indices, kv_last_page_len, mask_indptr, stream);
  } else {
    prefill_->plan_paged(qo_indptr, kv_indptr, kv_indices, kv_last_page_len, stream);
  }
}

void AttentionWrapper::plan(std::span<const int32_t> qo_indptr, std::span<const int32_t> kv_indptr,
                            const TensorView& kv_indices, std::span<const int32_t> kv_last_page_len,
                            cudaStream_t stream) {
  choose(one_query_each(qo_indptr), "qo_indptr: a request has a query length other than 1");
  if (kind_ == AttentionKind::kDecode) {
    if (kv_indptr.size() != qo_indptr.size())
      throw InvalidArgument("kv_indptr: expected " + str(static_cast<int64_t>(qo_indptr.size())) +
                            " elements (like qo_indptr), got " + str(static_cast<int64_t>(kv_indptr.size())));
    decode_->plan(kv_indptr, kv_indices, kv_last_page_len, stream);
  } else {  // BatchPrefill rejects it for the custom mask, by name
    prefill_->plan_paged(qo_indptr, kv_indptr, kv_indices, kv_last_page_len, stream);
  }
}

void AttentionWrapper::plan_ragged(std::span<const int32_t> qo_indptr, std::span<const int32_t> kv_indptr,
                                   cudaStream_t stream, std::span<const int32_t> mask_indptr) {
  choose(false, "plan_ragged: ragged KV runs on the prefill kernels");
  if (custom_mask_ || !mask_indptr.empty()) prefill_->plan_ragged(qo_indptr, kv_indptr, mask_indptr, stream);
  else prefill_->plan_ragged(qo_indptr, kv_indptr, stream);
}

void AttentionWrapper::plan_bsr(const BSRMatrix& bsr, cudaStream_t stream) {
  choose(bsr.block_rows() == 1, "bsr: block rows of more than one query (Br > 1) need prefill");
  if (kind_ == AttentionKind::kDecode) decode_->plan(bsr, stream);
  else prefill_->plan_bsr(bsr, stream);
}

// The custom-mask variant declares no extras: its one argument is the mask.
const TensorView* AttentionWrapper::mask_arg(const VariantArgs& args) const {
  for (const VariantArgs::Arg& a : args.args())
    if (a.name != kMaskArg)
      throw InvalidArgument(a.name + ": not an argument of the custom_mask variant (it takes " + kMaskArg + ")");
  const VariantArgs::Arg* m = args.find(kMaskArg);
  if (m == nullptr)
    throw InvalidArgument(std::string(kMaskArg) + ": missing; the custom_mask variant takes its packed mask bits by this name");
  if (m->kind != VariantArgs::Kind::kTensor)
    throw TypeMismatch(std::string(kMaskArg) + ": expected a uint8 tensor, got a scalar");
  return &m->t;
}

void AttentionWrapper::run(const TensorView& q, const PagedKVStorage& kv, const TensorView& o, const TensorView& lse,
                           const VariantArgs& args, cudaStream_t stream, RunOptions opt) const {
  if (!decode_ && !prefill_) throw InvalidArgument("run: expected plan() to be called first");
  opt.extras = &args;
  if (decode_) {
    decode_->run(q, kv, o, lse, stream, opt);
  } else if (custom_mask_) {
    const TensorView* mask = mask_arg(args);
    opt.extras = nullptr;
    prefill_->run(q, kv, *mask, o, lse, stream, opt);
  } else {
    prefill_->run(q, kv, o, lse, stream, opt);
  }
}

void AttentionWrapper::run_ragged(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& o,
                                  const TensorView& lse, const VariantArgs& args, cudaStream_t stream,
                                  RunOptions opt) const {
  if (!decode_ && !prefill_) throw InvalidArgument("run_ragged: expected plan_ragged() to be called first");
  if (decode_)
    throw InvalidArgument(std::string("run_ragged: this AttentionWrapper runs ") + kind_name(kind_) +
                          " over paged KV; call run()");
  opt.extras = &args;
  if (custom_mask_) {
    const TensorView* mask = mask_arg(args);
    opt.extras = nullptr;
    prefill_->run_ragged(q, k, v, *mask, o, lse, stream, opt);
  } else {
    prefill_->run_ragged(q, k, v, o, lse, stream, opt);
  }
}

}  // namespace tessera
