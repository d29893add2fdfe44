"""Head dims beyond 64 / 128 / 256 without a GPU: head_dim_qk 192 with
head_dim_vo 128 (DeepSeek-style) and head dim 512 (Gemma 3). The CPU path
(single_prefill / single_decode on host tensors) against the float64
reference (prefill_reference.py, conftest.ref_decode), the float64 C++
oracle against the numpy one, and the plan() checks every wrapper runs
before it needs the GPU: supported pairs pass them, others raise naming
head_dim_vo / head_dim. The GPU runs are in test_head_dims.py.
"""

import numpy as np
import pytest

import tessera
from conftest import ref_decode, rel_error
from prefill_reference import HKV, cpu_paged, expect, paged_args, ref_request
from tessera import _C


def _normal(rng, shape, scale=1.0):
    return (rng.standard_normal(shape) * scale).astype(np.float32)


# ======================================================================= CPU path
@pytest.mark.parametrize("qk, vo, causal, window_left, logits_soft_cap", [
    (192, 128, True, -1, None), (192, 128, False, 9, 20.0), (512, 512, True, 6, None), (512, 512, False, -1, 30.0)])
def test_single_prefill_cpu(rng, qk, vo, causal, window_left, logits_soft_cap):
    """o has v's head dim; the default sm_scale is 1 / sqrt(head_dim_qk)."""
    q = _normal(rng, (13, 8, qk), 2.0)
    k, v = _normal(rng, (29, HKV, qk)), _normal(rng, (29, HKV, vo))
    o, lse = tessera.single_prefill_with_kv_cache(q, k, v, causal=causal, window_left=window_left,
                                                  logits_soft_cap=logits_soft_cap, return_lse=True)
    assert o.shape == (13, 8, vo) and lse.shape == (13, 8)
    ref_o, ref_lse = ref_request(q, k, v, causal, window_left=window_left, logits_soft_cap=logits_soft_cap or 0.0)
    assert rel_error(o, ref_o) < 1e-5
    np.testing.assert_allclose(lse, ref_lse, rtol=1e-5, atol=1e-5)
    # HND views of the same KV (k and v with their own head dims).
    o_hnd = tessera.single_prefill_with_kv_cache(q, k.swapaxes(0, 1).copy(), v.swapaxes(0, 1).copy(), causal=causal,
                                                 window_left=window_left, logits_soft_cap=logits_soft_cap,
                                                 kv_layout="HND")
    np.testing.assert_array_equal(o_hnd, o)


def test_single_prefill_cpu_refuses_other_pairs(rng):
    q, k = _normal(rng, (3, 8, 128), 1.0), _normal(rng, (5, HKV, 128))
    expect(tessera.NotSupportedError, "^head_dim_vo=64: not supported yet",
           lambda: tessera.single_prefill_with_kv_cache(q, k, _normal(rng, (5, HKV, 64))))
    expect(ValueError, "^v:", lambda: tessera.single_prefill_with_kv_cache(q, k, _normal(rng, (6, HKV, 128))))


@pytest.mark.parametrize("layout, window_left, logits_soft_cap", [("NHD", -1, None), ("HND", 17, 30.0)])
def test_single_decode_cpu_head_dim_512(rng, layout, window_left, logits_soft_cap):
    q = _normal(rng, (8, 512), 2.0)
    shape = (45, HKV, 512) if layout == "NHD" else (HKV, 45, 512)
    k, v = _normal(rng, shape), _normal(rng, shape)
    o, lse = tessera.single_decode_with_kv_cache(q, k, v, kv_layout=layout, window_left=window_left,
                                                 logits_soft_cap=logits_soft_cap, return_lse=True)
    ref_o, ref_lse = ref_decode(q, k, v, layout, window_left=window_left, logits_soft_cap=logits_soft_cap or 0.0)
    assert rel_error(o, ref_o) < 1e-5
    np.testing.assert_allclose(lse, ref_lse, rtol=1e-5, atol=1e-5)


def test_oracle_matches_numpy_reference(rng):
    """The C++ float64 reference (the C++ GPU tests' oracle) computes 192 / 128 and 512 as the numpy one does."""
    for qk, vo in ((192, 128), (512, 512)):
        q = _normal(rng, (10, 4, qk))
        k, v = _normal(rng, (21, HKV, qk)), _normal(rng, (21, HKV, vo))
        o, lse = _C.reference_attention_ragged(q, [0, 4, 10], k, v, [0, 8, 21], causal=True, window_left=5)
        assert o.shape == (10, 4, vo)
        for a, b, c, d in ((0, 4, 0, 8), (4, 10, 8, 21)):
            ref_o, ref_lse = ref_request(q[a:b], k[c:d], v[c:d], True, window_left=5)
            np.testing.assert_allclose(o[a:b], ref_o, rtol=1e-12, atol=1e-12)
            np.testing.assert_allclose(lse[a:b], ref_lse, rtol=1e-12, atol=1e-12)


