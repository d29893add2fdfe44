"""BatchPrefillWithRaggedKVCacheWrapper: batch prefill over contiguous
(ragged) KV, re-exported by prefill.py under FlashInfer's module name (its
docstring says what the prefill wrappers share: causal alignment, custom
masks, LSE base)."""

import functools

from . import _compat as C
from . import _masks as M
from . import _prefill_base as B
from . import _tensors as T
from . import _wrapper_util as W


class BatchPrefillWithRaggedKVCacheWrapper(B.PrefillWrapper):
    """Batch prefill attention over ragged (contiguous, unpaged) KV (FlashInfer's wrapper of the same name).

    Request i's keys are rows kv_indptr[i] .. kv_indptr[i+1] of one K and one
    V tensor: [total_kv, num_kv_heads, head_dim] (NHD) or [num_kv_heads,
    total_kv, head_dim] (HND, read through a strided view: no copy), K's
    head_dim head_dim_qk and V's head_dim_vo (plan()). Same
    plan / run contract and workspace bounds as
    BatchPrefillWithPagedKVCacheWrapper (max_pages is 1 here); in CUDA-graph
    mode q and k / v may have more rows than the plan uses.

    Planning on the GPU (Tessera's keyword-only plan(..., on_device=True,
    batch_size=..., max_total_q=..., max_kv_tokens=...)), as for the paged
    wrapper: qo_indptr (or None: one query per request) and kv_indptr stay
    in int32 CUDA tensors sized for the bounds, kv_indptr[batch] at most
    max_kv_tokens; plan() only enqueues the planner kernel. run() then takes
    q of max_total_q rows and k / v of at least max_kv_tokens rows.
    """

    def __init__(self, float_workspace_buffer, kv_layout="NHD", use_cuda_graph=False, qo_indptr_buf=None,
                 kv_indptr_buf=None, custom_mask_buf=None, mask_indptr_buf=None, backend="auto", jit_args=None,
                 jit_kwargs=None, variant_owns_mask=False):
        """
        Args:
            float_workspace_buffer: a contiguous CUDA tensor of any dtype, used as bytes for the device workspace.
            kv_layout: "NHD" or "HND".
            use_cuda_graph: fix the workspace bounds at the first plan().
            qo_indptr_buf, kv_indptr_buf, mask_indptr_buf: optional 1-D tensors whose length - 1 fixes max_batch.
            custom_mask_buf: where CUDA-graph mode copies the packed custom mask (as the paged wrapper).
            backend: "auto", "fa2" or "fa3" (as above). jit_args, jit_kwargs, variant_owns_mask: only their defaults.
        """
        super().__init__(float_workspace_buffer, kv_layout, use_cuda_graph, backend, jit_args, jit_kwargs,
                         variant_owns_mask)
        self._buffers = (qo_indptr_buf, kv_indptr_buf, custom_mask_buf, mask_indptr_buf)
        self._qo_indptr_buf, self._kv_indptr_buf, self._custom_mask_buf, self._mask_indptr_buf = self._buffers
        self._fix_batch((("qo_indptr_buf", qo_indptr_buf, 1), ("kv_indptr_buf", kv_indptr_buf, 1),
                         ("mask_indptr_buf", mask_indptr_buf, 1)))
        self._mask_buf = custom_mask_buf

    @C.recorded_plan
    def plan(self, qo_indptr, kv_indptr, num_qo_heads, num_kv_heads, head_dim_qk, head_dim_vo=None, custom_mask=None,
             packed_custom_mask=None, causal=False, pos_encoding_mode="NONE", use_fp16_qk_reduction=False,
             window_left=-1, logits_soft_cap=None, sm_scale=None, rope_scale=None, rope_theta=None,
             q_data_type="float16", kv_data_type=None, o_data_type=None, non_blocking=True, prefix_len_ptr=None,
             token_pos_in_items_ptr=None, token_pos_in_items_len=0, max_item_len_ptr=None, fixed_split_size=None,
             disable_split_kv=False, seq_lens=None, seq_lens_q=None, max_token_per_sequence=None,
             max_sequence_kv=None, v_indptr=None, o_indptr=None, uniform_q_len=None, *, on_device=False,
             batch_size=None, max_total_q=None, max_kv_tokens=None):
        """Plans one step: qo_indptr / kv_indptr are int [batch + 1] row pointers into q and k / v.

        v_indptr, o_indptr: None, or equal to kv_indptr / qo_indptr (V and
        the output in other rows are not supported yet). seq_lens (KV
        lengths, from kv_indptr here) and the other arguments, custom masks
        included, are as for BatchPrefillWithPagedKVCacheWrapper.plan.
        on_device, batch_size, max_total_q: Tessera's (keyword-only), as for
        the paged wrapper's plan; max_kv_tokens: with on_device=True, the
        bound on kv_indptr[batch] (k and v in run() hold at least as many
        rows).
        """
        masked = custom_mask is not None or packed_custom_mask is not None
        causal = M.plan_causal(causal, masked)
        self._planned = None  # a failed plan() leaves nothing to run
        rope = B.reject_prefill_options((), (), head_dim_qk, head_dim_vo, pos_encoding_mode, rope_scale, rope_theta)
        # Ragged KV has no pages: the C++ object sees page size 1 and NHD rows
        # (run() hands HND over as a strided NHD view).
        config, scale, options = self._config(num_qo_heads, num_kv_heads, head_dim_qk, "head_dim_qk", 1, "NHD", causal,
                                              sm_scale, q_data_type, kv_data_type, o_data_type, window_left,
                                              logits_soft_cap, masked, rope, head_dim_vo)
        if W.on_device_arg(on_device, batch_size):
            B.refuse_on_device_extras(custom_mask, packed_custom_mask, fixed_split_size, prefix_len_ptr,
                                      token_pos_in_items_ptr, token_pos_in_items_len, max_item_len_ptr,
                                      disable_split_kv, uniform_q_len, seq_lens=seq_lens, seq_lens_q=seq_lens_q,
                                      max_token_per_sequence=max_token_per_sequence, max_sequence_kv=max_sequence_kv,
                                      v_indptr=v_indptr, o_indptr=o_indptr)
            self._plan_on_device(config, scale, options, rope, batch_size, qo_indptr, kv_indptr, max_total_q,
                                 max_kv_tokens, not disable_split_kv)
            return
        for name, value in (("max_total_q", max_total_q), ("max_kv_tokens", max_kv_tokens)):
            if value is not None:
                raise ValueError(f"{name}: expected None without on_device=True (a plan on the host takes it from "
                                 f"the step), got {value!r}")
        qo = B.indptr_arg(qo_indptr, "qo_indptr")
        kv = B.indptr_arg(kv_indptr, "kv_indptr")
        if kv.size != qo.size:
            raise ValueError(f"kv_indptr: expected {qo.size} entries (like qo_indptr), got {kv.size}")
        # Ragged KV is a cache of one-token pages: fixed_split_size counts tokens.
        fixed, split = B.check_plan_extras(qo, lambda: M.indptr_lengths(kv, "kv_indptr"), "kv_indptr",
                                           prefix_len_ptr, token_pos_in_items_ptr, token_pos_in_items_len,
                                           max_item_len_ptr, seq_lens, seq_lens_q, max_token_per_sequence,
                                           max_sequence_kv, fixed_split_size, disable_split_kv, uniform_q_len)
        C.same_indptr(v_indptr, kv, "v_indptr", "kv_indptr")
        C.same_indptr(o_indptr, qo, "o_indptr", "qo_indptr")
        batch, total_q = qo.size - 1, int(qo[-1])
        mask = None
        if masked:
            mask = M.MaskPlan(custom_mask, packed_custom_mask, causal, M.indptr_lengths(qo, "qo_indptr"),
                              M.indptr_lengths(kv, "kv_indptr"))
        bounds = (W.Bound("max_batch", "qo_indptr", "batch size", self._fixed_batch, "qo_indptr_buf / kv_indptr_buf"),
                  W.Bound("max_total_q", "qo_indptr", "total query length"),
                  W.Bound("max_pages", "kv_indptr", "page count"))
        self._plan(config, scale, options, (max(batch, 1), max(total_q, 1), 1), bounds,
                   lambda n, s: n.plan_ragged(qo, kv, s, None if mask is None else mask.indptr), mask=mask,
                   rope=rope, total_q=total_q, total_kv=int(kv[-1]),
                   planner=(split, fixed, lambda: (M.indptr_lengths(qo, "qo_indptr"), M.indptr_lengths(kv, "kv_indptr"))))

    def _plan_on_device(self, config, scale, options, rope, batch_size, qo_indptr, kv_indptr, max_total_q,
                        max_kv_tokens, split):
        """plan(on_device=True): the tensors checked from their metadata, the workspace sized for the bounds, the
        C++ device planner enqueued (as the paged wrapper's)."""
        max_total_q = B.on_device_total_q(batch_size, qo_indptr, max_total_q)
        max_kv_tokens = C.int_arg(max_kv_tokens, "max_kv_tokens", allow_none=True)
        if max_kv_tokens is None or not 1 <= max_kv_tokens < 2 ** 31:
            raise ValueError(f"max_kv_tokens: expected an int in [1, 2**31) with on_device=True (the bound on "
                             f"kv_indptr[batch], k's and v's rows in run()), got {max_kv_tokens}")
        step = {"batch_size": batch_size} if qo_indptr is None else {"batch_size": batch_size, "qo_indptr": qo_indptr}
        step = W.device_step(self, dict(step, kv_indptr=kv_indptr))
        max_batch = W.device_bound(step["kv_indptr"], "kv_indptr", 1, "max_batch")
        B.on_device_qo_rows(step, max_batch, "kv_indptr")
        if qo_indptr is None:
            max_total_q = max_batch
        bounds = (W.Bound("max_batch", "kv_indptr", "max_batch (its length - 1)", self._fixed_batch,
                          "qo_indptr_buf / kv_indptr_buf"),
                  W.Bound("max_total_q", "max_total_q" if qo_indptr is not None else "qo_indptr", "query-row bound"),
                  W.Bound("max_pages", "kv_indptr", "page count"))
        qo = step.get("qo_indptr")
        self._plan(config, scale, options, (max_batch, max_total_q, 1), bounds,
                   lambda n, s: n.plan_ragged_on_device(step["batch_size"], qo, step["kv_indptr"], max_kv_tokens, s),
                   rope=rope, total_q=max_total_q, total_kv=max_kv_tokens, on_device=True,
                   planner=(split, 0, None), exact=True, device_step=step)  # the C++ object reads them at run()

    begin_forward = plan

    def _nhd(self, x, name):
        T.framework(x, name)
        if len(x.shape) != 3:
            raise ValueError(f"{name}: expected a 3-D tensor ({self._kv_layout}), got shape {tuple(x.shape)}")
        return x.swapaxes(0, 1) if self._kv_layout == "HND" else x

    def run(self, q, k, v, *args, q_scale=None, k_scale=None, v_scale=None, o_scale=None, out=None, lse=None,
            return_lse=False, lse_base="log2", lse_layout="NH", enable_pdl=None, kv_cache_sf=None):
        """Attention of the planned step: q [qo_indptr[-1], num_qo_heads, head_dim_qk]; k, v as in the class doc.

        out ([rows, num_qo_heads, head_dim_vo]), lse, return_lse, lse_base / lse_layout and the scale / PDL
        options are as for the paged wrapper's run(); o_scale and kv_cache_sf
        only None so far.
        """
        ops = T.torch_ops(q)
        if ops is not None:  # torch.compile: one opaque custom op (see _ops.py)
            return ops.prefill_ragged_run(self, q, k, v, args, q_scale, k_scale, v_scale, o_scale, out, lse,
                                          return_lse, lse_base, lse_layout, enable_pdl, kv_cache_sf)
        return self._run(q, k, v, *args, q_scale=q_scale, k_scale=k_scale, v_scale=v_scale, o_scale=o_scale, out=out,
                         lse=lse, return_lse=return_lse, lse_base=lse_base, lse_layout=lse_layout,
                         enable_pdl=enable_pdl, kv_cache_sf=kv_cache_sf)

    def _run(self, q, k, v, *args, q_scale=None, k_scale=None, v_scale=None, o_scale=None, out=None, lse=None,
             return_lse=False, lse_base="log2", lse_layout="NH", enable_pdl=None, kv_cache_sf=None):
        """run() outside torch.compile (and the real implementation of tessera::batch_prefill_ragged_run)."""
        plan = self._check_run(args, q_scale, k_scale, v_scale, enable_pdl, None, lse_base, lse_layout, like=q,
                               o_scale=o_scale, kv_cache_sf=kv_cache_sf)
        k = T.kv_bits(self._nhd(k, "k"), "k", plan["kv_dtype"])[0]
        v = T.kv_bits(self._nhd(v, "v"), "v", plan["kv_dtype"])[0]
        out, lse = self._outputs(q, out, lse, return_lse)
        n, nk = plan["total_q"], plan["total_kv"]
        if plan.get("on_device") and (q.shape[0] < n or (q.shape[0] > n and not self._use_cuda_graph)):
            raise ValueError(f"q: expected {n} rows (the bound on query rows: after plan(on_device=True) run() covers "
                             f"them, leaving those past the step's queries as they are), got {q.shape[0]}")
        with T.on_device_of(q):
            self._launcher().run_ragged(T.arg(self._rows(q, n)), T.arg(self._rows(k, nk)), T.arg(self._rows(v, nk)),
                                        self._rows(out, n), self._rows(lse, n), plan["sm_scale"], T.stream_of(q),
                                        plan["mask"], pdl=plan["pdl"], v_scale=plan["v_scale"],
                                        k_scale_tensor=plan["k_scale_tensor"], v_scale_tensor=plan["v_scale_tensor"],
                                        **W.run_pos_encoding_args(plan["rope"], plan["alibi_slopes"]))
        if not return_lse:
            return out
        C.finish_lse(self._rows(lse, n), lse_base)
        return out, lse

    run_return_lse = functools.partialmethod(run, return_lse=True)

    def forward(self, q, k, v, causal=False, pos_encoding_mode="NONE", use_fp16_qk_reduction=False, window_left=-1,
                logits_soft_cap=None, sm_scale=None, rope_scale=None, rope_theta=None):
        """FlashInfer's deprecated plan-options-at-run call (as the paged wrapper's forward())."""
        self._replan(causal=causal, pos_encoding_mode=pos_encoding_mode, use_fp16_qk_reduction=use_fp16_qk_reduction,
                     window_left=window_left, logits_soft_cap=logits_soft_cap, sm_scale=sm_scale,
                     rope_scale=rope_scale, rope_theta=rope_theta)
        return self.run(q, k, v)

    def forward_return_lse(self, q, k, v, causal=False, pos_encoding_mode="NONE", use_fp16_qk_reduction=False,
                           window_left=-1, logits_soft_cap=None, sm_scale=None, rope_scale=None, rope_theta=None):
        """forward() returning (out, lse), lse in base 2."""
        self._replan(causal=causal, pos_encoding_mode=pos_encoding_mode, use_fp16_qk_reduction=use_fp16_qk_reduction,
                     window_left=window_left, logits_soft_cap=logits_soft_cap, sm_scale=sm_scale,
                     rope_scale=rope_scale, rope_theta=rope_theta)
        return self.run(q, k, v, return_lse=True)
