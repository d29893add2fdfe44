"""Bit packing (FlashInfer's ``flashinfer.quantization`` names): packbits and segment_packbits.

Custom attention masks travel packed, 8 positions per byte. FlashInfer's
kernels (and Tessera's) read **little** bit order: position i of a request's
flattened [qo_len, kv_len] mask is bit i % 8 of byte i // 8, i.e.
``numpy.packbits(mask, bitorder="little")`` per request. As in FlashInfer (and
numpy) the default here is "big", so pass bitorder="little" when packing a
mask yourself; the prefill wrappers pack ``custom_mask`` with it.

Pure torch (CPU or CUDA, no host synchronisation beyond segment_packbits'
output length) or numpy, results in the input's framework and device.
"""

import numpy as np

from .. import _tensors as T
from ..jit import gen_quantization_module  # noqa: F401 (FlashInfer name)

_ORDERS = ("big", "little")


def _bitorder(bitorder):
    if bitorder not in _ORDERS:
        raise ValueError(f"bitorder: expected 'big' or 'little', got {bitorder!r}")
    return bitorder


def _flat(x, name):
    fw = T.framework(x, name)
    if len(x.shape) != 1:
        raise ValueError(f"{name}: expected a 1-D array, got shape {tuple(x.shape)}")
    kind = str(x.dtype).replace("torch.", "")
    if fw == "numpy":
        ok = x.dtype.kind in "biu"
    else:
        ok = not (x.is_floating_point() or x.is_complex())
    if not ok:
        raise TypeError(f"{name}: expected a bool or integer array (nonzero = 1), got {kind}")
    return fw


def _weights(torch, bitorder, device):
    w = [1 << i for i in range(8)]
    return torch.tensor(w if bitorder == "little" else w[::-1], dtype=torch.int32, device=device)


def packbits(x, bitorder="big"):
    """Packs the elements of a 1-D binary-valued array into uint8, as numpy.packbits.

    Args:
        x: 1-D bool or integer array (torch on any device, or numpy); nonzero
            elements are 1 bits.
        bitorder: "big" (numpy's and FlashInfer's default: element 0 is the
            byte's most significant bit) or "little" (element 0 is bit 0, the
            order attention masks use).

    Returns:
        uint8 array of ceil(len(x) / 8) bytes, the last one zero-padded.
    """
    bitorder = _bitorder(bitorder)
    if _flat(x, "x") == "numpy":
        return np.packbits(x != 0, bitorder=bitorder)
    torch = T._torch()
    n = x.shape[0]
    bits = torch.zeros(((n + 7) // 8) * 8, dtype=torch.int32, device=x.device)
    bits[:n] = (x != 0).to(torch.int32)
    return (bits.view(-1, 8) * _weights(torch, bitorder, x.device)).sum(dim=1).to(torch.uint8)


def segment_packbits(x, indptr, bitorder="big"):
    """Packs each segment x[indptr[i]:indptr[i+1]] on its own, as numpy.packbits per segment.

    Args:
        x: 1-D bool or integer array of indptr[-1] elements (torch or numpy).
        indptr: int array [batch + 1], starting at 0, non-decreasing.
        bitorder: "big" (default, as FlashInfer) or "little".

    Returns:
        (y, new_indptr): y uint8 with segment i's bytes at
        y[new_indptr[i]:new_indptr[i+1]], new_indptr[i+1] - new_indptr[i] =
        ceil((indptr[i+1] - indptr[i]) / 8); new_indptr int32 on indptr's device.
    """
    bitorder = _bitorder(bitorder)
    fw = _flat(x, "x")
    T.common_framework(x=x, indptr=indptr)
    ip = np.asarray(indptr.detach().cpu().numpy() if fw == "torch" else indptr)
    if ip.ndim != 1 or ip.size < 1 or ip.dtype.kind not in "iu":
        raise ValueError(f"indptr: expected a 1-D integer array of batch + 1 >= 1 entries, got shape "
                         f"{tuple(ip.shape)} of {ip.dtype}")
    ip = ip.astype(np.int64)
    if ip[0] != 0 or np.any(np.diff(ip) < 0):
        raise ValueError("indptr: expected indptr[0] == 0 and non-decreasing values")
    if ip[-1] != x.shape[0]:
        raise ValueError(f"x: expected indptr[-1] = {int(ip[-1])} elements, got {x.shape[0]}")
    seg = np.diff(ip)
    new_ip = np.concatenate([[0], np.cumsum((seg + 7) // 8)]).astype(np.int64)
    if new_ip[-1] > 2**31 - 1:
        raise ValueError(f"indptr: the packed segments need {int(new_ip[-1])} bytes, beyond int32 offsets")
    if fw == "numpy":
        y = np.zeros(int(new_ip[-1]), dtype=np.uint8)
        for i in range(seg.size):
            y[new_ip[i]: new_ip[i + 1]] = np.packbits(x[ip[i]: ip[i + 1]] != 0, bitorder=bitorder)
        return y, new_ip.astype(np.int32)
    torch = T._torch()
    dev = x.device
    # Element e of segment s is bit (e - ip[s]) % 8 of byte new_ip[s] + (e - ip[s]) // 8.
    seg_t = torch.from_numpy(seg).to(dev)
    owner = torch.repeat_interleave(torch.arange(seg.size, device=dev), seg_t, output_size=int(ip[-1]))
    pos = torch.arange(int(ip[-1]), device=dev) - torch.from_numpy(ip[:-1]).to(dev)[owner]
    byte = torch.from_numpy(new_ip[:-1]).to(dev)[owner] + pos // 8
    shift = (pos % 8 if bitorder == "little" else 7 - pos % 8).to(torch.int32)
    y = torch.zeros(int(new_ip[-1]), dtype=torch.int32, device=dev)
    y.index_add_(0, byte, (x != 0).to(torch.int32) << shift)
    return y.to(torch.uint8), torch.from_numpy(new_ip.astype(np.int32)).to(indptr.device)
