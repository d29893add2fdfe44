#include "tessera/api/page_ids.hpp"

#include <cstring>
#include <string>
#include <utility>

#include "tessera/api/workspace.hpp"
#include "tessera/core/error.hpp"
#include "tessera/formats/paged_kv.hpp"
#include "tessera/runtime/cuda.hpp"
#include "tessera/runtime/device_planner.hpp"

namespace tessera {

MappedErrorRecord::~MappedErrorRecord() {
  if (host_) (void)cudaFreeHost(host_);
}

MappedErrorRecord::MappedErrorRecord(MappedErrorRecord&& o) noexcept
    : host_(std::exchange(o.host_, nullptr)), device_(std::exchange(o.device_, nullptr)) {}

MappedErrorRecord& MappedErrorRecord::operator=(MappedErrorRecord&& o) noexcept {
  if (this != &o) {
    if (host_) (void)cudaFreeHost(host_);
    host_ = std::exchange(o.host_, nullptr);
    device_ = std::exchange(o.device_, nullptr);
  }
  return *this;
}

int* MappedErrorRecord::device_ptr() {
  if (!device_) {
    void* h = nullptr;
    // Portable: the wrapper's device need not be the current one.
    TESSERA_CUDA_CHECK(cudaHostAlloc(&h, 4 * sizeof(int), cudaHostAllocMapped | cudaHostAllocPortable));
    host_ = static_cast<int*>(h);
    for (int i = 0; i < 4; ++i) host_[i] = 0;
    void* d = nullptr;
    TESSERA_CUDA_CHECK(cudaHostGetDevicePointer(&d, h, 0));
    device_ = static_cast<int*>(d);
  }
  return device_;
}

bool MappedErrorRecord::take(int (&fields)[3]) {
  if (!host_) return false;
  volatile int* e = host_;
  if (e[0] == 0) return false;
  for (int i = 0; i < 3; ++i) fields[i] = e[i + 1];
  e[0] = 0;
  return true;
}

void PageIdErrors::raise_pending(const char* what) {
  int f[3];
  if (!take(f)) return;
  throw InvalidArgument(std::string(what) + ": expected page ids in [0, " + std::to_string(f[1]) +
                        ") (the storage's num_pages), but a kernel met page id " + std::to_string(f[0]) +
                        " in the device page table; the outputs of the runs since the previous plan() or run() "
                        "are invalid");
}

void DevicePlanErrors::raise_pending() {
  int f[3];
  if (!take(f)) return;
  throw InvalidArgument(device_plan_error_message(f[0], f[1], f[2]) +
                        " in the device planner's inputs; the outputs of the runs since it planned are invalid");
}

namespace detail {

PageIds device_page_ids(const TensorView& t, std::span<const int32_t> kv_indptr, int workspace_device) {
  if (kv_indptr.empty()) throw InvalidArgument("kv_indptr: expected batch + 1 elements, got 0");
  const int64_t count = kv_indptr.back();
  const char* name = "kv_indices";
  check_dim(name, t, 1);
  check_dtype(name, t, DType::kInt32);
  check_contiguous(name, t);
  check_device(name, t, Device{DeviceType::kCUDA, workspace_device});
  if (t.size(0) < count)
    throw InvalidArgument(std::string(name) + ": expected at least " + std::to_string(count) +
                          " entries (kv_indptr[batch]), got " + std::to_string(t.size(0)));
  return {{}, static_cast<const int32_t*>(t.data), count};
}

int32_t check_page_ids(std::span<const int32_t> kv_indptr, const PageIds& ids,
                       std::span<const int32_t> kv_last_page_len, int32_t page_size, std::vector<int32_t>& kv_lens) {
  if (!ids.on_device()) return check_page_table(kv_indptr, ids.host, kv_last_page_len, page_size, kv_lens);
  check_page_lengths(kv_indptr, ids.count, kv_last_page_len, page_size, kv_lens);
  return ids.count > 0 ? 0 : -1;
}

void upload_with_page_ids(Workspace& ws, size_t offset, const PageIds& ids, cudaStream_t stream) {
  const size_t bytes = sizeof(int32_t) * static_cast<size_t>(ids.count);
  if (!ids.host.empty()) std::memcpy(static_cast<char*>(ws.host_ptr()) + offset, ids.host.data(), bytes);
  ws.upload(offset + (ids.on_device() ? 0 : bytes), stream);
  if (ids.on_device() && bytes)
    TESSERA_CUDA_CHECK(cudaMemcpyAsync(static_cast<char*>(ws.device_ptr()) + offset, ids.device, bytes,
                                       cudaMemcpyDeviceToDevice, stream));
}

}  // namespace detail

}  // namespace tessera
