// NVRTC compilation and the two-level (memory, disk) kernel cache.
#include "tessera/runtime/jit.hpp"

#include <nvrtc.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>
#include <unistd.h>

#include "tessera/core/error.hpp"
#include "tessera/runtime/cuda.hpp"

namespace fs = std::filesystem;

namespace tessera::jit {

namespace {

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

// 64-bit FNV-1a, run twice with different bases for a 128-bit key: plenty for
// a cache of a few thousand entries, and stable across processes.
struct Hasher {
  uint64_t a = 0xcbf29ce484222325ull, b = 0x84222325cbf29ce4ull;
  void add(std::string_view s) {
    for (unsigned char c : s) {
      a = (a ^ c) * 0x100000001b3ull;
      b = (b ^ c) * 0x100000001b3ull + 0x9e3779b97f4a7c15ull;
    }
    add_sep();
  }
  void add_sep() {
    a = (a ^ 0xff) * 0x100000001b3ull;
    b = (b ^ 0xfe) * 0x100000001b3ull;
  }
  std::string hex() const {
    char buf[33];
    std::snprintf(buf, sizeof buf, "%016llx%016llx", (unsigned long long)a, (unsigned long long)b);
    return buf;
  }
};

const std::string& headers_digest() {
  static const std::string d = [] {
    Hasher h;
    for (auto& [name, text] : embedded_headers()) {
      h.add(name);
      h.add(text);
    }
    return h.hex();
  }();
  return d;
}

void check_nvrtc(nvrtcResult r, const char* what) {
  if (r != NVRTC_SUCCESS) throw CompileError(std::string("NVRTC ") + what + " failed: " + nvrtcGetErrorString(r));
}

bool read_file(const fs::path& p, std::vector<char>& out) {
  std::ifstream f(p, std::ios::binary);
  if (!f) return false;
  out.assign(std::istreambuf_iterator<char>(f), {});
  return !out.empty();
}

// Write-then-rename, so a concurrent reader (another process) never sees a
// partial file. Cache writes are best effort: a read-only disk only costs time.
void write_file_atomic(const fs::path& p, const char* data, size_t n) {
  std::error_code ec;
  fs::create_directories(p.parent_path(), ec);
  fs::path tmp = p;
  tmp += ".tmp." + std::to_string(::getpid()) + "." +
         std::to_string(std::hash<std::thread::id>{}(std::this_thread::get_id()));
  {
    std::ofstream f(tmp, std::ios::binary);
    if (!f) return;
    f.write(data, static_cast<std::streamsize>(n));
    if (!f) return;
  }
  fs::rename(tmp, p, ec);
  if (ec) fs::remove(tmp, ec);
}

}  // namespace

// ---------------------------------------------------------------- Arch
Arch Arch::parse(const std::string& s0) {
  std::string s = s0;
  if (s.rfind("sm_", 0) == 0 || s.rfind("compute_", 0) == 0) s = s.substr(s.find('_') + 1);
  Arch a;
  if (!s.empty() && s.back() == 'a') {
    a.arch_specific = true;
    s.pop_back();
  }
  auto dot = s.find('.');
  try {
    if (dot != std::string::npos) {
      a.major = std::stoi(s.substr(0, dot));
      a.minor = std::stoi(s.substr(dot + 1));
    } else {
      int v = std::stoi(s);
      a.major = v / 10;
      a.minor = v % 10;
    }
  } catch (const std::exception&) {
    throw InvalidArgument("arch: expected a target like sm_80, sm_89 or sm_90a, got '" + s0 + "'");
  }
  if (a.major < 7 || a.major > 12)
    throw InvalidArgument("arch: expected a target between sm_75 and sm_121, got '" + s0 + "'");
  return a;
}

Arch Arch::of_device(int device) {
  auto info = cuda::device_info(device);
  Arch a{info.major, info.minor, false};
  a.arch_specific = info.major >= 9;  // Hopper+: use arch-specific instructions
  return a;
}

std::string Arch::str() const {
  return "sm_" + std::to_string(major) + std::to_string(minor) + (arch_specific ? "a" : "");
}

// ---------------------------------------------------------------- NVRTC
std::string nvrtc_version() {
  int major = 0, minor = 0;
  nvrtcVersion(&major, &minor);
  return std::to_string(major) + "." + std::to_string(minor);
}

std::string install_pack_dir() {
#ifdef TESSERA_INSTALL_PACK_DIR
  return TESSERA_INSTALL_PACK_DIR;  // a path set by CMake at configure time; it changes no kernel
#else
  return {};
#endif
}

std::string default_cache_dir() {
  if (const char* d = std::getenv("TESSERA_CACHE_DIR"); d && *d) return d;
  if (const char* x = std::getenv("XDG_CACHE_HOME"); x && *x) return std::string(x) + "/tessera";
  if (const char* h = std::getenv("HOME"); h && *h) return std::string(h) + "/.cache/tessera";
  return (fs::temp_directory_path() / "tessera-cache").string();
}

namespace {
// The library's one logging switch: TESSERA_LOG unset, empty or 0 is quiet;
// "jit" or 1 logs every JIT compile with ptxas's resource usage. Read once.
bool log_jit() {
  static const bool on = [] {
    const char* v = std::getenv("TESSERA_LOG");
    if (v == nullptr || *v == 0 || std::string(v) == "0") return false;
    if (std::string(v) == "jit" || std::string(v) == "1") return true;
    std::fprintf(stderr, "[tessera] TESSERA_LOG=%s: unknown value (expected jit, 1 or 0); logging off\n", v);
    return false;
  }();
  return on;
}

// NVRTC's log of a compiled program (errors, warnings, ptxas's report).
std::string program_log(nvrtcProgram prog) {
  size_t n = 0;
  nvrtcGetProgramLogSize(prog, &n);
  std::string log(n, '\0');
  if (n) nvrtcGetProgramLog(prog, log.data());
  return log;
}
}  // namespace

std::vector<char> compile_cubin(const KernelSource& src, const Arch& arch, const std::string& source_path) {
  const auto& headers = embedded_headers();
  std::vector<const char*> hdr_src, hdr_names;
  for (auto& [name, text] : headers) {
    hdr_names.push_back(name.c_str());
    hdr_src.push_back(text.c_str());
  }
  nvrtcProgram prog;
  check_nvrtc(nvrtcCreateProgram(&prog, src.source.c_str(), source_path.c_str(), static_cast<int>(headers.size()),
                                 hdr_src.data(), hdr_names.data()),
              "create program");
  std::unique_ptr<nvrtcProgram, void (*)(nvrtcProgram*)> guard(&prog, [](nvrtcProgram* p) { nvrtcDestroyProgram(p); });

  std::vector<std::string> opts = {"--gpu-architecture=" + arch.str(), "-std=c++17", "--device-as-default-execution-space",
                                   "-DTESSERA_JIT=1", "--extra-device-vectorization"};
  opts.insert(opts.end(), src.options.begin(), src.options.end());
  // TESSERA_LOG=jit (or 1): ptxas's resource report (registers, spills,
  // shared memory) of every kernel compiled, on stderr.
  const bool verbose = log_jit();
  if (verbose) opts.push_back("--ptxas-options=-v");
  std::vector<const char*> copts;
  for (auto& o : opts) copts.push_back(o.c_str());
  nvrtcResult r = nvrtcCompileProgram(prog, static_cast<int>(copts.size()), copts.data());
  if (r != NVRTC_SUCCESS)
    throw CompileError("NVRTC failed to compile kernel '" + src.entry + "' for " + arch.str() +
                       "\ngenerated source: " + source_path + "\n" + program_log(prog));
  if (verbose)
    std::fprintf(stderr, "[tessera jit] %s (%s):\n%s\n", src.entry.c_str(), arch.str().c_str(), program_log(prog).c_str());
  size_t size = 0;
  check_nvrtc(nvrtcGetCUBINSize(prog, &size), "get cubin size");
  std::vector<char> cubin(size);
  check_nvrtc(nvrtcGetCUBIN(prog, cubin.data()), "get cubin");
  return cubin;
}

// ---------------------------------------------------------------- LoadedKernel
LoadedKernel::LoadedKernel(cudaLibrary_t lib, cudaKernel_t kernel, std::string entry, int device)
    : lib_(lib), kernel_(kernel), entry_(std::move(entry)), device_(device) {
  int major = 0;
  if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) == cudaSuccess)
    pdl_capable_ = major >= 9;
}

