// JIT runtime tests that need no GPU: every built-in kernel compiles to cubin
// for sm_80 and sm_90a, the disk cache is hit by a fresh cache object (as by a
// second process), keys separate what must be separate, compile errors carry
// the NVRTC log and the generated source's path, and concurrent requests for
// one kernel compile it once.
#include <gtest/gtest.h>

#include <array>
#include <filesystem>
#include <limits>
#include <fstream>
#include <thread>

#include "tessera/runtime/jit.hpp"
#include "tessera/runtime/kernel_catalog.hpp"
#include "tessera/runtime/prefill_catalog.hpp"
#include "tessera/runtime/tensor_map.hpp"
#include "jit_util.hpp"
#include "test_util.hpp"

namespace fs = std::filesystem;
using namespace tessera;

using test::ScratchDir;
using test::is_elf;

TEST(Jit, ArchParse) {
  EXPECT_EQ(jit::Arch::parse("sm_90a").str(), "sm_90a");
  EXPECT_EQ(jit::Arch::parse("89").str(), "sm_89");
  EXPECT_EQ(jit::Arch::parse("8.0").str(), "sm_80");
  EXPECT_TRUE(jit::Arch::parse("sm_90a").arch_specific);
  EXPECT_THROW_MSG(jit::Arch::parse("banana"), InvalidArgument, "arch");
  EXPECT_THROW_MSG(jit::Arch::parse("sm_20"), InvalidArgument, "arch");
}

// The run's shared cache: `tessera compile` fills it with these same kernels,
// so here they usually come from disk, compiled by NVRTC from the same source
// (the key hashes source, options, arch, NVRTC version and headers).
TEST(Jit, EveryBuiltinCompilesForAmpereAndHopper) {
  jit::KernelCache cache;
  auto kernels = catalog::builtin_kernels();
  for (auto& k : catalog::builtin_prefill_kernels()) kernels.push_back(std::move(k));
  ASSERT_GE(kernels.size(), 80u);
  for (const char* arch : {"sm_80", "sm_90a"}) {
    cache.precompile(kernels, jit::Arch::parse(arch), 2);
    for (const auto& k : kernels) {
      auto bin = cache.cubin(k, jit::Arch::parse(arch));
      EXPECT_TRUE(is_elf(bin->image)) << k.entry << " for " << arch;
    }
  }
  // One compile or disk read per kernel and arch: no two kernels share a key.
  EXPECT_EQ(cache.stats().compiles + cache.stats().disk_hits, static_cast<int64_t>(2 * kernels.size()));
}

TEST(Jit, SecondCacheLoadsFromDisk) {
  const ScratchDir scratch("disk");
  const fs::path& dir = scratch.path();
  const auto src = catalog::merge_pair(DType::kFloat16);
  const auto arch = jit::Arch::parse("sm_80");
  std::vector<char> first;
  {
    jit::KernelCache cold(dir.string());
    auto bin = cold.cubin(src, arch);
    EXPECT_FALSE(bin->from_disk);
    EXPECT_GT(bin->compile_ms, 0.0);
    first = bin->image;
    EXPECT_TRUE(fs::exists(dir / (bin->key + ".cubin")));
    EXPECT_TRUE(fs::exists(dir / "src" / (bin->key + ".cu")));
  }
  jit::KernelCache warm(dir.string());  // a new process would start like this
  auto bin = warm.cubin(src, arch);
  EXPECT_TRUE(bin->from_disk);
  EXPECT_EQ(bin->image, first);
  EXPECT_EQ(warm.stats().compiles, 0);
  EXPECT_EQ(warm.stats().disk_hits, 1);
  auto again = warm.cubin(src, arch);  // now from memory
  EXPECT_EQ(again.get(), bin.get());
  EXPECT_EQ(warm.stats().memory_hits, 1);
}

