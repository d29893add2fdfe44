// Custom masks without a GPU: the packed format (little bit order, one byte
// boundary per request, as numpy packbits(bitorder="little") of each
// request's flattened mask), mask_indptr validation, and BatchPrefill's
// checks that a mask comes exactly where the custom_mask variant is used, all
// raised before any GPU work.
#include <gtest/gtest.h>

#include <random>

#include "tessera/api/decode.hpp"
#include "tessera/api/prefill.hpp"
#include "tessera/formats/custom_mask.hpp"
#include "tessera/reference/attention.hpp"
#include "fake_workspace.hpp"
#include "test_util.hpp"

using namespace tessera;
using namespace tessera::test;

namespace {

TaskInfo task() {
  TaskInfo t{8, 2, 16, KVLayout::kNHD, 4, 16};
  t.max_total_q = 64;
  return t;
}

AttentionSpec mask_spec(DType t = DType::kFloat16, int d = 128) { return {variants::custom_mask(), t, t, t, d}; }

TEST(CustomMask, LittleBitOrderPerRequest) {
  // numpy.packbits([1,0,1,1,0,0,1,1], bitorder="little") == [0xCD]; the second
  // request (2 x 5 = 10 bits) starts on a fresh byte: [0x03, 0x02].
  const std::vector<uint8_t> mask = {1, 0, 1, 1, 0, 0, 1, 1,  // request 0: 2 queries x 4 keys
                                     1, 1, 0, 0, 0,           // request 1: 2 queries x 5 keys
                                     0, 0, 0, 0, 1};
  const std::vector<int32_t> qo = {2, 2}, kv = {4, 5};
  const PackedMask p = pack_custom_mask(mask, qo, kv);
  EXPECT_EQ(p.indptr, (std::vector<int32_t>{0, 1, 3}));
  EXPECT_EQ(p.bits, (std::vector<uint8_t>{0xCD, 0x03, 0x02}));
  EXPECT_EQ(unpack_custom_mask(p.bits, p.indptr, qo, kv), mask);
}

TEST(CustomMask, RoundTripRandomLengths) {
  std::mt19937_64 rng(7);
  std::vector<int32_t> qo, kv;
  for (int b = 0; b < 12; ++b) {
    qo.push_back(static_cast<int32_t>(rng() % 9));  // includes 0 queries / 0 keys and odd bit counts
    kv.push_back(static_cast<int32_t>(rng() % 23));
  }
  std::vector<uint8_t> mask;
  for (size_t b = 0; b < qo.size(); ++b)
    for (int64_t i = 0; i < int64_t{qo[b]} * kv[b]; ++i) mask.push_back(static_cast<uint8_t>(rng() % 3 == 0 ? 0 : 1 + rng() % 5));
  const PackedMask p = pack_custom_mask(mask, qo, kv);
  EXPECT_EQ(p.indptr, mask_indptr_for(qo, kv));
  EXPECT_NO_THROW(validate_mask_indptr(p.indptr, qo, kv));
  // Bit (q, k) of request b: byte indptr[b] + (q * kv_len + k) / 8, bit (q * kv_len + k) % 8.
  size_t src = 0;
  for (size_t b = 0; b < qo.size(); ++b) {
    EXPECT_EQ(p.indptr[b + 1] - p.indptr[b], (int64_t{qo[b]} * kv[b] + 7) / 8);
    for (int q = 0; q < qo[b]; ++q)
      for (int k = 0; k < kv[b]; ++k, ++src) {
        const int64_t i = int64_t{q} * kv[b] + k;
        EXPECT_EQ((p.bits[p.indptr[b] + i / 8] >> (i % 8)) & 1, mask[src] != 0) << b << " " << q << " " << k;
      }
  }
  const std::vector<uint8_t> back = unpack_custom_mask(p.bits, p.indptr, qo, kv);
  ASSERT_EQ(back.size(), mask.size());
  for (size_t i = 0; i < mask.size(); ++i) EXPECT_EQ(back[i], mask[i] != 0 ? 1 : 0);
}

TEST(CustomMask, IndptrValidation) {
  const std::vector<int32_t> qo = {3, 0, 2}, kv = {5, 4, 4};  // 15 bits -> 2 bytes, 0, 8 bits -> 1 byte
  EXPECT_NO_THROW(validate_mask_indptr(std::vector<int32_t>{0, 2, 2, 3}, qo, kv));
  EXPECT_THROW_MSG(validate_mask_indptr(std::vector<int32_t>{0, 2, 2}, qo, kv), InvalidArgument, "mask_indptr");
  EXPECT_THROW_MSG(validate_mask_indptr(std::vector<int32_t>{1, 3, 3, 4}, qo, kv), InvalidArgument, "mask_indptr[0]");
  EXPECT_THROW_MSG(validate_mask_indptr(std::vector<int32_t>{0, 2, 1, 3}, qo, kv), InvalidArgument, "non-decreasing");
  EXPECT_THROW_MSG(validate_mask_indptr(std::vector<int32_t>{0, 15, 15, 23}, qo, kv), InvalidArgument,
                   "request 0");  // bit offsets instead of bytes
  EXPECT_THROW_MSG(validate_mask_indptr(std::vector<int32_t>{0, 2, 2, 4}, qo, kv), InvalidArgument, "request 2");
  EXPECT_THROW_MSG(pack_custom_mask(std::vector<uint8_t>(22, 1), qo, kv), InvalidArgument, "custom_mask");
  EXPECT_THROW_MSG(unpack_custom_mask(std::vector<uint8_t>(2, 0), std::vector<int32_t>{0, 2, 2, 3}, qo, kv),
                   InvalidArgument, "packed_custom_mask");
  // int32 offsets: 65536 x 65536 bits is 2^29 bytes; eight such requests reach 2^32.
  const std::vector<int32_t> big(8, 65536);
  EXPECT_THROW_MSG(mask_indptr_for(big, big), InvalidArgument, "mask_indptr");
}

TEST(CustomMask, ReferenceAppliesUnpackedMask) {
  // A row that sees no key is O = 0, LSE = -inf; the mask round-trips through packing.
  const DType dt = DType::kFloat32;
  HostTensor q = make_host(dt, {3, 2, 64}), k = make_host(dt, {5, 1, 64}), v = k;
  fill_random(q, 1);
  fill_random(k, 2);
  fill_random(v, 3);
  const std::vector<int32_t> qo = {3}, kv = {5};
  const std::vector<uint8_t> mask = {1, 0, 1, 0, 1, /**/ 0, 0, 0, 0, 0, /**/ 1, 1, 1, 1, 1};
  const PackedMask p = pack_custom_mask(mask, qo, kv);
  reference::Options opt;
  opt.custom_mask = unpack_custom_mask(p.bits, p.indptr, qo, kv);
  const auto r = reference::attention_ragged(q.view, RaggedIndex({0, 3}), k.view, v.view, RaggedIndex({0, 5}), opt);
  for (int h = 0; h < 2; ++h) {
    EXPECT_EQ(r.lse_at(1, h), -INFINITY);
    for (int d = 0; d < 64; ++d) EXPECT_EQ(r.at(1, h, d), 0.0);
    EXPECT_TRUE(std::isfinite(r.lse_at(0, h)) && std::isfinite(r.lse_at(2, h)));
  }
  reference::Options full;  // row 2 sees every key: as without a mask
  const auto all = reference::attention_ragged(q.view, RaggedIndex({0, 3}), k.view, v.view, RaggedIndex({0, 5}), full);
  EXPECT_NEAR(r.lse_at(2, 1), all.lse_at(2, 1), 1e-12);
}

TEST(CustomMask, PlanNeedsMaskExactlyForTheMaskVariant) {
  FakeWorkspace f;
  const std::vector<int32_t> qo = {0, 3, 5}, kv_tok = {0, 5, 9}, mask_ip = {0, 2, 3};
  const std::vector<int32_t> kvp = {0, 1, 2}, idx = {0, 1}, last = {5, 4};
  BatchPrefill plain({}, task(), f.ws);
  EXPECT_THROW_MSG(plain.plan_ragged(qo, kv_tok, mask_ip), InvalidArgument, "mask_indptr: given");
  EXPECT_THROW_MSG(plain.plan_paged(qo, kvp, idx, last, mask_ip), InvalidArgument, "variants::custom_mask()");
  BatchPrefill masked(mask_spec(), task(), f.ws);
  EXPECT_TRUE(masked.uses_custom_mask());
  EXPECT_FALSE(plain.uses_custom_mask());
  EXPECT_THROW_MSG(masked.plan_ragged(qo, kv_tok), InvalidArgument, "mask_indptr");
  EXPECT_THROW_MSG(masked.plan_paged(qo, kvp, idx, last), InvalidArgument, "mask_indptr");
  EXPECT_THROW_MSG(masked.plan_bsr(BSRMatrix(32, 64, 16, 16, {0, 1, 2}, {0, 1})), InvalidArgument, "bsr");
  // Bad mask_indptr is caught before the kernel is loaded (no GPU here).
  const std::vector<int32_t> short_ip = {0, 2}, bits_ip = {0, 15, 23}, off_ip = {1, 3, 4}, down_ip = {0, 2, 1};
  for (const auto* ip : {&short_ip, &bits_ip, &off_ip, &down_ip}) {
    EXPECT_THROW_MSG(masked.plan_ragged(qo, kv_tok, *ip), InvalidArgument, "mask_indptr");
    EXPECT_THROW_MSG(masked.plan_paged(qo, kvp, idx, last, *ip), InvalidArgument, "mask_indptr");
  }
  // Paged lengths come from the page table: request 1 has 2 x 4 = 8 bits = 1 byte.
  const std::vector<int32_t> last_bad = {5, 12};  // 2 x 12 = 24 bits = 3 bytes, not 1
  EXPECT_THROW_MSG(masked.plan_paged(qo, kvp, idx, last_bad, mask_ip), InvalidArgument, "request 1");
}

TEST(CustomMask, RunNeedsMaskExactlyForTheMaskVariant) {
  FakeWorkspace f;
  HostTensor q = make_host(DType::kFloat16, {5, 8, 128}), bits = make_host(DType::kUInt8, {3});
  BatchPrefill plain({}, task(), f.ws);
  EXPECT_THROW_MSG(plain.run(q.view, PagedKVStorage(), bits.view, q.view, TensorView()), InvalidArgument,
                   "packed_custom_mask: given");
  EXPECT_THROW_MSG(plain.run_ragged(q.view, q.view, q.view, bits.view, q.view, TensorView()), InvalidArgument,
                   "packed_custom_mask");
  EXPECT_THROW_MSG(plain.run(q.view, PagedKVStorage(), q.view, TensorView()), InvalidArgument, "plan");
  BatchPrefill masked(mask_spec(), task(), f.ws);
  EXPECT_THROW_MSG(masked.run(q.view, PagedKVStorage(), q.view, TensorView()), InvalidArgument, "packed_custom_mask");
  EXPECT_THROW_MSG(masked.run_ragged(q.view, q.view, q.view, q.view, TensorView()), InvalidArgument,
                   "packed_custom_mask");
  EXPECT_THROW_MSG(masked.run(q.view, PagedKVStorage(), bits.view, q.view, TensorView()), InvalidArgument, "plan");
}

TEST(CustomMask, WorkspaceAndPrefillOnly) {
  // The mask_indptr section: the custom-mask wrapper needs a little more.
  const auto plain = BatchPrefill::workspace_size({}, task(), 132);
  const auto masked = BatchPrefill::workspace_size(mask_spec(), task(), 132);
  EXPECT_GT(masked.host_bytes, plain.host_bytes);
  EXPECT_GE(masked.device_bytes, plain.device_bytes);
  // Decode and the row-wise kernel have no mask bits in their parameters.
  EXPECT_THROW_MSG(catalog::batch_decode(mask_spec(), 4), InvalidArgument, "variant");
  EXPECT_THROW_MSG(catalog::attention_rowwise(mask_spec()), InvalidArgument, "variant");
  FakeWorkspace f;
  EXPECT_THROW_MSG(BatchDecode(mask_spec(), task(), f.ws), InvalidArgument, "custom_mask");
  // Every (dtype, head dim, tile, backend) of the variant is a built-in kernel.
  const auto kernels = catalog::builtin_prefill_kernels(variants::custom_mask());
  EXPECT_EQ(kernels.size(), 2u * 3u * 4u + 2u * 3u * 2u);  // FA2: dtypes x head dims x tiles; Hopper: x 2 tiles
  for (const auto& k : kernels)  // the variant reading the mask bits: its header and struct
    EXPECT_NE(k.source.find("#include \"tessera/device/variants/custom_mask.cuh\"\n"), std::string::npos) << k.entry;
  for (const auto& k : kernels)
    EXPECT_NE(k.source.find("using CustomMaskAttention = tessera::variants::CustomMaskAttention;"), std::string::npos)
        << k.entry;
}

}  // namespace
