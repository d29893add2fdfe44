// An owning device allocation (RAII over cudaMalloc/cudaFree) for tools,
// tests and benchmarks. The attention API itself never allocates in run().
#pragma once
#include <cuda_runtime_api.h>

#include <cstddef>
#include <utility>
#include <vector>

#include "tessera/runtime/cuda.hpp"

namespace tessera::cuda {

class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t bytes) : bytes_(bytes) {
    if (bytes) TESSERA_CUDA_CHECK(cudaMalloc(&ptr_, bytes));
  }
  ~DeviceBuffer() {
    if (ptr_) (void)cudaFree(ptr_);
  }
  DeviceBuffer(DeviceBuffer&& o) noexcept : ptr_(std::exchange(o.ptr_, nullptr)), bytes_(std::exchange(o.bytes_, 0)) {}
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    std::swap(ptr_, o.ptr_);
    std::swap(bytes_, o.bytes_);
    return *this;
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  void* get() const { return ptr_; }
  size_t bytes() const { return bytes_; }
  template <typename T>
  T* as() const { return static_cast<T*>(ptr_); }

  void upload(const void* host, size_t bytes) { TESSERA_CUDA_CHECK(cudaMemcpy(ptr_, host, bytes, cudaMemcpyHostToDevice)); }
  void download(void* host, size_t bytes) const { TESSERA_CUDA_CHECK(cudaMemcpy(host, ptr_, bytes, cudaMemcpyDeviceToHost)); }
  // Fills with a byte pattern (0xFF in fp16/bf16/fp32 is NaN: "poison") and
  // waits for it, as upload and download do: cudaMemset runs on the legacy
  // default stream, which a non-blocking stream does not wait for, so a
  // kernel (or graph) launched there next could run before the memset and be
  // overwritten by it (seen as NaN outputs in the GPU suite's graph tests).
  void fill(int byte) {
    TESSERA_CUDA_CHECK(cudaMemset(ptr_, byte, bytes_));
    TESSERA_CUDA_CHECK(cudaDeviceSynchronize());
  }

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

}  // namespace tessera::cuda
