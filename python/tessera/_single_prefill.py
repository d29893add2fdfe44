"""Single-request prefill (FlashInfer's ``flashinfer.prefill`` functions
single_prefill_with_kv_cache and single_prefill_with_kv_cache_return_lse),
re-exported by prefill.py.

CUDA tensors run the batch prefill kernel (a batch of one, through a ragged
wrapper and workspace cached per device and backend); CPU inputs (numpy or
torch CPU) run the C++ CPU path (float accumulation). Arguments for features
Tessera does not implement yet raise tessera.NotSupportedError unless left
at their defaults (see _compat.py).
"""

import functools

import numpy as np

from . import _compat as C
from . import _masks as M
from . import _prefill_base as B
from . import _tensors as T
from . import _wrapper_util as W
from ._native import _C

# One ragged wrapper and workspace per (device, backend), reused across
# calls. Calls are ordered by the stream (torch's current one): interleaving
# calls on different streams without synchronizing them is not supported.
_SINGLE = {}


def _single_wrapper(q, config_args, masked, options, backend):
    """The cached ragged wrapper of q's device, its workspace large enough for config_args' bounds."""
    from .prefill import BatchPrefillWithRaggedKVCacheWrapper  # prefill.py imports this module

    torch = T._torch()
    dev = q.device.index if q.device.index is not None else torch.cuda.current_device()
    need, _ = _C.BatchPrefill.workspace_size(*config_args, device=dev, custom_mask=masked,
                                             backend=W.BACKENDS[backend], **options)
    entry = _SINGLE.get((dev, backend))
    if entry is None or entry[0].numel() < need:
        if entry is not None:
            torch.cuda.synchronize(q.device)  # queued work may still use the old workspace and staging buffer
        size = max(need, 2 * entry[0].numel()) if entry is not None else need
        buf = torch.empty(size, dtype=torch.uint8, device=q.device)
        entry = (buf, BatchPrefillWithRaggedKVCacheWrapper(buf, backend=backend))
        _SINGLE[(dev, backend)] = entry
    return entry[1]


