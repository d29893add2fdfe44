"""Argument checks and workspace management shared by the plan/run wrappers
(decode.py, prefill.py).

The wrappers keep FlashInfer's signatures; what they share is how they turn
FlashInfer-style arguments (torch dtypes or names, index tensors on any
device) into what the C++ bindings take, and how they size the C++ object's
fixed workspace sections (ensure_native). Messages name the argument, as the
C++ checks do.
"""

import itertools
import math
import numbers
import weakref
from typing import NamedTuple

import numpy as np

from . import _tensors as T

_LOG2E = 1.4426950408889634
_LN2 = 0.6931471805599453
from ._errors import describe, not_supported

LAYOUTS = ("NHD", "HND")
INT32_MAX = 2**31 - 1
_DTYPE_ALIASES = {"half": "float16", "fp16": "float16", "bf16": "bfloat16"}


_POS_ENCODINGS = ("NONE", "ROPE_LLAMA", "ALIBI")


def reject_unsupported(pos_encoding_mode, q_scale, k_scale, v_scale, rope_scale, rope_theta):
    """Rejects FlashInfer options whose non-default values Tessera cannot honour here: NotSupportedError for a
    known feature, ValueError for a value FlashInfer does not know either (callers that support RoPE check it
    with pos_encoding_arg and pass "NONE", None, None)."""
    if pos_encoding_mode != "NONE":
        if pos_encoding_mode in _POS_ENCODINGS:
            raise not_supported("pos_encoding_mode", pos_encoding_mode, "only 'NONE' is implemented here")
        raise ValueError(f"pos_encoding_mode: expected one of {_POS_ENCODINGS}, got {pos_encoding_mode!r}")
    for name, value in (("rope_scale", rope_scale), ("rope_theta", rope_theta)):
        if value is not None:
            raise ValueError(f"{name}={value}: expected None without pos_encoding_mode='ROPE_LLAMA'")
    for name, value in (("q_scale", q_scale), ("k_scale", k_scale), ("v_scale", v_scale)):
        if value is not None:
            raise not_supported(name, value, "quantization scales are not implemented here")


POS_NONE, POS_ROPE_LLAMA, POS_ALIBI = 0, 1, 2  # the bindings' pos_encoding codes


def pos_encoding_arg(pos_encoding_mode, rope_scale, rope_theta):
    """FlashInfer's pos_encoding_mode with its rope_scale / rope_theta as (code, scale, theta), code one of
    POS_NONE / POS_ROPE_LLAMA / POS_ALIBI.

    "NONE": no positional encoding (rope_scale / rope_theta must be None).
    "ROPE_LLAMA": Llama RoPE (half-split pairs, all head_dim features) fused
    into the kernel, on q at its position (kv_len - qo_len + i) and on k at
    its index in the request; rope_scale (default 1) divides positions,
    rope_theta (default 1e4) is the frequency base.
    "ALIBI": FlashInfer's ALiBi, logit += slope[head] * (j - i) for key j and
    query i (indices within the request), the standard slopes of
    num_qo_heads heads (tessera.variants.alibi_slopes); rope_scale /
    rope_theta must be None.
    Any of them combines with window_left and logits_soft_cap (the cap
    applies to the encoded logit).
    """
    if pos_encoding_mode in ("NONE", "ALIBI"):
        reject_unsupported("NONE", None, None, None, rope_scale, rope_theta)
        return (POS_NONE if pos_encoding_mode == "NONE" else POS_ALIBI), 1.0, 1e4
    if pos_encoding_mode != "ROPE_LLAMA":
        raise ValueError(f"pos_encoding_mode: expected one of {_POS_ENCODINGS}, got {pos_encoding_mode!r}")
    out = []
    for name, value, default in (("rope_scale", rope_scale, 1.0), ("rope_theta", rope_theta, 1e4)):
        if value is None:
            value = default
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            raise TypeError(f"{name}: expected a float, got {type(value).__name__}")
        value = float(value)
        if not (math.isfinite(value) and 0.0 < value <= _FLOAT32_MAX):
            raise ValueError(f"{name}: expected a finite float > 0, got {value}")
        out.append(value)
    return POS_ROPE_LLAMA, out[0], out[1]


