"""Paged KV cache maintenance (FlashInfer's ``flashinfer.page`` names).

append_paged_kv_cache writes new K/V tokens into a paged cache. The page
table it is given describes the cache *after* the append (update kv_indptr /
kv_last_page_len first, as with FlashInfer), so each appended token's position
is already inside its request's length.

CUDA tensors (torch) run one copy kernel on torch's current stream with no
synchronization (so it can be captured in a CUDA graph); there the index
tensors are not checked on the host, and a token whose request, position or
page index falls outside the page table or the cache is skipped rather than
written out of bounds. Host tensors (numpy arrays or torch CPU tensors) are
written by plain loops after every index has been checked (ValueError naming
the argument; nothing is written then).
"""

import numpy as np

from . import _tensors as T
from ._native import _C
from .decode import _LAYOUTS, _unpack_paged_kv_cache


def append_paged_kv_cache(append_key, append_value, batch_indices, positions, paged_kv_cache, kv_indices, kv_indptr,
                          kv_last_page_len, kv_layout="NHD"):
    """Appends tokens to a paged KV cache, in place.

    Args:
        append_key, append_value: [nnz, num_kv_heads, head_dim], the cache's dtype.
        batch_indices: int32 [nnz], the request of each appended token.
        positions: int32 [nnz], each token's position within its request.
        paged_kv_cache: (k_cache, v_cache), each [num_pages, page_size,
            num_kv_heads, head_dim] (NHD) or [num_pages, num_kv_heads,
            page_size, head_dim] (HND), or one interleaved tensor
            [num_pages, 2, ...].
        kv_indices: int32 page indices of the page table.
        kv_indptr: int32 [batch + 1] page-table row pointers.
        kv_last_page_len: int32 [batch] tokens in each request's last page.
        kv_layout: "NHD" or "HND".

    All tensors share one framework and device. Token i is written to page
    kv_indices[kv_indptr[b] + p // page_size], slot p % page_size, with
    b = batch_indices[i], p = positions[i].
    """
    if kv_layout not in _LAYOUTS:
        raise ValueError(f"kv_layout: expected 'NHD' or 'HND', got {kv_layout!r}")
    k, v = _unpack_paged_kv_cache(paged_kv_cache)
    T.common_framework(append_key=append_key, append_value=append_value, batch_indices=batch_indices,
                       positions=positions, paged_kv_cache=k, kv_indices=kv_indices, kv_indptr=kv_indptr,
                       kv_last_page_len=kv_last_page_len)
    with T.on_device_of(k):
        _C.append_paged_kv_cache(T.arg(append_key), T.arg(append_value), T.arg(batch_indices), T.arg(positions),
                                 T.arg(k), T.arg(v), T.arg(kv_indices), T.arg(kv_indptr), T.arg(kv_last_page_len),
                                 kv_layout, T.stream_of(k))


def get_seq_lens(kv_indptr, kv_last_page_len, page_size):
    """Each request's KV length: (pages - 1) * page_size + last_page_len, 0 without pages."""
    pages = kv_indptr[1:] - kv_indptr[:-1]
    full = (pages - 1).clip(min=0) * page_size
    lens = full + kv_last_page_len
    return lens * (pages > 0)


def get_batch_indices_positions(append_indptr, seq_lens, nnz):
    """batch_indices and positions (int32 [nnz]) for append_paged_kv_cache.

    Request b appends tokens append_indptr[b] .. append_indptr[b+1]-1, which
    become the last tokens of its seq_lens[b] (the length after the append).
    Works on numpy arrays and torch tensors (on their device).
    """
    counts = append_indptr[1:] - append_indptr[:-1]
    if T.is_torch(append_indptr):
        torch = T._torch()
        dev = append_indptr.device
        batch = torch.repeat_interleave(torch.arange(len(counts), device=dev), counts.long(), output_size=nnz)
        starts = (seq_lens.to(dev).long() - counts.long())[batch]
        offsets = torch.arange(nnz, device=dev) - append_indptr.long()[batch]
        return batch.int(), (starts + offsets).int()
    append_indptr = np.asarray(append_indptr, dtype=np.int64)
    counts = np.asarray(counts, dtype=np.int64)
    batch = np.repeat(np.arange(len(counts)), counts)
    positions = (np.asarray(seq_lens, dtype=np.int64) - counts)[batch] + np.arange(nnz) - append_indptr[batch]
    return batch.astype(np.int32), positions.astype(np.int32)
