"""Bad input is rejected with the right Python exception and a message that
names the offending argument: dtype/device/type problems -> TypeError,
shape/value problems -> ValueError, unsupported FlashInfer options ->
ValueError("... not supported yet").
"""

import numpy as np
import pytest

import tessera
from conftest import ref_decode, rel_error
from tessera import _C


def states(n=4, h=2, d=64, dtype=np.float16):
    rng = np.random.default_rng(0)
    return rng.standard_normal((n, h, d)).astype(dtype), np.zeros((n, h), np.float32)


def qkv(hq=4, hkv=2, d=64, kv_len=8, dtype=np.float16):
    rng = np.random.default_rng(0)
    q = rng.standard_normal((hq, d)).astype(dtype)
    k = rng.standard_normal((kv_len, hkv, d)).astype(dtype)
    return q, k, k.copy()


# ------------------------------------------------------------------ dtype -> TypeError
def test_merge_wrong_value_dtype():
    v, s = states()
    with pytest.raises(TypeError, match="v_a"):
        tessera.merge_state(v.astype(np.float64), s, v, s)


def test_merge_wrong_lse_dtype():
    v, s = states()
    with pytest.raises(TypeError, match="s_b"):
        tessera.merge_state(v, s, v, s.astype(np.float16))


def test_merge_values_dtype_mismatch():
    v, s = states()
    with pytest.raises(TypeError, match="v_b"):
        tessera.merge_state(v, s, v.astype(np.float32), s)


def test_ragged_indptr_wrong_dtype():
    v, s = states()
    with pytest.raises(TypeError, match="indptr"):
        tessera.merge_states_ragged(v, s, np.array([0, 2, 4], dtype=np.int64))


def test_decode_wrong_dtype():
    q, k, v = qkv()
    with pytest.raises(TypeError, match="q"):
        tessera.single_decode_with_kv_cache(q.astype(np.int32), k, v)
    with pytest.raises(TypeError, match="k"):
        tessera.single_decode_with_kv_cache(q, k.astype(np.float64), v)


def test_not_a_tensor():
    v, s = states()
    with pytest.raises(TypeError, match="s_a"):
        tessera.merge_state(v, s.tolist(), v, s)
    q, k, v = qkv()
    with pytest.raises(TypeError, match="k"):
        tessera.single_decode_with_kv_cache(q, "cache", v)


def test_low_level_rejects_read_only_output():
    v, s = states()
    out = np.empty_like(v)
    out.flags.writeable = False
    with pytest.raises(TypeError, match="v_out"):
        _C.merge_state(v, s, v, s, out, None)


# ------------------------------------------------------------------ shape / value -> ValueError
def test_merge_shape_mismatch():
    v, s = states()
    with pytest.raises(ValueError, match="s_a"):
        tessera.merge_state(v, s[:3], v, s)
    v2, s2 = states(n=5)
    with pytest.raises(ValueError, match="v_b"):
        tessera.merge_state(v, s, v2, s2)


def test_merge_unsupported_head_dim():
    v, s = states(d=12)
    with pytest.raises(ValueError, match="v_a"):
        tessera.merge_state(v, s, v, s)


def test_merge_states_needs_4d():
    v, s = states()
    with pytest.raises(ValueError, match="v"):
        tessera.merge_states(v, s)


def test_merge_states_lse_shape():
    v = np.zeros((3, 2, 4, 64), np.float16)
    with pytest.raises(ValueError, match="s"):
        tessera.merge_states(v, np.zeros((3, 4, 2), np.float32))


@pytest.mark.parametrize("indptr", [[0, 3, 2, 4], [1, 2, 4], [0, 2, 5], [0, 2, 3]])
def test_ragged_bad_indptr(indptr):
    """Non-monotone, not starting at 0, or not ending at the state count."""
    v, s = states()
    with pytest.raises(ValueError, match="indptr"):
        tessera.merge_states_ragged(v, s, np.array(indptr, dtype=np.int32))


def test_ragged_empty_indptr():
    v, s = states()
    with pytest.raises(ValueError, match="indptr"):
        tessera.merge_states_ragged(v, s, np.zeros(0, np.int32))


def test_in_place_mask_shape():
    v, s = states()
    with pytest.raises(ValueError, match="mask"):
        tessera.merge_state_in_place(v, s, v, s, mask=np.ones(3, dtype=bool))


def test_decode_shape_mismatch():
    q, k, v = qkv()
    with pytest.raises(ValueError, match="v"):
        tessera.single_decode_with_kv_cache(q, k, v[:4])
    with pytest.raises(ValueError, match="q"):
        tessera.single_decode_with_kv_cache(q[:, :32], k, v)
    with pytest.raises(ValueError, match="q"):
        tessera.single_decode_with_kv_cache(q[None], k, v)


def test_decode_heads_not_divisible():
    q, k, v = qkv(hq=6, hkv=4)
    with pytest.raises(ValueError, match="q"):
        tessera.single_decode_with_kv_cache(q, k, v)


def test_decode_bad_layout():
    q, k, v = qkv()
    with pytest.raises(ValueError, match="kv_layout"):
        tessera.single_decode_with_kv_cache(q, k, v, kv_layout="NDH")


def test_decode_bad_sm_scale():
    q, k, v = qkv()
    with pytest.raises(ValueError, match="sm_scale"):
        tessera.single_decode_with_kv_cache(q, k, v, sm_scale=-1.0)


