// Host-side building blocks: fp16/bf16 conversions, TensorView and its
// checks, ragged indices, page tables, paged storage and BSR matrices.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>
#include <random>

#include "tessera/formats/bsr.hpp"
#include "tessera/formats/paged_kv.hpp"
#include "tessera/formats/ragged.hpp"
#include "test_util.hpp"

namespace tessera {
namespace {

using test::HostTensor;
using test::make_host;

const float kInf = std::numeric_limits<float>::infinity();

// ---------------------------------------------------------------------------
// dtype conversions

TEST(DType, HalfFromFloatKnownPatterns) {
  EXPECT_EQ(float_to_half(1.0f), 0x3C00);
  EXPECT_EQ(float_to_half(-2.0f), 0xC000);
  EXPECT_EQ(float_to_half(0.0f), 0x0000);
  EXPECT_EQ(float_to_half(-0.0f), 0x8000);
  EXPECT_EQ(float_to_half(65504.0f), 0x7BFF);   // max finite
  EXPECT_EQ(float_to_half(65519.99f), 0x7BFF);  // just below the midpoint
  EXPECT_EQ(float_to_half(65520.0f), 0x7C00);   // midpoint, odd mantissa -> inf
  EXPECT_EQ(float_to_half(1e9f), 0x7C00);
  EXPECT_EQ(float_to_half(kInf), 0x7C00);
  EXPECT_EQ(float_to_half(-kInf), 0xFC00);
  EXPECT_EQ(float_to_half(std::ldexp(1.0f, -14)), 0x0400);  // smallest normal
  EXPECT_EQ(float_to_half(std::ldexp(1.0f, -24)), 0x0001);  // smallest subnormal
  EXPECT_EQ(float_to_half(std::ldexp(1023.0f, -24)), 0x03FF);
  EXPECT_EQ(float_to_half(std::ldexp(1.0f, -25)), 0x0000);   // tie 0 / 2^-24 -> even (0)
  EXPECT_EQ(float_to_half(std::ldexp(1.5f, -25)), 0x0001);   // above the tie
  EXPECT_EQ(float_to_half(std::ldexp(3.0f, -25)), 0x0002);   // tie 1 / 2 units -> even (2)
  EXPECT_EQ(float_to_half(std::ldexp(5.0f, -25)), 0x0002);   // tie 2 / 3 units -> even (2)
  EXPECT_EQ(float_to_half(-std::ldexp(1.0f, -30)), 0x8000);  // underflow keeps the sign
  EXPECT_EQ(float_to_half(std::ldexp(2047.0f, -25)), 0x0400);  // rounds up into the normals
  // Ties to even in the normal range: 1 + 2^-11 is halfway 0x3C00 / 0x3C01.
  EXPECT_EQ(float_to_half(1.0f + std::ldexp(1.0f, -11)), 0x3C00);
  EXPECT_EQ(float_to_half(1.0f + std::ldexp(3.0f, -11)), 0x3C02);
  EXPECT_EQ(float_to_half(1.0f + std::ldexp(1.0f, -11) + std::ldexp(1.0f, -20)), 0x3C01);
  EXPECT_EQ(float_to_half(2047.0f / 1024.0f + std::ldexp(1.0f, -11)), 0x4000);  // carry into the exponent
}

TEST(DType, HalfNaNStaysNaN) {
  const float nans[] = {std::numeric_limits<float>::quiet_NaN(), std::bit_cast<float>(0x7F800001u),
                        std::bit_cast<float>(0xFF800100u)};
  for (float f : nans) {
    uint16_t h = float_to_half(f);
    EXPECT_EQ(h & 0x7C00, 0x7C00) << std::hex << h;
    EXPECT_NE(h & 0x03FF, 0) << std::hex << h;
    EXPECT_TRUE(std::isnan(half_to_float(h)));
  }
}

TEST(DType, HalfToFloatKnownValues) {
  EXPECT_EQ(half_to_float(0x3C00), 1.0f);
  EXPECT_EQ(half_to_float(0x0001), std::ldexp(1.0f, -24));
  EXPECT_EQ(half_to_float(0x03FF), std::ldexp(1023.0f, -24));
  EXPECT_EQ(half_to_float(0x0400), std::ldexp(1.0f, -14));
  EXPECT_EQ(half_to_float(0x3555), 0.333251953125f);
  EXPECT_EQ(half_to_float(0x7BFF), 65504.0f);
  EXPECT_EQ(half_to_float(0x7C00), kInf);
  EXPECT_EQ(half_to_float(0xFC00), -kInf);
  EXPECT_TRUE(std::signbit(half_to_float(0x8000)));
  EXPECT_TRUE(std::isnan(half_to_float(0x7E00)));
}

TEST(DType, HalfRoundTripsEveryPattern) {
  for (uint32_t bits = 0; bits <= 0xFFFF; ++bits) {
    const uint16_t h = static_cast<uint16_t>(bits);
    const float f = half_to_float(h);
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(half_to_float(float_to_half(f))));
    } else {
      ASSERT_EQ(float_to_half(f), h) << "pattern 0x" << std::hex << bits;
    }
  }
}

