"""Prefill next to decode in one launch (FlashInfer's ``flashinfer.pod`` name): PODWithPagedKVCacheWrapper.

POD-Attention fuses one request's prefill (contiguous K / V) with a batch of
decode requests (paged cache) of the same layer: the decode rows stream KV on
SMs whose other CTAs keep the tensor cores busy, and the step pays one launch
and one tail. Tessera plans each side with its own batch prefill wrapper (the
prefill as a ragged batch of one, the decode batch as a paged one with one
query per request) and runs both plans in one persistent launch (C++
tessera::PrefillPair): every CTA walks its queue of prefill work, then its
queue of decode work. Both sides run on one template: the Hopper kernel on
sm_90 (64-row query tiles on both sides), the FA2 template elsewhere. The
outputs are those of the two wrappers' own runs, bit for bit. On the Hopper
kernel a prompt chunk of more than 1024 queries runs in a launch of its own
with its own tile choice (faster there, see _FUSED_MAX_Q).
"""

import contextlib

from . import _compat as C
from . import _tensors as T
from . import _wrapper_util as W
from ._native import _C
from .prefill import BatchPrefillWithPagedKVCacheWrapper, BatchPrefillWithRaggedKVCacheWrapper


class _Stager:
    """Stands in for a wrapper's C++ object during one run(): keeps the run's converted arguments (a
    StagedPrefillRun) for the fused launch instead of launching them."""

    def __init__(self, native):
        self._native = native
        self.staged = None

    def run(self, q, k, v, o, lse, sm_scale, stream, mask, **options):
        self.staged = self._native.stage_run(q, k, v, o, lse, sm_scale, mask, **options)

    def run_ragged(self, q, k, v, o, lse, sm_scale, stream, mask, **options):
        self.staged = self._native.stage_run_ragged(q, k, v, o, lse, sm_scale, mask, **options)


# On the Hopper kernel, a prompt chunk of more queries runs in a launch of its
# own, beside the decode batch's: the pair's decode side takes 64-row tiles,
# and so must the prefill's, where alone it takes 128-row ones (bench/pod.py
# on the H100, 32/8 heads: fused 1.02-1.06x the two launches at 512 queries,
# 1.00-1.02x at 1024, 0.94-0.99x at 2048, 0.86x at 8192).
_FUSED_MAX_Q = 1024


@contextlib.contextmanager
def _staging(*wrappers):
    """Inside, the wrappers' run() stage their launches; yields their stagers."""
    stagers = [_Stager(w._native) for w in wrappers]
    for w, s in zip(wrappers, stagers):
        w._stager = s
    try:
        yield stagers
    finally:
        for w in wrappers:
            w._stager = None


