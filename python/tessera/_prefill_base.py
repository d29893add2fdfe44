"""What the batch prefill wrappers share (prefill.py's paged and ragged
wrappers, sparse.py's block-sparse one): option checks, workspace bounds,
plan bookkeeping, run() outputs and FlashInfer's compatibility methods.

All three run one tensor-core kernel family (the FA2 template of the C++
BatchPrefill, or the Hopper one): only the addresses of the KV rows differ
between a paged cache, ragged KV and a block-sparse matrix (paper section
3.2.1).
"""

import numpy as np

from . import _auto_prefix as AP
from . import _compat as C
from . import _tensors as T
from . import _wrapper_util as W
from ._native import _C


# The (head_dim_qk, head_dim_vo) pairs with different dims the kernels take (DeepSeek-style prefill).
UNEQUAL_HEAD_DIMS = ((192, 128),)


def check_head_dim_vo(head_dim_qk, head_dim_vo):
    """head_dim_vo as the bindings take it: 0 for None or head_dim_qk's value, else the value when (head_dim_qk,
    head_dim_vo) is a supported pair (192, 128); NotSupportedError naming head_dim_vo otherwise."""
    if head_dim_vo is None or head_dim_vo == head_dim_qk:
        return 0
    if (head_dim_qk, head_dim_vo) not in UNEQUAL_HEAD_DIMS:
        raise C.not_supported("head_dim_vo", head_dim_vo, f"a value head dimension different from head_dim_qk "
                              f"({head_dim_qk}) is implemented for head_dim_qk 192 with head_dim_vo 128 only")
    return int(head_dim_vo)


def reject_prefill_options(mask_names, masks, head_dim_qk, head_dim_vo, pos_encoding_mode, rope_scale, rope_theta,
                           rope_ok=True):
    """Rejects what these wrappers do not support; returns W.pos_encoding_arg's (rope, scale, theta)
    (rope_ok=False: only pos_encoding_mode "NONE"). head_dim_vo: see check_head_dim_vo."""
    for name, value in zip(mask_names, masks):
        if value is not None:
            raise C.not_supported(name, value, "custom masks are not implemented for this wrapper")
    check_head_dim_vo(head_dim_qk, head_dim_vo)
    if rope_ok:
        return W.pos_encoding_arg(pos_encoding_mode, rope_scale, rope_theta)
    W.reject_unsupported(pos_encoding_mode, None, None, None, rope_scale, rope_theta)
    return False, 1.0, 1e4


def indptr_arg(x, name):
    arr = W.host_ints(x, name)
    if arr.size < 1:
        raise ValueError(f"{name}: expected batch_size + 1 >= 1 entries, got 0")
    return arr


