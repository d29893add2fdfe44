"""Rotary position embedding as standalone ops (FlashInfer's ``flashinfer.rope``
names): apply_rope, apply_rope_inplace, apply_rope_pos_ids,
apply_rope_pos_ids_inplace, their Llama 3.1 forms apply_llama31_rope,
apply_llama31_rope_inplace, apply_llama31_rope_pos_ids,
apply_llama31_rope_pos_ids_inplace, and the vLLM / SGLang style
apply_rope_with_cos_sin_cache and apply_rope_with_cos_sin_cache_inplace. The
math is that of the fused RoPE variants (tessera.variants.rope), so fused and
unfused pipelines agree.

q [nnz, num_q_heads, head_dim] and k [nnz, num_k_heads, head_dim] share one
dtype (float16 or bfloat16); head_dim is 64, 128 or 256; rotary_dim (None: all)
is a multiple of 16. Pairs are (j, j + rotary_dim / 2), or (2j, 2j + 1) with
interleave=True; pair j turns by pos / rope_scale * rope_theta^(-2j /
rotary_dim) radians. The Llama 3.1 forms divide only the low frequencies by
rope_scale: a pair whose wavelength 2 pi / rope_theta^(-2j / rotary_dim) is
below old_context_len / high_freq_factor keeps its frequency, one above
old_context_len / low_freq_factor has it divided by rope_scale, and those
between blend the two linearly in old_context_len / wavelength. The cos/sin
cache forms read pair j's cos and sin at position p from
cos_sin_cache[p, j] and cos_sin_cache[p, rotary_dim / 2 + j] (float32
[max_pos, rotary_dim]; is_neox=True pairs halves, False interleaves). CUDA
tensors run one kernel on torch's current stream; CPU tensors run the C++ CPU
path (tessera::cpu, rounded to the dtype).
"""

import numbers

import numpy as np

from . import _tensors as T
from ._native import _C


def _number(name, value):
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name}: expected a number, got {type(value).__name__}")
    return float(value)


def _options(rotary_dim, interleave, rope_scale, rope_theta):
    if rotary_dim is not None and (isinstance(rotary_dim, bool) or not isinstance(rotary_dim, numbers.Integral)):
        raise TypeError(f"rotary_dim: expected an int or None, got {type(rotary_dim).__name__}")
    return dict(rotary_dim=-1 if rotary_dim is None else int(rotary_dim), interleave=bool(interleave),
                rope_scale=_number("rope_scale", rope_scale), rope_theta=_number("rope_theta", rope_theta))


def _llama31_options(rotary_dim, interleave, rope_scale, rope_theta, low_freq_factor, high_freq_factor,
                     old_context_len):
    return dict(_options(rotary_dim, interleave, rope_scale, rope_theta), llama31=True,
                low_freq_factor=_number("low_freq_factor", low_freq_factor),
                high_freq_factor=_number("high_freq_factor", high_freq_factor),
                old_context_len=_number("old_context_len", old_context_len))


def _int32(x, like, name):
    """An int32 index tensor on like's device (lists, numpy, torch of any int dtype)."""
    if isinstance(x, (list, tuple)):
        x = np.asarray(x, dtype=np.int32)
    if isinstance(x, np.ndarray):
        if x.dtype.kind not in "iu":
            raise TypeError(f"{name}: expected integers, got {x.dtype.name}")
        x = np.ascontiguousarray(x, dtype=np.int32)
        return T._torch().from_numpy(x).to(like.device) if T.is_torch(like) else x
    if T.is_torch(x):
        if x.is_floating_point() or x.is_complex():
            raise TypeError(f"{name}: expected an integer tensor, got {str(x.dtype).replace('torch.', '')}")
        return x.to(device=like.device, dtype=T._torch().int32).contiguous()
    raise TypeError(f"{name}: expected a tensor or a list of ints, got {type(x).__name__}")


def _run(fn, q, k, q_out, k_out, *index, opts):
    T.common_framework(q=q, k=k)
    with T.on_device_of(q):
        fn(T.arg(q), T.arg(k), q_out, k_out, *index, **opts, stream=T.stream_of(q))
    return q_out, k_out


def apply_rope_pos_ids(q, k, pos_ids, rotary_dim=None, interleave=False, rope_scale=1, rope_theta=1e4):
    """RoPE of every row at pos_ids[row] (int [nnz]); returns new (q_rope, k_rope)."""
    opts = _options(rotary_dim, interleave, rope_scale, rope_theta)
    return _run(_C.apply_rope_pos_ids, q, k, T.empty(q, q.shape), T.empty(k, k.shape), _int32(pos_ids, q, "pos_ids"),
                opts=opts)


