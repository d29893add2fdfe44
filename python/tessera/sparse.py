"""Block-sparse attention (FlashInfer's ``flashinfer.sparse`` names): BlockSparseAttentionWrapper here,
VariableBlockSparseAttentionWrapper (variable block sizes, a mask per KV head) in variable_sparse.py.

It runs the batch prefill kernels of _prefill_base.py with each block row as
one request whose pages are its column blocks. FlashInfer 0.7.2's arguments
are all accepted; those for features Tessera does not implement yet
(BlockSparseAttentionWrapper's per-head block masks, the VSA backends' options, FP8 scale tensors)
raise tessera.NotSupportedError unless left at their defaults (see _compat.py).

Masks within blocks (mask / packed_mask) become each block row's custom mask
over the keys it gathers: the paged prefill kernel's custom-mask variant.
"""

import numbers

import numpy as np

from . import _compat as compat
from . import _masks as MK
from . import _prefill_base as B
from . import _tensors as T
from . import _wrapper_util as W


class BlockSparseAttentionWrapper(B.PrefillWrapper):
    """Block-sparse attention (FlashInfer's wrapper of the same name).

    The attention matrix has M query rows and N KV columns in blocks of
    R x C: block row r (queries r*R .. (r+1)*R - 1) attends to the column
    blocks indices[indptr[r] .. indptr[r+1]] (keys c*C .. (c+1)*C - 1 each).
    Each block row runs as one request whose pages are its column blocks, so
    causal=True masks bottom-right within the keys a block row gathers (in
    indices order), as FlashInfer does. The workspace bounds follow the
    plans (no CUDA-graph mode).
    """

    def __init__(self, float_workspace_buffer, backend="auto"):
        super().__init__(float_workspace_buffer, "NHD", False, backend, None)

    @compat.recorded_plan
    def plan(self, indptr, indices, M, N, R, C, num_qo_heads, num_kv_heads, head_dim, mask=None, packed_mask=None,
             causal=False, pos_encoding_mode="NONE", use_fp16_qk_reduction=False, logits_soft_cap=None, sm_scale=None,
             rope_scale=None, rope_theta=None, q_data_type="float16", kv_data_type=None, o_data_type="float16",
             non_blocking=True, block_mask=None, kv_block_lens=None, q2k_indices=None, q2k_num=None, kv_splits=None,
             use_clc=None, q_scale=None, k_scale=None, v_scale=None):
        """Plans the block-sparse pattern.

        Args:
            indptr: int [M / R + 1] block-row pointers (int32 or int64).
            indices: int [indptr[-1]] column-block indices (< N / C).
            M, N: rows of q and of k / v (multiples of R and C).
            R, C: block size.
            o_data_type: the output's dtype; float16 unless given, whatever
                q_data_type is, as in FlashInfer.
            mask: bool [indptr[-1], R, C], the elements each block keeps
                (True = the query sees the key), or packed_mask: those bits
                flattened and packed with little bit order (FlashInfer's
                packbits(mask.reshape(-1), bitorder="little")). Not with
                causal=True (put the causal part into the mask).
            block_mask, kv_block_lens, q2k_indices, q2k_num, kv_splits,
                use_clc, q_scale, k_scale, v_scale: only None so far.
            The other arguments are as for BatchPrefillWithPagedKVCacheWrapper.plan.
        """
        self._planned = None  # a failed plan() leaves nothing to run
        B.reject_prefill_options((), (), head_dim, None, pos_encoding_mode, rope_scale, rope_theta, rope_ok=False)
        compat.refuse_given("per-head block masks and variable block lengths are not implemented",
                            block_mask=block_mask, kv_block_lens=kv_block_lens, q2k_indices=q2k_indices,
                            q2k_num=q2k_num)
        compat.refuse_given("options of FlashInfer's VSA kernels", kv_splits=kv_splits, use_clc=use_clc)
        compat.refuse_given("FP8 scale tensors are not implemented", q_scale=q_scale, k_scale=k_scale,
                            v_scale=v_scale)
        R, C = W.positive_int(R, "R"), W.positive_int(C, "C")
        for name, value, block, size in (("M", M, "R", R), ("N", N, "C", C)):
            if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 0 or value % size:
                raise ValueError(f"{name}: expected a non-negative multiple of {block}={size}, got {value!r}")
        M, N = int(M), int(N)
        masked = mask is not None or packed_mask is not None
        config, scale, options = self._config(num_qo_heads, num_kv_heads, head_dim, "head_dim", C, "NHD", causal,
                                              sm_scale, q_data_type, kv_data_type, o_data_type,
                                              logits_soft_cap=logits_soft_cap, masked=masked)
        ip = B.indptr_arg(indptr, "indptr")
        idx = W.host_ints(indices, "indices")
        if ip.size != M // R + 1:
            raise ValueError(f"indptr: expected M / R + 1 = {M // R + 1} entries, got {ip.size}")
        bounds = (W.Bound("max_batch", "indptr", "block-row count"), W.Bound("max_total_q", "M", "row count"),
                  W.Bound("max_pages", "indices", "block count"))
        counts = (max(M // R, 1), max(M, 1), max(int(idx.size), 1))
        if not masked:
            self._plan(config, scale, options, counts, bounds, lambda n, s: n.plan_bsr(ip, idx, M, N, R, C, s),
                       total_q=M, N=N, C=C)
            return
        # Block row r is a request of R queries over its column blocks as pages of C keys.
        nnz = int(ip[-1])
        qo = np.arange(0, M + 1, R, dtype=np.int32)
        kv = ip.astype(np.int32)
        last = np.full(M // R, C, dtype=np.int32)
        flat = _block_row_masks(mask, packed_mask, ip, R, C)
        plan = MK.MaskPlan(flat, None, causal, np.full(M // R, R), np.diff(ip.astype(np.int64)) * C)
        ids = np.ascontiguousarray(idx[:nnz], dtype=np.int32)
        self._plan(config, scale, options, counts, bounds, lambda n, s: n.plan_paged(qo, kv, ids, last, s, plan.indptr),
                   mask=plan, total_q=M, N=N, C=C)

    begin_forward = plan

    @staticmethod
    def _pages(x, name, N, C):
        """k / v [N, Hkv, D] as N / C pages of C tokens (a view: splitting a dimension never copies)."""
        T.framework(x, name)
        if len(x.shape) != 3 or x.shape[0] != N:
            raise ValueError(f"{name}: expected a 3-D tensor [N={N}, num_kv_heads, head_dim], got shape "
                             f"{tuple(x.shape)}")
        return x.reshape((N // C, C) + tuple(x.shape[1:]))

    def run(self, q, k, v, scale_q=None, scale_k=None, scale_v=None, out=None, lse=None, return_lse=False,
            enable_pdl=None):
        """Attention of the planned pattern: q [M, num_qo_heads, head_dim]; k, v [N, num_kv_heads, head_dim].

        scale_q, scale_k, scale_v: only None so far (FP8 per-head scales).
        Returns out [M, num_qo_heads, head_dim] (o_data_type), or (out, lse) with
        return_lse (float32 [M, num_qo_heads], base 2).
        """
        compat.refuse_given("FP8 per-head scale tensors are not implemented", scale_q=scale_q, scale_k=scale_k,
                            scale_v=scale_v)
        plan = self._check_run((), None, None, None, enable_pdl)
        kp, vp = self._pages(k, "k", plan["N"], plan["C"]), self._pages(v, "v", plan["N"], plan["C"])
        out, lse = self._outputs(q, out, lse, return_lse)
        with T.on_device_of(q):
            self._native.run(T.arg(q), T.arg(kp), T.arg(vp), out, lse, plan["sm_scale"], T.stream_of(q),
                             plan["mask"], pdl=plan["pdl"])
        return (out, lse) if return_lse else out

    def forward(self, q, k, v, scale_q=None, scale_k=None, scale_v=None, pos_encoding_mode="NONE",
                use_fp16_qk_reduction=False, logits_soft_cap=None, sm_scale=None, rope_scale=None, rope_theta=None):
        """FlashInfer's deprecated plan-options-at-run call: these options replace those of the last plan() (here
        and for later runs; plan() runs again when they differ), then run()."""
        self._replan(pos_encoding_mode=pos_encoding_mode, use_fp16_qk_reduction=use_fp16_qk_reduction,
                     logits_soft_cap=logits_soft_cap, sm_scale=sm_scale, rope_scale=rope_scale, rope_theta=rope_theta)
        return self.run(q, k, v, scale_q, scale_k, scale_v)


def _block_row_masks(mask, packed_mask, indptr, R, C):
    """FlashInfer's per-block masks [nnz, R, C] (or their packed bits) as each block row's row-major
    [R, nnz_r * C] mask over the keys it gathers, concatenated: the prefill custom-mask layout. Stays in
    the input's framework and on its device (one scatter)."""
    nnz = int(indptr[-1])
    count = nnz * R * C
    if mask is not None and packed_mask is not None:
        raise ValueError("mask, packed_mask: expected one of them, got both")
    src = mask if mask is not None else packed_mask
    name = "mask" if mask is not None else "packed_mask"
    fw = T.framework(src, name)
    if mask is not None:
        if tuple(mask.shape) != (nnz, R, C):
            raise ValueError(f"mask: expected shape (indptr[-1]={nnz}, R={R}, C={C}), got {tuple(mask.shape)}")
        floating = (mask.dtype.kind in "fc") if fw == "numpy" else (mask.is_floating_point() or mask.is_complex())
        if floating:
            raise TypeError(f"mask: expected a bool (or 0/1 integer) tensor, got {str(mask.dtype).replace('torch.', '')}")
    else:
        dt = str(packed_mask.dtype).replace("torch.", "")
        if dt != "uint8" or len(packed_mask.shape) != 1:
            raise TypeError(f"packed_mask: expected a 1-D uint8 tensor (packed bits), got {dt} of shape "
                            f"{tuple(packed_mask.shape)}")
        if packed_mask.shape[0] < (count + 7) // 8:
            raise ValueError(f"packed_mask: expected at least ceil(indptr[-1] * R * C / 8) = {(count + 7) // 8} "
                             f"bytes, got {packed_mask.shape[0]}")
    # Destination of element (block b, row i, column c): the block row's base, row i of its
    # [R, nnz_r * C] mask, column j * C + c for the block's place j in the row.
    ip = indptr.astype(np.int64)
    per_row = np.diff(ip)
    row_of = np.repeat(np.arange(per_row.size), per_row)
    j = np.arange(nnz) - ip[row_of]
    width = per_row[row_of] * C
    base = ip[row_of] * R * C + j * C
    dest = (base[:, None, None] + np.arange(R)[None, :, None] * width[:, None, None]
            + np.arange(C)[None, None, :]).reshape(-1)
    if fw == "numpy":
        bits = (np.unpackbits(np.asarray(packed_mask), count=count, bitorder="little") if mask is None
                else np.asarray(mask).reshape(-1) != 0)
        out = np.zeros(count, dtype=bool)
        out[dest] = bits
        return out
    torch = T._torch()
    dev = src.device
    if mask is None:
        shifts = torch.arange(8, device=dev, dtype=torch.uint8)
        bits = ((packed_mask[:(count + 7) // 8, None] >> shifts) & 1).reshape(-1)[:count].bool()
    else:
        bits = mask.reshape(-1) != 0
    out = torch.zeros(count, dtype=torch.bool, device=dev)
    out[torch.from_numpy(dest).to(dev)] = bits
    return out


# FlashInfer's flashinfer.sparse also holds the variable-block wrapper (variable_sparse.py).
from .variable_sparse import VariableBlockSparseAttentionWrapper  # noqa: E402,F401