def single_prefill_with_kv_cache(q, k, v, scale_q=None, scale_k=None, scale_v=None, o_dtype=None, custom_mask=None,
                                 packed_custom_mask=None, causal=False, kv_layout="NHD", pos_encoding_mode="NONE",
                                 use_fp16_qk_reduction=False, sm_scale=None, window_left=-1, logits_soft_cap=None,
                                 rope_scale=None, rope_theta=None, backend="auto", return_lse=False, kv_cache_sf=None,
                                 k_scale=None, v_scale=None):
    """Prefill / append attention of one request over contiguous KV.

    Args:
        q: [qo_len, num_qo_heads, head_dim], float16 or bfloat16 on the GPU
            (float32 is also accepted on the CPU).
        k, v: [kv_len, num_kv_heads, head_dim] for kv_layout "NHD", or
            [num_kv_heads, kv_len, head_dim] for "HND" (read through a strided
            view, no copy); same dtype, and the same shape but for v's
            head dim, which may be 128 where q's and k's is 192
            (head_dim_vo, DeepSeek-style). Head dims 64, 128, 256, 512.
        scale_q, scale_k, scale_v: only None so far (FP8 per-head scales).
        o_dtype: the output's dtype; None means q's. On the GPU float16 or
            bfloat16; the CPU path writes q's dtype only.
        causal: bottom-right aligned causal mask (query i sees keys
            j <= i + kv_len - qo_len).
        custom_mask: bool [qo_len, kv_len] (True = visible), or
            packed_custom_mask: its flattened bits packed with little bit
            order (uint8, packbits(m.reshape(-1), bitorder="little")). At
            most one, and causal=False.
        window_left: -1 (no window), or the keys (>= 0) query i sees to the
            left of its position i + kv_len - qo_len.
        logits_soft_cap: None or 0.0 (off), or a cap > 0 on the logits
            (cap * tanh(logit / cap)). Both apply on top of a custom mask.
        pos_encoding_mode: "NONE", "ROPE_LLAMA" (Llama RoPE fused into the
            kernel: query i at position i + kv_len - qo_len, key j at j) or
            "ALIBI"; either combines with a window, a soft cap and a custom
            mask.
        rope_scale, rope_theta: with ROPE_LLAMA (None: 1 and 1e4), else None.
        use_fp16_qk_reduction: accepted; q.k is always accumulated in float32.
        sm_scale: softmax scale; None means 1 / sqrt(head_dim).
        backend: "auto", "fa2" or "fa3": the GPU kernel template (the CPU
            path has one).
        return_lse: also return the log-sum-exp.
        kv_cache_sf: only None so far (NVFP4 caches).
        k_scale, v_scale: None or floats, as FlashInfer applies them: k_scale
            multiplies the softmax scale, v_scale the output.

    Returns:
        o [qo_len, num_qo_heads, head_dim_vo] in o_dtype, or (o, lse) with
        return_lse: lse float32 [qo_len, num_qo_heads] in **base 2**.
    """
    ops = T.torch_ops(q)
    if ops is not None:  # torch.compile: one opaque custom op (see _ops.py)
        C.refuse_given("FP8 per-head scale tensors are not implemented", scale_q=scale_q, scale_k=scale_k,
                       scale_v=scale_v)
        C.refuse_given("NVFP4 KV caches are not implemented", kv_cache_sf=kv_cache_sf)
        return ops.single_prefill_call(q, k, v, o_dtype, custom_mask, packed_custom_mask, causal, kv_layout,
                                       pos_encoding_mode, sm_scale, window_left, logits_soft_cap, rope_scale,
                                       rope_theta, backend, return_lse, k_scale, v_scale)
    o, lse = _single_prefill(q, k, v, scale_q, scale_k, scale_v, o_dtype, custom_mask, packed_custom_mask, causal,
                             kv_layout, pos_encoding_mode, sm_scale, window_left, logits_soft_cap, rope_scale,
                             rope_theta, backend, return_lse, kv_cache_sf, k_scale, v_scale)
    return (o, lse) if return_lse else o


def _single_prefill(q, k, v, scale_q, scale_k, scale_v, o_dtype, custom_mask, packed_custom_mask, causal, kv_layout,
                    pos_encoding_mode, sm_scale, window_left, logits_soft_cap, rope_scale, rope_theta, backend,
                    return_lse, kv_cache_sf, k_scale, v_scale):
    """single_prefill_with_kv_cache's work: (o, lse or None). Also the real implementation of
    tessera::single_prefill (_ops.py)."""
    if kv_layout not in W.LAYOUTS:
        raise ValueError(f"kv_layout: expected 'NHD' or 'HND', got {kv_layout!r}")
    C.refuse_given("FP8 per-head scale tensors are not implemented", scale_q=scale_q, scale_k=scale_k,
                   scale_v=scale_v)
    C.refuse_given("NVFP4 KV caches are not implemented", kv_cache_sf=kv_cache_sf)
    W.check_backend(backend, None, allowed=("auto", "fa2", "fa3"))
    rope = B.reject_prefill_options((), (), None, None, pos_encoding_mode, rope_scale, rope_theta)
    window, cap = W.plan_options(window_left, logits_soft_cap)
    masked = custom_mask is not None or packed_custom_mask is not None
    causal = M.plan_causal(causal, masked)
    T.common_framework(q=q, k=k, v=v)
    if len(q.shape) != 3:
        raise ValueError(f"q: expected a 3-D tensor [qo_len, num_qo_heads, head_dim], got shape {tuple(q.shape)}")
    for name, x in (("k", k), ("v", v)):
        if len(x.shape) != 3:
            raise ValueError(f"{name}: expected a 3-D tensor ({kv_layout}), got shape {tuple(x.shape)}")
    scale = W.sm_scale_arg(sm_scale)
    B.check_head_dim_vo(int(q.shape[2]), int(v.shape[2]))  # v's head dim: q's, or 128 with 192
    if kv_layout == "HND":  # strided NHD views, no copy
        k, v = k.swapaxes(0, 1), v.swapaxes(0, 1)
    masks = dict(custom_mask=custom_mask, packed_custom_mask=packed_custom_mask)
    mask = None
    if masked:  # checked here, before any GPU work
        mask = M.MaskPlan(custom_mask, packed_custom_mask, causal, [int(q.shape[0])], [int(k.shape[0])])
    if T.is_cuda(q):
        o, lse = _single_prefill_gpu(q, k, v, bool(causal), sm_scale, return_lse, masks, window, cap, rope, o_dtype,
                                     backend, k_scale, v_scale)
    else:
        o, lse = _single_prefill_cpu(q, k, v, bool(causal), scale, mask, window, cap, rope, o_dtype, k_scale, v_scale)
    return o, lse


