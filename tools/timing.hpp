// Host timing helpers of the `tessera` tool's measurements.
#pragma once
#include <algorithm>
#include <chrono>
#include <vector>

namespace tessera::tools {

using Clock = std::chrono::steady_clock;

inline double us_since(Clock::time_point t0, Clock::time_point t1) {
  return std::chrono::duration<double, std::micro>(t1 - t0).count();
}

// The median of v (the upper one of an even count; 0 when empty).
inline double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace tessera::tools
