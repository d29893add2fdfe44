"""Custom attention masks for the prefill wrappers (FlashInfer's custom_mask / packed_custom_mask).

Request i has a boolean mask [qo_len_i, kv_len_i] (row-major, True = the query
sees the key). ``custom_mask`` is the flat concatenation over requests (bool or
0/1 integers); ``packed_custom_mask`` is each request's flattened mask packed
with little bit order (``packbits(m.reshape(-1), bitorder="little")``), the
requests' bytes concatenated. plan() derives the byte offsets of the requests
(mask_indptr) from the lengths, packs ``custom_mask`` when given, and moves
the bits to the workspace's GPU; run() hands them to the kernel.

Checks happen in two steps so that, on a machine without a GPU, mask errors
surface before the workspace is looked at: MaskPlan(...) validates the
arguments against the lengths; device_bits() packs and moves the bits.
"""

import numpy as np

from . import _tensors as T
from . import _wrapper_util as W
from .quantization import segment_packbits


def indptr_lengths(indptr, name):
    """Per-request lengths of an indptr (ValueError naming it unless it starts at 0 and never decreases)."""
    lens = np.diff(indptr.astype(np.int64))
    if indptr[0] != 0 or np.any(lens < 0):
        raise ValueError(f"{name}: expected {name}[0] == 0 and non-decreasing values")
    return lens


def paged_kv_lengths(kv_indptr, last, page_size):
    """KV lengths of a page table ((pages - 1) * page_size + last, 0 without pages), checked by name."""
    pages = indptr_lengths(kv_indptr, "paged_kv_indptr")
    if last.size != pages.size:
        raise ValueError(f"paged_kv_last_page_len: expected {pages.size} entries (batch size), got {last.size}")
    bad = (pages > 0) & ((last < 1) | (last > page_size))
    if np.any(bad):
        i = int(np.argmax(bad))
        raise ValueError(f"paged_kv_last_page_len: expected 1..page_size={page_size} for a request with pages, "
                         f"got {int(last[i])} for request {i}")
    return np.where(pages > 0, (pages - 1) * page_size + last, 0)


def plan_causal(causal, masked):
    """The causal flag a prefill plan() goes on with: a custom mask decides
    what each query sees, so with one causal is dropped, as FlashInfer's
    mask mode is then custom whatever causal says (SGLang's speculative
    verify plans its tree mask with causal=True)."""
    return False if masked else causal


class MaskPlan:
    """A custom mask checked against one step's lengths; .indptr is mask_indptr (int32 byte offsets)."""

    def __init__(self, custom_mask, packed_custom_mask, causal, qo_lens, kv_lens):
        if custom_mask is not None and packed_custom_mask is not None:
            raise ValueError("custom_mask, packed_custom_mask: expected one of them, got both")
        if causal:
            raise ValueError("causal=True: not allowed with a custom mask (the mask decides what each query "
                             "sees; put the causal part into it)")
        bits = np.asarray(qo_lens, dtype=np.int64) * np.asarray(kv_lens, dtype=np.int64)
        self.bit_indptr = np.concatenate([[0], np.cumsum(bits)]).astype(np.int64)
        indptr = np.concatenate([[0], np.cumsum((bits + 7) // 8)]).astype(np.int64)
        if indptr[-1] > W.INT32_MAX:
            raise ValueError(f"custom_mask: the packed masks need {int(indptr[-1])} bytes, beyond int32 offsets")
        self.indptr = indptr.astype(np.int32)
        self.custom, self.packed = custom_mask, packed_custom_mask
        if custom_mask is not None:
            fw = T.framework(custom_mask, "custom_mask")
            n = int(np.prod(custom_mask.shape))
            if n != self.bit_indptr[-1]:
                raise ValueError(f"custom_mask: expected sum(qo_len * kv_len) = {int(self.bit_indptr[-1])} "
                                 f"elements, got {n} (shape {tuple(custom_mask.shape)})")
            floating = (custom_mask.dtype.kind in "fc") if fw == "numpy" else (
                custom_mask.is_floating_point() or custom_mask.is_complex())
            if floating:
                raise TypeError(f"custom_mask: expected a bool (or 0/1 integer) tensor, got "
                                f"{str(custom_mask.dtype).replace('torch.', '')}")
        else:
            fw = T.framework(packed_custom_mask, "packed_custom_mask")
            dt = str(packed_custom_mask.dtype).replace("torch.", "")
            if dt != "uint8":
                raise TypeError(f"packed_custom_mask: expected uint8 (packed bits), got {dt}")
            if len(packed_custom_mask.shape) != 1:
                raise ValueError(f"packed_custom_mask: expected a 1-D tensor, got shape "
                                 f"{tuple(packed_custom_mask.shape)}")
            if packed_custom_mask.shape[0] < self.indptr[-1]:
                raise ValueError(f"packed_custom_mask: expected at least sum(ceil(qo_len * kv_len / 8)) = "
                                 f"{int(self.indptr[-1])} bytes, got {packed_custom_mask.shape[0]}")

    def host_mask(self):
        """The flat 0/1 uint8 numpy mask (CPU reference path)."""
        if self.custom is not None:
            m = self.custom
            m = m.detach().cpu().numpy() if T.is_torch(m) else np.asarray(m)
            return np.ascontiguousarray(m.reshape(-1) != 0, dtype=np.uint8)
        p = self.packed
        p = p.detach().cpu().numpy() if T.is_torch(p) else np.asarray(p)
        out = [np.unpackbits(p[a:b], count=int(n), bitorder="little")
               for a, b, n in zip(self.indptr[:-1], self.indptr[1:], np.diff(self.bit_indptr))]
        return np.ascontiguousarray(np.concatenate(out) if out else np.zeros(0, np.uint8))

    def device_bits(self, device, buf, cuda_graph):
        """The packed bits as a uint8 tensor on `device`; in CUDA-graph mode copied into buf (custom_mask_buf),
        whose address a captured run() keeps."""
        torch = T._torch()
        if cuda_graph and buf is None:
            raise ValueError("custom_mask_buf: expected a uint8 CUDA tensor given to the constructor: with "
                             "use_cuda_graph=True a captured run() reads the mask from a fixed address")
        if self.custom is not None:
            m = self.custom
            m = torch.from_numpy(np.ascontiguousarray(m)) if not T.is_torch(m) else m
            bits, _ = segment_packbits(m.detach().to(device).reshape(-1), torch.from_numpy(self.bit_indptr),
                                       bitorder="little")  # host indptr: no device round trip
        else:
            p = self.packed
            bits = (torch.from_numpy(np.ascontiguousarray(p)) if not T.is_torch(p) else p.detach())
            bits = bits.to(device).contiguous()
        if not cuda_graph:
            return bits
        n = int(self.indptr[-1])
        if not (T.is_cuda(buf) and str(buf.dtype) == "torch.uint8" and buf.dim() == 1 and buf.is_contiguous()):
            raise TypeError("custom_mask_buf: expected a contiguous 1-D uint8 CUDA tensor")
        if buf.shape[0] < n:
            raise ValueError(f"custom_mask_buf: expected at least {n} bytes for this step's packed mask, got "
                             f"{buf.shape[0]}")
        buf[:n].copy_(bits[:n], non_blocking=True)
        return buf