// Every midpoint between adjacent finite halves must round to the even one;
// this covers every exponent, subnormals included.
TEST(DType, HalfMidpointsRoundToEven) {
  for (uint32_t bits = 0; bits < 0x7BFF; ++bits) {
    const double lo = half_to_float(static_cast<uint16_t>(bits));
    const double hi = half_to_float(static_cast<uint16_t>(bits + 1));
    const float mid = static_cast<float>((lo + hi) / 2);  // exact in float
    const uint16_t even = (bits & 1) ? static_cast<uint16_t>(bits + 1) : static_cast<uint16_t>(bits);
    ASSERT_EQ(float_to_half(mid), even) << "between 0x" << std::hex << bits << " and 0x" << bits + 1;
    ASSERT_EQ(float_to_half(-mid), even | 0x8000) << "negated, 0x" << std::hex << bits;
  }
}

#ifdef __FLT16_MAX__
// Cross-check with the compiler's own _Float16 conversion (also RNE).
TEST(DType, HalfMatchesCompilerFloat16) {
  std::mt19937 rng(7);
  for (int i = 0; i < 200000; ++i) {
    const float f = std::bit_cast<float>(static_cast<uint32_t>(rng()));
    if (std::isnan(f)) continue;
    const _Float16 h = static_cast<_Float16>(f);
    ASSERT_EQ(float_to_half(f), std::bit_cast<uint16_t>(h)) << f;
  }
}
#endif

TEST(DType, BFloat16KnownPatterns) {
  EXPECT_EQ(float_to_bf16(1.0f), 0x3F80);
  EXPECT_EQ(float_to_bf16(-1.0f), 0xBF80);
  EXPECT_EQ(float_to_bf16(1.0f + std::ldexp(1.0f, -8)), 0x3F80);  // tie -> even
  EXPECT_EQ(float_to_bf16(1.0f + std::ldexp(3.0f, -8)), 0x3F82);  // tie -> even (up)
  EXPECT_EQ(float_to_bf16(1.0f + std::ldexp(1.0f, -8) + std::ldexp(1.0f, -20)), 0x3F81);
  EXPECT_EQ(float_to_bf16(std::numeric_limits<float>::max()), 0x7F80);  // rounds to inf
  EXPECT_EQ(float_to_bf16(kInf), 0x7F80);
  EXPECT_EQ(float_to_bf16(std::bit_cast<float>(0x00010000u)), 0x0001);  // subnormal, exact
  EXPECT_EQ(float_to_bf16(std::bit_cast<float>(0x00018000u)), 0x0002);  // subnormal tie -> even
  const uint16_t nan = float_to_bf16(std::bit_cast<float>(0x7F800001u));  // payload only in low bits
  EXPECT_TRUE(std::isnan(bf16_to_float(nan)));
  EXPECT_EQ(bf16_to_float(0x3F80), 1.0f);
  EXPECT_EQ(bf16_to_float(0x4049), 3.140625f);
  for (uint32_t bits = 0; bits <= 0xFFFF; ++bits) {
    const float f = bf16_to_float(static_cast<uint16_t>(bits));
    if (std::isnan(f)) continue;
    ASSERT_EQ(float_to_bf16(f), bits);
  }
}

