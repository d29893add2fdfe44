// Catalogue entries of the MLA kernel family (device/kernels/mla/): the
// query-tile configurations and the JIT source of one.
#pragma once
#include <vector>

#include "tessera/core/dtype.hpp"
#include "tessera/runtime/jit.hpp"

namespace tessera {

struct MlaKernelConfig {
  int cta_q = 16;   // fused rows (query position x head) per query tile: 16, 32 or 64
  int cta_kv = 64;  // keys per KV tile
  int warps_d = 4;  // warps per 16-row group (they split the tile's keys for S and O's columns)
  int stages = 2;   // cp.async pipeline depth
  int threads = 128;
  int smem_bytes = 0;  // dynamic shared memory: sizeof(MlaSharedStorage) (abi/mla_params.cuh)
  bool hopper = false;  // the sm_90a kernel (device/kernels/mla_sm90/): a producer and one or two consumer warpgroups
};

namespace catalog {
// The configuration of a query tile of cta_q rows (16, 32 or 64; else
// InvalidArgument naming cta_q).
MlaKernelConfig mla_config(int cta_q);
// Query tile for an average of `avg_fused_rows` fused rows per request
// (query length x heads): the smallest of 16, 32, 64 holding it, else 64.
int choose_mla_cta_q(double avg_fused_rows);
// The persistent MLA kernel: q / caches of dtype (fp16 or bf16; else
// TypeMismatch naming q_dtype), o of the same dtype.
jit::KernelSource batch_mla(DType dtype, int cta_q, bool causal);
// The Hopper kernel's configuration: 64-row query tiles (two consumer
// warpgroups), or 16 (one, the transposed GEMMs); 64-key KV tiles; fp8:
// over fp8 caches (the 16-row form then takes more shared memory). Other
// cta_q: InvalidArgument naming cta_q.
MlaKernelConfig mla_sm90_config(int cta_q = 64, bool fp8 = false);
// The persistent Hopper (sm_90a) MLA kernel: as batch_mla, query tiles of
// cta_q rows (64 or 16); caches of kv_dtype: q's dtype, or fp8 e4m3 / e5m2
// (else TypeMismatch naming kv_dtype).
jit::KernelSource batch_mla_sm90(DType dtype, DType kv_dtype, bool causal, int cta_q = 64);
// Every built-in MLA kernel: fp16 / bf16 x (query tiles 16 / 32 / 64, the
// Hopper kernel's 64- and 16-row tiles, each also over e4m3 caches)
// x causal or not.
std::vector<jit::KernelSource> builtin_mla_kernels();
}  // namespace catalog

}  // namespace tessera
