"""Prefill / append attention (FlashInfer's ``flashinfer.prefill`` names).

BatchPrefillWithPagedKVCacheWrapper, BatchPrefillWithRaggedKVCacheWrapper,
BlockSparseAttentionWrapper and single_prefill_with_kv_cache keep FlashInfer's
signatures. All four run one tensor-core kernel family (the FA2 template of
the C++ BatchPrefill): only the addresses of the KV rows differ between a
paged cache, ragged KV and a block-sparse matrix (paper section 3.2.1).
Options Tessera does not implement yet (sliding windows, soft-capping, RoPE,
a value head dimension different from the query/key one, quantization scales,
masks for block-sparse attention) raise ValueError instead of being silently
ignored.

``causal=True`` is FlashInfer's bottom-right aligned mask: in a request with
q_len queries and kv_len keys, query i sees keys j <= i + kv_len - q_len (a
query that sees no key gets o = 0 and lse = -inf). All LSEs are in **base 2**.

Custom masks (``custom_mask=`` / ``packed_custom_mask=`` of the paged and
ragged plan() and of single_prefill, as FlashInfer): request i's boolean mask
[qo_len_i, kv_len_i] (True = visible), ``custom_mask`` the flat concatenation
over requests, ``packed_custom_mask`` the same bits packed per request with
``tessera.packbits(m.reshape(-1), bitorder="little")`` (bytes concatenated;
``segment_packbits`` packs a whole batch). plan() derives the byte offsets from
the lengths and checks the sizes; with a mask, causal must be False (put the
causal part into the mask). Rows that see no key get o = 0 and lse = -inf.
"""

import functools
import numbers

from . import _masks as M
from . import _tensors as T
from . import _wrapper_util as W
from ._native import _C


def _reject_prefill_options(mask_names, masks, head_dim_qk, head_dim_vo, pos_encoding_mode, rope_scale, rope_theta,
                            rope_ok=True):
    """Rejects what these wrappers do not support; returns W.pos_encoding_arg's (rope, scale, theta)
    (rope_ok=False: only pos_encoding_mode "NONE")."""
    for name, value in zip(mask_names, masks):
        if value is not None:
            raise ValueError(f"{name}: custom attention masks are not supported yet")
    if head_dim_vo is not None and head_dim_vo != head_dim_qk:
        raise ValueError(f"head_dim_vo={head_dim_vo}: a value head dimension different from head_dim_qk "
                         f"({head_dim_qk}) is not supported yet")
    if rope_ok:
        return W.pos_encoding_arg(pos_encoding_mode, rope_scale, rope_theta)
    W.reject_unsupported(pos_encoding_mode, None, None, None, rope_scale, rope_theta)
    return False, 1.0, 1e4


def _indptr(x, name):
    arr = W.host_ints(x, name)
    if arr.size < 1:
        raise ValueError(f"{name}: expected batch_size + 1 >= 1 entries, got 0")
    return arr


