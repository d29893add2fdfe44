// Page tables that stay on the GPU.
//
// Serving engines keep their block tables in device memory, and FlashInfer's
// plan() never reads the page ids. Tessera's plan() does the same when
// kv_indices is a CUDA tensor: it copies the ids into the workspace on the
// stream (no host read, no synchronization, so plan()'s host time no longer
// grows with the number of pages), and the kernels check every id against
// the storage's page count instead.
//
// A failed check cannot throw where it happens. The kernel records it in
// pinned memory and reads zeros (or page 0) in its place, never memory
// outside the cache; the wrapper raises it at its next plan() or run(),
// naming the id, as CUDA reports its own asynchronous errors: the outputs of
// the runs since the previous check are invalid. Host page ids (a
// std::span) are checked by plan() itself, at once, and by the kernels too.
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>
#include <span>
#include <vector>

#include "tessera/core/tensor.hpp"

namespace tessera {

// plan()'s page ids: host memory (checked and staged by plan()), or device
// memory (copied on the stream, checked by the kernels). count =
// kv_indptr[batch] either way.
struct PageIds {
  std::span<const int32_t> host;
  const int32_t* device = nullptr;
  int64_t count = 0;
  bool on_device() const { return device != nullptr; }
  static PageIds from_host(std::span<const int32_t> ids) { return {ids, nullptr, static_cast<int64_t>(ids.size())}; }
};

// Four ints of mapped pinned memory where a kernel records a failed check
// (fields 1..3, a fence, then the flag in field 0), allocated at the first
// device_ptr() and read by the host without synchronizing.
class MappedErrorRecord {
 public:
  MappedErrorRecord() = default;
  ~MappedErrorRecord();
  MappedErrorRecord(MappedErrorRecord&& o) noexcept;
  MappedErrorRecord& operator=(MappedErrorRecord&& o) noexcept;
  int* device_ptr();

 protected:
  // Whether a kernel recorded a failure since the last call; its fields
  // (the flag is cleared).
  bool take(int (&fields)[3]);

 private:
  int* host_ = nullptr;
  int* device_ = nullptr;
};

// Where the kernels record a failed page-id check (flag, id, num_pages).
class PageIdErrors : public MappedErrorRecord {
 public:
  // Throws InvalidArgument naming `what` if a kernel recorded a bad id since
  // the last call (and clears the record). Reads pinned memory: no
  // synchronization, so a kernel still running reports at a later call.
  void raise_pending(const char* what);
};

// Where the device planner records a failed input check (flag, code,
// request, value; abi/device_plan_params.cuh), raised like PageIdErrors.
class DevicePlanErrors : public MappedErrorRecord {
 public:
  void raise_pending();
};

class Workspace;

namespace detail {
// Device page ids for plan(): kv_indptr non-empty, and kv_indices a 1-D
// contiguous int32 CUDA tensor on the workspace's device with at least
// kv_indptr[batch] entries (FlashInfer's buffers may be longer); its first
// kv_indptr[batch] are the ids.
PageIds device_page_ids(const TensorView& kv_indices, std::span<const int32_t> kv_indptr, int workspace_device);
// The page table's checks for either kind of ids (check_page_table, or
// check_page_lengths for device ids) and each request's KV length into
// kv_lens; returns the largest page id the storage must hold (-1: none;
// device ids: 0, the kernels check the rest).
int32_t check_page_ids(std::span<const int32_t> kv_indptr, const PageIds& ids,
                       std::span<const int32_t> kv_last_page_len, int32_t page_size, std::vector<int32_t>& kv_lens);
// A plan's upload when the ids are the workspace's last staged section, at
// `offset`: host ids are staged there and uploaded with the rest (only as
// many as the plan has); device ids are copied there on the stream after
// the upload, never read by the host. Call after stage_begin().
void upload_with_page_ids(Workspace& ws, size_t offset, const PageIds& ids, cudaStream_t stream);
}  // namespace detail

}  // namespace tessera
