// `tessera`: the command-line tool.
//   tessera demo [--small] [--seed N] [--iters N]   serving-style attention step, verified
//   tessera compile [--arch sm_80,sm_90a] [--threads N] [--verbose] [--load] [--pack DIR]
//   tessera plan-time [--batch N] [--reps N]         host time of BatchDecode::plan()
//   tessera prefix-time [--batch N] [--tokens N] [--reps N]   host time of shared-prefix detection
//   tessera device-plan [--layers N] [--steps N]     decode steps planned on the GPU vs on the host
//   tessera info                                     GPU, NVRTC and cache
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <sstream>
#include <string>
#include <vector>

#include "commands.hpp"
#include "tessera/core/error.hpp"
#include "tessera/runtime/cuda.hpp"
#include "tessera/runtime/jit.hpp"

namespace {

void usage() {
  std::puts(
      "usage: tessera <command> [options]\n"
      "  demo     [--small] [--seed N] [--iters N]  run a verified serving-style attention step\n"
      "  compile  [--arch LIST] [--threads N] [--verbose] [--load] [--pack DIR]  JIT-compile every built-in\n"
      "           kernel (--pack: also write them to DIR, a kernel pack an install ships)\n"
      "  plan-time [--batch N] [--reps N]  host time of steady-state decode plan() calls\n"
      "  prefix-time [--batch N] [--tokens N] [--reps N]  host time of shared-prefix detection (no GPU needed)\n"
      "  device-plan [--layers N] [--steps N] [--max-batch N] [--max-len N] [--cuda-cores]\n"
      "                                    decode steps planned on the GPU in one graph vs host plans\n"
      "  info     show the GPU, NVRTC version and kernel cache directory");
}

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  for (std::string item; std::getline(ss, item, ',');)
    if (!item.empty()) out.push_back(item);
  return out;
}

int info() {
  std::printf("NVRTC %s\nkernel cache: %s\n", tessera::jit::nvrtc_version().c_str(),
              tessera::jit::default_cache_dir().c_str());
  if (!tessera::cuda::gpu_available()) {
    std::printf("GPU: none (%s)\n", tessera::cuda::no_gpu_reason().c_str());
    return 0;
  }
  for (int d = 0; d < tessera::cuda::device_count(); ++d) {
    auto i = tessera::cuda::device_info(d);
    std::printf("GPU %d: %s, sm_%d%d, %d SMs, L2 %zu MB, JIT target %s\n", d, i.name.c_str(), i.major, i.minor,
                i.sm_count, i.l2_bytes >> 20, tessera::jit::Arch::of_device(d).str().c_str());
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    usage();
    return 2;
  }
  const std::string cmd = argv[1];
  try {
    if (cmd == "demo") {
      tessera::tools::DemoOptions opt;
      for (int i = 2; i < argc; ++i) {
        std::string a = argv[i];
        if (a == "--small") opt.small = true;
        else if (a == "--seed" && i + 1 < argc) opt.seed = std::strtoull(argv[++i], nullptr, 10);
        else if (a == "--iters" && i + 1 < argc) opt.iters = std::max(1, std::atoi(argv[++i]));
        else { usage(); return 2; }
      }
      return tessera::tools::run_demo(opt);
    }
    if (cmd == "plan-time") {
      int batch = 256, reps = 200;
      for (int i = 2; i < argc; ++i) {
        std::string a = argv[i];
        if (a == "--batch" && i + 1 < argc) batch = std::atoi(argv[++i]);
        else if (a == "--reps" && i + 1 < argc) reps = std::atoi(argv[++i]);
        else { usage(); return 2; }
      }
      if (batch < 1 || reps < 1) { usage(); return 2; }
      return tessera::tools::run_plan_time(batch, reps);
    }
    if (cmd == "prefix-time") {
      int batch = 256, tokens = 4096, reps = 100;
      for (int i = 2; i < argc; ++i) {
        std::string a = argv[i];
        if (a == "--batch" && i + 1 < argc) batch = std::atoi(argv[++i]);
        else if (a == "--tokens" && i + 1 < argc) tokens = std::atoi(argv[++i]);
        else if (a == "--reps" && i + 1 < argc) reps = std::atoi(argv[++i]);
        else { usage(); return 2; }
      }
      if (batch < 1 || tokens < 512 || reps < 1) { usage(); return 2; }
      return tessera::tools::run_prefix_time(batch, tokens, reps);
    }
    if (cmd == "device-plan") {
      tessera::tools::DevicePlanOptions opt;
      for (int i = 2; i < argc; ++i) {
        std::string a = argv[i];
        if (a == "--layers" && i + 1 < argc) opt.layers = std::atoi(argv[++i]);
        else if (a == "--steps" && i + 1 < argc) opt.steps = std::atoi(argv[++i]);
        else if (a == "--max-batch" && i + 1 < argc) opt.max_batch = std::atoi(argv[++i]);
        else if (a == "--max-len" && i + 1 < argc) opt.max_len = std::atoi(argv[++i]);
        else if (a == "--cuda-cores") opt.cuda_cores = true;
        else { usage(); return 2; }
      }
      if (opt.layers < 1 || opt.steps < 1 || opt.max_batch < 1 || opt.max_len < 1) { usage(); return 2; }
      return tessera::tools::run_device_plan(opt);
    }
    if (cmd == "compile") {
      std::vector<std::string> archs = {"sm_80", "sm_89", "sm_90a"};
      int threads = 0;
      bool verbose = false, load = false;
      std::string pack;
      for (int i = 2; i < argc; ++i) {
        std::string a = argv[i];
        if (a == "--arch" && i + 1 < argc) archs = split(argv[++i]);
        else if (a == "--threads" && i + 1 < argc) threads = std::atoi(argv[++i]);
        else if (a == "--verbose") verbose = true;
        else if (a == "--load") load = true;
        else if (a == "--pack" && i + 1 < argc) pack = argv[++i];
        else { usage(); return 2; }
      }
      return tessera::tools::run_compile(archs, threads, verbose, load, pack);
    }
    if (cmd == "info") return info();
    usage();
    return 2;
  } catch (const tessera::Error& e) {
    std::fprintf(stderr, "tessera %s: error: %s\n", cmd.c_str(), e.what());
    return 1;
  }
}
