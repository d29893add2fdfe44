"""What FlashInfer code relies on beyond the parameter lists (test_flashinfer_signatures.py).

CPU: workspaces of any dtype are used as bytes and int64 index arrays pass
every plan() check (a host workspace then stops the plan, by name); every
argument whose feature Tessera lacks raises tessera.NotSupportedError naming
it when given a non-default value, while values that say nothing new pass;
the deprecated positional plan() options and forward() shims; the page
helpers' int64 inputs and output buffers; single_prefill's k_scale / v_scale
on the CPU path. GPU (skipped without one): the same features on the device
against the plain calls.
"""

import warnings

import numpy as np
import pytest

import tessera
from conftest import rel_error, to_np
from decode_reference import HEAD_DIM, HKV, HQ
from prefill_reference import WORKSPACE_BYTES, indptr_of, make_table, random_cache, ref_request, uniform
from tessera import _compat as C
from tessera import _wrapper_util as W

DTYPES = [np.uint8, np.int8, np.int32, np.float16, np.float32, np.float64, np.bool_]
HOST_WORKSPACE = "^float_workspace_buffer: expected a torch CUDA tensor"

# Small valid steps: two requests, pages of 16 (decode and paged prefill), ragged lengths (ragged prefill).
DECODE = dict(indptr=[0, 1, 3], indices=[0, 2, 1], last_page_len=[5, 16], num_qo_heads=HQ, num_kv_heads=HKV,
              head_dim=HEAD_DIM, page_size=16)
PAGED = dict(qo_indptr=[0, 2, 5], paged_kv_indptr=[0, 1, 3], paged_kv_indices=[0, 2, 1],
             paged_kv_last_page_len=[5, 16], num_qo_heads=HQ, num_kv_heads=HKV, head_dim_qk=HEAD_DIM, page_size=16)
RAGGED = dict(qo_indptr=[0, 2, 5], kv_indptr=[0, 4, 9], num_qo_heads=HQ, num_kv_heads=HKV, head_dim_qk=HEAD_DIM)
BSR = dict(indptr=[0, 1, 2], indices=[0, 1], M=8, N=32, R=4, C=16, num_qo_heads=HQ, num_kv_heads=HKV,
           head_dim=HEAD_DIM)
CASCADE = dict(qo_indptr_arr=[[0, 5], [0, 2, 5]], paged_kv_indptr_arr=[[0, 1], [0, 1, 3]],
               paged_kv_indices_arr=[[3], [0, 2, 1]], paged_kv_last_page_len=[[16], [5, 16]], num_qo_heads=HQ,
               num_kv_heads=HKV, head_dim=HEAD_DIM, page_size=16)


def buf(dtype=np.uint8, n=64):
    return np.zeros(n, dtype)


def decode_w(**kw):
    return tessera.BatchDecodeWithPagedKVCacheWrapper(buf(), **kw)


def paged_w(**kw):
    return tessera.BatchPrefillWithPagedKVCacheWrapper(buf(), **kw)


def ragged_w(**kw):
    return tessera.BatchPrefillWithRaggedKVCacheWrapper(buf(), **kw)


def bsr_w():
    return tessera.BlockSparseAttentionWrapper(buf())


def with_(args, **kw):
    return dict(args, **kw)


# ======================================================================= workspaces and index dtypes
@pytest.mark.parametrize("dtype", DTYPES)
def test_workspace_of_any_dtype_is_its_bytes(dtype):
    x = np.zeros((4, 6), dtype)
    b = W.workspace_bytes(x)
    assert b.dtype == np.uint8 and b.shape == (x.nbytes,) and np.shares_memory(b, x)
    with pytest.raises(ValueError, match="^float_workspace_buffer: expected a contiguous"):
        W.workspace_bytes(x[:, ::2])