// Kernel packs (prebuilt cubins an install ships): looked up after memory and
// before the disk cache, in the order added; a miss falls through.
TEST(Jit, KernelPacksComeBeforeTheDiskCache) {
  const ScratchDir cache_dir("pack_cache"), pack_a("pack_a"), pack_b("pack_b");
  fs::create_directories(pack_a.path());
  fs::create_directories(pack_b.path());
  const auto src = catalog::merge_pair(DType::kFloat16), other = catalog::merge_pair(DType::kBFloat16);
  const auto arch = jit::Arch::parse("sm_80");
  jit::KernelCache cache(cache_dir.str());
  EXPECT_THROW_MSG(cache.add_pack((cache_dir.path() / "missing").string()), InvalidArgument, "dir");
  const std::string key = cache.key(src, arch);
  auto put = [&](const fs::path& dir, const std::string& text) {
    std::ofstream(dir / (key + ".cubin"), std::ios::binary) << text;
  };
  put(pack_b.path(), "from pack b");
  put(pack_a.path(), "from pack a");
  cache.add_pack(pack_a.str());
  cache.add_pack(pack_b.str());
  cache.add_pack(pack_a.str());  // added once
  ASSERT_EQ(cache.packs(), (std::vector<std::string>{pack_a.str(), pack_b.str()}));
  auto bin = cache.cubin(src, arch);
  EXPECT_TRUE(bin->from_pack && bin->from_disk);
  EXPECT_EQ(std::string(bin->image.begin(), bin->image.end()), "from pack a");
  EXPECT_EQ(cache.stats().pack_hits, 1);
  EXPECT_EQ(cache.stats().compiles, 0);
  EXPECT_FALSE(fs::exists(cache_dir.path() / (key + ".cubin"))) << "a pack hit writes nothing to the cache";
  auto miss = cache.cubin(other, arch);  // in no pack: compiled into the cache
  EXPECT_FALSE(miss->from_pack);
  EXPECT_TRUE(is_elf(miss->image));
  EXPECT_EQ(cache.stats().compiles, 1);
}

TEST(Jit, PrecompileReportsProgress) {
  const ScratchDir dir("progress");
  jit::KernelCache cache(dir.str());
  const std::vector<jit::KernelSource> srcs = {catalog::merge_pair(DType::kFloat16), catalog::merge_pair(DType::kBFloat16),
                                               catalog::merge_many(DType::kFloat32)};
  std::vector<size_t> seen;
  cache.precompile(srcs, jit::Arch::parse("sm_80"), 2, [&](size_t done, size_t total) {
    EXPECT_EQ(total, srcs.size());
    seen.push_back(done);
  });
  EXPECT_EQ(seen, (std::vector<size_t>{1, 2, 3})) << "one call per kernel, one at a time, in order of completion";
}

TEST(Jit, KeySeparatesSourceOptionsAndArch) {
  const ScratchDir dir("keys");
  jit::KernelCache cache(dir.str());
  auto a = catalog::merge_pair(DType::kFloat16);
  auto b = a;
  b.options.push_back("-DSOMETHING=1");
  auto c = catalog::merge_pair(DType::kBFloat16);
  const auto sm80 = jit::Arch::parse("sm_80"), sm90 = jit::Arch::parse("sm_90a");
  EXPECT_EQ(cache.key(a, sm80), cache.key(a, sm80));
  EXPECT_NE(cache.key(a, sm80), cache.key(b, sm80));
  EXPECT_NE(cache.key(a, sm80), cache.key(c, sm80));
  EXPECT_NE(cache.key(a, sm80), cache.key(a, sm90));
}

TEST(Jit, CompileErrorNamesLogAndSource) {
  const ScratchDir dir("error");
  jit::KernelCache cache(dir.str());
  AttentionSpec spec;
  spec.variant = {"Broken", "struct Broken : tessera::VariantBase {\n  using tessera::VariantBase::VariantBase;\n"
                            "  int oops = undefined_symbol;\n};\n"};
  try {
    cache.cubin(catalog::attention_rowwise(spec), jit::Arch::parse("sm_80"));
    FAIL() << "expected CompileError";
  } catch (const CompileError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("undefined_symbol"), std::string::npos) << msg;
    EXPECT_NE(msg.find("variant:Broken"), std::string::npos) << msg;  // the user's line, via #line
    const auto pos = msg.find("generated source: ");
    ASSERT_NE(pos, std::string::npos) << msg;
    const std::string path = msg.substr(pos + 18, msg.find('\n', pos) - pos - 18);
    EXPECT_TRUE(fs::exists(path)) << path;
  }
}

