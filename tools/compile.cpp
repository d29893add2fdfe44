// `tessera compile`: JIT-compiles every built-in kernel to cubin for the
// given architectures, with no GPU needed (CI runs this for sm_80 and sm_90a).
// With --pack DIR it also writes them to a kernel pack (the install's
// prebuilt kernels, jit.hpp).
// With --load (GPU only) it also loads each kernel onto the device and times
// that, and times in-memory lookups of loaded kernels.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <stdexcept>

#include "commands.hpp"
#include "tessera/runtime/cuda.hpp"
#include "tessera/runtime/jit.hpp"
#include "tessera/runtime/kernel_catalog.hpp"
#include "tessera/runtime/prefill_catalog.hpp"

namespace tessera::tools {

namespace {
double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

// KernelCache::precompile, with a progress line at most every 15 s: a cold
// cache takes minutes on a small machine, and a silent step looks hung.
void compile_with_progress(jit::KernelCache& cache, const std::vector<jit::KernelSource>& kernels,
                           const jit::Arch& arch, int threads) {
  const auto t0 = std::chrono::steady_clock::now();
  double last_report_ms = 0;
  cache.precompile(kernels, arch, threads, [&](size_t done, size_t total) {
    const double ms = ms_since(t0);
    if (done == total || ms - last_report_ms < 15000) return;
    last_report_ms = ms;
    std::printf("  %s: %zu/%zu kernels, %.0f s\n", arch.str().c_str(), done, total, ms / 1e3);
    std::fflush(stdout);
  });
}

// Writes each kernel's cubin to DIR/<key>.cubin: a kernel pack (jit.hpp).
void write_pack(jit::KernelCache& cache, const std::vector<jit::KernelSource>& kernels, const jit::Arch& arch,
                const std::string& dir) {
  std::filesystem::create_directories(dir);
  for (const auto& k : kernels) {
    auto bin = cache.cubin(k, arch);
    const auto path = std::filesystem::path(dir) / (bin->key + ".cubin");
    const auto tmp = path.string() + ".tmp";
    std::ofstream out(tmp, std::ios::binary);
    out.write(bin->image.data(), static_cast<std::streamsize>(bin->image.size()));
    out.close();
    if (!out) throw std::runtime_error("cannot write " + tmp);
    std::filesystem::rename(tmp, path);
  }
}
}  // namespace

int run_compile(const std::vector<std::string>& archs, int threads, bool verbose, bool load, const std::string& pack) {
  auto& cache = jit::KernelCache::global();
  auto kernels = catalog::builtin_kernels();
  for (auto& k : catalog::builtin_prefill_kernels()) kernels.push_back(std::move(k));
  std::printf("kernel cache: %s\n", cache.dir().c_str());
  std::fflush(stdout);
  for (const auto& name : archs) {
    const jit::Arch arch = jit::Arch::parse(name);
    const auto t0 = std::chrono::steady_clock::now();
    compile_with_progress(cache, kernels, arch, threads);
    const double s = ms_since(t0) / 1e3;
    int compiled = 0;
    double compile_ms = 0, max_compile = 0, load_ms = 0, max_load = 0;
    for (const auto& k : kernels) {
      auto bin = cache.cubin(k, arch);  // a memory hit now: reports how each was obtained
      compiled += bin->from_disk ? 0 : 1;
      compile_ms += bin->compile_ms;
      max_compile = std::max(max_compile, bin->compile_ms);
      load_ms += bin->load_ms;
      max_load = std::max(max_load, bin->load_ms);
      if (verbose)
        std::printf("  %-8s %-48s %8zu bytes  %s\n", arch.str().c_str(), k.entry.c_str(), bin->image.size(),
                    bin->from_disk ? ("disk cache, " + std::to_string(bin->load_ms) + " ms").c_str()
                                   : ("compiled, " + std::to_string(bin->compile_ms) + " ms").c_str());
    }
    const int from_disk = static_cast<int>(kernels.size()) - compiled;
    std::printf("%s: %zu kernels ready in %.2f s | compiled %d (mean %.0f ms, max %.0f ms per kernel) | from disk %d "
                "(mean %.2f ms, max %.2f ms per kernel)\n",
                arch.str().c_str(), kernels.size(), s, compiled, compiled ? compile_ms / compiled : 0.0, max_compile,
                from_disk, from_disk ? load_ms / from_disk : 0.0, max_load);
    if (!pack.empty()) {
      write_pack(cache, kernels, arch, pack);
      std::printf("%s: %zu kernels written to the kernel pack %s\n", arch.str().c_str(), kernels.size(), pack.c_str());
    }
    std::fflush(stdout);
  }
  if (load) {
    if (!cuda::gpu_available()) {
      std::printf("--load: no GPU (%s)\n", cuda::no_gpu_reason().c_str());
      return 0;
    }
    const int dev = cuda::current_device();
    double total = 0, worst = 0;
    for (const auto& k : kernels) {
      const auto t0 = std::chrono::steady_clock::now();
      cache.kernel(k, dev);  // cubin from memory/disk + module load onto the GPU
      const double ms = ms_since(t0);
      total += ms;
      worst = std::max(worst, ms);
    }
    const int reps = 10000;
    const auto t1 = std::chrono::steady_clock::now();
    for (int i = 0; i < reps; ++i) cache.kernel(kernels[i % kernels.size()], dev);
    const double lookup_us = ms_since(t1) * 1e3 / reps;
    std::printf("load onto %s: %zu kernels, mean %.2f ms, max %.2f ms per kernel (cubin fetch + module load); "
                "in-memory lookup %.2f us\n",
                jit::Arch::of_device(dev).str().c_str(), kernels.size(), total / kernels.size(), worst, lookup_us);
  }
  return 0;
}

}  // namespace tessera::tools
