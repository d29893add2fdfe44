"""Attention variants as specs, and the generic AttentionWrapper (paper section
3.2.3 and Listing 1).

A variant is CUDA code defining ``struct <name> : tessera::VariantBase`` that
overrides any of the functor slots (QueryTransform, KeyTransform,
ValueTransform, LogitsTransform, LogitsMask, OutputTransform; see
docs/variants.md), plus ``use_softmax``, ``causal`` and extra parameters:
scalars (float32 / int32) and tensors (any dtype), which the code reads as
``params.extra.<name>`` and run() takes by keyword::

    spec = tessera.AttentionSpec(tessera.variants.alibi(causal=True), q_dtype=torch.float16, head_dim=128)
    task = tessera.TaskInfo(32, 8, page_size=16, max_batch=256, max_pages=65536, max_total_q=16384)
    attn = tessera.AttentionWrapper(spec, task, torch.empty(256 << 20, dtype=torch.uint8, device="cuda"))
    attn.plan(qo_indptr, kv_indptr, kv_indices, kv_last_page_len)       # once per step
    o = attn.run(q, (k_cache, v_cache), alibi_slopes=slopes)             # every layer

The built-in variants below are C++ structs in the library's device headers
(include/tessera/device/variants/*.cuh): their specs name the header and the
struct instead of carrying code, and compile by the same JIT path. Errors name the argument: ValueError for missing or unknown extras
and bad values, TypeError for a wrong dtype, kind or device.
"""

import dataclasses
import numbers
from typing import Tuple

import numpy as np

from . import _tensors as T
from . import _wrapper_util as W
from ._native import _C

# Keywords of run() itself: an extra cannot be called like them.
_RUN_KEYWORDS = ("q", "k", "v", "paged_kv_cache", "out", "lse", "return_lse", "sm_scale")
_SCALAR_TYPES = {"float32": "float32", "float": "float32", "int32": "int32", "int": "int32"}


def _extra_list(value, name, scalars):
    """((name, dtype name), ...) from a dict or a sequence of pairs."""
    items = list(value.items()) if isinstance(value, dict) else list(value)
    out = []
    for item in items:
        if not (isinstance(item, (tuple, list)) and len(item) == 2 and isinstance(item[0], str)):
            raise TypeError(f"{name}: expected (name, dtype) pairs or a dict, got {item!r}")
        key, dtype = item
        if key in _RUN_KEYWORDS:
            raise ValueError(f"{name}: the extra name {key!r} is a keyword of run(); choose another")
        if scalars:
            s = str(dtype).replace("torch.", "")
            if s not in _SCALAR_TYPES:
                raise TypeError(f"{name}: expected float32 or int32 for scalar {key!r}, got {dtype!r}")
            out.append((key, _SCALAR_TYPES[s]))
        else:
            out.append((key, _tensor_dtype(dtype, f"{name}[{key!r}]")))
    return tuple(out)


def _tensor_dtype(dtype, name):
    s = str(dtype).replace("torch.", "") if not isinstance(dtype, str) else dtype
    s = {"half": "float16", "float": "float32"}.get(s, s)
    if s not in ("float16", "bfloat16", "float32", "int32", "uint8", "bool"):
        raise TypeError(f"{name}: expected float16, bfloat16, float32, int32, uint8 or bool, got {dtype!r}")
    return s