def pos_encoding_mode_name(code):
    """The pos_encoding_mode string of a pos_encoding_arg code."""
    return _POS_ENCODINGS[code]


_ALIBI_SLOPES = {}


def alibi_slopes_tensor(num_qo_heads, device):
    """The standard ALiBi slopes of num_qo_heads heads as a float32 torch tensor on `device`, made once per
    (heads, device) and kept, so run() passes a pointer and allocates nothing after the first call."""
    import torch
    key = (int(num_qo_heads), str(device))
    t = _ALIBI_SLOPES.get(key)
    if t is None:
        from ._native import _C
        t = torch.tensor(_C.alibi_slopes(int(num_qo_heads)), dtype=torch.float32, device=device)
        _ALIBI_SLOPES[key] = t
    return t


def plan_alibi_slopes(rope, num_qo_heads, device):
    """plan()'s slopes tensor for ALIBI (None otherwise), made outside any CUDA-graph capture."""
    return alibi_slopes_tensor(num_qo_heads, device) if rope[0] == POS_ALIBI else None


def run_pos_encoding_args(rope, slopes):
    """run()'s positional-encoding keywords for the bindings (rope: pos_encoding_arg's result; slopes:
    plan_alibi_slopes's)."""
    return dict(pos_encoding_scalars(rope), alibi_slopes=slopes)


def pos_encoding_scalars(rope):
    return dict(rope_scale=rope[1], rope_theta=rope[2])


_FLOAT32_MAX = 3.4028234663852886e38
_FLOAT32_TINY = 1.401298464324817e-45  # the smallest positive float32


def plan_options(window_left, logits_soft_cap):
    """FlashInfer's window_left and logits_soft_cap as the bindings take them: (int, float), (-1, 0.0) = off.

    window_left: -1, or the keys (>= 0) a query sees to the left of its
    bottom-right-aligned position. logits_soft_cap: None or 0 = off, else a
    finite cap > 0 (logit = cap * tanh(logit / cap)), applied in float32.
    """
    if isinstance(window_left, bool) or not isinstance(window_left, numbers.Integral):
        raise TypeError(f"window_left: expected an int (-1 = no window), got {type(window_left).__name__}")
    if not -1 <= window_left <= INT32_MAX:
        raise ValueError(f"window_left: expected -1 (no window) or 0..{INT32_MAX}, got {window_left}")
    cap = 0.0
    if logits_soft_cap is not None:
        if isinstance(logits_soft_cap, bool) or not isinstance(logits_soft_cap, numbers.Real):
            raise TypeError(f"logits_soft_cap: expected a number or None, got {type(logits_soft_cap).__name__}")
        cap = float(logits_soft_cap)
        if not (cap == 0.0 or _FLOAT32_TINY <= cap <= _FLOAT32_MAX):
            raise ValueError(f"logits_soft_cap: expected None, 0 (off) or a finite float32 > 0, got {logits_soft_cap!r}")
    return int(window_left), cap


def check_run_window(window_left, planned):
    """run()'s window_left: None or the value plan() was given (the kernel is specialized for it)."""
    if window_left is not None and window_left != planned:
        raise ValueError(f"window_left: expected None or {planned} (the value given to plan()), got {window_left!r}")


BACKENDS = {"auto": 0, "fa2": 1, "fa3": 2}


def check_backend(backend, jit_args, allowed=("auto", "fa2")):
    """Selects among Tessera's own kernels ('fa3' = the Hopper template, prefill only); custom JIT variants are not exposed yet."""
    if backend not in allowed:
        raise not_supported("backend", backend, f"Tessera's kernels are {', '.join(repr(a) for a in allowed)}")
    if jit_args is not None:
        raise not_supported("jit_args", jit_args, "custom variants run through tessera.AttentionWrapper")


