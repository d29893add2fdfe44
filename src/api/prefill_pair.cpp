// PrefillPair: two planned BatchPrefills in one persistent launch
// (api/prefill_pair.hpp).
#include "tessera/api/prefill_pair.hpp"

#include <algorithm>
#include <span>
#include <string>

#include "checks.hpp"
#include "tessera/core/error.hpp"
#include "tessera/runtime/cuda.hpp"

namespace tessera {

namespace {

bool overlap(const void* a, size_t a_bytes, const void* b, size_t b_bytes) {
  const auto* x = static_cast<const char*>(a);
  const auto* y = static_cast<const char*>(b);
  return a_bytes > 0 && b_bytes > 0 && x < y + b_bytes && y < x + a_bytes;
}

}  // namespace

PrefillPair::PrefillPair(const BatchPrefill& first, const BatchPrefill& second) : first_(&first), second_(&second) {
  if (&first == &second)
    throw InvalidArgument("second: expected another BatchPrefill than first (each part needs its own plan and "
                          "split-KV scratch)");
  for (const BatchPrefill* w : {&first, &second}) {
    const char* name = w == &first ? "first" : "second";
    if (w->batch_ < 0)
      throw InvalidArgument(std::string(name) + ": expected a BatchPrefill planned at least once (its tile is chosen "
                            "by its first plan)");
    if (w->config_.cluster != 1)
      throw InvalidArgument(std::string(name) + ": a pair runs single CTAs; expected PrefillOptions::cluster 0 or 1, "
                            "got a plan of CTA pairs");
  }
  if (first.config_.hopper != second.config_.hopper)
    throw InvalidArgument("second: expected the template of first (both PrefillBackend::kFA2, or both on the Hopper "
                          "kernel), got " + std::string(second.config_.hopper ? "the Hopper kernel" : "FA2") +
                          " beside " + (first.config_.hopper ? "the Hopper kernel" : "FA2"));
  if (first.ws_->device() != second.ws_->device())
    throw InvalidArgument("second: expected its workspace on first's device " + std::to_string(first.ws_->device()) +
                          ", got device " + std::to_string(second.ws_->device()));
  if (first.head_groups_ != second.head_groups_)
    throw InvalidArgument("second: expected as many head groups as first (" + std::to_string(first.head_groups_) +
                          "; PrefillOptions::group_heads and num_kv_heads alike), got " +
                          std::to_string(second.head_groups_));
  // Both parts run at once: their plans, counters and partial states must not share bytes.
  const bool shared = overlap(first.ws_->device_ptr(), first.ws_->device_bytes(), second.ws_->device_ptr(),
                              second.ws_->device_bytes()) ||
                      overlap(first.scratch_base(), first.layout_.scratch_bytes, second.scratch_base(),
                              second.layout_.scratch_bytes);
  if (shared)
    throw InvalidArgument("second: expected a workspace (and split-KV scratch) apart from first's; the two parts run "
                          "at the same time");
  source_ = catalog::batch_prefill_pair(first.spec_, first.config_, second.spec_, second.config_);
  smem_bytes_ = std::max(first.config_.smem_bytes, second.config_.smem_bytes);
  cuda::DeviceGuard guard(first.ws_->device());
  kernel_ = &jit::KernelCache::global().kernel(source_, first.ws_->device());
  kernel_->set_max_dynamic_smem(smem_bytes_);
}

void PrefillPair::run(const PrefillRunArgs& a, const PrefillRunArgs& b, cudaStream_t stream) const {
  struct Part {
    const BatchPrefill* w;
    const PrefillRunArgs* args;
    const TensorView* mask;
    PrefillParams<NoExtra> p;
    ParamBlock block;
    device::PagedKV view;
  };
  Part parts[2] = {{first_, &a, nullptr, {}, {}, {}}, {second_, &b, nullptr, {}, {}, {}}};
  for (Part& part : parts) {
    const BatchPrefill& w = *part.w;
    const PrefillRunArgs& r = *part.args;
    const char* name = part.w == first_ ? "first" : "second";
    part.mask = r.packed_custom_mask.defined() ? &r.packed_custom_mask : nullptr;
    device::PagedKV& view = part.view;
    if (w.source_kind_ == BatchPrefill::Source::kRagged) {
      if (r.kv != nullptr)
        throw InvalidArgument(std::string(name) + ".kv: expected null for a ragged plan (it reads k and v)");
      view = w.ragged_run_view(r.q, r.k, r.v, part.mask, r.o, r.lse);
    } else {
      if (r.kv == nullptr)
        throw InvalidArgument(std::string(name) + ".kv: expected the page storage of a paged or BSR plan");
      if (detail::has(r.k) || detail::has(r.v))
        throw InvalidArgument(std::string(name) + ".k, " + name + ".v: expected undefined views for a paged plan");
      view = w.paged_run_view(r.q, *r.kv, part.mask, r.o, r.lse);
    }
    w.pack_run(r.q, r.o, r.lse, view, part.mask, r.opt, part.p, part.block);
  }
  if (parts[0].args->q.device != parts[1].args->q.device)
    throw InvalidArgument("second.q: expected first.q's device");
  cuda::DeviceGuard guard(first_->ws_->device());
  const bool pdl_asked = a.opt.pdl;
  bool trimmed = false;
  for (Part& part : parts)
    if (part.w->trims(part.mask)) {
      part.w->trim_items(*part.mask, stream, pdl_asked);
      trimmed = true;
    }
  // Neither part may start early behind a kernel that writes its queues
  // (the mask trims, a device planner).
  const bool ahead_first = first_->device_.take_planner_ahead();
  const bool ahead_second = second_->device_.take_planner_ahead();
  const bool pdl = pdl_asked && !trimmed && !ahead_first && !ahead_second;
  int ctas_first = first_->ctas_per_group_, ctas_second = second_->ctas_per_group_;
  const dim3 grid(std::max(ctas_first, ctas_second), first_->head_groups_), threads(first_->config_.threads);
  if (first_->config_.hopper) {
    Sm90TensorMaps maps = first_->tensor_maps(a.q, parts[0].view), maps2 = second_->tensor_maps(b.q, parts[1].view);
    void* args[] = {parts[0].block.data(), parts[1].block.data(), &maps, &maps2, &ctas_first, &ctas_second};
    kernel_->launch_params(grid, threads, smem_bytes_, stream, args, pdl);
  } else {
    void* args[] = {parts[0].block.data(), parts[1].block.data(), &ctas_first, &ctas_second};
    kernel_->launch_params(grid, threads, smem_bytes_, stream, args, pdl);
  }
  detail::check_launch("PrefillPair::run");
}

}  // namespace tessera
