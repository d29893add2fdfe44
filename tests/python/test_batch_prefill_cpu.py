"""tessera prefill without a GPU: the wrappers' argument validation (every
bad argument a ValueError / TypeError naming it), single_prefill's CPU path
and the test oracle itself (prefill_reference.py) against the C++ float64
reference. The GPU tests are in test_batch_prefill.py."""

import numpy as np
import pytest

import tessera
from conftest import rel_error
from prefill_reference import (HKV, WORKSPACE_BYTES, cpu_paged, dense_mask, expect, indptr_of, paged_args, random_bsr,
                               ref_batch, ref_bsr_gathered, ref_request)
from tessera import _C


def test_constructor_options():
    for cls in (tessera.BatchPrefillWithPagedKVCacheWrapper, tessera.BatchPrefillWithRaggedKVCacheWrapper):
        buf = np.zeros(1024, np.uint8)
        expect(ValueError, "kv_layout", lambda: cls(buf, kv_layout="NDH"))
        expect(ValueError, "not supported yet", lambda: cls(buf, backend="cudnn"))
        assert cls(buf, backend="fa3") is not None  # the Hopper template (checked against the GPU at plan)
        expect(ValueError, "not supported yet", lambda: cls(buf, jit_args=["x"]))
        expect(TypeError, "float_workspace_buffer", lambda: cls([0] * 16))
        assert cls(buf, use_cuda_graph=True, backend="fa2").is_cuda_graph_enabled
    expect(ValueError, "^paged_kv_last_page_len_buf:", lambda: cpu_paged(
        qo_indptr_buf=np.zeros(5, np.int32), paged_kv_last_page_len_buf=np.zeros(3, np.int32)))
    expect(ValueError, "not supported yet", lambda: tessera.BlockSparseAttentionWrapper(np.zeros(16), "cudnn"))


@pytest.mark.parametrize("option, value, message", [
    ("pos_encoding_mode", "XPOS", "pos_encoding_mode"), ("rope_scale", 2.0, "rope_scale"),
    ("rope_theta", 1e4, "rope_theta"), ("head_dim_vo", 64, "not supported yet")])
def test_plan_rejects_unsupported_options(option, value, message):
    """ROPE_LLAMA and ALIBI are supported (test_pos_encoding.py); other modes, and RoPE parameters without it, are not."""
    expect(ValueError, message, lambda: cpu_paged().plan(**paged_args(**{option: value})))
    ragged = tessera.BatchPrefillWithRaggedKVCacheWrapper(np.zeros(16, np.uint8))
    expect(ValueError, message, lambda: ragged.plan([0, 2], [0, 4], 8, HKV, 128, **{option: value}))
    if option != "head_dim_vo":  # single_prefill has no head_dim_vo argument
        q = np.zeros((3, 8, 128), np.float32)
        expect(ValueError, message,
               lambda: tessera.single_prefill_with_kv_cache(q, q[:, :2], q[:, :2], **{option: value}))


def test_plan_window_and_soft_cap_validation_without_gpu():
    """Bad window_left / logits_soft_cap name the argument on every entry point; valid ones pass every check."""
    ragged = tessera.BatchPrefillWithRaggedKVCacheWrapper(np.zeros(16, np.uint8))
    q = np.zeros((3, 8, 128), np.float32)
    for opts, error, name in [(dict(window_left=-3), ValueError, "^window_left:"),
                              (dict(window_left=2.0), TypeError, "^window_left:"),
                              (dict(logits_soft_cap=-5.0), ValueError, "^logits_soft_cap:"),
                              (dict(logits_soft_cap=float("inf")), ValueError, "^logits_soft_cap:")]:
        expect(error, name, lambda: cpu_paged().plan(**paged_args(**opts)))
        expect(error, name, lambda: ragged.plan([0, 2], [0, 4], 8, HKV, 128, **opts))
        expect(error, name, lambda: tessera.single_prefill_with_kv_cache(q, q[:, :2], q[:, :2], **opts))
    mask = np.ones(2 * 4, bool)  # a custom mask combines with a window and a soft cap: only the workspace is wrong
    expect(TypeError, "float_workspace_buffer",
           lambda: ragged.plan([0, 2], [0, 4], 8, HKV, 128, custom_mask=mask, window_left=3, logits_soft_cap=5.0))
    expect(ValueError, "^window_left:", lambda: ragged.plan([0, 2], [0, 4], 8, HKV, 128, custom_mask=mask,
                                                            window_left=-2))
    for opts in (dict(window_left=64), dict(logits_soft_cap=30.0), dict(window_left=0, logits_soft_cap=50.0)):
        expect(TypeError, "float_workspace_buffer", lambda: cpu_paged().plan(**paged_args(causal=True, **opts)))
        expect(TypeError, "float_workspace_buffer", lambda: ragged.plan([0, 2], [0, 4], 8, HKV, 128, **opts))


