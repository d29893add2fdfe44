"""Decode attention (FlashInfer's ``flashinfer.decode`` names).

single_decode_with_kv_cache (in _single_decode.py) and BatchDecodeWithPagedKVCacheWrapper keep
FlashInfer's signatures so code written for FlashInfer runs unchanged; options
Tessera does not implement yet raise ValueError instead of being silently
ignored.

CUDA tensors (torch) run the JIT-compiled GPU kernel on torch's current
stream. CPU inputs (numpy arrays or torch CPU tensors) run the C++ CPU path
(float accumulation, o in q's dtype), so the API works on machines without a
GPU (slowly: it is meant for tests and tools).
"""

import functools

import numpy as np

from . import _auto_prefix as AP
from . import _compat as C
from . import _tensors as T
from . import _wrapper_util as W
from ._native import _C
from .jit import gen_batch_decode_module, gen_single_decode_module  # noqa: F401 (FlashInfer names)
from ._decode_fast_plan import fast_decode_plan  # noqa: F401 (FlashInfer name)
# Shared with prefill.py; re-exported under the old names (page.py imports them from here).
from ._wrapper_util import LAYOUTS as _LAYOUTS
from ._wrapper_util import dtype_arg as _dtype_arg
from ._wrapper_util import host_ints as _host_ints
from ._wrapper_util import positive_int as _positive_int
from ._wrapper_util import unpack_paged_kv_cache as _unpack_paged_kv_cache
from ._single_decode import single_decode_with_kv_cache  # noqa: F401 (flashinfer.decode's name)


