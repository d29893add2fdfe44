"""Prefill / append attention (FlashInfer's ``flashinfer.prefill`` names).

BatchPrefillWithPagedKVCacheWrapper lives here,
BatchPrefillWithRaggedKVCacheWrapper in _prefill_ragged.py,
single_prefill_with_kv_cache (and its _return_lse form) in _single_prefill.py
and BlockSparseAttentionWrapper in sparse.py, re-exported here so that
FlashInfer's module names work too. They keep FlashInfer
0.7.2's signatures; arguments for features Tessera does not implement yet
(sinks, FP8 scale tensors, multi-item scoring, a value head dimension
different from the query/key one, ...) raise tessera.NotSupportedError unless
left at their defaults (see _compat.py).

``causal=True`` is FlashInfer's bottom-right aligned mask: in a request with
q_len queries and kv_len keys, query i sees keys j <= i + kv_len - q_len (a
query that sees no key gets o = 0 and lse = -inf). LSEs are in **base 2**
unless run() is asked for lse_base="ln".

Custom masks (``custom_mask=`` / ``packed_custom_mask=`` of the paged and
ragged plan() and of single_prefill, as FlashInfer): request i's boolean mask
[qo_len_i, kv_len_i] (True = visible), ``custom_mask`` the flat concatenation
over requests, ``packed_custom_mask`` the same bits packed per request with
``tessera.packbits(m.reshape(-1), bitorder="little")`` (bytes concatenated;
``segment_packbits`` packs a whole batch). plan() derives the byte offsets from
the lengths and checks the sizes; with a mask, causal is ignored (the mask
decides, as in FlashInfer: put the causal part into it). Rows that see no key
get o = 0 and lse = -inf.
"""

import functools

from . import _auto_prefix as AP
from . import _compat as C
from . import _masks as M
from . import _prefill_base as B
from . import _tensors as T
from . import _wrapper_util as W
from ._prefill_ragged import BatchPrefillWithRaggedKVCacheWrapper  # noqa: F401 (FlashInfer's module name)
from .jit import gen_batch_prefill_module, gen_single_prefill_module  # noqa: F401 (FlashInfer names)
from .sparse import BlockSparseAttentionWrapper  # noqa: F401 (importable from here too)


