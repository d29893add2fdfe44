"""Shared-prefix batch attention (FlashInfer's ``flashinfer.cascade`` wrappers
BatchDecodeWithSharedPrefixPagedKVCacheWrapper and
BatchPrefillWithSharedPrefixPagedKVCacheWrapper, deprecated there in favour
of MultiLevelCascadeAttentionWrapper and still exported; cascade.py
re-exports them).

Every request of the batch continues one shared prefix whose K / V are given
as contiguous tensors [prefix_len, num_kv_heads, head_dim] (NHD) or
[num_kv_heads, prefix_len, head_dim] (HND); each request's own tokens are in
a paged KV cache. forward() computes two attention states and merges them
(the FlashInfer paper, section 2.2):

* the shared part: every query row of the batch, stacked, against the shared
  K / V (one single_prefill_with_kv_cache launch, not causal: the prefix
  precedes every query);
* the unique part: the batch decode / prefill wrapper over the page table of
  begin_forward();

then merge_state_in_place: three launches per layer. The shared K / V are
read once per query tile of the whole batch rather than once per request.
MultiLevelCascadeAttentionWrapper does the same with the prefix in the page
table, in one call whose levels merge inside its own workspace.
"""

from . import _tensors as T
from . import _wrapper_util as W
from ._single_prefill import single_prefill_with_kv_cache
from .decode import BatchDecodeWithPagedKVCacheWrapper
from .prefill import BatchPrefillWithPagedKVCacheWrapper


def _merge(v, s, v_other, s_other):
    """cascade.merge_state_in_place (imported here: cascade.py imports this module at its end)."""
    from .cascade import merge_state_in_place

    merge_state_in_place(v, s, v_other, s_other)


def _prefix_len(k_shared, v_shared, layout):
    """The shared prefix's length (k_shared and v_shared must have one shape)."""
    T.common_framework(k_shared=k_shared, v_shared=v_shared)
    if len(k_shared.shape) != 3:
        raise ValueError(f"k_shared: expected a 3-D tensor ({layout}), got shape {tuple(k_shared.shape)}")
    if tuple(v_shared.shape) != tuple(k_shared.shape):
        raise ValueError(f"v_shared: expected k_shared's shape {tuple(k_shared.shape)}, got {tuple(v_shared.shape)}")
    return int(k_shared.shape[0 if layout == "NHD" else 1])


def _kv_dtype(unique_kv_cache):
    k, _ = W.unpack_paged_kv_cache(unique_kv_cache)
    return T.dtype_name(k, "unique_kv_cache", ("float16", "bfloat16"))


class _SharedPrefixWrapper:
    """What both shared-prefix wrappers share: the suffix wrapper (`_suffix`, under FlashInfer's attribute name
    too), the workspace reset, and forward()'s prefix + suffix + merge."""

    def __init__(self, suffix, kv_layout):
        self._suffix = suffix
        self._kv_layout = kv_layout
        self._planned = False

    def reset_workspace_buffer(self, float_workspace_buffer, int_workspace_buffer):
        """Moves the suffix wrapper to a new workspace (any dtype, used as bytes); begin_forward() again before
        forward(). int_workspace_buffer: accepted for FlashInfer's signature and not written."""
        self._planned = False
        self._suffix.reset_workspace_buffer(float_workspace_buffer, int_workspace_buffer)

    def _check_forward(self, q):
        if not self._planned:
            raise ValueError("forward: expected begin_forward() to be called first")
        if not T.is_cuda(q):
            raise TypeError(f"q: expected a CUDA tensor, got {type(q).__name__} on {T.device_of(q)}")

    def _prefix_and_suffix(self, q, k_shared, v_shared, unique_kv_cache, **prefix_options):
        """Every query over the whole prefix (one single prefill), the planned suffix step, merged."""
        if _prefix_len(k_shared, v_shared, self._kv_layout) == 0:  # an empty state changes nothing
            return self._suffix.run(q, unique_kv_cache)
        v_unique, s_unique = self._suffix.run(q, unique_kv_cache, return_lse=True)
        v_shared, s_shared = single_prefill_with_kv_cache(q, k_shared, v_shared, causal=False,
                                                          kv_layout=self._kv_layout, return_lse=True,
                                                          **prefix_options)
        _merge(v_shared, s_shared, v_unique, s_unique)
        return v_shared


