"""Attention-state merging and cascade attention (FlashInfer's
``flashinfer.cascade`` names).

An attention state is a pair (v, s): v is the attention output over some set
of keys and s its log-sum-exp. Merging two states gives exactly the attention
over the union of their keys (the FlashInfer paper, section 2.2):

    s = log2(2**s_a + 2**s_b)
    v = (2**s_a * v_a + 2**s_b * v_b) / 2**s

**The LSE is in base 2** (log2 of the sum of 2**(logit * log2(e))), as
FlashInfer's kernels use it. An empty state has s = -inf and contributes
nothing; if every state of a row is empty the result is v = 0, s = -inf.

Values v are float16, bfloat16 or float32 with head_dim a multiple of 8
(fp16/bf16) or 4 (fp32) that divides 1024 or 512 respectively (64, 128 and
256 all work); scales s are float32. Inputs may be numpy arrays (computed on
the CPU) or torch tensors (CPU, or CUDA where the work runs on torch's
current stream); results have the inputs' framework, device and dtype.

The merges take ``enable_pdl`` (Tessera's; FlashInfer's merges have none):
None (the default) or True launches them with programmatic dependent launch
on sm_90+, as the attention wrappers' ``run(enable_pdl=None)``: a merge
starts while the kernel before it ends and waits for it before its first
load, so behind the attention kernels that produced its states it pays no
launch gap. False launches it plainly. CPU inputs ignore it.
"""

from . import _compat as C
from . import _tensors as T
from . import _wrapper_util as W
from ._native import _C


def merge_state(v_a, s_a, v_b, s_b, *, enable_pdl=None):
    """Merges two attention states.

    Args:
        v_a: values [seq_len, num_heads, head_dim].
        s_a: base-2 LSE of v_a, float32 [seq_len, num_heads].
        v_b: values like v_a (same shape and dtype).
        s_b: base-2 LSE of v_b, float32 [seq_len, num_heads].
        enable_pdl: programmatic dependent launch (module docstring).

    Returns:
        (v, s): merged values like v_a and their float32 base-2 LSE
        [seq_len, num_heads].
    """
    ops = T.torch_ops(v_a)
    if ops is not None:  # torch.compile: one opaque custom op (see _ops.py)
        return ops.merge_state_call(v_a, s_a, v_b, s_b, W.pdl_arg(enable_pdl))
    return _merge_state(v_a, s_a, v_b, s_b, W.pdl_arg(enable_pdl))


def _merge_state(v_a, s_a, v_b, s_b, pdl):
    """merge_state's work (also the real implementation of tessera::merge_state)."""
    T.common_framework(v_a=v_a, s_a=s_a, v_b=v_b, s_b=s_b)
    v_out = T.empty(v_a, v_a.shape)
    s_out = T.empty(v_a, v_a.shape[:-1], "float32")
    with T.on_device_of(v_a):
        _C.merge_state(T.arg(v_a), T.arg(s_a), T.arg(v_b), T.arg(s_b), v_out, s_out, T.stream_of(v_a), pdl)
    return v_out, s_out


def merge_state_in_place(v, s, v_other, s_other, mask=None, *, enable_pdl=None):
    """Merges (v_other, s_other) into (v, s) in place.

    Args:
        v: values [seq_len, num_heads, head_dim], overwritten with the merge.
        s: float32 base-2 LSE [seq_len, num_heads], overwritten likewise.
        v_other: values like v.
        s_other: float32 base-2 LSE like s.
        mask: optional bool/uint8 [seq_len]; rows where it is 0 keep (v, s)
            unchanged. None merges every row.
        enable_pdl: programmatic dependent launch (module docstring).

    Returns:
        None.
    """
    T.common_framework(v=v, s=s, v_other=v_other, s_other=s_other, mask=mask)
    with T.on_device_of(v):
        _C.merge_state_in_place(T.arg(v), T.arg(s), T.arg(v_other), T.arg(s_other), T.arg(mask), T.stream_of(v),
                                W.pdl_arg(enable_pdl))


