"""Multi-head latent attention (DeepSeek-style MLA with absorbed weights):
FlashInfer's ``flashinfer.mla.BatchMLAPagedAttentionWrapper`` over Tessera's
MLA kernel (``include/tessera/device/kernels/mla/``) and planner.

MLA decode is attention of ``num_heads`` query heads over one latent KV head:
K = concat(ckv, kpe), V = ckv, q = concat(q_nope, q_pe), with ``ckv_cache``
``[num_pages, page_size, 512]`` and ``kpe_cache`` ``[num_pages, page_size,
64]`` paged by ``kv_indices``. Each request may bring several queries
(speculative / MTP verification, absorbed prefill), causal among its new
tokens when ``causal=True``. LSE is base 2, as FlashInfer's.

plan() checks every argument's structure before it needs a GPU (ValueError /
TypeError naming the argument), runs the load-balanced planner (split-KV for
long contexts) and uploads the schedule; run() is one persistent kernel
launch with no allocation (given ``out``) and no synchronization, so it can
be captured in a CUDA graph and replayed after later plans
(``use_cuda_graph=True`` fixes the workspace bounds at the first plan()).
"""

import dataclasses
import numbers

import numpy as np

from . import _tensors as T
from . import _wrapper_util as W
from ._errors import not_supported
from ._native import _C
from ._workspace import Bound, ensure_native

_DIM_CKV, _DIM_KPE = 512, 64
_CSR_FIELDS = ("qo_indptr", "kv_indptr", "kv_indices", "kv_len_arr")
_DENSE_FIELDS = ("cum_seq_lens_q", "block_tables", "seq_lens", "max_q_len")


@dataclasses.dataclass(frozen=True)
class MLAPlanMetadata:
    """FlashInfer's ``flashinfer.mla.MLAPlanMetadata``: a step's page table for
    plan(metadata=...), as CSR (``qo_indptr``, ``kv_indptr``, ``kv_indices``,
    ``kv_len_arr``), dense (``cum_seq_lens_q``, ``block_tables`` [batch, width]
    with each request's pages first in its row, ``seq_lens``, ``max_q_len``) or
    both (``dual``; plan() then runs from the CSR form)."""
    qo_indptr: object = None
    kv_indptr: object = None
    kv_indices: object = None
    kv_len_arr: object = None
    cum_seq_lens_q: object = None
    block_tables: object = None
    seq_lens: object = None
    max_q_len: object = None

    @classmethod
    def csr(cls, qo_indptr, kv_indptr, kv_indices, kv_len_arr):
        return cls(qo_indptr=qo_indptr, kv_indptr=kv_indptr, kv_indices=kv_indices, kv_len_arr=kv_len_arr)

    @classmethod
    def dense(cls, cum_seq_lens_q, block_tables, seq_lens, max_q_len=None):
        return cls(cum_seq_lens_q=cum_seq_lens_q, block_tables=block_tables, seq_lens=seq_lens, max_q_len=max_q_len)

    @classmethod
    def dual(cls, qo_indptr, kv_indptr, kv_indices, kv_len_arr, *, cum_seq_lens_q, block_tables, seq_lens,
             max_q_len=None):
        return cls(qo_indptr, kv_indptr, kv_indices, kv_len_arr, cum_seq_lens_q, block_tables, seq_lens, max_q_len)