_FP8_ALIASES = {"float8_e4m3": "float8_e4m3fn", "fp8_e4m3": "float8_e4m3fn", "e4m3": "float8_e4m3fn",
                "fp8_e5m2": "float8_e5m2", "e5m2": "float8_e5m2"}


def dtype_arg(value, name, fp8=False):
    """A data type given as a torch dtype, numpy dtype or string, as 'float16' or 'bfloat16', or with fp8 (KV
    data types of the decode wrappers) also 'float8_e4m3fn' or 'float8_e5m2'."""
    if isinstance(value, str):
        s = value
    elif type(value).__module__ == "torch":  # torch.dtype, without importing torch
        s = str(value)
    else:
        try:
            s = np.dtype(value).name
        except TypeError:
            raise TypeError(f"{name}: expected a data type (torch dtype or name), got {value!r}") from None
    s = s.replace("torch.", "")
    s = _DTYPE_ALIASES.get(s, _FP8_ALIASES.get(s, s))
    if s in T.FP8:
        if fp8:
            return s
        if name.startswith("q"):
            raise TypeError(f"{name}: expected float16 or bfloat16, got {s} (fp8 is for the KV cache: "
                            "kv_data_type; queries stay 16-bit)")
        raise TypeError(f"{name}: expected float16 or bfloat16, got {s} (fp8 KV caches run on batch decode on CUDA "
                        "cores only so far: BatchDecodeWithPagedKVCacheWrapper, single_decode_with_kv_cache)")
    if s not in ("float16", "bfloat16"):
        raise TypeError(f"{name}: expected float16 or bfloat16{', float8_e4m3fn or float8_e5m2' if fp8 else ''}, "
                        f"got {s} (other data types are not supported yet)")
    return s


def host_ints(x, name):
    """A 1-D index array (torch tensor on any device, numpy array, list) as contiguous CPU int32 numpy."""
    if T.is_torch(x):
        if x.device.type == "cpu" and str(x.dtype) == "torch.int32" and x.dim() == 1:  # the common case
            return np.ascontiguousarray(x.numpy())
        if x.is_floating_point() or x.is_complex():
            raise TypeError(f"{name}: expected an integer tensor, got {str(x.dtype).replace('torch.', '')}")
        if x.device.type != "cpu":
            x = x.cpu()  # a GPU tensor is copied (synchronously) to the host, as FlashInfer does
        arr = x.numpy()  # integer tensors carry no autograd state
    elif isinstance(x, np.ndarray):
        arr = x
    elif isinstance(x, (list, tuple)):
        arr = np.asarray(x, dtype=np.int64)
    else:
        raise TypeError(f"{name}: expected a torch.Tensor, numpy.ndarray or list of ints, got {type(x).__name__}")
    if arr.dtype.kind not in "iu":
        raise TypeError(f"{name}: expected an integer dtype, got {arr.dtype.name}")
    if arr.ndim != 1:
        raise ValueError(f"{name}: expected a 1-D array, got shape {tuple(arr.shape)}")
    if arr.dtype == np.int32:  # the common case, once per generation step: no scan, no copy if contiguous
        return np.ascontiguousarray(arr)
    if arr.size and (int(arr.min()) < -INT32_MAX - 1 or int(arr.max()) > INT32_MAX):
        raise ValueError(f"{name}: expected values that fit in int32")
    return np.ascontiguousarray(arr, dtype=np.int32)


def int_table(x, name, keep_cuda=False):
    """A 2-D integer table (a dense block_tables) as numpy, or with keep_cuda a CUDA tensor as it is; TypeError
    naming it when its values are not integers. Rank and shape are the caller's to check."""
    if T.is_torch(x):
        if x.is_floating_point() or x.is_complex() or str(x.dtype) == "torch.bool":
            raise TypeError(f"{name}: expected an integer table, got {str(x.dtype).replace('torch.', '')}")
        return x if x.is_cuda and keep_cuda else x.cpu().numpy()
    arr = np.asarray(x)
    if arr.size == 0:  # an empty list has no integer dtype to infer
        arr = arr.astype(np.int32)
    if arr.dtype.kind not in "iu":
        raise TypeError(f"{name}: expected an integer table, got {arr.dtype.name}")
    return arr


