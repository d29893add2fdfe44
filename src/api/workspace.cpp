#include "tessera/api/workspace.hpp"

#include <utility>

#include "tessera/core/error.hpp"
#include "tessera/runtime/cuda.hpp"

namespace tessera {

Workspace Workspace::allocate(size_t device_bytes, size_t host_bytes, int device) {
  if (!cuda::gpu_available()) throw CudaError("Workspace::allocate: " + cuda::no_gpu_reason());
  if (device < 0) device = cuda::current_device();
  Workspace w;
  w.device_index_ = device;
  w.owned_ = true;
  int prev = cuda::current_device();
  TESSERA_CUDA_CHECK(cudaSetDevice(device));
  try {
    if (device_bytes) TESSERA_CUDA_CHECK(cudaMalloc(&w.device_, device_bytes));
    if (host_bytes) TESSERA_CUDA_CHECK(cudaMallocHost(&w.host_, host_bytes));
  } catch (...) {
    (void)cudaSetDevice(prev);
    throw;  // w's destructor frees what was allocated
  }
  TESSERA_CUDA_CHECK(cudaSetDevice(prev));
  w.device_bytes_ = device_bytes;
  w.host_bytes_ = host_bytes;
  return w;
}

Workspace::Workspace(void* device_buf, size_t device_bytes, void* pinned_host_buf, size_t host_bytes, int device)
    : device_(device_buf), host_(pinned_host_buf), device_bytes_(device_bytes), host_bytes_(host_bytes),
      device_index_(device) {
  if (device_bytes && !device_buf) throw InvalidArgument("workspace: expected a device buffer, got null");
  if (host_bytes && !pinned_host_buf) throw InvalidArgument("workspace: expected a pinned host buffer, got null");
  if (reinterpret_cast<uintptr_t>(device_buf) % 256 != 0)
    throw InvalidArgument("workspace: expected a device buffer aligned to 256 bytes");
}

Workspace::~Workspace() { release(); }

Workspace::Workspace(Workspace&& o) noexcept { *this = std::move(o); }

Workspace& Workspace::operator=(Workspace&& o) noexcept {
  if (this != &o) {
    release();
    device_ = std::exchange(o.device_, nullptr);
    host_ = std::exchange(o.host_, nullptr);
    device_bytes_ = std::exchange(o.device_bytes_, 0);
    host_bytes_ = std::exchange(o.host_bytes_, 0);
    device_index_ = o.device_index_;
    owned_ = std::exchange(o.owned_, false);
    upload_done_ = std::exchange(o.upload_done_, nullptr);
  }
  return *this;
}

void Workspace::release() {
  if (upload_done_) (void)cudaEventDestroy(upload_done_);
  if (owned_) {
    if (device_) (void)cudaFree(device_);
    if (host_) (void)cudaFreeHost(host_);
  }
  device_ = host_ = nullptr;
  upload_done_ = nullptr;
  owned_ = false;
}

void Workspace::stage_begin() {
  if (upload_done_) TESSERA_CUDA_CHECK(cudaEventSynchronize(upload_done_));
}

void Workspace::upload(size_t bytes, cudaStream_t stream) {
  if (bytes > host_bytes_ || bytes > device_bytes_)
    throw InvalidArgument("workspace: expected at least " + std::to_string(bytes) + " bytes of device and pinned host " +
                          "buffer, got " + std::to_string(device_bytes_) + " and " + std::to_string(host_bytes_));
  if (!upload_done_) TESSERA_CUDA_CHECK(cudaEventCreateWithFlags(&upload_done_, cudaEventDisableTiming));
  TESSERA_CUDA_CHECK(cudaMemcpyAsync(device_, host_, bytes, cudaMemcpyHostToDevice, stream));
  TESSERA_CUDA_CHECK(cudaEventRecord(upload_done_, stream));
}

}  // namespace tessera