@pytest.mark.parametrize("window_left, logits_soft_cap, causal", [(3, None, True), (-1, 2.0, False), (0, 1.5, True),
                                                                  (5, 4.0, False)])
def test_single_prefill_cpu_window_and_soft_cap(rng, window_left, logits_soft_cap, causal):
    q = rng.standard_normal((7, 8, 64)).astype(np.float32) * 3
    k, v = (rng.standard_normal((12, HKV, 64)).astype(np.float32) for _ in range(2))
    o, lse = tessera.single_prefill_with_kv_cache(q, k, v, causal=causal, window_left=window_left,
                                                  logits_soft_cap=logits_soft_cap, return_lse=True)
    ref_o, ref_lse = ref_request(q, k, v, causal, window_left=window_left, logits_soft_cap=logits_soft_cap or 0.0)
    assert rel_error(o, ref_o) < 1e-5
    np.testing.assert_allclose(lse, ref_lse, rtol=1e-5)
    assert rel_error(ref_request(q, k, v, causal)[0], ref_o) > 1e-3  # the options change the result


def test_plan_rechecks_changed_arguments_without_gpu():
    """plan() checks its scalar arguments only when they change: a valid plan (stopped by the workspace) must not
    let a later bad one through, on either wrapper."""
    w = cpu_paged()
    expect(TypeError, "float_workspace_buffer", lambda: w.plan(**paged_args()))
    expect(ValueError, "^head_dim", lambda: w.plan(**paged_args(head_dim_qk=80)))
    expect(TypeError, "float_workspace_buffer", lambda: w.plan(**paged_args(page_size=1)))
    expect(ValueError, "^page_size", lambda: w.plan(**paged_args(page_size=True)))  # == 1, but not a page size
    expect(TypeError, "float_workspace_buffer", lambda: w.plan(**paged_args(window_left=8)))
    expect(ValueError, "^window_left", lambda: w.plan(**paged_args(window_left=-3)))
    expect(TypeError, "^qo_indptr", lambda: w.plan(**paged_args(qo_indptr=np.array([0.0, 2.0]))))  # every time
    ragged = tessera.BatchPrefillWithRaggedKVCacheWrapper(np.zeros(16, np.uint8))
    expect(TypeError, "float_workspace_buffer", lambda: ragged.plan([0, 2], [0, 4], 8, HKV, 128))
    expect(ValueError, "^num_qo_heads", lambda: ragged.plan([0, 2], [0, 4], 6, 4, 128))


PAGED_PLAN_ERRORS = [  # plan() overrides, error, what the message names
    (dict(q_data_type="float32"), TypeError, "^q_data_type:"), (dict(head_dim_qk=80), ValueError, "^head_dim:"),
    (dict(kv_data_type="bfloat16"), TypeError, "kv_dtype"),  # the tensor-core kernel needs kv == q
    (dict(num_qo_heads=6, num_kv_heads=4), ValueError, "^num_qo_heads:"), (dict(page_size=0), ValueError, "^page_"),
    (dict(sm_scale=-1.0), ValueError, "^sm_scale:"), (dict(qo_indptr=np.array([0.0, 2.0])), TypeError, "^qo_indptr:"),
    (dict(paged_kv_indptr=[0, 3]), ValueError, "^paged_kv_indptr:"), (dict(qo_indptr=[]), ValueError, "^qo_indptr:"),
    # Valid options (dtype aliases included): the workspace is what is wrong.
    (dict(q_data_type="half", o_data_type="bfloat16"), TypeError, "float_workspace_buffer"),
    (dict(q_data_type=np.float16, causal=True), TypeError, "float_workspace_buffer"),
]


@pytest.mark.parametrize("overrides, error, name", PAGED_PLAN_ERRORS)
def test_paged_plan_validation_without_gpu(overrides, error, name):
    with pytest.raises(error, match=name):
        cpu_paged().plan(**paged_args(**overrides))


def test_ragged_plan_and_run_validation_without_gpu():
    expect(ValueError, "plan", lambda: cpu_paged().run(np.zeros((5, 8, 128), np.float16), (None, None)))
    ragged = tessera.BatchPrefillWithRaggedKVCacheWrapper(np.zeros(16, np.uint8))
    expect(ValueError, "^kv_indptr:", lambda: ragged.plan([0, 2, 3], [0, 4], 8, HKV, 128))
    expect(TypeError, "float_workspace_buffer", lambda: ragged.plan([0, 2, 3], [0, 4, 4], 8, HKV, 128, causal=True))


