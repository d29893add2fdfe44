"""Decode attention (FlashInfer's ``flashinfer.decode`` names).

single_decode_with_kv_cache and BatchDecodeWithPagedKVCacheWrapper keep
FlashInfer's signatures so code written for FlashInfer runs unchanged; options
Tessera does not implement yet raise ValueError instead of being silently
ignored.

CUDA tensors (torch) run the JIT-compiled GPU kernel on torch's current
stream. CPU inputs (numpy arrays or torch CPU tensors) run the C++ reference
implementation in float64 and cast the result to q's dtype, so the API works
on machines without a GPU (slowly: it is meant for tests and tools).
"""

import functools
import math
import numbers

import numpy as np

from . import _tensors as T
from ._native import _C

_LAYOUTS = ("NHD", "HND")


def _reject_unsupported(pos_encoding_mode, q_scale, k_scale, v_scale, window_left, logits_soft_cap, rope_scale,
                        rope_theta):
    """Raises ValueError for FlashInfer options whose non-default values Tessera cannot honour yet."""
    if pos_encoding_mode != "NONE":
        raise ValueError(f"pos_encoding_mode={pos_encoding_mode!r}: only 'NONE' is supported; RoPE is not supported yet")
    if window_left != -1:
        raise ValueError(f"window_left={window_left}: sliding-window attention is not supported yet (use -1)")
    if logits_soft_cap is not None and logits_soft_cap != 0.0:
        raise ValueError(f"logits_soft_cap={logits_soft_cap}: logits soft-capping is not supported yet")
    for name, value in (("rope_scale", rope_scale), ("rope_theta", rope_theta)):
        if value is not None:
            raise ValueError(f"{name}={value}: RoPE is not supported yet")
    for name, value in (("q_scale", q_scale), ("k_scale", k_scale), ("v_scale", v_scale)):
        if value is not None:
            raise ValueError(f"{name}: quantization scales are not supported yet")


def single_decode_with_kv_cache(q, k, v, kv_layout="NHD", pos_encoding_mode="NONE", use_tensor_cores=False,
                                q_scale=None, k_scale=None, v_scale=None, window_left=-1, logits_soft_cap=None,
                                sm_scale=None, rope_scale=None, rope_theta=None, return_lse=False):
    """Attention of one decode query over a contiguous KV cache.

    Query head h attends to KV head h // (num_qo_heads // num_kv_heads)
    (grouped-query attention; num_qo_heads must be a multiple of
    num_kv_heads).

    Args:
        q: [num_qo_heads, head_dim], float16 or bfloat16 on the GPU
            (float32 is also accepted on the CPU).
        k, v: [kv_len, num_kv_heads, head_dim] for kv_layout "NHD", or
            [num_kv_heads, kv_len, head_dim] for "HND"; same shape and dtype.
        kv_layout: "NHD" or "HND".
        pos_encoding_mode: only "NONE" (no RoPE) is supported.
        use_tensor_cores: accepted for compatibility; the kernel is chosen
            by Tessera and the result does not depend on it.
        q_scale, k_scale, v_scale, rope_scale, rope_theta: must be None.
        window_left: must be -1 (no sliding window).
        logits_soft_cap: must be None (or 0.0, which means off).
        sm_scale: softmax scale; None means 1 / sqrt(head_dim).
        return_lse: also return the log-sum-exp.

    Returns:
        o [num_qo_heads, head_dim] with q's dtype, framework and device; with
        return_lse, (o, lse) where lse is float32 [num_qo_heads] in **base 2**
        (log2 of the softmax denominator, FlashInfer's convention, ready for
        tessera.merge_state).
    """
    if kv_layout not in _LAYOUTS:
        raise ValueError(f"kv_layout: expected 'NHD' or 'HND', got {kv_layout!r}")
    _reject_unsupported(pos_encoding_mode, q_scale, k_scale, v_scale, window_left, logits_soft_cap, rope_scale,
                        rope_theta)
    T.common_framework(q=q, k=k, v=v)
    if len(q.shape) != 2:
        raise ValueError(f"q: expected a 2-D tensor [num_qo_heads, head_dim], got shape {tuple(q.shape)}")
    for name, x in (("k", k), ("v", v)):
        if len(x.shape) != 3:
            raise ValueError(f"{name}: expected a 3-D tensor ({kv_layout}), got shape {tuple(x.shape)}")
    if sm_scale is not None and not (isinstance(sm_scale, numbers.Real) and 0 < sm_scale < math.inf):
        raise ValueError(f"sm_scale: expected a positive finite number or None, got {sm_scale!r}")
    scale = -1.0 if sm_scale is None else float(sm_scale)

    if T.is_cuda(q):
        o, lse = _decode_gpu(q, k, v, kv_layout, scale, return_lse)
    else:
        o, lse = _decode_cpu(q, k, v, kv_layout, scale)
    return (o, lse) if return_lse else o


