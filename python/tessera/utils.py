"""FlashInfer's utility names (flashinfer.utils) that callers and test
suites use to pick code paths: device capability queries, the enums of
positional encoding, mask mode and KV layout, and small integer helpers.

The capability queries answer for Tessera: is_sm90a_supported is true where
Tessera runs its Hopper (sm_90a) kernels, is_fa3_backend_supported and
is_fa3_prefill_head_dim_supported say what backend="fa3" accepts.
"""

from enum import Enum


class PosEncodingMode(Enum):
    NONE = 0
    ROPE_LLAMA = 1
    ALIBI = 2


class MaskMode(Enum):
    NON_CAUSAL = 0
    CAUSAL = 1
    CUSTOM = 2
    MULTIITEMSCORING = 3


class TensorLayout(Enum):
    NHD = 0
    HND = 1


log2e = 1.44269504088896340736
ln2 = 0.6931471805599453094


class GPUArchitectureError(Exception):
    """The GPU cannot run the requested kernel."""


def _torch():
    try:
        import torch
    except ImportError as exc:  # pragma: no cover - torch is optional
        raise ImportError("tessera.utils device queries need torch") from exc
    return torch


def get_compute_capability(device):
    """(major, minor) of a CUDA torch.device; ValueError for other devices."""
    torch = _torch()
    device = torch.device(device)
    if device.type != "cuda":
        raise ValueError(f"device: expected a cuda device, got {device}")
    props = torch.cuda.get_device_properties(device)
    return props.major, props.minor


def _major(device):
    return get_compute_capability(device)[0]


def is_sm90a_supported(device):
    """True on Hopper (sm_90): Tessera's wgmma/TMA prefill kernels run there."""
    return _major(device) == 9


def _no_specific_kernels(device):
    """False (after checking `device`): Tessera has no kernels specific to these architectures; they run the
    sm_90a / sm_80 ones where those load."""
    _major(device)
    return False


is_sm100a_supported = is_sm100f_supported = is_sm110a_supported = is_sm12x_supported = _no_specific_kernels


def is_fa3_backend_supported(pos_encoding_mode, use_fp16_qk_reductions, use_custom_mask, dtype_q, dtype_kv):
    """Whether backend="fa3" (the Hopper prefill kernels) takes this combination: no RoPE inside the
    kernel, no fp16 QK reduction, and q and KV of one 16-bit dtype. Custom masks are accepted."""
    del use_custom_mask
    if int(getattr(pos_encoding_mode, "value", pos_encoding_mode)) == PosEncodingMode.ROPE_LLAMA.value:
        return False
    if use_fp16_qk_reductions:
        return False
    return dtype_q == dtype_kv and getattr(dtype_q, "itemsize", 2) == 2


def is_fa3_prefill_head_dim_supported(head_dim_qk, head_dim_vo):
    """Whether backend="fa3" takes these head dims (64, 128 or 256, equal for QK and VO)."""
    return head_dim_qk == head_dim_vo and head_dim_qk in (64, 128, 256)


def has_flashinfer_jit_cache():
    """True when the built-in kernels ship prebuilt (a kernel pack is installed), so the first call
    of a built-in kernel compiles nothing. FlashInfer's name for its AOT package check."""
    from .jit import kernel_packs

    return bool(kernel_packs())


# The same query under Tessera's name, for code whose identifiers were renamed along with the import.
has_tessera_jit_cache = has_flashinfer_jit_cache


def ceil_div(x, y):
    return -(-x // y)


def round_up(x, y):
    """x rounded up to a multiple of y."""
    return ceil_div(x, y) * y


__all__ = [
    "PosEncodingMode", "MaskMode", "TensorLayout", "GPUArchitectureError", "get_compute_capability",
    "is_sm90a_supported", "is_sm100a_supported", "is_sm100f_supported", "is_sm110a_supported",
    "is_sm12x_supported", "is_fa3_backend_supported", "is_fa3_prefill_head_dim_supported",
    "has_flashinfer_jit_cache", "has_tessera_jit_cache", "ceil_div", "round_up", "log2e", "ln2",
]
