// `tessera demo`: one serving-style attention step. A batch mixes decode
// requests (one query each) and chunked-prefill requests (many queries over a
// longer KV history) in one paged KV cache with shuffled pages; decode runs
// on BatchDecode and chunked prefill on BatchPrefill (tensor cores; the
// Hopper template on sm_90), each plan/run, verified against the CPU reference on
// sampled rows, and is timed with device events (median), reporting achieved
// bandwidth (KV bytes the batch needs) and FLOP rate.
//
// Without a GPU it says so, then still validates the plan, JIT-compiles the
// kernels it would launch and checks the reference path on a small batch.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <optional>
#include <string>
#include <random>
#include <vector>

#include "commands.hpp"
#include "timing.hpp"
#include "tessera/tessera.hpp"
#include "tessera/runtime/device_buffer.hpp"

namespace tessera::tools {
namespace {

constexpr int kHq = 32, kHkv = 8, kHeadDim = 128, kPageSize = 16;

struct Batch {
  std::vector<int32_t> q_len, kv_len;
  std::vector<int32_t> qo_indptr{0}, kv_indptr{0}, kv_indices, last_page_len;
  int64_t num_pages = 0;
  int64_t total_q() const { return qo_indptr.back(); }
};

Batch make_batch(int n_decode, int n_prefill, int max_decode_kv, int max_prefill_q, int max_prefix, std::mt19937_64& rng) {
  Batch b;
  auto uni = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  for (int i = 0; i < n_decode; ++i) { b.q_len.push_back(1); b.kv_len.push_back(uni(1, max_decode_kv)); }
  for (int i = 0; i < n_prefill; ++i) {
    int q = uni(max_prefill_q / 4, max_prefill_q);
    b.q_len.push_back(q);
    b.kv_len.push_back(q + uni(0, max_prefix));
  }
  std::vector<int32_t> pages_per_req;
  for (int32_t kv : b.kv_len) pages_per_req.push_back((kv + kPageSize - 1) / kPageSize);
  b.num_pages = std::accumulate(pages_per_req.begin(), pages_per_req.end(), int64_t{0}) + 7;  // a few unused pages
  std::vector<int32_t> perm(b.num_pages);
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng);  // pages scattered like a real allocator's
  int64_t next = 0;
  for (size_t r = 0; r < b.q_len.size(); ++r) {
    b.qo_indptr.push_back(b.qo_indptr.back() + b.q_len[r]);
    for (int p = 0; p < pages_per_req[r]; ++p) b.kv_indices.push_back(perm[next++]);
    b.kv_indptr.push_back(static_cast<int32_t>(b.kv_indices.size()));
    b.last_page_len.push_back(b.kv_len[r] - (pages_per_req[r] - 1) * kPageSize);
  }
  return b;
}

struct HostBuf {
  std::vector<uint16_t> data;
  TensorView view(std::vector<int64_t> shape, Device dev = {}) { return TensorView(data.data(), DType::kFloat16, dev, shape); }
};

HostBuf random_fp16(size_t n, std::mt19937_64& rng) {
  HostBuf h;
  h.data.resize(n);
  std::uniform_real_distribution<float> d(-1.f, 1.f);
  for (auto& x : h.data) x = float_to_half(d(rng));
  return h;
}

// Work the step needs: KV bytes of each request once, Q and O, and the FLOPs
// of the visible (causal) query-key pairs.
struct Work { double bytes = 0, flops = 0; };
Work step_work(const Batch& b) {
  Work w;
  for (size_t r = 0; r < b.q_len.size(); ++r) {
    w.bytes += 2.0 * b.kv_len[r] * kHkv * kHeadDim * 2 + 2.0 * b.q_len[r] * kHq * kHeadDim * 2;
    for (int i = 0; i < b.q_len[r]; ++i) w.flops += 4.0 * std::max(0, b.kv_len[r] - b.q_len[r] + i + 1) * kHq * kHeadDim;
  }
  return w;
}

// Rows checked against the reference: every decode row, and the first, last
// and a few random rows of each prefill request. Row i of a causal request
// sees the first (i + kv_len - q_len + 1) keys, so each sampled row becomes a
// one-query request over a truncated page table.
struct Sample { int64_t row; Batch table; };
std::vector<int64_t> sample_rows(const Batch& b, std::mt19937_64& rng) {
  std::vector<int64_t> rows;
  for (size_t r = 0; r < b.q_len.size(); ++r) {
    const int q = b.q_len[r];
    std::vector<int> picks = {0, q - 1};
    for (int k = 0; k < 4 && q > 2; ++k) picks.push_back(std::uniform_int_distribution<int>(1, q - 2)(rng));
    std::sort(picks.begin(), picks.end());
    picks.erase(std::unique(picks.begin(), picks.end()), picks.end());
    for (int i : picks) rows.push_back(b.qo_indptr[r] + i);
  }
  return rows;
}

Batch truncated_rows(const Batch& b, const std::vector<int64_t>& rows) {
  Batch t;
  t.num_pages = b.num_pages;
  for (int64_t row : rows) {
    const size_t r = std::upper_bound(b.qo_indptr.begin(), b.qo_indptr.end(), row) - b.qo_indptr.begin() - 1;
    const int i = static_cast<int>(row - b.qo_indptr[r]);
    const int kv = std::max(0, b.kv_len[r] - b.q_len[r] + i + 1);
    const int pages = (kv + kPageSize - 1) / kPageSize;
    t.q_len.push_back(1);
    t.kv_len.push_back(kv);
    t.qo_indptr.push_back(t.qo_indptr.back() + 1);
    for (int p = 0; p < pages; ++p) t.kv_indices.push_back(b.kv_indices[b.kv_indptr[r] + p]);
    t.kv_indptr.push_back(static_cast<int32_t>(t.kv_indices.size()));
    t.last_page_len.push_back(pages ? kv - (pages - 1) * kPageSize : 0);
  }
  return t;
}

// Max |out - ref| / max |ref| over the sampled rows (and NaN check).
double check_rows(const std::vector<uint16_t>& out, const std::vector<int64_t>& rows, const reference::Result& ref,
                  bool* nan_seen) {
  double max_err = 0, max_ref = 0;
  for (size_t s = 0; s < rows.size(); ++s)
    for (int h = 0; h < kHq; ++h)
      for (int d = 0; d < kHeadDim; ++d) {
        const double o = half_to_float(out[(rows[s] * kHq + h) * kHeadDim + d]);
        if (std::isnan(o)) *nan_seen = true;
        max_err = std::max(max_err, std::abs(o - ref.at(static_cast<int64_t>(s), h, d)));
        max_ref = std::max(max_ref, std::abs(ref.at(static_cast<int64_t>(s), h, d)));
      }
  return max_ref > 0 ? max_err / max_ref : max_err;
}

reference::Result reference_rows(const HostBuf& q, const std::vector<int64_t>& rows, const Batch& truncated,
                                 HostBuf& k, HostBuf& v) {
  HostBuf qs;
  for (int64_t row : rows)
    qs.data.insert(qs.data.end(), q.data.begin() + row * kHq * kHeadDim, q.data.begin() + (row + 1) * kHq * kHeadDim);
  const std::vector<int64_t> page_shape = {truncated.num_pages, kPageSize, kHkv, kHeadDim};
  PagedKVCache cache(PagedKVStorage(k.view(page_shape), v.view(page_shape), KVLayout::kNHD),
                     PageTable(truncated.kv_indptr, truncated.kv_indices, truncated.last_page_len, kPageSize,
                               truncated.num_pages));
  return reference::attention_paged(qs.view({static_cast<int64_t>(rows.size()), kHq, kHeadDim}),
                                    RaggedIndex(truncated.qo_indptr), cache);
}

int demo_without_gpu(const DemoOptions& opt) {
  std::printf("No GPU: %s\nRunning the host side of the step: plan validation, JIT compilation, reference check.\n",
              cuda::no_gpu_reason().c_str());
  std::mt19937_64 rng(opt.seed);
  Batch b = make_batch(3, 2, 200, 48, 64, rng);
  // The plan's host half: page table and lengths validated as plan() would,
  // and the decode requests scheduled by the load-balanced planner as on an
  // H100 (132 SMs, the decode kernel's CTAs per SM).
  PageTable table(b.kv_indptr, b.kv_indices, b.last_page_len, kPageSize, b.num_pages);
  validate_indptr("qo_indptr", b.qo_indptr);
  const AttentionSpec decode_spec{variants::standard(), DType::kFloat16, DType::kFloat16, DType::kFloat16, kHeadDim};
  const DecodeConfig cfg = catalog::decode_config(decode_spec, kHq / kHkv);
  std::vector<int32_t> decode_lens;
  for (size_t r = 0; r < b.q_len.size(); ++r)
    if (b.q_len[r] == 1) decode_lens.push_back(static_cast<int32_t>(table.kv_len(static_cast<int64_t>(r))));
  Planner planner;
  DecodePlan plan;
  const int ctas_per_head = std::max(1, 132 * cfg.ctas_per_sm / kHkv);
  planner.plan_decode(decode_lens, ctas_per_head, {}, plan);
  std::printf("plan: %zu requests (3 decode, 2 prefill), %lld query rows, %lld pages\n", b.q_len.size(),
              (long long)b.total_q(), (long long)b.num_pages);
  std::printf("plan: decode -> %zu work items on %d x %d CTAs (chunk %d tokens, %d split requests); prefill -> "
              "%lld query rows on the tensor-core prefill kernel\n",
              plan.items.size(), ctas_per_head, kHkv, plan.chunk_size, plan.num_split_requests,
              (long long)(b.total_q() - static_cast<int64_t>(decode_lens.size())));

  // The kernels a GPU run would launch: decode, and prefill with the FA2
  // template (sm_80) or the Hopper one (sm_90a).
  const AttentionSpec spec{variants::causal(), DType::kFloat16, DType::kFloat16, DType::kFloat16, kHeadDim};
  const std::pair<jit::KernelSource, const char*> kernels[] = {
      {catalog::batch_decode(decode_spec, kHq / kHkv), "sm_80"},
      {catalog::batch_decode(decode_spec, kHq / kHkv), "sm_90a"},
      {catalog::batch_prefill(spec, 64), "sm_80"},
      {catalog::batch_prefill(spec, 64, true), "sm_90a"}};
  for (const auto& [src, arch] : kernels) {
      auto bin = jit::KernelCache::global().cubin(src, jit::Arch::parse(arch));
      std::printf("jit: %s for %s: %zu-byte cubin (%s)\n", src.entry.c_str(), arch, bin->image.size(),
                  bin->from_disk ? "disk cache" : (std::to_string(bin->compile_ms) + " ms compile").c_str());
    }

  // Reference path: the paged reference against the dense formula, per row.
  HostBuf q = random_fp16(b.total_q() * kHq * kHeadDim, rng);
  HostBuf k = random_fp16(b.num_pages * kPageSize * kHkv * kHeadDim, rng);
  HostBuf v = random_fp16(k.data.size(), rng);
  std::vector<int64_t> rows(b.total_q());
  std::iota(rows.begin(), rows.end(), 0);
  const Batch t = truncated_rows(b, rows);
  auto ref = reference_rows(q, rows, t, k, v);
  double max_err = 0;
  for (size_t s = 0; s < rows.size(); ++s)
    for (int h = 0; h < kHq; ++h) {
      const int kv = t.kv_len[s];
      std::vector<double> qd(kHeadDim), kd, vd, o, lse;
      for (int d = 0; d < kHeadDim; ++d) qd[d] = half_to_float(q.data[(rows[s] * kHq + h) * kHeadDim + d]);
      for (int j = 0; j < kv; ++j) {
        const int64_t page = t.kv_indices[t.kv_indptr[s] + j / kPageSize];
        const int64_t base = ((page * kPageSize + j % kPageSize) * kHkv + h / (kHq / kHkv)) * kHeadDim;
        for (int d = 0; d < kHeadDim; ++d) {
          kd.push_back(half_to_float(k.data[base + d]));
          vd.push_back(half_to_float(v.data[base + d]));
        }
      }
      reference::dense_attention(qd, kd, vd, 1, kv, kHeadDim, 1.0 / std::sqrt(kHeadDim), {}, o, lse);
      for (int d = 0; d < kHeadDim; ++d) max_err = std::max(max_err, std::abs(o[d] - ref.at(s, h, d)));
    }
  const bool ok = max_err < 1e-9;
  std::printf("reference check (%lld rows x %d heads, paged vs dense formula): max abs diff %.2e  %s\n",
              (long long)rows.size(), kHq, max_err, ok ? "PASS" : "FAIL");
  return ok ? 0 : 1;
}

struct StepResult {
  bool ok = false;
  double ms = 0;
  Work work;
};

// Plans, verifies against the reference and times one batch. Decode-only
// batches run on BatchDecode (planner + persistent split-KV kernel); batches
// with longer queries on BatchPrefill (tensor cores, causal).
StepResult run_step(const char* label, const Batch& b, const HostBuf& q_host, HostBuf& k_host, HostBuf& v_host,
                    const cuda::DeviceBuffer& k_dev, const cuda::DeviceBuffer& v_dev, const DemoOptions& opt,
                    std::mt19937_64& rng) {
  const Device dev{DeviceType::kCUDA, cuda::current_device()};
  const bool decode_only = std::all_of(b.q_len.begin(), b.q_len.end(), [](int32_t q) { return q == 1; });
  const AttentionSpec spec{decode_only ? variants::standard() : variants::causal(), DType::kFloat16, DType::kFloat16,
                           DType::kFloat16, kHeadDim};
  TaskInfo task{kHq, kHkv, kPageSize, KVLayout::kNHD, static_cast<int64_t>(b.q_len.size()),
                static_cast<int64_t>(b.kv_indices.size())};
  cudaStream_t stream;
  TESSERA_CUDA_CHECK(cudaStreamCreate(&stream));

  // The engine for this batch: plan once, then a run closure.
  std::optional<Workspace> ws;
  std::optional<BatchDecode> dec;
  std::optional<BatchPrefill> pre;
  std::string kernel_name;
  const auto t_plan = std::chrono::steady_clock::now();
  if (decode_only) {
    auto sizes = BatchDecode::workspace_size(spec, task, cuda::device_info(dev.index).sm_count);
    ws.emplace(Workspace::allocate(sizes.device_bytes, sizes.host_bytes));
    dec.emplace(spec, task, *ws);
    dec->plan(b.kv_indptr, b.kv_indices, b.last_page_len, stream);
    kernel_name = dec->kernel_source().entry;
  } else {
    task.max_total_q = b.total_q();
    auto sizes = BatchPrefill::workspace_size(spec, task, cuda::device_info(dev.index).sm_count);
    ws.emplace(Workspace::allocate(sizes.device_bytes, sizes.host_bytes));
    pre.emplace(spec, task, *ws);
    pre->plan_paged(b.qo_indptr, b.kv_indptr, b.kv_indices, b.last_page_len, stream);
    kernel_name = pre->kernel_source().entry;
  }
  const double plan_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t_plan).count();