@pytest.mark.parametrize("dtype", DTYPES)
def test_wrappers_take_workspaces_of_any_dtype(dtype):
    """The constructors take any dtype; plan() then passes every argument check and stops only at the host
    workspace (a CUDA tensor is needed), with no word about its dtype."""
    ws = buf(dtype, 256)
    calls = [
        lambda: tessera.BatchDecodeWithPagedKVCacheWrapper(ws).plan(**DECODE),
        lambda: tessera.CUDAGraphBatchDecodeWithPagedKVCacheWrapper(ws, buf(np.int32, 3), buf(np.int32, 3),
                                                                    buf(np.int32, 2)).plan(**DECODE),
        lambda: tessera.BatchPrefillWithPagedKVCacheWrapper(ws).plan(**PAGED),
        lambda: tessera.BatchPrefillWithRaggedKVCacheWrapper(ws).plan(**RAGGED),
        lambda: tessera.BlockSparseAttentionWrapper(ws).plan(**BSR),
        lambda: tessera.MultiLevelCascadeAttentionWrapper(2, ws).plan(**CASCADE),
    ]
    for call in calls:
        with pytest.raises(TypeError, match=HOST_WORKSPACE + r" \(any dtype\)"):
            call()


@pytest.mark.parametrize("index_dtype", [np.int32, np.int64, np.uint32])
def test_plans_take_int64_indices(index_dtype):
    """int32 and int64 (and other integer) index arrays pass every plan() check of every wrapper."""
    def ints(x):
        return np.asarray(x, index_dtype)

    calls = [
        lambda: decode_w().plan(**with_(DECODE, indptr=ints(DECODE["indptr"]), indices=ints(DECODE["indices"]),
                                        last_page_len=ints(DECODE["last_page_len"]),
                                        seq_lens=ints([5, 32]))),
        lambda: paged_w().plan(**with_(PAGED, **{k: ints(PAGED[k]) for k in ("qo_indptr", "paged_kv_indptr",
                                                                              "paged_kv_indices",
                                                                              "paged_kv_last_page_len")})),
        lambda: paged_w().plan(**with_(PAGED, custom_mask=np.ones(2 * 5 + 3 * 32, bool), qo_indptr=ints([0, 2, 5]))),
        lambda: ragged_w().plan(**with_(RAGGED, qo_indptr=ints([0, 2, 5]), kv_indptr=ints([0, 4, 9]),
                                        seq_lens_q=ints([2, 3]), v_indptr=ints([0, 4, 9]))),
        lambda: bsr_w().plan(**with_(BSR, indptr=ints([0, 1, 2]), indices=ints([0, 1]))),
        lambda: tessera.MultiLevelCascadeAttentionWrapper(2, buf()).plan(
            **with_(CASCADE, qo_indptr_arr=[ints(x) for x in CASCADE["qo_indptr_arr"]],
                    paged_kv_indices_arr=[ints(x) for x in CASCADE["paged_kv_indices_arr"]])),
    ]
    for call in calls:
        with pytest.raises(TypeError, match=HOST_WORKSPACE):
            call()


def test_int64_indices_beyond_int32_are_rejected_by_name():
    with pytest.raises(ValueError, match="^indices: expected values that fit in int32"):
        decode_w().plan(**with_(DECODE, indices=np.array([0, 2, 2**31], np.int64)))


def test_append_paged_kv_cache_reads_int64_indices_like_int32(rng):
    key = rng.standard_normal((5, HKV, HEAD_DIM)).astype(np.float16)
    table = dict(batch_indices=[0, 0, 1, 1, 1], positions=[3, 4, 16, 17, 18], kv_indices=[2, 0, 1],
                 kv_indptr=[0, 1, 3], kv_last_page_len=[5, 3])
    caches = []
    for dtype in (np.int32, np.int64):
        k = np.zeros((4, 16, HKV, HEAD_DIM), np.float16)
        v = np.zeros_like(k)
        tessera.append_paged_kv_cache(key, key, paged_kv_cache=(k, v),
                                      **{name: np.asarray(x, dtype) for name, x in table.items()})
        caches.append(k)
    assert caches[0].any()
    np.testing.assert_array_equal(caches[0], caches[1])