def csr_cells(indptr):
    """(row, column) of every entry of a CSR table whose indptr (from 0, non-decreasing) is given: row b holds
    entries indptr[b] .. indptr[b + 1] - 1, at columns 0, 1, ..."""
    indptr = np.asarray(indptr, np.int64)
    counts = np.diff(indptr)
    return np.repeat(np.arange(counts.size), counts), np.arange(int(indptr[-1])) - np.repeat(indptr[:-1], counts)


class DeviceIds(NamedTuple):
    """Page ids on the GPU as the bindings take them: the address of `count`
    contiguous int32 entries on CUDA device `device` (`tensor` keeps them
    alive). Raw integers instead of a DLPack export: with torch's __dlpack__
    (and a slice) a plan() took ~35 us more on the H100 host than with host
    ids."""
    ptr: int
    count: int
    device: int
    tensor: object

    def __len__(self):
        return self.count


def page_ids(x, count, name, buffer, on_device=True):
    """plan()'s page ids: the first `count` entries of `x` (FlashInfer's
    buffers may be longer). A CUDA tensor stays on the GPU (on_device: a
    DeviceIds, which the C++ plan() copies on the stream without reading it;
    the kernels check the ids; int64 is narrowed there), as FlashInfer's
    plan() never reads them; anything else becomes host int32 (host_ints).
    `buffer` is the workspace buffer, whose device the ids must be on."""
    if T.is_torch(x) and x.is_cuda and on_device:
        count = max(count, 0)  # a negative indptr[-1] is the C++ plan()'s to reject, by name
        # Once per generation step: the common case (a contiguous int32 table
        # on the workspace's device) in a few attribute reads.
        if (str(x.dtype) == "torch.int32" and x.dim() == 1 and x.is_contiguous() and x.shape[0] >= count
                and T.is_cuda(buffer) and x.get_device() == buffer.get_device()):
            return DeviceIds(x.data_ptr(), count, x.get_device(), x)
        if x.is_floating_point() or x.is_complex() or str(x.dtype) == "torch.bool":
            raise TypeError(f"{name}: expected an integer tensor, got {str(x.dtype).replace('torch.', '')}")
        if x.dim() != 1:
            raise ValueError(f"{name}: expected a 1-D tensor, got shape {tuple(x.shape)}")
        if T.device_of(x) != T.device_of(buffer):
            raise ValueError(f"{name}: expected a tensor on {T.device_of(buffer)} (the workspace's device) or on the "
                             f"host, got one on {T.device_of(x)}")
        if x.shape[0] < count:
            raise ValueError(f"{name}: expected at least {count} entries (indptr[-1]), got {x.shape[0]}")
        if str(x.dtype) != "torch.int32":
            x = x[:count].int()
        elif not x.is_contiguous():
            x = x[:count].contiguous()
        return DeviceIds(x.data_ptr(), count, x.device.index or 0, x)
    arr = host_ints(x, name)
    if arr.size > count >= 0:
        arr = arr[:count]
    return arr


# ----------------------------------------------------------------------- planning on the GPU
def on_device_arg(on_device, batch_size):
    """plan()'s Tessera-only on_device flag as a bool; batch_size must be None without it (a host plan takes the
    batch size from its indptr)."""
    if not isinstance(on_device, (bool, np.bool_)):
        raise TypeError(f"on_device: expected a bool, got {type(on_device).__name__}")
    if not on_device and batch_size is not None:
        raise ValueError("batch_size: expected None without on_device=True (a plan on the host takes the batch "
                         "size from indptr)")
    return bool(on_device)


def refuse_on_device(why, **arguments):
    """ValueError naming the first of `arguments` that is not None: an option that planning on the GPU does not
    take (why: what it would need)."""
    for name, value in arguments.items():
        if value is not None:
            raise ValueError(f"{name}: expected None with on_device=True ({why}), got {describe(value)}")