TEST(Jit, ConcurrentRequestsCompileOnce) {
  const ScratchDir dir("concurrent");
  jit::KernelCache cache(dir.str());
  const auto src = catalog::merge_many(DType::kFloat32);
  const auto arch = jit::Arch::parse("sm_80");
  std::vector<std::thread> threads;
  std::vector<const jit::Cubin*> got(4);
  for (int i = 0; i < 4; ++i) threads.emplace_back([&, i] { got[i] = cache.cubin(src, arch).get(); });
  for (auto& t : threads) t.join();
  for (int i = 1; i < 4; ++i) EXPECT_EQ(got[i], got[0]);
  EXPECT_EQ(cache.stats().compiles, 1);
}

TEST(Jit, SpecValidation) {
  AttentionSpec spec;
  spec.head_dim = 96;
  EXPECT_THROW_MSG(catalog::attention_rowwise(spec), InvalidArgument, "head_dim");
  spec.head_dim = 128;
  spec.q_dtype = DType::kFloat32;
  EXPECT_THROW_MSG(catalog::attention_rowwise(spec), TypeMismatch, "q_dtype");
  EXPECT_THROW_MSG(catalog::merge_pair(DType::kInt32), TypeMismatch, "v");
  // fp32 outputs: the tensor-core prefill kernels only; fp32 states merge
  // into a 16-bit output, not the other way round.
  spec.q_dtype = DType::kFloat16;
  spec.o_dtype = DType::kFloat32;
  EXPECT_NO_THROW(catalog::batch_prefill(spec, 64));
  EXPECT_THROW_MSG(catalog::attention_rowwise(spec), TypeMismatch, "o_dtype");
  EXPECT_THROW_MSG(catalog::batch_decode(spec, 4), TypeMismatch, "o_dtype");
  spec.o_dtype = DType::kInt32;
  EXPECT_THROW_MSG(catalog::batch_prefill(spec, 64), TypeMismatch, "o_dtype");
  EXPECT_NO_THROW(catalog::merge_pair(DType::kFloat32, DType::kBFloat16));
  EXPECT_THROW_MSG(catalog::merge_pair(DType::kFloat16, DType::kFloat32), TypeMismatch, "v_out");
  EXPECT_THROW_MSG(catalog::merge_pair(DType::kFloat32, DType::kInt32), TypeMismatch, "v_out");
}

