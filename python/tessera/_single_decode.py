"""single_decode_with_kv_cache (FlashInfer's ``flashinfer.decode`` name): one request's decode step over
contiguous K / V, on the GPU kernel for CUDA tensors and the C++ CPU path for host ones (see decode.py)."""

import math

from . import _compat as C
from . import _tensors as T
from . import _wrapper_util as W
from ._native import _C
from ._wrapper_util import LAYOUTS as _LAYOUTS


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
            [num_kv_heads, kv_len, head_dim] for "HND"; same shape and dtype:
            q's, or fp8 (torch.float8_e4m3fn / float8_e5m2: a quantized
            cache, read with k_scale / v_scale; the output is q's dtype).
        kv_layout: "NHD" or "HND".
        pos_encoding_mode: "NONE", or "ROPE_LLAMA": Llama RoPE fused into
            the kernel, q rotated at position kv_len - 1 and key i at i
            (half-split pairs over all head_dim features), not combined
            with window_left / logits_soft_cap yet.
        rope_scale, rope_theta: with ROPE_LLAMA, positions are divided by
            rope_scale (None: 1) and the frequency base is rope_theta (None:
            1e4); None otherwise.
        use_tensor_cores: accepted for compatibility; the kernel is chosen
            by Tessera and the result does not depend on it (head_dim 512
            runs on the tensor-core prefill kernel, 16-bit K / V of q's
            dtype and float scales only; 64 / 128 / 256 on CUDA cores).
        q_scale, k_scale, v_scale: None or floats, as FlashInfer applies them:
            q_scale * k_scale multiplies the softmax scale, v_scale the
            output (an fp8 cache's dequantization scales). k_scale / v_scale
            may also be 1-element float32 tensors on q's device, read by the
            kernel when it runs (a captured CUDA graph replays with their
            current values).
        window_left: -1 (no window), or the keys (>= 0) the query sees to the
            left of its own position (the last key): keys >= kv_len - 1 - window_left.
        logits_soft_cap: None or 0.0 (off), or a cap > 0: logit = cap *
            tanh(logit / cap), the logit being q.k * sm_scale.
        sm_scale: softmax scale; None means 1 / sqrt(head_dim).
        return_lse: also return the log-sum-exp.

    Returns:
        o [num_qo_heads, head_dim] with q's dtype, framework and device; with
        return_lse, (o, lse) where lse is float32 [num_qo_heads] in **base 2**
        (log2 of the softmax denominator, FlashInfer's convention, ready for
        tessera.merge_state).
    """
    ops = T.torch_ops(q)
    if ops is not None:  # torch.compile: one opaque custom op (see _ops.py)
        return ops.single_decode_call(q, k, v, kv_layout, pos_encoding_mode, q_scale, k_scale, v_scale, window_left,
                                      logits_soft_cap, sm_scale, rope_scale, rope_theta, return_lse)
    o, lse = _single_decode(q, k, v, kv_layout, pos_encoding_mode, q_scale, k_scale, v_scale, window_left,
                            logits_soft_cap, sm_scale, rope_scale, rope_theta, return_lse)
    return (o, lse) if return_lse else o


def _single_decode(q, k, v, kv_layout, pos_encoding_mode, q_scale, k_scale, v_scale, window_left, logits_soft_cap,
                   sm_scale, rope_scale, rope_theta, return_lse):
    """single_decode_with_kv_cache's work: (o, lse or None). Also the real implementation of tessera::single_decode
    (use_tensor_cores changes nothing, so the op does not take it)."""
    if kv_layout not in _LAYOUTS:
        raise ValueError(f"kv_layout: expected 'NHD' or 'HND', got {kv_layout!r}")
    rope = W.pos_encoding_arg(pos_encoding_mode, rope_scale, rope_theta)
    window, cap = W.plan_options(window_left, logits_soft_cap)
    T.common_framework(q=q, k=k, v=v)
    if len(q.shape) != 2:
        raise ValueError(f"q: expected a 2-D tensor [num_qo_heads, head_dim], got shape {tuple(q.shape)}")
    for name, x in (("k", k), ("v", v)):
        if len(x.shape) != 3:
            raise ValueError(f"{name}: expected a 3-D tensor ({kv_layout}), got shape {tuple(x.shape)}")
    head_dim = int(q.shape[1])
    scale, vs, kt, vt = W.run_scales_with_tensors(W.sm_scale_arg(sm_scale), head_dim, q_scale, k_scale, v_scale, q)
    vs = 1.0 if vs is None else vs
    k, kd = T.kv_bits(k, "k")
    v, vd = T.kv_bits(v, "v", kd)
    if kd != vd:
        raise TypeError(f"v: expected the dtype of k ({kd or T.dtype_str(k)}), got {vd or T.dtype_str(v)}")

    if T.is_cuda(q):  # v_scale in the kernel's epilogue, scale tensors read by the kernel
        o, lse = _decode_gpu(q, k, v, kd, kv_layout, scale, return_lse, window, cap, rope, vs, kt, vt)
    else:  # host scale tensors: their values now (nothing to wait for)
        if kt is not None:
            scale = (scale if scale > 0 else 1.0 / math.sqrt(head_dim)) * float(kt.reshape(-1)[0])
        if vt is not None:
            vs *= float(vt.reshape(-1)[0])
        o, lse = _decode_cpu(q, k, v, kd, kv_layout, scale, window, cap, rope, vs)
    return o, lse


def _decode_gpu(q, k, v, kd, kv_layout, scale, return_lse, window, cap, rope, v_scale, k_tensor, v_tensor):
    """CUDA path: the C++ single_decode on torch's current stream of q's device. kd: the fp8 dtype of uint8 k, v
    views (T.kv_bits), else None."""
    qd = T.dtype_name(q, "q", ("float16", "bfloat16"))
    if int(q.shape[1]) > 256:  # head dim 512: the tensor-core prefill kernel
        from ._single_prefill import single_decode_tensor_cores
        return single_decode_tensor_cores(q, k, v, kd, qd, kv_layout, scale, return_lse, window, cap, rope, v_scale,
                                          k_tensor, v_tensor)
    kd = kd or T.dtype_name(k, "k", ("float16", "bfloat16"))
    o = T.empty(q, q.shape)
    lse = T.empty(q, q.shape[:1], "float32") if return_lse else None
    slopes = W.plan_alibi_slopes(rope, int(q.shape[0]), q.device)
    with T.on_device_of(q):
        _C.single_decode(T.arg(q), T.arg(k), T.arg(v), o, lse, kv_layout, "standard", qd, kd, qd, int(q.shape[1]),
                         scale, T.stream_of(q), window_left=window, logits_soft_cap=cap, pos_encoding=rope[0],
                         v_scale=v_scale, k_scale_tensor=T.arg(k_tensor), v_scale_tensor=T.arg(v_tensor),
                         **W.run_pos_encoding_args(rope, slopes))
    return o, lse


def _decode_cpu(q, k, v, kd, kv_layout, scale, window, cap, rope, v_scale):
    """CPU path: the C++ CPU attention (float accumulation), o in q's dtype. kd: the fp8 dtype of uint8 k, v views
    (T.kv_bits), else None."""
    for name, x in (("k", k), ("v", v)):
        if T.device_of(x) != "cpu":
            raise TypeError(f"{name}: expected a CPU tensor like q, got one on {T.device_of(x)}")
    T.dtype_name(q, "q")
    if kd is None:
        for name, x in (("k", k), ("v", v)):
            T.dtype_name(x, name)
    if kv_layout == "HND":  # strided NHD views, no copy
        k, v = k.swapaxes(0, 1), v.swapaxes(0, 1)
    kv_len = int(k.shape[0])
    o, lse = T.empty(q, (1,) + tuple(q.shape)), T.empty(q, (1, q.shape[0]), "float32")
    _C.cpu_attention_ragged(T.arg(q[None]), [0, 1], T.arg(k), T.arg(v), [0, kv_len], T.arg(o), T.arg(lse), scale,
                            logits_soft_cap=cap, window_left=window, rope=rope[0] == W.POS_ROPE_LLAMA,
                            alibi_slopes=_cpu_alibi_slopes(rope, int(q.shape[0])), kv_dtype=kd or "", v_scale=v_scale,
                            **W.pos_encoding_scalars(rope))
    return o[0], lse[0]


def _cpu_alibi_slopes(rope, num_qo_heads):
    """The CPU path's ALiBi slopes (a list; empty without ALIBI)."""
    return list(_C.alibi_slopes(num_qo_heads)) if rope[0] == W.POS_ALIBI else []