class BatchPrefillWithPagedKVCacheWrapper(B.PrefillWrapper):
    """Batch prefill / append attention over a paged KV cache (FlashInfer's wrapper of the same name).

    plan() once per step (it schedules (query tile x KV chunk) work items on
    the host and uploads them into the workspace), then run() for every
    layer. run() allocates nothing on the device beyond its outputs and never
    synchronizes, so it can be captured in a CUDA graph and replayed after
    later plan() calls with new lengths within the bounds (see below).
    In CUDA-graph mode q (and out / lse) may have more rows than the plan's
    qo_indptr[-1]: rows beyond it are left untouched.

    Workspace bounds: the C++ schedule lives in fixed sections of
    float_workspace_buffer sized for a largest batch, a largest total query
    length and a largest number of page-table entries. Index buffers given
    to the constructor (FlashInfer's CUDA-graph buffers) fix max_batch and
    max_pages by their lengths; anything else comes from the first plan().
    With use_cuda_graph=True the bounds are fixed after the first plan() (a
    captured run() holds the workspace addresses), so plan the largest step
    first: a later plan() beyond them raises ValueError naming the bound.
    Without CUDA graphs a larger plan() re-sizes the sections (waiting for
    the GPU once) as long as float_workspace_buffer is large enough. A buffer
    below the ideal size (_C.BatchPrefill.workspace_size, e.g. the common
    16 MB) works: the split-KV partial states get what fits and long requests
    split over fewer CTAs; below the minimum (min_workspace_size) plan()
    raises ValueError naming it.

    Planning on the GPU (Tessera's keyword-only plan(..., on_device=True,
    batch_size=..., max_total_q=...)), as for
    BatchDecodeWithPagedKVCacheWrapper: the step stays in int32 CUDA tensors
    sized for the bounds (qo_indptr None: one query per request); plan()
    only enqueues the planner kernel, so it can be captured with run() in
    one CUDA graph serving any step within the bounds. run() then takes q of
    max_total_q rows. Not with custom masks, shared_prefix, fixed_split_size
    or the length arguments (ValueError naming them); ragged KV: the ragged
    wrapper's plan(on_device=True). Details: docs/architecture.md, "Planning
    on the GPU".
    """

    def __init__(self, float_workspace_buffer, kv_layout="NHD", use_cuda_graph=False, qo_indptr_buf=None,
                 paged_kv_indptr_buf=None, paged_kv_indices_buf=None, paged_kv_last_page_len_buf=None,
                 custom_mask_buf=None, mask_indptr_buf=None, backend="auto", jit_args=None, jit_kwargs=None,
                 variant_owns_mask=False):
        """
        Args:
            float_workspace_buffer: a contiguous CUDA tensor of any dtype
                (FlashInfer users allocate 128 MB), used as bytes for the
                device workspace. It must stay alive and unused by anything
                else while the wrapper is in use.
            kv_layout: "NHD" or "HND".
            use_cuda_graph: fix the workspace bounds at the first plan().
            qo_indptr_buf, paged_kv_indptr_buf, paged_kv_indices_buf,
            paged_kv_last_page_len_buf: optional 1-D tensors whose lengths fix
                max_batch (indptr length - 1, or last_page_len length) and
                max_pages (indices length).
            custom_mask_buf: uint8 CUDA tensor that CUDA-graph mode copies
                each step's packed custom mask into (needed there for masks).
            mask_indptr_buf: its length - 1 fixes max_batch, as qo_indptr_buf.
            backend: "auto" (Hopper template on sm_90 where it applies, else FA2), "fa2" or "fa3".
            jit_args, jit_kwargs, variant_owns_mask: only their defaults (custom
                variants run through tessera.AttentionWrapper).
        """
        super().__init__(float_workspace_buffer, kv_layout, use_cuda_graph, backend, jit_args, jit_kwargs,
                         variant_owns_mask)
        # The caller's buffers, also under FlashInfer's attribute names.
        self._buffers = (qo_indptr_buf, paged_kv_indptr_buf, paged_kv_indices_buf, paged_kv_last_page_len_buf,
                         custom_mask_buf, mask_indptr_buf)
        (self._qo_indptr_buf, self._paged_kv_indptr_buf, self._paged_kv_indices_buf, self._paged_kv_last_page_len_buf,
         self._custom_mask_buf, self._mask_indptr_buf) = self._buffers
        self._fix_batch((("qo_indptr_buf", qo_indptr_buf, 1), ("paged_kv_indptr_buf", paged_kv_indptr_buf, 1),
                         ("paged_kv_last_page_len_buf", paged_kv_last_page_len_buf, 0),
                         ("mask_indptr_buf", mask_indptr_buf, 1)))
        self._mask_buf = custom_mask_buf
        self._fixed_pages = W.buffer_length(paged_kv_indices_buf, "paged_kv_indices_buf")
        # shared_prefix="auto": the K / V bytes a split must save (tests lower it) and its state (_auto_prefix.py).
        self._shared_prefix_min_bytes = AP.MIN_SAVED_BYTES
        # With CUDA graphs: PrefillOptions::shared_prefix's limits (as the decode wrapper's).
        self._shared_prefix_limits = AP.GRAPH_LIMITS
        self._auto_prefix = None

    @property
    def shared_prefix_stats(self):
        """What the last plan() with shared_prefix="auto" found (see _auto_prefix.stats), else None."""
        plan = self._planned
        if plan is not None and plan.get("prefix", AP.OFF)[0] and self._native is not None:
            return self._native.shared_prefix_stats  # the C++ wrapper split the step itself
        return AP.stats(self)

    def workspace_size(self, qo_indptr, paged_kv_indptr, paged_kv_indices, paged_kv_last_page_len, num_qo_heads,
                       num_kv_heads, head_dim_qk, page_size, head_dim_vo=None, custom_mask=None,
                       packed_custom_mask=None, causal=False, pos_encoding_mode="NONE", use_fp16_qk_reduction=False,
                       sm_scale=None, window_left=-1, logits_soft_cap=None, rope_scale=None, rope_theta=None,
                       q_data_type="float16", kv_data_type=None, o_data_type=None, prefix_len_ptr=None,
                       token_pos_in_items_ptr=None, token_pos_in_items_len=0, max_item_len_ptr=None, seq_lens=None,
                       seq_lens_q=None, block_tables=None, max_token_per_sequence=None, max_sequence_kv=None,
                       fixed_split_size=None, disable_split_kv=False, uniform_q_len=None):
        """FlashInfer's workspace_size(): (float_workspace_size, int_workspace_size) in bytes for plan() with
        these arguments (see W.probe_workspace_size); plan() state is not touched."""
        options = dict(locals())
        del options["self"]
        return W.probe_workspace_size(self, type(self).plan.__wrapped__, (), options)

    @C.recorded_plan
    def plan(self, qo_indptr, paged_kv_indptr, paged_kv_indices, paged_kv_last_page_len, num_qo_heads, num_kv_heads,
             head_dim_qk, page_size, head_dim_vo=None, custom_mask=None, packed_custom_mask=None, causal=False,
             pos_encoding_mode="NONE", use_fp16_qk_reduction=False, sm_scale=None, window_left=-1,
             logits_soft_cap=None, rope_scale=None, rope_theta=None, q_data_type="float16", kv_data_type=None,
             o_data_type=None, non_blocking=True, prefix_len_ptr=None, token_pos_in_items_ptr=None,
             token_pos_in_items_len=0, max_item_len_ptr=None, seq_lens=None, seq_lens_q=None, block_tables=None,
             max_token_per_sequence=None, max_sequence_kv=None, fixed_split_size=None, disable_split_kv=False,
             uniform_q_len=None, *, shared_prefix=None, on_device=False, batch_size=None, max_total_q=None):
        """Plans one step.

        Args:
            qo_indptr: int [batch + 1] query row pointers (torch on any
                device, numpy or list; index arrays are copied to the host).
            paged_kv_indptr: int [batch + 1] page-table row pointers.
            paged_kv_indices: int [paged_kv_indptr[-1]] page indices (a longer
                buffer is cut to that length). A CUDA tensor on the
                workspace's device stays there (without a custom mask):
                plan() copies it without reading it and the kernels check
                the ids, raising a bad one at the next plan() or run().
            paged_kv_last_page_len: int [batch] tokens in each request's last
                page (1..page_size; 0 or page_size for a request without pages).
            num_qo_heads, num_kv_heads: query heads must be a multiple of KV heads.
            head_dim_qk: 64, 128, 256 or 512 (q's and k's head dim).
            head_dim_vo: v's and the output's head dim: None or head_dim_qk,
                or 128 with head_dim_qk 192 (DeepSeek-style prefill: q, k
                [.., 192], v, out [.., 128]). Head dim 512 and unequal dims
                run on the FA2 template (backend "auto" picks it; "fa3"
                raises).
            page_size: tokens per page.
            causal: bottom-right aligned causal mask (see the module doc);
                ignored with a custom mask.
            custom_mask: bool [sum(qo_len * kv_len)], each request's
                row-major [qo_len, kv_len] mask in turn (any device; packed
                here), or packed_custom_mask: those bits packed per request
                with little bit order (uint8). At most one; causal=False.
            window_left: -1 (no window), or the keys (>= 0) a query sees to
                the left of its bottom-right-aligned position (qo_idx + kv_len
                - qo_len); with causal a sliding window.
            logits_soft_cap: None or 0.0 (off), or a cap > 0 on the logits
                (cap * tanh(logit / cap), logit = q.k * sm_scale). Window and
                cap combine (Gemma 2), also with a custom mask.
            pos_encoding_mode: "NONE", or "ROPE_LLAMA": Llama RoPE fused into
                the kernel, query i of a request rotated at position i +
                kv_len - qo_len and key j at j (half-split pairs over all
                head_dim features), or "ALIBI"; either combines with a window,
                a soft cap and a custom mask.
            rope_scale, rope_theta: with ROPE_LLAMA, positions are divided by
                rope_scale (None: 1), frequency base rope_theta (None: 1e4);
                None otherwise.
            use_fp16_qk_reduction: accepted; Tessera always accumulates q.k
                in float32.
            sm_scale: softmax scale; None means 1 / sqrt(head_dim_qk).
            q_data_type, kv_data_type, o_data_type: float16 or bfloat16
                (torch dtype or name); kv_data_type may also be
                float8_e4m3fn or float8_e5m2 (an fp8 cache, widened to q's
                type as it is read; the FA2 kernels, head_dim 64, 128 or
                256), else it equals q's; kv and o default to q's.
            non_blocking: accepted; the schedule upload is always asynchronous.
            seq_lens, seq_lens_q: None, or each request's KV / query length,
                equal to what the page table / qo_indptr give (FlashInfer's
                cuDNN and TensorRT-LLM backends read these forms).
            max_token_per_sequence, max_sequence_kv: None, or bounds on the
                query / KV lengths (cuDNN sizing hints), at least the longest.
            uniform_q_len: a CUDA-graph scheduling hint; accepted, and the
                planner sizes tiles from the actual lengths.
            prefix_len_ptr, token_pos_in_items_ptr, token_pos_in_items_len,
            max_item_len_ptr (multi-item scoring): only their defaults so
                far.
            block_tables: None, or the same page table dense ([batch, width],
                row b starting with request b's pages), as FlashInfer's cuDNN /
                TensorRT-LLM backends read it; checked on the host.
            fixed_split_size: None / -1, or a batch-invariant mode: every
                request's KV split into chunks of this many pages, so its
                output is bitwise the same whatever else is in the batch.
            disable_split_kv: True plans every request's KV as one chunk.
            shared_prefix: Tessera's (keyword-only, after FlashInfer's): None
                (off), or "auto": find requests whose tables start with the
                same full pages (prefix caching, parallel samples) and, when
                that saves at least 16 MiB of K / V reads per layer (shared
                pages x (sharers - 1)), plan a two-level cascade (the shared
                pages once for all their sharers' query rows, unmasked, then
                each request's own pages, causal when causal is set, merged
                through the attention state) that run() goes through;
                otherwise the normal plan. The caller's table and run() do not
                change. With causal, a request shares only pages that end
                before its first query (floor((kv_len - qo_len) / page_size)
                pages), so the unmasked shared level is exact. The cascade has
                a workspace of its own, allocated at the first split step.
                With use_cuda_graph every step splits (the run() a graph
                captured stays the same launches): groups are runs of adjacent
                requests sharing at least 512 tokens, and the levels live in
                the tail of this wrapper's workspace. Not with custom masks,
                window_left,
                pos_encoding_mode, head_dim_vo != head_dim_qk, o_data_type !=
                q_data_type, fixed_split_size or disable_split_kv
                (NotSupportedError naming the argument). shared_prefix_stats
                tells what the last plan found. See tessera/_auto_prefix.py.
            on_device: Tessera's (keyword-only): False (FlashInfer's plan on
                the host), or True to plan on the GPU (see "Planning on the
                GPU" in the class doc): qo_indptr (or None), paged_kv_indptr,
                paged_kv_indices and paged_kv_last_page_len are then int32
                CUDA tensors sized for the bounds, read by the planner kernel
                on the GPU, never on the host.
            batch_size: with on_device=True, an int32 CUDA tensor of one
                element, the step's number of requests (0 .. max_batch);
                else None.
            max_total_q: with on_device=True and a qo_indptr tensor, the
                bound on the step's query rows (qo_indptr[batch] <=
                max_total_q): run() takes q of that many rows. None with
                qo_indptr None (one query per request: max_batch rows) and
                without on_device.
        """
        self._planned = None  # a failed plan() leaves nothing to run
        rope = B.reject_prefill_options((), (), head_dim_qk, head_dim_vo, pos_encoding_mode, rope_scale, rope_theta)
        masked = custom_mask is not None or packed_custom_mask is not None
        causal = M.plan_causal(causal, masked)
        config, scale, options = self._config(num_qo_heads, num_kv_heads, head_dim_qk, "head_dim_qk", page_size,
                                              self._kv_layout, causal, sm_scale, q_data_type, kv_data_type,
                                              o_data_type, window_left, logits_soft_cap, masked, rope, head_dim_vo)
        if W.on_device_arg(on_device, batch_size):
            W.refuse_on_device("finding shared prefixes reads the page table on the host",
                               shared_prefix=shared_prefix)
            B.refuse_on_device_extras(custom_mask, packed_custom_mask, fixed_split_size, prefix_len_ptr,
                                      token_pos_in_items_ptr, token_pos_in_items_len, max_item_len_ptr,
                                      disable_split_kv, uniform_q_len, block_tables=block_tables,
                                      seq_lens=seq_lens, seq_lens_q=seq_lens_q,
                                      max_token_per_sequence=max_token_per_sequence, max_sequence_kv=max_sequence_kv)
            if self._auto_prefix is not None:
                self._auto_prefix.stats = None
            self._plan_on_device(config, scale, options, rope, batch_size, qo_indptr, paged_kv_indptr,
                                 paged_kv_indices, paged_kv_last_page_len, max_total_q, not disable_split_kv)
            return
        if max_total_q is not None:
            raise ValueError(f"max_total_q: expected None without on_device=True (a plan on the host takes it from "
                             f"qo_indptr), got {max_total_q!r}")
        qo = B.indptr_arg(qo_indptr, "qo_indptr")
        kv = B.indptr_arg(paged_kv_indptr, "paged_kv_indptr")
        last = W.host_ints(paged_kv_last_page_len, "paged_kv_last_page_len")
        batch, total_q = qo.size - 1, int(qo[-1])
        if kv.size != qo.size:
            raise ValueError(f"paged_kv_indptr: expected {qo.size} entries (like qo_indptr), got {kv.size}")
        fixed, split = B.check_plan_extras(qo, lambda: M.paged_kv_lengths(kv, last, config[6]), "the page table",
                                           prefix_len_ptr, token_pos_in_items_ptr, token_pos_in_items_len,
                                           max_item_len_ptr, seq_lens, seq_lens_q, max_token_per_sequence,
                                           max_sequence_kv, fixed_split_size, disable_split_kv, uniform_q_len)
        C.same_page_table(block_tables, kv, paged_kv_indices)
        # A CUDA tensor of ids stays on the GPU (see W.page_ids), except with
        # a custom mask, whose plan takes host ids.
        indices = W.page_ids(paged_kv_indices, int(kv[-1]), "paged_kv_indices", self._float_workspace_buffer,
                             on_device=not masked)
        auto = AP.shared_prefix_arg(shared_prefix)
        # shared_prefix="auto": with CUDA graphs the C++ wrapper splits every step itself (PrefillOptions::
        # shared_prefix, from host page ids); without, a step worth splitting runs on a cascade.
        prefix = self._shared_prefix_limits if auto and self._use_cuda_graph else AP.OFF
        if auto:
            AP.check_options(options["window_left"], rope, config[1], config[0], config[2], masked=masked,
                             head_dim_vo=options["head_dim_vo"], fixed_split_size=fixed_split_size,
                             disable_split_kv=disable_split_kv)
            if prefix[0]:
                indices = AP.host_page_ids(indices)
            elif AP.plan_prefill(self, qo, kv, indices, last, config, scale, sm_scale, options, rope):
                return
        elif self._auto_prefix is not None:
            self._auto_prefix.stats = None
        mask = None
        if masked:
            mask = M.MaskPlan(custom_mask, packed_custom_mask, causal, M.indptr_lengths(qo, "qo_indptr"),
                              M.paged_kv_lengths(kv, last, config[6]))
        bounds = (W.Bound("max_batch", "qo_indptr", "batch size", self._fixed_batch,
                          "qo_indptr_buf / paged_kv_indptr_buf / paged_kv_last_page_len_buf"),
                  W.Bound("max_total_q", "qo_indptr", "total query length"),
                  W.Bound("max_pages", "paged_kv_indices", "page count", self._fixed_pages, "paged_kv_indices_buf"))
        counts = (max(batch, 1), max(total_q, 1), max(len(indices), 1))
        self._plan(config, scale, options, counts, bounds,
                   lambda n, s: (n.plan_paged_device(qo, kv, indices.ptr, indices.count, indices.device, last, s)
                                 if isinstance(indices, W.DeviceIds) else
                                 n.plan_paged(qo, kv, indices, last, s, None if mask is None else mask.indptr)),
                   mask=mask, rope=rope, total_q=total_q, auto_prefix=auto, prefix=prefix,
                   planner=(split, fixed * config[6],
                            lambda: (M.indptr_lengths(qo, "qo_indptr"), M.paged_kv_lengths(kv, last, config[6]))))

    def _plan_on_device(self, config, scale, options, rope, batch_size, qo_indptr, kv_indptr, kv_indices, last,
                        max_total_q, split):
        """plan(on_device=True): checks the tensors from their metadata (never their values), sizes the workspace
        for the bounds they give (or the fixed ones they must match) and enqueues the C++ device planner."""
        max_total_q = B.on_device_total_q(batch_size, qo_indptr, max_total_q)
        step = {"batch_size": batch_size} if qo_indptr is None else {"batch_size": batch_size, "qo_indptr": qo_indptr}
        step = W.device_step(self, dict(step, paged_kv_indptr=kv_indptr, paged_kv_indices=kv_indices,
                                        paged_kv_last_page_len=last))
        max_batch = W.device_bound(step["paged_kv_indptr"], "paged_kv_indptr", 1, "max_batch")
        max_pages = W.device_bound(step["paged_kv_indices"], "paged_kv_indices", 0, "max_pages")
        B.on_device_qo_rows(step, max_batch, "paged_kv_indptr")
        if step["paged_kv_last_page_len"].shape[0] < max_batch:
            raise ValueError(f"paged_kv_last_page_len: expected at least {max_batch} entries (max_batch, "
                             f"paged_kv_indptr's length - 1), got {step['paged_kv_last_page_len'].shape[0]}")
        if qo_indptr is None:
            max_total_q = max_batch
        bounds = (W.Bound("max_batch", "paged_kv_indptr", "max_batch (its length - 1)", self._fixed_batch,
                          "qo_indptr_buf / paged_kv_indptr_buf / paged_kv_last_page_len_buf"),
                  W.Bound("max_total_q", "max_total_q" if qo_indptr is not None else "qo_indptr",
                          "query-row bound"),
                  W.Bound("max_pages", "paged_kv_indices", "max_pages (its length)", self._fixed_pages,
                          "paged_kv_indices_buf"))
        qo = step.get("qo_indptr")
        self._plan(config, scale, options, (max_batch, max_total_q, max_pages), bounds,
                   lambda n, s: n.plan_paged_on_device(step["batch_size"], qo, step["paged_kv_indptr"],
                                                       step["paged_kv_indices"], step["paged_kv_last_page_len"], s),
                   rope=rope, total_q=max_total_q, auto_prefix=False, on_device=True, planner=(split, 0, None),
                   exact=True, device_step=step)  # the C++ object reads them at every run(): keep them alive

    begin_forward = plan

    def run(self, q, paged_kv_cache, *args, q_scale=None, k_scale=None, v_scale=None, out=None, lse=None,
            return_lse=False, lse_base="log2", lse_layout="NH", enable_pdl=None, window_left=None, sinks=None,
            kv_cache_sf=None, skip_softmax_threshold_scale_factor=None, use_fp16_softmax=None, uses_spcompress=None):
        """Attention of the planned step.

        Args:
            q: [qo_indptr[-1], num_qo_heads, head_dim_qk] CUDA tensor of q_data_type.
            paged_kv_cache: (k_cache, v_cache), each [num_pages, page_size,
                num_kv_heads, head_dim] (NHD) or [num_pages, num_kv_heads,
                page_size, head_dim] (HND), head_dim_qk for k_cache and
                head_dim_vo for v_cache, or one interleaved tensor
                [num_pages, 2, ...] (K at index 0, V at 1; equal dims).
            q_scale, k_scale, v_scale: None or floats (serving engines pass
                1.0 for 16-bit caches): q_scale * k_scale multiplies the
                softmax scale, v_scale the output, as in FlashInfer. With an
                fp8 cache (which may also be uint8 tensors of its bits)
                k_scale / v_scale may be 1-element float32 CUDA tensors,
                read at run time (a captured CUDA graph replays their
                current values).
            out: optional output [rows, num_qo_heads, head_dim_vo]
                (o_data_type); allocated when None.
            lse: optional float32 [rows, num_qo_heads]; allocated when None
                and return_lse.
            return_lse: also return the LSE.
            lse_base: "log2" (the kernels' base, FlashInfer's default) or
                "ln" (natural log, rescaled after the kernel).
            lse_layout: "NH" ([rows, heads]) only so far.
            enable_pdl: programmatic dependent launch (None: on; ignored
                before sm_90), as for BatchDecodeWithPagedKVCacheWrapper.run.
            window_left: None or the value given to plan().
            sinks: None, or float32 [num_qo_heads] attention-sink logits,
                as for BatchDecodeWithPagedKVCacheWrapper.run.
            kv_cache_sf, skip_softmax_threshold_scale_factor: only
                None so far; use_fp16_softmax, uses_spcompress (TensorRT-LLM
                kernel variants): None or False.

        Returns:
            out, or (out, lse) with return_lse.
        """
        ops = T.torch_ops(q)
        if ops is not None:  # torch.compile: one opaque custom op (see _ops.py)
            return ops.prefill_paged_run(self, q, paged_kv_cache, args, q_scale, k_scale, v_scale, out, lse,
                                         return_lse, lse_base, lse_layout, enable_pdl, window_left, sinks,
                                         kv_cache_sf, skip_softmax_threshold_scale_factor, use_fp16_softmax,
                                         uses_spcompress)
        return self._run(q, paged_kv_cache, *args, q_scale=q_scale, k_scale=k_scale, v_scale=v_scale, out=out,
                         lse=lse, return_lse=return_lse, lse_base=lse_base, lse_layout=lse_layout,
                         enable_pdl=enable_pdl, window_left=window_left, sinks=sinks, kv_cache_sf=kv_cache_sf,
                         skip_softmax_threshold_scale_factor=skip_softmax_threshold_scale_factor,
                         use_fp16_softmax=use_fp16_softmax, uses_spcompress=uses_spcompress)

    def _run(self, q, paged_kv_cache, *args, q_scale=None, k_scale=None, v_scale=None, out=None, lse=None,
             return_lse=False, lse_base="log2", lse_layout="NH", enable_pdl=None, window_left=None, sinks=None,
             kv_cache_sf=None, skip_softmax_threshold_scale_factor=None, use_fp16_softmax=None, uses_spcompress=None):
        """run() outside torch.compile (and the real implementation of tessera::batch_prefill_paged_run)."""
        B.check_run_flags(use_fp16_softmax, uses_spcompress)
        plan = self._check_run(args, q_scale, k_scale, v_scale, enable_pdl, window_left, lse_base, lse_layout,
                               like=q, kv_cache_sf=kv_cache_sf,
                               skip_softmax_threshold_scale_factor=skip_softmax_threshold_scale_factor)
        k, v = W.unpack_paged_kv_cache(paged_kv_cache)
        # An fp8 cache crosses as uint8 views (T.kv_bits); its fp8 type must be the planned one.
        k = T.kv_bits(k, "paged_kv_cache", plan.get("kv_dtype"))[0]  # shared_prefix="auto" plans 16-bit caches
        v = T.kv_bits(v, "paged_kv_cache", plan.get("kv_dtype"))[0]
        out, lse = self._outputs(q, out, lse, return_lse)
        sinks = W.check_sinks(sinks, q, plan["num_qo_heads"])
        if sinks is not None and lse is None:
            lse = T.empty(q, q.shape[:2], "float32")
        n = plan["total_q"]
        if plan.get("on_device") and (q.shape[0] < n or (q.shape[0] > n and not self._use_cuda_graph)):
            raise ValueError(f"q: expected {n} rows (the bound on query rows: after plan(on_device=True) run() covers "
                             f"them, leaving those past the step's queries as they are), got {q.shape[0]}")
        if plan.get("shared_prefix") is not None:  # the shared-prefix cascade (shared_prefix="auto")
            if plan["k_scale_tensor"] is not None or plan["v_scale_tensor"] is not None:
                raise TypeError("k_scale, v_scale: expected floats with shared_prefix=\"auto\" (16-bit caches), "
                                "got a tensor")
            vs = None if plan["v_scale"] == 1.0 else plan["v_scale"]
            plan["shared_prefix"].run(q, paged_kv_cache, out, lse, plan["sm_scale"], vs, sinks)
            return (out, C.finish_lse(lse, lse_base)) if return_lse else out
        with T.on_device_of(q):
            self._launcher().run(T.arg(self._rows(q, n)), T.arg(k), T.arg(v), self._rows(out, n), self._rows(lse, n),
                                 plan["sm_scale"], T.stream_of(q), plan["mask"], pdl=plan["pdl"],
                                 v_scale=plan["v_scale"], k_scale_tensor=plan["k_scale_tensor"],
                                 v_scale_tensor=plan["v_scale_tensor"],
                                 **W.run_pos_encoding_args(plan["rope"], plan["alibi_slopes"]))
            if sinks is not None:
                W.apply_sinks(self._rows(out, n), self._rows(lse, n), sinks)
        if not return_lse:
            return out
        C.finish_lse(self._rows(lse, n), lse_base)
        return out, lse

    run_return_lse = functools.partialmethod(run, return_lse=True)

    def forward(self, q, paged_kv_cache, causal=False, pos_encoding_mode="NONE", use_fp16_qk_reduction=False,
                k_scale=None, v_scale=None, window_left=-1, logits_soft_cap=None, sm_scale=None, rope_scale=None,
                rope_theta=None):
        """FlashInfer's deprecated plan-options-at-run call: these options replace those of the last plan() (here
        and for later runs; plan() runs again when they differ, since the kernel is chosen at plan()), then run()."""
        self._replan(causal=causal, pos_encoding_mode=pos_encoding_mode, use_fp16_qk_reduction=use_fp16_qk_reduction,
                     window_left=window_left, logits_soft_cap=logits_soft_cap, sm_scale=sm_scale,
                     rope_scale=rope_scale, rope_theta=rope_theta)
        return self.run(q, paged_kv_cache, k_scale=k_scale, v_scale=v_scale)

    def forward_return_lse(self, q, paged_kv_cache, causal=False, pos_encoding_mode="NONE",
                           use_fp16_qk_reduction=False, k_scale=None, v_scale=None, window_left=-1,
                           logits_soft_cap=None, sm_scale=None, rope_scale=None, rope_theta=None):
        """forward() returning (out, lse), lse in base 2."""
        self._replan(causal=causal, pos_encoding_mode=pos_encoding_mode, use_fp16_qk_reduction=use_fp16_qk_reduction,
                     window_left=window_left, logits_soft_cap=logits_soft_cap, sm_scale=sm_scale,
                     rope_scale=rope_scale, rope_theta=rope_theta)
        return self.run(q, paged_kv_cache, k_scale=k_scale, v_scale=v_scale, return_lse=True)


# FlashInfer's flashinfer.prefill also holds the single-request functions.
from ._single_prefill import single_prefill_with_kv_cache, single_prefill_with_kv_cache_return_lse  # noqa: E402,F401
