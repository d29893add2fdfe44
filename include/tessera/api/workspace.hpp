// Workspace: the fixed-address device buffer plus pinned host buffer that a
// wrapper's plan() fills (scheduling metadata, index arrays) and its run()
// reads. Fixed addresses are what make run() capturable in a CUDA graph
// (paper Appendix D.1). Either owned (allocated here) or borrowed from the
// caller (e.g. a torch tensor and a pinned torch tensor).
#pragma once
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace tessera {

class Workspace {
 public:
  // Owned: allocates device_bytes on `device` (-1: current) and host_bytes of
  // pinned host memory.
  static Workspace allocate(size_t device_bytes, size_t host_bytes, int device = -1);
  // Borrowed: the caller keeps both buffers alive and unchanged while in use.
  Workspace(void* device_buf, size_t device_bytes, void* pinned_host_buf, size_t host_bytes, int device);
  Workspace() = default;
  ~Workspace();
  Workspace(Workspace&&) noexcept;
  Workspace& operator=(Workspace&&) noexcept;
  Workspace(const Workspace&) = delete;
  Workspace& operator=(const Workspace&) = delete;

  void* device_ptr() const { return device_; }
  size_t device_bytes() const { return device_bytes_; }
  void* host_ptr() const { return host_; }
  size_t host_bytes() const { return host_bytes_; }
  int device() const { return device_index_; }

  // Host -> device copy of the first `bytes` of the pinned buffer to the
  // device buffer, asynchronous on `stream`. The next stage_begin() waits for
  // it, so a new plan never overwrites pinned data still being copied.
  void upload(size_t bytes, cudaStream_t stream);
  // Call before writing the pinned buffer.
  void stage_begin();

 private:
  void release();
  void* device_ = nullptr;
  void* host_ = nullptr;
  size_t device_bytes_ = 0, host_bytes_ = 0;
  int device_index_ = 0;
  bool owned_ = false;
  cudaEvent_t upload_done_ = nullptr;
};

// Bytes a wrapper needs: device workspace and pinned host staging buffer.
struct WorkspaceSizes {
  size_t device_bytes = 0, host_bytes = 0;
};

// Lays out fixed sections in a workspace: each add() returns an offset,
// aligned so every section can hold 16-byte vectors.
class WorkspaceLayout {
 public:
  size_t add(size_t bytes, size_t align = 256) {
    offset_ = (offset_ + align - 1) / align * align;
    size_t at = offset_;
    offset_ += bytes;
    return at;
  }
  size_t total() const { return offset_; }

 private:
  size_t offset_ = 0;
};

}  // namespace tessera