class _PrefillWrapper(W.PlannedWrapper):
    """What the three batch wrappers share: options, workspace bounds, plan bookkeeping and run() outputs."""

    def __init__(self, float_workspace_buffer, kv_layout, use_cuda_graph, backend, jit_args):
        W.init_paged_wrapper(self, float_workspace_buffer, kv_layout, use_cuda_graph, backend, jit_args)
        # Tessera-only knobs (not in FlashInfer's signature): the query tile
        # (0 = chosen by the heuristic at the first plan), an SM cap, the
        # tile override (cta_kv, warps_q, warps_kv, stages; 0 = heuristic)
        # and the Hopper kernel's CTA pairs (2 = on; 0 = auto, off).
        self._cta_q = 0
        self._max_sms = 0
        self._tile = (0, 0, 0, 0)
        self._cluster = 0
        self._mask_buf = None  # custom_mask_buf: where CUDA-graph mode copies the packed mask
        self._config_key = self._config_checked = None  # _config()'s last checked arguments and result

    @property
    def cta_q(self):
        """Query rows per CTA tile chosen at the first plan (None before)."""
        return self._native.cta_q if self._native is not None else None

    @property
    def grid(self):
        """(CTAs per head group, CTAs per cluster) of the persistent kernel, fixed at the first plan (None before)."""
        return (self._native.ctas_per_head, self._native.cluster) if self._native is not None else None

    def _fix_batch(self, buffers):
        """max_batch from FlashInfer's index buffers: (name, buffer, entries beyond the batch size)."""
        for name, buf, extra in buffers:
            if buf is None:
                continue
            n = W.positive_int(len(buf) - extra, f"{name} length" + (f" - {extra}" if extra else ""))
            if self._fixed_batch is not None and n != self._fixed_batch:
                raise ValueError(f"{name}: expected a length giving batch size {self._fixed_batch} like the other "
                                 f"index buffers, got {len(buf)} entries")
            self._fixed_batch = n

    def _config(self, num_qo_heads, num_kv_heads, head_dim, head_dim_name, page_size, layout, causal, sm_scale,
                q_data_type, kv_data_type, o_data_type, window_left=-1, logits_soft_cap=None, masked=False,
                rope=(False, 1.0, 1e4)):
        """The C++ configuration tuple (constructor order), the softmax scale and the variant options
        {window_left, logits_soft_cap, rope}; validates without a GPU (masked: a custom mask is given;
        rope: W.pos_encoding_arg's result).

        The arguments rarely change between steps: the checks (and the C++
        probe, which builds the variant) run when they do, as in decode."""
        args = (num_qo_heads, num_kv_heads, head_dim, head_dim_name, page_size, layout, causal, sm_scale, q_data_type,
                kv_data_type, o_data_type, window_left, logits_soft_cap, masked, rope[0])
        key = args + tuple(map(type, args))  # 1, 1.0 and True compare equal; their checks differ
        if key == self._config_key:
            return self._config_checked
        window, cap = W.plan_options(window_left, logits_soft_cap)
        W.check_rope_options(rope, window, cap)
        options = dict(window_left=window, logits_soft_cap=cap, rope=rope[0])
        q_dt = W.dtype_arg(q_data_type, "q_data_type")
        kv_dt = q_dt if kv_data_type is None else W.dtype_arg(kv_data_type, "kv_data_type")
        o_dt = q_dt if o_data_type is None else W.dtype_arg(o_data_type, "o_data_type")
        hq = W.positive_int(num_qo_heads, "num_qo_heads")
        hkv = W.positive_int(num_kv_heads, "num_kv_heads")
        d = W.positive_int(head_dim, head_dim_name)
        ps = W.positive_int(page_size, "page_size")
        scale = W.sm_scale_arg(sm_scale)
        config = (q_dt, kv_dt, o_dt, d, hq, hkv, ps, layout, bool(causal))
        # The C++ checks of dtypes, heads, head_dim and options, without touching a GPU.
        _C.BatchPrefill.workspace_size(*config, 1, 1, 1, num_sms=1, custom_mask=masked, **options)
        self._config_key, self._config_checked = key, (config, scale, options)
        return config, scale, options

    def _plan(self, config, scale, options, counts, bounds, plan_fn, mask=None, rope=(False, 1.0, 1e4), **planned):
        """Builds the C++ object if needed (a custom-mask one when mask, an M.MaskPlan, is given), then
        plan_fn(native, stream) on torch's current stream."""
        buf = self._float_workspace_buffer
        W.check_workspace_buffer_once(self)
        knobs = dict(options, cta_q=self._cta_q, max_sms=self._max_sms, backend=self._backend, tile=self._tile,
                     cluster=self._cluster, custom_mask=mask is not None)

        def size(want, device):
            return _C.BatchPrefill.workspace_size(*config, *want, device=device, **knobs)

        def make(want, ws, ws_bytes, host, host_bytes, device):
            return _C.BatchPrefill(*config, *want, ws, ws_bytes, host, host_bytes, device, **knobs)

        W.ensure_native(self, config + (mask is not None, options["window_left"], options["logits_soft_cap"],
                                        options["rope"]), counts, bounds, size, make)
        with T.on_device_of(buf):
            bits = None if mask is None else mask.device_bits(buf.device, self._mask_buf, self._use_cuda_graph)
            plan_fn(self._native, T.stream_of(buf))
        self._planned = dict(planned, o_dtype=config[2], sm_scale=scale, mask=bits, window_left=options["window_left"],
                             rope=rope, head_dim=config[3])

    def _check_run(self, args, q_scale, k_scale, v_scale, enable_pdl, window_left=None):
        if self._planned is None:
            raise ValueError("run: expected plan() to be called first")
        if args:
            raise ValueError("run: extra positional arguments (custom JIT variants) are not supported yet")
        scale, vs = W.run_scales(self._planned["sm_scale"], self._planned["head_dim"], q_scale, k_scale, v_scale)
        W.check_run_window(window_left, self._planned["window_left"])
        return dict(self._planned, pdl=bool(enable_pdl), sm_scale=scale, v_scale=1.0 if vs is None else vs)

    def _outputs(self, q, out, lse, return_lse):
        return W.run_outputs(q, out, lse, return_lse, self._planned["o_dtype"])

    def _rows(self, x, n):
        """The first n rows of x in CUDA-graph mode, where tensors are allocated for the largest step and a
        plan may use fewer rows (the kernel reads the planned lengths from the workspace, so a graph captured
        with these tensors stays valid); x itself otherwise, so a mismatch is reported by the C++ checks."""
        if x is not None and self._use_cuda_graph and T.is_torch(x) and x.dim() >= 1 and x.shape[0] > n:
            return x[:n]
        return x

    def end_forward(self):
        """Kept for FlashInfer compatibility; nothing to release."""