// soft_cap / sliding_window: value-specific specs (name and code carry the
// value), argument validation, which ones count as causal.
TEST(Jit, SoftCapAndSlidingWindowSpecs) {
  const VariantSpec a = variants::soft_cap(30.f, true), b = variants::soft_cap(30.f, false);
  EXPECT_EQ(a.name, "CausalSoftCap_30");
  EXPECT_EQ(b.name, "SoftCap_30");
  EXPECT_TRUE(a.causal);
  EXPECT_FALSE(b.causal);
  EXPECT_TRUE(a.code.empty());  // a built-in: its header and struct, no code
  EXPECT_EQ(a.headers, std::vector<std::string>{"tessera/device/variants/soft_cap.cuh"});
  EXPECT_EQ(a.struct_name, "tessera::variants::SoftCap<0x41f00000u>");  // 30 as its float bits
  EXPECT_EQ(variants::soft_cap(2.5f).name, "SoftCap_2p5");
  EXPECT_EQ(variants::soft_cap(1e-5f).name, "SoftCap_9p99999975em06");
  EXPECT_NE(variants::soft_cap(30.f), variants::soft_cap(30.000002f));  // adjacent floats: different kernels
  EXPECT_EQ(variants::sliding_window(128, true).name, "CausalSlidingWindow_128");
  EXPECT_EQ(variants::sliding_window(0).name, "SlidingWindow_0");
  EXPECT_THROW_MSG(variants::soft_cap(0.f), InvalidArgument, "cap");
  EXPECT_THROW_MSG(variants::soft_cap(-1.f), InvalidArgument, "cap");
  EXPECT_THROW_MSG(variants::soft_cap(std::numeric_limits<float>::infinity()), InvalidArgument, "cap");
  EXPECT_THROW_MSG(variants::soft_cap(std::numeric_limits<float>::quiet_NaN()), InvalidArgument, "cap");
  EXPECT_THROW_MSG(variants::sliding_window(-1), InvalidArgument, "window_left");

  // FlashInfer's plan() options: defaults give the plain specs, one option
  // the single-option spec, both one combined spec.
  EXPECT_EQ(variants::from_plan_options(false), variants::standard());
  EXPECT_EQ(variants::from_plan_options(true, -1, 0.f), variants::causal());
  EXPECT_EQ(variants::from_plan_options(true, 128, 0.f), variants::sliding_window(128, true));
  EXPECT_EQ(variants::from_plan_options(false, -1, 30.f), variants::soft_cap(30.f, false));
  const VariantSpec both = variants::from_plan_options(true, 4096, 50.f);
  EXPECT_EQ(both.name, "CausalSlidingWindow_4096_SoftCap_50");
  EXPECT_TRUE(both.causal);
  EXPECT_EQ(both.window_left, 4096);
  // The composing template: the window on top of the soft cap (50 = 0x42480000).
  EXPECT_EQ(both.struct_name, "tessera::variants::SlidingWindow<4096, tessera::variants::SoftCap<0x42480000u>>");
  EXPECT_EQ(both.headers, (std::vector<std::string>{"tessera/device/variants/sliding_window.cuh",
                                                    "tessera/device/variants/soft_cap.cuh"}));
  EXPECT_EQ(variants::from_plan_options(false, 0, 2.5f).name, "SlidingWindow_0_SoftCap_2p5");
  EXPECT_THROW_MSG(variants::from_plan_options(false, -2, 0.f), InvalidArgument, "window_left");
  EXPECT_THROW_MSG(variants::from_plan_options(false, -1, -1.f), InvalidArgument, "logits_soft_cap");
  EXPECT_THROW_MSG(variants::from_plan_options(false, -1, std::numeric_limits<float>::quiet_NaN()), InvalidArgument,
                   "logits_soft_cap");
  // pos_encoding_mode ROPE_LLAMA: the built-in rope variant (half-split), causal or not; not with a window or cap.
  using variants::PosEncoding;
  EXPECT_EQ(variants::from_plan_options(false, -1, 0.f, PosEncoding::kRopeLlama), variants::rope(false, false));
  EXPECT_EQ(variants::from_plan_options(true, -1, 0.f, PosEncoding::kRopeLlama), variants::rope(false, true));
  EXPECT_EQ(variants::from_plan_options(true, -1, 0.f, PosEncoding::kNone), variants::causal());
  EXPECT_THROW_MSG(variants::from_plan_options(true, 16, 0.f, PosEncoding::kRopeLlama), InvalidArgument,
                   "pos_encoding_mode");
  EXPECT_THROW_MSG(variants::from_plan_options(false, -1, 30.f, PosEncoding::kRopeLlama), InvalidArgument,
                   "pos_encoding_mode");

  EXPECT_TRUE(variants::is_causal(variants::causal()));
  EXPECT_TRUE(variants::is_causal(a));
  EXPECT_TRUE(variants::is_causal(variants::sliding_window(7, true)));
  EXPECT_FALSE(variants::is_causal(b));
  EXPECT_FALSE(variants::is_causal(variants::sliding_window(7, false)));
  EXPECT_FALSE(variants::is_causal(variants::standard()));
  EXPECT_FALSE(variants::is_causal(variants::custom_mask()));
  EXPECT_FALSE(variants::is_causal({"CausalSoftCap_1", "struct CausalSoftCap_1 : tessera::VariantBase {};"}));
}