LoadedKernel::~LoadedKernel() { (void)cudaLibraryUnload(lib_); }

namespace {

// A launch, with the programmatic-stream-serialization attribute when `pdl`.
void launch_kernel(cudaKernel_t kernel, bool pdl, dim3 grid, dim3 block, size_t smem_bytes, cudaStream_t stream,
                   void** args) {
  if (pdl) {
    cudaLaunchAttribute attr{};
    attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr.val.programmaticStreamSerializationAllowed = 1;
    cudaLaunchConfig_t cfg{};
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem_bytes;
    cfg.stream = stream;
    cfg.attrs = &attr;
    cfg.numAttrs = 1;
    TESSERA_CUDA_CHECK(cudaLaunchKernelExC(&cfg, reinterpret_cast<const void*>(kernel), args));
    return;
  }
  TESSERA_CUDA_CHECK(cudaLaunchKernel(reinterpret_cast<const void*>(kernel), grid, block, args, smem_bytes, stream));
}

}  // namespace

void LoadedKernel::launch(dim3 grid, dim3 block, size_t smem_bytes, cudaStream_t stream, void* params, bool pdl) const {
  void* args[] = {params};
  launch_kernel(kernel_, pdl && pdl_capable_, grid, block, smem_bytes, stream, args);
}

void LoadedKernel::launch(dim3 grid, dim3 block, size_t smem_bytes, cudaStream_t stream, void* params, void* params2,
                          bool pdl) const {
  void* const args[] = {params, params2};
  launch_params(grid, block, smem_bytes, stream, args, pdl);
}

