#include "tessera/api/page_ids.hpp"

#include <string>
#include <utility>

#include "tessera/core/error.hpp"
#include "tessera/runtime/cuda.hpp"

namespace tessera {

PageIdErrors::~PageIdErrors() {
  if (host_) (void)cudaFreeHost(host_);
}

PageIdErrors::PageIdErrors(PageIdErrors&& o) noexcept
    : host_(std::exchange(o.host_, nullptr)), device_(std::exchange(o.device_, nullptr)) {}

PageIdErrors& PageIdErrors::operator=(PageIdErrors&& o) noexcept {
  if (this != &o) {
    if (host_) (void)cudaFreeHost(host_);
    host_ = std::exchange(o.host_, nullptr);
    device_ = std::exchange(o.device_, nullptr);
  }
  return *this;
}

int* PageIdErrors::device_ptr() {
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

void PageIdErrors::raise_pending(const char* what) {
  if (!host_) return;
  volatile int* e = host_;
  if (e[0] == 0) return;
  const int id = e[1], num_pages = e[2];
  e[0] = 0;
  throw InvalidArgument(std::string(what) + ": expected page ids in [0, " + std::to_string(num_pages) +
                        ") (the storage's num_pages), but a kernel met page id " + std::to_string(id) +
                        " in the device page table; the outputs of the runs since the previous plan() or run() "
                        "are invalid");
}

namespace detail {

PageIds device_page_ids(const TensorView& t, int64_t count, int workspace_device) {
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

}  // namespace detail

}  // namespace tessera
