// Automatic shared prefixes as a plan() option of BatchDecode and
// BatchPrefill (FlashInfer paper §3.1.2, §4.4): the wrapper finds, in the
// page table it is given, requests that start with the same full pages and
// attends over those pages once per group, with no change to the caller's
// page table or run() call.
//
// With the option, every plan() from host page ids splits the step into the
// two composable levels of find_shared_prefixes (formats/shared_prefix.hpp)
// with SharedPrefixOptions::keep_order and always_levels, so run() is the
// same launches on every step and a captured CUDA graph stays valid:
//
//   unique level: each request's pages after its group's shared ones (all of
//       them outside a group), on the wrapper's own kernel, into o and an LSE
//       the wrapper keeps in its workspace;
//   shared level: each group's shared pages once, with all of its members'
//       query rows as one block of rows (read once per query tile, on the
//       tensor cores), on a prefill kernel that merges into o in its
//       epilogue (RunOptions::merge_lse); rows outside the groups keep o.
//
// Groups are runs of adjacent requests (the caller's row order is kept: no
// gather of q, no scatter of outputs) that share at least min_shared_tokens
// tokens of full pages, with enough members and savings (below). A step
// without groups costs one more launch over no pages. The shared level is
// re-planned only when its groups change.
//
// Needs: host page ids (plan() with a TensorView of ids, plan_on_device and
// the ragged / masked plans raise InvalidArgument naming shared_prefix), the
// task's bounds max_batch and max_pages (and max_total_q for prefill) at
// construction, q / kv / o of one 16-bit dtype and equal head dims, and a
// variant that splits exactly over keys: standard, causal (prefill: the
// shared keys precede every query of a member, see
// SharedPrefixOptions::causal) and soft cap. Positional variants (RoPE,
// ALiBi, windows, sinks), custom masks and fixed_chunk are refused at
// construction (InvalidArgument naming shared_prefix), as are scale tensors
// and merge_lse at run().
#pragma once
#include <cstdint>

namespace tessera {

struct AutoSharedPrefix {
  bool enabled = false;
  // The fewest shared tokens that make a group, rounded up to whole pages
  // (>= 1). The flat kernels read a short prefix mostly from L2, its
  // sharers' CTAs running together, so a short group gains little from a
  // level of its own: on an H100 (bench/shared_prefix_graph.py, batch 128,
  // GQA 32/8) 256-token prompts ran 0.89-0.91x in groups of 16 and 64,
  // 512-token ones 1.18-1.49x and 1536-token ones 2.0-2.3x.
  int32_t min_shared_tokens = 512;
  // The fewest members that make a group (>= 2), and the fewest K / V token
  // reads per layer the step's groups must save (shared tokens x (members -
  // 1), summed; >= 0) for the shared level to hold them; a step below either
  // runs every request on the unique level (the shared level's launch over
  // no pages stays). The flat kernel runs a small group's members side by
  // side and reads their shared pages mostly from L2, while the shared level
  // adds its own latency after the unique one. In the serving loop
  // (bench/serve, Study 2, H200) with every group kept, groups of 2 over
  // ~1500-token prompts ran 0.95x and one group of 16 over 640 tokens (9,600
  // tokens saved) added 0.57 ms to a 8.1 ms step (0.93x); with 4 members and
  // 32,768 tokens those steps stay flat (decode step within 0.04 ms of the
  // flat one at every n) and groups of 4-64 over ~1500-token prompts keep
  // 1.03-1.23x. Attention alone, 512-token prompts in groups of 16 or 64
  // (about 61,000 tokens saved at batch 128) ran 1.18-1.49x, hence not more.
  int32_t min_members = 4;
  int64_t min_saved_tokens = 32768;
};

// What the last plan() found.
struct SharedPrefixStats {
  int32_t groups = 0;              // groups in the shared level
  int32_t requests_in_groups = 0;  // their members
  int64_t saved_pages = 0;         // page reads per run() the split saves: shared pages x (members - 1)
  int32_t groups_found = 0;        // groups found, also those left on the unique level (too few savings)
  double detect_us = 0;            // host time of the detection
  bool replanned = false;          // whether the shared level was planned anew (its groups changed)
};

}  // namespace tessera