def test_get_batch_indices_positions_outputs_and_padding():
    """FlashInfer's optional int32 outputs, written in place; entries past append_indptr[-1] get (-1, 0), except
    that a given positions buffer keeps its values there (FlashInfer resets only batch_indices)."""
    append_indptr, seq_lens = np.array([0, 2, 2, 5], np.int64), np.array([10, 4, 3], np.int64)
    batch, positions = np.full(7, 99, np.int32), np.full(7, 99, np.int32)
    got = tessera.get_batch_indices_positions(append_indptr, seq_lens, 7, batch, positions)
    assert got[0] is batch and got[1] is positions
    np.testing.assert_array_equal(batch, [0, 0, 2, 2, 2, -1, -1])
    np.testing.assert_array_equal(positions, [8, 9, 0, 1, 2, 99, 99])
    np.testing.assert_array_equal(tessera.get_batch_indices_positions(append_indptr, seq_lens, 7)[1],
                                  [8, 9, 0, 1, 2, 0, 0])
    only_positions = np.zeros(5, np.int32)
    b, p = tessera.get_batch_indices_positions(append_indptr, seq_lens, 5, positions=only_positions)
    assert p is only_positions and b.dtype == np.int32
    with pytest.raises(TypeError, match="^batch_indices: expected int32"):
        tessera.get_batch_indices_positions(append_indptr, seq_lens, 5, np.zeros(5, np.int64))
    with pytest.raises(ValueError, match="^positions: expected shape"):
        tessera.get_batch_indices_positions(append_indptr, seq_lens, 5, positions=np.zeros(4, np.int32))


# ======================================================================= features Tessera lacks
_T = np.zeros(4, np.float32)  # any tensor
_Q, _K = np.zeros((3, HQ, 64), np.float32), np.zeros((5, HKV, 64), np.float32)

NOT_SUPPORTED = [  # (argument the message names, call)
    ("backend", lambda: decode_w(backend="trtllm-gen")),
    ("jit_args", lambda: paged_w(jit_args=["x"])),
    ("jit_kwargs", lambda: paged_w(jit_kwargs={"x": 1})),
    ("variant_owns_mask", lambda: ragged_w(variant_owns_mask=True)),
    ("window_right", lambda: decode_w().plan(**DECODE, window_right=4)),
    ("block_tables", lambda: decode_w().plan(**DECODE, block_tables=np.zeros((2, 2), np.int32))),
    ("seq_lens", lambda: decode_w().plan(**DECODE, seq_lens=np.array([5, 31]))),
    ("skip_softmax_threshold_scale_factor", lambda: decode_w().run(_Q, (_K, _K),
                                                                   skip_softmax_threshold_scale_factor=0.5)),
    ("kv_cache_sf", lambda: decode_w().run(_Q, (_K, _K), kv_cache_sf=(_T, _T))),
    ("args", lambda: decode_w().run(_Q, (_K, _K), _T)),
    ("prefix_len_ptr", lambda: paged_w().plan(**PAGED, prefix_len_ptr=_T)),
    ("token_pos_in_items_ptr", lambda: paged_w().plan(**PAGED, token_pos_in_items_ptr=_T)),
    ("token_pos_in_items_len", lambda: paged_w().plan(**PAGED, token_pos_in_items_len=8)),
    ("max_item_len_ptr", lambda: paged_w().plan(**PAGED, max_item_len_ptr=_T)),
    ("block_tables", lambda: paged_w().plan(**PAGED, block_tables=np.zeros((2, 2), np.int32))),
    ("seq_lens", lambda: paged_w().plan(**PAGED, seq_lens=np.array([5, 30]))),
    ("seq_lens_q", lambda: paged_w().plan(**PAGED, seq_lens_q=np.array([2, 2]))),
    ("head_dim_vo", lambda: paged_w().plan(**PAGED, head_dim_vo=64)),
    ("kv_cache_sf", lambda: paged_w().run(_Q, (_K, _K), kv_cache_sf=_T)),
    ("skip_softmax_threshold_scale_factor", lambda: paged_w().run(_Q, (_K, _K),
                                                                  skip_softmax_threshold_scale_factor=1.0)),
    ("use_fp16_softmax", lambda: paged_w().run(_Q, (_K, _K), use_fp16_softmax=True)),
    ("uses_spcompress", lambda: paged_w().run(_Q, (_K, _K), uses_spcompress=True)),
    ("lse_layout", lambda: paged_w().run(_Q, (_K, _K), return_lse=True, lse_layout="HN")),
    ("v_indptr", lambda: ragged_w().plan(**RAGGED, v_indptr=[0, 5, 9])),
    ("o_indptr", lambda: ragged_w().plan(**RAGGED, o_indptr=[0, 3, 5])),
    ("o_scale", lambda: ragged_w().run(_Q, _K, _K, o_scale=2.0)),
    ("block_mask", lambda: bsr_w().plan(**BSR, block_mask=np.ones((1, 2, 2), bool))),
    ("kv_splits", lambda: bsr_w().plan(**BSR, kv_splits=2)),
    ("use_clc", lambda: bsr_w().plan(**BSR, use_clc=True)),
    ("q_scale", lambda: bsr_w().plan(**BSR, q_scale=_T)),
    ("scale_q", lambda: bsr_w().run(_Q, _K, _K, _T)),
    ("scale_k", lambda: tessera.single_prefill_with_kv_cache(_Q, _K, _K, scale_k=_T)),
    ("kv_cache_sf", lambda: tessera.single_prefill_with_kv_cache(_Q, _K, _K, kv_cache_sf=(_T, _T))),
    ("backend", lambda: tessera.single_prefill_with_kv_cache(_Q, _K, _K, backend="cudnn")),
    ("o_dtype", lambda: tessera.single_prefill_with_kv_cache(_Q, _K, _K, o_dtype="float16")),
    ("window_left", lambda: tessera.MultiLevelCascadeAttentionWrapper(2, buf()).plan(**CASCADE, window_left=8)),
    ("pos_encoding_mode", lambda: tessera.MultiLevelCascadeAttentionWrapper(2, buf()).plan(
        **CASCADE, pos_encoding_mode="ROPE_LLAMA")),
    ("q_scale", lambda: W.run_scales(-1.0, 128, _T, None, None)),
]