def apply_rope_pos_ids_inplace(q, k, pos_ids, rotary_dim=None, interleave=False, rope_scale=1, rope_theta=1e4):
    """apply_rope_pos_ids writing into q and k."""
    opts = _options(rotary_dim, interleave, rope_scale, rope_theta)
    _run(_C.apply_rope_pos_ids, q, k, q, k, _int32(pos_ids, q, "pos_ids"), opts=opts)


def apply_rope(q, k, indptr, offsets, rotary_dim=None, interleave=False, rope_scale=1, rope_theta=1e4):
    """RoPE of ragged rows: row n of request b (rows indptr[b] .. indptr[b + 1]) sits at position
    offsets[b] + n - indptr[b]. Returns new (q_rope, k_rope)."""
    opts = _options(rotary_dim, interleave, rope_scale, rope_theta)
    return _run(_C.apply_rope, q, k, T.empty(q, q.shape), T.empty(k, k.shape), _int32(indptr, q, "indptr"),
                _int32(offsets, q, "offsets"), opts=opts)


def apply_rope_inplace(q, k, indptr, offsets, rotary_dim=None, interleave=False, rope_scale=1, rope_theta=1e4):
    """apply_rope writing into q and k."""
    opts = _options(rotary_dim, interleave, rope_scale, rope_theta)
    _run(_C.apply_rope, q, k, q, k, _int32(indptr, q, "indptr"), _int32(offsets, q, "offsets"), opts=opts)


def apply_llama31_rope_pos_ids(q, k, pos_ids, rotary_dim=None, interleave=False, rope_scale=8, rope_theta=5e5,
                               low_freq_factor=1, high_freq_factor=4, old_context_len=8192):
    """apply_rope_pos_ids with Llama 3.1 frequencies (0 < low_freq_factor < high_freq_factor,
    old_context_len > 0); returns new (q_rope, k_rope)."""
    opts = _llama31_options(rotary_dim, interleave, rope_scale, rope_theta, low_freq_factor, high_freq_factor,
                            old_context_len)
    return _run(_C.apply_rope_pos_ids, q, k, T.empty(q, q.shape), T.empty(k, k.shape), _int32(pos_ids, q, "pos_ids"),
                opts=opts)


def apply_llama31_rope_pos_ids_inplace(q, k, pos_ids, rotary_dim=None, interleave=False, rope_scale=8,
                                       rope_theta=5e5, low_freq_factor=1, high_freq_factor=4, old_context_len=8192):
    """apply_llama31_rope_pos_ids writing into q and k."""
    opts = _llama31_options(rotary_dim, interleave, rope_scale, rope_theta, low_freq_factor, high_freq_factor,
                            old_context_len)
    _run(_C.apply_rope_pos_ids, q, k, q, k, _int32(pos_ids, q, "pos_ids"), opts=opts)


def apply_llama31_rope(q, k, indptr, offsets, rotary_dim=None, interleave=False, rope_scale=8, rope_theta=5e5,
                       low_freq_factor=1, high_freq_factor=4, old_context_len=8192):
    """apply_rope (ragged rows by indptr / offsets) with Llama 3.1 frequencies; returns new (q_rope, k_rope)."""
    opts = _llama31_options(rotary_dim, interleave, rope_scale, rope_theta, low_freq_factor, high_freq_factor,
                            old_context_len)
    return _run(_C.apply_rope, q, k, T.empty(q, q.shape), T.empty(k, k.shape), _int32(indptr, q, "indptr"),
                _int32(offsets, q, "offsets"), opts=opts)


def apply_llama31_rope_inplace(q, k, indptr, offsets, rotary_dim=None, interleave=False, rope_scale=8,
                               rope_theta=5e5, low_freq_factor=1, high_freq_factor=4, old_context_len=8192):
    """apply_llama31_rope writing into q and k."""
    opts = _llama31_options(rotary_dim, interleave, rope_scale, rope_theta, low_freq_factor, high_freq_factor,
                            old_context_len)
    _run(_C.apply_rope, q, k, q, k, _int32(indptr, q, "indptr"), _int32(offsets, q, "offsets"), opts=opts)