void LoadedKernel::launch_params(dim3 grid, dim3 block, size_t smem_bytes, cudaStream_t stream,
                                 std::span<void* const> args, bool pdl) const {
  launch_kernel(kernel_, pdl && pdl_capable_, grid, block, smem_bytes, stream, const_cast<void**>(args.data()));
}

void LoadedKernel::set_max_dynamic_smem(int bytes) const {
  TESSERA_CUDA_CHECK(cudaKernelSetAttributeForDevice(kernel_, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes, device_));
}

// ---------------------------------------------------------------- KernelCache
KernelCache::KernelCache(std::string dir) : dir_(dir.empty() ? default_cache_dir() : std::move(dir)) {}

KernelCache& KernelCache::global() {
  static KernelCache& cache = []() -> KernelCache& {
    static KernelCache c;
    std::error_code ec;
    if (const std::string pack = install_pack_dir(); !pack.empty() && fs::is_directory(pack, ec)) c.add_pack(pack);
    return c;
  }();
  return cache;
}

void KernelCache::add_pack(const std::string& dir) {
  std::error_code ec;
  if (dir.empty() || !fs::is_directory(dir, ec))
    throw InvalidArgument("dir: expected an existing kernel pack directory, got '" + dir + "'");
  std::lock_guard<std::mutex> lock(mu_);
  if (std::find(packs_.begin(), packs_.end(), dir) == packs_.end()) packs_.push_back(dir);
}

std::vector<std::string> KernelCache::packs() const {
  std::lock_guard<std::mutex> lock(mu_);
  return packs_;
}

std::string KernelCache::key(const KernelSource& src, const Arch& arch) const {
  Hasher h;
  h.add(src.entry);
  h.add(src.source);
  for (auto& o : src.options) h.add(o);
  h.add(arch.str());
  h.add(nvrtc_version());
  h.add(headers_digest());
  return h.hex();
}

