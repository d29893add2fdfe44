// The JIT: kernel specializations (template + configuration + variant code)
// compiled by NVRTC to cubin for a given architecture, cached in memory and on
// disk, and loaded through the CUDA runtime's library API (no link to the
// driver library).
//
// Cache key: a 128-bit hash of the generated source, the embedded device
// headers, the NVRTC options, the target architecture and the NVRTC version.
// Disk cache: $TESSERA_CACHE_DIR, else $XDG_CACHE_HOME/tessera, else
// ~/.cache/tessera. Files: <dir>/<key>.cubin and, for diagnostics,
// <dir>/src/<key>.cu (the generated source).
//
// Kernel packs: read-only directories of <key>.cubin files built ahead of
// time (`tessera compile --pack DIR`), which installs ship so the built-in
// kernels need no JIT at first use: the C++ install's share/tessera/kernels
// (known to the library) and the Python package's tessera/kernels (added at
// import). A cubin is looked up in memory, then in the packs, then in the
// disk cache, then compiled. A pack built by another NVRTC or other headers
// simply misses: its keys differ.
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

namespace tessera::jit {

// A GPU architecture target, e.g. sm_80, sm_89, sm_90a.
struct Arch {
  int major = 8, minor = 0;
  bool arch_specific = false;  // the 'a' suffix (wgmma, setmaxnreg ...)
  static Arch parse(const std::string& s);  // "sm_90a", "90a", "8.0"
  static Arch of_device(int device);        // sm_90 -> sm_90a (arch-specific features on)
  std::string str() const;                  // "sm_90a"
  bool operator==(const Arch&) const = default;
};

// One kernel to compile: a complete translation unit that includes Tessera's
// device headers (by "tessera/device/..." names) and defines `entry` as an
// extern "C" __global__ function.
struct KernelSource {
  std::string entry;
  std::string source;
  std::vector<std::string> options;  // extra NVRTC options
};

struct Cubin {
  std::string key;
  std::vector<char> image;
  double compile_ms = 0;  // NVRTC time; 0 when it came from disk
  double load_ms = 0;     // disk read time when it came from disk
  bool from_disk = false;
  bool from_pack = false;  // found in a kernel pack (from_disk is then true too)
};

// A kernel loaded on one device. Launch passes `params` (a pointer to the
// kernel's single by-value parameter block).
class LoadedKernel {
 public:
  LoadedKernel(cudaLibrary_t lib, cudaKernel_t kernel, std::string entry, int device);
  ~LoadedKernel();
  LoadedKernel(const LoadedKernel&) = delete;
  LoadedKernel& operator=(const LoadedKernel&) = delete;

  // pdl: programmatic dependent launch (sm_90+; ignored before): the kernel
  // may start while the previous one on the stream runs, and must call
  // grid_dependency_wait (arch/grid_dependency.cuh) before touching its data.
  void launch(dim3 grid, dim3 block, size_t smem_bytes, cudaStream_t stream, void* params, bool pdl = false) const;
  // Kernels with a second parameter (the Hopper prefill kernel's tensor maps).
  void launch(dim3 grid, dim3 block, size_t smem_bytes, cudaStream_t stream, void* params, void* params2,
              bool pdl = false) const;
  // Any parameter list: args[i] points at parameter i.
  void launch_params(dim3 grid, dim3 block, size_t smem_bytes, cudaStream_t stream, std::span<void* const> args,
                     bool pdl = false) const;
  void set_max_dynamic_smem(int bytes) const;
  const std::string& entry() const { return entry_; }
  cudaKernel_t handle() const { return kernel_; }

 private:
  cudaLibrary_t lib_;
  cudaKernel_t kernel_;
  std::string entry_;
  int device_;
  bool pdl_capable_ = false;  // sm_90+: programmatic dependent launch
};

struct CacheStats {
  int64_t memory_hits = 0, disk_hits = 0, pack_hits = 0, compiles = 0, loads = 0;
  double compile_ms_total = 0, disk_load_ms_total = 0;
};

class KernelCache {
 public:
  // dir empty: the default cache directory (see above). The global cache
  // starts with the C++ install's kernel pack when it exists.
  explicit KernelCache(std::string dir = "");
  static KernelCache& global();

  // The cubin for `src` on `arch`: memory, else disk, else NVRTC. Needs no GPU.
  std::shared_ptr<const Cubin> cubin(const KernelSource& src, const Arch& arch);
  // The kernel loaded on `device` (compiling if needed). Needs a GPU.
  const LoadedKernel& kernel(const KernelSource& src, int device);
  // Compiles many kernels on `threads` threads (0: hardware concurrency).
  // Errors are collected and rethrown (first one) after all finished.
  // progress (optional) is called after each kernel with (done, total), one
  // call at a time.
  void precompile(std::span<const KernelSource> srcs, const Arch& arch, int threads = 0,
                  const std::function<void(size_t, size_t)>& progress = {});
  // Adds a kernel pack (see above), searched after those added before; a
  // directory that does not exist is an error (InvalidArgument).
  void add_pack(const std::string& dir);
  std::vector<std::string> packs() const;

  std::string key(const KernelSource& src, const Arch& arch) const;
  const std::string& dir() const { return dir_; }
  CacheStats stats() const;
  // Forget the in-memory cache (cubins and loaded kernels); the disk stays.
  void clear_memory();

 private:
  std::string dir_;
  std::vector<std::string> packs_;
  mutable std::mutex mu_;
  std::map<std::string, std::shared_ptr<const Cubin>> cubins_;
  std::map<std::pair<std::string, int>, std::unique_ptr<LoadedKernel>> loaded_;
  std::map<std::string, std::shared_ptr<std::mutex>> inflight_;  // one compile per key
  CacheStats stats_;
};

// Compiles `src` with NVRTC (no caching). Throws CompileError with the log and
// `source_path` (where the caller saved the source) on failure.
std::vector<char> compile_cubin(const KernelSource& src, const Arch& arch, const std::string& source_path);
std::string nvrtc_version();
std::string default_cache_dir();
// The C++ install's kernel pack (<prefix>/share/tessera/kernels), or "" when
// the library was not configured for one.
std::string install_pack_dir();
// Embedded device headers: (include name, contents).
const std::vector<std::pair<std::string, std::string>>& embedded_headers();

}  // namespace tessera::jit
