// How do cp.async copies of 256-byte K / V rows reach the L2? The 8-row
// decode tile's producer copies a head's row as 16 lanes x 16 bytes, with
// an ignore-src predicate (zero fill past a chunk's end) and the L2::128B
// prefetch size; FlashInfer's loader copies 8 lanes x 16 bytes of a 128-byte
// line, two instructions a row, with a src-size operand. Each CTA of a
// 264-CTA grid (two an SM) streams rows through a 3-stage shared ring, 64
// rows a stage, in five modes: every CTA its own rows from HBM; every CTA
// the same 8192 rows (an L2-resident shared prefix), 256 or 2048 bytes
// apart (one head of an NHD page of 8 heads), in lockstep or staggered;
// and runs of 33 CTAs each on one of the 8 heads of those rows.
// Copy forms x lane maps, with the copies tracked by commit groups or by
// the stage's mbarrier, printed as time and bytes delivered per second;
// one configuration alone (argument mode * 10 + form) for ncu:
//   nvcc -std=c++17 -arch=sm_90a -O3 bench/micro/cp_async_requests.cu -o /tmp/cp_async_requests
//   /tmp/cp_async_requests
//   ncu --launch-skip 3 --launch-count 1 --metrics lts__t_requests_srcunit_tex_op_read.sum,\
//     lts__t_sectors_srcunit_tex_op_read.sum,l1tex__m_xbar2l1tex_read_sectors.sum,\
//     lrc__average_xbar2gpc_sectors_op_read.ratio /tmp/cp_async_requests 30
// (sectors per L2 request: sectors / requests; the last: how many SMs the
// L2 request coalescer served with each sector the L2 read).
#include <cstdio>
#include <cstdlib>

#include <cuda_runtime.h>

#include "cuda_check.cuh"

typedef unsigned u32;
constexpr int kThreads = 256, kRows = 64, kStages = 3, kCtas = 264;

__device__ __forceinline__ u32 smem_u32(const void* p) { return static_cast<u32>(__cvta_generic_to_shared(p)); }

// FORM 0: ignore-src predicate, L2::128B (the 8-row tile's); 1: src-size
// operand, L2::128B (FlashInfer's); 2: plain, L2::128B; 3: plain, no hint.
template <int FORM>
__device__ __forceinline__ void cp16(u32 s, const void* g) {
  if constexpr (FORM == 0)
    asm volatile("{\n .reg .pred skip;\n setp.eq.u32 skip, %2, 0;\n cp.async.cg.shared.global.L2::128B [%0], [%1], 16, skip;\n}\n"
                 ::"r"(s), "l"(g), "r"(1u));
  else if constexpr (FORM == 1)
    asm volatile("cp.async.cg.shared.global.L2::128B [%0], [%1], 16, %2;\n" ::"r"(s), "l"(g), "r"(16u));
  else if constexpr (FORM == 2)
    asm volatile("cp.async.cg.shared.global.L2::128B [%0], [%1], 16;\n" ::"r"(s), "l"(g));
  else
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(s), "l"(g));
}

// Row r's bytes: rows of 256 bytes back to back, or one row every
// row_stride bytes in pages of 16 rows scattered over the buffer.
__device__ __forceinline__ long row_address(long r, long row_stride) {
  if (row_stride == 256) return r * 256;
  const long page = r / 16, slot = r % 16;
  return (((page * 7919) % 4096) * 16 + slot) * row_stride;
}

// MAP 0: thread l copies chunk l % 16 of row l / 16 (16 rows an instruction
// pass; the 8-row tile's map). MAP 1: row warp * 4 + lane / 8, chunk lane % 8
// then + 8 (FlashInfer's). Destinations: 256-byte rows, chunk XOR row % 8.
// SYNC 0: each stage's copies a commit group (wait_group keeps two in
// flight); SYNC 1: they arrive on the stage's mbarrier
// (cp.async.mbarrier.arrive.noinc, as the decode tiles' producers track
// them), waited on before the stage is reused.
__device__ __forceinline__ void wait_parity(u32 bar, u32 parity) {
  asm volatile("{\n .reg .pred p;\n WAIT_%=:\n mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n @!p bra WAIT_%=;\n}\n"
               ::"r"(bar), "r"(parity) : "memory");
}

