#include "tessera/runtime/cuda.hpp"

#include <sstream>

namespace tessera::cuda {

void throw_cuda_error(cudaError_t err, const char* expr, const char* file, int line) {
  std::ostringstream os;
  os << "CUDA error " << cudaGetErrorName(err) << " (" << cudaGetErrorString(err) << ") in " << expr
     << " at " << file << ":" << line;
  throw CudaError(os.str());
}

namespace {
struct Probe {
  int count = 0;
  std::string reason;
};
// Probed once: the answer cannot change within a process, and a failed
// probe must not leave a sticky error behind for later calls.
const Probe& probe() {
  static const Probe p = [] {
    Probe r;
    cudaError_t err = cudaGetDeviceCount(&r.count);
    if (err != cudaSuccess) {
      r.count = 0;
      r.reason = std::string("no usable CUDA device: ") + cudaGetErrorString(err);
      (void)cudaGetLastError();
    } else if (r.count == 0) {
      r.reason = "no CUDA device found";
    }
    return r;
  }();
  return p;
}
}  // namespace

int device_count() { return probe().count; }
bool gpu_available() { return probe().count > 0; }
std::string no_gpu_reason() { return probe().reason; }

int current_device() {
  int d = 0;
  TESSERA_CUDA_CHECK(cudaGetDevice(&d));
  return d;
}

DeviceGuard::DeviceGuard(int device) {
  int cur = current_device();
  if (cur != device) {
    TESSERA_CUDA_CHECK(cudaSetDevice(device));
    prev_ = cur;
  }
}

DeviceGuard::~DeviceGuard() {
  if (prev_ >= 0) (void)cudaSetDevice(prev_);
}

DeviceInfo device_info(int device) {
  cudaDeviceProp prop{};
  TESSERA_CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
  DeviceInfo info;
  info.index = device;
  info.name = prop.name;
  info.major = prop.major;
  info.minor = prop.minor;
  info.sm_count = prop.multiProcessorCount;
  info.l2_bytes = prop.l2CacheSize;
  info.smem_per_block_optin = prop.sharedMemPerBlockOptin;
  return info;
}

}  // namespace tessera::cuda