@dataclasses.dataclass(frozen=True)
class VariantSpec:
    """A variant: its struct's name, its CUDA code, flags and extras.

    A built-in (tessera.variants.*) has no code: ``headers`` names the
    library's device headers defining it and ``struct_name`` the struct (e.g.
    ``tessera::variants::SoftCap<0x41f00000u>``); user variants leave both
    empty and pass their code.

    extra_scalars / extra_tensors: dict or (name, dtype) pairs; scalars are
    float32 or int32, tensors any of float16, bfloat16, float32, int32,
    uint8, bool (the kernel sees ``const T*``). use_softmax=False or
    causal=True take effect whether given here or in the code; only causal
    here lets the scheduler skip tiles above the diagonal. window_left >= 0
    declares that the code's LogitsMask hides keys left of a sliding window
    (query at bottom-right position p sees keys >= p - window_left), so the
    scheduler never loads them; -1: no window.
    """

    name: str
    code: str
    use_softmax: bool = True
    causal: bool = False
    extra_scalars: Tuple = ()
    extra_tensors: Tuple = ()
    window_left: int = -1
    headers: Tuple = ()
    struct_name: str = ""

    def __post_init__(self):
        if not isinstance(self.name, str) or not isinstance(self.code, str):
            raise TypeError("name, code: expected strings")
        if isinstance(self.headers, str) or not all(isinstance(h, str) for h in self.headers):
            raise TypeError(f"headers: expected a sequence of header names, got {self.headers!r}")
        if not isinstance(self.struct_name, str):
            raise TypeError(f"struct_name: expected a string, got {type(self.struct_name).__name__}")
        object.__setattr__(self, "headers", tuple(self.headers))
        object.__setattr__(self, "extra_scalars", _extra_list(self.extra_scalars, "extra_scalars", True))
        object.__setattr__(self, "extra_tensors", _extra_list(self.extra_tensors, "extra_tensors", False))
        _C.validate_variant(self._tuple())

    def _tuple(self):
        if isinstance(self.window_left, bool) or not isinstance(self.window_left, int):
            raise TypeError(f"window_left: expected an int, got {type(self.window_left).__name__}")
        return (self.name, self.code, bool(self.use_softmax), bool(self.causal), list(self.extra_scalars),
                list(self.extra_tensors), int(self.window_left), list(self.headers), self.struct_name)

    @classmethod
    def _from_tuple(cls, t):
        return cls(t[0], t[1], t[2], t[3], tuple(t[4]), tuple(t[5]), t[6], tuple(t[7]), t[8])


@dataclasses.dataclass(frozen=True)
class AttentionSpec:
    """What a kernel computes: a variant, data types (kv and o default to q's) and head dimension."""

    variant: VariantSpec
    q_dtype: object = "float16"
    kv_dtype: object = None
    o_dtype: object = None
    head_dim: int = 128

    def _dtypes(self):
        q = W.dtype_arg(self.q_dtype, "q_dtype")
        kv = q if self.kv_dtype is None else W.dtype_arg(self.kv_dtype, "kv_dtype")
        o = q if self.o_dtype is None else W.dtype_arg(self.o_dtype, "o_dtype")
        return q, kv, o


@dataclasses.dataclass(frozen=True)
class TaskInfo:
    """Heads, page size, layout and the workspace bounds a wrapper is built for.

    max_batch: most requests per plan; max_pages: most page-table entries
    (for ragged KV: 1); max_total_q: most query rows per plan (prefill;
    None: max_batch, enough for decode).
    """

    num_qo_heads: int
    num_kv_heads: int
    page_size: int = 16
    kv_layout: str = "NHD"
    max_batch: int = 256
    max_pages: int = 65536
    max_total_q: int = None


# ------------------------------------------------------------------ built-ins
# Specs of the C++ built-ins (tessera::variants), naming their device structs.
def _builtin(kind, **kw):
    return VariantSpec._from_tuple(_C.builtin_variant(kind, **kw))


def standard():
    """Plain softmax attention."""
    return _builtin("standard")


def causal():
    """Bottom-right aligned causal mask."""
    return _builtin("causal")


def custom_mask():
    """FlashInfer's packed custom mask (prefill only): plan(mask_indptr=...), run(packed_custom_mask=bits)."""
    return _builtin("custom_mask")


def soft_cap(cap, causal=False):
    """logit = cap * tanh(logit / cap); the cap is compiled into the kernel."""
    return _builtin("soft_cap", cap=float(cap), causal=causal)


def sliding_window(window_left, causal=False):
    """Keys kv_idx >= q_pos - window_left (window compiled into the kernel)."""
    return _builtin("sliding_window", window_left=int(window_left), causal=causal)


def alibi(causal=False):
    """ALiBi: logit += alibi_slopes[head] * (kv_idx - q_pos). Extra: alibi_slopes float32 [num_qo_heads]."""
    return _builtin("alibi", causal=causal)


def flash_sigmoid(causal=False):
    """No softmax: o = sum sigmoid(logit * sigmoid_scale + sigmoid_bias) v. Extras: sigmoid_scale, sigmoid_bias."""
    return _builtin("flash_sigmoid", causal=causal)


def attention_sink():
    """Streaming-LLM: the first sink_size keys plus window_left keys before the query, causal (int32 extras)."""
    return _builtin("attention_sink")


def rope(interleave=False, causal=False):
    """Fused Llama RoPE on q and k (half-split pairs, or adjacent with interleave). Extras: rope_scale, rope_theta.

    Every kernel family: decode, the row-wise kernel and both tensor-core
    prefill templates.
    """
    return _builtin("rope", interleave=interleave, causal=causal)