@pytest.mark.parametrize("name, call", NOT_SUPPORTED, ids=[f"{i}-{n}" for i, (n, _) in enumerate(NOT_SUPPORTED)])
def test_unsupported_values_raise_not_supported_error(name, call):
    with pytest.raises(tessera.NotSupportedError, match=f"^{name}=.*: not supported yet") as info:
        call()
    assert isinstance(info.value, NotImplementedError) and isinstance(info.value, ValueError)


ACCEPTED = [  # values that equal what Tessera derives, or change nothing: every check passes
    lambda: decode_w().plan(**DECODE, window_right=-1, fixed_split_size=-1, q_len_per_req=1, is_causal=False,
                            disable_split_kv=True, seq_lens=np.array([5, 32]), non_blocking=False,
                            block_tables=np.array([[0, -1, -1], [2, 1, 7]], np.int32)),
    lambda: decode_w().plan(**DECODE, block_tables=[[0, 9], [2, 1]], q_len_per_req=2),
    lambda: paged_w().plan(**PAGED, seq_lens=np.array([5, 32]), seq_lens_q=np.array([2, 3]), uniform_q_len=3,
                           max_token_per_sequence=3, max_sequence_kv=64, fixed_split_size=None,
                           disable_split_kv=False, token_pos_in_items_len=0,
                           block_tables=np.array([[0, 0], [2, 1]], np.int64)),
    lambda: ragged_w().plan(**RAGGED, v_indptr=np.array([0, 4, 9]), o_indptr=[0, 2, 5], seq_lens=[4, 5],
                            max_sequence_kv=5),
    lambda: bsr_w().plan(**BSR, o_data_type="bfloat16", kv_splits=None, use_clc=None),
]


@pytest.mark.parametrize("call", ACCEPTED)
def test_values_that_say_nothing_new_are_accepted(call):
    with pytest.raises(TypeError, match=HOST_WORKSPACE):
        call()


