"""Framework helpers shared by the public functions.

The package accepts numpy arrays and torch tensors and returns results of the
same kind, on the same device. torch is optional: it is never imported here
unless the caller already passed a torch tensor (so the package imports and
runs its CPU paths with numpy alone), and torch tensors are recognised by
their class hierarchy rather than by ``isinstance(x, torch.Tensor)``.
"""

import contextlib
import sys

import numpy as np

_IS_TORCH = {}  # type -> bool: the MRO scan runs once per type (this sits on every plan() / run() call)


def is_torch(x):
    """True when x is a torch.Tensor (or a subclass such as Parameter), without importing torch."""
    t = type(x)
    r = _IS_TORCH.get(t)
    if r is None:
        r = _IS_TORCH[t] = any(c.__name__ == "Tensor" and c.__module__ == "torch" for c in t.__mro__)
    return r


def _torch():
    """The already-imported torch module (only called for torch inputs)."""
    mod = sys.modules.get("torch")
    if mod is None:  # a torch tensor exists, so this is unusual, but be safe
        import torch as mod
    return mod


def framework(x, name):
    """'torch' or 'numpy' for a tensor argument; TypeError naming the argument otherwise."""
    if isinstance(x, np.ndarray):
        return "numpy"
    if is_torch(x):
        return "torch"
    raise TypeError(f"{name}: expected a torch.Tensor or numpy.ndarray, got {type(x).__name__}")


def common_framework(**tensors):
    """The framework shared by all (non-None) named tensors.

    Mixing numpy and torch in one call is a TypeError naming the first
    argument that differs from the first one, because results are allocated
    with a single framework.
    """
    first_name, first_fw = None, None
    for name, x in tensors.items():
        if x is None:
            continue
        fw = framework(x, name)
        if first_fw is None:
            first_name, first_fw = name, fw
        elif fw != first_fw:
            raise TypeError(f"{name}: expected a {first_fw} tensor like {first_name}, got a {fw} one")
    return first_fw


def device_of(x):
    """The device of a tensor as a string: 'cpu' or 'cuda:<index>'."""
    if is_torch(x):
        d = x.device
        return "cpu" if d.type == "cpu" else f"{d.type}:{d.index or 0}"
    return "cpu"


def is_cuda(x):
    """True for a torch tensor in CUDA memory."""
    return is_torch(x) and x.device.type == "cuda"


def int32_capacity(x):
    """Entries an index vector's buffer holds from its first element on: through the end of its storage for a
    1-D CUDA torch int32 tensor of stride 1 (a view of a larger preallocated buffer, as serving engines keep the
    page tables a CUDA graph reads), else its own length (any other tensor, or a converted copy)."""
    if is_cuda(x) and x.dim() == 1 and x.dtype == _torch().int32 and x.stride(0) == 1:
        return x.untyped_storage().nbytes() // x.element_size() - x.storage_offset()
    shape = getattr(x, "shape", ())
    return int(shape[0]) if len(shape) else 0


def dtype_name(x, name, allowed=("float16", "bfloat16", "float32")):
    """The dtype of x as a C++ dtype name; TypeError naming the argument unless it is in `allowed`."""
    if is_torch(x):
        s = str(x.dtype).replace("torch.", "")
    else:
        s = np.dtype(x.dtype).name
    if s not in allowed:
        raise TypeError(f"{name}: expected dtype {', '.join(allowed)}, got {s}")
    return s


FP8 = ("float8_e4m3fn", "float8_e5m2")


def dtype_str(x):
    """The dtype of a torch tensor or numpy array as a name ('float16', 'float8_e4m3fn', 'uint8', ...)."""
    return str(x.dtype).replace("torch.", "") if is_torch(x) else np.dtype(x.dtype).name


def kv_bits(x, name, want=None):
    """A KV tensor as handed to the bindings, and the dtype name to give them.

    fp8 crosses as a uint8 view of the same bits with its dtype named beside
    it (DLPack exporters differ on fp8): an fp8 tensor (torch.float8_e4m3fn /
    float8_e5m2, or numpy's ml_dtypes types) becomes its uint8 view; a uint8
    tensor stands for `want` when that is an fp8 type (serving engines keep
    fp8 caches as uint8). An fp8 tensor of another fp8 type than `want` is a
    TypeError naming `name`. Anything else passes unchanged (the C++ checks
    name a wrong dtype). Returns (tensor, dtype name or None)."""
    if x is None:
        return None, None
    s = dtype_str(x)
    if s in FP8:
        if want is not None and want != s:
            raise TypeError(f"{name}: expected dtype {want} (the KV dtype), got {s}")
        return (x.view(_torch().uint8) if is_torch(x) else x.view(np.uint8)), s
    if s == "uint8" and want in FP8:
        return x, want
    return x, None


def empty(like, shape, dtype=None):
    """An uninitialised array of `shape` with like's framework and device.

    dtype: None for like's dtype, or a C++ dtype name such as 'float32'.
    """
    shape = tuple(int(n) for n in shape)
    if is_torch(like):
        torch = _torch()
        dt = like.dtype if dtype is None else getattr(torch, dtype)
        return torch.empty(shape, dtype=dt, device=like.device)
    dt = like.dtype if dtype is None else np.dtype(dtype if dtype != "bool" else np.bool_)
    return np.empty(shape, dtype=dt)


def as_index_array(values, like, name):
    """An int32 index array (e.g. indptr) with like's framework and device.

    Lists and tuples are converted; tensors are passed through unchanged so
    the C++ checks can report a wrong dtype or device by name.
    """
    if isinstance(values, (list, tuple)):
        if is_torch(like):
            return _torch().tensor(values, dtype=_torch().int32, device=like.device)
        return np.asarray(values, dtype=np.int32)
    framework(values, name)
    return values


def stream_of(x):
    """The CUDA stream handle to launch on: torch's current stream of x's
    device for CUDA tensors (so work is ordered with the caller's torch work),
    0 (the default stream, unused on the CPU) otherwise."""
    if is_cuda(x):
        torch = _torch()
        raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)  # the handle without a Stream object
        return raw(x.device.index) if raw is not None else torch.cuda.current_stream(x.device).cuda_stream
    return 0


def on_device_of(x):
    """Context making x's CUDA device current while launching (the C++ launch
    uses the thread's current device); a no-op for CPU tensors."""
    if is_cuda(x):
        torch = _torch()
        if x.device.index != torch.cuda.current_device():  # switching costs a context manager per call
            return torch.cuda.device(x.device)
    return contextlib.nullcontext()


def arg(x):
    """A tensor as handed to the bindings: torch tensors are detached, since
    DLPack export refuses tensors that require grad (no copy is made)."""
    if x is not None and is_torch(x):
        return x.detach()
    return x


def torch_ops(x):
    """tessera._ops (the torch.library custom ops) while torch.compile traces a call whose tensor x is a CUDA
    torch tensor, else None (eager calls pay a dict lookup and torch.compiler.is_compiling()). Under Dynamo
    this folds to a constant, so the traced code goes straight to the op."""
    torch = sys.modules.get("torch")
    is_compiling = getattr(getattr(torch, "compiler", None), "is_compiling", None)  # torch >= 2.3
    if is_compiling is None or not is_compiling() or not getattr(x, "is_cuda", False):
        return None
    from . import _ops
    return _ops
