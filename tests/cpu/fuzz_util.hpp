// Seeded randomness shared by the planners' randomized tests
// (test_planner_fuzz.cpp, test_device_planner.cpp): per-case seeds from one
// base seed, a small generator, and lengths of several shapes. Test-only
// environment: TESSERA_FUZZ_SEED picks another base seed and
// TESSERA_FUZZ_SCALE multiplies the case counts, for longer local runs; CI
// runs the fixed defaults. Nothing in the library reads them.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <initializer_list>
#include <random>
#include <vector>

namespace tessera::test {

inline uint64_t env_or(const char* name, uint64_t fallback) {
  const char* v = std::getenv(name);
  return v && *v ? std::strtoull(v, nullptr, 0) : fallback;
}
inline uint64_t base_seed() { return env_or("TESSERA_FUZZ_SEED", 0x7E55E4A); }
inline int case_count(int n) { return n * static_cast<int>(std::max<uint64_t>(1, env_or("TESSERA_FUZZ_SCALE", 1))); }

// Independent per-case streams, so one case reruns from its seed alone.
inline uint64_t case_seed(uint64_t base, uint64_t stream, uint64_t i) {
  uint64_t z = base * 0x9E3779B97F4A7C15ull + stream * 0xBF58476D1CE4E5B9ull + i;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

struct Rng {
  std::mt19937_64 g;
  int64_t uniform(int64_t lo, int64_t hi) { return std::uniform_int_distribution<int64_t>(lo, hi)(g); }
  double real(double lo, double hi) { return std::uniform_real_distribution<double>(lo, hi)(g); }
  bool chance(double p) { return real(0, 1) < p; }
  // Spread over orders of magnitude, so short and long lengths both come up.
  int64_t log_uniform(int64_t lo, int64_t hi) {
    return std::clamp<int64_t>(static_cast<int64_t>(std::exp(real(std::log(lo + 1.0), std::log(hi + 1.0)))) - 1, lo,
                               hi);
  }
  template <typename T>
  T pick(std::initializer_list<T> xs) {
    return xs.begin()[uniform(0, static_cast<int64_t>(xs.size()) - 1)];
  }
};

inline constexpr int32_t kMaxLen = 200000;
inline constexpr const char* kDistNames[] = {"constant", "uniform", "zipf", "zeros", "one-huge", "few-values", "tiny"};

// Lengths from one of several shapes: equal, uniform, Zipf-like skew, mostly
// zeros, one huge request among short ones, few distinct values (ties), and
// lengths around min_chunk / chunk_align.
inline std::vector<int32_t> draw_lengths(Rng& rng, int n, int dist) {
  std::vector<int32_t> v(n);
  const int64_t max_len = rng.log_uniform(1, kMaxLen);
  switch (dist) {
    case 0:
      std::fill(v.begin(), v.end(), static_cast<int32_t>(max_len));
      break;
    case 1:
      for (auto& x : v) x = static_cast<int32_t>(rng.uniform(0, max_len));
      break;
    case 2: {
      const double s = rng.real(0.5, 2.0);
      for (int i = 0; i < n; ++i) v[i] = static_cast<int32_t>(max_len / std::pow(i + 1.0, s));
      std::shuffle(v.begin(), v.end(), rng.g);
      break;
    }
    case 3:
      for (auto& x : v) x = rng.chance(0.8) ? 0 : static_cast<int32_t>(rng.uniform(0, max_len));
      break;
    case 4:
      for (auto& x : v) x = static_cast<int32_t>(rng.uniform(0, 2000));
      if (n > 0) v[rng.uniform(0, n - 1)] = static_cast<int32_t>(rng.uniform(kMaxLen / 2, kMaxLen));
      break;
    case 5: {
      const int64_t step = rng.log_uniform(1, 8000);
      for (auto& x : v) x = static_cast<int32_t>(rng.uniform(0, 4) * step + rng.uniform(0, 2));
      break;
    }
    default:
      for (auto& x : v) x = static_cast<int32_t>(rng.uniform(0, 130));
  }
  return v;
}

}  // namespace tessera::test