@pytest.mark.parametrize("error, name, call", [
    (ValueError, "q_len_per_req", lambda: decode_w().plan(**DECODE, q_len_per_req=0)),
    (TypeError, "is_causal", lambda: decode_w().plan(**DECODE, q_len_per_req=2, is_causal="yes")),
    (TypeError, "window_right", lambda: decode_w().plan(**DECODE, window_right=0.5)),
    (TypeError, "disable_split_kv", lambda: decode_w().plan(**DECODE, disable_split_kv="yes")),
    (ValueError, "seq_lens", lambda: decode_w().plan(**DECODE, seq_lens=np.array([5]))),
    (ValueError, "block_tables", lambda: decode_w().plan(**DECODE, block_tables=np.array([[0], [2]], np.int32))),
    (ValueError, "block_tables", lambda: decode_w().plan(**DECODE, block_tables=np.array([0, 2, 1], np.int32))),
    (TypeError, "block_tables", lambda: paged_w().plan(**PAGED, block_tables=np.zeros((2, 2), np.float32))),
    (ValueError, "max_token_per_sequence", lambda: paged_w().plan(**PAGED, max_token_per_sequence=2)),
    (ValueError, "max_sequence_kv", lambda: ragged_w().plan(**RAGGED, max_sequence_kv=4)),
    (TypeError, "uniform_q_len", lambda: paged_w().plan(**PAGED, uniform_q_len=2.5)),
    (ValueError, "lse_base", lambda: paged_w().run(_Q, (_K, _K), lse_base="e")),
    (ValueError, "pos_encoding_mode", lambda: paged_w().plan(**PAGED, pos_encoding_mode="rope")),
])
def test_bad_values_of_supported_arguments_are_not_not_supported(error, name, call):
    """A wrong value of a supported argument is a ValueError / TypeError naming it, not NotSupportedError."""
    with pytest.raises(error, match=f"^{name}") as info:
        call()
    assert not isinstance(info.value, tessera.NotSupportedError)


# ======================================================================= calling conventions
def test_decode_plan_options_by_position_follow_flashinfer_order():
    """Options after page_size by position: FlashInfer's legacy order, with a DeprecationWarning."""
    positional = list(DECODE.values())
    with pytest.warns(DeprecationWarning, match="by position is deprecated"):
        with pytest.raises(ValueError, match="^sm_scale"):  # the 8th option is sm_scale
            decode_w().plan(*positional, "NONE", -1, None, "float16", None, None, None, -1.0)
    # The 14th option is fixed_split_size (pages): accepted, so the CPU
    # workspace is what stops this plan.
    with pytest.warns(DeprecationWarning), pytest.raises(TypeError, match="^float_workspace_buffer"):
        decode_w().plan(*positional, "NONE", -1, None, "float16", None, None, None, None, None, None, True, None,
                        None, 8)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        with pytest.raises(TypeError, match="multiple values for argument 'window_left'"):
            decode_w().plan(*positional, "NONE", 4, window_left=4)
        with pytest.raises(TypeError, match="at most 16"):
            decode_w().plan(*positional, *([None] * 17))
    with pytest.raises(TypeError, match="unexpected keyword argument 'bogus'"):
        decode_w().plan(**DECODE, bogus=1)


class _Planned:
    """A stand-in wrapper recording plan() calls, for forward()'s re-planning."""

    def __init__(self):
        self.calls = []

    @C.recorded_plan
    def plan(self, qo_indptr, kv_indptr, causal=False, sm_scale=None, q_data_type="float16"):
        self.calls.append(dict(qo_indptr=qo_indptr, kv_indptr=kv_indptr, causal=causal, sm_scale=sm_scale,
                               q_data_type=q_data_type))


def test_forward_replans_only_when_its_options_differ():
    w = _Planned()
    with pytest.raises(ValueError, match="^forward: expected plan"):
        C.replan(w, _Planned.plan, dict(causal=True))
    w.plan([0, 2], [0, 4], q_data_type="bfloat16")
    C.replan(w, _Planned.plan, dict(causal=False, sm_scale=None))
    assert len(w.calls) == 1
    C.replan(w, _Planned.plan, dict(causal=True, sm_scale=None))
    assert w.calls[-1] == dict(qo_indptr=[0, 2], kv_indptr=[0, 4], causal=True, sm_scale=None,
                               q_data_type="bfloat16")
    C.replan(w, _Planned.plan, dict(causal=True))  # the new options stay, as FlashInfer's forward() leaves them
    assert len(w.calls) == 2
    for wrapper, args in ((decode_w(), ()), (paged_w(), ()), (ragged_w(), (_K,)), (bsr_w(), (_K,))):
        with pytest.raises(ValueError, match="^forward: expected plan"):
            wrapper.forward(_Q, (_K, _K) if not args else _K, *args)


