"""Paged KV cache maintenance (FlashInfer's ``flashinfer.page`` names).

append_paged_kv_cache writes new K/V tokens into a paged cache. The page
table it is given describes the cache *after* the append (update kv_indptr /
kv_last_page_len first, as with FlashInfer), so each appended token's position
is already inside its request's length.

CUDA tensors (torch) run one copy kernel on torch's current stream with no
synchronization (so it can be captured in a CUDA graph); there the index
tensors are not checked on the host, and a token whose request, position or
page index falls outside the page table or the cache is skipped rather than
written out of bounds. The kernel reads the int32 tables as far as their
buffers reach, not just the views passed: a graph captured with views of
preallocated int32 buffers (kv_indptr_buf[:bs + 1], ...) follows the larger
tables written into those buffers before a replay. Host tensors (numpy arrays or torch CPU tensors) are
written by plain loops after every index has been checked (ValueError naming
the argument; nothing is written then).
"""

import numbers

import numpy as np

from . import _tensors as T
from . import _wrapper_util as W
from ._native import _C
from .jit import gen_page_module  # noqa: F401 (FlashInfer name)
from .decode import _LAYOUTS, _unpack_paged_kv_cache


def _int32_indices(x, name):
    """An index tensor as int32 (FlashInfer casts its index tensors too): any integer dtype is accepted; host
    values must fit. Anything else is left for the C++ checks, which name the argument."""
    if isinstance(x, np.ndarray) and x.dtype.kind in "iu" and x.dtype != np.int32:
        if x.size and (int(x.min()) < -W.INT32_MAX - 1 or int(x.max()) > W.INT32_MAX):
            raise ValueError(f"{name}: expected values that fit in int32")
        return x.astype(np.int32)
    if T.is_torch(x) and str(x.dtype) in ("torch.int64", "torch.int16", "torch.int8", "torch.uint8"):
        return x.int()
    return x


def append_paged_kv_cache(append_key, append_value, batch_indices, positions, paged_kv_cache, kv_indices, kv_indptr,
                          kv_last_page_len, kv_layout="NHD", *, k_scale=None, v_scale=None):
    """Appends tokens to a paged KV cache, in place.

    Args:
        append_key, append_value: [nnz, num_kv_heads, head_dim] (each of
            its cache's width: K and V may differ, head dims 192 / 128 as
            in DeepSeek-style prefill caches), the cache's dtype (copied bit
            for bit), or float16 / bfloat16 into an fp8
            cache (torch.float8_e4m3fn / float8_e5m2): quantized, each value
            divided by k_scale (v_scale), rounded to nearest even and
            saturated to the format's largest finite value (448 / 57344),
            the same bits on the GPU and the CPU.
        batch_indices: int [nnz], the request of each appended token.
        positions: int [nnz], each token's position within its request.
        paged_kv_cache: (k_cache, v_cache), each [num_pages, page_size,
            num_kv_heads, head_dim] (NHD) or [num_pages, num_kv_heads,
            page_size, head_dim] (HND) (v_cache 128 wide with a 192-wide
            k_cache), or one interleaved tensor [num_pages, 2, ...].
        kv_indices: int page indices of the page table.
        kv_indptr: int [batch + 1] page-table row pointers.
        kv_last_page_len: int [batch] tokens in each request's last page.
        kv_layout: "NHD" or "HND".
        k_scale, v_scale: (Tessera's, keyword-only) the scales a quantizing
            append divides by, those run() reads the cache with: None (1),
            floats, or 1-element float32 tensors on the cache's device (read
            by the kernel when it runs, so a captured CUDA graph appends with
            their current values). Only None for a copy of the cache's dtype.

    Index tensors may be int32 or int64 (read as int32, as FlashInfer
    does). All tensors share one framework and device. Token i is written to
    page kv_indices[kv_indptr[b] + p // page_size], slot p % page_size, with
    b = batch_indices[i], p = positions[i].

    CUDA graphs: the kernel reads kv_indptr, kv_last_page_len and kv_indices
    up to the end of the buffers behind 1-D int32 CUDA views of stride 1, so
    a graph captured with views of preallocated buffers appends by the
    tables a replay finds there, however many requests and pages they now
    hold. Tables that grow under a captured graph need int32 buffers (as
    vLLM and SGLang keep them): an int64 table is converted to a new tensor
    at capture time, bounded by its own length and never updated.
    """
    if kv_layout not in _LAYOUTS:
        raise ValueError(f"kv_layout: expected 'NHD' or 'HND', got {kv_layout!r}")
    k, v = _unpack_paged_kv_cache(paged_kv_cache)
    T.common_framework(append_key=append_key, append_value=append_value, batch_indices=batch_indices,
                       positions=positions, paged_kv_cache=k, kv_indices=kv_indices, kv_indptr=kv_indptr,
                       kv_last_page_len=kv_last_page_len)
    index = [_int32_indices(x, name) for x, name in ((batch_indices, "batch_indices"), (positions, "positions"),
                                                     (kv_indices, "kv_indices"), (kv_indptr, "kv_indptr"),
                                                     (kv_last_page_len, "kv_last_page_len"))]
    # fp8 tensors cross as uint8 views with their dtype named (T.kv_bits).
    k, cache_dt = T.kv_bits(k, "paged_kv_cache")
    v, v_dt = T.kv_bits(v, "paged_kv_cache", cache_dt)
    append_key, append_dt = T.kv_bits(append_key, "append_key")
    append_value, _ = T.kv_bits(append_value, "append_value", append_dt)
    scales = {}
    for name, x in (("k_scale", k_scale), ("v_scale", v_scale)):
        if W.is_tensor(x):
            scales[name + "_tensor"] = T.arg(W.scale_tensor(name, x, k, "paged_kv_cache"))
        elif x is not None:
            if isinstance(x, bool) or not isinstance(x, numbers.Real):
                raise TypeError(f"{name}: expected a float, a 1-element float32 tensor or None, got {type(x).__name__}")
            scales[name] = float(x)
    bounds = {}
    if T.is_cuda(k):  # how far the kernel may read the tables: to the end of their buffers
        indices_cap, indptr_cap, last_cap = (T.int32_capacity(x) for x in index[2:])
        bounds = dict(max_batch=max(min(indptr_cap - 1, last_cap), 0), max_indices=indices_cap)
    with T.on_device_of(k):
        _C.append_paged_kv_cache(T.arg(append_key), T.arg(append_value), T.arg(index[0]), T.arg(index[1]),
                                 T.arg(k), T.arg(v), T.arg(index[2]), T.arg(index[3]), T.arg(index[4]),
                                 kv_layout, T.stream_of(k), cache_dtype=cache_dt or "", append_dtype=append_dt or "",
                                 **scales, **bounds)