def _plan_tables(metadata, flat, page_size):
    """(qo_indptr, kv_indptr, kv_indices, kv_len_arr) from plan()'s metadata
    (ours or FlashInfer's object) or its flat arguments of one form (a dict
    of the eight fields)."""
    if metadata is not None:
        if any(v is not None for v in flat.values()):
            raise ValueError("metadata: give either metadata= or the flat page-table arguments, not both")
        if not all(hasattr(metadata, f) for f in _CSR_FIELDS + _DENSE_FIELDS):
            raise TypeError(f"metadata: expected an MLAPlanMetadata, got {type(metadata).__name__}")
        fields = {f: getattr(metadata, f) for f in _CSR_FIELDS + _DENSE_FIELDS}
    else:
        fields = flat
        if any(fields[f] is not None for f in _CSR_FIELDS) and any(fields[f] is not None for f in _DENSE_FIELDS):
            raise ValueError("cum_seq_lens_q: the flat CSR (qo_indptr, kv_indptr, kv_indices, kv_len_arr) and dense "
                             "(cum_seq_lens_q, block_tables, seq_lens, max_q_len) forms cannot be mixed")
    if any(fields[f] is not None for f in _CSR_FIELDS) or all(fields[f] is None for f in _DENSE_FIELDS):
        for f in _CSR_FIELDS:
            if fields[f] is None:
                raise TypeError(f"plan() missing required argument: '{f}'")
        return tuple(fields[f] for f in _CSR_FIELDS)
    return _csr_from_dense(*(fields[f] for f in _DENSE_FIELDS), page_size)


def _csr_from_dense(cum_seq_lens_q, block_tables, seq_lens, max_q_len, page_size):
    """The CSR page table of a dense one: request b's first ceil(seq_lens[b] /
    page_size) entries of block_tables row b. A CUDA table is gathered on its
    device (the kernels check the ids), anything else on the host."""
    for name, value in (("cum_seq_lens_q", cum_seq_lens_q), ("block_tables", block_tables), ("seq_lens", seq_lens)):
        if value is None:
            raise TypeError(f"plan() missing required argument: '{name}' (the dense page table)")
    qo = W.host_ints(cum_seq_lens_q, "cum_seq_lens_q")
    lens = W.host_ints(seq_lens, "seq_lens")
    if qo.size < 1:
        raise ValueError("cum_seq_lens_q: expected batch + 1 entries, got 0")
    batch = qo.size - 1
    if lens.size != batch:
        raise ValueError(f"seq_lens: expected {batch} entries (one per request), got {lens.size}")
    if batch and int(lens.min()) < 0:
        raise ValueError(f"seq_lens: expected lengths >= 0, got {int(lens.min())}")
    block_tables = W.int_table(block_tables, "block_tables", keep_cuda=True)
    shape = tuple(block_tables.shape)
    if len(shape) != 2 or shape[0] != batch:
        raise ValueError(f"block_tables: expected shape [{batch}, max pages] (a row per request), got {shape}")
    pages = (lens.astype(np.int64) + page_size - 1) // page_size
    if batch and int(pages.max()) > shape[1]:
        raise ValueError(f"block_tables: {shape[1]} columns, but seq_lens needs {int(pages.max())} pages of "
                         f"{page_size} tokens")
    if max_q_len is not None:
        if not isinstance(max_q_len, numbers.Integral) or isinstance(max_q_len, bool):
            raise TypeError(f"max_q_len: expected an int or None, got {type(max_q_len).__name__}")
        longest = int(np.diff(qo).max()) if batch else 0
        if max_q_len < longest:
            raise ValueError(f"max_q_len: expected at least the longest query length {longest}, got {max_q_len}")
    kv_indptr = np.zeros(batch + 1, np.int64)
    np.cumsum(pages, out=kv_indptr[1:])
    if kv_indptr[-1] > W.INT32_MAX:
        raise ValueError(f"seq_lens: {int(kv_indptr[-1])} pages in all, more than int32 holds")
    rows, cols = W.csr_cells(kv_indptr)
    if T.is_torch(block_tables):  # on the GPU (int_table keeps only those)
        import torch
        kv_indices = block_tables[torch.from_numpy(rows).to(block_tables.device),
                                  torch.from_numpy(cols).to(block_tables.device)]
    else:
        kv_indices = block_tables[rows, cols]
    return qo, kv_indptr.astype(np.int32), kv_indices, lens


