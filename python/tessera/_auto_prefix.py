"""shared_prefix="auto": composable formats found from the page table (the
FlashInfer paper, sections 3.1.2 and 4.4), behind the plan() option of
BatchDecodeWithPagedKVCacheWrapper and BatchPrefillWithPagedKVCacheWrapper.

plan() looks for requests whose page tables start with the same full pages
(prefix caching, parallel samples of one prompt) with the C++ detection
(tessera._C.find_shared_prefixes; tessera/formats/shared_prefix.hpp): groups
by first page id, each group sharing its members' longest common run of
identical ids from position 0, full pages only (a page a request fills only
partly is its own). When the split saves at least MIN_SAVED_BYTES of K / V
reads per layer (the sum over groups of shared pages x (members - 1), in
bytes of K and V), plan() plans a two-level cascade instead of the flat step:

* level 0: each group's shared pages once, with all of its members' query
  rows as one block of rows (read once per query tile, on the tensor cores);
  requests in no group have no pages there;
* level 1: each request's remaining pages, causal for a causal prefill;

and run() merges the two through the attention state (the C++
CascadeAttention, via MultiLevelCascadeAttentionWrapper). Every key of every
request is in exactly one level, so the result is the flat attention's up to
rounding (the levels' states are fp32 and rounded once). A step without
sharing worth it takes the wrapper's normal plan, unchanged.

Causal prefill: the shared level has no mask, so a member shares at most
floor((kv_len - qo_len) / page_size) pages: every shared key then precedes
each of its queries (bottom-right alignment), and its level-1 keys keep the
alignment (kv_len - shared keys >= qo_len).

Members of a group are made adjacent (a level-0 entry is a contiguous block
of rows). When the groups are not contiguous in the batch, run() gathers q's
rows into that order (one index_select) and scatters out / lse back.

Workspace: the cascade has a buffer of its own, allocated on the workspace's
device at the first plan() that splits and regrown (doubling the bounds) when
a later one needs more: its ideal size for the step's bounds (two fp32 states
of the step's query rows plus one split-KV scratch, ~34 MB at head_dim 128 on
an H100 whatever the batch). The caller's float_workspace_buffer stays the
normal plan's alone, so a step without sharing is planned exactly as with
shared_prefix=None.

CUDA graphs (the decode wrapper's use_cuda_graph=True): a captured run()
replays one sequence of launches, so in this mode the C++ wrapper splits
every step itself (DecodeOptions::shared_prefix, tessera/api/
shared_prefix.hpp): groups are runs of adjacent requests sharing at least
GRAPH_MIN_SHARED_TOKENS tokens, with enough members and savings (the
wrapper's _shared_prefix_limits),
the unique level runs on the wrapper's own decode kernel and the shared
level on a prefill kernel merging into out in its epilogue, re-planned only
when its groups change; a step without groups adds one launch over no
pages. Its workspace is the tail of the wrapper's. The prefill wrapper's
CUDA-graph mode does the same on its own kernel (PrefillOptions::
shared_prefix; causal: each member shares only pages before its first query).

Not with custom masks, sliding windows, fused RoPE / ALiBi, fp8 caches, an
o_data_type or head_dim_vo other than q's, fixed_split_size,
disable_split_kv or q_len_per_req > 1: plan() raises NotSupportedError
naming the argument, whether or not the step shares pages. Page ids given
as a CUDA tensor are copied to the host for the detection (a
synchronization).
"""

import math

import numpy as np

from . import _compat as C
from . import _tensors as T
from . import _wrapper_util as W
from ._native import _C

# The K / V reads per layer a split must save: it costs a second launch, a
# merge kernel and fp32 states, about 5 us on an H100, which is ~16 MiB of
# HBM traffic at 3.35 TB/s. A heuristic, not a measurement of the cascade.
MIN_SAVED_BYTES = 16 << 20