@pytest.mark.parametrize(
    "option, value, error",
    [
        ("pos_encoding_mode", "XPOS", ValueError),
        ("rope_scale", 1.0, ValueError),
        ("rope_theta", 1e4, ValueError),
        ("q_scale", 0.0, ValueError),
        ("k_scale", -0.5, ValueError),
        ("v_scale", float("nan"), ValueError),
        ("k_scale", "2", TypeError),
        ("q_scale", True, TypeError),
    ],
)
def test_decode_unsupported_option(option, value, error):
    """Modes other than NONE / ROPE_LLAMA, RoPE parameters without ROPE_LLAMA, and bad q / k / v scales."""
    q, k, v = qkv()
    with pytest.raises(error) as info:
        tessera.single_decode_with_kv_cache(q, k, v, **{option: value})
    assert option in str(info.value)


def test_decode_q_k_v_scales_cpu():
    """FlashInfer's scales on a 16-bit cache: q_scale * k_scale multiply sm_scale, v_scale the output."""
    q, k, v = qkv(kv_len=12, dtype=np.float32)
    v = np.random.default_rng(2).standard_normal(v.shape).astype(np.float32)
    d = q.shape[-1]
    got = tessera.single_decode_with_kv_cache(q, k, v, q_scale=1.5, k_scale=2.0, v_scale=0.25)
    want = tessera.single_decode_with_kv_cache(q, k, v, sm_scale=3.0 / np.sqrt(d)) * 0.25
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)
    same = tessera.single_decode_with_kv_cache(q, k, v, q_scale=1.0, k_scale=1.0, v_scale=1.0)
    np.testing.assert_array_equal(same, tessera.single_decode_with_kv_cache(q, k, v))


@pytest.mark.parametrize("window_left, logits_soft_cap", [(3, None), (-1, 2.0), (0, 1.5), (100, 4.0)])
def test_decode_window_and_soft_cap_cpu(window_left, logits_soft_cap):
    """single_decode's CPU path honours FlashInfer's window_left / logits_soft_cap (the numpy formula agrees)."""
    q, k, v = qkv(kv_len=12, dtype=np.float32)
    v = np.random.default_rng(1).standard_normal(v.shape).astype(np.float32)
    o, lse = tessera.single_decode_with_kv_cache(q * 4, k, v, window_left=window_left,
                                                 logits_soft_cap=logits_soft_cap, return_lse=True)
    ref_o, ref_lse = ref_decode(q * 4, k, v, window_left=window_left, logits_soft_cap=logits_soft_cap or 0.0)
    assert rel_error(o, ref_o) < 1e-5
    np.testing.assert_allclose(lse, ref_lse, rtol=1e-5)
    plain = tessera.single_decode_with_kv_cache(q * 4, k, v)
    assert rel_error(plain, ref_o) > 1e-3  # the options change the result


def test_decode_bad_window_and_soft_cap():
    q, k, v = qkv()
    with pytest.raises(ValueError, match="window_left"):
        tessera.single_decode_with_kv_cache(q, k, v, window_left=-5)
    with pytest.raises(ValueError, match="logits_soft_cap"):
        tessera.single_decode_with_kv_cache(q, k, v, logits_soft_cap=-2.0)


def test_decode_default_options_accepted():
    """FlashInfer's defaults (and the no-op values) are not rejected."""
    q, k, v = qkv()
    o = tessera.single_decode_with_kv_cache(q, k, v, pos_encoding_mode="NONE", use_tensor_cores=True,
                                            window_left=-1, logits_soft_cap=0.0)
    assert o.shape == q.shape and not np.isnan(o.astype(np.float32)).any()


def test_compile_builtin_bad_arch():
    with pytest.raises(ValueError, match="arch"):
        tessera.compile_builtin("sm_xyz")


def test_gpu_status_is_consistent():
    assert isinstance(tessera.gpu_available(), bool)
    assert (tessera.no_gpu_reason() == "") == tessera.gpu_available()
    assert isinstance(tessera.cache_dir(), str) and tessera.cache_dir()


# ------------------------------------------------------------------ GPU: devices and kernel limits
def test_merge_mismatched_devices_gpu(torch_cuda):
    torch = torch_cuda
    v = torch.zeros(4, 2, 64, dtype=torch.float16, device="cuda")
    s = torch.zeros(4, 2, dtype=torch.float32, device="cuda")
    with pytest.raises((TypeError, ValueError), match="s_a"):
        tessera.merge_state(v, s.cpu(), v, s)
    with pytest.raises((TypeError, ValueError), match="indptr"):
        tessera.merge_states_ragged(v, s, torch.tensor([0, 4], dtype=torch.int32))


def test_decode_mismatched_devices_gpu(torch_cuda):
    torch = torch_cuda
    q = torch.zeros(4, 64, dtype=torch.float16, device="cuda")
    k = torch.zeros(8, 2, 64, dtype=torch.float16, device="cuda")
    with pytest.raises((TypeError, ValueError), match="k"):
        tessera.single_decode_with_kv_cache(q, k.cpu(), k)
    with pytest.raises((TypeError, ValueError), match="k"):
        tessera.single_decode_with_kv_cache(q.cpu(), k, k)


def test_decode_gpu_limits(torch_cuda):
    torch = torch_cuda
    k = torch.zeros(8, 2, 64, dtype=torch.float16, device="cuda")
    with pytest.raises(TypeError, match="q"):
        tessera.single_decode_with_kv_cache(torch.zeros(4, 64, device="cuda"), k, k)  # float32 on the GPU
    k96 = torch.zeros(8, 2, 96, dtype=torch.float16, device="cuda")
    with pytest.raises(ValueError, match="head_dim"):
        tessera.single_decode_with_kv_cache(torch.zeros(4, 96, dtype=torch.float16, device="cuda"), k96, k96)


def test_mixing_numpy_and_torch():
    try:
        import torch
    except ImportError:
        pytest.skip("skipped: no torch")
    v, s = states()
    with pytest.raises(TypeError, match="s_a"):
        tessera.merge_state(v, torch.from_numpy(s), v, s)