TEST(DType, LoadStoreByDType) {
  uint16_t h[2] = {0, 0};
  float f[2] = {0, 0};
  store_from_float(h, DType::kFloat16, 1, 1.0f);
  EXPECT_EQ(h[1], 0x3C00);
  EXPECT_EQ(load_as_float(h, DType::kFloat16, 1), 1.0f);
  store_from_float(h, DType::kBFloat16, 0, -1.0f);
  EXPECT_EQ(h[0], 0xBF80);
  EXPECT_EQ(load_as_float(h, DType::kBFloat16, 0), -1.0f);
  store_from_float(f, DType::kFloat32, 1, 0.1f);
  EXPECT_EQ(load_as_float(f, DType::kFloat32, 1), 0.1f);
  int32_t ints[1] = {0};
  EXPECT_THROW_MSG(load_as_float(ints, DType::kInt32, 0), TypeMismatch, "int32");
  EXPECT_THROW_MSG(store_from_float(ints, DType::kInt32, 0, 1.f), TypeMismatch, "dtype");
}

// ---------------------------------------------------------------------------
// TensorView

TEST(TensorView, StridesSizesAndChecks) {
  float buf[24];
  TensorView t(buf, DType::kFloat32, Device{}, {2, 3, 4});
  EXPECT_EQ(t.strides, (std::vector<int64_t>{12, 4, 1}));
  EXPECT_EQ(t.size(-1), 4);
  EXPECT_EQ(t.stride(-3), 12);
  EXPECT_EQ(t.numel(), 24);
  EXPECT_TRUE(t.is_contiguous());
  EXPECT_EQ(t.shape_str(), "[2, 3, 4]");
  EXPECT_THROW_MSG(t.size(3), InvalidArgument, "dim");
  EXPECT_THROW_MSG(t.stride(-4), InvalidArgument, "dim");
  EXPECT_EQ((Device{}).str(), "cpu");
  EXPECT_EQ((Device{DeviceType::kCUDA, 0}).str(), "cuda:0");

  TensorView strided(buf, DType::kFloat32, Device{}, {2, 3}, {8, 1});
  EXPECT_FALSE(strided.is_contiguous());
  EXPECT_THROW_MSG(check_contiguous("x", strided), InvalidArgument, "x: expected a contiguous tensor");
  TensorView size1(buf, DType::kFloat32, Device{}, {1, 3}, {99, 1});  // size-1 stride is irrelevant
  EXPECT_TRUE(size1.is_contiguous());
  EXPECT_THROW_MSG(TensorView(buf, DType::kFloat32, Device{}, {2, 3}, {1}), InvalidArgument, "strides");
  EXPECT_THROW_MSG(TensorView(buf, DType::kFloat32, Device{}, {2, -3}), InvalidArgument, "shape");

  EXPECT_THROW_MSG(check_dim("q", t, 2), InvalidArgument, "q: expected a 2-D tensor, got 3-D");
  EXPECT_NO_THROW(check_shape("q", t, {2, -1, 4}));
  EXPECT_THROW_MSG(check_shape("q", t, {2, 3, 5}), InvalidArgument, "q: expected shape [2, 3, 5], got [2, 3, 4]");
  EXPECT_THROW_MSG(check_dtype("q", t, DType::kFloat16), TypeMismatch, "q: expected dtype float16, got float32");
  EXPECT_THROW_MSG(check_dtype_in("q", t, {DType::kFloat16, DType::kBFloat16}), TypeMismatch, "q: expected dtype");
  EXPECT_NO_THROW(check_dtype_in("q", t, {DType::kFloat16, DType::kFloat32}));
  const Device gpu{DeviceType::kCUDA, 0};
  EXPECT_THROW_MSG(check_device("q", t, gpu), TypeMismatch, "q: expected device cuda:0, got cpu");
  TensorView on_gpu(buf, DType::kFloat32, gpu, {2});
  EXPECT_THROW_MSG(check_same_device("q", t, "k", on_gpu), TypeMismatch, "k: expected the same device as q");

  TensorView last_strided(buf, DType::kFloat32, Device{}, {3, 4}, {8, 2});
  EXPECT_THROW_MSG(check_last_dim_contiguous("k", last_strided), InvalidArgument, "k: expected stride 1");
  EXPECT_NO_THROW(check_last_dim_contiguous("k", strided, 8));
  EXPECT_THROW_MSG(check_last_dim_contiguous("k", t, 8), InvalidArgument, "multiple of 8");
}

// ---------------------------------------------------------------------------
// Ragged

