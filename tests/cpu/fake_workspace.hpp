// A borrowed workspace over host memory for CPU tests of the wrappers'
// argument checks: plan() validation never touches it.
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

#include "tessera/api/workspace.hpp"

namespace tessera::test {

struct FakeWorkspace {
  alignas(256) static inline char buf[1 << 16];
  Workspace ws{buf, sizeof buf, buf, sizeof buf, 0};
};

// A borrowed workspace of given sizes over host memory, both sections
// 256-byte aligned (e.g. a CascadeAttention's, sized by its workspace_size).
struct HostWorkspace {
  std::vector<char> dev, host;
  Workspace ws;
  HostWorkspace(size_t device_bytes, size_t host_bytes)
      : dev(device_bytes + 256), host(host_bytes + 256),
        ws(aligned(dev), device_bytes, aligned(host), host_bytes, 0) {}
  static char* aligned(std::vector<char>& v) {
    return reinterpret_cast<char*>((reinterpret_cast<uintptr_t>(v.data()) + 255) / 256 * 256);
  }
};

}  // namespace tessera::test