def merge_states(v, s, *, enable_pdl=None):
    """Merges a fixed number of states per row.

    Args:
        v: values [seq_len, num_states, num_heads, head_dim].
        s: float32 base-2 LSE [seq_len, num_states, num_heads].
        enable_pdl: programmatic dependent launch (module docstring).

    Returns:
        (v, s): merged values [seq_len, num_heads, head_dim] (dtype of v) and
        their float32 base-2 LSE [seq_len, num_heads].
    """
    T.common_framework(v=v, s=s)
    if len(v.shape) != 4:
        raise ValueError(f"v: expected a 4-D tensor [seq_len, num_states, num_heads, head_dim], got shape {tuple(v.shape)}")
    n, _, h, d = v.shape
    v_out = T.empty(v, (n, h, d))
    s_out = T.empty(v, (n, h), "float32")
    with T.on_device_of(v):
        _C.merge_states(T.arg(v), T.arg(s), v_out, s_out, T.stream_of(v), W.pdl_arg(enable_pdl))
    return v_out, s_out


def merge_states_ragged(v, s, indptr, *, enable_pdl=None):
    """Merges a variable number of states per row.

    Row i of the result merges states indptr[i] .. indptr[i+1]-1; a row with
    no states gets v = 0 and s = -inf.

    Args:
        v: values [total_states, num_heads, head_dim].
        s: float32 base-2 LSE [total_states, num_heads].
        indptr: int32 [num_rows + 1] on v's device, starting at 0,
            non-decreasing, ending at total_states. A Python list is also
            accepted (converted to an int32 tensor/array on v's device).
        enable_pdl: programmatic dependent launch (module docstring).

    Returns:
        (v, s): merged values [num_rows, num_heads, head_dim] and float32
        base-2 LSE [num_rows, num_heads].
    """
    T.common_framework(v=v, s=s)
    indptr = T.as_index_array(indptr, v, "indptr")
    T.common_framework(v=v, indptr=indptr)
    if len(indptr.shape) != 1 or indptr.shape[0] < 1:
        raise ValueError(f"indptr: expected a 1-D tensor [num_rows + 1], got shape {tuple(indptr.shape)}")
    if len(v.shape) != 3:
        raise ValueError(f"v: expected a 3-D tensor [total_states, num_heads, head_dim], got shape {tuple(v.shape)}")
    rows = indptr.shape[0] - 1
    v_out = T.empty(v, (rows,) + tuple(v.shape[1:]))
    s_out = T.empty(v, (rows, v.shape[1]), "float32")
    with T.on_device_of(v):
        _C.merge_states_ragged(T.arg(v), T.arg(s), T.arg(indptr), v_out, s_out, T.stream_of(v),
                               W.pdl_arg(enable_pdl))
    return v_out, s_out