class BatchPrefillWithPagedKVCacheWrapper(_PrefillWrapper):
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
    the GPU once) as long as float_workspace_buffer is large enough.
    """

    def __init__(self, float_workspace_buffer, kv_layout="NHD", use_cuda_graph=False, qo_indptr_buf=None,
                 paged_kv_indptr_buf=None, paged_kv_indices_buf=None, paged_kv_last_page_len_buf=None,
                 custom_mask_buf=None, mask_indptr_buf=None, backend="auto", jit_args=None):
        """
        Args:
            float_workspace_buffer: a torch uint8 CUDA tensor (FlashInfer users
                allocate 128 MB) used as the device workspace. It must stay
                alive and unused by anything else while the wrapper is in use.
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
            jit_args: must be None (custom variants are not supported yet).
        """
        super().__init__(float_workspace_buffer, kv_layout, use_cuda_graph, backend, jit_args)
        # Kept only so the caller's buffers outlive the wrapper as in FlashInfer.
        self._buffers = (qo_indptr_buf, paged_kv_indptr_buf, paged_kv_indices_buf, paged_kv_last_page_len_buf,
                         custom_mask_buf, mask_indptr_buf)
        self._fix_batch((("qo_indptr_buf", qo_indptr_buf, 1), ("paged_kv_indptr_buf", paged_kv_indptr_buf, 1),
                         ("paged_kv_last_page_len_buf", paged_kv_last_page_len_buf, 0),
                         ("mask_indptr_buf", mask_indptr_buf, 1)))
        self._mask_buf = custom_mask_buf
        self._fixed_pages = W.buffer_length(paged_kv_indices_buf, "paged_kv_indices_buf")

    def plan(self, qo_indptr, paged_kv_indptr, paged_kv_indices, paged_kv_last_page_len, num_qo_heads, num_kv_heads,
             head_dim_qk, page_size, head_dim_vo=None, custom_mask=None, packed_custom_mask=None, causal=False,
             pos_encoding_mode="NONE", use_fp16_qk_reduction=False, sm_scale=None, window_left=-1,
             logits_soft_cap=None, rope_scale=None, rope_theta=None, q_data_type="float16", kv_data_type=None,
             o_data_type=None, non_blocking=True):
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
            head_dim_qk: 64, 128 or 256; head_dim_vo must be None or equal.
            page_size: tokens per page.
            causal: bottom-right aligned causal mask (see the module doc).
            custom_mask: bool [sum(qo_len * kv_len)], each request's
                row-major [qo_len, kv_len] mask in turn (any device; packed
                here), or packed_custom_mask: those bits packed per request
                with little bit order (uint8). At most one; causal=False.
            window_left: -1 (no window), or the keys (>= 0) a query sees to
                the left of its bottom-right-aligned position (qo_idx + kv_len
                - qo_len); with causal a sliding window.
            logits_soft_cap: None or 0.0 (off), or a cap > 0 on the logits
                (cap * tanh(logit / cap), logit = q.k * sm_scale). Window and
                cap combine (Gemma 2); neither with a custom mask yet.
            pos_encoding_mode: "NONE", or "ROPE_LLAMA": Llama RoPE fused into
                the kernel, query i of a request rotated at position i +
                kv_len - qo_len and key j at j (half-split pairs over all
                head_dim features); not with a window, a soft cap or a
                custom mask yet.
            rope_scale, rope_theta: with ROPE_LLAMA, positions are divided by
                rope_scale (None: 1), frequency base rope_theta (None: 1e4);
                None otherwise.
            use_fp16_qk_reduction: accepted; Tessera always accumulates q.k
                in float32.
            sm_scale: softmax scale; None means 1 / sqrt(head_dim_qk).
            q_data_type, kv_data_type, o_data_type: float16 or bfloat16
                (torch dtype or name; kv must equal q); kv and o default to q's.
            non_blocking: accepted; the schedule upload is always asynchronous.
        """
        self._planned = None  # a failed plan() leaves nothing to run
        rope = _reject_prefill_options((), (), head_dim_qk, head_dim_vo, pos_encoding_mode, rope_scale, rope_theta)
        masked = custom_mask is not None or packed_custom_mask is not None
        config, scale, options = self._config(num_qo_heads, num_kv_heads, head_dim_qk, "head_dim_qk", page_size,
                                              self._kv_layout, causal, sm_scale, q_data_type, kv_data_type,
                                              o_data_type, window_left, logits_soft_cap, masked, rope)
        qo = _indptr(qo_indptr, "qo_indptr")
        kv = _indptr(paged_kv_indptr, "paged_kv_indptr")
        last = W.host_ints(paged_kv_last_page_len, "paged_kv_last_page_len")
        batch, total_q = qo.size - 1, int(qo[-1])
        if kv.size != qo.size:
            raise ValueError(f"paged_kv_indptr: expected {qo.size} entries (like qo_indptr), got {kv.size}")
        # A CUDA tensor of ids stays on the GPU (see W.page_ids), except with
        # a custom mask, whose plan takes host ids.
        indices = W.page_ids(paged_kv_indices, int(kv[-1]), "paged_kv_indices", self._float_workspace_buffer,
                             on_device=not masked)
        mask = None
        if custom_mask is not None or packed_custom_mask is not None:
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
                   mask=mask, rope=rope, total_q=total_q)

    begin_forward = plan

    def run(self, q, paged_kv_cache, *args, q_scale=None, k_scale=None, v_scale=None, out=None, lse=None,
            return_lse=False, enable_pdl=None, window_left=None):
        """Attention of the planned step.

        Args:
            q: [qo_indptr[-1], num_qo_heads, head_dim] CUDA tensor of q_data_type.
            paged_kv_cache: (k_cache, v_cache), each [num_pages, page_size,
                num_kv_heads, head_dim] (NHD) or [num_pages, num_kv_heads,
                page_size, head_dim] (HND), or one interleaved tensor
                [num_pages, 2, ...] (K at index 0, V at 1).
            q_scale, k_scale, v_scale: None or floats (serving engines pass
                1.0 for 16-bit caches): q_scale * k_scale multiplies the
                softmax scale, v_scale the output, as in FlashInfer.
            out: optional output like q (o_data_type); allocated when None.
            lse: optional float32 [rows, num_qo_heads]; allocated when None
                and return_lse.
            return_lse: also return the LSE, in **base 2**.
            enable_pdl: programmatic dependent launch (sm_90+; ignored
                before), as for BatchDecodeWithPagedKVCacheWrapper.run.
            window_left: None or -1.

        Returns:
            out, or (out, lse) with return_lse.
        """
        plan = self._check_run(args, q_scale, k_scale, v_scale, enable_pdl, window_left)
        k, v = W.unpack_paged_kv_cache(paged_kv_cache)
        out, lse = self._outputs(q, out, lse, return_lse)
        n = plan["total_q"]
        with T.on_device_of(q):
            self._native.run(T.arg(self._rows(q, n)), T.arg(k), T.arg(v), self._rows(out, n), self._rows(lse, n),
                             plan["sm_scale"], T.stream_of(q), plan["mask"], pdl=plan["pdl"],
                             rope_scale=plan["rope"][1], rope_theta=plan["rope"][2], v_scale=plan["v_scale"])
        return (out, lse) if return_lse else out

    run_return_lse = functools.partialmethod(run, return_lse=True)