BSR_PLAN_ERRORS = [  # plan() overrides, error, what the message names
    (dict(M=6), ValueError, "^M:"), (dict(M=-4), ValueError, "^M:"), (dict(N=40), ValueError, "^N:"),
    (dict(N=32.0), ValueError, "^N:"), (dict(R=0), ValueError, "^R:"), (dict(indptr=[0, 1]), ValueError, "^indptr:"),
    (dict(mask=np.ones(4, bool)), ValueError, "^mask: expected shape"),
    (dict(packed_mask=np.ones(4, np.uint8)), ValueError, "^packed_mask: expected at least"),
    (dict(mask=np.ones((2, 4, 16)), indices=[0, 1]), TypeError, "^mask: expected a bool"),
    (dict(head_dim=96), ValueError, "^head_dim:"), (dict(causal=True), TypeError, "float_workspace_buffer"),
]


@pytest.mark.parametrize("overrides, error, name", BSR_PLAN_ERRORS)
def test_bsr_plan_validation_without_gpu(overrides, error, name):
    args = dict(indptr=[0, 1, 2], indices=[0, 1], M=8, N=32, R=4, C=16, num_qo_heads=8, num_kv_heads=HKV, head_dim=128)
    with pytest.raises(error, match=name):
        tessera.BlockSparseAttentionWrapper(np.zeros(16, np.uint8)).plan(**dict(args, **overrides))


def test_workspace_size_query():
    def size(batch, total_q, pages, sms=132, **kw):
        return _C.BatchPrefill.workspace_size("float16", "float16", "float16", 128, 32, 8, 16, "NHD", True, batch,
                                              total_q, pages, num_sms=sms, **kw)

    dev, host = size(64, 8192, 4096)
    assert 0 < host <= dev < WORKSPACE_BYTES
    assert size(64, 65536, 4096)[0] > dev and size(64, 8192, 65536)[0] > dev
    assert size(64, 8192, 4096, sms=16)[0] < dev  # fewer CTAs, fewer partial-state slots
    assert size(64, 8192, 4096, cta_q=16)[0] <= dev  # one tile size instead of the largest of all
    expect(ValueError, "max_total_q", lambda: size(1, 0, 1))
    expect(ValueError, "cta_q", lambda: size(1, 1, 1, cta_q=48))
    # Head groups (8 KV heads on 132 SMs: 4 groups of 2) plan twice the requests; auto (0) may group a first
    # plan of long prompts on the Hopper kernel's 128-row tiles, so it holds that layout too.
    off, on, auto = (size(64, 8192, 4096, cta_q=128, backend=2, group_heads=g)[1] for g in (1, 2, 0))
    assert on > off and auto == on
    expect(ValueError, "group_heads", lambda: size(1, 1, 1, group_heads=3))


def test_tile_and_tensor_core_query_tile_options():
    """tile= (the C++ PrefillTile: cta_kv, warps_q, warps_kv, stages; 0 = heuristic) and BatchDecode's
    tc_cta_q= are checked without a GPU: ValueError naming the field, TypeError for a malformed value."""
    def size(**kw):
        return _C.BatchPrefill.workspace_size("float16", "float16", "float16", 128, 32, 8, 16, "NHD", True, 8, 512,
                                              64, num_sms=132, **kw)

    assert size(tile=(64, 0, 0, 3))[0] > 0
    assert size(tile=(0, 2, 0, 0), cta_q=64, backend=1)[0] > 0  # an FA2 warp layout for a pinned query tile
    expect(ValueError, "tile.stages", lambda: size(tile=(0, 0, 0, 1)))
    expect(ValueError, "tile.cta_kv", lambda: size(tile=(40, 0, 0, 0)))
    expect(ValueError, "tile.warps_q", lambda: size(tile=(0, 4, 0, 0)))
    expect(ValueError, "tile.cta_kv", lambda: size(tile=(32, 0, 0, 0), cta_q=128, backend=2))
    for bad in [(64, 0, 0), "64,0,0,2", (64.5, 0, 0, 2)]:
        with pytest.raises(TypeError):
            size(tile=bad)

    def decode_size(**kw):
        return _C.BatchDecode.workspace_size("float16", "float16", "float16", 128, 32, 8, 16, "NHD", 8, 64,
                                             num_sms=132, **kw)

    assert decode_size(use_tensor_cores=True, tc_cta_q=64)[0] > 0
    expect(ValueError, "tc_cta_q", lambda: decode_size(use_tensor_cores=True, tc_cta_q=48))
    expect(ValueError, "tc_cta_q", lambda: decode_size(tc_cta_q=64))  # the CUDA-core path has no query tile


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("layout", ["NHD", "HND"])
def test_single_prefill_cpu(rng, causal, layout):
    q_len, kv_len, hq, d = 7, 12, 8, 64
    q = rng.standard_normal((q_len, hq, d)).astype(np.float32)
    k, v = (rng.standard_normal((kv_len, HKV, d)).astype(np.float32) for _ in range(2))
    kk, vv = (x.transpose(1, 0, 2).copy() for x in (k, v)) if layout == "HND" else (k, v)
    o, lse = tessera.single_prefill_with_kv_cache(q, kk, vv, causal=causal, kv_layout=layout, sm_scale=0.2,
                                                  return_lse=True)
    ref_o, ref_lse = ref_request(q, k, v, causal, 0.2)
    assert o.dtype == np.float32 and o.shape == q.shape and lse.shape == (q_len, hq)
    assert rel_error(o, ref_o) < 1e-5
    np.testing.assert_allclose(lse, ref_lse, rtol=1e-5)
    o2, _ = tessera.single_prefill_with_kv_cache_return_lse(q, kk, vv, causal=causal, kv_layout=layout, sm_scale=0.2)
    np.testing.assert_array_equal(o2, o)