// The new variants compile into the prefill (FA2 on sm_80 and sm_90a, Hopper
// on sm_90a) and decode kernels.
TEST(Jit, SoftCapAndSlidingWindowKernelsCompile) {
  jit::KernelCache cache;  // the run's shared cache
  for (const VariantSpec& v : {variants::soft_cap(30.f, true), variants::sliding_window(128, true),
                               variants::from_plan_options(true, 128, 30.f)}) {
    const AttentionSpec spec{v, DType::kFloat16, DType::kFloat16, DType::kFloat16, 128};
    std::vector<jit::KernelSource> both{catalog::batch_prefill(spec, 128, false), catalog::batch_decode(spec, 4)};
    for (const char* arch : {"sm_80", "sm_90a"})
      for (const auto& k : both) EXPECT_TRUE(is_elf(cache.cubin(k, jit::Arch::parse(arch))->image)) << k.entry << " " << arch;
    ASSERT_TRUE(catalog::hopper_supported(spec, 128));
    const auto hopper = catalog::batch_prefill(spec, 128, true);
    EXPECT_TRUE(is_elf(cache.cubin(hopper, jit::Arch::parse("sm_90a"))->image)) << hopper.entry;
  }
  // A soft cap without causal on bf16 / d64, too.
  const AttentionSpec bf{variants::soft_cap(5.f), DType::kBFloat16, DType::kBFloat16, DType::kBFloat16, 64};
  EXPECT_TRUE(is_elf(cache.cubin(catalog::batch_prefill(bf, 64), jit::Arch::parse("sm_80"))->image));
  EXPECT_TRUE(is_elf(cache.cubin(catalog::batch_decode(bf, 1), jit::Arch::parse("sm_80"))->image));
}

// The Hopper prefill configuration: V one stage deeper than K, a second Q
// buffer only where it fits, every tile within the 227 KB a CTA may use, and
// 64-row tiles at two CTAs per SM.
TEST(Jit, HopperPrefillRingsFitSharedMemory) {
  for (int d : {64, 128})
    for (int cta_q : {64, 128}) {
      const AttentionSpec spec{variants::causal(), DType::kFloat16, DType::kFloat16, DType::kFloat16, d};
      const PrefillConfig c = catalog::prefill_config(spec, cta_q, true);
      SCOPED_TRACE("d " + std::to_string(d) + " cta_q " + std::to_string(cta_q));
      EXPECT_EQ(c.v_stages, c.stages + 1);
      const int dynamic = 2 * (c.q_bufs * cta_q * d + (c.stages + c.v_stages) * c.cta_kv * d) + 1024;
      EXPECT_EQ(c.smem_bytes, dynamic);
      EXPECT_LE(c.smem_bytes + 5120, 227 * 1024);
      if (cta_q == 64) {
        EXPECT_EQ(c.ctas_per_sm, 2);
        EXPECT_LE(2 * (c.smem_bytes + 5120), 228 * 1024);
      }
      // The kernel name carries the ring depths (they change the code).
      const std::string entry = catalog::batch_prefill(spec, cta_q, true).entry;
      EXPECT_NE(entry.find("_k" + std::to_string(c.stages) + "v" + std::to_string(c.v_stages) + "q" +
                           std::to_string(c.q_bufs)),
                std::string::npos)
          << entry;
    }
  // 128 x 128 tiles at head_dim 128: two Q buffers would not fit next to 2 + 3 stages.
  const AttentionSpec spec{variants::causal(), DType::kFloat16, DType::kFloat16, DType::kFloat16, 128};
  EXPECT_EQ(catalog::prefill_config(spec, 128, true).q_bufs, 1);
  // Head dim 256: 64-token KV tiles, one CTA per SM; at 128 query rows even
  // V's third stage does not fit (Q 64 KB + K 2 x 32 KB + V 2 x 32 KB).
  for (DType dt : {DType::kFloat16, DType::kBFloat16}) {
    const AttentionSpec d256{variants::causal(), dt, dt, dt, 256};
    const PrefillConfig c128 = catalog::prefill_config(d256, 128, true), c64 = catalog::prefill_config(d256, 64, true);
    EXPECT_EQ(c128.cta_kv, 64);
    EXPECT_EQ(c128.stages, 2);
    EXPECT_EQ(c128.v_stages, 2);
    EXPECT_EQ(c128.q_bufs, 1);
    EXPECT_EQ(c128.ctas_per_sm, 1);
    EXPECT_EQ(c128.smem_bytes, 2 * (128 * 256 + 4 * 64 * 256) + 1024);
    EXPECT_EQ(c64.cta_kv, 64);
    EXPECT_EQ(c64.v_stages, 3);
    EXPECT_EQ(c64.q_bufs, 1);
    EXPECT_EQ(c64.ctas_per_sm, 1);
    EXPECT_LE(c64.smem_bytes + 5120, 227 * 1024);
    EXPECT_TRUE(catalog::hopper_supported(d256, 128));
    EXPECT_FALSE(catalog::hopper_supported(d256, 32));
  }
}