# CUDA-graph mode: the fewest shared tokens that make a group (AutoSharedPrefix::min_shared_tokens; why 512:
# tessera/api/shared_prefix.hpp), and the C++ option's (min_shared_tokens, min_members, min_saved_tokens) the
# wrappers pass (-1: AutoSharedPrefix's default); OFF: the option off.
GRAPH_MIN_SHARED_TOKENS = 512
GRAPH_LIMITS = (GRAPH_MIN_SHARED_TOKENS, -1, -1)
OFF = (0, -1, -1)


def shared_prefix_arg(value):
    """True for "auto", False for None; ValueError naming shared_prefix otherwise."""
    if value is None:
        return False
    if isinstance(value, str) and value == "auto":
        return True
    raise ValueError(f"shared_prefix: expected None or 'auto', got {value!r}")


def _refuse(name, value, why):
    raise C.not_supported(name, value, f"with shared_prefix='auto': {why}")


def check_options(window_left, rope, kv_dtype, q_dtype, o_dtype, masked=False, head_dim_vo=0,
                  fixed_split_size=None, disable_split_kv=False, q_len_per_req=1):
    """The plan() arguments shared_prefix="auto" does not combine with (NotSupportedError naming each); checked on
    every such plan, whatever the table, so a configuration either works on every step or on none."""
    if q_len_per_req != 1:
        _refuse("q_len_per_req", q_len_per_req, "only one query per request is split into levels")
    if masked:
        _refuse("custom_mask", "given", "a mask spans both levels")
    if window_left != -1:
        _refuse("window_left", window_left, "a window relative to the whole sequence spans both levels")
    if rope[0] != W.POS_NONE:
        _refuse("pos_encoding_mode", W.pos_encoding_mode_name(rope[0]), "fused positional encodings are not "
                "implemented on the cascade levels")
    if kv_dtype != q_dtype:
        _refuse("kv_data_type", kv_dtype, "the cascade levels read 16-bit caches of q's dtype")
    if o_dtype != q_dtype:
        _refuse("o_data_type", o_dtype, "the cascade writes q's dtype")
    if head_dim_vo:
        _refuse("head_dim_vo", head_dim_vo, "the cascade levels take one head dim")
    if fixed_split_size not in (None, -1):
        _refuse("fixed_split_size", fixed_split_size, "batch-invariant chunks are not implemented on the levels")
    if disable_split_kv:
        _refuse("disable_split_kv", True, "the levels plan their own KV splits")


def min_saved_pages(page_size, num_kv_heads, head_dim, min_bytes):
    """MIN_SAVED_BYTES (or min_bytes) as page reads of 16-bit K and V."""
    page_bytes = page_size * num_kv_heads * 2 * head_dim * 2
    return max(0, math.ceil(min_bytes / page_bytes))


def host_page_ids(indices):
    """plan()'s page ids (W.page_ids' result) as host int32, for the detection: ids on the GPU are copied."""
    if isinstance(indices, W.DeviceIds):
        return W.host_ints(indices.tensor[:indices.count], "indices")
    return indices


