"""Decode attention (FlashInfer's ``flashinfer.decode`` names).

single_decode_with_kv_cache keeps FlashInfer's signature so code written for
FlashInfer runs unchanged; options Tessera does not implement yet raise
ValueError instead of being silently ignored.

CUDA tensors (torch) run the JIT-compiled GPU kernel on torch's current
stream. CPU inputs (numpy arrays or torch CPU tensors) run the C++ reference
implementation in float64 and cast the result to q's dtype, so the API works
on machines without a GPU (slowly: it is meant for tests and tools).
"""

import math
import numbers

from . import _tensors as T
from ._native import _C

_LAYOUTS = ("NHD", "HND")


def _reject_unsupported(pos_encoding_mode, q_scale, k_scale, v_scale, window_left, logits_soft_cap, rope_scale,
                        rope_theta):
    """Raises ValueError for FlashInfer options whose non-default values Tessera cannot honour yet."""
    if pos_encoding_mode != "NONE":
        raise ValueError(f"pos_encoding_mode={pos_encoding_mode!r}: only 'NONE' is supported; RoPE is not supported yet")
    if window_left != -1:
        raise ValueError(f"window_left={window_left}: sliding-window attention is not supported yet (use -1)")
    if logits_soft_cap is not None and logits_soft_cap != 0.0:
        raise ValueError(f"logits_soft_cap={logits_soft_cap}: logits soft-capping is not supported yet")
    for name, value in (("rope_scale", rope_scale), ("rope_theta", rope_theta)):
        if value is not None:
            raise ValueError(f"{name}={value}: RoPE is not supported yet")
    for name, value in (("q_scale", q_scale), ("k_scale", k_scale), ("v_scale", v_scale)):
        if value is not None:
            raise ValueError(f"{name}: quantization scales are not supported yet")


def single_decode_with_kv_cache(q, k, v, kv_layout="NHD", pos_encoding_mode="NONE", use_tensor_cores=False,
                                q_scale=None, k_scale=None, v_scale=None, window_left=-1, logits_soft_cap=None,
                                sm_scale=None, rope_scale=None, rope_theta=None, return_lse=False):
    """Attention of one decode query over a contiguous KV cache.

    Query head h attends to KV head h // (num_qo_heads // num_kv_heads)
    (grouped-query attention; num_qo_heads must be a multiple of
    num_kv_heads).

    Args:
        q: [num_qo_heads, head_dim], float16 or bfloat16 on the GPU
            (float32 is also accepted on the CPU).
        k, v: [kv_len, num_kv_heads, head_dim] for kv_layout "NHD", or
            [num_kv_heads, kv_len, head_dim] for "HND"; same shape and dtype.
        kv_layout: "NHD" or "HND".
        pos_encoding_mode: only "NONE" (no RoPE) is supported.
        use_tensor_cores: accepted for compatibility; the kernel is chosen
            by Tessera and the result does not depend on it.
        q_scale, k_scale, v_scale, rope_scale, rope_theta: must be None.
        window_left: must be -1 (no sliding window).
        logits_soft_cap: must be None (or 0.0, which means off).
        sm_scale: softmax scale; None means 1 / sqrt(head_dim).
        return_lse: also return the log-sum-exp.

    Returns:
        o [num_qo_heads, head_dim] with q's dtype, framework and device; with
        return_lse, (o, lse) where lse is float32 [num_qo_heads] in **base 2**
        (log2 of the softmax denominator, FlashInfer's convention, ready for
        tessera.merge_state).
    """
    if kv_layout not in _LAYOUTS:
        raise ValueError(f"kv_layout: expected 'NHD' or 'HND', got {kv_layout!r}")
    _reject_unsupported(pos_encoding_mode, q_scale, k_scale, v_scale, window_left, logits_soft_cap, rope_scale,
                        rope_theta)
    T.common_framework(q=q, k=k, v=v)
    if len(q.shape) != 2:
        raise ValueError(f"q: expected a 2-D tensor [num_qo_heads, head_dim], got shape {tuple(q.shape)}")
    for name, x in (("k", k), ("v", v)):
        if len(x.shape) != 3:
            raise ValueError(f"{name}: expected a 3-D tensor ({kv_layout}), got shape {tuple(x.shape)}")
    if sm_scale is not None and not (isinstance(sm_scale, numbers.Real) and 0 < sm_scale < math.inf):
        raise ValueError(f"sm_scale: expected a positive finite number or None, got {sm_scale!r}")
    scale = -1.0 if sm_scale is None else float(sm_scale)

    if T.is_cuda(q):
        o, lse = _decode_gpu(q, k, v, kv_layout, scale, return_lse)
    else:
        o, lse = _decode_cpu(q, k, v, kv_layout, scale)
    return (o, lse) if return_lse else o


def _decode_gpu(q, k, v, kv_layout, scale, return_lse):
    """CUDA path: the C++ single_decode on torch's current stream of q's device."""
    qd = T.dtype_name(q, "q", ("float16", "bfloat16"))
    kd = T.dtype_name(k, "k", ("float16", "bfloat16"))
    o = T.empty(q, q.shape)
    lse = T.empty(q, q.shape[:1], "float32") if return_lse else None
    with T.on_device_of(q):
        _C.single_decode(T.arg(q), T.arg(k), T.arg(v), o, lse, kv_layout, "standard", qd, kd, qd, int(q.shape[1]),
                         scale, T.stream_of(q))
    return o, lse


def _decode_cpu(q, k, v, kv_layout, scale):
    """CPU path: the float64 C++ reference, result cast to q's dtype."""
    for name, x in (("k", k), ("v", v)):
        if T.device_of(x) != "cpu":
            raise TypeError(f"{name}: expected a CPU tensor like q, got one on {T.device_of(x)}")
    for name, x in (("q", q), ("k", k), ("v", v)):
        T.dtype_name(x, name)
    if kv_layout == "HND":  # strided NHD views, no copy
        k, v = k.swapaxes(0, 1), v.swapaxes(0, 1)
    kv_len = int(k.shape[0])
    o64, lse64 = _C.reference_attention_ragged(T.arg(q[None]), [0, 1], T.arg(k), T.arg(v), [0, kv_len], scale)
    return T.from_float64(o64[0], q), T.from_float64(lse64[0], q, "float32")