def device_step(owner, tensors):
    """The tensors of a plan on the GPU (on_device=True), {name: tensor} in plan()'s argument names with
    "batch_size" among them: 1-D int32 torch CUDA tensors (batch_size: one element; a 0-d one becomes its
    1-element view) on the device of the wrapper's workspace, contiguous. Checked from their metadata only:
    never read, copied or synchronized on, so plan() stays capturable in a CUDA graph. Type and dtype errors are
    TypeError, shape errors ValueError, both naming the tensor; dtypes and shapes are checked for every tensor
    before whether it is on the GPU, and that before the workspace (check_workspace_buffer_once). Sizes (the
    bounds) are the caller's to check. Returns the tensors."""
    for name, x in tensors.items():
        if x is None:
            raise ValueError(f"{name}: expected an int32 CUDA tensor with on_device=True, got None")
        if not (T.is_torch(x) or isinstance(x, np.ndarray)):
            raise TypeError(f"{name}: expected an int32 CUDA tensor with on_device=True, got {type(x).__name__}")
        dt = T.dtype_str(x)
        if dt != "int32":
            raise TypeError(f"{name}: expected dtype int32 with on_device=True, got {dt}")
        if name.startswith("batch_size"):
            if len(x.shape) > 1 or int(np.prod(x.shape)) != 1:
                raise ValueError(f"batch_size: expected a tensor of 1 element (the step's number of requests), got "
                                 f"shape {tuple(x.shape)}")
        elif len(x.shape) != 1:
            raise ValueError(f"{name}: expected a 1-D tensor, got shape {tuple(x.shape)}")
    for name, x in tensors.items():
        if not T.is_cuda(x):
            raise TypeError(f"{name}: expected a CUDA tensor with on_device=True (the planner reads it on the GPU; "
                            f"plan() never reads it on the host), got a {T.framework(x, name)} one on "
                            f"{T.device_of(x)}")
    check_workspace_buffer_once(owner)
    device = T.device_of(owner._float_workspace_buffer)
    out = {}
    for name, x in tensors.items():
        if T.device_of(x) != device:
            raise ValueError(f"{name}: expected a tensor on {device} (the workspace's device), got one on "
                             f"{T.device_of(x)}")
        if not x.is_contiguous():
            raise ValueError(f"{name}: expected a contiguous tensor (stride 1), got stride {tuple(x.stride())}")
        out[name] = x.reshape(1) if x.dim() == 0 else x
    return out


def device_bound(x, name, extra, what):
    """A bound given by a tensor's length: len(x) - extra, at least 1 (ValueError naming x otherwise)."""
    n = int(x.shape[0]) - extra
    if n < 1:
        raise ValueError(f"{name}: expected at least {extra + 1} entries ({what} >= 1 with on_device=True), got "
                         f"{int(x.shape[0])}")
    return n


def positive_int(value, name):
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise ValueError(f"{name}: expected a positive int, got {value!r}")
    return int(value)


def pdl_arg(enable_pdl):
    """enable_pdl as the bindings take it. None is on, FlashInfer's default
    for its decode and prefill wrappers (``device_support_pdl``): the
    launches ignore it before sm_90, and the kernels wait for the kernel
    before them before reading q, K, V or writing outputs."""
    return True if enable_pdl is None else bool(enable_pdl)


def sm_scale_arg(sm_scale):
    """The softmax scale as the bindings take it: -1.0 (None: 1/sqrt(head_dim)) or a positive finite float."""
    if sm_scale is None:
        return -1.0
    if isinstance(sm_scale, bool) or not (isinstance(sm_scale, numbers.Real) and 0 < sm_scale < math.inf):
        raise ValueError(f"sm_scale: expected a positive finite number or None, got {sm_scale!r}")
    return float(sm_scale)


def _scale_value(name, x, positive):
    if hasattr(x, "shape") and hasattr(x, "dtype"):
        raise not_supported(name, x, "scales are floats here; 1-element scale tensors are read by the CUDA-core "
                            "decode kernels only (BatchDecodeWithPagedKVCacheWrapper, single_decode_with_kv_cache, "
                            "append_paged_kv_cache), per-head scales are not implemented")
    if isinstance(x, bool) or not isinstance(x, numbers.Real):
        raise TypeError(f"{name}: expected a float or None, got {type(x).__name__}")
    x = float(x)
    if not math.isfinite(x) or (positive and x <= 0.0):
        raise ValueError(f"{name}: expected a finite float{' > 0' if positive else ''} or None, got {x}")
    return x