class AutoPrefix:
    """One wrapper's shared-prefix state: the last detection and the cascade that runs split steps."""

    def __init__(self, kv_layout, backend):
        self._kv_layout = kv_layout
        self._backend = backend  # the cascade's backend name ("auto", "fa2", "fa3")
        self._cascade = None  # MultiLevelCascadeAttentionWrapper over self._buffer
        self._buffer = None
        self._config = self._bounds = None  # what the buffer was sized for
        self._rows = None  # level row -> caller's row (a CUDA int64 tensor), None when the order is the same
        self._total_q = 0
        self.stats = None  # the last detection, for shared_prefix_stats

    def detect(self, kv_indptr, kv_indices, kv_last_page_len, page_size, qo_indptr, causal, min_pages):
        """The C++ detection on host int32 arrays; its dict when the split is worth it, else None."""
        split = _C.find_shared_prefixes(kv_indptr, kv_indices, kv_last_page_len, page_size, qo_indptr,
                                        min_shared_pages=1, min_saved_pages=min_pages, causal=causal)
        groups = split["groups"]
        self.stats = dict(split=split["split"], groups=int(groups.shape[0]),
                          requests_in_groups=int(groups[:, 1].sum()) if groups.size else 0,
                          saved_pages=int(split["saved_pages"]), detect_us=float(split["host_us"]))
        return split if split["split"] else None

    def plan(self, split, buf, num_qo_heads, num_kv_heads, head_dim, page_size, causal, sm_scale, cap, q_dtype):
        """Plans the two levels of `split` (detect()'s) on the cascade, sizing its own workspace first."""
        from .cascade import MultiLevelCascadeAttentionWrapper

        torch = T._torch()
        levels = (split["shared"], split["unique"])
        total_q = int(levels[1][0][-1])
        counts = (max(max(lv[0].size - 1 for lv in levels), 1), max(total_q, 1),
                  max(max(lv[2].size for lv in levels), 1))
        config = (q_dtype, q_dtype, q_dtype, int(head_dim), int(num_qo_heads), int(num_kv_heads), int(page_size),
                  self._kv_layout, 2, bool(causal))
        device = buf.device.index or 0
        if config != self._config or self._bounds is None:
            bounds = counts
        elif all(c <= b for c, b in zip(counts, self._bounds)):
            bounds = self._bounds
        else:  # grow by doubling, as the wrappers' own bounds do, so re-sizes stay rare
            bounds = tuple(max(c, 2 * b) for c, b in zip(counts, self._bounds))
        if bounds != self._bounds or config != self._config:
            need, _ = _C.CascadeAttention.workspace_size(*config, *bounds, device=device,
                                                         backend=W.BACKENDS[self._backend], logits_soft_cap=cap)
            if self._buffer is None or self._buffer.numel() < need:
                if self._buffer is not None:  # queued runs may still read the old buffer
                    torch.cuda.synchronize(buf.device)
                self._cascade = None
                self._buffer = torch.empty(need, dtype=torch.uint8, device=buf.device)
            self._config, self._bounds = config, bounds
        if self._cascade is None:
            self._cascade = MultiLevelCascadeAttentionWrapper(2, self._buffer, self._kv_layout, backend=self._backend)
        self._rows = None
        self._cascade.plan([lv[0] for lv in levels], [lv[1] for lv in levels], [lv[2] for lv in levels],
                           [lv[3] for lv in levels], num_qo_heads, num_kv_heads, head_dim, page_size, causal=causal,
                           sm_scale=sm_scale, logits_soft_cap=cap, q_data_type=q_dtype, kv_data_type=q_dtype)
        if not split["identity_order"]:
            self._rows = torch.from_numpy(split["row_order"].astype(np.int64)).to(buf.device)
        self._total_q = total_q

    def run(self, q, paged_kv_cache, out, lse, sm_scale, v_scale, sinks):
        """The planned levels into out (and lse, base 2, when given); sinks / v_scale applied after the merge.
        sm_scale: the binding's (run()'s q_scale / k_scale folded in); v_scale: None or a float."""
        if q.shape[0] != self._total_q:
            raise ValueError(f"q: expected {self._total_q} rows (the planned query rows), got {q.shape[0]}")
        k, v = W.unpack_paged_kv_cache(paged_kv_cache)
        rows = self._rows
        q_l, out_l, lse_l = q, out, lse
        if rows is not None:  # the levels' row order: gather q, scatter the outputs back
            q_l = q.index_select(0, rows)
            out_l = T.empty(out, tuple(out.shape))
            lse_l = None if lse is None else T.empty(lse, tuple(lse.shape))
        native = self._cascade._native
        with T.on_device_of(q):
            native.run(T.arg(q_l), T.arg(k), T.arg(v), out_l, lse_l, sm_scale, T.stream_of(q))
            if rows is not None:
                out.index_copy_(0, rows, out_l)
                if lse is not None:
                    lse.index_copy_(0, rows, lse_l)
            if v_scale is not None:
                out.mul_(v_scale)
            if sinks is not None:
                W.apply_sinks(out, lse, sinks)
        return out, lse