def _decode_gpu(q, k, v, kv_layout, scale, return_lse):
    """CUDA path: the C++ single_decode on torch's current stream of q's device."""
    qd = T.dtype_name(q, "q", ("float16", "bfloat16"))
    kd = T.dtype_name(k, "k", ("float16", "bfloat16"))
    o = T.empty(q, q.shape)
    lse = T.empty(q, q.shape[:1], "float32") if return_lse else None
    with T.on_device_of(q):
        _C.single_decode(T.arg(q), T.arg(k), T.arg(v), o, lse, kv_layout, "standard", qd, kd, qd, int(q.shape[1]),
                         scale, T.stream_of(q))
    return o, lse


def _decode_cpu(q, k, v, kv_layout, scale):
    """CPU path: the float64 C++ reference, result cast to q's dtype."""
    for name, x in (("k", k), ("v", v)):
        if T.device_of(x) != "cpu":
            raise TypeError(f"{name}: expected a CPU tensor like q, got one on {T.device_of(x)}")
    for name, x in (("q", q), ("k", k), ("v", v)):
        T.dtype_name(x, name)
    if kv_layout == "HND":  # strided NHD views, no copy
        k, v = k.swapaxes(0, 1), v.swapaxes(0, 1)
    kv_len = int(k.shape[0])
    o64, lse64 = _C.reference_attention_ragged(T.arg(q[None]), [0, 1], T.arg(k), T.arg(v), [0, kv_len], scale)
    return T.from_float64(o64[0], q), T.from_float64(lse64[0], q, "float32")


# ======================================================================= batch decode
_INT32_MAX = 2**31 - 1
_DTYPE_ALIASES = {"half": "float16", "fp16": "float16", "bf16": "bfloat16"}


def _dtype_arg(value, name):
    """A data type given as a torch dtype, numpy dtype or string, as 'float16' or 'bfloat16'."""
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
    s = _DTYPE_ALIASES.get(s, s)
    if s not in ("float16", "bfloat16"):
        raise TypeError(f"{name}: expected float16 or bfloat16, got {s} (other data types are not supported yet)")
    return s


def _host_ints(x, name):
    """A 1-D index array (torch tensor on any device, numpy array, list) as contiguous CPU int32 numpy."""
    if T.is_torch(x):
        if x.is_floating_point() or x.is_complex():
            raise TypeError(f"{name}: expected an integer tensor, got {str(x.dtype).replace('torch.', '')}")
        arr = x.detach().cpu().numpy()  # a GPU tensor is copied (synchronously) to the host, as FlashInfer does
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
    if arr.size and (int(arr.min()) < -_INT32_MAX - 1 or int(arr.max()) > _INT32_MAX):
        raise ValueError(f"{name}: expected values that fit in int32")
    return np.ascontiguousarray(arr, dtype=np.int32)


def _positive_int(value, name):
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise ValueError(f"{name}: expected a positive int, got {value!r}")
    return int(value)


def _unpack_paged_kv_cache(paged_kv_cache):
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