TEST(Ragged, ValidateIndptr) {
  EXPECT_NO_THROW(validate_indptr("indptr", std::vector<int32_t>{0, 2, 2, 5}, 5));
  EXPECT_THROW_MSG(validate_indptr("qo_indptr", std::vector<int32_t>{}), InvalidArgument, "qo_indptr");
  EXPECT_THROW_MSG(validate_indptr("qo_indptr", std::vector<int32_t>{1, 2}), InvalidArgument, "qo_indptr[0]");
  EXPECT_THROW_MSG(validate_indptr("indptr", std::vector<int32_t>{0, 1, 3, 5, 2}), InvalidArgument,
                   "indptr: expected non-decreasing values, got indptr[3]=5 > indptr[4]=2");
  EXPECT_THROW_MSG(validate_indptr("kv_indptr", std::vector<int32_t>{0, 2, 4}, 5), InvalidArgument,
                   "kv_indptr: expected last value == 5");
}

TEST(Ragged, IndexAndFromLengths) {
  RaggedIndex r({0, 3, 3, 7});
  EXPECT_EQ(r.num_sequences(), 3);
  EXPECT_EQ(r.total(), 7);
  EXPECT_EQ(r.begin(2), 3);
  EXPECT_EQ(r.length(1), 0);
  const std::vector<int32_t> lens{2, 0, 5};
  RaggedIndex f = RaggedIndex::from_lengths(lens);
  EXPECT_EQ(std::vector<int32_t>(f.indptr().begin(), f.indptr().end()), (std::vector<int32_t>{0, 2, 2, 7}));
  EXPECT_EQ(RaggedIndex().num_sequences(), 0);
  const std::vector<int32_t> bad{1, -1};
  EXPECT_THROW_MSG(RaggedIndex::from_lengths(bad), InvalidArgument, "lengths[1]=-1");
  EXPECT_THROW_MSG(RaggedIndex({0, 2}, 3, "qo_indptr"), InvalidArgument, "qo_indptr");
}

// ---------------------------------------------------------------------------
// Page table

TEST(PageTable, LengthsAndAddressing) {
  // Request 0: pages {4, 1}, last 2 -> 6 tokens; request 1: no pages; request 2: page {0}, full.
  PageTable t({0, 2, 2, 3}, {4, 1, 0}, {2, 0, 4}, 4, 5);
  EXPECT_EQ(t.num_requests(), 3);
  EXPECT_EQ(t.kv_len(0), 6);
  EXPECT_EQ(t.kv_len(1), 0);
  EXPECT_EQ(t.kv_len(2), 4);
  EXPECT_EQ(t.page_of(0, 5), 1);
  EXPECT_EQ(t.slot_of(5), 1);
  EXPECT_EQ(t.page_of(0, 3), 4);
  EXPECT_THROW_MSG(t.kv_len(3), InvalidArgument, "req");
  EXPECT_NO_THROW(PageTable({0, 0}, {}, {4}, 4, 0));  // empty request may pass page_size
}

// plan()'s one-pass check: lengths and the largest page id, over more ids
// than one vector lane holds (the negative id sits past the vectorized part).
TEST(PageTable, CheckReturnsLengthsAndLargestId) {
  std::vector<int32_t> indptr{0, 3, 3, 21}, indices(21), last{2, 0, 4}, lens;
  for (int i = 0; i < 21; ++i) indices[i] = (i * 7) % 23;
  const int32_t expect_max = *std::max_element(indices.begin(), indices.end());
  EXPECT_EQ(check_page_table(indptr, indices, last, 4, lens), expect_max);
  EXPECT_EQ(lens, (std::vector<int32_t>{2 * 4 + 2, 0, 17 * 4 + 4}));
  indices[19] = -3;
  EXPECT_THROW_MSG(check_page_table(indptr, indices, last, 4, lens), InvalidArgument, "indices[19]=-3");
  EXPECT_EQ(check_page_table(std::vector<int32_t>{0, 0}, {}, std::vector<int32_t>{0}, 4, lens), -1);
}

