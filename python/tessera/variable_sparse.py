"""Block-sparse attention with variable block sizes and a mask per KV head
(FlashInfer's ``flashinfer.sparse`` name VariableBlockSparseAttentionWrapper;
sparse.py re-exports it).

KV head h splits the M query rows into blocks of block_row_sz[h] rows and
the N keys into blocks of block_col_sz[h] keys; block row i sees column
block c where block_mask_map[h, i, c] is set. Query heads h * group ..
(h + 1) * group - 1 (group = num_qo_heads / num_kv_heads) follow KV head h.

It runs as one batch prefill (BatchPrefillWithPagedKVCacheWrapper, one
persistent launch for every head): each (KV head, block row) is a request
whose query rows are that block row of the head's group of query heads, and
whose "pages" are single keys (page_size 1) of the head's K / V, listed
block by block in column order. Cost, beyond the attention itself:

* plan() builds the key lists on the host: one int32 id per visible key per
  (KV head, block row), i.e. 4 bytes x the mask's visible keys, uploaded
  into the workspace; it reads the mask (a CUDA mask is copied to the host).
* run() copies q into the (KV head, row, group) order and the output back
  (one extra read and write of q and of out); K / V are read in place when
  contiguous (else copied once).
* the kernel gathers keys row by row through the ids instead of reading
  whole blocks, so dense regions run slower than with BlockSparseAttentionWrapper's
  fixed blocks.
"""

import numpy as np

from . import _compat as C
from . import _prefill_base as B
from . import _tensors as T
from . import _wrapper_util as W


def _host_array(x, name, ndim):
    """An index / mask tensor (torch on any device, numpy, nested lists) as host numpy with `ndim` dimensions."""
    if T.is_torch(x):
        x = x.detach().cpu().numpy()
    elif isinstance(x, (list, tuple)):
        x = np.asarray(x)
    elif not isinstance(x, np.ndarray):
        raise TypeError(f"{name}: expected a torch.Tensor or numpy.ndarray, got {type(x).__name__}")
    if x.ndim != ndim:
        raise ValueError(f"{name}: expected a {ndim}-D tensor, got shape {tuple(x.shape)}")
    return x


def _block_sizes(x, name, heads):
    arr = _host_array(x, name, 2)
    if arr.dtype.kind not in "iu":
        raise TypeError(f"{name}: expected an integer dtype, got {arr.dtype.name}")
    if arr.shape[0] != heads:
        raise ValueError(f"{name}: expected {heads} rows (num_kv_heads), got shape {tuple(arr.shape)}")
    arr = arr.astype(np.int64)
    if arr.size and int(arr.min()) < 0:
        raise ValueError(f"{name}: expected sizes >= 0, got {int(arr.min())}")
    totals = arr.sum(axis=1)
    if totals.size and (totals != totals[0]).any():
        h = int(np.argmax(totals != totals[0]))
        raise ValueError(f"{name}: expected every KV head's sizes to add up to the same length, got {int(totals[0])} "
                         f"for head 0 and {int(totals[h])} for head {h}")
    return arr, int(totals[0]) if totals.size else 0


def variable_block_plan(block_mask_map, block_row_sz, block_col_sz, num_kv_heads):
    """The batch-prefill form of a variable block-sparse pattern.

    Returns (qo_indptr, kv_indptr, kv_indices, M, N): requests h * MB + i
    (KV head h, block row i) in order, their query rows in the
    [num_kv_heads * M] row order of the rearranged q, and the ids of their
    visible keys in the [num_kv_heads * N] key order (head h's key j is
    h * N + j), column blocks in increasing order."""
    hkv = W.positive_int(num_kv_heads, "num_kv_heads")
    mask = _host_array(block_mask_map, "block_mask_map", 3)
    if mask.dtype.kind not in "biu":
        raise TypeError(f"block_mask_map: expected a bool (or integer) tensor, got {mask.dtype.name}")
    if mask.shape[0] != hkv:
        raise ValueError(f"block_mask_map: expected num_kv_heads={hkv} as its first dimension, got shape "
                         f"{tuple(mask.shape)}")
    mask = mask != 0
    rows, M = _block_sizes(block_row_sz, "block_row_sz", hkv)
    cols, N = _block_sizes(block_col_sz, "block_col_sz", hkv)
    mb, nb = mask.shape[1], mask.shape[2]
    if rows.shape[1] != mb:
        raise ValueError(f"block_row_sz: expected shape ({hkv}, {mb}) (block_mask_map's row blocks), got "
                         f"{tuple(rows.shape)}")
    if cols.shape[1] != nb:
        raise ValueError(f"block_col_sz: expected shape ({hkv}, {nb}) (block_mask_map's column blocks), got "
                         f"{tuple(cols.shape)}")
    if hkv * max(M, N) > W.INT32_MAX:
        raise ValueError(f"block_row_sz, block_col_sz: num_kv_heads x rows / keys must fit in int32, got {hkv} x "
                         f"{max(M, N)}")
    qo_indptr = np.concatenate([[0], np.cumsum(rows.reshape(-1))])
    row_keys = (mask * cols[:, None, :]).sum(axis=2)  # [Hkv, MB] visible keys per block row
    kv_indptr = np.concatenate([[0], np.cumsum(row_keys.reshape(-1))])
    if kv_indptr[-1] > W.INT32_MAX:
        raise ValueError(f"block_mask_map: {int(kv_indptr[-1])} visible keys in all exceed int32 ids")
    # Every visible block in (head, row, column) order, expanded to its keys.
    first_key = np.arange(hkv)[:, None] * N + np.cumsum(cols, axis=1) - cols  # [Hkv, NB]
    h, _, c = np.nonzero(mask)
    lengths = cols[h, c]
    starts = np.repeat(first_key[h, c] - (np.cumsum(lengths) - lengths), lengths)
    kv_indices = np.arange(int(kv_indptr[-1]), dtype=np.int64) + starts
    return (qo_indptr.astype(np.int32), kv_indptr.astype(np.int32), kv_indices.astype(np.int32), M, N)