def stats(wrapper):
    """What the last plan() with shared_prefix="auto" found (None before one): split (whether run() goes
    through the cascade), groups, requests_in_groups, saved_pages (page reads per layer the split saves) and
    detect_us (the detection's host time)."""
    auto = getattr(wrapper, "_auto_prefix", None)
    return None if auto is None or auto.stats is None else dict(auto.stats)


def plan_decode(w, indptr, indices, last_page_len, dtypes, shape, scale, sm_scale, cap, rope, buf):
    """BatchDecodeWithPagedKVCacheWrapper.plan's shared_prefix="auto" step without CUDA graphs: plans the cascade
    and returns True when the step's sharing is worth it (run() then goes through it), else False (the normal
    plan follows). dtypes: (q, kv, o) names; shape: (num_qo_heads, num_kv_heads, head_dim, page_size); scale: the
    binding's."""
    if w._auto_prefix is None:
        w._auto_prefix = AutoPrefix(w._kv_layout, "auto")
    hq, hkv, d, ps = shape
    split = w._auto_prefix.detect(indptr, host_page_ids(indices), last_page_len, ps, None, False,
                                  min_saved_pages(ps, hkv, d, w._shared_prefix_min_bytes))
    if split is None:
        return False
    w._planned = None  # a failed plan() leaves nothing to run
    w._auto_prefix.plan(split, buf, hq, hkv, d, ps, False, sm_scale, cap, dtypes[0])
    w._planned = {"batch": indptr.size - 1, "q_dtype": dtypes[0], "kv_dtype": dtypes[1], "o_dtype": dtypes[2],
                  "num_qo_heads": hq, "head_dim": d, "sm_scale": scale, "window_left": -1, "rope": rope,
                  "alibi_slopes": None, "auto_prefix": True, "shared_prefix": w._auto_prefix}
    return True


def run_decode(plan, q, paged_kv_cache, scale, v_scale, out, lse, return_lse, window_left, sinks):
    """BatchDecodeWithPagedKVCacheWrapper.run of a step planned as a cascade (scale, v_scale: W.run_scales')."""
    W.check_run_window(window_left, -1)
    if len(q.shape) != 3:
        raise ValueError(f"q: expected a 3-D tensor [batch_size, num_qo_heads, head_dim], got shape {tuple(q.shape)}")
    sinks = W.check_sinks(sinks, q, plan["num_qo_heads"])
    out, lse = W.run_outputs(q, out, lse, return_lse or sinks is not None, plan["o_dtype"])
    out, lse = plan["shared_prefix"].run(q, paged_kv_cache, out, lse, scale, v_scale, sinks)
    return (out, lse) if return_lse else out


def plan_prefill(w, qo, kv, indices, last, config, scale, sm_scale, options, rope):
    """BatchPrefillWithPagedKVCacheWrapper.plan's shared_prefix="auto" step (as plan_decode; config: the
    wrapper's C++ configuration tuple, options its variant options)."""
    if w._auto_prefix is None:
        backend = next(name for name, code in W.BACKENDS.items() if code == w._backend)
        w._auto_prefix = AutoPrefix(w._kv_layout, backend)
    q_dt, _, o_dt, d, hq, hkv, ps, _, causal = config
    W.check_workspace_buffer_once(w)
    split = w._auto_prefix.detect(kv, host_page_ids(indices), last, ps, qo, causal,
                                  min_saved_pages(ps, hkv, d, w._shared_prefix_min_bytes))
    if split is None:
        return False
    w._auto_prefix.plan(split, w._float_workspace_buffer, hq, hkv, d, ps, causal, sm_scale,
                        options["logits_soft_cap"], q_dt)
    w._planned = dict(total_q=int(qo[-1]), auto_prefix=True, shared_prefix=w._auto_prefix, o_dtype=o_dt,
                      sm_scale=scale, mask=None, window_left=-1, rope=rope, alibi_slopes=None, head_dim=d,
                      head_dim_vo=d, num_qo_heads=hq)
    return True