class MultiLevelCascadeAttentionWrapper(W.PlannedWrapper):
    """Attention over a paged KV cache split into levels (composable formats,
    FlashInfer paper section 3.1.2; FlashInfer's wrapper of the same name).

    Requests that share pages (a system prompt, the prompt of parallel
    samples) list those pages once, at an outer level, as one group whose
    query rows are all the sharing requests' queries: one query tile reads
    each shared KV tile once, on the tensor cores. Level i's qo_indptr groups
    the query rows (every level covers all rows, in the same order, so its
    last entry is the step's total); its paged_kv_* arrays give each group's
    pages, as BatchPrefillWithPagedKVCacheWrapper.plan takes them. The last
    level usually holds each request's own pages (qo_indptr = the requests'
    query pointers). A group with no pages contributes nothing at that level.

    Levels run as batch prefills over fixed slices of float_workspace_buffer,
    and their results merge through the attention state into the output
    (the C++ CascadeAttention), so run() allocates nothing beyond its outputs
    and can be captured in a CUDA graph: with use_cuda_graph=True the bounds
    are fixed by the first plan() (plan the largest step first) and q may
    have more rows than a later plan's total (rows beyond it are left as they
    are). causal=True masks the last level bottom-right (the shared levels
    precede every query row); logits_soft_cap applies to every level. All
    LSEs are in **base 2**.

    Planning on the GPU (Tessera's keyword-only plan(..., on_device=True,
    batch_size=[...], max_total_q=...)): every level's qo_indptr,
    paged_kv_indptr, paged_kv_indices and paged_kv_last_page_len stay in
    int32 CUDA tensors sized for the bounds, with a 1-element batch_size
    tensor per level (its group count); plan() only enqueues each level's
    planner kernel, so it can be captured with run() in one CUDA graph
    serving any step within the bounds. run() then takes q of max_total_q
    rows. A level whose qo_indptr ends elsewhere than level 0's is raised by
    the next plan() or run() (ValueError naming the level).
    """

    def __init__(self, num_levels, float_workspace_buffer, kv_layout="NHD", use_cuda_graph=False,
                 qo_indptr_buf_arr=None, paged_kv_indptr_buf_arr=None, paged_kv_indices_buf_arr=None,
                 paged_kv_last_page_len_buf_arr=None, *, backend="auto"):
        """
        Args:
            num_levels: number of levels (>= 1).
            float_workspace_buffer: a contiguous CUDA tensor of any dtype, used
                as bytes for the device workspace (FlashInfer users allocate
                128 MB); kept alive and unused by anything else while the
                wrapper is in use.
            kv_layout: "NHD" or "HND".
            use_cuda_graph: fix the workspace bounds at the first plan().
            qo_indptr_buf_arr, paged_kv_indptr_buf_arr, paged_kv_indices_buf_arr,
            paged_kv_last_page_len_buf_arr: optional lists (one per level) of
                FlashInfer's CUDA-graph index buffers; their lengths fix the
                bounds (largest group count, largest page count).
            backend: Tessera's (keyword-only; FlashInfer's wrapper has none):
                "auto", "fa2" or "fa3", the batch-prefill kernel template of
                every level.
        """
        self._num_levels = W.positive_int(num_levels, "num_levels")
        W.init_paged_wrapper(self, float_workspace_buffer, kv_layout, use_cuda_graph, backend, None)
        self._config_key = self._config_checked = None  # plan()'s last checked scalar arguments and result
        for name, arr, extra in (("qo_indptr_buf_arr", qo_indptr_buf_arr, 1),
                                 ("paged_kv_indptr_buf_arr", paged_kv_indptr_buf_arr, 1),
                                 ("paged_kv_last_page_len_buf_arr", paged_kv_last_page_len_buf_arr, 0),
                                 ("paged_kv_indices_buf_arr", paged_kv_indices_buf_arr, None)):
            if arr is None:
                continue
            arr = self._per_level(arr, name)
            n = max(W.positive_int(len(b) - (extra or 0), f"{name}[{i}] length") for i, b in enumerate(arr))
            if extra is None:
                self._fixed_pages = n
            else:
                self._fixed_batch = max(self._fixed_batch or 0, n)
        self._buffers = (qo_indptr_buf_arr, paged_kv_indptr_buf_arr, paged_kv_indices_buf_arr,
                         paged_kv_last_page_len_buf_arr)  # kept alive as FlashInfer does

    def _per_level(self, arr, name):
        if not isinstance(arr, (list, tuple)) or len(arr) != self._num_levels:
            got = f"{len(arr)} items" if isinstance(arr, (list, tuple)) else type(arr).__name__
            raise ValueError(f"{name}: expected a list of {self._num_levels} arrays (one per level), got {got}")
        return list(arr)

    def plan(self, qo_indptr_arr, paged_kv_indptr_arr, paged_kv_indices_arr, paged_kv_last_page_len, num_qo_heads,
             num_kv_heads, head_dim, page_size, causal=False, pos_encoding_mode="NONE", use_fp16_qk_reduction=False,
             sm_scale=None, window_left=-1, logits_soft_cap=None, rope_scale=None, rope_theta=None,
             q_data_type="float16", kv_data_type=None, *, on_device=False, batch_size=None, max_total_q=None):
        """Plans one step.

        Args:
            qo_indptr_arr: per level, int [groups + 1] query row pointers
                (torch on any device, numpy or list); every level ends at the
                step's total query rows.
            paged_kv_indptr_arr, paged_kv_indices_arr, paged_kv_last_page_len:
                per level, each group's pages (indptr in pages, page ids, tokens
                in the last page), as BatchPrefillWithPagedKVCacheWrapper.plan.
            num_qo_heads, num_kv_heads, head_dim, page_size: as for batch prefill.
            causal: bottom-right causal mask on the last level.
            window_left: -1 only (a window relative to the whole sequence
                cannot be split into levels).
            logits_soft_cap: None / 0 (off) or a cap > 0, on every level.
            pos_encoding_mode, rope_scale, rope_theta: only the defaults.
            use_fp16_qk_reduction: accepted; q.k always accumulates in float32.
            sm_scale: None means 1 / sqrt(head_dim).
            q_data_type, kv_data_type: float16 or bfloat16; kv_data_type
                may also be float8_e4m3fn or float8_e5m2 (an fp8 cache read
                by the FA2 kernels: head_dim 64, 128 or 256), else it equals
                q's.
            on_device, batch_size, max_total_q: Tessera's (keyword-only):
                planning on the GPU (see the class doc); batch_size a list
                of 1-element int32 CUDA tensors, one per level; max_total_q
                the bound on query rows (q's rows in run()).
        """
        self._planned = None
        W.reject_unsupported(pos_encoding_mode, None, None, None, rope_scale, rope_theta)
        window, cap = W.plan_options(window_left, logits_soft_cap)
        if window != -1:
            raise C.not_supported("window_left", window_left, "a sliding window spans the levels of a cascade; "
                                  "only -1 is implemented")
        if W.on_device_arg(on_device, batch_size):
            self._plan_on_device(qo_indptr_arr, paged_kv_indptr_arr, paged_kv_indices_arr, paged_kv_last_page_len,
                                 batch_size, max_total_q, (num_qo_heads, num_kv_heads, head_dim, page_size, causal,
                                                           sm_scale, q_data_type, kv_data_type, cap))
            return
        if max_total_q is not None:
            raise ValueError(f"max_total_q: expected None without on_device=True (a plan on the host takes it from "
                             f"qo_indptr_arr), got {max_total_q!r}")
        qo = [W.host_ints(x, f"qo_indptr_arr[{i}]")
              for i, x in enumerate(self._per_level(qo_indptr_arr, "qo_indptr_arr"))]
        kv = [W.host_ints(x, f"paged_kv_indptr_arr[{i}]")
              for i, x in enumerate(self._per_level(paged_kv_indptr_arr, "paged_kv_indptr_arr"))]
        last = [W.host_ints(x, f"paged_kv_last_page_len[{i}]")
                for i, x in enumerate(self._per_level(paged_kv_last_page_len, "paged_kv_last_page_len"))]
        for i in range(self._num_levels):
            if qo[i].size < 1:
                raise ValueError(f"qo_indptr_arr[{i}]: expected groups + 1 >= 1 entries, got 0")
        # Page ids: a CUDA tensor stays on the GPU (W.page_ids), cut to its level's count.
        idx = [W.page_ids(x, int(kv[i][-1]) if kv[i].size else 0, f"paged_kv_indices_arr[{i}]",
                          self._float_workspace_buffer)
               for i, x in enumerate(self._per_level(paged_kv_indices_arr, "paged_kv_indices_arr"))]
        config, scale, knobs = self._config(num_qo_heads, num_kv_heads, head_dim, page_size, causal, sm_scale,
                                            q_data_type, kv_data_type, cap)
        buf = self._float_workspace_buffer
        W.check_workspace_buffer_once(self)
        total_q = int(qo[0][-1])
        bounds = (W.Bound("max_batch", "qo_indptr_arr", "group count", self._fixed_batch,
                          "qo_indptr_buf_arr / paged_kv_indptr_buf_arr / paged_kv_last_page_len_buf_arr"),
                  W.Bound("max_total_q", "qo_indptr_arr", "total query length"),
                  W.Bound("max_pages", "paged_kv_indices_arr", "page count", self._fixed_pages,
                          "paged_kv_indices_buf_arr"))
        counts = (max(max(x.size - 1 for x in qo), 1), max(total_q, 1), max(max(len(x) for x in idx), 1))

        def size(want, device):
            ideal, host = _C.CascadeAttention.workspace_size(*config, *want, device=device, **knobs)
            return ideal, _C.CascadeAttention.min_workspace_size(*config, *want, device=device, **knobs)[0], host

        def make(want, ws, ws_bytes, host, host_bytes, device):
            return _C.CascadeAttention(*config, *want, ws, ws_bytes, host, host_bytes, device, **knobs)

        W.ensure_native(self, config + (cap,), counts, bounds, size, make)
        with T.on_device_of(buf):
            self._native.plan(qo, kv, idx, last, T.stream_of(buf))
        self._planned = dict(total_q=total_q, sm_scale=scale, o_dtype=config[0], kv_dtype=config[1],
                             head_dim=config[3])

    def _plan_on_device(self, qo_arr, kv_arr, idx_arr, last_arr, batch_size, max_total_q, options):
        """plan(on_device=True): the level tensors checked from their metadata (never their values), the
        workspace sized for the bounds they give, every level's planner enqueued."""
        if batch_size is None:
            raise ValueError("batch_size: expected a list of 1-element int32 CUDA tensors (one per level) with "
                             "on_device=True, got None")
        sizes = self._per_level(batch_size, "batch_size")
        levels = []
        for i, (qo, kv, idx, last, bs) in enumerate(zip(self._per_level(qo_arr, "qo_indptr_arr"),
                                                         self._per_level(kv_arr, "paged_kv_indptr_arr"),
                                                         self._per_level(idx_arr, "paged_kv_indices_arr"),
                                                         self._per_level(last_arr, "paged_kv_last_page_len"),
                                                         sizes)):
            step = W.device_step(self, {f"batch_size[{i}]": bs, f"qo_indptr_arr[{i}]": qo,
                                        f"paged_kv_indptr_arr[{i}]": kv, f"paged_kv_indices_arr[{i}]": idx,
                                        f"paged_kv_last_page_len[{i}]": last})
            levels.append(tuple(step.values()))
        max_total_q = C.int_arg(max_total_q, "max_total_q", allow_none=True)
        if max_total_q is None or max_total_q < 1:
            raise ValueError(f"max_total_q: expected an int >= 1 with on_device=True (the bound on the step's query "
                             f"rows, q's rows in run()), got {max_total_q}")
        max_batch = max(W.device_bound(lv[2], f"paged_kv_indptr_arr[{i}]", 1, "max_batch")
                        for i, lv in enumerate(levels))
        max_pages = max(W.device_bound(lv[3], f"paged_kv_indices_arr[{i}]", 0, "max_pages")
                        for i, lv in enumerate(levels))
        config, scale, knobs = self._config(*options)
        bounds = (W.Bound("max_batch", "paged_kv_indptr_arr", "max_batch (the longest length - 1)", self._fixed_batch,
                          "qo_indptr_buf_arr / paged_kv_indptr_buf_arr / paged_kv_last_page_len_buf_arr"),
                  W.Bound("max_total_q", "max_total_q", "query-row bound"),
                  W.Bound("max_pages", "paged_kv_indices_arr", "max_pages (the longest length)", self._fixed_pages,
                          "paged_kv_indices_buf_arr"))

        def size(want, device):
            ideal, host = _C.CascadeAttention.workspace_size(*config, *want, device=device, **knobs)
            return ideal, _C.CascadeAttention.min_workspace_size(*config, *want, device=device, **knobs)[0], host

        def make(want, ws, ws_bytes, host, host_bytes, device):
            return _C.CascadeAttention(*config, *want, ws, ws_bytes, host, host_bytes, device, **knobs)

        W.ensure_native(self, config + (options[-1],), (max_batch, max_total_q, max_pages), bounds, size, make,
                        exact=True)
        buf = self._float_workspace_buffer
        with T.on_device_of(buf):
            self._native.plan_on_device(*[[lv[j] for lv in levels] for j in range(5)], T.stream_of(buf))
        self._planned = dict(total_q=max_total_q, sm_scale=scale, o_dtype=config[0], kv_dtype=config[1],
                             head_dim=config[3], on_device=True, device_step=levels)  # the planners read them

    def _config(self, num_qo_heads, num_kv_heads, head_dim, page_size, causal, sm_scale, q_data_type, kv_data_type,
                cap):
        """The C++ configuration (constructor order), the softmax scale and the knobs; the checks (and the C++
        probe, which builds the level specs) run only when the arguments change, as in the prefill wrappers."""
        args = (num_qo_heads, num_kv_heads, head_dim, page_size, causal, sm_scale, q_data_type, kv_data_type, cap)
        key = args + tuple(map(type, args))
        if key == self._config_key:
            return self._config_checked
        q_dt = W.dtype_arg(q_data_type, "q_data_type")
        kv_dt = q_dt if kv_data_type is None else W.dtype_arg(kv_data_type, "kv_data_type", fp8=True)
        hq = W.positive_int(num_qo_heads, "num_qo_heads")
        hkv = W.positive_int(num_kv_heads, "num_kv_heads")
        d = W.positive_int(head_dim, "head_dim")
        ps = W.positive_int(page_size, "page_size")
        scale = W.sm_scale_arg(sm_scale)
        config = (q_dt, kv_dt, q_dt, d, hq, hkv, ps, self._kv_layout, self._num_levels, bool(causal))
        knobs = dict(backend=self._backend, logits_soft_cap=cap)
        _C.CascadeAttention.workspace_size(*config, 1, 1, 1, num_sms=1, **knobs)  # checks without a GPU
        self._config_key, self._config_checked = key, (config, scale, knobs)
        return config, scale, knobs

    begin_forward = plan

    def run(self, q, paged_kv_cache, *, out=None, lse=None, return_lse=False, k_scale=None, v_scale=None):
        """Attention of the planned step over every level.

        FlashInfer's run() takes q and paged_kv_cache and returns out;
        out, lse, return_lse, k_scale and v_scale are Tessera's keyword-only
        additions.

        Args:
            q: [rows, num_qo_heads, head_dim] CUDA tensor of q_data_type
                (rows = the planned total; more in CUDA-graph mode).
            paged_kv_cache: (k_cache, v_cache) or one interleaved tensor, as
                for BatchPrefillWithPagedKVCacheWrapper.run; every level's
                page ids index it.
            out: optional output like q; allocated when None.
            lse: optional float32 [rows, num_qo_heads]; allocated when None and return_lse.
            return_lse: also return the LSE (base 2).
            k_scale, v_scale: None, floats, or (fp8 caches) 1-element
                float32 CUDA tensors read at run time: k_scale multiplies the
                softmax scale, v_scale the output, on every level.

        Returns:
            out, or (out, lse) with return_lse.
        """
        if self._planned is None:
            raise ValueError("run: expected plan() to be called first")
        plan = self._planned
        scale, vs, kt, vt = W.run_scales_with_tensors(plan["sm_scale"], plan["head_dim"], None, k_scale, v_scale, q)
        k, v = W.unpack_paged_kv_cache(paged_kv_cache)
        # An fp8 cache crosses as uint8 views (T.kv_bits); its fp8 type must be the planned one.
        k = T.kv_bits(k, "paged_kv_cache", plan["kv_dtype"])[0]
        v = T.kv_bits(v, "paged_kv_cache", plan["kv_dtype"])[0]
        if plan.get("on_device") and (q.shape[0] < plan["total_q"] or
                                      (q.shape[0] > plan["total_q"] and not self._use_cuda_graph)):
            raise ValueError(f"q: expected {plan['total_q']} rows (max_total_q: after plan(on_device=True) run() "
                             f"covers them, leaving those past the step's queries as they are), got {q.shape[0]}")
        out, lse = W.run_outputs(q, out, lse, return_lse, self._planned["o_dtype"])
        # CUDA-graph mode: buffers may hold more rows than the workspace bound
        # max_total_q; the rows up to it are what any plan can touch.
        bound = self._native_key[1][1]
        rows = (lambda x: x[:bound] if x is not None and self._use_cuda_graph and x.shape[0] > bound else x)
        with T.on_device_of(q):
            self._native.run(T.arg(rows(q)), T.arg(k), T.arg(v), rows(out), rows(lse), scale, T.stream_of(q),
                             v_scale=1.0 if vs is None else vs, k_scale_tensor=T.arg(kt), v_scale_tensor=T.arg(vt))
        return (out, lse) if return_lse else out

    forward = run

    def reset_workspace_buffer(self, float_workspace_buffer, int_workspace_buffers):
        """Moves the wrapper to a new workspace (any dtype, used as bytes); plan() again before run().

        int_workspace_buffers: one tensor per level, accepted for FlashInfer's
        signature; Tessera keeps the schedules in float_workspace_buffer.
        """
        C.check_int_workspace(list(int_workspace_buffers), "int_workspace_buffers")
        W.reset_workspace(self, float_workspace_buffer)

    def end_forward(self):
        """Kept for FlashInfer compatibility; nothing to release."""


# FlashInfer's flashinfer.cascade also holds the shared-prefix wrappers (shared_prefix.py).
from .shared_prefix import (BatchDecodeWithSharedPrefixPagedKVCacheWrapper,  # noqa: E402,F401
                            BatchPrefillWithSharedPrefixPagedKVCacheWrapper)
