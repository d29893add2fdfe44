// Thin helpers over the CUDA runtime: error checking that throws CudaError,
// and GPU discovery that answers "no GPU" instead of failing when the driver
// is missing (the runtime is linked statically and opens the driver lazily).
#pragma once
#include <cuda_runtime_api.h>

#include <string>

#include "tessera/core/error.hpp"

namespace tessera::cuda {

[[noreturn]] void throw_cuda_error(cudaError_t err, const char* expr, const char* file, int line);

// Number of usable CUDA devices; 0 when there is no driver or no device.
int device_count();
bool gpu_available();
// Why no GPU is usable (empty when one is).
std::string no_gpu_reason();

struct DeviceInfo {
  int index = 0;
  std::string name;
  int major = 0, minor = 0;
  int sm_count = 0;
  size_t l2_bytes = 0;
  size_t smem_per_block_optin = 0;
};
DeviceInfo device_info(int device);
int current_device();

// Makes `device` current for a scope (kernels launch on the current device),
// restoring the previous one on exit. A no-op when it is already current.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device);
  ~DeviceGuard();
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int prev_ = -1;
};

}  // namespace tessera::cuda

#define TESSERA_CUDA_CHECK(expr)                                                   \
  do {                                                                             \
    cudaError_t _tessera_err = (expr);                                             \
    if (_tessera_err != cudaSuccess)                                               \
      ::tessera::cuda::throw_cuda_error(_tessera_err, #expr, __FILE__, __LINE__); \
  } while (0)
