// Prefill softmax: per-thread running state of the rows a thread owns, and
// the per-tile logits / mask / online-softmax step (base 2, paper §3.2.1).
#pragma once
#include "tessera/device/kernels/common/work_queue.cuh"
#include "tessera/device/primitives/attention_state.cuh"
#include "tessera/device/primitives/variant_traits.cuh"

namespace tessera {

#if defined(__CUDACC__) || defined(__CUDACC_RTC__)

// Per-thread softmax state: for each of the warp's MT m-tiles, the thread's
// two rows (g and g + 8 of the m-tile).
template <int MT, int NT_O>
struct PrefillState {
  float m[MT][2], d[MT][2];
  float o[MT][NT_O][4];
  __device__ __forceinline__ void init() {
#pragma unroll
    for (int t = 0; t < MT; ++t) {
      m[t][0] = m[t][1] = neg_inf();
      d[t][0] = d[t][1] = 0.f;
#pragma unroll
      for (int n = 0; n < NT_O; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) o[t][n][e] = 0.f;
    }
  }
};

// The rows this thread owns, resolved once per work item.
template <int MT>
struct RowInfo {
  int qo_idx[MT][2];  // position within the request
  int head[MT][2];    // query head
  bool valid[MT][2];
};

// Variant logits, masks and the online-softmax update of one S tile held in
// mma-layout fragments (s[MT][NT_S][4], columns from col0), shared by the
// FA2 and Hopper templates. Leaves P (unnormalized weights) in s and updates
// the row maxima m and sums d, but not O: O's rescale factors go to `scale`
// and the return value says whether any row of the warp needs one (warp
// uniform). Split from the rescale so the Hopper mainloop can run this step
// while the previous tile's O += P V is still in flight on the tensor cores.
// State: anything with m[MT][2] and d[MT][2] (a PrefillState).
// Whether KV tile [first, last] needs the per-element mask for a warp whose
// rows are queries min_qo..max_qo (all valid when rows_valid): it crosses
// kv_end, the causal diagonal or the window's left edge, or the variant has a
// LogitsMask of its own. Warp-uniform. kBits: the variant's LogitsMaskBits
// words stand in for its LogitsMask (MaskBits::kUsed), and
// prefill_softmax_step skips the mask itself where they are all ones.
template <typename Variant, typename Params, bool kBits = false>
__device__ __forceinline__ bool tile_needs_mask(int first, int last, int kv_end, bool rows_valid, int min_qo, int max_qo,
                                                int causal_shift) {
  return (VariantTraits<Variant, Params>::logits_mask && !kBits) || !rows_valid || last >= kv_end ||
         (Variant::causal && last > min_qo + causal_shift) ||
         (Variant::window_left >= 0 && first < window_first_key<Variant>(max_qo + causal_shift));
}

// A variant's LogitsMaskBits answers 32 keys at once: word w of row r holds
// keys col0 + 32 w ..., so this thread's column n * 8 + (e & 1) is bit
// (n % 4) * 8 + (e & 1) of word n / 4. (One LogitsMask call per element
// kept ~64 byte loads in flight per thread: a packed custom mask ran at
// 0.07x of the causal variant on the Hopper kernel, spilling.) The Hopper
// mainloop loads a tile's words before it waits for S, so their latency
// hides behind the tensor cores.
template <typename Variant, typename Params, int MT, int NT_S>
struct MaskBits {
  static constexpr bool kUsed = VariantTraits<Variant, Params>::logits_mask_bits && NT_S % 4 == 0;
  u32 w[MT][2][kUsed ? NT_S / 4 : 1];
  __device__ __forceinline__ void load(const Params& p, const Variant& variant, const RowInfo<MT>& rows, int col0, int b,
                                       int kv_head) {
    if constexpr (kUsed) {
#pragma unroll
      for (int t = 0; t < MT; ++t)
#pragma unroll
        for (int r = 0; r < 2; ++r)
#pragma unroll
          for (int i = 0; i < NT_S / 4; ++i)
            w[t][r][i] = rows.valid[t][r] ? variant.LogitsMaskBits(p, b, rows.qo_idx[t][r], col0 + 32 * i,
                                                                   rows.head[t][r], kv_head)
                                          : 0u;
    }
  }
  // Every key of this thread's rows visible (an invalid row's words are 0).
  __device__ __forceinline__ bool all_ones() const {
    u32 a = ~0u;
#pragma unroll
    for (int t = 0; t < MT; ++t)
#pragma unroll
      for (int r = 0; r < 2; ++r)
#pragma unroll
        for (int i = 0; i < (kUsed ? NT_S / 4 : 1); ++i) a &= w[t][r][i];
    return a == ~0u;
  }
  __device__ __forceinline__ bool keep(int t, int n, int e) const {
    return !kUsed || ((w[t][e / 2][kUsed ? n / 4 : 0] >> ((n % 4) * 8 + (e & 1))) & 1u);
  }
};

// kRowSums = false leaves d alone: the caller sums the rows of P itself
// (the Hopper template, on the tensor cores). bits: the tile's mask words
// already loaded (MaskBits::kUsed), else loaded here. kRunScale: the softmax
// scale is run_sm_scale (an fp8 cache's k_scale tensor folded in at run
// time), else p.sm_scale. kPExp2: P (and d) come out scaled by 2^kPExp2 (fp8
// P keeps small weights that way; the caller divides d and O back).
// kMaxSlack > 0 keeps a row's reference maximum until a tile's exceeds it by
// more than that (base 2): weights then reach 2^kMaxSlack, which 16-bit P
// holds as exactly as weights <= 1, and O is rescaled only in the rare tiles
// where a row jumps that far instead of whenever a maximum rises (most tiles
// among a 16-row warp's first few dozen). Every kernel with 16-bit P takes
// kSoftmaxMaxSlack (the FA2 and Hopper templates; the MLA 64-row tile has
// the same update inline); fp8 P has no headroom above its 2^kPExp2 scaling.
constexpr int kSoftmaxMaxSlack = 8;
template <typename Variant, bool kRowSums = true, bool kRunScale = false, int kPExp2 = 0, int kMaxSlack = 0, int MT,
          int NT_S, typename State, typename Params>
__device__ __forceinline__ bool prefill_softmax_step(const Params& p, const Variant& variant, State& st,
                                                     const RowInfo<MT>& rows, float (&s)[MT][NT_S][4], int col0,
                                                     int kv_end, int b, int kv_head, bool masked, int causal_shift,
                                                     float (&scale)[MT][2],
                                                     const MaskBits<Variant, Params, MT, NT_S>* bits = nullptr,
                                                     float run_sm_scale = 0.f) {
  // Logits. Plain softmax variants keep S raw and fold sm_scale * log2(e)
  // into the exponent (one FFMA + MUFU per element); others run the variant's
  // LogitsTransform and move to base 2. Masks run only on tiles that need one
  // (`masked`: tile_needs_mask).
  using Traits = VariantTraits<Variant, Params>;
  constexpr bool kPlain = Variant::use_softmax && !Traits::logits_transform;
  const float scale_log2 = (kRunScale ? run_sm_scale : p.sm_scale) * kLog2e;
  using Bits = MaskBits<Variant, Params, MT, NT_S>;
  constexpr bool kMaskBits = Bits::kUsed;
  auto keep = [&](int t, int r, int pos) {
    bool k = rows.valid[t][r] && pos < kv_end;
    if constexpr (Variant::causal) k = k && pos <= rows.qo_idx[t][r] + causal_shift;
    if constexpr (Variant::window_left >= 0) k = k && pos >= window_first_key<Variant>(rows.qo_idx[t][r] + causal_shift);
    if constexpr (Traits::logits_mask && !kMaskBits)
      k = k && variant.LogitsMask(p, b, rows.qo_idx[t][r], pos, rows.head[t][r], kv_head);
    return k;
  };
  // The mask is a branch around the whole tile, not a test per element: the
  // compiler if-converts a per-element `masked && !keep` into ~7 predicate
  // instructions per element on every tile (SASS of the Hopper kernel).
  Bits own;
  if (kMaskBits && bits == nullptr) own.load(p, variant, rows, col0, b, kv_head);
  const Bits& words = bits != nullptr ? *bits : own;
  auto apply_mask = [&](float masked_value) {
#pragma unroll
    for (int t = 0; t < MT; ++t)
#pragma unroll
      for (int n = 0; n < NT_S; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e)
          if (!(keep(t, e / 2, col0 + n * 8 + (e & 1)) && words.keep(t, n, e))) s[t][n][e] = masked_value;
  };
  if constexpr (!kPlain) {
#pragma unroll
    for (int t = 0; t < MT; ++t)
#pragma unroll
      for (int n = 0; n < NT_S; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int r = e / 2, pos = col0 + n * 8 + (e & 1);
          const float logit = variant.LogitsTransform(p, s[t][n][e] * (kRunScale ? run_sm_scale : p.sm_scale), b,
                                                      rows.qo_idx[t][r], pos, rows.head[t][r], kv_head);
          s[t][n][e] = Variant::use_softmax ? logit * kLog2e : logit;
        }
  }
  // Mask words: `masked` left them out (tile_needs_mask<..., true>); a tile
  // whose words are all ones for the whole warp (a custom mask's interior)
  // skips the ~500 selects, which change nothing there.
  if constexpr (kMaskBits) masked = masked || !__all_sync(0xffffffffu, words.all_ones());
  if (masked) apply_mask(Variant::use_softmax ? neg_inf() : 0.f);

  bool raised = false;
  if (Variant::use_softmax) {
    // New row maxima first. A row's reference maximum moves only when the
    // tile's exceeds it by more than kMaxSlack (base 2; see the template
    // parameter), and O and d need a rescale only when some row of the warp
    // moved it (MT x NT_O x 4 multiplies).
#pragma unroll
    for (int t = 0; t < MT; ++t)
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        // Two chains (even and odd n-tiles) halve the dependent FMNMX latency.
        float mx = fmaxf(s[t][0][2 * r], s[t][0][2 * r + 1]);
        float my = NT_S > 1 ? fmaxf(s[t][NT_S - 1][2 * r], s[t][NT_S - 1][2 * r + 1]) : mx;
#pragma unroll
        for (int n = 1; n < NT_S - 1; ++n) {
          if (n % 2) my = fmaxf(my, fmaxf(s[t][n][2 * r], s[t][n][2 * r + 1]));
          else mx = fmaxf(mx, fmaxf(s[t][n][2 * r], s[t][n][2 * r + 1]));
        }
        mx = fmaxf(mx, my);
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
        if constexpr (kPlain) mx *= scale_log2;  // sm_scale > 0 (checked on the host): the max commutes
        if constexpr (kMaxSlack == 0) {  // plain maxima (fp8 P)
          const float m_new = fmaxf(mx, st.m[t][r]);
          raised |= m_new > st.m[t][r];
          const float m_safe = m_new == neg_inf() ? 0.f : m_new;
          scale[t][r] = fast_exp2(st.m[t][r] - m_safe);
          st.m[t][r] = m_new;
        } else {
          // -inf + slack is -inf: a row's first finite logits always move it.
          // One select, then the exponent unconditionally (2^0 = 1 where the
          // maximum stays): a select on the factor too made the FA2 template
          // spill more at its register limit, and run slower.
          const bool up = mx > st.m[t][r] + static_cast<float>(kMaxSlack);
          raised |= up;
          const float m_new = up ? mx : st.m[t][r];
          const float m_safe = m_new == neg_inf() ? 0.f : m_new;
          scale[t][r] = fast_exp2(st.m[t][r] - m_safe);
          st.m[t][r] = m_new;
        }
      }
    raised = __any_sync(0xffffffffu, raised);
#pragma unroll
    for (int t = 0; t < MT; ++t)
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        // All masked so far: weights 0, not NaN.
        const float m_safe = (st.m[t][r] == neg_inf() ? 0.f : st.m[t][r]) - static_cast<float>(kPExp2);
        float sums[2] = {0.f, 0.f};  // two chains, as for the maximum
#pragma unroll
        for (int n = 0; n < NT_S; ++n)
#pragma unroll
          for (int c = 0; c < 2; ++c) {
            float& x = s[t][n][2 * r + c];
            x = kPlain ? fast_exp2(fmaf(x, scale_log2, -m_safe)) : fast_exp2(x - m_safe);
            if constexpr (kRowSums) sums[c] += x;
          }
        // A quarter of the row (quads are summed at the end); d at the old
        // maximum is rescaled here, O by the caller.
        if constexpr (kRowSums) st.d[t][r] = (raised ? st.d[t][r] * scale[t][r] : st.d[t][r]) + (sums[0] + sums[1]);
      }
  }
  return raised;
}

