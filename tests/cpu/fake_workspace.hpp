// A borrowed workspace over host memory for CPU tests of the wrappers'
// argument checks: plan() validation never touches it.
#pragma once
#include "tessera/api/workspace.hpp"

namespace tessera::test {

struct FakeWorkspace {
  alignas(256) static inline char buf[1 << 16];
  Workspace ws{buf, sizeof buf, buf, sizeof buf, 0};
};

}  // namespace tessera::test