single_prefill_with_kv_cache_return_lse = functools.partial(single_prefill_with_kv_cache, return_lse=True)
single_prefill_with_kv_cache_return_lse.__doc__ = (
    "single_prefill_with_kv_cache(..., return_lse=True): the same arguments; returns (o, lse), lse in base 2.")


def _single_prefill_gpu(q, k, v, causal, sm_scale, return_lse, masks, window, cap, rope, o_dtype, backend, k_scale,
                        v_scale):
    qd = T.dtype_name(q, "q", ("float16", "bfloat16"))
    kd = T.dtype_name(k, "k", ("float16", "bfloat16") + T.FP8)  # fp8: a quantized cache, widened as it is read
    if T.dtype_str(v) != kd:
        raise TypeError(f"v: expected the dtype of k ({kd}), got {T.dtype_str(v)}")
    od = qd if o_dtype is None else W.dtype_arg(o_dtype, "o_dtype")
    for name, x in (("k", k), ("v", v)):
        if T.device_of(x) != T.device_of(q):
            raise TypeError(f"{name}: expected a tensor on {T.device_of(q)} like q, got one on {T.device_of(x)}")
    qo_len, kv_len = int(q.shape[0]), int(k.shape[0])
    hq, d, hkv = int(q.shape[1]), int(q.shape[2]), int(k.shape[1])
    dvo = B.check_head_dim_vo(d, int(v.shape[2]))  # 0: d
    # Checks heads, head_dim and dtypes (the C++ messages name them) before anything is allocated.
    config_args = (qd, kd, od, d, hq, hkv, 1, "NHD", causal, 1, max(qo_len, 1), 1)
    wrapper = _single_wrapper(q, config_args, any(m is not None for m in masks.values()),
                              dict(window_left=window, logits_soft_cap=cap, pos_encoding=rope[0], head_dim_vo=dvo),
                              backend)
    rope_args = dict(pos_encoding_mode=W.pos_encoding_mode_name(rope[0]))
    if rope[0] == W.POS_ROPE_LLAMA:
        rope_args.update(rope_scale=rope[1], rope_theta=rope[2])
    wrapper.plan([0, qo_len], [0, kv_len], hq, hkv, d, head_dim_vo=dvo or None, causal=causal, sm_scale=sm_scale,
                 q_data_type=qd, kv_data_type=kd, o_data_type=od, window_left=window, logits_soft_cap=cap, **masks,
                 **rope_args)
    if return_lse:
        return wrapper.run(q, k, v, k_scale=k_scale, v_scale=v_scale, return_lse=True)
    return wrapper.run(q, k, v, k_scale=k_scale, v_scale=v_scale), None