std::shared_ptr<const Cubin> KernelCache::cubin(const KernelSource& src, const Arch& arch) {
  const std::string k = key(src, arch);
  std::shared_ptr<std::mutex> key_mu;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (auto it = cubins_.find(k); it != cubins_.end()) {
      ++stats_.memory_hits;
      return it->second;
    }
    auto& slot = inflight_[k];
    if (!slot) slot = std::make_shared<std::mutex>();
    key_mu = slot;
  }
  // One thread per key compiles; the others wait here and then hit memory.
  std::lock_guard<std::mutex> key_lock(*key_mu);
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (auto it = cubins_.find(k); it != cubins_.end()) {
      ++stats_.memory_hits;
      return it->second;
    }
  }
  auto out = std::make_shared<Cubin>();
  out->key = k;
  const fs::path bin_path = fs::path(dir_) / (k + ".cubin");
  auto t0 = std::chrono::steady_clock::now();
  for (const std::string& pack : packs()) {
    if (!read_file(fs::path(pack) / (k + ".cubin"), out->image)) continue;
    out->from_disk = out->from_pack = true;
    out->load_ms = ms_since(t0);
    std::lock_guard<std::mutex> lock(mu_);
    ++stats_.pack_hits;
    stats_.disk_load_ms_total += out->load_ms;
    cubins_[k] = out;
    return out;
  }
  if (read_file(bin_path, out->image)) {
    out->from_disk = true;
    out->load_ms = ms_since(t0);
    std::lock_guard<std::mutex> lock(mu_);
    ++stats_.disk_hits;
    stats_.disk_load_ms_total += out->load_ms;
  } else {
    const fs::path src_path = fs::path(dir_) / "src" / (k + ".cu");
    write_file_atomic(src_path, src.source.data(), src.source.size());
    out->image = compile_cubin(src, arch, src_path.string());
    out->compile_ms = ms_since(t0);
    write_file_atomic(bin_path, out->image.data(), out->image.size());
    std::lock_guard<std::mutex> lock(mu_);
    ++stats_.compiles;
    stats_.compile_ms_total += out->compile_ms;
  }
  std::lock_guard<std::mutex> lock(mu_);
  cubins_[k] = out;
  return out;
}

const LoadedKernel& KernelCache::kernel(const KernelSource& src, int device) {
  if (!cuda::gpu_available()) throw CudaError("cannot load kernel '" + src.entry + "': " + cuda::no_gpu_reason());
  const Arch arch = Arch::of_device(device);
  const std::string k = key(src, arch);
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (auto it = loaded_.find({k, device}); it != loaded_.end()) {
      ++stats_.memory_hits;
      return *it->second;
    }
  }
  auto bin = cubin(src, arch);
  std::lock_guard<std::mutex> lock(mu_);
  if (auto it = loaded_.find({k, device}); it != loaded_.end()) return *it->second;
  int prev = 0;
  TESSERA_CUDA_CHECK(cudaGetDevice(&prev));
  TESSERA_CUDA_CHECK(cudaSetDevice(device));
  cudaLibrary_t lib;
  cudaKernel_t kern;
  cudaError_t err = cudaLibraryLoadData(&lib, bin->image.data(), nullptr, nullptr, 0, nullptr, nullptr, 0);
  if (err == cudaSuccess) {
    err = cudaLibraryGetKernel(&kern, lib, src.entry.c_str());
    if (err != cudaSuccess) (void)cudaLibraryUnload(lib);
  }
  (void)cudaSetDevice(prev);
  if (err != cudaSuccess) cuda::throw_cuda_error(err, ("loading kernel " + src.entry).c_str(), __FILE__, __LINE__);
  ++stats_.loads;
  auto& slot = loaded_[{k, device}];
  slot = std::make_unique<LoadedKernel>(lib, kern, src.entry, device);
  return *slot;
}

void KernelCache::precompile(std::span<const KernelSource> srcs, const Arch& arch, int threads,
                             const std::function<void(size_t, size_t)>& progress) {
  if (threads <= 0) threads = std::max(1u, std::thread::hardware_concurrency());
  std::atomic<size_t> next{0};
  std::mutex err_mu;
  size_t done = 0;
  std::exception_ptr first_error;
  auto worker = [&] {
    for (size_t i; (i = next.fetch_add(1)) < srcs.size();) {
      std::exception_ptr err;
      try {
        cubin(srcs[i], arch);
      } catch (...) {
        err = std::current_exception();
      }
      std::lock_guard<std::mutex> lock(err_mu);
      if (err && !first_error) first_error = err;
      ++done;
      if (progress) progress(done, srcs.size());
    }
  };
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) pool.emplace_back(worker);
  for (auto& t : pool) t.join();
  if (first_error) std::rethrow_exception(first_error);
}

CacheStats KernelCache::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

void KernelCache::clear_memory() {
  std::lock_guard<std::mutex> lock(mu_);
  cubins_.clear();
  loaded_.clear();
}

}  // namespace tessera::jit
