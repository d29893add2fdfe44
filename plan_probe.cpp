// Temporary: host-time breakdown of a decode plan() on the GPU host.
#include <chrono>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>
#include <cuda_runtime.h>
#include "tessera/formats/paged_kv.hpp"
#include "tessera/runtime/planner.hpp"
using namespace tessera;
int main() {
  const int B = 256, ps = 16, L = 1024;
  std::vector<int32_t> indptr(B + 1), last(B), idx;
  for (int b = 0; b < B; ++b) { indptr[b + 1] = indptr[b] + L / ps; last[b] = ps; }
  idx.resize(indptr[B]);
  for (size_t i = 0; i < idx.size(); ++i) idx[i] = (i * 7919) % idx.size();
  char* host; cudaMallocHost(&host, 1 << 24); char* dev; cudaMalloc(&dev, 1 << 24);
  cudaStream_t s; cudaStreamCreate(&s); cudaEvent_t ev; cudaEventCreateWithFlags(&ev, cudaEventDisableTiming);
  Planner planner; DecodePlan plan; PrefillPlan pplan; std::vector<int32_t> lens(B), qo(B, 1);
  auto time = [&](const char* what, auto f) {
    for (int i = 0; i < 20; ++i) f();
    std::vector<double> t;
    for (int i = 0; i < 200; ++i) { auto t0 = std::chrono::steady_clock::now(); f(); t.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count()); }
    std::sort(t.begin(), t.end());
    printf("%-34s median %6.2f us  p10 %6.2f\n", what, t[100], t[20]);
  };
  time("check_page_table", [&] { check_page_table(indptr, idx, last, ps, lens); });
  for (int ctas : {16, 33, 66}) { char n[64]; snprintf(n, 64, "plan_decode ctas=%d", ctas); time(n, [&] { planner.plan_decode(lens, ctas, {}, plan); }); }
  PlannerOptions po; po.chunk_align = 128;
  time("plan_prefill (tc decode) ctas=16", [&] { planner.plan_prefill(qo, lens, 4, 64, true, 16, po, pplan); });
  time("memcpy indices", [&] { std::memcpy(host, idx.data(), idx.size() * 4); });
  for (int bytes : {4096, 65536, 200000, 1 << 20}) {
    char n[64]; snprintf(n, 64, "memcpyAsync %d B", bytes);
    time(n, [&] { cudaMemcpyAsync(dev, host, bytes, cudaMemcpyHostToDevice, s); });
  }
  cudaStreamSynchronize(s);
  time("eventRecord", [&] { cudaEventRecord(ev, s); });
  cudaStreamSynchronize(s);
  time("eventQuery (done)", [&] { cudaEventQuery(ev); });
  time("eventSynchronize (done)", [&] { cudaEventSynchronize(ev); });
  time("eventSync+memcpyAsync+record", [&] { cudaEventSynchronize(ev); cudaMemcpyAsync(dev, host, 200000, cudaMemcpyHostToDevice, s); cudaEventRecord(ev, s); });
  int d; time("cudaGetDevice", [&] { cudaGetDevice(&d); });
  printf("items %zu %zu\n", plan.items.size(), pplan.items.size());
}