def run_scales(sm_scale, head_dim, q_scale, k_scale, v_scale):
    """FlashInfer's run() scales on 16-bit caches (serving engines pass them for every layer, 1.0 unless the cache
    is quantized): q_scale and k_scale multiply the softmax scale, v_scale the output (FlashInfer does the same).
    sm_scale: the binding's (-1.0 = 1/sqrt(head_dim)). Returns (the softmax scale for the binding, v_scale or None
    when it is 1)."""
    factor = 1.0
    for name, x in (("q_scale", q_scale), ("k_scale", k_scale)):
        if x is not None:
            factor *= _scale_value(name, x, True)
    vs = None if v_scale is None else _scale_value("v_scale", v_scale, False)
    if vs == 1.0:
        vs = None
    if factor == 1.0:
        return sm_scale, vs
    scale = (sm_scale if sm_scale > 0 else 1.0 / math.sqrt(head_dim)) * factor
    if not (0.0 < scale <= _FLOAT32_MAX):
        raise ValueError(f"q_scale, k_scale: the softmax scale they give, {scale}, is not a positive float32")
    return scale, vs


def is_tensor(x):
    return x is not None and (T.is_torch(x) or isinstance(x, np.ndarray))


def scale_tensor(name, x, like, like_name="q"):
    """A k_scale / v_scale given as a tensor: a 1-element float32 tensor on `like`'s device (read by the kernel at
    run time, so a captured CUDA graph replays with its new value). TypeError / ValueError naming it otherwise."""
    if T.framework(x, name) != T.framework(like, like_name) or T.device_of(x) != T.device_of(like):
        raise TypeError(f"{name}: expected a {T.framework(like, like_name)} tensor on {T.device_of(like)} like "
                        f"{like_name}, got a {T.framework(x, name)} one on {T.device_of(x)}")
    if T.dtype_str(x) != "float32":
        raise TypeError(f"{name}: expected a float32 tensor, got {T.dtype_str(x)}")
    n = int(np.prod(x.shape)) if len(x.shape) else 1
    if n != 1:
        raise ValueError(f"{name}: expected a 1-element tensor (a per-tensor scale), got shape {tuple(x.shape)}")
    return x


def run_scales_with_tensors(sm_scale, head_dim, q_scale, k_scale, v_scale, like):
    """run_scales, with k_scale / v_scale also given as 1-element float32 tensors on like's device (the CUDA-core
    decode kernels read those at run time). Returns (softmax scale, v_scale or None, k tensor or None, v tensor or
    None): float scales folded as run_scales does."""
    kt = scale_tensor("k_scale", k_scale, like) if is_tensor(k_scale) else None
    vt = scale_tensor("v_scale", v_scale, like) if is_tensor(v_scale) else None
    scale, vs = run_scales(sm_scale, head_dim, q_scale, None if kt is not None else k_scale,
                           None if vt is not None else v_scale)
    return scale, vs, kt, vt


def unpack_paged_kv_cache(paged_kv_cache):
    """(k, v) for a (k_cache, v_cache) pair, (kv, None) for one interleaved [num_pages, 2, ...] tensor."""
    if isinstance(paged_kv_cache, (tuple, list)):
        if len(paged_kv_cache) != 2:
            raise ValueError(f"paged_kv_cache: expected a (k_cache, v_cache) pair, got {len(paged_kv_cache)} items")
        k, v = paged_kv_cache
        T.framework(k, "paged_kv_cache[0]")
        T.framework(v, "paged_kv_cache[1]")
        return k, v
    T.framework(paged_kv_cache, "paged_kv_cache")
    return paged_kv_cache, None