class BatchMLAPagedAttentionWrapper(W.PlannedWrapper):
    """FlashInfer 0.7.2's BatchMLAPagedAttentionWrapper: plans from CSR or
    dense page tables (flat or MLAPlanMetadata), runs split (q_nope / q_pe,
    ckv / kpe) or packed (query=, kv_cache=) inputs."""

    def __init__(self, float_workspace_buffer, use_cuda_graph=False, qo_indptr=None, kv_indptr=None,
                 kv_indices=None, kv_len_arr=None, backend="auto"):
        if backend not in ("auto", "fa2", "fa3"):
            raise not_supported("backend", backend, "Tessera's MLA kernels: 'auto' (the Hopper kernel on sm_90, "
                                "else fa2), 'fa2' (mma.sync, sm_80+) or 'fa3' (Hopper)")
        self._backend = backend
        self._cta_q = 0  # Tessera-only: pins the query tile (16, 32 or 64; fp8 caches: 16 or 64)
        if not isinstance(use_cuda_graph, bool):
            raise TypeError(f"use_cuda_graph: expected a bool, got {type(use_cuda_graph).__name__}")
        self._float_workspace_buffer = float_workspace_buffer
        self._buffer_checked = False
        self._use_cuda_graph = use_cuda_graph
        # FlashInfer's CUDA-graph buffers: their lengths bound the plans (the
        # schedule itself lives in the workspace, whose address never moves).
        self._qo_indptr_buf, self._kv_indptr_buf = qo_indptr, kv_indptr
        self._kv_indices_buf, self._kv_len_arr_buf = kv_indices, kv_len_arr
        self._native = None
        self._native_key = None
        self._pinned = None
        self._planned = None

    def _bounds(self):
        def fixed(buf, minus):
            return None if buf is None else max(W.buffer_length(buf, "buffer") - minus, 1)
        return (Bound("max_batch", "qo_indptr", "batch size", fixed(self._qo_indptr_buf, 1), "qo_indptr"),
                Bound("max_total_q", "qo_indptr", "total query length"),
                Bound("max_pages", "kv_indices", "page count", fixed(self._kv_indices_buf, 0), "kv_indices"))

    def plan(self, qo_indptr=None, kv_indptr=None, kv_indices=None, kv_len_arr=None, num_heads=None,
             head_dim_ckv=None, head_dim_kpe=None, page_size=None, causal=None, sm_scale=None, q_data_type=None,
             kv_data_type=None, use_profiler=False, *, metadata=None, cum_seq_lens_q=None, block_tables=None,
             seq_lens=None, max_q_len=None, query_layout=None, kv_cache_layout=None, lse_mode="none",
             output_dtype=None, output_scale="none", scale_mode="default", skip_softmax=False, enable_pdl=None,
             use_sinks=False):
        """Plans one step (every layer's run() reuses it).

        The page table comes flat (the CSR arguments, or the dense ones:
        cum_seq_lens_q, block_tables, seq_lens, max_q_len) or as
        ``metadata=MLAPlanMetadata.csr(...)`` / ``.dense(...)``; a dense table
        is turned into the CSR one here.

        Args:
            qo_indptr: int [batch + 1], queries of each request.
            kv_indptr: int [batch + 1], pages of each request in kv_indices.
            kv_indices: int page ids (a CUDA tensor stays on the GPU: copied
                on the stream, checked by the kernel).
            kv_len_arr: int [batch], tokens of each request (its pages hold
                exactly ceil(kv_len / page_size)).
            num_heads: query heads; head_dim_ckv 512, head_dim_kpe 64.
            page_size: tokens per page; causal: mask among new tokens.
            sm_scale: softmax scale (DeepSeek: 1 / sqrt(192) times any YaRN factor).
            q_data_type: float16 or bfloat16; kv_data_type: the same, or an fp8
                dtype (float8_e4m3fn, float8_e5m2; the Hopper kernel), whose
                run() takes ckv_scale and kpe_scale.
            enable_pdl: programmatic dependent launch of every run() of the
                plan (None: on; ignored before sm_90): the kernel may start
                while the kernel before it on the stream finishes, and waits
                for it before reading q or the caches.
        """
        for name, value, default in (("output_scale", output_scale, "none"),
                                     ("skip_softmax", skip_softmax, False), ("use_sinks", use_sinks, False),
                                     ("use_profiler", use_profiler, False)):
            if value is not default and value != default:
                raise not_supported(name, value, "Tessera's MLA wrapper takes the default")
        # run() takes either form of each (q_nope / q_pe or query=, ckv / kpe
        # or kv_cache=), so the declared layouts are only checked.
        for name, value in (("query_layout", query_layout), ("kv_cache_layout", kv_cache_layout)):
            if value not in (None, "packed", "split"):
                raise ValueError(f"{name}: expected 'packed' or 'split', got {value!r}")
        if lse_mode not in ("none", "base2", "basee"):
            raise ValueError(f"lse_mode: expected 'none', 'base2' or 'basee', got {lse_mode!r}")
        for name, value in (("num_heads", num_heads), ("head_dim_ckv", head_dim_ckv),
                            ("head_dim_kpe", head_dim_kpe), ("page_size", page_size), ("causal", causal),
                            ("sm_scale", sm_scale), ("q_data_type", q_data_type), ("kv_data_type", kv_data_type)):
            if value is None:
                raise TypeError(f"plan() missing required argument: '{name}'")
        num_heads = W.positive_int(num_heads, "num_heads")
        page_size = W.positive_int(page_size, "page_size")
        flat = dict(qo_indptr=qo_indptr, kv_indptr=kv_indptr, kv_indices=kv_indices, kv_len_arr=kv_len_arr,
                    cum_seq_lens_q=cum_seq_lens_q, block_tables=block_tables, seq_lens=seq_lens, max_q_len=max_q_len)
        qo_indptr, kv_indptr, kv_indices, kv_len_arr = _plan_tables(metadata, flat, page_size)
        if W.positive_int(head_dim_ckv, "head_dim_ckv") != _DIM_CKV:
            raise ValueError(f"head_dim_ckv: expected 512 (DeepSeek's kv_lora_rank), got {head_dim_ckv}")
        if W.positive_int(head_dim_kpe, "head_dim_kpe") != _DIM_KPE:
            raise ValueError(f"head_dim_kpe: expected 64 (DeepSeek's qk_rope_head_dim), got {head_dim_kpe}")
        if not isinstance(causal, (bool, numbers.Integral)):
            raise TypeError(f"causal: expected a bool, got {type(causal).__name__}")
        sm_scale = W.sm_scale_arg(sm_scale)
        q_dtype = W.dtype_arg(q_data_type, "q_data_type")
        kv_dtype = W.dtype_arg(kv_data_type, "kv_data_type", fp8=True)
        if output_dtype is not None and W.dtype_arg(output_dtype, "output_dtype", fp8=True) != q_dtype:
            raise not_supported("output_dtype", output_dtype, f"outputs of q_data_type's {q_dtype}")
        fp8 = kv_dtype in ("float8_e4m3fn", "float8_e5m2")
        if kv_dtype != q_dtype and not fp8:
            raise TypeError(f"kv_data_type: expected q_data_type's {q_dtype} or an fp8 dtype (float8_e4m3fn, "
                            f"float8_e5m2), got {kv_dtype}")
        if scale_mode not in ("default", "kv-per-tensor"):
            raise not_supported("scale_mode", scale_mode, "per-tensor fp8 cache scales ('kv-per-tensor') or none")
        if scale_mode == "kv-per-tensor" and not fp8:
            raise ValueError("scale_mode: 'kv-per-tensor' is for fp8 caches; expected 'default' with "
                             f"kv_data_type {kv_dtype}")
        qo = W.host_ints(qo_indptr, "qo_indptr")
        ip = W.host_ints(kv_indptr, "kv_indptr")
        lens = W.host_ints(kv_len_arr, "kv_len_arr")
        if qo.size < 1:
            raise ValueError("qo_indptr: expected batch + 1 entries, got 0")
        if ip.size != qo.size:
            raise ValueError(f"kv_indptr: expected {qo.size} entries (like qo_indptr), got {ip.size}")
        if lens.size != qo.size - 1:
            raise ValueError(f"kv_len_arr: expected {qo.size - 1} entries (one per request), got {lens.size}")
        count = int(ip[-1])
        ids = W.page_ids(kv_indices, count, "kv_indices", self._float_workspace_buffer)
        batch, total_q = qo.size - 1, int(qo[-1])
        W.check_workspace_buffer_once(self)
        config = (q_dtype, kv_dtype, num_heads, page_size, bool(causal), self._cta_q)

        def size(want, dev):
            i_dev, i_host = _C.BatchMLA.workspace_size(q_dtype, kv_dtype, num_heads, _DIM_CKV, _DIM_KPE, page_size,
                                                       bool(causal), *want, device=dev, cta_q=self._cta_q,
                                                       backend=self._backend)
            m_dev, _ = _C.BatchMLA.min_workspace_size(q_dtype, kv_dtype, num_heads, _DIM_CKV, _DIM_KPE, page_size,
                                                      bool(causal), *want, device=dev, cta_q=self._cta_q,
                                                      backend=self._backend)
            return i_dev, m_dev, i_host

        def make(want, ws_ptr, ws_bytes, host_ptr, host_bytes, dev):
            return _C.BatchMLA(q_dtype, kv_dtype, num_heads, _DIM_CKV, _DIM_KPE, page_size, bool(causal), *want,
                               ws_ptr, ws_bytes, host_ptr, host_bytes, dev, cta_q=self._cta_q, backend=self._backend)

        ensure_native(self, config, (max(batch, 1), max(total_q, 1), max(count, 1)), self._bounds(), size, make)
        stream = T.stream_of(self._float_workspace_buffer)
        if isinstance(ids, W.DeviceIds):
            self._native.plan_device(qo, ip, ids.ptr, ids.count, ids.device, lens, stream)
        else:
            self._native.plan(qo, ip, ids, lens, stream)
        self._planned = dict(num_heads=num_heads, total_q=total_q, sm_scale=sm_scale, dtype=q_dtype,
                             lse_base_e=lse_mode == "basee", pdl=W.pdl_arg(enable_pdl), fp8=fp8)

    def run(self, q_nope=None, q_pe=None, ckv_cache=None, kpe_cache=None, out=None, lse=None, return_lse=False,
            profiler_buffer=None, kv_len=None, page_table=None, return_lse_base_on_e=False, o_scale=None, *,
            query=None, kv_cache=None, ckv_scale=None, ckv_scale_arr=None, kpe_scale=None, sinks=None,
            skip_softmax_threshold_scale_factor=None, bmm1_scale=None, bmm2_scale=None):
        """out [total_q, num_heads, 512] (and, with return_lse, lse [total_q, num_heads], base 2 unless
        return_lse_base_on_e) for the last plan()."""
        for name, value in (("profiler_buffer", profiler_buffer), ("kv_len", kv_len), ("page_table", page_table),
                            ("o_scale", o_scale), ("ckv_scale_arr", ckv_scale_arr), ("sinks", sinks),
                            ("skip_softmax_threshold_scale_factor", skip_softmax_threshold_scale_factor),
                            ("bmm1_scale", bmm1_scale), ("bmm2_scale", bmm2_scale)):
            if value is not None:
                raise not_supported(name, value, "the plan's CSR page table, and per-tensor scales (ckv_scale, "
                                    "kpe_scale) for fp8 caches")
        if query is not None:
            if q_nope is not None or q_pe is not None:
                raise ValueError("query: give either query= or q_nope / q_pe, not both")
            q_nope, q_pe = _split(query, "query", _DIM_CKV)
        if kv_cache is not None:
            if ckv_cache is not None or kpe_cache is not None:
                raise ValueError("kv_cache: give either kv_cache= or ckv_cache / kpe_cache, not both")
            ckv_cache, kpe_cache = _split(kv_cache, "kv_cache", _DIM_CKV)
        for name, value in (("q_nope", q_nope), ("q_pe", q_pe), ("ckv_cache", ckv_cache), ("kpe_cache", kpe_cache)):
            if value is None:
                raise TypeError(f"run() missing required argument: '{name}'")
        p = self._planned
        if p is None:
            raise ValueError("run: expected plan() to be called first")
        if p["fp8"]:
            for name, value in (("ckv_scale", ckv_scale), ("kpe_scale", kpe_scale)):
                if value is None:
                    raise ValueError(f"{name}: required with an fp8 cache (its per-tensor dequantization scale)")
            ckv_scale = W._scale_value("ckv_scale", ckv_scale, True)
            kpe_scale = W._scale_value("kpe_scale", kpe_scale, True)
        else:
            if ckv_scale is not None or kpe_scale is not None:
                raise ValueError("ckv_scale / kpe_scale: only for fp8 caches (this plan's are "
                                 f"{p['dtype']})")
            ckv_scale = kpe_scale = 1.0
        if not T.is_cuda(q_nope):
            raise TypeError(f"q_nope: expected a CUDA tensor, got {type(q_nope).__name__} on {T.device_of(q_nope)}")
        if len(q_nope.shape) != 3:
            raise ValueError(f"q_nope: expected a 3-D tensor [total_q, num_heads, 512], got shape {tuple(q_nope.shape)}")
        want_lse = return_lse or lse is not None
        if out is None:
            out = T.empty(q_nope, tuple(q_nope.shape[:2]) + (_DIM_CKV,), p["dtype"])
        if lse is None and want_lse:
            lse = T.empty(q_nope, tuple(q_nope.shape[:2]), "float32")
        self._native.run(T.arg(q_nope), T.arg(q_pe), T.arg(ckv_cache), T.arg(kpe_cache), T.arg(out),
                         T.arg(lse) if lse is not None else None, p["sm_scale"], T.stream_of(q_nope), p["pdl"],
                         ckv_scale, kpe_scale)
        if lse is not None and (return_lse_base_on_e or p["lse_base_e"]):
            lse.mul_(0.6931471805599453)  # base 2 -> natural
        return (out, lse) if return_lse else out