TEST(PageTable, RejectsBadInput) {
  EXPECT_THROW_MSG(PageTable({0, 1}, {0}, {1}, 0, 1), InvalidArgument, "page_size");
  EXPECT_THROW_MSG(PageTable({0, 2, 1}, {0, 1}, {1, 1}, 4, 2), InvalidArgument, "indptr");
  EXPECT_THROW_MSG(PageTable({1, 2}, {0, 1}, {1}, 4, 2), InvalidArgument, "indptr");
  EXPECT_THROW_MSG(PageTable({0, 2}, {0}, {1}, 4, 2), InvalidArgument, "indices: expected 2 entries");
  EXPECT_THROW_MSG(PageTable({0, 2}, {0, 2}, {1}, 4, 2), InvalidArgument, "indices[1]=2");
  EXPECT_THROW_MSG(PageTable({0, 2}, {0, -1}, {1}, 4, 2), InvalidArgument, "indices");
  EXPECT_THROW_MSG(PageTable({0, 1}, {0}, {1, 1}, 4, 2), InvalidArgument, "last_page_len: expected 1 entries");
  EXPECT_THROW_MSG(PageTable({0, 1}, {0}, {0}, 4, 2), InvalidArgument, "last_page_len[0]=0");
  EXPECT_THROW_MSG(PageTable({0, 1}, {0}, {5}, 4, 2), InvalidArgument, "last_page_len");
  EXPECT_THROW_MSG(PageTable({0, 0}, {}, {-1}, 4, 2), InvalidArgument, "last_page_len");
  EXPECT_THROW_MSG(PageTable({0, 0}, {}, {5}, 4, 2), InvalidArgument, "last_page_len");
  EXPECT_THROW_MSG(PageTable({0}, {}, {}, 4, -1), InvalidArgument, "num_pages");
}

TEST(KVLayout, ParseAndName) {
  EXPECT_EQ(parse_kv_layout("NHD"), KVLayout::kNHD);
  EXPECT_EQ(parse_kv_layout("HND"), KVLayout::kHND);
  EXPECT_STREQ(kv_layout_name(KVLayout::kHND), "HND");
  EXPECT_THROW_MSG(parse_kv_layout("nhd"), InvalidArgument, "kv_layout");
}

// ---------------------------------------------------------------------------
// Paged storage

TEST(PagedKVStorage, SeparateNHDAndHNDStrides) {
  HostTensor k = make_host(DType::kFloat16, {5, 16, 2, 64});
  HostTensor v = make_host(DType::kFloat16, {5, 16, 2, 64});
  PagedKVStorage nhd(k.view, v.view, KVLayout::kNHD);
  EXPECT_EQ(nhd.num_pages(), 5);
  EXPECT_EQ(nhd.page_size(), 16);
  EXPECT_EQ(nhd.num_kv_heads(), 2);
  EXPECT_EQ(nhd.head_dim(), 64);
  EXPECT_EQ(nhd.page_stride(), 16 * 2 * 64);
  EXPECT_EQ(nhd.token_stride(), 2 * 64);
  EXPECT_EQ(nhd.head_stride(), 64);
  EXPECT_EQ(nhd.offset(3, 1, 5), 3 * 2048 + 64 + 5 * 128);
  EXPECT_EQ(nhd.v().data, v.view.data);

  PagedKVStorage hnd(k.view, v.view, KVLayout::kHND);  // same shape read as [P, H=16, ps=2, D]
  EXPECT_EQ(hnd.page_size(), 2);
  EXPECT_EQ(hnd.num_kv_heads(), 16);
  EXPECT_EQ(hnd.head_stride(), 2 * 64);
  EXPECT_EQ(hnd.token_stride(), 64);
}

TEST(PagedKVStorage, InterleavedAndStridedPages) {
  HostTensor kv = make_host(DType::kBFloat16, {3, 2, 4, 2, 128});
  PagedKVStorage s(kv.view, KVLayout::kNHD);
  EXPECT_EQ(s.page_stride(), 2 * 4 * 2 * 128);
  EXPECT_EQ(s.token_stride(), 2 * 128);
  EXPECT_EQ(s.head_stride(), 128);
  EXPECT_EQ(s.k().data, kv.view.data);
  EXPECT_EQ(static_cast<char*>(s.v().data) - static_cast<char*>(s.k().data), 4 * 2 * 128 * 2);
  EXPECT_EQ(s.k().dim(), 4);
  EXPECT_EQ(s.dtype(), DType::kBFloat16);

  // Pages that are a strided slice of a bigger buffer: the real strides win.
  HostTensor big = test::make_host_strided(DType::kFloat16, {3, 4, 1, 64}, {1000, 64, 64, 1});
  PagedKVStorage strided(big.view, big.view, KVLayout::kNHD);
  EXPECT_EQ(strided.page_stride(), 1000);
  EXPECT_EQ(strided.token_stride(), 64);
}

