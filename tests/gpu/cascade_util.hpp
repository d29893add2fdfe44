// A step of composable levels over one shuffled page pool, for the cascade
// and shared-prefix GPU tests: per level, groups of consecutive requests and
// their tokens; the flat K / V of each request for the CPU reference.
#pragma once
#include <algorithm>
#include <cstring>
#include <numeric>
#include <random>
#include <utility>
#include <vector>

#include "gpu_util.hpp"
#include "tessera/api/cascade.hpp"
#include "tessera/reference/attention.hpp"

namespace tessera::test {

// One step: per level, groups of consecutive requests and their token counts.
struct CascadeStep {
  std::vector<int32_t> q_len;
  // groups[l]: request count per group of level l (summing to the batch);
  // tokens[l]: tokens of each group at level l.
  std::vector<std::vector<int32_t>> groups, tokens;
};

struct LevelArrays {
  std::vector<int32_t> qo{0}, kv{0}, indices, last;
};

struct CascadeProblem {
  std::vector<LevelArrays> levels;
  std::vector<int32_t> qo{0}, kv_tokens{0};  // flat: per request, all its levels' tokens
  HostTensor k, v, q, flat_k, flat_v;
  int64_t pool = 0;
  std::vector<std::vector<std::pair<std::vector<int32_t>, int32_t>>> runs;  // per request: (pages, tokens) per level

  CascadeProblem(const CascadeStep& s, DType dt, int D, int64_t Hkv, int64_t Hq, int P, std::mt19937_64& rng) {
    const size_t L = s.groups.size(), n = s.q_len.size();
    for (size_t l = 0; l < L; ++l)
      for (int32_t t : s.tokens[l]) pool += (t + P - 1) / P;
    pool += 2;
    std::vector<int32_t> perm(pool);
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng);
    k = make_host(dt, {pool, P, Hkv, D});
    v = k;
    fill_random(k, rng());
    fill_random(v, rng());
    for (int32_t x : s.q_len) qo.push_back(qo.back() + x);
    q = make_host(dt, {qo.back(), Hq, D});
    fill_random(q, rng(), -2.f, 2.f);
    // Per level, per group: its pages; per request, its (pages, tokens) runs.
    runs.assign(n, {});
    int next = 0;
    for (size_t l = 0; l < L; ++l) {
      LevelArrays a;
      size_t r = 0;
      for (size_t g = 0; g < s.groups[l].size(); ++g) {
        const int32_t t = s.tokens[l][g], pages = (t + P - 1) / P;
        std::vector<int32_t> ids(perm.begin() + next, perm.begin() + next + pages);
        next += pages;
        int32_t rows = 0;
        for (int32_t i = 0; i < s.groups[l][g]; ++i, ++r) {
          rows += s.q_len[r];
          runs[r].push_back({ids, t});
        }
        a.qo.push_back(a.qo.back() + rows);
        a.indices.insert(a.indices.end(), ids.begin(), ids.end());
        a.kv.push_back(static_cast<int32_t>(a.indices.size()));
        a.last.push_back(pages ? t - (pages - 1) * P : 0);
      }
      levels.push_back(std::move(a));
    }
    // The flat KV: each request's tokens of every level, in level order.
    for (const auto& rr : runs) {
      int32_t t = 0;
      for (const auto& run : rr) t += run.second;
      kv_tokens.push_back(kv_tokens.back() + t);
    }
    flat_k = make_host(dt, {std::max<int64_t>(kv_tokens.back(), 1), Hkv, D});
    flat_v = flat_k;
    const size_t token_bytes = static_cast<size_t>(Hkv * D) * dtype_size(dt);
    size_t at = 0;
    for (const auto& rr : runs)
      for (const auto& [ids, t] : rr)
        for (int32_t j = 0; j < t; ++j, at += token_bytes) {
          const size_t src = (static_cast<size_t>(ids[j / P]) * P + j % P) * token_bytes;
          std::memcpy(flat_k.storage.data() + at, k.storage.data() + src, token_bytes);
          std::memcpy(flat_v.storage.data() + at, v.storage.data() + src, token_bytes);
        }
  }

  std::vector<CascadeLevel> plan_input() const {
    std::vector<CascadeLevel> in;
    for (const LevelArrays& a : levels) in.push_back({a.qo, a.kv, a.indices, a.last});
    return in;
  }

  // The flat page table of the step: each request's pages of every level in
  // order. Only its last page may be partly filled, so every level but the
  // last needs whole pages (tokens a multiple of the page size).
  LevelArrays flat_table(int P) const {
    LevelArrays a;
    for (const auto& rr : runs) {
      int32_t last = 0;
      for (const auto& [ids, t] : rr) {
        a.indices.insert(a.indices.end(), ids.begin(), ids.end());
        if (!ids.empty()) last = t - (static_cast<int32_t>(ids.size()) - 1) * P;
      }
      a.kv.push_back(static_cast<int32_t>(a.indices.size()));
      a.last.push_back(last);
    }
    a.qo = qo;
    return a;
  }

  reference::Result reference(bool causal) const {
    reference::Options ro;
    ro.causal = causal;
    return reference::attention_ragged(q.view, RaggedIndex(qo), flat_k.view, flat_v.view, RaggedIndex(kv_tokens), ro);
  }
};

}  // namespace tessera::test