def _heads(x, head_size, name):
    """x [nnz, ...] seen as [nnz, heads, head_size] without a copy (so in place writes reach x)."""
    T.framework(x, name)
    shape = tuple(x.shape)
    if len(shape) < 2:
        raise ValueError(f"{name}: expected [nnz, num_heads * head_size], got shape {shape}")
    width = int(np.prod(shape[1:]))
    if width % head_size:
        raise ValueError(f"{name}: expected num_heads * head_size features (head_size={head_size}), got shape {shape}")
    new = (shape[0], width // head_size, head_size)
    if T.is_torch(x):
        try:
            view = x.view(new)
        except RuntimeError:
            raise ValueError(f"{name}: expected a layout viewable as {new} without a copy, got strides "
                             f"{tuple(x.stride())}") from None
        unit = view.stride(-1) == 1
    else:
        view = x.view()
        try:
            view.shape = new
        except (AttributeError, ValueError):
            raise ValueError(f"{name}: expected a layout viewable as {new} without a copy, got strides "
                             f"{x.strides}") from None
        unit = view.strides[-1] == view.itemsize
    if not unit and new[0] * new[1] > 0:
        raise ValueError(f"{name}: expected contiguous features (stride 1 in the last dim), got shape {shape}")
    return view


def _cos_sin_args(positions, query, key, head_size, cos_sin_cache, is_neox):
    T.common_framework(query=query, key=key, cos_sin_cache=cos_sin_cache)
    if isinstance(head_size, bool) or not isinstance(head_size, numbers.Integral):
        raise TypeError(f"head_size: expected an int, got {type(head_size).__name__}")
    if int(head_size) not in (64, 128, 256):
        raise ValueError(f"head_size: expected 64, 128 or 256, got {head_size}")
    dt = str(cos_sin_cache.dtype).replace("torch.", "") if T.is_torch(cos_sin_cache) else np.dtype(cos_sin_cache.dtype).name
    if dt != "float32":
        raise ValueError(f"cos_sin_cache: expected float32, got {dt}")
    qt = T.dtype_name(query, "query", ("float16", "bfloat16"))
    kt = T.dtype_name(key, "key", ("float16", "bfloat16"))
    if kt != qt:
        raise TypeError(f"key: expected the dtype of query ({qt}), got {kt}")
    q, k = _heads(query, int(head_size), "query"), _heads(key, int(head_size), "key")
    if k.shape[0] != q.shape[0]:
        raise ValueError(f"key: expected {q.shape[0]} rows like query, got shape {tuple(key.shape)}")
    pos = _int32(positions, q, "positions")
    if tuple(pos.shape) != (q.shape[0],):
        raise ValueError(f"positions: expected shape ({q.shape[0]},), got {tuple(pos.shape)}")
    if not T.is_cuda(pos) and pos.shape[0] and len(cos_sin_cache.shape) == 2:
        lo, hi, rows = int(pos.min()), int(pos.max()), int(cos_sin_cache.shape[0])
        if lo < 0 or hi >= rows:
            raise ValueError(f"positions: expected values in [0, {rows}) (rows of cos_sin_cache), got "
                             f"{lo if lo < 0 else hi}")
    return q, k, pos


def apply_rope_with_cos_sin_cache(positions, query, key, head_size, cos_sin_cache, is_neox=True):
    """RoPE with precomputed angles (vLLM / SGLang): query [nnz, num_q_heads * head_size] and key
    [nnz, num_k_heads * head_size] rotated at positions[row] by cos_sin_cache (float32 [max_pos,
    rotary_dim], cos in the first half, sin in the second; rotary_dim <= head_size, a multiple of 16).
    Returns new (query_out, key_out) shaped like query and key. On CUDA, a position outside the cache
    gives NaN in that row's rotated features."""
    q, k, pos = _cos_sin_args(positions, query, key, head_size, cos_sin_cache, is_neox)
    query_out, key_out = T.empty(query, query.shape), T.empty(key, key.shape)
    qo, ko = _heads(query_out, q.shape[2], "query_out"), _heads(key_out, k.shape[2], "key_out")
    with T.on_device_of(q):
        _C.apply_rope_pos_ids_cos_sin_cache(T.arg(q), T.arg(k), qo, ko, T.arg(cos_sin_cache), pos,
                                            interleave=not bool(is_neox), stream=T.stream_of(q))
    return query_out, key_out


def apply_rope_with_cos_sin_cache_inplace(positions, query, key, head_size, cos_sin_cache, is_neox=True):
    """apply_rope_with_cos_sin_cache writing into query and key."""
    q, k, pos = _cos_sin_args(positions, query, key, head_size, cos_sin_cache, is_neox)
    with T.on_device_of(q):
        _C.apply_rope_pos_ids_cos_sin_cache(T.arg(q), T.arg(k), T.arg(q), T.arg(k), T.arg(cos_sin_cache), pos,
                                            interleave=not bool(is_neox), stream=T.stream_of(q))
