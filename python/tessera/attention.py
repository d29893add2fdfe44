"""Mixed prefill + decode batches in one call (FlashInfer's ``flashinfer.attention`` name): BatchAttention.

FlashInfer's BatchAttention fuses requests of any query length (prompts
being prefilled next to requests decoding one token) into one persistent
kernel. Tessera's paged prefill wrapper already does that: its planner
splits every request, whatever its query length, into (query tile x KV
chunk) work items of one persistent launch. BatchAttention is that wrapper
behind FlashInfer's BatchAttention signature: the wrapper owns its
workspace, and plan() takes each request's KV length in tokens
(kv_len_arr) instead of the last page's fill.
"""

import re

import numpy as np

from . import _compat as C
from . import _prefill_base as B
from . import _tensors as T
from . import _wrapper_util as W
from .jit import gen_batch_attention_module  # noqa: F401 (FlashInfer name)

# The workspace BatchAttention allocates (FlashInfer's takes 384 MiB). Tessera's schedule for 4096
# requests, 256k query rows and 4M pages needs about 52 MiB; where the ideal layout needs more, the
# split-KV partial states get what fits, and a plan whose minimum (_TOO_SMALL's number) is over it grows it.
_WORKSPACE_BYTES = 128 << 20
_TOO_SMALL = re.compile(r"^float_workspace_buffer: expected at least (\d+) bytes")


def _device_arg(device):
    """FlashInfer's `device` ("cuda", "cuda:1", a torch.device; "cpu" for argument checks only) as
    (text, is_cuda)."""
    if type(device).__module__ == "torch":  # a torch.device, without importing torch
        device = str(device)
    if not isinstance(device, str):
        raise TypeError(f"device: expected a device name such as 'cuda' or 'cuda:0', got {type(device).__name__}")
    kind = device.split(":", 1)[0]
    if kind not in ("cuda", "cpu"):
        raise ValueError(f"device: expected 'cuda', 'cuda:<index>' or 'cpu', got {device!r}")
    return device, kind == "cuda"