def alibi_slopes(num_heads):
    """The standard ALiBi slopes of num_heads heads, float32 numpy."""
    return np.asarray(_C.alibi_slopes(W.positive_int(num_heads, "num_heads")), dtype=np.float32)


# ------------------------------------------------------------------ wrapper
class AttentionWrapper:
    """Plan/run attention of one spec over one task (paper Listing 1).

    plan() once per step, run() for every layer with the variant's extras as
    keywords. A paged plan whose requests all have one query runs decode (a
    BSR plan with R == 1 too); anything else prefill. kind="auto" fixes the
    kind at the first plan; "decode" / "prefill" fix it up front. run()
    allocates nothing on the device beyond its outputs and never
    synchronizes, so it can be captured in a CUDA graph (extras' tensors are
    captured by address, like q).
    """

    def __init__(self, spec, task_info, float_workspace_buffer, kind="auto", backend="auto", use_tensor_cores=False):
        if not isinstance(spec, AttentionSpec):
            raise TypeError(f"spec: expected a tessera.AttentionSpec, got {type(spec).__name__}")
        if not isinstance(task_info, TaskInfo):
            raise TypeError(f"task_info: expected a tessera.TaskInfo, got {type(task_info).__name__}")
        if task_info.kv_layout not in W.LAYOUTS:
            raise ValueError(f"task_info.kv_layout: expected 'NHD' or 'HND', got {task_info.kv_layout!r}")
        if kind not in ("auto", "decode", "prefill"):
            raise ValueError(f"kind: expected 'auto', 'decode' or 'prefill', got {kind!r}")
        W.check_backend(backend, None, allowed=("auto", "fa2", "fa3"))
        buf = W.check_workspace_buffer(float_workspace_buffer)  # any dtype, as bytes
        self._spec, self._task = spec, task_info
        q, kv, o = spec._dtypes()
        t = task_info
        max_total_q = t.max_batch if t.max_total_q is None else t.max_total_q
        config = (spec.variant._tuple(), q, kv, o, W.positive_int(spec.head_dim, "head_dim"),
                  W.positive_int(t.num_qo_heads, "num_qo_heads"), W.positive_int(t.num_kv_heads, "num_kv_heads"),
                  W.positive_int(t.page_size, "page_size"), t.kv_layout, W.positive_int(t.max_batch, "max_batch"),
                  W.positive_int(max_total_q, "max_total_q"), W.positive_int(t.max_pages, "max_pages"))
        knobs = dict(kind=kind, backend=W.BACKENDS[backend], use_tensor_cores=bool(use_tensor_cores))
        torch = T._torch()
        device = buf.device.index or 0
        # Below the ideal size the split-KV partial states get what fits (plans split less KV); below the
        # minimum the buffer is refused.
        ideal, host_bytes = _C.AttentionWrapper.workspace_size(*config, device=device, **knobs)
        least = _C.AttentionWrapper.min_workspace_size(*config, device=device, **knobs)[0]
        if least > buf.numel():
            raise ValueError(f"float_workspace_buffer: expected at least {least} bytes for this task, got "
                             f"{buf.numel()} ({ideal} bytes hold every split-KV partial state: the fastest plans)")
        self._buffer = buf
        self._pinned = torch.empty(max(host_bytes, 1), dtype=torch.uint8, pin_memory=True)
        self._native = _C.AttentionWrapper(*config, buf.data_ptr(), buf.numel(), self._pinned.data_ptr(),
                                           self._pinned.numel(), device, **knobs)
        self._o_dtype = o
        self._planned = None

    @property
    def kind(self):
        """'decode' or 'prefill' once the first plan (or the constructor) fixed it, else 'auto'."""
        return self._native.kind

    def _stream(self):
        torch = T._torch()
        return torch.cuda.current_stream(self._buffer.device).cuda_stream

    def _plan(self, fn, **planned):
        self._planned = None  # a failed plan leaves nothing to run
        torch = T._torch()
        with torch.cuda.device(self._buffer.device):
            fn(self._stream())
        self._planned = planned

    def plan(self, qo_indptr, kv_indptr, kv_indices, kv_last_page_len, mask_indptr=None):
        """Plans a paged step: int [batch + 1] qo_indptr and kv_indptr (pages), kv_indices, kv_last_page_len
        (any device; copied to the host, except kv_indices as a CUDA tensor without mask_indptr, which stays on
        the GPU: plan() copies it unread and the kernels check the ids, raising a bad one at the next plan() or
        run()). mask_indptr: byte offsets of packed masks (custom_mask variant)."""
        qo, kv = W.host_ints(qo_indptr, "qo_indptr"), W.host_ints(kv_indptr, "kv_indptr")
        last = W.host_ints(kv_last_page_len, "kv_last_page_len")
        ids = W.page_ids(kv_indices, int(kv[-1]) if kv.size else 0, "kv_indices", self._buffer,
                         on_device=mask_indptr is None)
        mask = None if mask_indptr is None else W.host_ints(mask_indptr, "mask_indptr")
        if isinstance(ids, W.DeviceIds):
            fn = lambda s: self._native.plan_paged_device(qo, kv, ids.ptr, ids.count, ids.device, last, s)  # noqa: E731
        else:
            fn = lambda s: self._native.plan_paged(qo, kv, ids, last, s, mask)  # noqa: E731
        self._plan(fn, rows=int(qo[-1]) if qo.size else 0, ragged=False)

    def plan_ragged(self, qo_indptr, kv_indptr, mask_indptr=None):
        """Plans a ragged prefill step: k / v rows kv_indptr[i] .. kv_indptr[i + 1] belong to request i."""
        qo, kv = W.host_ints(qo_indptr, "qo_indptr"), W.host_ints(kv_indptr, "kv_indptr")
        mask = None if mask_indptr is None else W.host_ints(mask_indptr, "mask_indptr")
        self._plan(lambda s: self._native.plan_ragged(qo, kv, s, mask), rows=int(qo[-1]) if qo.size else 0, ragged=True)

    def plan_bsr(self, indptr, indices, M, N, R, C):
        """Plans a block-sparse step: M x N of R x C blocks (C must be task_info.page_size)."""
        ip, idx = W.host_ints(indptr, "indptr"), W.host_ints(indices, "indices")
        for name, value in (("M", M), ("N", N), ("R", R), ("C", C)):
            if isinstance(value, bool) or not isinstance(value, numbers.Integral):
                raise TypeError(f"{name}: expected an int, got {type(value).__name__}")
        self._plan(lambda s: self._native.plan_bsr(ip, idx, int(M), int(N), int(R), int(C), s), rows=int(M),
                   ragged=False, bsr=(int(N), int(C)))

    def _outputs(self, q, out, lse, return_lse):
        if self._planned is None:
            raise ValueError("run: expected plan() to be called first")
        if not T.is_cuda(q):
            raise TypeError(f"q: expected a CUDA tensor, got {type(q).__name__} on {T.device_of(q)}")
        if out is None:
            out = T.empty(q, q.shape, self._o_dtype)
        if lse is None and return_lse:
            lse = T.empty(q, q.shape[:2], "float32")
        return out, lse

    @staticmethod
    def _extras(extras):
        out = {}
        for name, value in extras.items():
            if isinstance(value, np.generic):
                value = value.item()
            out[name] = T.arg(value)
        return out

    def run(self, q, paged_kv_cache, *, out=None, lse=None, return_lse=False, sm_scale=None, **extras):
        """Paged or BSR run: paged_kv_cache is (k_cache, v_cache) or one interleaved tensor (for BSR, k / v
        [N, num_kv_heads, head_dim]); extras are the variant's values by name (ints, floats, CUDA tensors)."""
        out, lse = self._outputs(q, out, lse, return_lse)
        k, v = W.unpack_paged_kv_cache(paged_kv_cache)
        if self._planned.get("bsr") and v is not None:
            n, c = self._planned["bsr"]
            k, v = (x.reshape((n // c, c) + tuple(x.shape[1:])) if len(x.shape) == 3 else x for x in (k, v))
        if self._planned["ragged"]:
            raise ValueError("run: the last plan was ragged; call run_ragged(q, k, v, ...)")
        with T.on_device_of(q):
            self._native.run(T.arg(q), T.arg(k), T.arg(v), out, lse, W.sm_scale_arg(sm_scale), T.stream_of(q),
                             self._extras(extras))
        return (out, lse) if return_lse else out

    def run_ragged(self, q, k, v, *, out=None, lse=None, return_lse=False, sm_scale=None, **extras):
        """Ragged run: k, v [total_kv, num_kv_heads, head_dim]; extras by name as for run()."""
        out, lse = self._outputs(q, out, lse, return_lse)
        if not self._planned["ragged"]:
            raise ValueError("run_ragged: the last plan was paged or BSR; call run(q, paged_kv_cache, ...)")
        with T.on_device_of(q):
            self._native.run_ragged(T.arg(q), T.arg(k), T.arg(v), out, lse, W.sm_scale_arg(sm_scale), T.stream_of(q),
                                    self._extras(extras))
        return (out, lse) if return_lse else out
