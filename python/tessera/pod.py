"""Prefill next to decode (FlashInfer's ``flashinfer.pod`` name): PODWithPagedKVCacheWrapper.

FlashInfer's POD-Attention runs one request's prefill (contiguous K / V) and
a batch of decode requests (paged cache) in one fused launch. Tessera runs
the same two computations as two launches on the same stream: the decode
batch through BatchDecodeWithPagedKVCacheWrapper (planned by plan()), then
the prefill through single_prefill_with_kv_cache. The results are those of
the two separate calls; only the overlap of the fused kernel is missing.
(tessera.BatchAttention runs prefill and decode requests of a paged cache
in one launch.)
"""

from . import _compat as C
from ._single_prefill import single_prefill_with_kv_cache
from .decode import BatchDecodeWithPagedKVCacheWrapper


class PODWithPagedKVCacheWrapper:
    """One prefill request and a decode batch per call (FlashInfer's wrapper of the same name; two launches,
    see the module doc).

    plan() plans the decode batch (as BatchDecodeWithPagedKVCacheWrapper.plan,
    without a soft cap, as FlashInfer's POD plan), then run() for every
    layer takes the prefill's q / K / V with its options and the decode
    batch's q and cache, and returns (out_p, out_d).
    """

    def __init__(self, float_workspace_buffer, kv_layout="NHD", use_cuda_graph=False, paged_kv_indptr_buffer=None,
                 paged_kv_indices_buffer=None, paged_kv_last_page_len_buffer=None, jit_args=None):
        """
        Args:
            float_workspace_buffer: a contiguous CUDA tensor of any dtype (FlashInfer users allocate 128 MB),
                the decode batch's workspace.
            kv_layout: "NHD" or "HND", of the decode cache.
            use_cuda_graph, paged_kv_indptr_buffer, paged_kv_indices_buffer,
            paged_kv_last_page_len_buffer: as for BatchDecodeWithPagedKVCacheWrapper
                (the buffers' lengths fix its workspace bounds).
            jit_args: only None (custom variants run through tessera.AttentionWrapper).
        """
        C.refuse_given("custom variants run through tessera.AttentionWrapper", jit_args=jit_args)
        self._decode = BatchDecodeWithPagedKVCacheWrapper(float_workspace_buffer, kv_layout, use_cuda_graph,
                                                          paged_kv_indptr_buffer=paged_kv_indptr_buffer,
                                                          paged_kv_indices_buffer=paged_kv_indices_buffer,
                                                          paged_kv_last_page_len_buffer=paged_kv_last_page_len_buffer)
        self._kv_layout = kv_layout
        self._planned = None

    @property
    def is_cuda_graph_enabled(self):
        return self._decode.is_cuda_graph_enabled

    def reset_workspace_buffer(self, float_workspace_buffer, int_workspace_buffer):
        """Moves the decode batch to a new workspace (any dtype, used as bytes); plan() again before run().
        int_workspace_buffer: accepted for FlashInfer's signature and not written."""
        self._planned = None
        self._decode.reset_workspace_buffer(float_workspace_buffer, int_workspace_buffer)

    def plan(self, indptr, indices, last_page_len, num_qo_heads, num_kv_heads, head_dim, page_size,
             pos_encoding_mode="NONE", window_left=-1, q_data_type="float16", kv_data_type=None, data_type=None,
             sm_scale=None, rope_scale=None, rope_theta=None, non_blocking=True):
        """Plans the decode batch: the arguments of BatchDecodeWithPagedKVCacheWrapper.plan of the same names
        (pos_encoding_mode "NONE" or "ROPE_LLAMA", window_left, dtypes, sm_scale, RoPE parameters)."""
        self._planned = None
        self._decode.plan(indptr, indices, last_page_len, num_qo_heads, num_kv_heads, head_dim, page_size,
                          pos_encoding_mode=pos_encoding_mode, window_left=window_left, q_data_type=q_data_type,
                          kv_data_type=kv_data_type, data_type=data_type, sm_scale=sm_scale, rope_scale=rope_scale,
                          rope_theta=rope_theta, non_blocking=non_blocking)
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

    def run(self, q_p, k_p, v_p, q_d, paged_kv_cache_d, custom_mask_p=None, packed_custom_mask_p=None,
            causal_p=False, kv_layout_p="NHD", pos_encoding_mode_p="NONE", sm_scale_p=None, window_left_p=-1,
            rope_scale_p=None, rope_theta_p=None, return_lse_p=False, custom_mask_d=None, packed_custom_mask_d=None,
            causal_d=False, kv_layout_d="NHD", pos_encoding_mode_d="NONE", sm_scale_d=None, window_left_d=-1,
            rope_scale_d=None, rope_theta_d=None, q_scale=None, k_scale=None, v_scale=None, return_lse_d=False,
            use_fp16_qk_reduction=False, enable_pdl=None, *args):
        """The prefill request and the planned decode batch.

        Args:
            q_p, k_p, v_p: the prefill request, as for single_prefill_with_kv_cache
                ([qo_len, num_qo_heads, head_dim]; k / v in kv_layout_p).
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
            enable_pdl: programmatic dependent launch of the decode launch.
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
        for name, flag in (("causal_d", causal_d), ("return_lse_p", return_lse_p), ("return_lse_d", return_lse_d)):
            if not isinstance(flag, bool):
                raise TypeError(f"{name}: expected a bool, got {type(flag).__name__}")
        out_d = self._decode.run(q_d, paged_kv_cache_d, q_scale=q_scale, k_scale=k_scale, v_scale=v_scale,
                                 enable_pdl=enable_pdl)
        out_p = single_prefill_with_kv_cache(q_p, k_p, v_p, custom_mask=custom_mask_p,
                                             packed_custom_mask=packed_custom_mask_p, causal=causal_p,
                                             kv_layout=kv_layout_p, pos_encoding_mode=pos_encoding_mode_p,
                                             use_fp16_qk_reduction=use_fp16_qk_reduction, sm_scale=sm_scale_p,
                                             window_left=window_left_p, rope_scale=rope_scale_p,
                                             rope_theta=rope_theta_p)
        return out_p, out_d
