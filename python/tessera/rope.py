"""Rotary position embedding as standalone ops (FlashInfer's ``flashinfer.rope``
names): apply_rope, apply_rope_inplace, apply_rope_pos_ids,
apply_rope_pos_ids_inplace, their Llama 3.1 forms apply_llama31_rope,
apply_llama31_rope_inplace, apply_llama31_rope_pos_ids,
apply_llama31_rope_pos_ids_inplace, and the vLLM / SGLang style
apply_rope_with_cos_sin_cache and apply_rope_with_cos_sin_cache_inplace, and
the fused fp8 cache write of the decode step: rope_quantize_fp8,
mla_rope_quantize_fp8 and rope_quantize_fp8_append_paged_kv_cache (RoPE from a
cos/sin cache, then value * quant_scale rounded to fp8, k / v written into a
paged fp8 cache, one kernel). The
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



def _reshape_no_copy(x, shape):
    """A view of numpy array x with this shape; ValueError where that needs a copy."""
    try:
        return np.reshape(x, shape, copy=False)  # numpy >= 2.1
    except TypeError:  # older numpy: assigning the shape of a view raises the same way
        view = x.view()
        view.shape = shape
        return view

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
        try:
            view = _reshape_no_copy(x, new)
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


# ---------------------------------------------------------------- fused RoPE + fp8 quantize (+ paged append)
_LAYOUTS = ("NHD", "HND")


def _fp8_name(dtype, name):
    s = str(dtype).replace("torch.", "")
    if s not in T.FP8:
        raise ValueError(f"{name}: expected torch.float8_e4m3fn or torch.float8_e5m2, got {dtype}")
    return s


def _quantize_dtype(quantize_dtype, outs):
    """FlashInfer's rule: the given dtype, else the first given output's, else float8_e4m3fn."""
    if quantize_dtype is not None:
        return _fp8_name(quantize_dtype, "quantize_dtype")
    for name, out in outs:
        if out is not None:
            return _fp8_name(T.dtype_str(out), name)
    return "float8_e4m3fn"


def _empty_fp8(like, shape, dt):
    if T.is_torch(like):
        torch = T._torch()
        return torch.empty(tuple(int(n) for n in shape), dtype=getattr(torch, dt), device=like.device)
    try:
        import ml_dtypes
    except ImportError:
        raise TypeError("q_rope: fp8 outputs of numpy arrays need ml_dtypes; pass torch tensors") from None
    return np.empty(tuple(int(n) for n in shape), dtype=getattr(ml_dtypes, dt))


def _fp8_out(out, like, dt, name):
    """(the fp8 output to return, its bits as handed to the bindings)."""
    if out is None:
        if like is None:
            return None, None
        out = _empty_fp8(like, like.shape, dt)
    bits, _ = T.kv_bits(out, name, dt)
    return out, bits


def _check_rope_inputs(q_rope, k_rope, cos_sin_cache, is_neox, quant_scale_q, quant_scale_kv):
    for name, x in (("q_rope", q_rope), ("k_rope", k_rope), ("cos_sin_cache", cos_sin_cache)):
        if x is None:
            raise ValueError(f"{name}: expected a tensor, got None")
        T.framework(x, name)
    if T.dtype_str(cos_sin_cache) != "float32":
        raise ValueError(f"cos_sin_cache: expected float32, got {T.dtype_str(cos_sin_cache)}")
    if len(q_rope.shape) != 3:
        raise ValueError(f"q_rope: expected [nnz, num_qo_heads, rope_dim], got shape {tuple(q_rope.shape)}")
    if len(k_rope.shape) not in (2, 3):
        raise ValueError(f"k_rope: expected [nnz, num_kv_heads, rope_dim] or [nnz, rope_dim] (MLA), got shape "
                         f"{tuple(k_rope.shape)}")
    if not isinstance(is_neox, (bool, np.bool_)):
        raise TypeError(f"is_neox: expected a bool, got {type(is_neox).__name__}")
    return _number("quant_scale_q", quant_scale_q), _number("quant_scale_kv", quant_scale_kv)


def rope_quantize_fp8(q_rope, k_rope, q_nope, k_nope, cos_sin_cache, pos_ids, is_neox=True, quantize_dtype=None,
                      quant_scale_q=1.0, quant_scale_kv=1.0, q_rope_out=None, k_rope_out=None, q_nope_out=None,
                      k_nope_out=None, enable_pdl=False, backend="cuda"):
    """RoPE on the rotary parts, then every value times its quant scale, rounded to fp8 (one fused kernel).

    q_rope [nnz, num_qo_heads, rope_dim] and k_rope [nnz, num_kv_heads, rope_dim] (or [nnz, rope_dim], MLA) are
    rotated at pos_ids by cos_sin_cache (float32 [max_pos, rope_dim], cos in the first half, sin in the second;
    is_neox=True pairs the halves, False interleaves), in float32 with one rounding per operation; q_nope /
    k_nope (None: no features) pass unrotated. Every q value is multiplied by quant_scale_q, every k value by
    quant_scale_kv (FlashInfer's convention) and rounded to quantize_dtype (None: the outputs' dtype, else
    float8_e4m3fn) to nearest even, saturating (+-448 / +-57344). rope_dim and no_rope_dim are multiples of
    16. Returns (q_rope_out, k_rope_out, q_nope_out, k_nope_out), allocated when None. enable_pdl is accepted
    and ignored; backend "cuda" and "cutile" both run Tessera's kernel. A position outside the cache gives NaN
    on CUDA (not read back) and a ValueError on the CPU.
    """
    if backend not in ("cuda", "cutile"):
        raise ValueError(f"backend: expected 'cuda' or 'cutile', got {backend!r}")
    sq, skv = _check_rope_inputs(q_rope, k_rope, cos_sin_cache, is_neox, quant_scale_q, quant_scale_kv)
    dt = _quantize_dtype(quantize_dtype, (("q_rope_out", q_rope_out), ("k_rope_out", k_rope_out),
                                          ("q_nope_out", q_nope_out), ("k_nope_out", k_nope_out)))
    T.common_framework(q_rope=q_rope, k_rope=k_rope, cos_sin_cache=cos_sin_cache)
    pos = _int32(pos_ids, q_rope, "pos_ids")
    nnz, hq = q_rope.shape[0], q_rope.shape[1]
    if q_nope is None:
        q_nope = T.empty(q_rope, (nnz, hq, 0))
    if k_nope is None:
        k_nope = T.empty(k_rope, tuple(k_rope.shape[:-1]) + (0,))
    q_rope_out, qro = _fp8_out(q_rope_out, q_rope, dt, "q_rope_out")
    k_rope_out, kro = _fp8_out(k_rope_out, k_rope, dt, "k_rope_out")
    q_nope_out, qno = _fp8_out(q_nope_out, q_nope, dt, "q_nope_out")
    k_nope_out, kno = _fp8_out(k_nope_out, k_nope, dt, "k_nope_out")
    with T.on_device_of(q_rope):
        _C.rope_quantize_fp8(T.arg(q_rope), T.arg(k_rope), T.arg(q_nope), T.arg(k_nope), None, T.arg(cos_sin_cache),
                             pos, qro, kro, qno, kno, None, None, None, None, None, None, out_dtype=dt,
                             interleave=not bool(is_neox), quant_scale_q=sq, quant_scale_kv=skv,
                             stream=T.stream_of(q_rope))
    return q_rope_out, k_rope_out, q_nope_out, k_nope_out


def mla_rope_quantize_fp8(q_rope, k_rope, q_nope, k_nope, cos_sin_cache, pos_ids, is_neox=True, quantize_dtype=None,
                          quant_scale_q=1.0, quant_scale_kv=1.0, q_rope_out=None, k_rope_out=None, q_nope_out=None,
                          k_nope_out=None, enable_pdl=False):
    """rope_quantize_fp8 with MLA's 2-D k_rope [nnz, rope_dim] / k_nope [nnz, no_rope_dim] (as FlashInfer)."""
    return rope_quantize_fp8(q_rope, k_rope, q_nope, k_nope, cos_sin_cache, pos_ids, is_neox, quantize_dtype,
                             quant_scale_q, quant_scale_kv, q_rope_out, k_rope_out, q_nope_out, k_nope_out, enable_pdl)