def workspace_bytes(buf, name="float_workspace_buffer"):
    """A workspace of any dtype (FlashInfer users pass uint8, int8, float...) as its flat uint8 view: the
    same memory, counted in bytes. Needs a contiguous tensor (torch or numpy)."""
    T.framework(buf, name)
    if T.is_torch(buf):
        if not buf.is_contiguous():
            raise ValueError(f"{name}: expected a contiguous tensor")
        return buf.reshape(-1).view(T._torch().uint8)
    if not buf.flags.c_contiguous:
        raise ValueError(f"{name}: expected a contiguous array")
    return buf.reshape(-1).view(np.uint8)


def check_aligned(buf, name):
    """FlashInfer's workspace alignment rule: a torch tensor's data must start on a 16-byte boundary (the
    kernels read 16-byte vectors from offsets aligned relative to it)."""
    if T.is_torch(buf) and buf.data_ptr() % 16:
        raise ValueError(f"{name} must be 16-byte aligned: expected a data pointer that is a multiple of 16, got "
                         f"{buf.data_ptr():#x}")

def check_workspace_buffer(buf):
    """float_workspace_buffer as the byte view the C++ objects borrow: a contiguous torch CUDA tensor of any
    dtype (checked at plan(), not in the constructor, so option errors surface first without a GPU)."""
    if not T.is_cuda(buf):
        raise TypeError(f"float_workspace_buffer: expected a torch CUDA tensor (any dtype), got "
                        f"{type(buf).__name__} of {getattr(buf, 'dtype', '?')} on {T.device_of(buf)}")
    return workspace_bytes(buf)


def check_workspace_buffer_once(owner):
    """check_workspace_buffer on owner's buffer at its first plan() after construction or
    reset_workspace_buffer(); from then on owner._float_workspace_buffer is the byte view."""
    if not owner._buffer_checked:
        owner._float_workspace_buffer = check_workspace_buffer(owner._float_workspace_buffer)
        owner._buffer_checked = True


def reset_workspace(owner, float_workspace_buffer):
    """FlashInfer's reset_workspace_buffer(): later plans use the new buffer. The C++ object holds the old
    one's address, so the next plan() builds a new one (waiting for queued work first, as any re-size
    does) and run() needs that plan."""
    T.framework(float_workspace_buffer, "float_workspace_buffer")
    check_aligned(float_workspace_buffer, "float_workspace_buffer")
    owner._float_workspace_buffer = float_workspace_buffer
    owner._buffer_checked = False
    owner._native_key = None
    owner._planned = None


def init_paged_wrapper(owner, float_workspace_buffer, kv_layout, use_cuda_graph, backend, jit_args):
    """The state every prefill-family wrapper starts with (workspace, layout, graph mode, backend, no C++ object)."""
    if kv_layout not in LAYOUTS:
        raise ValueError(f"kv_layout: expected 'NHD' or 'HND', got {kv_layout!r}")
    check_backend(backend, jit_args, allowed=("auto", "fa2", "fa3"))
    T.framework(float_workspace_buffer, "float_workspace_buffer")
    check_aligned(float_workspace_buffer, "float_workspace_buffer")
    owner._backend = BACKENDS[backend]
    owner._float_workspace_buffer = float_workspace_buffer
    owner._kv_layout = kv_layout
    owner._use_cuda_graph = bool(use_cuda_graph)
    owner._fixed_batch = owner._fixed_pages = None
    owner._native = None  # the C++ object, built by plan()
    owner._native_key = None  # what it was built for: configuration, bounds
    owner._pinned = None  # the pinned host staging buffer it borrows
    owner._planned = None  # what the last plan() fixed for run()
    owner._buffer_checked = False
    owner._handle = register_handle(owner)


_WRAPPERS = weakref.WeakValueDictionary()  # handle -> wrapper, for the torch.compile custom ops (_ops.py)
_HANDLES = itertools.count(1)


def register_handle(owner):
    """A new int handle for a plan/run wrapper: torch.compile's custom ops take it in place of the object
    (which cannot be a graph input) and find the wrapper again with wrapper_of."""
    handle = next(_HANDLES)
    _WRAPPERS[handle] = owner
    return handle