class BatchDecodeWithPagedKVCacheWrapper:
    """Batch decode attention over a paged KV cache (FlashInfer's wrapper of the same name).

    plan() once per generation step (it schedules the step on the host with
    the load-balanced planner and uploads the schedule into the workspace),
    then run() for every layer. run() allocates nothing on the device beyond
    its output and never synchronizes, so it can be captured in a CUDA graph
    (torch.cuda.graph) and replayed after later plan() calls with new
    lengths.

    Workspace bounds: the C++ schedule lives in fixed sections of
    float_workspace_buffer sized for a largest batch and a largest number of
    page-table entries. They come from paged_kv_indptr_buffer /
    paged_kv_indices_buffer when given (FlashInfer's CUDA-graph buffers; their
    sizes are all Tessera uses them for), else from the first plan(). With
    use_cuda_graph=True the bounds are fixed: a later plan() beyond them
    raises ValueError naming max_batch or max_pages (a captured graph holds
    the workspace addresses). Without CUDA graphs a larger plan() re-sizes the
    sections (waiting for the GPU once) as long as float_workspace_buffer is
    large enough.
    """

    def __init__(self, float_workspace_buffer, kv_layout="NHD", use_cuda_graph=False, use_tensor_cores=False,
                 paged_kv_indptr_buffer=None, paged_kv_indices_buffer=None, paged_kv_last_page_len_buffer=None,
                 backend="auto", jit_args=None):
        """
        Args:
            float_workspace_buffer: a torch uint8 CUDA tensor (FlashInfer users
                allocate 128 MB) used as the device workspace. It must stay
                alive and unused by anything else while the wrapper is in use.
            kv_layout: "NHD" or "HND".
            use_cuda_graph: fix the workspace bounds (see the class doc).
            use_tensor_cores: accepted for compatibility; Tessera picks its
                decode kernel itself and the result does not depend on it.
            paged_kv_indptr_buffer, paged_kv_indices_buffer,
            paged_kv_last_page_len_buffer: optional 1-D tensors whose lengths
                fix max_batch (indptr length - 1, or last_page_len length) and
                max_pages (indices length).
            backend: "auto" or "fa2" (both mean Tessera's kernel).
            jit_args: must be None (custom variants are not supported yet).
        """
        if kv_layout not in _LAYOUTS:
            raise ValueError(f"kv_layout: expected 'NHD' or 'HND', got {kv_layout!r}")
        if backend not in ("auto", "fa2"):
            raise ValueError(f"backend={backend!r}: not supported yet (only 'auto' / 'fa2', Tessera's own kernel)")
        if jit_args is not None:
            raise ValueError("jit_args: custom JIT variants are not supported yet")
        T.framework(float_workspace_buffer, "float_workspace_buffer")
        self._float_workspace_buffer = float_workspace_buffer
        self._kv_layout = kv_layout
        self._use_cuda_graph = bool(use_cuda_graph)
        self._use_tensor_cores = bool(use_tensor_cores)
        # Kept only so the caller's buffers outlive the wrapper as in FlashInfer.
        self._paged_kv_buffers = (paged_kv_indptr_buffer, paged_kv_indices_buffer, paged_kv_last_page_len_buffer)
        self._fixed_batch = self._fixed_pages = None
        if paged_kv_indptr_buffer is not None:
            self._fixed_batch = _positive_int(len(paged_kv_indptr_buffer) - 1, "paged_kv_indptr_buffer length - 1")
        if paged_kv_last_page_len_buffer is not None:
            n = _positive_int(len(paged_kv_last_page_len_buffer), "paged_kv_last_page_len_buffer length")
            if self._fixed_batch is not None and n != self._fixed_batch:
                raise ValueError(f"paged_kv_last_page_len_buffer: expected {self._fixed_batch} entries "
                                 f"(paged_kv_indptr_buffer length - 1), got {n}")
            self._fixed_batch = n
        if paged_kv_indices_buffer is not None:
            self._fixed_pages = _positive_int(len(paged_kv_indices_buffer), "paged_kv_indices_buffer length")
        # Tessera-only knobs (not in FlashInfer's signature): the planner's KV
        # splitting (False = the no-load-balancing ablation) and an SM cap.
        self._split_kv = True
        self._max_sms = 0
        self._native = None  # the C++ BatchDecode, built by plan()
        self._native_key = None  # what it was built for: dtypes, shape, bounds
        self._pinned = None  # the pinned host staging buffer it borrows
        self._planned = None  # what the last plan() fixed for run()

    @property
    def is_cuda_graph_enabled(self):
        return self._use_cuda_graph

    @property
    def use_tensor_cores(self):
        return self._use_tensor_cores

    def plan(self, indptr, indices, last_page_len, num_qo_heads, num_kv_heads, head_dim, page_size,
             pos_encoding_mode="NONE", window_left=-1, logits_soft_cap=None, q_data_type="float16",
             kv_data_type=None, data_type=None, sm_scale=None, rope_scale=None, rope_theta=None, non_blocking=True,
             o_data_type=None):
        """Plans one decode step.

        Args:
            indptr: int [batch + 1] page-table row pointers (torch on any
                device, numpy or list; copied to the host).
            indices: int [indptr[-1]] page indices.
            last_page_len: int [batch] tokens in each request's last page
                (1..page_size; any value for a request without pages).
            num_qo_heads, num_kv_heads: query heads must be a multiple of KV heads.
            head_dim: 64, 128 or 256.
            page_size: tokens per page.
            pos_encoding_mode, window_left, logits_soft_cap, rope_scale,
            rope_theta: only the defaults (no RoPE, no window, no soft cap).
            q_data_type, kv_data_type, o_data_type: float16 or bfloat16 (torch
                dtype or name); kv and o default to q's. data_type
                (deprecated in FlashInfer) fills kv_data_type when it is None.
            sm_scale: softmax scale; None means 1 / sqrt(head_dim).
            non_blocking: accepted; the schedule upload is always asynchronous.
        """
        _reject_unsupported(pos_encoding_mode, None, None, None, window_left, logits_soft_cap, rope_scale, rope_theta)
        if data_type is not None:
            q_data_type = data_type if q_data_type is None else q_data_type
            kv_data_type = data_type if kv_data_type is None else kv_data_type
        q_dt = _dtype_arg(q_data_type, "q_data_type")
        kv_dt = q_dt if kv_data_type is None else _dtype_arg(kv_data_type, "kv_data_type")
        o_dt = q_dt if o_data_type is None else _dtype_arg(o_data_type, "o_data_type")
        shape = tuple(_positive_int(x, n) for x, n in ((num_qo_heads, "num_qo_heads"), (num_kv_heads, "num_kv_heads"),
                                                       (head_dim, "head_dim"), (page_size, "page_size")))
        if sm_scale is not None and not (isinstance(sm_scale, numbers.Real) and 0 < sm_scale < math.inf):
            raise ValueError(f"sm_scale: expected a positive finite number or None, got {sm_scale!r}")
        # The C++ checks of dtypes, heads and head_dim, without touching a GPU.
        _C.BatchDecode.workspace_size(q_dt, kv_dt, o_dt, shape[2], shape[0], shape[1], shape[3], self._kv_layout, 1, 1,
                                      num_sms=1)
        indptr = _host_ints(indptr, "indptr")
        indices = _host_ints(indices, "indices")
        last_page_len = _host_ints(last_page_len, "last_page_len")
        if indptr.size < 1:
            raise ValueError("indptr: expected batch_size + 1 >= 1 entries, got 0")
        batch = indptr.size - 1
        if indices.size > indptr[-1] >= 0:  # FlashInfer tolerates a longer indices buffer
            indices = indices[: indptr[-1]]
        buf = self._float_workspace_buffer
        if not (T.is_cuda(buf) and str(buf.dtype) == "torch.uint8"):
            raise TypeError(f"float_workspace_buffer: expected a torch uint8 CUDA tensor, got "
                            f"{type(buf).__name__} of {getattr(buf, 'dtype', '?')} on {T.device_of(buf)}")
        if not buf.is_contiguous():
            raise ValueError("float_workspace_buffer: expected a contiguous tensor")

        self._ensure_native((q_dt, kv_dt, o_dt) + shape, max(batch, 1), max(int(indices.size), 1))
        torch = T._torch()
        with torch.cuda.device(buf.device):
            self._native.plan(indptr, indices, last_page_len, torch.cuda.current_stream(buf.device).cuda_stream)
        self._planned = {"batch": batch, "q_dtype": q_dt, "o_dtype": o_dt, "num_qo_heads": shape[0],
                         "head_dim": shape[2], "sm_scale": -1.0 if sm_scale is None else float(sm_scale)}

    begin_forward = plan

    @property
    def last_plan_us(self):
        """Host time of the last plan() inside the C++ planner, in microseconds."""
        return self._native.last_plan_us if self._native is not None else None

    def _ensure_native(self, config, batch, pages):
        """Builds (or re-sizes) the C++ BatchDecode for this configuration and these counts."""
        key = self._native_key
        same = key is not None and key[0] == config
        if same and batch <= key[1] and pages <= key[2]:
            return
        # Bounds that cannot move: the caller's buffers, and in CUDA-graph mode
        # the first plan's (a captured run() holds the workspace addresses).
        fixed_batch, fixed_pages = self._fixed_batch, self._fixed_pages
        if same and self._use_cuda_graph:
            fixed_batch, fixed_pages = key[1], key[2]
        if fixed_batch is not None and batch > fixed_batch:
            raise ValueError(f"indptr: batch size {batch} exceeds the workspace bound max_batch={fixed_batch} "
                             "(fixed by paged_kv_indptr_buffer, or by the first plan() with use_cuda_graph=True)")
        if fixed_pages is not None and pages > fixed_pages:
            raise ValueError(f"indices: {pages} pages exceed the workspace bound max_pages={fixed_pages} "
                             "(fixed by paged_kv_indices_buffer, or by the first plan() with use_cuda_graph=True)")
        need = (fixed_batch or batch, fixed_pages or pages)
        # Growing without fixed bounds: double, so a slowly growing workload
        # re-sizes rarely (each re-size waits for the GPU once).
        want = (fixed_batch or max(batch, 2 * key[1]), fixed_pages or max(pages, 2 * key[2])) if same else need
        torch = T._torch()
        buf = self._float_workspace_buffer
        device = buf.device.index or 0
        q_dt, kv_dt, o_dt, hq, hkv, d, ps = config
        args = (q_dt, kv_dt, o_dt, d, hq, hkv, ps, self._kv_layout)
        have = buf.numel()
        dev_bytes, host_bytes = _C.BatchDecode.workspace_size(*args, *want, device=device)
        if dev_bytes > have and want != need:
            want = need
            dev_bytes, host_bytes = _C.BatchDecode.workspace_size(*args, *want, device=device)
        if dev_bytes > have:
            raise ValueError(f"float_workspace_buffer: expected at least {dev_bytes} bytes for max_batch={want[0]}, "
                             f"max_pages={want[1]}, got {have}")
        if self._native is not None:
            # Queued kernels may still read the old schedule, and a queued
            # upload may still read the pinned staging buffer.
            torch.cuda.synchronize(buf.device)
        if self._pinned is None or self._pinned.numel() < host_bytes:
            self._pinned = torch.empty(max(host_bytes, 1), dtype=torch.uint8, pin_memory=True)
        self._native = None
        self._native = _C.BatchDecode(*args, *want, buf.data_ptr(), have, self._pinned.data_ptr(),
                                      self._pinned.numel(), device, split_kv=self._split_kv, max_sms=self._max_sms)
        self._native_key = (config, want[0], want[1])

    def run(self, q, paged_kv_cache, *args, q_scale=None, k_scale=None, v_scale=None, out=None, lse=None,
            return_lse=False, enable_pdl=None, window_left=None):
        """Decode attention of the planned step.

        Args:
            q: [batch, num_qo_heads, head_dim] CUDA tensor of q_data_type.
            paged_kv_cache: (k_cache, v_cache), each [num_pages, page_size,
                num_kv_heads, head_dim] (NHD) or [num_pages, num_kv_heads,
                page_size, head_dim] (HND), or one interleaved tensor
                [num_pages, 2, ...] (K at index 0, V at 1).
            q_scale, k_scale, v_scale: must be None.
            out: optional output like q (o_data_type); allocated when None.
            lse: optional float32 [batch, num_qo_heads] for the log-sum-exp;
                allocated when None and return_lse.
            return_lse: also return the LSE, in **base 2** (FlashInfer's
                convention, ready for tessera.merge_state).
            enable_pdl: None or False (programmatic dependent launch is not
                supported yet).
            window_left: None or -1.

        Returns:
            out, or (out, lse) with return_lse.
        """
        if self._planned is None:
            raise ValueError("run: expected plan() to be called first")
        if args:
            raise ValueError("run: extra positional arguments (custom JIT variants) are not supported yet")
        _reject_unsupported("NONE", q_scale, k_scale, v_scale, -1 if window_left is None else window_left, None,
                            None, None)
        if enable_pdl:
            raise ValueError("enable_pdl=True: programmatic dependent launch is not supported yet")
        k, v = _unpack_paged_kv_cache(paged_kv_cache)
        if not T.is_cuda(q):
            raise TypeError(f"q: expected a CUDA tensor, got {type(q).__name__} on {T.device_of(q)}")
        plan = self._planned
        if len(q.shape) != 3:
            raise ValueError(f"q: expected a 3-D tensor [batch_size, num_qo_heads, head_dim], got shape {tuple(q.shape)}")
        if out is None:
            out = T.empty(q, q.shape, plan["o_dtype"])
        if lse is None and return_lse:
            lse = T.empty(q, q.shape[:2], "float32")
        with T.on_device_of(q):
            self._native.run(T.arg(q), T.arg(k), T.arg(v), out, lse, plan["sm_scale"], T.stream_of(q))
        return (out, lse) if return_lse else out

    run_return_lse = functools.partialmethod(run, return_lse=True)

    def end_forward(self):
        """Kept for FlashInfer compatibility; nothing to release."""