def single_decode_tensor_cores(q, k, v, kd, qd, kv_layout, scale, return_lse, window, cap, rope, v_scale, k_tensor,
                               v_tensor):
    """single_decode_with_kv_cache's GPU path for head dims over 256 (512): a single prefill of one query on the
    tensor-core kernel (a warp of the CUDA-core decode kernel holds a row of at most 256 16-bit features). The
    query sits at position kv_len - 1 there too, so windows, RoPE and ALiBi mean the same. kd: the fp8 dtype of
    uint8 k, v views, else None; qd: q's dtype name; scale: the binding's sm_scale (< 0: 1 / sqrt(head_dim))."""
    d = int(q.shape[1])
    if kd is not None:
        raise ValueError(f"head_dim: {d} runs on the tensor-core prefill kernel, which reads 16-bit K / V; an fp8 "
                         f"cache ({kd}) takes head_dim 64, 128 or 256")
    if k_tensor is not None or v_tensor is not None:
        raise ValueError(f"head_dim: {d} runs on the tensor-core prefill kernel, which takes k_scale / v_scale as "
                         "floats, not tensors")
    kd = T.dtype_name(k, "k", ("float16", "bfloat16"))
    if kd != qd:
        raise ValueError(f"head_dim: {d} runs on the tensor-core prefill kernel, which needs k and v of q's dtype "
                         f"({qd}), got {kd}")
    if kv_layout == "HND":  # strided NHD views, no copy
        k, v = k.swapaxes(0, 1), v.swapaxes(0, 1)
    o, lse = _single_prefill_gpu(q[None], k, v, False, None if scale < 0 else scale, return_lse, {}, window, cap, rope,
                                 None, "auto", None, v_scale)
    return o[0], (None if lse is None else lse[0])


def _single_prefill_cpu(q, k, v, causal, scale, mask, window, cap, rope, o_dtype, k_scale, v_scale):
    """CPU path: the C++ CPU attention (float accumulation), o in q's dtype."""
    for name, x in (("k", k), ("v", v)):
        if T.device_of(x) != "cpu":
            raise TypeError(f"{name}: expected a CPU tensor like q, got one on {T.device_of(x)}")
    T.dtype_name(q, "q")
    k, kd = T.kv_bits(k, "k")  # fp8 K / V cross as uint8 views
    v, vd = T.kv_bits(v, "v", kd)
    if kd != vd:
        raise TypeError(f"v: expected the dtype of k ({kd or T.dtype_str(k)}), got {vd or T.dtype_str(v)}")
    if kd is None:
        for name, x in (("k", k), ("v", v)):
            T.dtype_name(x, name)
    if o_dtype is not None and _dtype_name(o_dtype) != T.dtype_name(q, "q"):
        raise C.not_supported("o_dtype", o_dtype, "the CPU path writes o in q's dtype")
    scale, vs = W.run_scales(scale, int(q.shape[2]), None, k_scale, v_scale)
    qo_len, kv_len = int(q.shape[0]), int(k.shape[0])
    o, lse = T.empty(q, tuple(q.shape[:2]) + (int(v.shape[2]),)), T.empty(q, q.shape[:2], "float32")
    _C.cpu_attention_ragged(T.arg(q), [0, qo_len], T.arg(k), T.arg(v), [0, kv_len], T.arg(o), T.arg(lse), scale,
                            causal, custom_mask=None if mask is None else mask.host_mask(), logits_soft_cap=cap,
                            window_left=window, rope=rope[0] == W.POS_ROPE_LLAMA, rope_scale=rope[1], rope_theta=rope[2],
                            alibi_slopes=list(_C.alibi_slopes(int(q.shape[1]))) if rope[0] == W.POS_ALIBI else [],
                            kv_dtype=kd or "")
    if vs is not None:
        o = o.mul_(vs) if T.is_torch(o) else o * vs
    return o, lse


def _dtype_name(value):
    """A dtype given as a torch dtype, numpy dtype or name, as its name ('float32'); the value itself if none."""
    if isinstance(value, str):
        return {"half": "float16", "float": "float32", "bf16": "bfloat16"}.get(value, value)
    if type(value).__module__ == "torch":
        return str(value).replace("torch.", "")
    try:
        return np.dtype(value).name
    except TypeError:
        return value