# ======================================================================= plan() checks without a GPU
def _ragged():
    return tessera.BatchPrefillWithRaggedKVCacheWrapper(np.zeros(16, np.uint8))


@pytest.mark.parametrize("qk, vo", [(192, 128), (512, None), (512, 512), (64, 64), (128, None)])
def test_plans_accept_supported_head_dims(qk, vo):
    """Supported dims pass every check plan() makes before the GPU (it stops at the host workspace)."""
    for kwargs in (dict(), dict(causal=True, window_left=32, logits_soft_cap=30.0),
                   dict(pos_encoding_mode="ROPE_LLAMA")):
        expect(TypeError, "float_workspace_buffer",
               lambda: cpu_paged().plan(**paged_args(head_dim_qk=qk, head_dim_vo=vo, **kwargs)))
        expect(TypeError, "float_workspace_buffer",
               lambda: _ragged().plan([0, 2], [0, 4], 8, HKV, qk, head_dim_vo=vo, **kwargs))


@pytest.mark.parametrize("qk, vo, error, name", [
    (128, 64, tessera.NotSupportedError, "^head_dim_vo=64: not supported yet"),
    (256, 128, tessera.NotSupportedError, "^head_dim_vo=128: not supported yet"),
    (512, 256, tessera.NotSupportedError, "^head_dim_vo=256: not supported yet"),
    (192, None, ValueError, "head_dim: expected 64, 128, 256 or 512"),
    (96, None, ValueError, "head_dim: expected 64, 128, 256 or 512"),
    (1024, 1024, ValueError, "head_dim: expected 64, 128, 256 or 512")])
def test_plans_refuse_other_head_dims(qk, vo, error, name):
    expect(error, name, lambda: cpu_paged().plan(**paged_args(head_dim_qk=qk, head_dim_vo=vo)))
    expect(error, name, lambda: _ragged().plan([0, 2], [0, 4], 8, HKV, qk, head_dim_vo=vo))


def test_workspace_sizes():
    """Partial states hold v's head dim: 192 / 128 needs what 128 does (same query tile, same CTAs per SM)."""
    def size(qk, vo=0):
        return _C.BatchPrefill.workspace_size("float16", "float16", "float16", qk, 8, HKV, 16, "NHD", True, 16, 4096,
                                              512, num_sms=132, cta_q=64, backend=1, head_dim_vo=vo)[0]
    assert size(192, 128) == size(128)
    assert size(512) > 0


@pytest.mark.parametrize("use_tensor_cores", [False, True])
def test_decode_plan_head_dim_512(use_tensor_cores):
    """512 passes decode's checks with either flag (the tensor-core path); what only the CUDA-core kernel does
    names head_dim."""
    def plan(**kwargs):
        w = tessera.BatchDecodeWithPagedKVCacheWrapper(np.zeros(16, np.uint8), use_tensor_cores=use_tensor_cores)
        return w.plan([0, 1], [0], [5], 8, HKV, 512, 16, **kwargs)
    expect(TypeError, "float_workspace_buffer", lambda: plan(q_data_type="bfloat16"))
    expect(TypeError, "float_workspace_buffer", lambda: plan(window_left=64, logits_soft_cap=30.0))
    expect(ValueError, "head_dim: 512", lambda: plan(q_data_type="float16", kv_data_type="bfloat16"))
    if not use_tensor_cores:  # with the flag, fp8 is refused for the tensor cores whatever the head dim
        expect(ValueError, "head_dim: 512", lambda: plan(kv_data_type="float8_e4m3fn"))
    other = tessera.BatchDecodeWithPagedKVCacheWrapper(np.zeros(16, np.uint8), use_tensor_cores=use_tensor_cores)
    expect(ValueError, "head_dim: expected 64, 128, 256 or 512", lambda: other.plan([0, 1], [0], [5], 8, HKV, 384, 16))


def test_decode_plan_keeps_cuda_core_dims():
    """head_dim 512 is the tensor cores'; the CUDA-core kernel's own dims are unchanged."""
    sizes = _C.BatchDecode.workspace_size("float16", "float16", "float16", 512, 8, HKV, 16, "NHD", 4, 64, num_sms=132,
                                          use_tensor_cores=False)
    assert sizes == _C.BatchDecode.workspace_size("float16", "float16", "float16", 512, 8, HKV, 16, "NHD", 4, 64,
                                                  num_sms=132, use_tensor_cores=True)
    with pytest.raises(ValueError, match="head_dim: 512"):
        _C.BatchDecode.workspace_size("float16", "float16", "float16", 512, 8, HKV, 16, "NHD", 4, 64, num_sms=132,
                                      cuda_cores=True)
