// GPU test helpers: skip without a GPU (reported as "skipped: no GPU"),
// device copies of host tensors, poisoned outputs, and the error metric every
// GPU check uses (max |out - ref| / max |ref|, NaN never passes).
#pragma once
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "tessera/runtime/cuda.hpp"
#include "tessera/runtime/device_buffer.hpp"
#include "test_util.hpp"

#define SKIP_WITHOUT_GPU() \
  if (!::tessera::cuda::gpu_available()) GTEST_SKIP() << "skipped: no GPU"

namespace tessera::test {

struct DeviceTensor {
  cuda::DeviceBuffer buf;
  TensorView view;
};

// Same shape, strides and bytes as the host tensor (padding included).
inline DeviceTensor to_device(const HostTensor& h) {
  DeviceTensor d{cuda::DeviceBuffer(std::max<size_t>(h.storage.size(), 16)), h.view};
  if (!h.storage.empty()) d.buf.upload(h.storage.data(), h.storage.size());
  d.view.data = static_cast<char*>(d.buf.get()) + (static_cast<const uint8_t*>(h.view.data) - h.storage.data());
  d.view.device = Device{DeviceType::kCUDA, cuda::current_device()};
  return d;
}

// A device tensor like `like` filled with 0xFF bytes (NaN for fp16/bf16/fp32).
inline DeviceTensor poisoned_like(const HostTensor& like) {
  DeviceTensor d = to_device(like);
  d.buf.fill(0xFF);
  return d;
}

// Copies a device tensor back into a host tensor laid out like `like`.
inline HostTensor to_host(const DeviceTensor& d, const HostTensor& like) {
  HostTensor h = like;
  if (!h.storage.empty()) d.buf.download(h.storage.data(), h.storage.size());
  return h;
}

struct ErrorStats {
  double rel = 0;  // max |out - ref| / max |ref|
  bool nan = false;
};

inline ErrorStats compare(const std::vector<double>& out, const std::vector<double>& ref) {
  ErrorStats s;
  double max_err = 0, max_ref = 0;
  for (size_t i = 0; i < out.size(); ++i) {
    if (std::isnan(out[i])) s.nan = true;
    if (std::isinf(ref[i]) || std::isinf(out[i])) {  // -inf LSE must match exactly
      if (out[i] != ref[i]) max_err = INFINITY;
      continue;
    }
    max_err = std::max(max_err, std::abs(out[i] - ref[i]));
    max_ref = std::max(max_ref, std::abs(ref[i]));
  }
  s.rel = max_ref > 0 ? max_err / max_ref : max_err;
  return s;
}

inline double tolerance(DType t) { return t == DType::kFloat32 ? 1e-5 : (t == DType::kBFloat16 ? 1e-2 : 1e-3); }

#define EXPECT_CLOSE(stats, dtype)                                        \
  do {                                                                   \
    auto _s = (stats);                                                   \
    EXPECT_FALSE(_s.nan) << "NaN in output";                             \
    EXPECT_LT(_s.rel, ::tessera::test::tolerance(dtype)) << "rel error"; \
  } while (0)

inline bool bitwise_equal(const HostTensor& a, const HostTensor& b) { return a.storage == b.storage; }

// The launches fn() makes on `stream`, captured and instantiated as a CUDA
// graph, destroyed with the object (also when an ASSERT leaves the test).
class CapturedGraph {
 public:
  template <typename Fn>
  CapturedGraph(cudaStream_t stream, Fn fn) {
    TESSERA_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    fn();
    TESSERA_CUDA_CHECK(cudaStreamEndCapture(stream, &graph_));
    TESSERA_CUDA_CHECK(cudaGraphInstantiate(&exec_, graph_, 0));
  }
  CapturedGraph(const CapturedGraph&) = delete;
  CapturedGraph& operator=(const CapturedGraph&) = delete;
  ~CapturedGraph() {
    if (exec_ != nullptr) EXPECT_EQ(cudaGraphExecDestroy(exec_), cudaSuccess);
    if (graph_ != nullptr) EXPECT_EQ(cudaGraphDestroy(graph_), cudaSuccess);
  }
  void launch(cudaStream_t stream) const { TESSERA_CUDA_CHECK(cudaGraphLaunch(exec_, stream)); }

 private:
  cudaGraph_t graph_ = nullptr;
  cudaGraphExec_t exec_ = nullptr;
};

}  // namespace tessera::test