// O *= scale row by row (after prefill_softmax_step raised a maximum).
template <int MT, int NT_O>
__device__ __forceinline__ void prefill_rescale_o(PrefillState<MT, NT_O>& st, const float (&scale)[MT][2]) {
#pragma unroll
  for (int t = 0; t < MT; ++t)
#pragma unroll
    for (int r = 0; r < 2; ++r)
#pragma unroll
      for (int n = 0; n < NT_O; ++n) {
        st.o[t][n][2 * r] *= scale[t][r];
        st.o[t][n][2 * r + 1] *= scale[t][r];
      }
}

// The whole update for kernels whose O is not in flight: step + rescale.
template <typename Variant, bool kRunScale = false, int kMaxSlack = 0, int MT, int NT_S, int NT_O, typename Params>
__device__ __forceinline__ void prefill_softmax_tile(const Params& p, const Variant& variant, PrefillState<MT, NT_O>& st,
                                                     const RowInfo<MT>& rows, float (&s)[MT][NT_S][4], int col0,
                                                     int kv_end, int b, int kv_head, bool masked, int causal_shift,
                                                     float run_sm_scale = 0.f) {
  float scale[MT][2];
  if (prefill_softmax_step<Variant, true, kRunScale, 0, kMaxSlack>(
          p, variant, st, rows, s, col0, kv_end, b, kv_head, masked, causal_shift, scale,
          static_cast<const MaskBits<Variant, Params, MT, NT_S>*>(nullptr), run_sm_scale))
    prefill_rescale_o(st, scale);
}

#endif

}  // namespace tessera
