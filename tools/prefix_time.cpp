// `tessera prefix-time`: host time of shared-prefix detection
// (find_shared_prefixes, formats/shared_prefix.hpp) on serving-sized page
// tables, the cost plan(..., shared_prefix="auto") adds to every step: no
// sharing, n parallel samples per prompt forking at a page boundary, and
// forks mid-page (the partly filled page is each sample's own). The
// decode planner alone on the same lengths is timed beside it for scale.
// Host code only: no GPU needed.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <random>
#include <vector>

#include "commands.hpp"
#include "timing.hpp"
#include "tessera/tessera.hpp"

namespace tessera::tools {
namespace {

struct Table {
  std::vector<int32_t> indptr{0}, indices, last, lens;
};

// `batch` requests of `tokens` keys: groups of `n` samples share the first
// `shared` tokens of their prompt (full pages only are shared; a partly
// filled page at the fork is copied into each sample's own pages), the rest
// is each request's own. Page ids are a shuffled pool.
Table make_table(int batch, int tokens, int n, int shared, int page_size, unsigned seed) {
  Table t;
  const int total_pages = (tokens + page_size - 1) / page_size, shared_pages = shared / page_size;
  std::vector<int32_t> pool(static_cast<size_t>(batch) * total_pages);
  for (size_t i = 0; i < pool.size(); ++i) pool[i] = static_cast<int32_t>(i);
  std::shuffle(pool.begin(), pool.end(), std::mt19937(seed));
  size_t next = 0;
  std::vector<int32_t> prompt;
  for (int b = 0; b < batch; ++b) {
    if (b % n == 0) {  // a new prompt: its shared pages
      prompt.assign(pool.begin() + next, pool.begin() + next + shared_pages);
      next += shared_pages;
    }
    t.indices.insert(t.indices.end(), prompt.begin(), prompt.end());
    for (int p = shared_pages; p < total_pages; ++p) t.indices.push_back(pool[next++]);
    t.indptr.push_back(static_cast<int32_t>(t.indices.size()));
    t.last.push_back(tokens - (total_pages - 1) * page_size);
    t.lens.push_back(tokens);
  }
  return t;
}

}  // namespace

int run_prefix_time(int batch, int tokens, int reps) {
  constexpr int kPage = 16;
  std::printf("shared-prefix detection, host time: %d requests x %d keys, page %d, median of %d (steady state, "
              "buffers reused)\n", batch, tokens, kPage, reps);
  std::printf("%-34s %9s %7s %12s | %12s %14s\n", "table", "page ids", "groups", "saved pages", "detect us",
              "plan_decode us");
  struct Row {
    const char* name;
    int n, shared;
  };
  const int fork = tokens - 256;  // each sample's own 256 keys after the prompt
  const Row rows[] = {{"no sharing", 1, 0},
                      {"4 samples / prompt, page fork", 4, fork / kPage * kPage},
                      {"16 samples / prompt, page fork", 16, fork / kPage * kPage},
                      {"64 samples / prompt, page fork", 64, fork / kPage * kPage},
                      {"16 samples / prompt, mid-page fork", 16, fork / kPage * kPage + kPage / 2}};
  for (const Row& r : rows) {
    const Table t = make_table(batch, tokens, r.n, r.shared, kPage, 7);
    SharedPrefixSplit split;
    std::vector<double> detect, planner;
    Planner pl;
    DecodePlan dplan;
    for (int i = 0; i < reps + 1; ++i) {  // the first call sizes the buffers
      const auto t0 = Clock::now();
      find_shared_prefixes(t.indptr, t.indices, t.last, kPage, {}, {}, split);
      const auto t1 = Clock::now();
      pl.plan_decode(t.lens, 132, {}, dplan);
      const auto t2 = Clock::now();
      if (i == 0) continue;
      detect.push_back(us_since(t0, t1));
      planner.push_back(us_since(t1, t2));
    }
    std::printf("%-34s %9zu %7zu %12lld | %12.1f %14.1f\n", r.name, t.indices.size(), split.groups.size(),
                static_cast<long long>(split.saved_pages), median(detect), median(planner));
  }
  return 0;
}

}  // namespace tessera::tools