class PrefillWrapper(W.PlannedWrapper):
    """What the three batch wrappers share: options, workspace bounds, plan bookkeeping and run() outputs."""

    def __init__(self, float_workspace_buffer, kv_layout, use_cuda_graph, backend, jit_args, jit_kwargs=None,
                 variant_owns_mask=False):
        W.init_paged_wrapper(self, float_workspace_buffer, kv_layout, use_cuda_graph, backend, jit_args)
        C.refuse_given("custom variants run through tessera.AttentionWrapper", jit_kwargs=jit_kwargs)
        C.refuse_true("variant_owns_mask", variant_owns_mask, "custom variants run through tessera.AttentionWrapper")
        # Tessera-only knobs (not in FlashInfer's signature): the query tile
        # (0 = chosen by the heuristic at the first plan), an SM cap, the
        # tile override (cta_kv, warps_q, warps_kv, stages; 0 = heuristic)
        # and the Hopper kernel's CTA pairs (2 = on; 0 = auto, off), KV head
        # groups (PrefillOptions::group_heads: 0 = auto, 1 = one plan per
        # head, 2 = grouped; fixed at the first plan); for fp8
        # caches on the Hopper kernel, fp8 tensor cores (PrefillOptions::fp8_mma:
        # q as two e4m3 terms and P as e4m3; faster, less exact).
        self._cta_q = 0
        self._max_sms = 0
        self._tile = (0, 0, 0, 0)
        self._cluster = 0
        self._group_heads = 0  # 0: auto (long prompts on 128-row Hopper tiles), 1: one plan per KV head, 2: grouped
        self._fp8_mma = False
        self._mask_buf = None  # custom_mask_buf: where CUDA-graph mode copies the packed mask
        self._config_key = self._config_checked = None  # _config()'s last checked arguments and result
        self._stager = None  # set while pod.py stages this wrapper's run for a fused launch

    def _launcher(self):
        """What run() launches through: the C++ object, or the stager of a fused launch (pod.py), which keeps
        the run's converted arguments instead."""
        return self._stager if self._stager is not None else self._native

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
                rope=(W.POS_NONE, 1.0, 1e4), head_dim_vo=None):
        """The C++ configuration tuple (constructor order), the softmax scale and the variant options
        {window_left, logits_soft_cap, rope, head_dim_vo}; validates without a GPU (masked: a custom mask is
        given; rope: W.pos_encoding_arg's result; head_dim_vo: v's head dim, None for head_dim's).

        The arguments rarely change between steps: the checks (and the C++
        probe, which builds the variant) run when they do, as in decode."""
        args = (num_qo_heads, num_kv_heads, head_dim, head_dim_name, page_size, layout, causal, sm_scale, q_data_type,
                kv_data_type, o_data_type, window_left, logits_soft_cap, masked, rope[0], head_dim_vo)
        key = args + tuple(map(type, args)) + (bool(self._fp8_mma),)  # 1, 1.0 and True compare equal; their checks differ
        if key == self._config_key:
            return self._config_checked
        window, cap = W.plan_options(window_left, logits_soft_cap)
        options = dict(window_left=window, logits_soft_cap=cap, pos_encoding=rope[0],
                       head_dim_vo=check_head_dim_vo(head_dim, head_dim_vo))
        q_dt = W.dtype_arg(q_data_type, "q_data_type")
        kv_dt = q_dt if kv_data_type is None else W.dtype_arg(kv_data_type, "kv_data_type", fp8=True)
        o_dt = q_dt if o_data_type is None else W.dtype_arg(o_data_type, "o_data_type")
        hq = W.positive_int(num_qo_heads, "num_qo_heads")
        hkv = W.positive_int(num_kv_heads, "num_kv_heads")
        d = W.positive_int(head_dim, head_dim_name)
        ps = W.positive_int(page_size, "page_size")
        scale = W.sm_scale_arg(sm_scale)
        config = (q_dt, kv_dt, o_dt, d, hq, hkv, ps, layout, bool(causal))
        # The C++ checks of dtypes, heads, head_dim and options, without touching a GPU.
        _C.BatchPrefill.workspace_size(*config, 1, 1, 1, num_sms=1, custom_mask=masked, fp8_mma=bool(self._fp8_mma),
                                       **options)
        self._config_key, self._config_checked = key, (config, scale, options)
        return config, scale, options

    def _plan(self, config, scale, options, counts, bounds, plan_fn, mask=None, rope=(W.POS_NONE, 1.0, 1e4),
              planner=(True, 0, None), exact=False, prefix=AP.OFF, **planned):
        """Builds the C++ object if needed (a custom-mask one when mask, an M.MaskPlan, is given), then
        plan_fn(native, stream) on torch's current stream. planner: (split_kv, fixed chunk in keys, 0 = off,
        lens() -> (qo_lens, kv_lens) of the step, read only with fixed chunks). exact: the counts are the
        bounds (planning on the GPU; see W.ensure_native). prefix: the C++ wrapper's shared_prefix option
        (min_shared_tokens > 0 turns it on, min_members, min_saved_tokens; -1: its default)."""
        buf = self._float_workspace_buffer
        W.check_workspace_buffer_once(self)
        split, fixed, lens = planner
        knobs = dict(options, cta_q=self._cta_q, max_sms=self._max_sms, backend=self._backend, tile=self._tile,
                     cluster=self._cluster, custom_mask=mask is not None, split_kv=split, fixed_chunk=fixed,
                     shared_prefix=prefix, fp8_mma=bool(self._fp8_mma), group_heads=self._group_heads)
        key = config + (mask is not None, options["window_left"], options["logits_soft_cap"], options["pos_encoding"],
                        split, fixed, options["head_dim_vo"], prefix, bool(self._fp8_mma))
        if fixed:  # the workspace holds every (query tile, chunk) piece of the step
            same = self._native is not None and self._native_key[0] == key
            # before the first plan: the smallest tile the options allow
            cta = (self._native.cta_q if same else 0) or self._cta_q or 16
            counts = counts + (_fixed_chunk_pieces(*lens(), config[4] // config[5], cta, fixed),)
            bounds = bounds + (W.Bound("max_fixed_chunks", "fixed_split_size", "fixed-chunk pieces per KV head"),)

        def split_want(want):
            return want[:3], dict(knobs, max_fixed_chunks=want[3] if len(want) > 3 else 0)

        def size(want, device):
            dims, kw = split_want(want)
            ideal, host = _C.BatchPrefill.workspace_size(*config, *dims, device=device, **kw)
            return ideal, _C.BatchPrefill.min_workspace_size(*config, *dims, device=device, **kw)[0], host

        def make(want, ws, ws_bytes, host, host_bytes, device):
            dims, kw = split_want(want)
            return _C.BatchPrefill(*config, *dims, ws, ws_bytes, host, host_bytes, device, **kw)

        W.ensure_native(self, key, counts, bounds, size, make, exact)
        with T.on_device_of(buf):
            bits = None if mask is None else mask.device_bits(buf.device, self._mask_buf, self._use_cuda_graph)
            plan_fn(self._native, T.stream_of(buf))
        self._planned = dict(planned, prefix=prefix, kv_dtype=config[1], o_dtype=config[2], sm_scale=scale, mask=bits, window_left=options["window_left"],
                             rope=rope, alibi_slopes=W.plan_alibi_slopes(rope, config[4], buf.device),
                             head_dim=config[3], head_dim_vo=options["head_dim_vo"] or config[3],
                             num_qo_heads=config[4])

    def _check_run(self, args, q_scale, k_scale, v_scale, enable_pdl, window_left=None, lse_base="log2",
                   lse_layout="NH", like=None, **features):
        """run()'s checks; `features` are FlashInfer run() arguments whose feature is not implemented (None: off).
        like: q, whose device 1-element k_scale / v_scale tensors must share (an fp8 cache's scales, read by the
        kernel at run time); None refuses tensors."""
        if args:
            raise C.not_supported("args", args, "extra run() arguments feed custom JIT variants, which run through "
                                  "tessera.AttentionWrapper")
        for name, value in features.items():
            C.refuse_given(_RUN_FEATURES[name], **{name: value})
        C.lse_options(lse_base, lse_layout)
        if self._planned is None:
            raise ValueError("run: expected plan() to be called first")
        if like is None:
            scale, vs = W.run_scales(self._planned["sm_scale"], self._planned["head_dim"], q_scale, k_scale, v_scale)
            kt = vt = None
        else:
            scale, vs, kt, vt = W.run_scales_with_tensors(self._planned["sm_scale"], self._planned["head_dim"],
                                                          q_scale, k_scale, v_scale, like)
        W.check_run_window(window_left, self._planned["window_left"])
        return dict(self._planned, pdl=W.pdl_arg(enable_pdl), sm_scale=scale, v_scale=1.0 if vs is None else vs,
                    k_scale_tensor=T.arg(kt), v_scale_tensor=T.arg(vt))

    def _outputs(self, q, out, lse, return_lse):
        return W.run_outputs(q, out, lse, return_lse, self._planned["o_dtype"], self._planned["head_dim_vo"])

    def _rows(self, x, n):
        """The first n rows of x in CUDA-graph mode, where tensors are allocated for the largest step and a
        plan may use fewer rows (the kernel reads the planned lengths from the workspace, so a graph captured
        with these tensors stays valid); x itself otherwise, so a mismatch is reported by the C++ checks."""
        if x is not None and self._use_cuda_graph and T.is_torch(x) and x.dim() >= 1 and x.shape[0] > n:
            return x[:n]
        return x

    def end_forward(self):
        """Kept for FlashInfer compatibility; nothing to release."""

    def reset_workspace_buffer(self, float_workspace_buffer, int_workspace_buffer):
        """Moves the wrapper to a new workspace (any dtype, used as bytes); plan() again before run().

        int_workspace_buffer: accepted for FlashInfer's signature; Tessera keeps
        the whole schedule in float_workspace_buffer and does not write it.
        """
        C.check_int_workspace(int_workspace_buffer, "int_workspace_buffer")
        W.reset_workspace(self, float_workspace_buffer)

    def _replan(self, **options):
        """FlashInfer's deprecated forward(): its options replace the last plan()'s (see C.replan)."""
        C.replan(self, type(self).plan, options)


# What each FlashInfer run() argument without a Tessera implementation would need.
_RUN_FEATURES = {
    "kv_cache_sf": "NVFP4 KV caches are not implemented",
    "skip_softmax_threshold_scale_factor": "skip-softmax sparsity is not implemented",
    "o_scale": "an output quantization scale is not implemented",
}


def refuse_on_device_extras(custom_mask, packed_custom_mask, fixed_split_size, prefix_len_ptr, token_pos_in_items_ptr,
                            token_pos_in_items_len, max_item_len_ptr, disable_split_kv, uniform_q_len, **host_lengths):
    """plan(on_device=True)'s refusals shared by the prefill wrappers: a custom mask, fixed_split_size and the
    arguments checked against host lengths (host_lengths: {name: value}), each ValueError naming it; the
    multi-item-scoring, disable_split_kv and uniform_q_len checks of a host plan."""
    W.refuse_on_device("a custom mask's plan reads the lengths on the host", custom_mask=custom_mask,
                       packed_custom_mask=packed_custom_mask)
    W.refuse_on_device("it is checked against the lengths on the host", **host_lengths)
    if C.fixed_split_size_arg(fixed_split_size):
        raise ValueError(f"fixed_split_size: expected None or -1 with on_device=True (batch-invariant chunks size the "
                         f"workspace from the step's lengths), got {fixed_split_size}")
    C.multi_item_scoring(prefix_len_ptr, token_pos_in_items_ptr, token_pos_in_items_len, max_item_len_ptr)
    if not isinstance(disable_split_kv, (bool, np.bool_)):
        raise TypeError(f"disable_split_kv: expected a bool, got {type(disable_split_kv).__name__}")
    C.uniform_q_len_arg(uniform_q_len)


def on_device_qo_rows(step, max_batch, kv_name):
    """plan(on_device=True): a qo_indptr tensor of the step, when given, has max_batch + 1 entries like the
    KV indptr (kv_name); ValueError naming it otherwise."""
    qo = step.get("qo_indptr")
    if qo is not None and qo.shape[0] != max_batch + 1:
        raise ValueError(f"qo_indptr: expected {max_batch + 1} entries (like {kv_name}), got {qo.shape[0]}")


def on_device_total_q(batch_size, qo_indptr, max_total_q):
    """plan(on_device=True)'s batch_size and max_total_q checks: max_total_q as an int, or None with qo_indptr
    None (one query per request: the bound is then max_batch)."""
    if batch_size is None:
        raise ValueError("batch_size: expected an int32 CUDA tensor of 1 element with on_device=True, got None")
    if qo_indptr is None:
        if max_total_q is not None:
            raise ValueError(f"max_total_q: expected None with qo_indptr None (one query per request: the bound is "
                             f"max_batch), got {max_total_q!r}")
        return None
    max_total_q = C.int_arg(max_total_q, "max_total_q", allow_none=True)
    if max_total_q is None or max_total_q < 1:
        raise ValueError(f"max_total_q: expected an int >= 1 with on_device=True and a qo_indptr tensor (the bound on "
                         f"the step's query rows, q's rows in run()), got {max_total_q}")
    return max_total_q


def check_run_flags(use_fp16_softmax, uses_spcompress):
    """TensorRT-LLM kernel selections of FlashInfer's paged run(): off (None / False) only."""
    C.refuse_true("use_fp16_softmax", use_fp16_softmax, "a float16 softmax accumulator is a TensorRT-LLM kernel "
                  "variant; Tessera accumulates in float32")
    C.refuse_true("uses_spcompress", uses_spcompress, "sparse compression is a TensorRT-LLM kernel variant")


def check_plan_extras(qo, kv_lengths, derived_from, prefix_len_ptr, token_pos_in_items_ptr, token_pos_in_items_len,
                      max_item_len_ptr, seq_lens, seq_lens_q, max_token_per_sequence, max_sequence_kv,
                      fixed_split_size, disable_split_kv, uniform_q_len):
    """The paged and ragged plan() arguments FlashInfer added for other backends and features.

    qo: the host qo_indptr; kv_lengths(): each request's KV length as
    Tessera derives it, from `derived_from` (called only when needed, so the
    common step pays nothing). Lengths and bounds that agree with them are
    accepted (they say nothing new); anything that needs a feature raises
    NotSupportedError. Returns the planner options plan() passes on:
    (fixed_split_size in pages, 0 = off; split_kv = not disable_split_kv).
    """
    C.multi_item_scoring(prefix_len_ptr, token_pos_in_items_ptr, token_pos_in_items_len, max_item_len_ptr)
    fixed_pages = C.fixed_split_size_arg(fixed_split_size)
    if not isinstance(disable_split_kv, (bool, np.bool_)):
        raise TypeError(f"disable_split_kv: expected a bool, got {type(disable_split_kv).__name__}")
    C.uniform_q_len_arg(uniform_q_len)
    if seq_lens is not None or max_sequence_kv is not None:
        kv = kv_lengths()
        if seq_lens is not None:
            C.same_lengths(seq_lens, kv, "seq_lens", derived_from)
        C.max_length(max_sequence_kv, kv, "max_sequence_kv", "KV length")
    if seq_lens_q is not None or max_token_per_sequence is not None:
        q = np.diff(qo.astype(np.int64))
        if seq_lens_q is not None:
            C.same_lengths(seq_lens_q, q, "seq_lens_q", "qo_indptr")
        C.max_length(max_token_per_sequence, q, "max_token_per_sequence", "query length")
    return fixed_pages, not bool(disable_split_kv)


def _fixed_chunk_pieces(qo_lens, kv_lens, group, cta_q, fixed):
    """(query tile, KV chunk) pieces per KV head of a step with fixed chunks of `fixed` keys: each request's
    ceil(q_len * group / cta_q) tiles over its ceil(kv_len / fixed) chunks (at least one), an upper bound."""
    q = np.asarray(qo_lens, dtype=np.int64)
    kv = np.asarray(kv_lens, dtype=np.int64)
    tiles = (q * group + cta_q - 1) // cta_q
    chunks = np.maximum((kv + fixed - 1) // fixed, 1)
    return max(int((tiles * chunks).sum()), 1)
