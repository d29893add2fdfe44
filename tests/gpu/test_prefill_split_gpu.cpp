// Split tiles on both prefill templates: few query tiles over long contexts,
// so the plan cuts each tile into chunks, merged in slices by the chunks'
// CTAs (common/cooperative_merge.cuh): many chunks a tile, and (fixed
// chunks) every split tile cut in two. Against the reference, and bitwise
// across repeats: the bits must not depend on which CTA merged a slice.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <tuple>
#include <vector>

#include "decode_util.hpp"
#include "prefill_util.hpp"

using namespace tessera;
using namespace tessera::test;

namespace {

// dtype, head dim, query tile, causal, backend (kAuto: the Hopper kernel on sm_90).
class PrefillSplitTiles : public ::testing::TestWithParam<std::tuple<DType, int, int, bool, PrefillBackend>> {};

// Plans with fixed_chunk keys a chunk (0: the planner's choice), checks the
// chunk counts with expect_chunks(counts of the split tiles), runs against
// the reference and repeats bitwise.
template <typename ExpectChunks>
void check_split_tiles(const std::tuple<DType, int, int, bool, PrefillBackend>& param, int fixed_chunk,
                       ExpectChunks expect_chunks) {
  const auto [dt, D, cta_q, causal, backend] = param;
  const int64_t Hkv = 2, Hq = 8;
  const int page_size = 16;
  std::mt19937_64 rng(D + cta_q + causal * 7);
  // Requests: few queries over long contexts, one key, no queries.
  const std::vector<int32_t> q_lens = {3, 70, 1, 0}, kv_lens = {5003, 3001, 1, 40};
  const Table table = make_table(kv_lens, page_size, pages_needed(kv_lens, page_size) + 3, rng);
  std::vector<int32_t> qo = {0};
  for (int32_t n : q_lens) qo.push_back(qo.back() + n);
  const int64_t rows = qo.back();
  const PagedInputs in(dt, Hkv, Hq, D, page_size, table.num_pages, qo, table.indptr, table.indices, table.last, causal,
                       rng);

  const AttentionSpec spec{causal ? variants::causal() : variants::standard(), dt, dt, dt, D};
  TaskInfo task{static_cast<int>(Hq), static_cast<int>(Hkv), page_size, KVLayout::kNHD, 8, table.num_pages};
  task.max_total_q = 256;
  PrefillOptions opt;
  opt.cta_q = cta_q;
  opt.backend = backend;
  opt.planner.fixed_chunk = fixed_chunk;
  Workspace ws = prefill_workspace(spec, task, opt);
  BatchPrefill pre(spec, task, ws, opt);
  pre.plan_paged(qo, table.indptr, table.indices, table.last);
  std::vector<int> split_chunks;
  for (const PrefillWorkItem& w : pre.last_plan().items)
    if (w.num_chunks > 1) split_chunks.push_back(w.num_chunks);
  expect_chunks(split_chunks);
  auto dk = to_device(in.k), dv = to_device(in.v), dq = to_device(in.q);
  const PagedKVStorage kv(dk.view, dv.view, KVLayout::kNHD);
  auto run = [&](const TensorView& o, const TensorView& lse) { pre.run(dq.view, kv, o, lse); };
  Out a = run_and_fetch(run, dt, rows, Hq, D);
  EXPECT_CLOSE(compare(to_doubles(a.o.view), in.ref.o), dt);
  EXPECT_CLOSE(compare(to_doubles(a.lse.view), in.ref.lse), DType::kFloat16);
  for (int i = 0; i < 3; ++i) {
    Out c = run_and_fetch(run, dt, rows, Hq, D);
    EXPECT_TRUE(bitwise_equal(a.o, c.o));
    EXPECT_TRUE(bitwise_equal(a.lse, c.lse));
  }
}

TEST_P(PrefillSplitTiles, ManyChunksMatchReferenceAndRepeat) {
  SKIP_WITHOUT_GPU();
  check_split_tiles(GetParam(), 0, [](const std::vector<int>& chunks) {
    EXPECT_GE(chunks.empty() ? 0 : *std::max_element(chunks.begin(), chunks.end()), 3)
        << "the plan should cut a tile into at least three chunks";
  });
}

// Chunks of at most 2560 keys cut the 3001- and 5003-key requests' tiles
// (and the causal ones' visible prefixes) in exactly two.
TEST_P(PrefillSplitTiles, TilesCutInTwoMatchReferenceAndRepeat) {
  SKIP_WITHOUT_GPU();
  check_split_tiles(GetParam(), 2560, [](const std::vector<int>& chunks) {
    EXPECT_FALSE(chunks.empty()) << "the plan should split the long requests' tiles";
    for (int n : chunks) EXPECT_EQ(n, 2) << "every split tile should be cut in two";
  });
}

INSTANTIATE_TEST_SUITE_P(
    All, PrefillSplitTiles,
    ::testing::Values(std::tuple{DType::kFloat16, 128, 64, false, PrefillBackend::kAuto},
                      std::tuple{DType::kBFloat16, 128, 128, true, PrefillBackend::kAuto},
                      std::tuple{DType::kFloat16, 64, 64, true, PrefillBackend::kAuto},
                      std::tuple{DType::kFloat16, 256, 64, false, PrefillBackend::kAuto},
                      std::tuple{DType::kFloat16, 128, 16, false, PrefillBackend::kFA2},
                      std::tuple{DType::kBFloat16, 128, 64, true, PrefillBackend::kFA2},
                      std::tuple{DType::kFloat16, 128, 128, false, PrefillBackend::kFA2},
                      std::tuple{DType::kFloat16, 64, 16, true, PrefillBackend::kFA2}));

}  // namespace