class BatchDecodeWithSharedPrefixPagedKVCacheWrapper(_SharedPrefixWrapper):
    """Batch decode over a shared prefix (contiguous K / V) plus each request's paged suffix (FlashInfer's
    wrapper of the same name; see the module doc).

    begin_forward() once per step plans the suffixes (a
    BatchDecodeWithPagedKVCacheWrapper on float_workspace_buffer), then
    forward() for every layer. The softmax scale is 1 / sqrt(head_dim).
    """

    def __init__(self, float_workspace_buffer, kv_layout="NHD"):
        """
        Args:
            float_workspace_buffer: a contiguous CUDA tensor of any dtype (FlashInfer users allocate 128 MB),
                the suffix decode's workspace.
            kv_layout: "NHD" or "HND", of the shared K / V and of the paged cache.
        """
        super().__init__(BatchDecodeWithPagedKVCacheWrapper(float_workspace_buffer, kv_layout), kv_layout)
        self._batch_decode_wrapper = self._suffix  # FlashInfer's attribute name

    def begin_forward(self, unique_kv_indptr, unique_kv_indices, unique_kv_last_page_len, num_qo_heads,
                      num_kv_heads, head_dim, page_size, data_type="float16"):
        """Plans the step's suffixes.

        Args:
            unique_kv_indptr, unique_kv_indices, unique_kv_last_page_len:
                each request's own pages, as for
                BatchDecodeWithPagedKVCacheWrapper.plan (indptr, indices,
                last_page_len).
            num_qo_heads, num_kv_heads, head_dim, page_size: as there.
            data_type: float16 or bfloat16 (torch dtype or name), the dtype
                of q and of every K / V (FlashInfer's names the cache's and
                keeps q at float16; Tessera's kernels read one dtype).
        """
        self._planned = False
        dt = W.dtype_arg(data_type, "data_type")
        self._batch_decode_wrapper.plan(unique_kv_indptr, unique_kv_indices, unique_kv_last_page_len, num_qo_heads,
                                        num_kv_heads, head_dim, page_size, pos_encoding_mode="NONE", q_data_type=dt,
                                        kv_data_type=dt)
        self._planned = True

    def forward(self, q, k_shared, v_shared, unique_kv_cache):
        """Decode attention over the shared prefix and each request's suffix.

        Args:
            q: [batch, num_qo_heads, head_dim] CUDA tensor of data_type.
            k_shared, v_shared: the prefix's K / V, [prefix_len, num_kv_heads,
                head_dim] (NHD) or [num_kv_heads, prefix_len, head_dim] (HND),
                on q's device (prefix_len may be 0).
            unique_kv_cache: the paged cache of the suffixes, (k_cache,
                v_cache) or one interleaved tensor, as for
                BatchDecodeWithPagedKVCacheWrapper.run.

        Returns:
            out [batch, num_qo_heads, head_dim] like q.
        """
        self._check_forward(q)
        return self._prefix_and_suffix(q, k_shared, v_shared, unique_kv_cache)


class BatchPrefillWithSharedPrefixPagedKVCacheWrapper(_SharedPrefixWrapper):
    """Batch prefill / append over a shared prefix (contiguous K / V) plus each request's paged suffix
    (FlashInfer's wrapper of the same name; see the module doc).

    begin_forward() once per step plans the suffixes (a
    BatchPrefillWithPagedKVCacheWrapper on float_workspace_buffer), then
    forward() for every layer. causal masks each request's suffix
    bottom-right; every query sees the whole prefix.
    """

    def __init__(self, float_workspace_buffer, kv_layout="NHD"):
        """
        Args:
            float_workspace_buffer: a contiguous CUDA tensor of any dtype (FlashInfer users allocate 128 MB),
                the suffix prefill's workspace.
            kv_layout: "NHD" or "HND", of the shared K / V and of the paged cache.
        """
        super().__init__(BatchPrefillWithPagedKVCacheWrapper(float_workspace_buffer, kv_layout), kv_layout)
        self._batch_prefill_wrapper = self._suffix  # FlashInfer's attribute name

    def begin_forward(self, qo_indptr, paged_kv_indptr, paged_kv_indices, paged_kv_last_page_len, num_qo_heads,
                      num_kv_heads, head_dim, page_size):
        """Plans the step's suffixes: the arguments of BatchPrefillWithPagedKVCacheWrapper.plan of the same
        names. The data types follow q and the cache at forward() (float16 or bfloat16, equal)."""
        self._planned = False
        self._batch_prefill_wrapper.plan(qo_indptr, paged_kv_indptr, paged_kv_indices, paged_kv_last_page_len,
                                         num_qo_heads, num_kv_heads, head_dim, page_size)
        self._planned = True

    def forward(self, q, k_shared, v_shared, unique_kv_cache, causal=False, use_fp16_qk_reduction=False,
                sm_scale=None, rope_scale=None, rope_theta=None):
        """Prefill / append attention over the shared prefix and each request's suffix.

        Args:
            q: [qo_indptr[-1], num_qo_heads, head_dim] CUDA tensor, float16
                or bfloat16.
            k_shared, v_shared: the prefix's K / V, [prefix_len, num_kv_heads,
                head_dim] (NHD) or [num_kv_heads, prefix_len, head_dim] (HND),
                q's dtype and device (prefix_len may be 0).
            unique_kv_cache: the paged cache of the suffixes, (k_cache,
                v_cache) or one interleaved tensor, as for
                BatchPrefillWithPagedKVCacheWrapper.run.
            causal: bottom-right causal mask within each request's suffix.
            use_fp16_qk_reduction: accepted; q.k always accumulates in float32.
            sm_scale: softmax scale of both parts; None means 1 / sqrt(head_dim).
            rope_scale, rope_theta: only None (FlashInfer's forward runs
                without positional encoding, where they mean nothing).

        Options or dtypes other than the last forward()'s re-plan the suffix
        step with the same index arrays (as FlashInfer's deprecated forward
        does), so keep them fixed across layers.

        Returns:
            out [qo_indptr[-1], num_qo_heads, head_dim] like q.
        """
        self._check_forward(q)
        dt = T.dtype_name(q, "q", ("float16", "bfloat16"))
        kv_dt = _kv_dtype(unique_kv_cache)
        self._batch_prefill_wrapper._replan(causal=causal, pos_encoding_mode="NONE",
                                            use_fp16_qk_reduction=use_fp16_qk_reduction, window_left=-1,
                                            logits_soft_cap=None, sm_scale=sm_scale, rope_scale=rope_scale,
                                            rope_theta=rope_theta, q_data_type=dt,
                                            kv_data_type=None if kv_dt == dt else kv_dt)
        return self._prefix_and_suffix(q, k_shared, v_shared, unique_kv_cache,
                                       use_fp16_qk_reduction=use_fp16_qk_reduction, sm_scale=sm_scale)