def kv_lengths_to_pages(kv_indptr, kv_len_arr, page_size):
    """FlashInfer's (kv_indptr, kv_len_arr) page-table form as Tessera's (kv_indptr, keep, last_page_len).

    kv_indptr: host int32 [batch + 1]; kv_len_arr: each request's KV length
    in tokens, at most its pages' capacity. Requests whose length needs fewer
    pages than listed use their first ceil(len / page_size) pages (the rest
    are never read, as in FlashInfer). Returns the indptr of the pages used,
    `keep` (None when every listed page is used, else the int64 positions of
    the used entries of kv_indices) and each request's last-page fill (0 for
    a request without keys)."""
    lens = W.host_ints(kv_len_arr, "kv_len_arr").astype(np.int64)
    batch = kv_indptr.size - 1
    if lens.size != batch:
        raise ValueError(f"kv_len_arr: expected {batch} entries (kv_indptr has {kv_indptr.size}), got {lens.size}")
    if lens.size and int(lens.min()) < 0:
        i = int(np.argmin(lens))
        raise ValueError(f"kv_len_arr: expected lengths >= 0, got {int(lens[i])} for request {i}")
    pages = np.diff(kv_indptr.astype(np.int64))
    if pages.size and int(pages.min()) < 0:
        i = int(np.argmin(pages))
        raise ValueError(f"kv_indptr: expected non-decreasing entries, got {int(kv_indptr[i])} then "
                         f"{int(kv_indptr[i + 1])} at request {i}")
    need = -(-lens // page_size)
    short = need > pages
    if short.any():
        i = int(np.argmax(short))
        raise ValueError(f"kv_len_arr: request {i} has {int(lens[i])} tokens, more than its {int(pages[i])} pages "
                         f"of page_size {page_size} hold")
    last = np.where(need > 0, lens - (need - 1) * page_size, 0).astype(np.int32)
    if np.array_equal(need, pages):
        return kv_indptr, None, last
    indptr = np.concatenate([[0], np.cumsum(need)]).astype(np.int32)
    starts = np.repeat(kv_indptr[:-1].astype(np.int64) - indptr[:-1], need)
    keep = np.arange(int(indptr[-1]), dtype=np.int64) + starts
    return indptr, keep, last


def _take(indices, keep):
    """kv_indices' entries at the host positions `keep` (a CUDA tensor stays on its device)."""
    arr = indices if T.is_torch(indices) else W.host_ints(indices, "kv_indices")
    if T.is_torch(arr) and arr.dim() != 1:
        raise ValueError(f"kv_indices: expected a 1-D tensor, got shape {tuple(arr.shape)}")
    if keep.size and int(keep[-1]) >= arr.shape[0]:
        raise ValueError(f"kv_indices: expected at least {int(keep[-1]) + 1} entries (kv_indptr), got {arr.shape[0]}")
    if T.is_torch(arr):
        return arr.index_select(0, T._torch().from_numpy(keep).to(arr.device))
    return arr[keep]


class BatchAttention:
    """Attention of a batch mixing prefill and decode requests over a paged KV cache, in one launch
    (FlashInfer's class of the same name).

    plan() once per step, then run() for every layer. Request i's queries are
    rows qo_indptr[i] .. qo_indptr[i+1] of q (any count: a prompt, or one
    token being decoded) and its keys the first kv_len_arr[i] tokens of its
    pages kv_indices[kv_indptr[i] .. kv_indptr[i+1]]. All requests run in one
    persistent launch of the batch prefill kernel
    (BatchPrefillWithPagedKVCacheWrapper underneath, on the wrapper's own
    workspace: 128 MiB at construction, grown when a plan needs more).

    run() returns (out, lse) with lse in **base 2**, as FlashInfer's
    BatchAttention writes it (log2 of the softmax denominator, ready for
    tessera.merge_state). Without a CUDA-graph mode in FlashInfer's
    signature, a plan larger than every earlier one may re-size the
    workspace sections (waiting for the GPU once), so capture run() in a
    CUDA graph only after planning the largest step.
    """

    def __init__(self, kv_layout="NHD", device="cuda"):
        """
        Args:
            kv_layout: "NHD" or "HND".
            device: the CUDA device whose memory holds the workspace ("cuda",
                "cuda:1" or a torch.device). "cpu" builds a wrapper whose
                plan() checks its arguments and then raises TypeError: the
                kernels need a GPU.
        """
        if kv_layout not in W.LAYOUTS:
            raise ValueError(f"kv_layout: expected 'NHD' or 'HND', got {kv_layout!r}")
        self._device, on_gpu = _device_arg(device)
        self._kv_layout = kv_layout
        if on_gpu:
            import torch  # the workspace is a CUDA tensor

            buf = torch.empty(_WORKSPACE_BYTES, dtype=torch.uint8, device=torch.device(self._device))
        else:
            buf = np.zeros(1, np.uint8)  # stands in until plan()'s device check
        from .prefill import BatchPrefillWithPagedKVCacheWrapper

        self._prefill = BatchPrefillWithPagedKVCacheWrapper(buf, kv_layout)
        self._planned = None

    @property
    def float_workspace_buffer(self):
        """The workspace the wrapper owns (a uint8 CUDA tensor)."""
        return self._prefill._float_workspace_buffer

    def plan(self, qo_indptr, kv_indptr, kv_indices, kv_len_arr, num_qo_heads, num_kv_heads, head_dim_qk,
             head_dim_vo, page_size, causal=False, sm_scale=None, logits_soft_cap=None, q_data_type="bfloat16",
             kv_data_type="bfloat16", use_profiler=False):
        """Plans one step.

        Args:
            qo_indptr: int [batch + 1] query row pointers (torch on any
                device, numpy or list; copied to the host).
            kv_indptr: int [batch + 1] page-table row pointers.
            kv_indices: int [kv_indptr[-1]] page ids (a CUDA tensor on the
                workspace's device stays there). They are copied at plan()
                (FlashInfer's reads them at run()): plan again after
                changing them.
            kv_len_arr: int [batch] KV tokens of each request (at most its
                pages' capacity; pages beyond ceil(len / page_size) are not
                read).
            num_qo_heads, num_kv_heads: query heads must be a multiple of KV heads.
            head_dim_qk: 64, 128, 256 or 512; head_dim_vo equal, or 128
                with head_dim_qk 192 (v and out [.., 128]).
            page_size: tokens per page.
            causal: bottom-right aligned causal mask within each request
                (query j of a request with q_len queries and kv_len keys sees
                keys < kv_len - q_len + j + 1).
            sm_scale: softmax scale; None means 1 / sqrt(head_dim_qk).
            logits_soft_cap: None or 0 (off), or a cap > 0 on the logits.
            q_data_type, kv_data_type: float16 or bfloat16 (torch dtype or
                name; FlashInfer's default is torch.bfloat16); equal.
            use_profiler: only False (FlashInfer's kernel profiler).
        """
        self._planned = None  # a failed plan() leaves nothing to run
        C.refuse_true("use_profiler", use_profiler, "FlashInfer's kernel profiler is not part of Tessera")
        d_qk = W.positive_int(head_dim_qk, "head_dim_qk")
        d_vo = W.positive_int(head_dim_vo, "head_dim_vo")
        B.check_head_dim_vo(d_qk, d_vo)  # equal, or 192 / 128
        ps = W.positive_int(page_size, "page_size")
        qo = B.indptr_arg(qo_indptr, "qo_indptr")
        kv = B.indptr_arg(kv_indptr, "kv_indptr")
        if kv.size != qo.size:
            raise ValueError(f"kv_indptr: expected {qo.size} entries (like qo_indptr), got {kv.size}")
        indptr, keep, last = kv_lengths_to_pages(kv, kv_len_arr, ps)
        indices = kv_indices if keep is None else _take(kv_indices, keep)
        args = (qo, indptr, indices, last, num_qo_heads, num_kv_heads, d_qk, ps)
        options = dict(causal=causal, sm_scale=sm_scale, logits_soft_cap=logits_soft_cap, q_data_type=q_data_type,
                       kv_data_type=kv_data_type, head_dim_vo=d_vo)
        if not T.is_cuda(self._prefill._float_workspace_buffer):
            # Every argument check of the prefill plan runs first; the workspace check ends it.
            try:
                self._prefill.plan(*args, **options)
            except TypeError as e:
                if not str(e).startswith("float_workspace_buffer"):
                    raise
            raise TypeError(f"device: expected a CUDA device for the workspace (the kernels need a GPU), got "
                            f"{self._device!r}")
        try:
            self._prefill.plan(*args, **options)
        except ValueError as e:
            m = _TOO_SMALL.match(str(e))
            if m is None:
                raise
            torch = T._torch()
            buf = self._prefill._float_workspace_buffer
            grown = torch.empty(max(2 * buf.numel(), int(m.group(1))), dtype=torch.uint8, device=buf.device)
            self._prefill.reset_workspace_buffer(grown, grown)
            self._prefill.plan(*args, **options)
        cap = W.plan_options(-1, logits_soft_cap)[1]
        self._planned = dict(cap=cap)

    def run(self, q, kv_cache, out=None, lse=None, k_scale=None, v_scale=None, logits_soft_cap=0.0,
            profiler_buffer=None, kv_cache_sf=None):
        """Attention of the planned step.

        Args:
            q: [qo_indptr[-1], num_qo_heads, head_dim_qk] CUDA tensor of q_data_type.
            kv_cache: (k_cache, v_cache), each [num_pages, page_size,
                num_kv_heads, head_dim] (NHD) or [num_pages, num_kv_heads,
                page_size, head_dim] (HND), or one interleaved tensor
                [num_pages, 2, ...].
            out: optional output [rows, num_qo_heads, head_dim_vo]; allocated when None.
            lse: optional float32 [rows, num_qo_heads]; allocated when None.
            k_scale, v_scale: None or floats: k_scale multiplies the softmax
                scale, v_scale the output, as in FlashInfer.
            logits_soft_cap: 0.0 / None, or the cap given to plan(). The
                planned cap applies (Tessera specializes the kernel for it at
                plan()); another value raises ValueError.
            profiler_buffer, kv_cache_sf: only None (FlashInfer's profiler,
                NVFP4 caches).

        Returns:
            (out, lse): out like q, lse float32 [rows, num_qo_heads] in base 2.
        """
        C.refuse_given("FlashInfer's kernel profiler is not part of Tessera", profiler_buffer=profiler_buffer)
        C.refuse_given("NVFP4 KV caches are not implemented", kv_cache_sf=kv_cache_sf)
        if self._planned is None:
            raise ValueError("run: expected plan() to be called first")
        cap = W.plan_options(-1, logits_soft_cap)[1]
        if cap not in (0.0, self._planned["cap"]):
            raise ValueError(f"logits_soft_cap: expected 0.0 or the value given to plan() "
                             f"({self._planned['cap'] or None}), got {logits_soft_cap!r}")
        return self._prefill.run(q, kv_cache, k_scale=k_scale, v_scale=v_scale, out=out, lse=lse, return_lse=True)