  const int64_t rows = b.total_q();
  cuda::DeviceBuffer q_dev(q_host.data.size() * 2), o_dev(rows * kHq * kHeadDim * 2), lse_dev(rows * kHq * 4);
  q_dev.upload(q_host.data.data(), q_dev.bytes());
  o_dev.fill(0xFF);  // poison: NaN in fp16
  const std::vector<int64_t> page_shape = {b.num_pages, kPageSize, kHkv, kHeadDim};
  PagedKVStorage kv(TensorView(k_dev.get(), DType::kFloat16, dev, page_shape),
                    TensorView(v_dev.get(), DType::kFloat16, dev, page_shape), KVLayout::kNHD);
  TensorView q(q_dev.get(), DType::kFloat16, dev, {rows, kHq, kHeadDim});
  TensorView o(o_dev.get(), DType::kFloat16, dev, {rows, kHq, kHeadDim});
  TensorView lse(lse_dev.get(), DType::kFloat32, dev, {rows, kHq});
  auto run = [&] {
    if (dec) dec->run(q, kv, o, lse, stream);
    else pre->run(q, kv, o, lse, stream);
  };
  run();
  TESSERA_CUDA_CHECK(cudaStreamSynchronize(stream));

  std::vector<uint16_t> out(rows * kHq * kHeadDim);
  o_dev.download(out.data(), out.size() * 2);
  const auto sampled = sample_rows(b, rng);
  const auto ref = reference_rows(q_host, sampled, truncated_rows(b, sampled), k_host, v_host);
  bool nan_seen = false;
  const double err = check_rows(out, sampled, ref, &nan_seen);
  for (uint16_t x : out) nan_seen |= std::isnan(half_to_float(x));  // every row written (poison gone)
  StepResult res;
  res.ok = err < 1e-3 && !nan_seen;