def rope_quantize_fp8_append_paged_kv_cache(q_rope, k_rope, q_nope, k_nope, v, cos_sin_cache, pos_ids,
                                            paged_kv_cache, kv_indices, kv_indptr, batch_indices, positions,
                                            is_neox=True, quantize_dtype=None, quant_scale_q=1.0, quant_scale_kv=1.0,
                                            page_size=16, kv_layout="NHD", q_rope_out=None, q_nope_out=None,
                                            enable_pdl=False):
    """rope_quantize_fp8 whose k (and v) go straight into a paged fp8 cache, in one kernel.

    GQA / MHA (k_rope 3-D): paged_kv_cache = (k_cache, v_cache), each [num_pages, page_size, num_kv_heads,
    rope_dim + no_rope_dim] (NHD) or [num_pages, num_kv_heads, page_size, head_dim] (HND); k_rope fills the
    first rope_dim features of the K row, k_nope the rest, v (same heads, head_dim features) the V row. MLA
    (k_rope 2-D, v None): paged_kv_cache = (ckv_cache [num_pages, page_size, no_rope_dim], kpe_cache
    [num_pages, page_size, rope_dim]). Caches must already have quantize_dtype. Token i goes to page
    kv_indices[kv_indptr[b] + positions[i] // page_size], slot positions[i] % page_size, b = batch_indices[i]
    (from get_batch_indices_positions); b < 0 marks padding: nothing of it is written, q included (as
    FlashInfer). On CUDA the indices are not read back: a token whose request or page the table and cache do
    not cover keeps its cache slots untouched (its q is written). On the CPU every index is checked first
    (ValueError naming it). Returns (q_rope_out, q_nope_out).

    CUDA graphs: as append_paged_kv_cache, kv_indptr and kv_indices are read to the end of the buffers behind
    1-D int32 CUDA views of stride 1, so a captured graph follows larger tables written into the same buffers
    before a replay (int64 tables are converted at capture time and bounded by their own length).
    """
    sq, skv = _check_rope_inputs(q_rope, k_rope, cos_sin_cache, is_neox, quant_scale_q, quant_scale_kv)
    mla = len(k_rope.shape) == 2
    if not isinstance(paged_kv_cache, (tuple, list)) or len(paged_kv_cache) != 2:
        raise ValueError("paged_kv_cache: expected a tuple of 2 tensors, (k_cache, v_cache) or (ckv_cache, kpe_cache)")
    cache0, cache1 = paged_kv_cache
    if mla and v is not None:
        raise ValueError("v: MLA (2-D k_rope) takes no V tensor; pass None")
    if not mla and v is None:
        raise ValueError("v: GQA / MHA expects a V tensor, got None (only MLA passes None)")
    if kv_layout not in _LAYOUTS:
        raise ValueError(f"kv_layout: expected 'NHD' or 'HND', got {kv_layout!r}")
    if isinstance(page_size, bool) or not isinstance(page_size, numbers.Integral):
        raise TypeError(f"page_size: expected an int, got {type(page_size).__name__}")
    dt = _quantize_dtype(quantize_dtype, (("q_rope_out", q_rope_out), ("q_nope_out", q_nope_out)))
    name0, name1 = ("ckv_cache", "kpe_cache") if mla else ("paged_kv_cache", "paged_kv_cache")
    for name, c in ((name0, cache0), (name1, cache1)):
        T.framework(c, name)
        if T.dtype_str(c) not in (dt, "uint8"):
            raise ValueError(f"{name}: expected the quantize dtype {dt}, got {T.dtype_str(c)}")
        if len(c.shape) != (3 if mla else 4):
            raise ValueError(f"{name}: expected {3 if mla else 4} dimensions, got shape {tuple(c.shape)}")
    cache_page = cache0.shape[1] if mla or kv_layout == "NHD" else cache0.shape[2]
    if int(page_size) != int(cache_page):
        raise ValueError(f"page_size: expected the cache's page size {cache_page}, got {page_size}")
    T.common_framework(q_rope=q_rope, k_rope=k_rope, cos_sin_cache=cos_sin_cache, paged_kv_cache=cache0)
    nnz, hq = q_rope.shape[0], q_rope.shape[1]
    if q_nope is None:
        q_nope = T.empty(q_rope, (nnz, hq, 0))
    if k_nope is None:
        k_nope = T.empty(k_rope, tuple(k_rope.shape[:-1]) + (0,))
    index = [_int32(x, q_rope, name) for x, name in ((pos_ids, "pos_ids"), (kv_indices, "kv_indices"),
                                                     (kv_indptr, "kv_indptr"), (batch_indices, "batch_indices"),
                                                     (positions, "positions"))]
    q_rope_out, qro = _fp8_out(q_rope_out, q_rope, dt, "q_rope_out")
    q_nope_out, qno = _fp8_out(q_nope_out, q_nope, dt, "q_nope_out")
    c0, _ = T.kv_bits(cache0, name0, dt)
    c1, _ = T.kv_bits(cache1, name1, dt)
    bounds = {}
    if T.is_cuda(q_rope):  # how far the kernel may read the tables: to the end of their buffers
        bounds = dict(max_batch=max(T.int32_capacity(index[2]) - 1, 0), max_indices=T.int32_capacity(index[1]))
    with T.on_device_of(q_rope):
        _C.rope_quantize_fp8(T.arg(q_rope), T.arg(k_rope), T.arg(q_nope), T.arg(k_nope), T.arg(v),
                             T.arg(cos_sin_cache), index[0], qro, None, qno, None, c0, c1, index[1], index[2],
                             index[3], index[4], kv_layout=kv_layout, out_dtype=dt, interleave=not bool(is_neox),
                             quant_scale_q=sq, quant_scale_kv=skv, stream=T.stream_of(q_rope), **bounds)
    return q_rope_out, q_nope_out
