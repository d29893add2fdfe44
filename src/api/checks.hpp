// Validation shared by the API entry points (internal header).
#pragma once
#include <cstdint>
#include <string>

#include "tessera/core/tensor.hpp"
#include "tessera/runtime/cuda.hpp"

namespace tessera::detail {

inline std::string str(int64_t v) { return std::to_string(v); }

// A CUDA tensor whose rows are 16-byte aligned vectors: last dim contiguous,
// data pointer and every other stride 16-byte aligned.
inline void check_cuda_vectors(const char* name, const TensorView& t) {
  if (!t.device.is_cuda()) throw TypeMismatch(std::string(name) + ": expected a CUDA tensor, got " + t.device.str());
  check_last_dim_contiguous(name, t, 16 / static_cast<int64_t>(dtype_size(t.dtype)));
  if (reinterpret_cast<uintptr_t>(t.data) % 16 != 0)
    throw InvalidArgument(std::string(name) + ": expected a 16-byte aligned data pointer");
}

inline void require_gpu(const char* what) {
  if (!cuda::gpu_available()) throw CudaError(std::string(what) + ": " + cuda::no_gpu_reason());
}

inline void check_launch(const char* what) {
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) cuda::throw_cuda_error(err, what, __FILE__, __LINE__);
}

}  // namespace tessera::detail
