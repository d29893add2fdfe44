"""Rotary position embedding as standalone ops (FlashInfer's ``flashinfer.rope``
names): apply_rope, apply_rope_inplace, apply_rope_pos_ids,
apply_rope_pos_ids_inplace. The math is that of the fused RoPE variants
(tessera.variants.rope), so fused and unfused pipelines agree.

q [nnz, num_q_heads, head_dim] and k [nnz, num_k_heads, head_dim] share one
dtype (float16 or bfloat16); head_dim is 64, 128 or 256; rotary_dim (None: all)
is a multiple of 16. Pairs are (j, j + rotary_dim / 2), or (2j, 2j + 1) with
interleave=True; pair j turns by pos / rope_scale * rope_theta^(-2j /
rotary_dim) radians. CUDA tensors run one kernel on torch's current stream;
CPU tensors run the C++ CPU path (tessera::cpu, rounded to the dtype).
"""

import numbers

import numpy as np

from . import _tensors as T
from ._native import _C


def _options(rotary_dim, interleave, rope_scale, rope_theta):
    if rotary_dim is not None and (isinstance(rotary_dim, bool) or not isinstance(rotary_dim, numbers.Integral)):
        raise TypeError(f"rotary_dim: expected an int or None, got {type(rotary_dim).__name__}")
    for name, value in (("rope_scale", rope_scale), ("rope_theta", rope_theta)):
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            raise TypeError(f"{name}: expected a number, got {type(value).__name__}")
    return dict(rotary_dim=-1 if rotary_dim is None else int(rotary_dim), interleave=bool(interleave),
                rope_scale=float(rope_scale), rope_theta=float(rope_theta))


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