  cudaEvent_t e0, e1;
  TESSERA_CUDA_CHECK(cudaEventCreate(&e0));
  TESSERA_CUDA_CHECK(cudaEventCreate(&e1));
  for (int i = 0; i < 3; ++i) run();
  std::vector<double> times;
  for (int i = 0; i < opt.iters; ++i) {
    TESSERA_CUDA_CHECK(cudaEventRecord(e0, stream));
    run();
    TESSERA_CUDA_CHECK(cudaEventRecord(e1, stream));
    TESSERA_CUDA_CHECK(cudaEventSynchronize(e1));
    float ms = 0;
    TESSERA_CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
    times.push_back(ms);
  }
  TESSERA_CUDA_CHECK(cudaEventDestroy(e0));
  TESSERA_CUDA_CHECK(cudaEventDestroy(e1));
  TESSERA_CUDA_CHECK(cudaStreamDestroy(stream));
  res.ms = median(times);
  res.work = step_work(b);
  std::printf("%-8s %4zu req %6lld rows | %-52s %9.1f us %8.1f GB/s %7.2f TFLOP/s | plan %6.2f ms | err %.1e %s\n", label,
              b.q_len.size(), (long long)rows, kernel_name.c_str(), res.ms * 1e3, res.work.bytes / (res.ms * 1e-3) / 1e9,
              res.work.flops / (res.ms * 1e-3) / 1e12, plan_ms, err,
              res.ok ? "PASS" : (nan_seen ? "FAIL (NaN/unwritten)" : "FAIL"));
  return res;
}

}  // namespace

