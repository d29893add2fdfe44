// Sub-commands of the `tessera` command-line tool.
#pragma once
#include <string>
#include <vector>

namespace tessera::tools {

struct DemoOptions {
  unsigned long long seed = 0;
  int iters = 20;
  bool small = false;  // a tiny batch (also what runs when there is no GPU)
};
int run_demo(const DemoOptions& opt);

// Compiles every built-in kernel for each arch; prints per-kernel times.
int run_compile(const std::vector<std::string>& archs, int threads, bool verbose, bool load, const std::string& pack);

// Host time of steady-state BatchDecode::plan() calls, and of the planner alone.
int run_plan_time(int batch, int reps);

// Host time of shared-prefix detection on serving-sized page tables.
int run_prefix_time(int batch, int tokens, int reps);

// A decode step of `layers` attention layers planned on the GPU in one
// graph for every batch size, against host plans with a graph per size.
struct DevicePlanOptions {
  int layers = 32, steps = 100, max_batch = 256, max_len = 4096;
  bool cuda_cores = false;
  unsigned long long seed = 1;
};
int run_device_plan(const DevicePlanOptions& opt);

}  // namespace tessera::tools