TEST(PagedKVStorage, RejectsBadInput) {
  HostTensor k = make_host(DType::kFloat16, {2, 4, 2, 64});
  HostTensor f32 = make_host(DType::kFloat32, {2, 4, 2, 64});
  HostTensor bf = make_host(DType::kBFloat16, {2, 4, 2, 64});
  HostTensor other = make_host(DType::kFloat16, {2, 4, 1, 64});
  HostTensor d96 = make_host(DType::kFloat16, {2, 4, 2, 96});
  HostTensor three_d = make_host(DType::kFloat16, {2, 4, 64});
  EXPECT_THROW_MSG(PagedKVStorage(f32.view, f32.view, KVLayout::kNHD), TypeMismatch, "k: expected dtype");
  EXPECT_THROW_MSG(PagedKVStorage(k.view, bf.view, KVLayout::kNHD), TypeMismatch, "v");
  EXPECT_THROW_MSG(PagedKVStorage(k.view, other.view, KVLayout::kNHD), InvalidArgument, "v: expected the shape");
  EXPECT_THROW_MSG(PagedKVStorage(d96.view, d96.view, KVLayout::kNHD), InvalidArgument, "head_dim");
  EXPECT_THROW_MSG(PagedKVStorage(three_d.view, three_d.view, KVLayout::kNHD), InvalidArgument, "k: expected a 4-D");
  TensorView on_gpu = k.view;
  on_gpu.device = Device{DeviceType::kCUDA, 0};
  EXPECT_THROW_MSG(PagedKVStorage(k.view, on_gpu, KVLayout::kNHD), TypeMismatch, "v: expected the same device");
  TensorView v_strided = k.view;
  v_strided.strides = {1024, 128, 64, 1};
  EXPECT_THROW_MSG(PagedKVStorage(k.view, v_strided, KVLayout::kNHD), InvalidArgument, "v: expected the strides");
  TensorView last_strided(k.view.data, DType::kFloat16, Device{}, {2, 2, 2, 64}, {512, 256, 128, 2});
  EXPECT_THROW_MSG(PagedKVStorage(last_strided, last_strided, KVLayout::kNHD), InvalidArgument, "k: expected stride 1");
  HostTensor three = make_host(DType::kFloat16, {2, 3, 4, 2, 64});
  EXPECT_THROW_MSG(PagedKVStorage(three.view, KVLayout::kHND), InvalidArgument, "kv: expected size 2 in dim 1");
  EXPECT_THROW_MSG(PagedKVStorage(k.view, KVLayout::kHND), InvalidArgument, "kv: expected a 5-D");
  HostTensor zero_ps = make_host(DType::kFloat16, {2, 0, 2, 64});
  EXPECT_THROW_MSG(PagedKVStorage(zero_ps.view, zero_ps.view, KVLayout::kNHD), InvalidArgument, "page_size");
}

TEST(PagedKVCache, ChecksTableAgainstStorageAndFillsDeviceView) {
  HostTensor kv = make_host(DType::kFloat16, {4, 2, 2, 8, 64});  // HND: H=2, page_size=8
  PagedKVStorage s(kv.view, KVLayout::kHND);
  PageTable t({0, 1, 3}, {3, 0, 2}, {5, 8}, 8, 4);
  PagedKVCache cache(s, t);
  const int32_t ip[3] = {0}, ix[3] = {0}, lp[2] = {0};
  device::PagedKV view = cache.device_view(ip, ix, lp);
  EXPECT_EQ(view.k, kv.view.data);
  EXPECT_EQ(static_cast<const char*>(view.v) - static_cast<const char*>(view.k), 2 * 8 * 64 * 2);
  EXPECT_EQ(view.indptr, ip);
  EXPECT_EQ(view.indices, ix);
  EXPECT_EQ(view.last_page_len, lp);
  EXPECT_EQ(view.page_stride, 2 * 2 * 8 * 64);
  EXPECT_EQ(view.head_stride, 8 * 64);
  EXPECT_EQ(view.token_stride, 64);
  EXPECT_EQ(view.page_size, 8);
  EXPECT_EQ(view.num_kv_heads, 2);

  EXPECT_THROW_MSG(PagedKVCache(s, PageTable({0, 1}, {0}, {1}, 4, 4)), InvalidArgument, "table: expected page_size 8");
  EXPECT_THROW_MSG(PagedKVCache(s, PageTable({0, 1}, {4}, {1}, 8, 5)), InvalidArgument, "table: expected num_pages");
}

// ---------------------------------------------------------------------------
// BSR