class VariableBlockSparseAttentionWrapper:
    """Block-sparse attention with variable block sizes and a block mask per KV head (FlashInfer's wrapper of
    the same name; see the module doc for the pattern and what it costs).

    causal=True masks each (KV head, block row) bottom-right within the keys
    it gathers (in column order), as FlashInfer does: query i of a block row
    of r rows that gathers L keys sees the first L - r + i + 1 of them.
    q, k, v and the output are head-major: q [num_qo_heads, M, head_dim],
    k / v [num_kv_heads, N, head_dim]. LSEs are in base 2.
    """

    def __init__(self, float_workspace_buffer, backend="auto"):
        """
        Args:
            float_workspace_buffer: a contiguous CUDA tensor of any dtype (FlashInfer users allocate 128 MB),
                the batch prefill's workspace.
            backend: "auto", "fa2" or "fa3" (Tessera's prefill kernel templates); FlashInfer's "cake" /
                "cake_cute" kernels are not part of Tessera.
        """
        from .prefill import BatchPrefillWithPagedKVCacheWrapper  # prefill imports sparse, which imports this module

        self._prefill = BatchPrefillWithPagedKVCacheWrapper(float_workspace_buffer, "NHD", backend=backend)
        self._planned = None

    def reset_workspace_buffer(self, float_workspace_buffer, int_workspace_buffer):
        """Moves the wrapper to a new workspace (any dtype, used as bytes); plan() again before run().
        int_workspace_buffer: accepted for FlashInfer's signature and not written."""
        self._planned = None
        self._prefill.reset_workspace_buffer(float_workspace_buffer, int_workspace_buffer)

    @C.recorded_plan
    def plan(self, block_mask_map, block_row_sz, block_col_sz, num_qo_heads, num_kv_heads, head_dim, causal=False,
             pos_encoding_mode="NONE", use_fp16_qk_reduction=False, logits_soft_cap=None, sm_scale=None,
             rope_scale=None, rope_theta=None, non_blocking=True, q_data_type="float16", kv_data_type=None):
        """Plans the pattern.

        Args:
            block_mask_map: bool (or integer, nonzero = visible) [num_kv_heads,
                MB, NB] (torch on any device, numpy; read on the host).
            block_row_sz: int [num_kv_heads, MB] rows of each block row; each
                head's add up to M (the same for every head). Sizes may be 0.
            block_col_sz: int [num_kv_heads, NB] keys of each column block;
                each head's add up to N.
            num_qo_heads, num_kv_heads: query heads must be a multiple of KV heads.
            head_dim: 64, 128 or 256.
            causal: bottom-right within each block row's gathered keys (see
                the class doc).
            logits_soft_cap: None or 0 (off), or a cap > 0.
            sm_scale: softmax scale; None means 1 / sqrt(head_dim).
            q_data_type, kv_data_type: float16 or bfloat16 (kv defaults to
                q's and must equal it); the output has q's dtype.
            use_fp16_qk_reduction, non_blocking: accepted (q.k accumulates in
                float32; the upload is asynchronous).
            pos_encoding_mode, rope_scale, rope_theta: only the defaults
                (positions are not defined across gathered blocks here).
        """
        self._planned = None  # a failed plan() leaves nothing to run
        B.reject_prefill_options((), (), head_dim, None, pos_encoding_mode, rope_scale, rope_theta, rope_ok=False)
        hq = W.positive_int(num_qo_heads, "num_qo_heads")
        hkv = W.positive_int(num_kv_heads, "num_kv_heads")
        if hq % hkv:
            raise ValueError(f"num_qo_heads: expected a multiple of num_kv_heads={hkv}, got {hq}")
        qo, kv, ids, M, N = variable_block_plan(block_mask_map, block_row_sz, block_col_sz, hkv)
        last = np.ones(qo.size - 1, np.int32)  # page_size 1: every page holds one key
        self._prefill.plan(qo, kv, ids, last, hq // hkv, 1, head_dim, 1, causal=causal,
                           use_fp16_qk_reduction=use_fp16_qk_reduction, sm_scale=sm_scale,
                           logits_soft_cap=logits_soft_cap, q_data_type=q_data_type, kv_data_type=kv_data_type,
                           o_data_type=q_data_type, non_blocking=non_blocking)
        self._planned = dict(hq=hq, hkv=hkv, M=M, N=N, head_dim=int(head_dim))

    def _check_kv(self, x, name):
        p = self._planned
        T.framework(x, name)
        want = (p["hkv"], p["N"], p["head_dim"])
        if tuple(x.shape) != want:
            raise ValueError(f"{name}: expected shape {want} [num_kv_heads, N, head_dim], got {tuple(x.shape)}")
        return x.reshape(p["hkv"] * p["N"], 1, 1, p["head_dim"])  # pages of one key (a view when contiguous)

    def run(self, q, k, v, out=None, lse=None, return_lse=False, enable_pdl=None):
        """Attention of the planned pattern.

        Args:
            q: [num_qo_heads, M, head_dim] CUDA tensor of q_data_type.
            k, v: [num_kv_heads, N, head_dim] on q's device.
            out: optional output, [num_qo_heads, M, head_dim] (filled and
                returned) or FlashInfer's kernel layout [num_kv_heads * M,
                group, head_dim] (filled, and the result returned in the
                head-major layout as FlashInfer does).
            lse: optional float32 [num_qo_heads, M] or [num_kv_heads * M,
                group], likewise; filled when given. Where the two shapes
                coincide (M == group), the head-major layout is meant.
            return_lse: also return the LSE (base 2).
            enable_pdl: programmatic dependent launch (None: on; ignored before sm_90).

        Returns:
            out [num_qo_heads, M, head_dim], or (out, lse [num_qo_heads, M]).
        """
        p = self._planned
        if p is None:
            raise ValueError("run: expected plan() to be called first")
        if not T.is_cuda(q):
            raise TypeError(f"q: expected a CUDA tensor, got {type(q).__name__} on {T.device_of(q)}")
        hq, hkv, M, d = p["hq"], p["hkv"], p["M"], p["head_dim"]
        g = hq // hkv
        if tuple(q.shape) != (hq, M, d):
            raise ValueError(f"q: expected shape {(hq, M, d)} [num_qo_heads, M, head_dim], got {tuple(q.shape)}")
        kp, vp = self._check_kv(k, "k"), self._check_kv(v, "v")
        rows = q.reshape(hkv, g, M, d).permute(0, 2, 1, 3).reshape(hkv * M, g, d).contiguous()  # (head, row, group)
        head_major = (hq, M, d), (hq, M)
        kernel = (hkv * M, g, d), (hkv * M, g)
        for name, x, dtype in (("out", out, q.dtype), ("lse", lse, "float32")):
            if x is not None and (not T.is_cuda(x) or x.device != q.device or str(x.dtype).replace("torch.", "") !=
                                  str(dtype).replace("torch.", "")):
                raise TypeError(f"{name}: expected a {str(dtype).replace('torch.', '')} tensor on {q.device}, got "
                                f"{getattr(x, 'dtype', type(x).__name__)} on {T.device_of(x)}")
        o_k = self._kernel_buffer(out, "out", head_major[0], kernel[0])
        l_k = self._kernel_buffer(lse, "lse", head_major[1], kernel[1])
        want_lse = return_lse or lse is not None
        res = self._prefill.run(rows, (kp, vp), out=o_k, lse=l_k, return_lse=want_lse, enable_pdl=enable_pdl)
        o_k, l_k = res if want_lse else (res, None)
        o = o_k.reshape(hkv, M, g, d).permute(0, 2, 1, 3).reshape(hq, M, d)
        if out is not None and tuple(out.shape) == head_major[0]:
            out.copy_(o)  # dtype and device checked before the launch
            o = out
        if l_k is not None:
            s = l_k.reshape(hkv, M, g).permute(0, 2, 1).reshape(hq, M)
            if lse is not None and tuple(lse.shape) == head_major[1]:
                lse.copy_(s)
                s = lse
        return (o, s) if return_lse else o

    @staticmethod
    def _kernel_buffer(x, name, head_major, kernel):
        """The caller's out / lse as the kernel's buffer: itself in the kernel layout, None (allocated by the
        kernel, copied into x afterwards) in the head-major one."""
        if x is None or tuple(x.shape) == head_major:
            return None
        if tuple(x.shape) != kernel:
            raise ValueError(f"{name}: expected shape {head_major} or {kernel} (FlashInfer's kernel layout), got "
                             f"{tuple(x.shape)}")
        return x

    def forward(self, q, k, v, pos_encoding_mode="NONE", use_fp16_qk_reduction=False, logits_soft_cap=None,
                sm_scale=None, rope_scale=None, rope_theta=None):
        """FlashInfer's deprecated plan-options-at-run call: these options replace those of the last plan() (here
        and for later runs; plan() runs again when they differ), then run()."""
        C.replan(self, type(self).plan, dict(pos_encoding_mode=pos_encoding_mode,
                                             use_fp16_qk_reduction=use_fp16_qk_reduction,
                                             logits_soft_cap=logits_soft_cap, sm_scale=sm_scale,
                                             rope_scale=rope_scale, rope_theta=rope_theta))
        return self.run(q, k, v)