// FA2 template, 128-row query tiles at head dim 128 (32 rows per warp):
// 64-token KV tiles for variants without per-element functors, 32 for the
// others (they would spill at 64); head dim 256 keeps 32.
TEST(Jit, Fa2KvTileFollowsTheVariant) {
  auto kv_tile = [](const VariantSpec& v, int d) {
    return catalog::prefill_config(AttentionSpec{v, DType::kFloat16, DType::kFloat16, DType::kFloat16, d}, 128).cta_kv;
  };
  EXPECT_EQ(kv_tile(variants::standard(), 128), 64);
  EXPECT_EQ(kv_tile(variants::causal(), 128), 64);
  EXPECT_EQ(kv_tile(variants::sliding_window(100, true), 128), 64);
  EXPECT_EQ(kv_tile(variants::soft_cap(30.f, true), 128), 32);
  EXPECT_EQ(kv_tile(variants::custom_mask(), 128), 32);
  EXPECT_EQ(kv_tile(variants::standard(), 256), 32);
}

// PrefillTile (PrefillOptions::tile): set fields replace the heuristic's,
// reach the kernel's name and template arguments, and are checked against
// each template's requirements with the field named.
TEST(Jit, PrefillTileOverrideReachesTheKernel) {
  const AttentionSpec spec{variants::standard(), DType::kFloat16, DType::kFloat16, DType::kFloat16, 128};
  EXPECT_EQ(catalog::batch_prefill(spec, 64, false, 1, PrefillTile{}).source, catalog::batch_prefill(spec, 64).source);
  // (cta_kv, warps_q, warps_kv, stages, v_stages, q_bufs, threads)
  auto fields = [](const PrefillConfig& c) {
    return std::array{c.cta_kv, c.warps_q, c.warps_kv, c.stages, c.v_stages, c.q_bufs, c.threads};
  };
  const PrefillTile fa2_tile{.cta_kv = 32, .warps_q = 2, .warps_kv = 1, .stages = 3};
  const PrefillConfig fa2 = catalog::prefill_config(spec, 64, false, fa2_tile);
  EXPECT_EQ(fields(fa2), (std::array{32, 2, 1, 3, 2, 1, 64}));
  EXPECT_EQ(fa2.smem_bytes, 2 * (64 * 128 + 3 * 2 * 32 * 128));
  const jit::KernelSource fa2_src = catalog::batch_prefill(spec, 64, false, 1, fa2_tile);
  EXPECT_NE(fa2_src.entry.find("_q64_kv32_w2x1_s3"), std::string::npos) << fa2_src.entry;
  EXPECT_NE(fa2_src.source.find("64, 32, 2, 1, 3"), std::string::npos);
  // Zero fields keep the heuristic's choice (64-row tiles: 4 x 1 warps, 2 stages).
  EXPECT_EQ(fields(catalog::prefill_config(spec, 64, false, {.cta_kv = 128})), (std::array{128, 4, 1, 2, 2, 1, 128}));
  // Hopper: the KV tile and the K ring's depth (V one deeper, a second Q
  // buffer where they fit); the warps follow the query tile.
  const PrefillTile sm90_tile{.cta_kv = 64, .stages = 3};
  EXPECT_EQ(fields(catalog::prefill_config(spec, 128, true, sm90_tile)), (std::array{64, 8, 1, 3, 4, 2, 384}));
  EXPECT_NE(catalog::batch_prefill(spec, 128, true, 1, sm90_tile).entry.find("_kv64_k3v4q2"), std::string::npos);

  auto fa2_throws = [&](int cta_q, PrefillTile t, const char* field) {
    EXPECT_THROW_MSG(catalog::prefill_config(spec, cta_q, false, t), InvalidArgument, field);
  };
  fa2_throws(64, {.cta_kv = -16}, "tile.cta_kv");
  fa2_throws(64, {.cta_kv = 24}, "tile.cta_kv");
  fa2_throws(64, {.warps_q = -1}, "tile.warps_q");
  fa2_throws(64, {.stages = 1}, "tile.stages");
  fa2_throws(16, {.warps_q = 2}, "tile.warps_q");                 // 2 warps of 16 rows > a 16-row tile
  fa2_throws(64, {.warps_q = 3}, "tile.warps_q");                 // 64 rows do not split over 3 warps
  fa2_throws(64, {.cta_kv = 32, .warps_kv = 4}, "tile.warps_kv");  // 8 KV columns per warp
  fa2_throws(64, {.cta_kv = 256, .warps_q = 4, .warps_kv = 16}, "tile.warps_q");  // 2048 threads
  fa2_throws(64, {.cta_kv = 256, .stages = 4}, "tile");           // 512 KB of shared memory
  EXPECT_THROW_MSG(catalog::prefill_config(spec, 128, true, {.cta_kv = 32}), InvalidArgument, "tile.cta_kv");
  EXPECT_THROW_MSG(catalog::prefill_config(spec, 128, true, {.warps_q = 8}), InvalidArgument, "tile.warps_q");
  EXPECT_THROW_MSG(catalog::prefill_config(spec, 128, true, {.stages = 6}), InvalidArgument, "tile");  // too big for one CTA
  EXPECT_THROW_MSG(catalog::batch_prefill(spec, 64, false, 1, {.stages = 1}), InvalidArgument, "tile.stages");
}