def test_single_prefill_cpu_rows_without_keys(rng):
    """Causal with q_len > kv_len: the first rows see nothing (o = 0, lse = -inf); no keys at all likewise."""
    q = rng.standard_normal((5, 4, 64)).astype(np.float32)
    k = rng.standard_normal((2, 2, 64)).astype(np.float32)
    o, lse = tessera.single_prefill_with_kv_cache(q, k, k, causal=True, return_lse=True)
    assert np.all(o[:3] == 0) and np.all(np.isneginf(lse[:3])) and np.isfinite(lse[3:]).all()
    o, lse = tessera.single_prefill_with_kv_cache(q, k[:0], k[:0], return_lse=True)
    assert np.all(o == 0) and np.all(np.isneginf(lse))


_Q, _K = np.zeros((3, 8, 64), np.float32), np.zeros((5, 2, 64), np.float32)


@pytest.mark.parametrize("args, kwargs, error, name", [
    ((_Q, _K, _K), dict(kv_layout="HDN"), ValueError, "kv_layout"), ((_Q[0], _K, _K), {}, ValueError, "q"),
    ((_Q, _K, _K[0]), {}, ValueError, "v"), ((_Q, _K, _K), dict(sm_scale=0.0), ValueError, "sm_scale"),
    ((_Q, _K.tolist(), _K), {}, TypeError, "^k:"), ((_Q.astype(np.int32), _K, _K), {}, TypeError, "^q:")])
def test_single_prefill_bad_input(args, kwargs, error, name):
    with pytest.raises(error, match=name):
        tessera.single_prefill_with_kv_cache(*args, **kwargs)


def test_reference_matches_cpp_reference(rng):
    """The test oracle (ref_request) agrees with the C++ float64 reference, causal rows without keys included."""
    q_lens, kv_lens = [3, 9, 0, 4], [7, 3, 5, 0]
    qo, kv = indptr_of(q_lens), indptr_of(kv_lens)
    q = rng.standard_normal((int(qo[-1]), 8, 64)).astype(np.float32)
    k, v = (rng.standard_normal((int(kv[-1]), HKV, 64)).astype(np.float32) for _ in range(2))
    for causal in (False, True):
        o, lse = _C.reference_attention_ragged(q, qo.tolist(), k, v, kv.tolist(), 0.3, causal)
        ref_o, ref_lse = ref_batch(q, qo, lambda i: (k[kv[i]: kv[i + 1]], v[kv[i]: kv[i + 1]]), causal, 0.3)
        np.testing.assert_allclose(o, ref_o, atol=1e-9)
        np.testing.assert_array_equal(np.isneginf(lse), np.isneginf(ref_lse))
        np.testing.assert_allclose(lse[np.isfinite(lse)], ref_lse[np.isfinite(ref_lse)], rtol=1e-9)


def test_bsr_references_agree(rng):
    """Without causal, the dense-mask BSR reference equals the per-block-row gathered one."""
    R, C, MB, NB = 4, 2, 5, 6
    indptr, indices = random_bsr(rng, MB, NB)
    q = rng.standard_normal((MB * R, 8, 64))
    k, v = (rng.standard_normal((NB * C, HKV, 64)) for _ in range(2))
    dense = ref_request(q, k, v, False, visible=dense_mask(indptr, indices, MB * R, NB * C, R, C))
    gathered = ref_bsr_gathered(q, k, v, indptr, indices, R, C, False)
    for a, b in zip(dense, gathered):
        np.testing.assert_array_equal(np.isneginf(a), np.isneginf(b))
        np.testing.assert_allclose(np.where(np.isfinite(a), a, 0), np.where(np.isfinite(b), b, 0), atol=1e-12)