def test_reset_workspace_buffer_takes_any_dtype():
    for make, args in ((decode_w, DECODE), (paged_w, PAGED), (ragged_w, RAGGED), (bsr_w, BSR)):
        w = make()
        w.reset_workspace_buffer(buf(np.float32), buf(np.int8))
        with pytest.raises(TypeError, match=HOST_WORKSPACE):
            w.plan(**args)
        with pytest.raises(TypeError, match="^int_workspace_buffer"):
            w.reset_workspace_buffer(buf(), [0] * 4)
    cascade = tessera.MultiLevelCascadeAttentionWrapper(2, buf())
    cascade.reset_workspace_buffer(buf(np.float64), [buf(np.uint8), buf(np.uint8)])
    with pytest.raises(TypeError, match=r"^int_workspace_buffers\[1\]"):
        cascade.reset_workspace_buffer(buf(), [buf(), None])


def test_cuda_graph_decode_wrapper_fixes_its_bounds():
    w = tessera.CUDAGraphBatchDecodeWithPagedKVCacheWrapper(buf(), buf(np.int32, 9), buf(np.int32, 100),
                                                            buf(np.int32, 8), "HND", True)
    assert w.is_cuda_graph_enabled and w.use_tensor_cores
    assert (w._fixed_batch, w._fixed_pages, w._kv_layout) == (8, 100, "HND")
    with pytest.raises(ValueError, match="^paged_kv_last_page_len_buffer"):
        tessera.CUDAGraphBatchDecodeWithPagedKVCacheWrapper(buf(), buf(np.int32, 9), buf(np.int32, 100),
                                                            buf(np.int32, 7))


@pytest.mark.parametrize("k_scale, v_scale", [(None, None), (0.5, None), (None, 3.0), (2.0, 0.25)])
def test_single_prefill_cpu_k_scale_and_v_scale(rng, k_scale, v_scale):
    """As FlashInfer applies them: k_scale multiplies the softmax scale, v_scale the output."""
    q = rng.standard_normal((6, 4, 64)).astype(np.float32)
    k, v = (rng.standard_normal((9, 2, 64)).astype(np.float32) for _ in range(2))
    o, lse = tessera.single_prefill_with_kv_cache(q, k, v, causal=True, sm_scale=0.2, k_scale=k_scale,
                                                  v_scale=v_scale, o_dtype=np.float32, return_lse=True)
    ref_o, ref_lse = ref_request(q, k, v, True, 0.2 * (k_scale or 1.0))
    assert rel_error(o, ref_o * (v_scale or 1.0)) < 1e-5
    np.testing.assert_allclose(lse, ref_lse, rtol=1e-5)


def test_finish_lse_converts_to_natural_log():
    lse = np.array([[1.0, -np.inf], [0.0, 3.0]], np.float32)
    np.testing.assert_array_equal(C.finish_lse(lse.copy(), "log2"), lse)
    np.testing.assert_allclose(C.finish_lse(lse.copy(), "ln"), lse * np.log(2.0), rtol=1e-6)


# ======================================================================= GPU
def _gpu_step(torch, rng, kv_lens=(7, 300, 1, 90), q_lens=(3, 17, 1, 9), page_size=16):
    """One paged step on the GPU: (table as int32 numpy, cache, decode q, prefill q, qo_indptr)."""
    table = make_table(rng, list(kv_lens), page_size)
    cache, _, _ = random_cache(torch, rng, "NHD", table[3], page_size, HEAD_DIM, torch.float16, False)
    qo = indptr_of(list(q_lens))
    q_prefill = uniform(torch, rng, (int(qo[-1]), HQ, HEAD_DIM), torch.float16, -2.0, 2.0)
    q_decode = uniform(torch, rng, (len(kv_lens), HQ, HEAD_DIM), torch.float16, -2.0, 2.0)
    return table[:3], cache, q_decode, q_prefill, qo