class PODWithPagedKVCacheWrapper:
    """One prefill request and a decode batch per call, in one launch (FlashInfer's wrapper of the same name).

    plan() plans the decode batch (the arguments of
    BatchDecodeWithPagedKVCacheWrapper.plan that FlashInfer's POD plan
    takes), then run() for every layer takes the prefill's q / K / V with
    its options and the decode batch's q and cache, and returns
    (out_p, out_d). The prefill side is planned inside run() when its
    lengths or options change (once per step: every layer brings the same).
    """

    def __init__(self, float_workspace_buffer, kv_layout="NHD", use_cuda_graph=False, paged_kv_indptr_buffer=None,
                 paged_kv_indices_buffer=None, paged_kv_last_page_len_buffer=None, jit_args=None, *,
                 backend="auto"):
        """
        Args:
            float_workspace_buffer: a contiguous CUDA tensor of any dtype (FlashInfer users allocate 128 MB),
                used as bytes: its first half holds the decode batch's plan, the second the prefill's.
            kv_layout: "NHD" or "HND", of the decode cache.
            use_cuda_graph, paged_kv_indptr_buffer, paged_kv_indices_buffer,
            paged_kv_last_page_len_buffer: as for BatchDecodeWithPagedKVCacheWrapper
                (the buffers' lengths fix the decode side's workspace bounds).
            jit_args: only None (custom variants run through tessera.AttentionWrapper).
            backend (Tessera's): the template of both sides: "auto" (the Hopper kernel on sm_90 for head
                dims 64, 128 and 256, else FA2), "fa2" or "fa3" (the Hopper kernel).
        """
        C.refuse_given("custom variants run through tessera.AttentionWrapper", jit_args=jit_args)
        if backend not in ("auto", "fa2", "fa3"):
            raise ValueError(f"backend: expected 'auto', 'fa2' or 'fa3', got {backend!r}")
        self._backend = backend
        if kv_layout not in W.LAYOUTS:
            raise ValueError(f"kv_layout: expected one of {W.LAYOUTS}, got {kv_layout!r}")
        self._kv_layout = kv_layout
        self._use_cuda_graph = bool(use_cuda_graph)
        self._buffers = (paged_kv_indptr_buffer, paged_kv_indices_buffer, paged_kv_last_page_len_buffer)
        self._planned = None
        self._set_workspace(float_workspace_buffer)

    def _set_workspace(self, float_workspace_buffer):
        """Splits the buffer's bytes between the two sides (their wrappers come with the first plan)."""
        W.check_aligned(float_workspace_buffer, "float_workspace_buffer")
        buf = W.workspace_bytes(float_workspace_buffer)
        half = buf.shape[0] // 2 // 256 * 256  # each side's workspace starts 256-byte aligned
        self._decode_buffer, self._prefill_buffer = buf[:half], buf[half:]
        self._decode = self._template = None  # built by plan()
        self._prefills = {}  # "fused" / "alone": [wrapper, its plan's lengths and options], built by run()
        self._pair = self._pair_key = None

    def _choose_template(self, head_dim):
        """"fa3" (the Hopper kernel) or "fa2" for both sides; builds the decode side's wrapper for it."""
        template = self._backend
        if template == "auto":
            buf = self._decode_buffer
            on_sm90 = T.is_torch(buf) and buf.is_cuda and T._torch().cuda.get_device_capability(buf.device)[0] == 9
            template = "fa3" if on_sm90 and head_dim in (64, 128, 256) else "fa2"
        if self._decode is not None and template == self._template:
            return
        indptr_buf, indices_buf, last_buf = self._buffers
        qo_indptr_buf = None
        if indptr_buf is not None and T.is_torch(indptr_buf):
            qo_indptr_buf = T._torch().arange(len(indptr_buf), dtype=T._torch().int32, device=indptr_buf.device)
        self._decode = BatchPrefillWithPagedKVCacheWrapper(
            self._decode_buffer, self._kv_layout, self._use_cuda_graph, qo_indptr_buf=qo_indptr_buf,
            paged_kv_indptr_buf=indptr_buf, paged_kv_indices_buf=indices_buf, paged_kv_last_page_len_buf=last_buf,
            backend=template)
        # Tiles of as many threads on both sides: the Hopper kernel's 64-row
        # ones; on FA2 the heuristic's decode tile (4 warps).
        self._decode._cta_q = 64 if template == "fa3" else 0
        self._template = template
        self._prefills = {}

    @property
    def is_cuda_graph_enabled(self):
        return self._use_cuda_graph

    def reset_workspace_buffer(self, float_workspace_buffer, int_workspace_buffer):
        """Moves both sides to a new workspace (any dtype, used as bytes); plan() again before run().
        int_workspace_buffer: accepted for FlashInfer's signature and not written."""
        self._planned = None
        self._set_workspace(float_workspace_buffer)

    def plan(self, indptr, indices, last_page_len, num_qo_heads, num_kv_heads, head_dim, page_size,
             pos_encoding_mode="NONE", window_left=-1, q_data_type="float16", kv_data_type=None, data_type=None,
             sm_scale=None, rope_scale=None, rope_theta=None, non_blocking=True, *, on_device=False,
             batch_size=None):
        """Plans the decode batch: the arguments of BatchDecodeWithPagedKVCacheWrapper.plan of the same names
        (pos_encoding_mode "NONE", "ROPE_LLAMA" or "ALIBI", window_left, dtypes, sm_scale, RoPE parameters).
        on_device, batch_size (Tessera's, keyword-only): the decode batch planned on the GPU, as
        BatchDecodeWithPagedKVCacheWrapper.plan(on_device=True) takes it; run() then takes q_d of max_batch
        rows (indptr's length - 1). The prefill side plans from its tensors' shapes at its first run()."""
        self._planned = None
        on_device = W.on_device_arg(on_device, batch_size)
        if data_type is not None:  # FlashInfer's older name for both dtypes
            q_data_type = data_type if q_data_type in (None, "float16") else q_data_type
            kv_data_type = data_type if kv_data_type is None else kv_data_type
        n = len(indptr) - 1
        if n < 0:
            raise ValueError("indptr: expected batch_size + 1 >= 1 entries, got 0")
        qo_indptr = None if on_device else list(range(n + 1))  # on the GPU: one query per request
        self._choose_template(head_dim)
        self._decode.plan(qo_indptr, indptr, indices, last_page_len, num_qo_heads, num_kv_heads, head_dim, page_size,
                          causal=False, pos_encoding_mode=pos_encoding_mode, window_left=window_left,
                          q_data_type=q_data_type, kv_data_type=kv_data_type, sm_scale=sm_scale,
                          rope_scale=rope_scale, rope_theta=rope_theta, non_blocking=non_blocking,
                          on_device=on_device, batch_size=batch_size)
        self._planned = dict(pos_encoding_mode=pos_encoding_mode, sm_scale=sm_scale, window_left=window_left,
                             rope_scale=rope_scale, rope_theta=rope_theta)

    begin_forward = plan

    def _check_decode_options(self, given):
        """run()'s decode-side options: FlashInfer's POD takes them from plan(); here each must be its default
        or the planned value, never a different one."""
        defaults = dict(pos_encoding_mode="NONE", sm_scale=None, window_left=-1, rope_scale=None, rope_theta=None)
        for name, value in given.items():
            planned = self._planned[name]
            if value != defaults[name] and value != planned:
                raise ValueError(f"{name}_d: expected {defaults[name]!r} or the plan()'s {planned!r} (the decode "
                                 f"side runs with plan()'s options), got {value!r}")

    def _plan_prefill(self, kind, q_p, k_p, v_p, kv_layout_p, options, mask):
        """The prefill side's wrapper of `kind`, planned (a ragged batch of one) where its lengths, options or
        mask changed: "fused" (the pair's tiles) or, on the Hopper kernel, "alone" (its own tile choice, for
        a launch of its own). Each has a quarter of the workspace, so both plans stay valid."""
        if kv_layout_p not in W.LAYOUTS:
            raise ValueError(f"kv_layout_p: expected one of {W.LAYOUTS}, got {kv_layout_p!r}")
        for name, x in (("q_p", q_p), ("k_p", k_p), ("v_p", v_p)):
            T.framework(x, name)
            if len(x.shape) != 3:
                raise ValueError(f"{name}: expected a 3-D tensor, got shape {tuple(x.shape)}")
        qo_len, heads, head_dim = q_p.shape
        entry = self._prefills.get(kind)
        if entry is None or entry[0]._kv_layout != kv_layout_p:
            quarter = self._prefill_buffer.shape[0] // 2 // 256 * 256
            part = self._prefill_buffer[:quarter] if kind == "fused" else self._prefill_buffer[quarter:]
            entry = self._prefills[kind] = [BatchPrefillWithRaggedKVCacheWrapper(part, kv_layout_p,
                                                                                 backend=self._template), None]
        wrapper = entry[0]
        if kind == "fused":
            # Tiles of as many threads on both sides: the Hopper kernel's 64-row
            # ones; on FA2 4 warps (its 128-row tile takes 8 at head dim 256).
            wrapper._cta_q = 64 if self._template == "fa3" or head_dim > 128 else 0
        tokens_at, heads_at = (1, 0) if kv_layout_p == "HND" else (0, 1)
        kv_len, kv_heads = k_p.shape[tokens_at], k_p.shape[heads_at]
        key = (qo_len, kv_len, heads, kv_heads, head_dim, v_p.shape[-1], q_p.dtype, k_p.dtype,
               tuple(sorted(options.items())))
        if mask is not None or key != entry[1]:
            entry[1] = None
            wrapper.plan([0, qo_len], [0, kv_len], heads, kv_heads, head_dim, head_dim_vo=v_p.shape[-1],
                         q_data_type=q_p.dtype, kv_data_type=k_p.dtype, **(mask or {}), **options)
            entry[1] = None if mask else key
        return wrapper

    def _pair_for(self, prefill):
        """The fused launch of the two sides' current C++ objects (rebuilt when a side rebuilt its own)."""
        key = (id(prefill._native), id(self._decode._native))
        if self._pair is None or self._pair_key != key:
            self._pair = _C.PrefillPair(prefill._native, self._decode._native)
            self._pair_key = key
        return self._pair

    def run(self, q_p, k_p, v_p, q_d, paged_kv_cache_d, custom_mask_p=None, packed_custom_mask_p=None,
            causal_p=False, kv_layout_p="NHD", pos_encoding_mode_p="NONE", sm_scale_p=None, window_left_p=-1,
            rope_scale_p=None, rope_theta_p=None, return_lse_p=False, custom_mask_d=None, packed_custom_mask_d=None,
            causal_d=False, kv_layout_d="NHD", pos_encoding_mode_d="NONE", sm_scale_d=None, window_left_d=-1,
            rope_scale_d=None, rope_theta_d=None, q_scale=None, k_scale=None, v_scale=None, return_lse_d=False,
            use_fp16_qk_reduction=False, enable_pdl=None, *args):
        """The prefill request and the planned decode batch, in one launch.

        Args:
            q_p, k_p, v_p: the prefill request, as for single_prefill_with_kv_cache
                ([qo_len, num_qo_heads, head_dim]; k / v in kv_layout_p; head dims up to 256).
            q_d: [batch, num_qo_heads, head_dim] decode queries.
            paged_kv_cache_d: the decode cache, (k_cache, v_cache) or one
                interleaved tensor, in the wrapper's kv_layout.
            custom_mask_p, packed_custom_mask_p, causal_p, kv_layout_p,
            pos_encoding_mode_p, sm_scale_p, window_left_p, rope_scale_p,
            rope_theta_p: the prefill's options, as single_prefill_with_kv_cache's
                (a custom mask needs causal_p=False).
            return_lse_p, return_lse_d: accepted; FlashInfer's run() returns
                no LSE either.
            custom_mask_d, packed_custom_mask_d: only None.
            causal_d: either (one query per request, at its last position,
                sees every key either way).
            kv_layout_d: "NHD" (the default) or the wrapper's kv_layout.
            pos_encoding_mode_d, sm_scale_d, window_left_d, rope_scale_d,
            rope_theta_d: the defaults or the values given to plan(), which
                apply (as in FlashInfer).
            q_scale, k_scale, v_scale: None or floats, on the decode side (as
                FlashInfer): q_scale * k_scale multiply its softmax scale,
                v_scale its output.
            use_fp16_qk_reduction: accepted; q.k accumulates in float32.
            enable_pdl: programmatic dependent launch of the fused launch.
            args: only empty.

        Returns:
            (out_p, out_d): [qo_len, num_qo_heads, head_dim] like q_p and
            [batch, num_qo_heads, head_dim] like q_d.
        """
        if args:
            raise C.not_supported("args", args, "extra run() arguments feed custom JIT variants, which run through "
                                  "tessera.AttentionWrapper")
        C.refuse_given("the decode side has no custom mask (one query per request sees its whole cache)",
                       custom_mask_d=custom_mask_d, packed_custom_mask_d=packed_custom_mask_d)
        if self._planned is None:
            raise ValueError("run: expected plan() to be called first")
        if kv_layout_d not in ("NHD", self._kv_layout):
            raise ValueError(f"kv_layout_d: expected 'NHD' (the default) or the wrapper's {self._kv_layout!r}, got "
                             f"{kv_layout_d!r}")
        self._check_decode_options(dict(pos_encoding_mode=pos_encoding_mode_d, sm_scale=sm_scale_d,
                                        window_left=window_left_d, rope_scale=rope_scale_d, rope_theta=rope_theta_d))
        for name, flag in (("causal_p", causal_p), ("causal_d", causal_d), ("return_lse_p", return_lse_p),
                           ("return_lse_d", return_lse_d)):
            if not isinstance(flag, bool):
                raise TypeError(f"{name}: expected a bool, got {type(flag).__name__}")
        if custom_mask_p is not None and packed_custom_mask_p is not None:
            raise ValueError("custom_mask_p, packed_custom_mask_p: expected at most one")
        mask = None
        if custom_mask_p is not None:
            mask = dict(custom_mask=custom_mask_p.reshape(-1))
        elif packed_custom_mask_p is not None:
            mask = dict(packed_custom_mask=packed_custom_mask_p)
        options = dict(causal=causal_p, pos_encoding_mode=pos_encoding_mode_p, sm_scale=sm_scale_p,
                       window_left=window_left_p, rope_scale=rope_scale_p, rope_theta=rope_theta_p,
                       use_fp16_qk_reduction=use_fp16_qk_reduction)
        alone = self._template == "fa3" and len(q_p.shape) == 3 and q_p.shape[0] > _FUSED_MAX_Q
        prefill = self._plan_prefill("alone" if alone else "fused", q_p, k_p, v_p, kv_layout_p, options, mask)
        if alone:
            out_p = prefill.run(q_p, k_p, v_p, enable_pdl=enable_pdl)
            out_d = self._decode.run(q_d, paged_kv_cache_d, q_scale=q_scale, k_scale=k_scale, v_scale=v_scale,
                                     enable_pdl=enable_pdl)
            return out_p, out_d
        pair = self._pair_for(prefill)
        with _staging(prefill, self._decode) as (stage_p, stage_d):
            out_p = prefill.run(q_p, k_p, v_p, enable_pdl=enable_pdl)
            out_d = self._decode.run(q_d, paged_kv_cache_d, q_scale=q_scale, k_scale=k_scale, v_scale=v_scale,
                                     enable_pdl=enable_pdl)
        with T.on_device_of(q_d):
            pair.run(stage_p.staged, stage_d.staged, T.stream_of(q_d))
        return out_p, out_d