class BatchPrefillWithRaggedKVCacheWrapper(_PrefillWrapper):
    """Batch prefill attention over ragged (contiguous, unpaged) KV (FlashInfer's wrapper of the same name).

    Request i's keys are rows kv_indptr[i] .. kv_indptr[i+1] of one K and one
    V tensor: [total_kv, num_kv_heads, head_dim] (NHD) or [num_kv_heads,
    total_kv, head_dim] (HND, read through a strided view: no copy). Same
    plan / run contract and workspace bounds as
    BatchPrefillWithPagedKVCacheWrapper (max_pages is 1 here); in CUDA-graph
    mode q and k / v may have more rows than the plan uses.
    """

    def __init__(self, float_workspace_buffer, kv_layout="NHD", use_cuda_graph=False, qo_indptr_buf=None,
                 kv_indptr_buf=None, custom_mask_buf=None, mask_indptr_buf=None, backend="auto", jit_args=None):
        """
        Args:
            float_workspace_buffer: a torch uint8 CUDA tensor used as the device workspace.
            kv_layout: "NHD" or "HND".
            use_cuda_graph: fix the workspace bounds at the first plan().
            qo_indptr_buf, kv_indptr_buf, mask_indptr_buf: optional 1-D tensors whose length - 1 fixes max_batch.
            custom_mask_buf: where CUDA-graph mode copies the packed custom mask (as the paged wrapper).
            backend: "auto", "fa2" or "fa3" (as above). jit_args: must be None.
        """
        super().__init__(float_workspace_buffer, kv_layout, use_cuda_graph, backend, jit_args)
        self._buffers = (qo_indptr_buf, kv_indptr_buf, custom_mask_buf, mask_indptr_buf)
        self._fix_batch((("qo_indptr_buf", qo_indptr_buf, 1), ("kv_indptr_buf", kv_indptr_buf, 1),
                         ("mask_indptr_buf", mask_indptr_buf, 1)))
        self._mask_buf = custom_mask_buf

    def plan(self, qo_indptr, kv_indptr, num_qo_heads, num_kv_heads, head_dim_qk, head_dim_vo=None, custom_mask=None,
             packed_custom_mask=None, causal=False, pos_encoding_mode="NONE", use_fp16_qk_reduction=False,
             window_left=-1, logits_soft_cap=None, sm_scale=None, rope_scale=None, rope_theta=None,
             q_data_type="float16", kv_data_type=None, o_data_type=None, non_blocking=True):
        """Plans one step: qo_indptr / kv_indptr are int [batch + 1] row pointers into q and k / v.

        The other arguments (custom masks included) are as for BatchPrefillWithPagedKVCacheWrapper.plan.
        """
        self._planned = None  # a failed plan() leaves nothing to run
        rope = _reject_prefill_options((), (), head_dim_qk, head_dim_vo, pos_encoding_mode, rope_scale, rope_theta)
        # Ragged KV has no pages: the C++ object sees page size 1 and NHD rows
        # (run() hands HND over as a strided NHD view).
        masked = custom_mask is not None or packed_custom_mask is not None
        config, scale, options = self._config(num_qo_heads, num_kv_heads, head_dim_qk, "head_dim_qk", 1, "NHD", causal,
                                              sm_scale, q_data_type, kv_data_type, o_data_type, window_left,
                                              logits_soft_cap, masked, rope)
        qo = _indptr(qo_indptr, "qo_indptr")
        kv = _indptr(kv_indptr, "kv_indptr")
        if kv.size != qo.size:
            raise ValueError(f"kv_indptr: expected {qo.size} entries (like qo_indptr), got {kv.size}")
        batch, total_q = qo.size - 1, int(qo[-1])
        mask = None
        if custom_mask is not None or packed_custom_mask is not None:
            mask = M.MaskPlan(custom_mask, packed_custom_mask, causal, M.indptr_lengths(qo, "qo_indptr"),
                              M.indptr_lengths(kv, "kv_indptr"))
        bounds = (W.Bound("max_batch", "qo_indptr", "batch size", self._fixed_batch, "qo_indptr_buf / kv_indptr_buf"),
                  W.Bound("max_total_q", "qo_indptr", "total query length"),
                  W.Bound("max_pages", "kv_indptr", "page count"))
        self._plan(config, scale, options, (max(batch, 1), max(total_q, 1), 1), bounds,
                   lambda n, s: n.plan_ragged(qo, kv, s, None if mask is None else mask.indptr), mask=mask,
                   rope=rope, total_q=total_q, total_kv=int(kv[-1]))

    begin_forward = plan

    def _nhd(self, x, name):
        T.framework(x, name)
        if len(x.shape) != 3:
            raise ValueError(f"{name}: expected a 3-D tensor ({self._kv_layout}), got shape {tuple(x.shape)}")
        return x.swapaxes(0, 1) if self._kv_layout == "HND" else x

    def run(self, q, k, v, *args, q_scale=None, k_scale=None, v_scale=None, out=None, lse=None, return_lse=False,
            enable_pdl=None):
        """Attention of the planned step: q [qo_indptr[-1], num_qo_heads, head_dim]; k, v as in the class doc.

        out, lse, return_lse and the scale / PDL options are as for the paged wrapper's run().
        """
        plan = self._check_run(args, q_scale, k_scale, v_scale, enable_pdl)
        k, v = self._nhd(k, "k"), self._nhd(v, "v")
        out, lse = self._outputs(q, out, lse, return_lse)
        n, nk = plan["total_q"], plan["total_kv"]
        with T.on_device_of(q):
            self._native.run_ragged(T.arg(self._rows(q, n)), T.arg(self._rows(k, nk)), T.arg(self._rows(v, nk)),
                                    self._rows(out, n), self._rows(lse, n), plan["sm_scale"], T.stream_of(q),
                                    plan["mask"], pdl=plan["pdl"], rope_scale=plan["rope"][1],
                                    rope_theta=plan["rope"][2], v_scale=plan["v_scale"])
        return (out, lse) if return_lse else out

    run_return_lse = functools.partialmethod(run, return_lse=True)