// The Hopper kernel takes its K / V tensor maps as a second, grid-constant
// parameter (the TMA reads them from parameter space); the other families
// keep one parameter.
TEST(Jit, HopperPrefillTakesTensorMapsAsGridConstant) {
  const AttentionSpec spec{variants::causal(), DType::kBFloat16, DType::kBFloat16, DType::kBFloat16, 128};
  const std::string hopper = catalog::batch_prefill(spec, 128, true).source;
  EXPECT_NE(hopper.find("const __grid_constant__ tessera::Sm90TensorMaps tma)"), std::string::npos);
  EXPECT_NE(hopper.find(">(p, tma);"), std::string::npos);
  const std::string fa2 = catalog::batch_prefill(spec, 128, false).source;
  EXPECT_EQ(fa2.find("Sm90TensorMaps"), std::string::npos);
}

// Views the TMA cannot describe are refused before the driver is asked
// (the caller then gathers with cp.async).
TEST(Jit, TensorMapRefusesViewsTheTmaCannotDescribe) {
  alignas(256) static uint16_t buf[64 * 1024];
  TensorMap m{};
  // base not 16-byte aligned
  EXPECT_FALSE(tma::encode_kv_tiles(m, buf + 1, 16, 2, 128, 256, 128, 64));
  // token stride of 8 bytes (not a multiple of 16)
  EXPECT_FALSE(tma::encode_kv_tiles(m, buf, 16, 2, 128, 4, 128, 64));
  // head_dim not a multiple of the 64-feature box
  EXPECT_FALSE(tma::encode_kv_tiles(m, buf, 16, 2, 96, 192, 96, 64));
  // box taller than 256 rows, empty tensor
  EXPECT_FALSE(tma::encode_kv_tiles(m, buf, 16, 2, 128, 256, 128, 512));
  EXPECT_FALSE(tma::encode_kv_tiles(m, buf, 0, 2, 128, 256, 128, 64));
  EXPECT_FALSE(tma::encode_kv_tiles(m, nullptr, 16, 2, 128, 256, 128, 64));
  // Q tiles (tokens 16, kv heads 2, group 4, head_dim 128, token stride 1024,
  // head stride 128, 128 fused rows): the group must divide the tile's rows,
  // strides must be multiples of 16 bytes, the base 16-byte aligned.
  EXPECT_FALSE(tma::encode_q_tiles(m, buf, 16, 2, 3, 128, 768, 128, 128));
  EXPECT_FALSE(tma::encode_q_tiles(m, buf, 16, 2, 4, 128, 1024, 4, 128));
  EXPECT_FALSE(tma::encode_q_tiles(m, buf + 1, 16, 2, 4, 128, 1024, 128, 128));
  EXPECT_FALSE(tma::encode_q_tiles(m, buf, 16, 2, 4, 96, 768, 96, 128));
  EXPECT_FALSE(tma::encode_q_tiles(m, buf, 0, 2, 4, 128, 1024, 128, 128));
  EXPECT_FALSE(tma::encode_q_tiles(m, buf, 16, 2, 512, 128, 1024, 128, 1024));
}