# ======================================================================= batch decode
class BatchDecodeWithPagedKVCacheWrapper(W.PlannedWrapper):
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
    large enough. Below the ideal size (e.g. the common 16 MB) the split-KV
    partial states get what fits, so long requests split over fewer CTAs;
    below the minimum (min_workspace_size) plan() raises ValueError.

    Planning on the GPU (Tessera's keyword-only plan(..., on_device=True,
    batch_size=...)): the step stays in int32 CUDA tensors sized for the
    bounds (their sizes: max_batch = len(indptr) - 1, max_pages =
    len(indices)); plan() only enqueues the planner kernel, so one CUDA
    graph of plan() and every layer's run() serves any batch up to
    max_batch. run() then takes q of max_batch rows. Bad values are raised
    by the next host call; the tensors must outlive the runs planned from
    them. Details: docs/architecture.md, "Planning on the GPU".
    """

    def __init__(self, float_workspace_buffer, kv_layout="NHD", use_cuda_graph=False, use_tensor_cores=False,
                 paged_kv_indptr_buffer=None, paged_kv_indices_buffer=None, paged_kv_last_page_len_buffer=None,
                 backend="auto", jit_args=None):
        """
        Args:
            float_workspace_buffer: a contiguous CUDA tensor of any dtype
                (FlashInfer users allocate 128 MB), used as bytes for the
                device workspace. It must stay alive and unused by anything
                else while the wrapper is in use.
            kv_layout: "NHD" or "HND".
            use_cuda_graph: fix the workspace bounds (see the class doc).
            use_tensor_cores: run decode on the tensor-core prefill kernel
                (each request a query of length 1, its group of query heads
                packed into rows of one query tile). Needs q_data_type ==
                kv_data_type. As in FlashInfer's docs, a hint: with False the
                wrapper picks the kernel, the tensor cores on sm_90 when the
                dtypes match (faster there at every measured batch, length
                and group size), else the CUDA-core kernel. Head dim 512
                always runs on the tensor cores.
            paged_kv_indptr_buffer, paged_kv_indices_buffer,
            paged_kv_last_page_len_buffer: optional 1-D tensors whose lengths
                fix max_batch (indptr length - 1, or last_page_len length) and
                max_pages (indices length).
            backend: "auto" or "fa2" (both mean Tessera's kernel).
            jit_args: must be None (custom variants are not supported yet).
        """
        if kv_layout not in _LAYOUTS:
            raise ValueError(f"kv_layout: expected 'NHD' or 'HND', got {kv_layout!r}")
        W.check_backend(backend, jit_args)
        T.framework(float_workspace_buffer, "float_workspace_buffer")
        W.check_aligned(float_workspace_buffer, "float_workspace_buffer")
        self._float_workspace_buffer = float_workspace_buffer
        self._kv_layout = kv_layout
        self._use_cuda_graph = bool(use_cuda_graph)
        self._use_tensor_cores = bool(use_tensor_cores)
        # The caller's buffers, under FlashInfer's attribute names (engines write page ids into
        # _paged_kv_indices_buf before plan() in CUDA-graph mode).
        self._paged_kv_buffers = (paged_kv_indptr_buffer, paged_kv_indices_buffer, paged_kv_last_page_len_buffer)
        self._paged_kv_indptr_buf, self._paged_kv_indices_buf, self._paged_kv_last_page_len_buf = \
            self._paged_kv_buffers
        self._multi = None  # the prefill wrapper that runs q_len_per_req > 1 steps (built at the first such plan)
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
        # splitting (False = the no-load-balancing ablation), an SM cap and,
        # with use_tensor_cores, the prefill kernel's query tile (0 = heuristic);
        # _cuda_cores runs the CUDA-core kernel whatever the wrapper would pick.
        self._split_kv = True
        self._max_sms = 0
        self._tc_cta_q = 0
        self._cuda_cores = False
        self._heads_per_thread = 0  # the CUDA-core kernel's query heads per thread (0: heuristic)
        # shared_prefix="auto": the K / V bytes a split must save (tests lower it) and its state (_auto_prefix.py).
        self._shared_prefix_min_bytes = AP.MIN_SAVED_BYTES
        # With CUDA graphs: DecodeOptions::shared_prefix's (min_shared_tokens, min_members, min_saved_tokens);
        # -1 keeps the C++ default (tests and benchmarks lower them).
        self._shared_prefix_limits = AP.GRAPH_LIMITS
        self._auto_prefix = None
        self._native = None  # the C++ BatchDecode, built by plan()
        self._native_key = None  # what it was built for: dtypes, shape, bounds
        self._pinned = None  # the pinned host staging buffer it borrows
        self._planned = None  # what the last plan() fixed for run()
        self._checked_scalars, self._checked = None, None  # plan()'s scalar arguments, once checked
        self._buffer_checked = False
        self._handle = W.register_handle(self)  # how torch.compile's custom op finds this wrapper (_ops.py)

    @property
    def use_tensor_cores(self):
        return self._use_tensor_cores

    @property
    def shared_prefix_stats(self):
        """What the last plan() with shared_prefix="auto" found (see _auto_prefix.stats), else None."""
        plan = self._planned
        if self._use_cuda_graph and plan is not None and plan.get("auto_prefix") and self._native is not None:
            return self._native.shared_prefix_stats  # the C++ wrapper split the step itself
        return AP.stats(self)

    def reset_workspace_buffer(self, float_workspace_buffer, int_workspace_buffer):
        """Moves the wrapper to a new workspace (any dtype, used as bytes); plan() again before run().

        int_workspace_buffer: accepted for FlashInfer's signature; Tessera keeps
        the whole schedule in float_workspace_buffer and does not write it.
        """
        C.check_int_workspace(int_workspace_buffer, "int_workspace_buffer")
        W.reset_workspace(self, float_workspace_buffer)
        self._multi = None

    def workspace_size(self, indptr, indices, last_page_len, num_qo_heads, num_kv_heads, head_dim, page_size,
                       pos_encoding_mode="NONE", window_left=-1, logits_soft_cap=None, q_data_type="float16",
                       kv_data_type=None, o_data_type=None, data_type=None, sm_scale=None, rope_scale=None,
                       rope_theta=None, block_tables=None, seq_lens=None, fixed_split_size=None,
                       disable_split_kv=False, q_len_per_req=1):
        """FlashInfer's workspace_size(): (float_workspace_size, int_workspace_size) in bytes for plan() with
        these arguments (see W.probe_workspace_size); plan() state is not touched."""
        options = dict(locals())
        del options["self"]
        head = [options.pop(k) for k in ("indptr", "indices", "last_page_len", "num_qo_heads", "num_kv_heads",
                                         "head_dim", "page_size")]
        return W.probe_workspace_size(self, type(self)._plan_impl, head, options)

    def plan(self, indptr, indices, last_page_len, num_qo_heads, num_kv_heads, head_dim, page_size,
             *deprecated_positional_args, **kwargs):
        """Plans one decode step.

        The options after page_size are keyword arguments (those of
        _plan_impl, documented there). As in FlashInfer, giving them by
        position still works, in the order of _DECODE_PLAN_LEGACY, with a
        DeprecationWarning.
        """
        if deprecated_positional_args:
            kwargs = C.merge_legacy_positional("BatchDecodeWithPagedKVCacheWrapper.plan", deprecated_positional_args,
                                               _DECODE_PLAN_LEGACY, kwargs)
        self._plan_impl(indptr, indices, last_page_len, num_qo_heads, num_kv_heads, head_dim, page_size, **kwargs)

    @C.recorded_plan
    def _plan_impl(self, indptr, indices, last_page_len, num_qo_heads, num_kv_heads, head_dim, page_size, *,
                   pos_encoding_mode="NONE", window_left=-1, window_right=0, logits_soft_cap=None,
                   q_data_type="float16", kv_data_type=None, o_data_type=None, data_type=None, sm_scale=None,
                   rope_scale=None, rope_theta=None, non_blocking=True, block_tables=None, seq_lens=None,
                   fixed_split_size=None, disable_split_kv=False, q_len_per_req=1, is_causal=None,
                   shared_prefix=None, on_device=False, batch_size=None):
        """Plans one decode step (FlashInfer's plan() options, keyword-only).

        Args:
            indptr: int [batch + 1] page-table row pointers (int32 or int64;
                torch on any device, numpy or list; copied to the host).
            indices: int [indptr[-1]] page indices (a longer buffer is
                fine). A CUDA tensor on the workspace's device stays there:
                plan() copies it on the stream without reading it, as
                FlashInfer's does, and the kernels check each id against
                the cache, raising a bad one (ValueError) at the next plan()
                or run(). Host ids are checked by plan() itself.
            last_page_len: int [batch] tokens in each request's last page
                (1..page_size; any value for a request without pages).
            num_qo_heads, num_kv_heads: query heads must be a multiple of KV heads.
            head_dim: 64, 128, 256 or 512. 512 runs on the tensor-core
                path whatever use_tensor_cores says (the flag is a hint;
                the CUDA-core kernel holds at most 256 features a row), so
                it needs a 16-bit cache of q's dtype.
            page_size: tokens per page.
            window_left: -1 (no window), or the keys (>= 0) each query sees to
                the left of its own position (its request's last key).
            window_right: 0 or -1: the query is its request's last position,
                so no key lies to its right either way. Other values are not
                supported yet.
            logits_soft_cap: None or 0.0 (off), or a cap > 0 on the logits
                (cap * tanh(logit / cap)). A window and a cap may be combined.
            pos_encoding_mode: "NONE", "ROPE_LLAMA" (Llama RoPE fused into
                the kernel: each query rotated at its request's last
                position, key i at i) or "ALIBI"; each combines with
                window_left and logits_soft_cap (see
                _wrapper_util.pos_encoding_arg).
            rope_scale, rope_theta: with ROPE_LLAMA (None: 1 and 1e4), else None.
            q_data_type, kv_data_type, o_data_type: float16 or bfloat16 (torch
                dtype or name); kv and o default to q's. kv_data_type may
                also be torch.float8_e4m3fn / float8_e5m2 ("float8_e4m3fn",
                "float8_e5m2"): an fp8 cache, read on the tensor cores on
                sm_90 and with use_tensor_cores=True (16-row tiles that
                widen K / V in registers), else on the CUDA-core kernel,
                with run()'s k_scale / v_scale as its dequantization
                scales. data_type
                (deprecated in FlashInfer) fills kv_data_type when it is None.
            sm_scale: softmax scale; None means 1 / sqrt(head_dim).
            non_blocking: accepted; the schedule upload is always asynchronous.
            seq_lens: None, or each request's KV length; it must equal what
                indptr / last_page_len give (FlashInfer's backends read
                either).
            disable_split_kv: True plans every request's KV as one chunk (no
                split-KV merge), as FlashInfer does for deterministic CUDA
                graphs.
            fixed_split_size: None or -1 (the planner sizes KV chunks per
                step), or a page count: every request's KV is cut into
                near-equal chunks of at most that many pages whatever else is
                in the batch, so a request's output is bitwise the same in
                any batch (and under CUDA graphs); the chunks are still
                balanced over the CTAs. About the mean KV length in pages is
                a good value (the default plan's cost on bench/results/).
            q_len_per_req: queries per request (1: decode). n > 1 (speculative
                / MTP verification): q holds request b's n queries, its last
                n positions, in rows [b * n, (b + 1) * n); they attend
                causally (query j sees keys < kv_len - (n - 1 - j)) unless
                is_causal is False. Runs on the prefill kernels.
            is_causal: None or True (causal among a request's queries), or
                False (each sees all keys).
            block_tables: None, or the same page table dense ([batch, width],
                row b starting with request b's pages), as FlashInfer's
                cuDNN / TensorRT-LLM backends read it; checked on the host.
            shared_prefix: Tessera's (after FlashInfer's options): None (off)
                or "auto": when requests' tables start with the same full pages
                and that saves >= 16 MiB of K / V reads per layer, plan a
                two-level cascade (shared pages once for all their sharers'
                queries, then each request's own, merged) that run() goes
                through, on a workspace of its own; else the normal plan.
                With use_cuda_graph every step takes the cascade (a captured
                run() replays one sequence of launches) and groups are runs of
                adjacent requests. Not with window_left, pos_encoding_mode,
                fp8, o_data_type, fixed_split_size, disable_split_kv or
                q_len_per_req > 1 (NotSupportedError naming it); run() takes
                float scales only. See tessera/_auto_prefix.py.
            on_device: Tessera's (keyword-only): False (FlashInfer's plan on
                the host), or True to plan on the GPU: plan() then only
                enqueues the device planner on torch's current stream, which
                reads the step from indptr, indices, last_page_len and
                batch_size when it runs. Nothing is read, copied or
                synchronized on the host, so plan() and run() can be captured
                together in one CUDA graph that serves any batch within the
                bounds (see "Planning on the GPU" in the class doc).
            batch_size: with on_device=True, an int32 CUDA tensor of one
                element: the step's number of requests (0 .. max_batch),
                read on the GPU; else None.
        """
        # The scalar arguments rarely change between steps: their checks (and
        # the C++ workspace_size probe) run when they do, not every step.
        scalars = (pos_encoding_mode, window_left, logits_soft_cap, q_data_type, kv_data_type, data_type, sm_scale,
                   rope_scale, rope_theta, o_data_type, num_qo_heads, num_kv_heads, head_dim, page_size, window_right,
                   fixed_split_size, q_len_per_req, is_causal, disable_split_kv)
        scalars += tuple(map(type, scalars))  # 1, 1.0 and True compare equal; their checks differ
        if scalars == self._checked_scalars:
            q_dt, kv_dt, o_dt, shape, scale, options, rope = self._checked
        else:
            _check_decode_only_options(window_right, fixed_split_size, q_len_per_req, is_causal, disable_split_kv)
            q_dt, kv_dt, o_dt, shape, scale, options, rope = self._check_scalars(
                pos_encoding_mode, window_left, logits_soft_cap, q_data_type, kv_data_type, data_type, sm_scale,
                rope_scale, rope_theta, o_data_type, num_qo_heads, num_kv_heads, head_dim, page_size)
            self._checked_scalars, self._checked = scalars, (q_dt, kv_dt, o_dt, shape, scale, options, rope)
        n = C.int_arg(q_len_per_req, "q_len_per_req")
        auto = AP.shared_prefix_arg(shared_prefix)
        split = self._split_kv and not disable_split_kv
        # Batch-invariant chunks of fixed_split_size pages (0: the planner's own).
        fixed = C.fixed_split_size_arg(fixed_split_size) * shape[3]
        if W.on_device_arg(on_device, batch_size):
            W.refuse_on_device("finding shared prefixes reads the page table on the host",
                               shared_prefix=shared_prefix)
            W.refuse_on_device("it is checked against the page table on the host", seq_lens=seq_lens,
                               block_tables=block_tables)
            if n != 1:
                raise ValueError(f"q_len_per_req: expected 1 with on_device=True (several queries per request run "
                                 f"on the prefill wrapper: plan BatchPrefillWithPagedKVCacheWrapper with "
                                 f"on_device=True and a qo_indptr tensor), got {n}")
            if self._auto_prefix is not None:
                self._auto_prefix.stats = None
            self._plan_on_device(batch_size, indptr, indices, last_page_len, (q_dt, kv_dt, o_dt), shape, scale,
                                 options, rope, split, fixed)
            return
        if auto:
            AP.check_options(options[0], rope, kv_dt, q_dt, o_dt,  # CUDA graphs: see _auto_prefix.py
                             fixed_split_size=fixed_split_size, disable_split_kv=disable_split_kv, q_len_per_req=n)
        elif self._auto_prefix is not None:
            self._auto_prefix.stats = None
        if block_tables is not None:
            C.same_page_table(block_tables, _host_ints(indptr, "indptr"), indices)
        if n > 1:
            self._plan_multi_token(n, is_causal, indptr, indices, last_page_len, num_qo_heads, num_kv_heads, head_dim,
                                   page_size, pos_encoding_mode=pos_encoding_mode, window_left=window_left,
                                   logits_soft_cap=logits_soft_cap, q_data_type=q_data_type,
                                   kv_data_type=kv_data_type if kv_data_type is not None else data_type,
                                   o_data_type=o_data_type, sm_scale=sm_scale, rope_scale=rope_scale,
                                   rope_theta=rope_theta, seq_lens=seq_lens, fixed_split_size=fixed_split_size,
                                   disable_split_kv=disable_split_kv)
            return
        indptr = _host_ints(indptr, "indptr")
        last_page_len = _host_ints(last_page_len, "last_page_len")
        if indptr.size < 1:
            raise ValueError("indptr: expected batch_size + 1 >= 1 entries, got 0")
        batch = indptr.size - 1
        if seq_lens is not None:
            pages = np.diff(indptr.astype(np.int64))
            if last_page_len.size == pages.size:  # else the C++ plan() names last_page_len
                C.same_lengths(seq_lens, np.where(pages > 0, (pages - 1) * shape[3] + last_page_len, 0), "seq_lens",
                               "indptr / last_page_len")
        buf = self._float_workspace_buffer
        # A CUDA tensor of ids stays on the GPU: plan() copies it without
        # reading it, and the kernels check the ids (see W.page_ids).
        indices = W.page_ids(indices, int(indptr[-1]), "indices", buf)
        W.check_workspace_buffer_once(self)
        buf = self._float_workspace_buffer
        # shared_prefix="auto": with CUDA graphs the C++ wrapper splits every step itself (DecodeOptions::
        # shared_prefix, from host page ids); without, a step worth splitting runs on a cascade.
        prefix = self._shared_prefix_limits if auto and self._use_cuda_graph else AP.OFF
        if auto and not prefix[0] and AP.plan_decode(self, indptr, indices, last_page_len, (q_dt, kv_dt, o_dt),
                                                        shape, scale, sm_scale, options[1], rope, buf):
            return
        if prefix[0]:
            indices = AP.host_page_ids(indices)
        self._ensure_native((q_dt, kv_dt, o_dt) + shape + options + (rope[0], split, fixed, prefix),
                            max(batch, 1), max(len(indices), 1))
        # The C++ plan() switches to the workspace's device itself.
        if isinstance(indices, W.DeviceIds):
            self._native.plan_device(indptr, indices.ptr, indices.count, indices.device, last_page_len,
                                     T.stream_of(buf))
        else:
            self._native.plan(indptr, indices, last_page_len, T.stream_of(buf))
        self._planned = {"batch": batch, "q_dtype": q_dt, "kv_dtype": kv_dt, "o_dtype": o_dt, "num_qo_heads": shape[0],
                         "head_dim": shape[2], "sm_scale": scale, "window_left": options[0], "rope": rope,
                         "alibi_slopes": W.plan_alibi_slopes(rope, shape[0], buf.device), "auto_prefix": auto}


    def _plan_on_device(self, batch_size, indptr, indices, last_page_len, dtypes, shape, scale, options, rope, split,
                        fixed):
        """plan(on_device=True): checks the tensors from their metadata (never their values), sizes the workspace
        for the bounds they give (or the fixed ones they must match) and enqueues the C++ device planner."""
        self._planned = None  # a failed plan() leaves nothing to run
        if batch_size is None:
            raise ValueError("batch_size: expected an int32 CUDA tensor of 1 element with on_device=True, got None")
        step = W.device_step(self, dict(batch_size=batch_size, indptr=indptr, indices=indices,
                                        last_page_len=last_page_len))
        buf = self._float_workspace_buffer
        max_batch = W.device_bound(step["indptr"], "indptr", 1, "max_batch")
        max_pages = W.device_bound(step["indices"], "indices", 0, "max_pages")
        if step["last_page_len"].shape[0] < max_batch:
            raise ValueError(f"last_page_len: expected at least {max_batch} entries (max_batch, indptr's length - 1), "
                             f"got {step['last_page_len'].shape[0]}")
        self._ensure_native(dtypes + shape + options + (rope[0], split, fixed, AP.OFF), max_batch, max_pages,
                            exact=True)
        self._native.plan_on_device(step["batch_size"], step["indptr"], step["indices"], step["last_page_len"],
                                    T.stream_of(buf))
        self._planned = {"batch": max_batch, "q_dtype": dtypes[0], "kv_dtype": dtypes[1], "o_dtype": dtypes[2],
                         "num_qo_heads": shape[0], "head_dim": shape[2], "sm_scale": scale, "window_left": options[0],
                         "rope": rope, "alibi_slopes": W.plan_alibi_slopes(rope, shape[0], buf.device),
                         "auto_prefix": False, "on_device": True,
                         "device_step": step}  # the C++ object reads them at every run(): keep them alive

    def _plan_multi_token(self, n, is_causal, indptr, indices, last_page_len, num_qo_heads, num_kv_heads, head_dim,
                          page_size, **options):
        """q_len_per_req = n > 1 (speculative / MTP verification): request b's queries are rows [b * n, (b + 1) * n)
        of q, its last n positions, so the step is a batch prefill with n queries per request, causal (bottom-right
        aligned: query j sees keys < kv_len - (n - 1 - j)) unless is_causal is False. It runs on the prefill
        wrapper (its tensor-core kernels), on this wrapper's workspace."""
        from .prefill import BatchPrefillWithPagedKVCacheWrapper  # prefill imports this module's helpers
        if self._multi is None:
            self._multi = BatchPrefillWithPagedKVCacheWrapper(self._float_workspace_buffer, self._kv_layout,
                                                              self._use_cuda_graph, None, *self._paged_kv_buffers)
        batch = _host_ints(indptr, "indptr").size - 1
        qo_indptr = np.arange(max(batch, 0) + 1, dtype=np.int32) * n
        self._planned = None  # a failed plan() leaves nothing to run
        self._multi.plan(qo_indptr, indptr, indices, last_page_len, num_qo_heads, num_kv_heads, head_dim, page_size,
                         causal=is_causal is not False, **options)
        self._planned = {"multi": n, "batch": batch}

    def _check_scalars(self, pos_encoding_mode, window_left, logits_soft_cap, q_data_type, kv_data_type, data_type,
                       sm_scale, rope_scale, rope_theta, o_data_type, num_qo_heads, num_kv_heads, head_dim, page_size):
        """plan()'s checks of its scalar arguments: (q, kv, o dtype names, (hq, hkv, head_dim, page_size), sm_scale,
        (window_left, logits_soft_cap), (rope, rope_scale, rope_theta))."""
        rope = W.pos_encoding_arg(pos_encoding_mode, rope_scale, rope_theta)
        options = W.plan_options(window_left, logits_soft_cap)
        if data_type is not None:
            q_data_type = data_type if q_data_type is None else q_data_type
            kv_data_type = data_type if kv_data_type is None else kv_data_type
        q_dt = _dtype_arg(q_data_type, "q_data_type")
        kv_dt = q_dt if kv_data_type is None else _dtype_arg(kv_data_type, "kv_data_type", fp8=True)
        o_dt = q_dt if o_data_type is None else _dtype_arg(o_data_type, "o_data_type")
        shape = tuple(_positive_int(x, n) for x, n in ((num_qo_heads, "num_qo_heads"), (num_kv_heads, "num_kv_heads"),
                                                       (head_dim, "head_dim"), (page_size, "page_size")))
        scale = W.sm_scale_arg(sm_scale)
        # The C++ checks of dtypes, heads and head_dim, without touching a GPU.
        _C.BatchDecode.workspace_size(q_dt, kv_dt, o_dt, shape[2], shape[0], shape[1], shape[3], self._kv_layout, 1, 1,
                                      num_sms=1, use_tensor_cores=self._use_tensor_cores, window_left=options[0],
                                      logits_soft_cap=options[1], pos_encoding=rope[0])
        return q_dt, kv_dt, o_dt, shape, scale, options, rope

    begin_forward = plan

    def _ensure_native(self, config, batch, pages, exact=False):
        """Builds (or re-sizes) the C++ BatchDecode for this configuration and these counts (exact: these bounds,
        planning on the GPU; see W.ensure_native)."""
        what = ("max_batch (its length - 1)", "max_pages (its length)") if exact else ("batch size", "page count")
        bounds = (W.Bound("max_batch", "indptr", what[0], self._fixed_batch, "paged_kv_indptr_buffer"),
                  W.Bound("max_pages", "indices", what[1], self._fixed_pages, "paged_kv_indices_buffer"))
        q_dt, kv_dt, o_dt, hq, hkv, d, ps, window, cap, rope, split, fixed, prefix = config
        args = (q_dt, kv_dt, o_dt, d, hq, hkv, ps, self._kv_layout)
        knobs = dict(split_kv=split, max_sms=self._max_sms, use_tensor_cores=self._use_tensor_cores,
                     tc_cta_q=self._tc_cta_q, cuda_cores=self._cuda_cores, window_left=window, logits_soft_cap=cap,
                     pos_encoding=rope, fixed_chunk=fixed, heads_per_thread=self._heads_per_thread,
                     shared_prefix=prefix)

        def size(want, device):
            ideal, host = _C.BatchDecode.workspace_size(*args, *want, device=device, **knobs)
            return ideal, _C.BatchDecode.min_workspace_size(*args, *want, device=device, **knobs)[0], host

        def make(want, ws, ws_bytes, host, host_bytes, device):
            return _C.BatchDecode(*args, *want, ws, ws_bytes, host, host_bytes, device, **knobs)

        W.ensure_native(self, config, (batch, pages), bounds, size, make, exact)

    def run(self, q, paged_kv_cache, *args, q_scale=None, k_scale=None, v_scale=None, out=None, lse=None,
            return_lse=False, enable_pdl=None, window_left=None, sinks=None, q_len_per_req=None,
            skip_softmax_threshold_scale_factor=None, kv_cache_sf=None):
        """Decode attention of the planned step.

        Args:
            q: [batch, num_qo_heads, head_dim] CUDA tensor of q_data_type.
            paged_kv_cache: (k_cache, v_cache), each [num_pages, page_size,
                num_kv_heads, head_dim] (NHD) or [num_pages, num_kv_heads,
                page_size, head_dim] (HND), or one interleaved tensor
                [num_pages, 2, ...] (K at index 0, V at 1), of kv_data_type
                (an fp8 cache may also be uint8 tensors of its bits).
            q_scale, k_scale, v_scale: None or floats (serving engines pass
                1.0 for 16-bit caches): q_scale * k_scale multiplies the
                softmax scale, v_scale the output, as in FlashInfer: an fp8
                cache's dequantization scales. k_scale / v_scale may also be
                1-element float32 CUDA tensors, read by the kernel when it
                runs (a captured CUDA graph replays with their current
                values), on either decode kernel.
            out: optional output like q (o_data_type); allocated when None.
            lse: optional float32 [batch, num_qo_heads] for the log-sum-exp;
                allocated when None and return_lse.
            return_lse: also return the LSE, in **base 2** (FlashInfer's
                convention, ready for tessera.merge_state).
            enable_pdl: programmatic dependent launch (None: on, as
                FlashInfer on sm_90+; ignored before sm_90): the kernel
                may start while the previous kernel on the stream (e.g.
                the append of this step's K / V) finishes, and waits for
                it before reading q, K, V or writing outputs.
            window_left: None or the value given to plan().
            q_len_per_req: None or 1 (FlashInfer moved it to plan()).
            sinks: None, or float32 [num_qo_heads] CUDA attention-sink logits
                (gpt-oss): a virtual key per head with that logit (natural
                units, not scaled by sm_scale) and a zero value joins each
                row's softmax; applied to the kernel's (out, lse) as a merge
                with that state.
            skip_softmax_threshold_scale_factor, kv_cache_sf: only
                None so far (skip-softmax sparsity and NVFP4
                caches are not implemented).

        Returns:
            out, or (out, lse) with return_lse.
        """
        ops = T.torch_ops(q)
        if ops is not None:  # torch.compile: one opaque custom op (see _ops.py)
            return ops.decode_run(self, q, paged_kv_cache, args, q_scale, k_scale, v_scale, out, lse, return_lse,
                                  enable_pdl, window_left, sinks, q_len_per_req, skip_softmax_threshold_scale_factor,
                                  kv_cache_sf)
        return self._run(q, paged_kv_cache, *args, q_scale=q_scale, k_scale=k_scale, v_scale=v_scale, out=out,
                         lse=lse, return_lse=return_lse, enable_pdl=enable_pdl, window_left=window_left, sinks=sinks,
                         q_len_per_req=q_len_per_req,
                         skip_softmax_threshold_scale_factor=skip_softmax_threshold_scale_factor,
                         kv_cache_sf=kv_cache_sf)

    def _run(self, q, paged_kv_cache, *args, q_scale=None, k_scale=None, v_scale=None, out=None, lse=None,
             return_lse=False, enable_pdl=None, window_left=None, sinks=None, q_len_per_req=None,
             skip_softmax_threshold_scale_factor=None, kv_cache_sf=None):
        """run() outside torch.compile (and the real implementation of tessera::batch_decode_run)."""
        if args:
            raise C.not_supported("args", args, "extra run() arguments feed custom JIT variants, which run through "
                                  "tessera.AttentionWrapper")
        _check_run_features(skip_softmax_threshold_scale_factor, kv_cache_sf)
        if self._planned is None:
            raise ValueError("run: expected plan() to be called first")
        planned_n = self._planned.get("multi", 1)
        if q_len_per_req is not None and C.int_arg(q_len_per_req, "q_len_per_req") != planned_n:
            raise ValueError(f"q_len_per_req: expected {planned_n} (as planned), got {q_len_per_req}")
        if planned_n > 1:
            return self._multi.run(q, paged_kv_cache, q_scale=q_scale, k_scale=k_scale, v_scale=v_scale, out=out,
                                   lse=lse, return_lse=return_lse, enable_pdl=enable_pdl, window_left=window_left,
                                   sinks=sinks)
        if not T.is_cuda(q):
            raise TypeError(f"q: expected a CUDA tensor, got {type(q).__name__} on {T.device_of(q)}")
        plan = self._planned
        if plan.get("auto_prefix"):  # float scales only, split or not: a configuration works on every step or none
            scale, vs = W.run_scales(plan["sm_scale"], plan["head_dim"], q_scale, k_scale, v_scale)
            if plan.get("shared_prefix") is not None:
                return AP.run_decode(plan, q, paged_kv_cache, scale, vs, out, lse, return_lse, window_left, sinks)
        scale, vs, kt, vt = W.run_scales_with_tensors(plan["sm_scale"], plan["head_dim"], q_scale, k_scale, v_scale, q)
        W.check_run_window(window_left, plan["window_left"])
        k, v = _unpack_paged_kv_cache(paged_kv_cache)
        # An fp8 cache crosses as uint8 views (T.kv_bits); its fp8 type must be the planned one.
        k = T.kv_bits(k, "paged_kv_cache", plan["kv_dtype"])[0]
        v = T.kv_bits(v, "paged_kv_cache", plan["kv_dtype"])[0]
        if len(q.shape) != 3:
            raise ValueError(f"q: expected a 3-D tensor [batch_size, num_qo_heads, head_dim], got shape {tuple(q.shape)}")
        if plan.get("on_device") and q.shape[0] != plan["batch"]:
            raise ValueError(f"q: expected {plan['batch']} rows (max_batch: after plan(on_device=True) run() covers "
                             f"the bound's rows, leaving those past the step's batch as they are), got {q.shape[0]}")
        sinks = W.check_sinks(sinks, q, plan["num_qo_heads"])
        if out is None:
            out = T.empty(q, q.shape, plan["o_dtype"])
        if lse is None and (return_lse or sinks is not None):
            lse = T.empty(q, q.shape[:2], "float32")
        with T.on_device_of(q):
            self._native.run(T.arg(q), T.arg(k), T.arg(v), out, lse, scale, T.stream_of(q),
                             pdl=W.pdl_arg(enable_pdl), v_scale=1.0 if vs is None else vs, k_scale_tensor=T.arg(kt),
                             v_scale_tensor=T.arg(vt), **W.run_pos_encoding_args(plan["rope"], plan["alibi_slopes"]))
            if sinks is not None:
                W.apply_sinks(out, lse, sinks)
        return (out, lse) if return_lse else out

    run_return_lse = functools.partialmethod(run, return_lse=True)

    def forward(self, q, paged_kv_cache, pos_encoding_mode="NONE", q_scale=None, k_scale=None, v_scale=None,
                window_left=-1, logits_soft_cap=None, sm_scale=None, rope_scale=None, rope_theta=None):
        """FlashInfer's deprecated plan-options-at-run call: these options replace those of the last plan() (here
        and for later runs; plan() runs again when they differ, since the kernel is chosen at plan()), then run()."""
        C.replan(self, type(self)._plan_impl, dict(pos_encoding_mode=pos_encoding_mode, window_left=window_left,
                                                   logits_soft_cap=logits_soft_cap, sm_scale=sm_scale,
                                                   rope_scale=rope_scale, rope_theta=rope_theta))
        return self.run(q, paged_kv_cache, q_scale=q_scale, k_scale=k_scale, v_scale=v_scale)

    def forward_return_lse(self, q, paged_kv_cache, pos_encoding_mode="NONE", q_scale=None, k_scale=None,
                           v_scale=None, window_left=-1, logits_soft_cap=None, sm_scale=None, rope_scale=None,
                           rope_theta=None):
        """forward() returning (out, lse), lse in base 2."""
        C.replan(self, type(self)._plan_impl, dict(pos_encoding_mode=pos_encoding_mode, window_left=window_left,
                                                   logits_soft_cap=logits_soft_cap, sm_scale=sm_scale,
                                                   rope_scale=rope_scale, rope_theta=rope_theta))
        return self.run(q, paged_kv_cache, q_scale=q_scale, k_scale=k_scale, v_scale=v_scale, return_lse=True)

    def end_forward(self):
        """Kept for FlashInfer compatibility; nothing to release."""


# plan()'s options in FlashInfer's deprecated positional order (after page_size).
_DECODE_PLAN_LEGACY = ("pos_encoding_mode", "window_left", "logits_soft_cap", "q_data_type", "kv_data_type",
                       "o_data_type", "data_type", "sm_scale", "rope_scale", "rope_theta", "non_blocking",
                       "block_tables", "seq_lens", "fixed_split_size", "disable_split_kv", "q_len_per_req")


def _check_decode_only_options(window_right, fixed_split_size, q_len_per_req, is_causal, disable_split_kv):
    """plan()'s options for features decode does not have yet; each accepts its default."""
    if C.int_arg(window_right, "window_right") not in (0, -1):
        raise C.not_supported("window_right", window_right, "with one query per request, the last position, no key "
                              "lies to its right: only 0 or -1 (no bound) mean something here")
    C.fixed_split_size_arg(fixed_split_size)
    n = C.int_arg(q_len_per_req, "q_len_per_req")
    if n < 1:
        raise ValueError(f"q_len_per_req: expected an int >= 1, got {n}")
    if is_causal is not None and not isinstance(is_causal, (bool, np.bool_)):
        raise TypeError(f"is_causal: expected None or a bool, got {type(is_causal).__name__}")
    if not isinstance(disable_split_kv, (bool, np.bool_)):
        raise TypeError(f"disable_split_kv: expected a bool, got {type(disable_split_kv).__name__}")


def _check_run_features(skip_softmax_threshold_scale_factor, kv_cache_sf):
    C.refuse_given("skip-softmax sparsity is not implemented",
                   skip_softmax_threshold_scale_factor=skip_softmax_threshold_scale_factor)
    C.refuse_given("NVFP4 KV caches are not implemented", kv_cache_sf=kv_cache_sf)


class CUDAGraphBatchDecodeWithPagedKVCacheWrapper(BatchDecodeWithPagedKVCacheWrapper):
    """FlashInfer's CUDA-graph decode wrapper: BatchDecodeWithPagedKVCacheWrapper with use_cuda_graph=True and
    the index buffers that fix its bounds (indptr_buffer: max_batch + 1 entries, indices_buffer: max_pages,
    last_page_len_buffer: max_batch). plan() is not captured; run() is."""

    def __init__(self, workspace_buffer, indptr_buffer, indices_buffer, last_page_len_buffer, kv_layout="NHD",
                 use_tensor_cores=False):
        super().__init__(workspace_buffer, kv_layout, use_cuda_graph=True, use_tensor_cores=use_tensor_cores,
                         paged_kv_indptr_buffer=indptr_buffer, paged_kv_indices_buffer=indices_buffer,
                         paged_kv_last_page_len_buffer=last_page_len_buffer)