def _workspace(torch, dtype="uint8"):
    t = getattr(torch, dtype)
    return torch.empty(WORKSPACE_BYTES // torch.tensor([], dtype=t).element_size(), dtype=t, device="cuda")


@pytest.mark.parametrize("dtype", ["int8", "float32", "float64"])
def test_gpu_workspace_dtype_and_int64_indices_change_nothing(torch_cuda, rng, dtype):
    torch = torch_cuda
    table, cache, qd, qp, qo = _gpu_step(torch, rng)
    outs = []
    for ws_dtype, index in (("uint8", lambda x: x), (dtype, lambda x: torch.from_numpy(x.astype(np.int64)).cuda())):
        dec = tessera.BatchDecodeWithPagedKVCacheWrapper(_workspace(torch, ws_dtype))
        dec.plan(*(index(x) for x in table), HQ, HKV, HEAD_DIM, 16)
        pre = tessera.BatchPrefillWithPagedKVCacheWrapper(_workspace(torch, ws_dtype))
        pre.plan(index(qo), *(index(x) for x in table), HQ, HKV, HEAD_DIM, 16, causal=True)
        outs.append((dec.run(qd, cache), pre.run(qp, cache)))
    torch.cuda.synchronize()
    assert torch.equal(outs[0][0], outs[1][0]) and torch.equal(outs[0][1], outs[1][1])


def test_gpu_forward_is_plan_with_its_options_then_run(torch_cuda, rng):
    torch = torch_cuda
    table, cache, qd, qp, qo = _gpu_step(torch, rng)
    ws = _workspace(torch)
    pre = tessera.BatchPrefillWithPagedKVCacheWrapper(ws)
    pre.begin_forward(qo, *table, HQ, HKV, HEAD_DIM, 16)  # the old API: options come with forward()
    got, got_lse = pre.forward_return_lse(qp, cache, causal=True, sm_scale=0.1)
    again = pre.run(qp, cache)  # forward()'s options stay, as in FlashInfer
    ref = tessera.BatchPrefillWithPagedKVCacheWrapper(_workspace(torch))
    ref.plan(qo, *table, HQ, HKV, HEAD_DIM, 16, causal=True, sm_scale=0.1)
    want, want_lse = ref.run(qp, cache, return_lse=True)
    dec = tessera.BatchDecodeWithPagedKVCacheWrapper(_workspace(torch))
    dec.plan(*table, HQ, HKV, HEAD_DIM, 16)
    got_dec = dec.forward(qd, cache, sm_scale=0.07)
    ref_dec = tessera.BatchDecodeWithPagedKVCacheWrapper(_workspace(torch))
    ref_dec.plan(*table, HQ, HKV, HEAD_DIM, 16, sm_scale=0.07)
    want_dec = ref_dec.run(qd, cache)
    torch.cuda.synchronize()
    assert torch.equal(got, want) and torch.equal(got_lse, want_lse) and torch.equal(again, want)
    assert torch.equal(got_dec, want_dec)


def test_gpu_lse_base_ln(torch_cuda, rng):
    torch = torch_cuda
    table, cache, _, qp, qo = _gpu_step(torch, rng)
    w = tessera.BatchPrefillWithPagedKVCacheWrapper(_workspace(torch))
    w.plan(qo, *table, HQ, HKV, HEAD_DIM, 16, causal=True)
    _, log2 = w.run(qp, cache, return_lse=True)
    _, ln = w.run(qp, cache, return_lse=True, lse_base="ln")
    torch.cuda.synchronize()
    np.testing.assert_allclose(to_np(ln), to_np(log2) * np.log(2.0), rtol=1e-6)


def test_gpu_cuda_graph_decode_wrapper_and_disable_split_kv(torch_cuda, rng):
    torch = torch_cuda
    table, cache, qd, _, _ = _gpu_step(torch, rng, kv_lens=(4000, 3, 2500, 700))
    plain = tessera.BatchDecodeWithPagedKVCacheWrapper(_workspace(torch))
    plain.plan(*table, HQ, HKV, HEAD_DIM, 16)
    want = plain.run(qd, cache)
    graph = tessera.CUDAGraphBatchDecodeWithPagedKVCacheWrapper(
        _workspace(torch), torch.empty(5, dtype=torch.int32, device="cuda"),
        torch.empty(len(table[1]) + 8, dtype=torch.int32, device="cuda"),
        torch.empty(4, dtype=torch.int32, device="cuda"))
    graph.plan(*table, HQ, HKV, HEAD_DIM, 16)
    unsplit = tessera.BatchDecodeWithPagedKVCacheWrapper(_workspace(torch))
    unsplit.plan(*table, HQ, HKV, HEAD_DIM, 16, disable_split_kv=True)
    outs = graph.run(qd, cache), unsplit.run(qd, cache)
    torch.cuda.synchronize()
    for o in outs:
        assert rel_error(to_np(o), to_np(want)) < 2e-3


def test_gpu_reset_workspace_buffer_needs_a_new_plan(torch_cuda, rng):
    torch = torch_cuda
    table, cache, _, qp, qo = _gpu_step(torch, rng)
    w = tessera.BatchPrefillWithPagedKVCacheWrapper(_workspace(torch))
    w.plan(qo, *table, HQ, HKV, HEAD_DIM, 16, causal=True)
    want = w.run(qp, cache)
    w.reset_workspace_buffer(_workspace(torch, "float32"), torch.empty(8 << 20, dtype=torch.uint8, device="cuda"))
    with pytest.raises(ValueError, match="plan"):
        w.run(qp, cache)
    w.plan(qo, *table, HQ, HKV, HEAD_DIM, 16, causal=True)
    got = w.run(qp, cache)
    torch.cuda.synchronize()
    assert torch.equal(got, want)


def test_gpu_single_prefill_o_dtype_and_scales(torch_cuda, rng):
    torch = torch_cuda
    q = uniform(torch, rng, (33, HQ, 64), torch.float16, -2.0, 2.0)
    k, v = (uniform(torch, rng, (70, HKV, 64), torch.float16) for _ in range(2))
    o, lse = tessera.single_prefill_with_kv_cache_return_lse(q, k, v, o_dtype=torch.bfloat16, causal=True,
                                                             sm_scale=0.1, k_scale=2.0, v_scale=0.5)
    torch.cuda.synchronize()
    assert o.dtype == torch.bfloat16
    ref_o, ref_lse = ref_request(to_np(q), to_np(k), to_np(v), True, 0.2)
    assert rel_error(to_np(o), 0.5 * ref_o) < 1e-2
    np.testing.assert_allclose(to_np(lse), ref_lse, rtol=1e-3, atol=1e-3)


def test_gpu_batch_indices_positions_outputs(torch_cuda):
    torch = torch_cuda
    append_indptr = torch.tensor([0, 2, 2, 5], dtype=torch.int64, device="cuda")
    seq_lens = torch.tensor([10, 4, 3], dtype=torch.int32, device="cuda")
    batch = torch.full((7,), 99, dtype=torch.int32, device="cuda")
    positions = torch.full((7,), 99, dtype=torch.int32, device="cuda")
    got = tessera.get_batch_indices_positions(append_indptr, seq_lens, 7, batch, positions)
    assert got[0] is batch and got[1] is positions
    # FlashInfer fills a given batch_indices with -1 first but leaves a given positions' padding as it was.
    assert batch.tolist() == [0, 0, 2, 2, 2, -1, -1] and positions.tolist() == [8, 9, 0, 1, 2, 99, 99]
    _, fresh = tessera.get_batch_indices_positions(append_indptr, seq_lens, 7)
    assert fresh.tolist() == [8, 9, 0, 1, 2, 0, 0]


def test_fixed_split_size_values():
    """fixed_split_size: None / -1 (the planner's own chunks) or a page count >= 1; bools and 0 are refused, by
    decode and both prefill wrappers; disable_split_kv must be a bool."""
    plans = (lambda **kw: decode_w().plan(**DECODE, **kw), lambda **kw: paged_w().plan(**PAGED, **kw),
             lambda **kw: ragged_w().plan(**RAGGED, **kw))
    for plan in plans:
        for ok in (None, -1, 1, 8):  # accepted: the CPU workspace is what stops these plans
            with pytest.raises(TypeError, match="^float_workspace_buffer"):
                plan(fixed_split_size=ok, disable_split_kv=ok == 1)
        with pytest.raises(ValueError, match="^fixed_split_size"):
            plan(fixed_split_size=0)
        with pytest.raises(TypeError, match="^fixed_split_size"):
            plan(fixed_split_size=True)
        with pytest.raises(TypeError, match="^disable_split_kv"):
            plan(disable_split_kv="yes")
