"""Attention-state merging (FlashInfer's ``flashinfer.cascade`` names).

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
"""

from . import _tensors as T
from ._native import _C


def merge_state(v_a, s_a, v_b, s_b):
    """Merges two attention states.

    Args:
        v_a: values [seq_len, num_heads, head_dim].
        s_a: base-2 LSE of v_a, float32 [seq_len, num_heads].
        v_b: values like v_a (same shape and dtype).
        s_b: base-2 LSE of v_b, float32 [seq_len, num_heads].

    Returns:
        (v, s): merged values like v_a and their float32 base-2 LSE
        [seq_len, num_heads].
    """
    T.common_framework(v_a=v_a, s_a=s_a, v_b=v_b, s_b=s_b)
    v_out = T.empty(v_a, v_a.shape)
    s_out = T.empty(v_a, v_a.shape[:-1], "float32")
    with T.on_device_of(v_a):
        _C.merge_state(T.arg(v_a), T.arg(s_a), T.arg(v_b), T.arg(s_b), v_out, s_out, T.stream_of(v_a))
    return v_out, s_out


def merge_state_in_place(v, s, v_other, s_other, mask=None):
    """Merges (v_other, s_other) into (v, s) in place.

    Args:
        v: values [seq_len, num_heads, head_dim], overwritten with the merge.
        s: float32 base-2 LSE [seq_len, num_heads], overwritten likewise.
        v_other: values like v.
        s_other: float32 base-2 LSE like s.
        mask: optional bool/uint8 [seq_len]; rows where it is 0 keep (v, s)
            unchanged. None merges every row.

    Returns:
        None.
    """
    T.common_framework(v=v, s=s, v_other=v_other, s_other=s_other, mask=mask)
    with T.on_device_of(v):
        _C.merge_state_in_place(T.arg(v), T.arg(s), T.arg(v_other), T.arg(s_other), T.arg(mask), T.stream_of(v))


def merge_states(v, s):
    """Merges a fixed number of states per row.

    Args:
        v: values [seq_len, num_states, num_heads, head_dim].
        s: float32 base-2 LSE [seq_len, num_states, num_heads].

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
        _C.merge_states(T.arg(v), T.arg(s), v_out, s_out, T.stream_of(v))
    return v_out, s_out


def merge_states_ragged(v, s, indptr):
    """Merges a variable number of states per row.

    Row i of the result merges states indptr[i] .. indptr[i+1]-1; a row with
    no states gets v = 0 and s = -inf.

    Args:
        v: values [total_states, num_heads, head_dim].
        s: float32 base-2 LSE [total_states, num_heads].
        indptr: int32 [num_rows + 1] on v's device, starting at 0,
            non-decreasing, ending at total_states. A Python list is also
            accepted (converted to an int32 tensor/array on v's device).

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
        _C.merge_states_ragged(T.arg(v), T.arg(s), T.arg(indptr), v_out, s_out, T.stream_of(v))
    return v_out, s_out