def get_seq_lens(kv_indptr, kv_last_page_len, page_size):
    """Each request's KV length: (pages - 1) * page_size + last_page_len, 0 without pages."""
    pages = kv_indptr[1:] - kv_indptr[:-1]
    full = (pages - 1).clip(min=0) * page_size
    lens = full + kv_last_page_len
    return lens * (pages > 0)


def get_batch_indices_positions(append_indptr, seq_lens, nnz, batch_indices=None, positions=None):
    """batch_indices and positions (int32 [nnz]) for append_paged_kv_cache.

    Request b appends tokens append_indptr[b] .. append_indptr[b+1]-1, which
    become the last tokens of its seq_lens[b] (the length after the append).
    Entries at or beyond append_indptr[-1] (nnz may be larger, e.g. a CUDA
    graph's padded size) get batch index -1 and position 0, as in FlashInfer
    (a given positions buffer keeps its values there, as FlashInfer's does).
    Works on numpy arrays and torch tensors (on their device, without a
    host synchronization); indices may be int32 or int64.

    batch_indices, positions: optional int32 [nnz] outputs on
    append_indptr's device, written in place and returned.
    """
    nnz = int(nnz)
    torch_in = T.is_torch(append_indptr)
    for name, out in (("batch_indices", batch_indices), ("positions", positions)):
        if out is not None:
            _check_output(out, name, nnz, append_indptr, torch_in)
    if torch_in:
        torch = T._torch()
        dev = append_indptr.device
        indptr = append_indptr.long()
        rows = torch.arange(nnz, device=dev)
        batch = torch.searchsorted(indptr[1:].contiguous(), rows, right=True)
        valid = batch < indptr.numel() - 1
        b = batch.clamp(max=max(indptr.numel() - 2, 0))
        start = seq_lens.to(dev).long() - (indptr[1:] - indptr[:-1])
        pos = start[b] + rows - indptr[b] if indptr.numel() > 1 else rows
        batch, pos = torch.where(valid, batch, -1).int(), torch.where(valid, pos, 0).int()
    else:
        indptr = np.asarray(append_indptr, dtype=np.int64)
        rows = np.arange(nnz, dtype=np.int64)
        batch = np.searchsorted(indptr[1:], rows, side="right")
        valid = batch < indptr.size - 1
        b = np.minimum(batch, max(indptr.size - 2, 0))
        start = np.asarray(seq_lens, dtype=np.int64) - np.diff(indptr)
        pos = start[b] + rows - indptr[b] if indptr.size > 1 else rows
        batch, pos = np.where(valid, batch, -1).astype(np.int32), np.where(valid, pos, 0).astype(np.int32)
    if batch_indices is not None:
        batch_indices[...] = batch
        batch = batch_indices
    if positions is not None:
        if torch_in:
            positions.copy_(T._torch().where(valid, pos, positions))  # no host synchronization
        else:
            np.copyto(positions, pos, where=valid)
        pos = positions
    return batch, pos


def _check_output(out, name, nnz, like, torch_in):
    dtype = str(out.dtype).replace("torch.", "") if T.is_torch(out) else np.dtype(out.dtype).name
    if T.is_torch(out) != torch_in or (torch_in and out.device != like.device):
        raise TypeError(f"{name}: expected a tensor on append_indptr's device, got {type(out).__name__} on "
                        f"{T.device_of(out)}")
    if dtype != "int32":
        raise TypeError(f"{name}: expected int32, got {dtype}")
    if tuple(out.shape) != (nnz,):
        raise ValueError(f"{name}: expected shape ({nnz},), got {tuple(out.shape)}")
from .mla import append_paged_mla_kv_cache  # noqa: E402,F401 (FlashInfer keeps it in flashinfer.page)

# The public names, re-exports included (so linters see them used).
__all__ = ["append_paged_kv_cache", "append_paged_mla_kv_cache", "gen_page_module", "get_batch_indices_positions",
           "get_seq_lens"]