def wrapper_of(handle):
    """The wrapper of a register_handle handle (ValueError once it was garbage-collected)."""
    owner = _WRAPPERS.get(handle)
    if owner is None:
        raise ValueError(f"wrapper handle {handle}: no live wrapper has it (it was garbage-collected)")
    return owner


def run_outputs(q, out, lse, return_lse, o_dtype, head_dim_vo=None):
    """run()'s q checks and its outputs: out like q (o_dtype; head_dim_vo features, q's when None), lse float32
    [rows, heads] when asked for."""
    if not T.is_cuda(q):
        raise TypeError(f"q: expected a CUDA tensor, got {type(q).__name__} on {T.device_of(q)}")
    if len(q.shape) != 3:
        raise ValueError(f"q: expected a 3-D tensor [total_q, num_qo_heads, head_dim], got shape {tuple(q.shape)}")
    if out is None:
        out = T.empty(q, tuple(q.shape[:2]) + (head_dim_vo or q.shape[2],), o_dtype)
    if lse is None and return_lse:
        lse = T.empty(q, q.shape[:2], "float32")
    return out, lse


def check_sinks(sinks, q, num_qo_heads):
    """FlashInfer's attention sinks: None, or a floating CUDA tensor [num_qo_heads] on q's device."""
    if sinks is None:
        return None
    if not T.is_cuda(sinks):
        raise TypeError(f"sinks: expected a CUDA tensor [num_qo_heads], got {type(sinks).__name__} on "
                        f"{T.device_of(sinks)}")
    if not sinks.is_floating_point():
        raise TypeError(f"sinks: expected a floating-point tensor (float32), got {sinks.dtype}")
    if tuple(sinks.shape) != (num_qo_heads,):
        raise ValueError(f"sinks: expected shape ({num_qo_heads},) (one logit per query head), got {tuple(sinks.shape)}")
    if sinks.device != q.device:
        raise ValueError(f"sinks: expected a tensor on {q.device} (q's device), got {sinks.device}")
    return sinks


def apply_sinks(out, lse, sinks):
    """Attention sinks (gpt-oss; FlashInfer's `sinks`): one virtual key per query head, logit sinks[h] (natural
    units, not scaled by sm_scale) and value zero, joins every row's softmax. That is a merge of each row's
    state (out, lse) with the state (0, s), s = sinks * log2(e): out *= 1 / (1 + 2^(s - lse)) and lse becomes
    log2(2^lse + 2^s), in place (lse in base 2, as the kernels write it). An empty row (lse = -inf) keeps
    out = 0 and gets lse = s."""
    s = sinks.float() * _LOG2E
    keep = ((lse - s) * _LN2).sigmoid()  # 1 / (1 + 2^(s - lse))
    out.copy_((out.float() * keep.unsqueeze(-1)).to(out.dtype))
    lse.copy_(lse.logaddexp2(s.expand_as(lse)))


def buffer_length(buf, name):
    """The length of a FlashInfer CUDA-graph index buffer (a positive count), or None when not given."""
    return None if buf is None else positive_int(len(buf), f"{name} length")


class PlannedWrapper:
    """What every plan/run wrapper reports the same way (FlashInfer's
    is_cuda_graph_enabled, and the host time of the last plan()). Subclasses
    set _use_cuda_graph and _native (the C++ object, None before a plan)."""

    @property
    def is_cuda_graph_enabled(self):
        return self._use_cuda_graph

    @property
    def _plan_info(self):
        """What the last plan() fixed for run(), None before one (FlashInfer's wrappers keep their plan
        under this name; callers test it for None)."""
        return getattr(self, "_planned", None)

    @property
    def last_plan_us(self):
        """Host time of the last plan() inside the C++ planner (a cascade: all levels), in microseconds."""
        return self._native.last_plan_us if self._native is not None else None


# Workspace sizing and the C++ objects built on it (re-exported: the wrappers call them as W.*).
from ._workspace import Bound, ensure_native, fit_workspace, probe_workspace_size  # noqa: E402,F401