def _split(x, name, dim):
    """A (nope, pe) pair, or one packed tensor [..., dim + pe] as two views."""
    if isinstance(x, (tuple, list)):
        if len(x) != 2:
            raise ValueError(f"{name}: expected a (nope, pe) pair or one packed tensor, got {len(x)} items")
        return x[0], x[1]
    if not hasattr(x, "shape") or x.shape[-1] <= dim:
        raise ValueError(f"{name}: expected a (nope, pe) pair or a tensor of more than {dim} features")
    return x[..., :dim], x[..., dim:]


def append_paged_mla_kv_cache(append_ckv, append_kpe, batch_indices, positions, ckv_cache, kpe_cache, kv_indices,
                              kv_indptr, kv_last_page_len):
    """FlashInfer's append_paged_mla_kv_cache: append_ckv [nnz, 512] and append_kpe [nnz, 64] into ckv_cache
    [num_pages, page_size, 512] / kpe_cache [num_pages, page_size, 64] (the page table of the cache after the
    append, as append_paged_kv_cache takes it). Two appends of one-head rows (the ckv and the kpe parts), each
    writing its rows as both K and V of a single-head cache view: the same bits to the same slots. Under a
    captured CUDA graph the tables are read as append_paged_kv_cache reads them (int32 buffers may grow)."""
    from .page import append_paged_kv_cache
    for name, rows, cache in (("append_ckv", append_ckv, ckv_cache), ("append_kpe", append_kpe, kpe_cache)):
        cache_name = "ckv_cache" if name == "append_ckv" else "kpe_cache"
        if cache is None:
            raise ValueError(f"{cache_name}: expected a tensor, got None")
        if len(getattr(rows, "shape", ())) != 2:
            raise ValueError(f"{name}: expected a 2-D tensor [nnz, dim], got {W_describe(rows)}")
        if len(getattr(cache, "shape", ())) != 3:
            raise ValueError(f"{cache_name}: expected a 3-D tensor [num_pages, page_size, dim], got {W_describe(cache)}")
        view = cache[:, :, None, :]  # NHD, one head
        r = rows[:, None, :]
        append_paged_kv_cache(r, r, batch_indices, positions, (view, view), kv_indices, kv_indptr, kv_last_page_len,
                              "NHD")


def W_describe(x):
    from ._errors import describe
    return describe(x)