TEST(BSR, AccessorsAndRowLengths) {
  BSRMatrix m(8, 12, 4, 4, {0, 2, 3}, {2, 0, 1}, {3, 4});
  EXPECT_EQ(m.num_block_rows(), 2);
  EXPECT_EQ(m.num_block_cols(), 3);
  EXPECT_EQ(m.nnz_blocks(), 3);
  EXPECT_EQ(m.row_kv_len(0), 7);
  EXPECT_EQ(m.row_kv_len(1), 4);
  BSRMatrix full(2, 4, 1, 2, {0, 2, 2}, {1, 0});
  EXPECT_EQ(full.row_kv_len(0), 4);
  EXPECT_EQ(full.row_kv_len(1), 0);
  EXPECT_FALSE(full.has_last_block_len());
  EXPECT_THROW_MSG(full.row_kv_len(2), InvalidArgument, "r");
}

TEST(BSR, RejectsBadInput) {
  EXPECT_THROW_MSG(BSRMatrix(4, 4, 0, 1, {0}, {}), InvalidArgument, "Br");
  EXPECT_THROW_MSG(BSRMatrix(4, 4, 1, 0, {0}, {}), InvalidArgument, "Bc");
  EXPECT_THROW_MSG(BSRMatrix(5, 4, 2, 1, {0, 0, 0}, {}), InvalidArgument, "M: expected");
  EXPECT_THROW_MSG(BSRMatrix(4, 5, 1, 2, {0, 0, 0, 0, 0}, {}), InvalidArgument, "N: expected");
  EXPECT_THROW_MSG(BSRMatrix(4, 4, 2, 2, {0, 1}, {0}), InvalidArgument, "indptr: expected 3 entries");
  EXPECT_THROW_MSG(BSRMatrix(4, 4, 2, 2, {0, 2, 1}, {0, 1}), InvalidArgument, "indptr: expected non-decreasing");
  EXPECT_THROW_MSG(BSRMatrix(4, 4, 2, 2, {0, 1, 2}, {0}), InvalidArgument, "indices: expected 2 entries");
  EXPECT_THROW_MSG(BSRMatrix(4, 4, 2, 2, {0, 1, 2}, {0, 2}), InvalidArgument, "indices[1]=2");
  EXPECT_THROW_MSG(BSRMatrix(4, 4, 2, 2, {0, 1, 2}, {0, 1}, {1}), InvalidArgument, "last_block_len: expected 2");
  EXPECT_THROW_MSG(BSRMatrix(4, 4, 2, 2, {0, 1, 2}, {0, 1}, {1, 3}), InvalidArgument, "last_block_len[1]=3");
  EXPECT_THROW_MSG(BSRMatrix(4, 4, 2, 2, {0, 1, 2}, {0, 1}, {0, 1}), InvalidArgument, "last_block_len[0]=0");
  EXPECT_NO_THROW(BSRMatrix(4, 4, 2, 2, {0, 0, 2}, {0, 1}, {0, 1}));
}

TEST(BSR, PageTableToBSR) {
  PageTable t({0, 2, 2, 3}, {4, 1, 0}, {2, 0, 3}, 4, 5);
  RaggedIndex qo({0, 2, 3, 3});  // request 0: 2 queries, 1: 1 query, 2: none
  BSRMatrix m = page_table_to_bsr(t, qo);
  EXPECT_EQ(m.rows(), 3);
  EXPECT_EQ(m.cols(), 20);
  EXPECT_EQ(m.block_rows(), 1);
  EXPECT_EQ(m.block_cols(), 4);
  EXPECT_EQ(std::vector<int32_t>(m.indptr().begin(), m.indptr().end()), (std::vector<int32_t>{0, 2, 4, 4}));
  EXPECT_EQ(std::vector<int32_t>(m.indices().begin(), m.indices().end()), (std::vector<int32_t>{4, 1, 4, 1}));
  EXPECT_EQ(std::vector<int32_t>(m.last_block_len().begin(), m.last_block_len().end()),
            (std::vector<int32_t>{2, 2, 0}));
  EXPECT_EQ(m.row_kv_len(0), t.kv_len(0));
  EXPECT_EQ(m.row_kv_len(2), 0);
  EXPECT_THROW_MSG(page_table_to_bsr(t, RaggedIndex({0, 1})), InvalidArgument, "qo: expected 3 sequences");
}

}  // namespace
}  // namespace tessera