template <int FORM, int MAP, int SYNC = 0>
__global__ void __launch_bounds__(kThreads) stream(const char* __restrict__ src, long rows_per_cta, long cta_stride,
                                                   long stagger, long row_stride, int heads, int* sink) {
  extern __shared__ __align__(128) char smem[];
  __shared__ __align__(8) unsigned long long bars[kStages];
  const int t = threadIdx.x;
  if (SYNC == 1) {
    if (t == 0)
      for (int s = 0; s < kStages; ++s)
        asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_u32(&bars[s])), "r"(kThreads));
    __syncthreads();
  }
  long it = 0;
  // heads > 1: consecutive runs of kCtas / heads CTAs read one head's 256
  // bytes of every 2048-byte token row (an NHD page of 8 heads), as a
  // decode grid of heads x queues does.
  const char* base = src + static_cast<long>(blockIdx.x) * cta_stride * 256 +
                     (heads > 1 ? static_cast<long>(blockIdx.x / ((kCtas + heads - 1) / heads)) * 256 : 0);
  const long shift = (blockIdx.x * stagger) % rows_per_cta;
  const u32 s0 = smem_u32(smem);
  int stage = 0;
  for (long r0 = 0; r0 < rows_per_cta; r0 += kRows) {
    const u32 st = s0 + stage * kRows * 256;
    if (SYNC == 1 && it >= kStages) wait_parity(smem_u32(&bars[stage]), static_cast<u32>((it / kStages - 1) & 1));
    auto row_of = [&](int row) { return base + row_address((r0 + row + shift) % rows_per_cta, row_stride); };
    if constexpr (MAP == 0) {
      const int c = t % 16, rr = t / 16;
#pragma unroll
      for (int i = 0; i < kRows / 16; ++i) {
        const int row = rr + 16 * i;
        cp16<FORM>(st + row * 256 + ((c ^ (row & 7)) << 4), row_of(row) + c * 16);
      }
    } else {
      const int w = t / 32, lane = t % 32, c = lane % 8;
#pragma unroll
      for (int i = 0; i < kRows / 32; ++i) {
        const int row = w * 4 + lane / 8 + 32 * i;
#pragma unroll
        for (int j = 0; j < 2; ++j)
          cp16<FORM>(st + row * 256 + (((8 * j + c) ^ (row & 7)) << 4), row_of(row) + (8 * j + c) * 16);
      }
    }
    if (SYNC == 1) {
      asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(smem_u32(&bars[stage])) : "memory");
    } else {
      asm volatile("cp.async.commit_group;\n");
      asm volatile("cp.async.wait_group 2;\n");
    }
    stage = (stage + 1) % kStages;
    ++it;
  }
  if (SYNC == 1) {
    for (long k = it > kStages ? it - kStages : 0; k < it; ++k)
      wait_parity(smem_u32(&bars[k % kStages]), static_cast<u32>((k / kStages) & 1));
  }
  asm volatile("cp.async.wait_group 0;\n");
  __syncthreads();
  if (t == 0) atomicAdd(sink, smem[7]);  // keeps the copies
}

struct Mode {
  const char* name;
  long rows, cta_stride, stagger, row_stride;
  int heads;
};

template <int FORM, int MAP, int SYNC = 0>
void run(const char* src, const Mode& m, int* sink, const char* name) {
  auto k = stream<FORM, MAP, SYNC>;
  constexpr int kSmem = kStages * kRows * 256;
  CHECK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem));
  cudaEvent_t a, b;
  CHECK(cudaEventCreate(&a));
  CHECK(cudaEventCreate(&b));
  for (int w = 0; w < 3; ++w) k<<<kCtas, kThreads, kSmem>>>(src, m.rows, m.cta_stride, m.stagger, m.row_stride, m.heads, sink);
  CHECK(cudaGetLastError());
  CHECK(cudaEventRecord(a));
  constexpr int kReps = 20;
  for (int w = 0; w < kReps; ++w)
    k<<<kCtas, kThreads, kSmem>>>(src, m.rows, m.cta_stride, m.stagger, m.row_stride, m.heads, sink);
  CHECK(cudaEventRecord(b));
  CHECK(cudaEventSynchronize(b));
  float ms = 0.f;
  CHECK(cudaEventElapsedTime(&ms, a, b));
  const double bytes = static_cast<double>(m.rows) * 256 * kCtas, s = ms * 1e-3 / kReps;
  std::printf("%-28s %-12s rows %4ld B apart: %7.1f us, %.2f TB/s\n", name, m.name, m.row_stride, s * 1e6, bytes / s / 1e12);
  CHECK(cudaEventDestroy(a));
  CHECK(cudaEventDestroy(b));
}

int main(int argc, char** argv) {
  constexpr long kBytes = 1L << 31;
  char* buf = nullptr;
  int* sink = nullptr;
  CHECK(cudaMalloc(&buf, kBytes));
  CHECK(cudaMalloc(&sink, sizeof(int)));
  CHECK(cudaMemset(buf, 1, kBytes));
  const long own_rows = kBytes / 256 / kCtas / kRows * kRows;
  const int which = argc > 1 ? std::atoi(argv[1]) : -1;  // -1: all; else mode * 10 + configuration
  const Mode modes[5] = {{"HBM", own_rows, own_rows, 0, 256, 1},
                         {"L2-lockstep", 8192, 0, 0, 256, 1},
                         {"L2-lockstep", 8192, 0, 0, 2048, 1},
                         {"L2-stagger", 8192, 0, 640, 2048, 1},
                         {"L2-8-heads", 8192, 0, 0, 2048, 8}};
  for (int m = 0; m < 5; ++m) {
#define RUN(F, P, NAME, ID, ...) \
  if (which < 0 || which == m * 10 + ID) run<F, P, ##__VA_ARGS__>(buf, modes[m], sink, NAME);
    RUN(0, 0, "ignore-src L2::128B 16/row", 0)
    RUN(1, 0, "src-size L2::128B 16/row", 1)
    RUN(2, 0, "plain L2::128B 16/row", 2)
    RUN(3, 0, "plain no-hint 16/row", 3)
    RUN(0, 1, "ignore-src L2::128B 8/line", 4)
    RUN(1, 1, "src-size L2::128B 8/line", 5)
    RUN(0, 0, "ignore-src 16/row mbarrier", 6, 1)
    RUN(1, 1, "src-size 8/line mbarrier", 7, 1)
#undef RUN
  }
  CHECK(cudaDeviceSynchronize());
  CHECK(cudaFree(buf));
  CHECK(cudaFree(sink));
  return 0;
}