int run_demo(const DemoOptions& opt) {
  if (!cuda::gpu_available()) return demo_without_gpu(opt);
  const auto info = cuda::device_info(cuda::current_device());
  std::printf("GPU: %s (sm_%d%d, %d SMs); fp16, Hq=%d Hkv=%d D=%d, page size %d, causal\n", info.name.c_str(),
              info.major, info.minor, info.sm_count, kHq, kHkv, kHeadDim, kPageSize);
  std::mt19937_64 rng(opt.seed);
  const bool small = opt.small;
  // One serving step: the decode requests (one query each) and the
  // chunked-prefill requests of the same step, each on its kernel.
  Batch decode = make_batch(small ? 4 : 96, 0, small ? 300 : 4096, 1, 0, rng);
  Batch prefill = make_batch(0, small ? 2 : 4, 1, small ? 64 : 512, small ? 64 : 1024, rng);
  bool ok = true;
  double total_ms = 0, total_bytes = 0, total_flops = 0;
  for (auto [label, b] : {std::pair<const char*, Batch*>{"decode", &decode}, {"prefill", &prefill}}) {
    HostBuf q = random_fp16(b->total_q() * kHq * kHeadDim, rng);
    HostBuf k = random_fp16(b->num_pages * kPageSize * kHkv * kHeadDim, rng);
    HostBuf v = random_fp16(k.data.size(), rng);
    cuda::DeviceBuffer k_dev(k.data.size() * 2), v_dev(v.data.size() * 2);
    k_dev.upload(k.data.data(), k_dev.bytes());
    v_dev.upload(v.data.data(), v_dev.bytes());
    StepResult r = run_step(label, *b, q, k, v, k_dev, v_dev, opt, rng);
    ok &= r.ok;
    total_ms += r.ms;
    total_bytes += r.work.bytes;
    total_flops += r.work.flops;
  }
  std::printf("step     %4zu req          | %-52s %9.1f us %8.1f GB/s %7.2f TFLOP/s\n",
              decode.q_len.size() + prefill.q_len.size(), "decode + prefill", total_ms * 1e3,
              total_bytes / (total_ms * 1e-3) / 1e9, total_flops / (total_ms * 1e-3) / 1e12);
  const auto s = jit::KernelCache::global().stats();
  std::printf("jit: %lld compiled (%.0f ms), %lld from disk cache (%.1f ms), cache %s\n", (long long)s.compiles,
              s.compile_ms_total, (long long)s.disk_hits, s.disk_load_ms_total, jit::KernelCache::global().dir().c_str());
  std::printf("demo: %s\n", ok ? "PASS" : "FAIL");
  return ok ? 0 : 1;
}

}  // namespace tessera::tools
