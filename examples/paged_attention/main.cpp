// A paged batch decode and a causal batch prefill through Tessera's C++ API,
// checked against a plain CPU loop over the same keys and values.
//
// One paged KV cache (fp16, NHD, pages handed out in shuffled order) holds
// six requests; append_paged_kv_cache writes their K / V into it on the host.
//  * With a GPU: BatchDecode runs the four one-query requests and
//    BatchPrefill the two multi-query ones (plan once, run), and every output
//    row and LSE is compared with the CPU loop.
//  * Without one: the CPU paths of the API run instead. Each row's keys are
//    split in two, the two partial attention states are computed from the
//    paged cache and merged by merge_state (as split-KV kernels do), and the
//    result is compared with the CPU loop over the unsplit keys. The decode
//    and prefill kernels a GPU run would launch are JIT-compiled for sm_80
//    (NVRTC needs no GPU), from the device sources inside the library.
// Prints PASS or FAIL; the exit status is 0 only on PASS.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <numeric>
#include <random>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

#include "tessera/tessera.hpp"

namespace {

using namespace tessera;

constexpr int kHq = 8, kHkv = 2, kDim = 128, kPage = 16;

// The requests of one step: their query and KV lengths, and the page table.
struct Batch {
  std::vector<int32_t> q_len, kv_len;
  std::vector<int32_t> qo_indptr{0}, kv_indptr{0}, kv_indices, last_page_len, kv_start{0};
  int64_t rows() const { return qo_indptr.back(); }
  int64_t tokens() const { return kv_start.back(); }
};

Batch make_batch(const std::vector<int32_t>& q_len, const std::vector<int32_t>& kv_len,
                 std::vector<int32_t>& free_pages) {
  Batch b;
  b.q_len = q_len;
  b.kv_len = kv_len;
  for (size_t r = 0; r < q_len.size(); ++r) {
    const int32_t pages = (kv_len[r] + kPage - 1) / kPage;
    for (int32_t p = 0; p < pages; ++p) {
      b.kv_indices.push_back(free_pages.back());
      free_pages.pop_back();
    }
    b.qo_indptr.push_back(b.qo_indptr.back() + q_len[r]);
    b.kv_indptr.push_back(static_cast<int32_t>(b.kv_indices.size()));
    b.last_page_len.push_back(kv_len[r] - (pages - 1) * kPage);
    b.kv_start.push_back(b.kv_start.back() + kv_len[r]);
  }
  return b;
}

std::vector<uint16_t> random_fp16(size_t n, std::mt19937& rng) {
  std::uniform_real_distribution<float> d(-1.f, 1.f);
  std::vector<uint16_t> x(n);
  for (auto& v : x) v = float_to_half(d(rng));
  return x;
}

TensorView host(std::vector<uint16_t>& x, std::vector<int64_t> shape) {
  return TensorView(x.data(), DType::kFloat16, Device{}, std::move(shape));
}
TensorView host(std::vector<float>& x, std::vector<int64_t> shape) {
  return TensorView(x.data(), DType::kFloat32, Device{}, std::move(shape));
}
TensorView host(std::vector<int32_t>& x) {
  return TensorView(x.data(), DType::kInt32, Device{}, {static_cast<int64_t>(x.size())});
}

// Writes every request's K / V (rows of k_src / v_src, request after request)
// into the paged cache with the API's CPU path.
void fill_cache(Batch& b, std::vector<uint16_t>& k_src, std::vector<uint16_t>& v_src, const PagedKVStorage& cache) {
  std::vector<int32_t> batch_indices, positions;
  for (size_t r = 0; r < b.kv_len.size(); ++r)
    for (int32_t j = 0; j < b.kv_len[r]; ++j) {
      batch_indices.push_back(static_cast<int32_t>(r));
      positions.push_back(j);
    }
  append_paged_kv_cache(host(k_src, {b.tokens(), kHkv, kDim}), host(v_src, {b.tokens(), kHkv, kDim}),
                        host(batch_indices), host(positions), cache, host(b.kv_indices), host(b.kv_indptr),
                        host(b.last_page_len));
}

// Attention of one query row and head over keys [k0, k1) of a request (causal
// rows stop at their own position), in double: o[kDim] and the base-2 LSE.
// key(j) / value(j) give the fp16 row of key j for this head's KV head.
template <typename Row>
void attend(const uint16_t* q, int k0, int k1, Row key, Row value, double* o, double* lse) {
  std::vector<double> s;
  double m = -INFINITY;
  for (int j = k0; j < k1; ++j) {
    double dot = 0;
    for (int d = 0; d < kDim; ++d) dot += double(half_to_float(q[d])) * half_to_float(key(j)[d]);
    s.push_back(dot / std::sqrt(double(kDim)));
    m = std::max(m, s.back());
  }
  std::fill(o, o + kDim, 0.0);
  double sum = 0;
  for (int j = k0; j < k1; ++j) {
    const double p = std::exp(s[j - k0] - m);
    sum += p;
    for (int d = 0; d < kDim; ++d) o[d] += p * half_to_float(value(j)[d]);
  }
  for (int d = 0; d < kDim; ++d) o[d] = sum > 0 ? o[d] / sum : 0.0;
  *lse = sum > 0 ? (m + std::log(sum)) / std::log(2.0) : -INFINITY;
}

// The keys query i of request r sees: all of them, or with a causal mask
// (bottom-right aligned) those up to its own position.
int visible(const Batch& b, size_t r, int i, bool causal) {
  return causal ? b.kv_len[r] - b.q_len[r] + i + 1 : b.kv_len[r];
}

// Expected outputs of every (row, head): the CPU loop over the source K / V.
void expected(const Batch& b, const std::vector<uint16_t>& q, const std::vector<uint16_t>& k_src,
              const std::vector<uint16_t>& v_src, bool causal, std::vector<double>& o, std::vector<double>& lse) {
  o.assign(b.rows() * kHq * kDim, 0);
  lse.assign(b.rows() * kHq, 0);
  for (size_t r = 0; r < b.q_len.size(); ++r)
    for (int i = 0; i < b.q_len[r]; ++i)
      for (int h = 0; h < kHq; ++h) {
        const int64_t row = b.qo_indptr[r] + i, hk = h / (kHq / kHkv);
        auto at = [&](const std::vector<uint16_t>& src) {
          const uint16_t* base = src.data() + (int64_t(b.kv_start[r]) * kHkv + hk) * kDim;
          return [base](int j) { return base + int64_t(j) * kHkv * kDim; };
        };
        attend(&q[(row * kHq + h) * kDim], 0, visible(b, r, i, causal), at(k_src), at(v_src),
               &o[(row * kHq + h) * kDim], &lse[row * kHq + h]);
      }
}

struct Error {
  double o = 0, lse = 0;
  bool ok(double tol) const { return o <= tol && lse <= tol; }  // also false for NaN
};

template <typename O>
Error compare(const O& got_o, const std::vector<float>& got_lse, const std::vector<double>& o,
              const std::vector<double>& lse, float (*to_float)(typename O::value_type)) {
  Error e;
  for (size_t i = 0; i < o.size(); ++i) e.o = std::max(e.o, std::abs(double(to_float(got_o[i])) - o[i]));
  for (size_t i = 0; i < lse.size(); ++i)
    if (!(std::isinf(lse[i]) && std::isinf(got_lse[i]))) e.lse = std::max(e.lse, std::abs(got_lse[i] - lse[i]));
  if (std::any_of(got_o.begin(), got_o.end(), [&](auto x) { return std::isnan(to_float(x)); })) e.o = NAN;
  return e;
}

float identity(float x) { return x; }

// No GPU: split-KV on the CPU, merged by merge_state, against the CPU loop.
bool check_cpu(const char* label, const Batch& b, std::vector<uint16_t>& q, const std::vector<uint16_t>& k_src,
               const std::vector<uint16_t>& v_src, const PagedKVStorage& cache, bool causal) {
  const int64_t n = b.rows();
  std::vector<float> part_o[2], part_lse[2], merged_o(n * kHq * kDim), merged_lse(n * kHq);
  for (auto& p : part_o) p.resize(n * kHq * kDim);
  for (auto& p : part_lse) p.resize(n * kHq);
  std::vector<double> o(kDim);
  double lse;
  for (size_t r = 0; r < b.q_len.size(); ++r)
    for (int i = 0; i < b.q_len[r]; ++i)
      for (int h = 0; h < kHq; ++h) {
        const int64_t row = b.qo_indptr[r] + i, hk = h / (kHq / kHkv), end = visible(b, r, i, causal);
        // Key j of request r, read through the page table from the cache.
        auto at = [&](const TensorView& t) {
          const uint16_t* base = t.ptr<const uint16_t>();
          const int32_t* pages = b.kv_indices.data() + b.kv_indptr[r];
          return [base, pages, hk](int j) {
            return base + ((int64_t(pages[j / kPage]) * kPage + j % kPage) * kHkv + hk) * kDim;
          };
        };
        const int split[3] = {0, static_cast<int>(end / 2), static_cast<int>(end)};
        for (int part = 0; part < 2; ++part) {
          attend(&q[(row * kHq + h) * kDim], split[part], split[part + 1], at(cache.k()), at(cache.v()), o.data(), &lse);
          std::copy(o.begin(), o.end(), part_o[part].begin() + (row * kHq + h) * kDim);
          part_lse[part][row * kHq + h] = static_cast<float>(lse);
        }
      }
  merge_state(host(part_o[0], {n, kHq, kDim}), host(part_lse[0], {n, kHq}), host(part_o[1], {n, kHq, kDim}),
              host(part_lse[1], {n, kHq}), host(merged_o, {n, kHq, kDim}), host(merged_lse, {n, kHq}));
  std::vector<double> want_o, want_lse;
  expected(b, q, k_src, v_src, causal, want_o, want_lse);
  const Error e = compare(merged_o, merged_lse, want_o, want_lse, identity);
  const bool ok = e.ok(1e-4);
  std::printf("%-8s CPU: %lld rows x %d heads, paged cache + split KV + merge_state: max |o - ref| %.1e, "
              "|lse - ref| %.1e  %s\n", label, (long long)n, kHq, e.o, e.lse, ok ? "ok" : "WRONG");
  return ok;
}

#define CHECK_CUDA(x)                                                                           \
  do {                                                                                          \
    cudaError_t err_ = (x);                                                                     \
    if (err_ != cudaSuccess) throw std::runtime_error(std::string(#x) + ": " + cudaGetErrorString(err_)); \
  } while (0)

// A device copy of a host vector, freed with the object.
template <typename T>
struct DeviceArray {
  void* ptr = nullptr;
  explicit DeviceArray(const std::vector<T>& x) {
    CHECK_CUDA(cudaMalloc(&ptr, x.size() * sizeof(T)));
    CHECK_CUDA(cudaMemcpy(ptr, x.data(), x.size() * sizeof(T), cudaMemcpyHostToDevice));
  }
  ~DeviceArray() { cudaFree(ptr); }
  TensorView view(DType t, std::vector<int64_t> shape) const {
    return TensorView(ptr, t, Device{DeviceType::kCUDA, cuda::current_device()}, std::move(shape));
  }
  std::vector<T> download(size_t n) const {
    std::vector<T> x(n);
    CHECK_CUDA(cudaMemcpy(x.data(), ptr, n * sizeof(T), cudaMemcpyDeviceToHost));
    return x;
  }
};

// GPU: plan + run on the batch's wrapper, against the CPU loop.
bool check_gpu(const char* label, const Batch& b, const std::vector<uint16_t>& q, const std::vector<uint16_t>& k_src,
               const std::vector<uint16_t>& v_src, const PagedKVStorage& host_cache, bool decode) {
  const int64_t n = b.rows(), pages = host_cache.num_pages();
  const std::vector<int64_t> page_shape = {pages, kPage, kHkv, kDim};
  const auto cache_data = [&](const TensorView& t) {
    return std::vector<uint16_t>(t.ptr<uint16_t>(), t.ptr<uint16_t>() + t.numel());
  };
  DeviceArray<uint16_t> k_dev(cache_data(host_cache.k())), v_dev(cache_data(host_cache.v())), q_dev(q);
  DeviceArray<uint16_t> o_dev(std::vector<uint16_t>(n * kHq * kDim, 0xFFFF));  // NaN until written
  DeviceArray<float> lse_dev(std::vector<float>(n * kHq, 0.f));
  const PagedKVStorage kv(k_dev.view(DType::kFloat16, page_shape), v_dev.view(DType::kFloat16, page_shape),
                          KVLayout::kNHD);
  const TensorView qv = q_dev.view(DType::kFloat16, {n, kHq, kDim}), ov = o_dev.view(DType::kFloat16, {n, kHq, kDim});
  const TensorView lv = lse_dev.view(DType::kFloat32, {n, kHq});

  const AttentionSpec spec{decode ? variants::standard() : variants::causal(), DType::kFloat16, DType::kFloat16,
                           DType::kFloat16, kDim};
  TaskInfo task{kHq, kHkv, kPage, KVLayout::kNHD, static_cast<int64_t>(b.q_len.size()),
                static_cast<int64_t>(b.kv_indices.size()), n};
  const int sms = cuda::device_info(cuda::current_device()).sm_count;
  cudaStream_t stream;
  CHECK_CUDA(cudaStreamCreate(&stream));
  if (decode) {
    const auto sizes = BatchDecode::workspace_size(spec, task, sms);
    Workspace ws = Workspace::allocate(sizes.device_bytes, sizes.host_bytes);
    BatchDecode dec(spec, task, ws);
    dec.plan(b.kv_indptr, b.kv_indices, b.last_page_len, stream);
    dec.run(qv, kv, ov, lv, stream);
    CHECK_CUDA(cudaStreamSynchronize(stream));
  } else {
    const auto sizes = BatchPrefill::workspace_size(spec, task, sms);
    Workspace ws = Workspace::allocate(sizes.device_bytes, sizes.host_bytes);
    BatchPrefill pre(spec, task, ws);
    pre.plan_paged(b.qo_indptr, b.kv_indptr, b.kv_indices, b.last_page_len, stream);
    pre.run(qv, kv, ov, lv, stream);
    CHECK_CUDA(cudaStreamSynchronize(stream));
  }
  CHECK_CUDA(cudaStreamDestroy(stream));
  std::vector<double> want_o, want_lse;
  expected(b, q, k_src, v_src, !decode, want_o, want_lse);
  const Error e = compare(o_dev.download(n * kHq * kDim), lse_dev.download(n * kHq), want_o, want_lse, half_to_float);
  const bool ok = e.ok(5e-3);
  std::printf("%-8s GPU: %lld rows x %d heads on %s: max |o - ref| %.1e, |lse - ref| %.1e  %s\n", label,
              (long long)n, kHq, decode ? "BatchDecode" : "BatchPrefill", e.o, e.lse, ok ? "ok" : "WRONG");
  return ok;
}

// No GPU: the kernels a GPU run would launch, compiled by NVRTC for sm_80.
void compile_kernels() {
  const AttentionSpec decode_spec{variants::standard(), DType::kFloat16, DType::kFloat16, DType::kFloat16, kDim};
  const AttentionSpec prefill_spec{variants::causal(), DType::kFloat16, DType::kFloat16, DType::kFloat16, kDim};
  Workspace no_workspace;  // the constructor only picks the kernel; plan() would need a GPU
  const BatchDecode dec(decode_spec, TaskInfo{kHq, kHkv, kPage}, no_workspace);
  for (const auto& src : {dec.kernel_source(), catalog::batch_prefill(prefill_spec, 64)}) {
    const auto bin = jit::KernelCache::global().cubin(src, jit::Arch::parse("sm_80"));
    std::printf("jit: %s for sm_80: %zu-byte cubin (%s)\n", src.entry.c_str(), bin->image.size(),
                bin->from_disk ? "from the disk cache" : "compiled");
  }
}

int run() {
#ifdef TESSERA_KERNEL_PACK_DIR
  if (std::filesystem::is_directory(TESSERA_KERNEL_PACK_DIR)) jit::KernelCache::global().add_pack(TESSERA_KERNEL_PACK_DIR);
#endif
  for (const auto& pack : jit::KernelCache::global().packs()) std::printf("kernel pack: %s\n", pack.c_str());
  std::mt19937 rng(2024);
  const bool gpu = cuda::gpu_available();
  if (gpu) std::printf("GPU: %s\n", cuda::device_info(cuda::current_device()).name.c_str());
  else std::printf("No GPU (%s): checking the CPU path\n", cuda::no_gpu_reason().c_str());

  // Decode: four requests of one query each; prefill: two of many, causal.
  std::vector<int32_t> free_pages(40);
  std::iota(free_pages.begin(), free_pages.end(), 0);
  std::shuffle(free_pages.begin(), free_pages.end(), rng);
  const int64_t num_pages = static_cast<int64_t>(free_pages.size());
  Batch decode = make_batch({1, 1, 1, 1}, {1, 37, 200, 129}, free_pages);
  Batch prefill = make_batch({17, 40}, {50, 40}, free_pages);

  std::vector<uint16_t> k_cache(num_pages * kPage * kHkv * kDim), v_cache(k_cache.size());
  const PagedKVStorage cache(host(k_cache, {num_pages, kPage, kHkv, kDim}), host(v_cache, {num_pages, kPage, kHkv, kDim}),
                             KVLayout::kNHD);
  bool ok = true;
  for (auto [label, b, is_decode] : {std::tuple{"decode", &decode, true}, std::tuple{"prefill", &prefill, false}}) {
    auto k_src = random_fp16(b->tokens() * kHkv * kDim, rng), v_src = random_fp16(k_src.size(), rng);
    auto q = random_fp16(b->rows() * kHq * kDim, rng);
    fill_cache(*b, k_src, v_src, cache);
    ok &= gpu ? check_gpu(label, *b, q, k_src, v_src, cache, is_decode)
              : check_cpu(label, *b, q, k_src, v_src, cache, !is_decode);
  }
  if (!gpu) compile_kernels();
  std::printf("paged_attention (%s path): %s\n", gpu ? "GPU" : "CPU", ok ? "PASS" : "FAIL");
  return ok ? 0 : 1;
}

}  // namespace

int main() {
  try {
    return run();
  } catch (const std::exception& e) {
    std::printf("error: %s\npaged_attention: FAIL\n", e.what());
    return 1;
  }
}