class BlockSparseAttentionWrapper(_PrefillWrapper):
    """Block-sparse attention (FlashInfer's wrapper of the same name).

    The attention matrix has M query rows and N KV columns in blocks of
    R x C: block row r (queries r*R .. (r+1)*R - 1) attends to the column
    blocks indices[indptr[r] .. indptr[r+1]] (keys c*C .. (c+1)*C - 1 each).
    Each block row runs as one request whose pages are its column blocks, so
    causal=True masks bottom-right within the keys a block row gathers (in
    indices order), as FlashInfer does. The workspace bounds follow the
    plans (no CUDA-graph mode).
    """

    def __init__(self, float_workspace_buffer, backend="auto"):
        super().__init__(float_workspace_buffer, "NHD", False, backend, None)

    def plan(self, indptr, indices, M, N, R, C, num_qo_heads, num_kv_heads, head_dim, mask=None, packed_mask=None,
             causal=False, pos_encoding_mode="NONE", use_fp16_qk_reduction=False, logits_soft_cap=None, sm_scale=None,
             rope_scale=None, rope_theta=None, q_data_type="float16", kv_data_type=None, o_data_type=None,
             non_blocking=True):
        """Plans the block-sparse pattern.

        Args:
            indptr: int [M / R + 1] block-row pointers.
            indices: int [indptr[-1]] column-block indices (< N / C).
            M, N: rows of q and of k / v (multiples of R and C).
            R, C: block size.
            mask, packed_mask: must be None (not supported yet).
            The other arguments are as for BatchPrefillWithPagedKVCacheWrapper.plan.
        """
        self._planned = None  # a failed plan() leaves nothing to run
        _reject_prefill_options(("mask", "packed_mask"), (mask, packed_mask), head_dim, None, pos_encoding_mode,
                                rope_scale, rope_theta, rope_ok=False)
        R, C = W.positive_int(R, "R"), W.positive_int(C, "C")
        for name, value, block, size in (("M", M, "R", R), ("N", N, "C", C)):
            if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 0 or value % size:
                raise ValueError(f"{name}: expected a non-negative multiple of {block}={size}, got {value!r}")
        M, N = int(M), int(N)
        config, scale, options = self._config(num_qo_heads, num_kv_heads, head_dim, "head_dim", C, "NHD", causal,
                                              sm_scale, q_data_type, kv_data_type, o_data_type,
                                              logits_soft_cap=logits_soft_cap)
        ip = _indptr(indptr, "indptr")
        idx = W.host_ints(indices, "indices")
        if ip.size != M // R + 1:
            raise ValueError(f"indptr: expected M / R + 1 = {M // R + 1} entries, got {ip.size}")
        bounds = (W.Bound("max_batch", "indptr", "block-row count"), W.Bound("max_total_q", "M", "row count"),
                  W.Bound("max_pages", "indices", "block count"))
        counts = (max(M // R, 1), max(M, 1), max(int(idx.size), 1))
        self._plan(config, scale, options, counts, bounds, lambda n, s: n.plan_bsr(ip, idx, M, N, R, C, s), total_q=M,
                   N=N, C=C)

    begin_forward = plan

    @staticmethod
    def _pages(x, name, N, C):
        """k / v [N, Hkv, D] as N / C pages of C tokens (a view: splitting a dimension never copies)."""
        T.framework(x, name)
        if len(x.shape) != 3 or x.shape[0] != N:
            raise ValueError(f"{name}: expected a 3-D tensor [N={N}, num_kv_heads, head_dim], got shape "
                             f"{tuple(x.shape)}")
        return x.reshape((N // C, C) + tuple(x.shape[1:]))

    def run(self, q, k, v, out=None, lse=None, return_lse=False, *, enable_pdl=None):
        """Attention of the planned pattern: q [M, num_qo_heads, head_dim]; k, v [N, num_kv_heads, head_dim].

        Returns out [M, num_qo_heads, head_dim] (o_data_type), or (out, lse) with
        return_lse (float32 [M, num_qo_heads], base 2).
        """
        plan = self._check_run((), None, None, None, enable_pdl)
        kp, vp = self._pages(k, "k", plan["N"], plan["C"]), self._pages(v, "v", plan["N"], plan["C"])
        out, lse = self._outputs(q, out, lse, return_lse)
        with T.on_device_of(q):
            self._native.run(T.arg(q), T.arg(kp), T.arg(vp), out, lse, plan["sm_scale"], T.stream_of(q),
                             pdl=plan["pdl"])
        return (out, lse) if return_lse else out


# ======================================================================= single request
# One ragged wrapper and workspace per device, reused across calls. Calls are
# ordered by the stream (torch's current one): interleaving calls on different
# streams without synchronizing them is not supported.
_SINGLE = {}


def _single_wrapper(q, config_args, masked, options):
    """The cached ragged wrapper of q's device, its workspace large enough for config_args' bounds."""
    torch = T._torch()
    dev = q.device.index if q.device.index is not None else torch.cuda.current_device()
    need, _ = _C.BatchPrefill.workspace_size(*config_args, device=dev, custom_mask=masked, **options)
    entry = _SINGLE.get(dev)
    if entry is None or entry[0].numel() < need:
        if entry is not None:
            torch.cuda.synchronize(q.device)  # queued work may still use the old workspace and staging buffer
        size = max(need, 2 * entry[0].numel()) if entry is not None else need
        buf = torch.empty(size, dtype=torch.uint8, device=q.device)
        entry = (buf, BatchPrefillWithRaggedKVCacheWrapper(buf))
        _SINGLE[dev] = entry
    return entry[1]


def single_prefill_with_kv_cache(q, k, v, custom_mask=None, packed_custom_mask=None, causal=False, kv_layout="NHD",
                                 pos_encoding_mode="NONE", use_fp16_qk_reduction=False, sm_scale=None, window_left=-1,
                                 logits_soft_cap=None, rope_scale=None, rope_theta=None, return_lse=False):
    """Prefill / append attention of one request over contiguous KV.

    Args:
        q: [qo_len, num_qo_heads, head_dim], float16 or bfloat16 on the GPU
            (float32 is also accepted on the CPU).
        k, v: [kv_len, num_kv_heads, head_dim] for kv_layout "NHD", or
            [num_kv_heads, kv_len, head_dim] for "HND" (read through a strided
            view, no copy); same shape and dtype.
        causal: bottom-right aligned causal mask (query i sees keys
            j <= i + kv_len - qo_len).
        custom_mask: bool [qo_len, kv_len] (True = visible), or
            packed_custom_mask: its flattened bits packed with little bit
            order (uint8, packbits(m.reshape(-1), bitorder="little")). At
            most one, and causal=False.
        window_left: -1 (no window), or the keys (>= 0) query i sees to the
            left of its position i + kv_len - qo_len.
        logits_soft_cap: None or 0.0 (off), or a cap > 0 on the logits
            (cap * tanh(logit / cap)); neither option with a custom mask yet.
        pos_encoding_mode: "NONE", or "ROPE_LLAMA" (Llama RoPE fused into the
            kernel: query i at position i + kv_len - qo_len, key j at j); not
            with a window, a soft cap or a custom mask yet.
        rope_scale, rope_theta: with ROPE_LLAMA (None: 1 and 1e4), else None.
        use_fp16_qk_reduction: accepted; q.k is always accumulated in float32.
        sm_scale: softmax scale; None means 1 / sqrt(head_dim).
        return_lse: also return the log-sum-exp.

    CUDA tensors run the batch prefill kernel (a batch of one, through a
    ragged wrapper and workspace cached per device; changing dtypes, heads,
    head_dim or causal between calls waits for the GPU once). CPU inputs
    (numpy or torch CPU) run the C++ CPU path (float accumulation).

    Returns:
        o like q, or (o, lse) with return_lse: lse float32 [qo_len,
        num_qo_heads] in **base 2**.
    """
    if kv_layout not in W.LAYOUTS:
        raise ValueError(f"kv_layout: expected 'NHD' or 'HND', got {kv_layout!r}")
    rope = _reject_prefill_options((), (), None, None, pos_encoding_mode, rope_scale, rope_theta)
    window, cap = W.plan_options(window_left, logits_soft_cap)
    W.check_rope_options(rope, window, cap)
    if (custom_mask is not None or packed_custom_mask is not None) and (window != -1 or cap != 0.0 or rope[0]):
        raise ValueError(f"window_left / logits_soft_cap / pos_encoding_mode: expected -1 / None / 'NONE' with a "
                         f"custom mask (not supported together yet), got {window_left} / {logits_soft_cap} / "
                         f"{pos_encoding_mode!r}")
    T.common_framework(q=q, k=k, v=v)
    if len(q.shape) != 3:
        raise ValueError(f"q: expected a 3-D tensor [qo_len, num_qo_heads, head_dim], got shape {tuple(q.shape)}")
    for name, x in (("k", k), ("v", v)):
        if len(x.shape) != 3:
            raise ValueError(f"{name}: expected a 3-D tensor ({kv_layout}), got shape {tuple(x.shape)}")
    scale = W.sm_scale_arg(sm_scale)
    if kv_layout == "HND":  # strided NHD views, no copy
        k, v = k.swapaxes(0, 1), v.swapaxes(0, 1)
    masks = dict(custom_mask=custom_mask, packed_custom_mask=packed_custom_mask)
    mask = None
    if custom_mask is not None or packed_custom_mask is not None:  # checked here, before any GPU work
        mask = M.MaskPlan(custom_mask, packed_custom_mask, causal, [int(q.shape[0])], [int(k.shape[0])])
    if T.is_cuda(q):
        o, lse = _single_prefill_gpu(q, k, v, bool(causal), sm_scale, return_lse, masks, window, cap, rope)
    else:
        o, lse = _single_prefill_cpu(q, k, v, bool(causal), scale, mask, window, cap, rope)
    return (o, lse) if return_lse else o


def single_prefill_with_kv_cache_return_lse(q, k, v, **kwargs):
    """single_prefill_with_kv_cache(..., return_lse=True): returns (o, lse), lse in base 2."""
    return single_prefill_with_kv_cache(q, k, v, **dict(kwargs, return_lse=True))


def _single_prefill_gpu(q, k, v, causal, sm_scale, return_lse, masks, window, cap, rope):
    qd = T.dtype_name(q, "q", ("float16", "bfloat16"))
    kd = T.dtype_name(k, "k", ("float16", "bfloat16"))
    for name, x in (("k", k), ("v", v)):
        if T.device_of(x) != T.device_of(q):
            raise TypeError(f"{name}: expected a tensor on {T.device_of(q)} like q, got one on {T.device_of(x)}")
    qo_len, kv_len = int(q.shape[0]), int(k.shape[0])
    hq, d, hkv = int(q.shape[1]), int(q.shape[2]), int(k.shape[1])
    # Checks heads, head_dim and dtypes (the C++ messages name them) before anything is allocated.
    config_args = (qd, kd, qd, d, hq, hkv, 1, "NHD", causal, 1, max(qo_len, 1), 1)
    wrapper = _single_wrapper(q, config_args, any(m is not None for m in masks.values()),
                              dict(window_left=window, logits_soft_cap=cap, rope=rope[0]))
    rope_args = dict(pos_encoding_mode="ROPE_LLAMA", rope_scale=rope[1], rope_theta=rope[2]) if rope[0] else {}
    wrapper.plan([0, qo_len], [0, kv_len], hq, hkv, d, causal=causal, sm_scale=sm_scale, q_data_type=qd,
                 kv_data_type=kd, window_left=window, logits_soft_cap=cap, **masks, **rope_args)
    return wrapper.run(q, k, v, return_lse=True) if return_lse else (wrapper.run(q, k, v), None)


def _single_prefill_cpu(q, k, v, causal, scale, mask, window, cap, rope):
    """CPU path: the C++ CPU attention (float accumulation), o in q's dtype."""
    for name, x in (("k", k), ("v", v)):
        if T.device_of(x) != "cpu":
            raise TypeError(f"{name}: expected a CPU tensor like q, got one on {T.device_of(x)}")
    for name, x in (("q", q), ("k", k), ("v", v)):
        T.dtype_name(x, name)
    qo_len, kv_len = int(q.shape[0]), int(k.shape[0])
    o, lse = T.empty(q, q.shape), T.empty(q, q.shape[:2], "float32")
    _C.cpu_attention_ragged(T.arg(q), [0, qo_len], T.arg(k), T.arg(v), [0, kv_len], T.arg(o), T.arg(lse), scale,
                            causal, custom_mask=None if mask is None else mask.host_mask(), logits_soft_cap=cap,
                            window_left=window, rope=rope[0], rope_scale=rope[1], rope_theta=rope[2])
    return o, lse
