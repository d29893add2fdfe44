"""tessera.single_decode_with_kv_cache against a float64 numpy softmax.

CPU tests (numpy, and the same path any CPU tensor takes) run everywhere;
GPU tests cover float16/bfloat16 x head dims 64/128/256 x GQA group sizes
1/4/8 x NHD/HND x kv_len 1, 33 and 4097, and skip with "skipped: no GPU"
without a CUDA device. Outputs start as NaN (the `poison` fixture).
"""

import numpy as np
import pytest

import tessera
from conftest import TOL, assert_lse_close, ref_decode, rel_error, to_np

NUM_KV_HEADS = 2


def make_qkv(rng, group, head_dim, kv_len, layout, dtype, num_kv_heads=NUM_KV_HEADS):
    """Random q [Hq, D] and k, v in the given layout, as numpy arrays of dtype."""
    q = rng.standard_normal((num_kv_heads * group, head_dim)).astype(dtype)
    shape = (kv_len, num_kv_heads, head_dim) if layout == "NHD" else (num_kv_heads, kv_len, head_dim)
    k = rng.standard_normal(shape).astype(dtype)
    v = rng.standard_normal(shape).astype(dtype)
    return q, k, v


# ======================================================================= CPU
@pytest.mark.parametrize("dtype", ["float16", "float32"])
@pytest.mark.parametrize("layout", ["NHD", "HND"])
@pytest.mark.parametrize("group", [1, 4])
@pytest.mark.parametrize("kv_len", [1, 17, 300])
def test_decode_cpu(rng, dtype, layout, group, kv_len):
    q, k, v = make_qkv(rng, group, 64, kv_len, layout, dtype)
    o, lse = tessera.single_decode_with_kv_cache(q, k, v, kv_layout=layout, return_lse=True)
    assert o.dtype == np.dtype(dtype) and o.shape == q.shape
    assert lse.dtype == np.float32 and lse.shape == (q.shape[0],)
    o_ref, lse_ref = ref_decode(q, k, v, layout)
    assert rel_error(o, o_ref) < TOL[dtype]
    assert_lse_close(lse, lse_ref, 1e-4)


def test_decode_cpu_kv_len_1_returns_v(rng):
    """With one key every head's output is exactly its KV head's value."""
    q, k, v = make_qkv(rng, 4, 64, 1, "NHD", np.float32)
    o = tessera.single_decode_with_kv_cache(q, k, v)
    np.testing.assert_allclose(o, np.repeat(v[0], 4, axis=0), rtol=1e-6)


def test_decode_cpu_sm_scale(rng):
    q, k, v = make_qkv(rng, 2, 64, 40, "NHD", np.float32)
    o, lse = tessera.single_decode_with_kv_cache(q, k, v, sm_scale=0.3, return_lse=True)
    o_ref, lse_ref = ref_decode(q, k, v, sm_scale=0.3)
    assert rel_error(o, o_ref) < TOL["float32"]
    assert_lse_close(lse, lse_ref, 1e-4)
    o_default = tessera.single_decode_with_kv_cache(q, k, v)
    assert rel_error(o_default, o_ref) > 1e-3  # the scale really was applied


def test_decode_cpu_gqa_mapping(rng):
    """Query head h reads KV head h // group: make KV heads distinguishable by value."""
    q, k, v = make_qkv(rng, 4, 64, 5, "NHD", np.float32, num_kv_heads=2)
    v[:, 0, :] = 1.0
    v[:, 1, :] = -1.0
    o = tessera.single_decode_with_kv_cache(q, k, v)
    np.testing.assert_allclose(o[:4], 1.0, rtol=1e-6)
    np.testing.assert_allclose(o[4:], -1.0, rtol=1e-6)


def test_decode_cpu_without_lse_returns_array(rng):
    q, k, v = make_qkv(rng, 1, 64, 3, "HND", np.float16)
    o = tessera.single_decode_with_kv_cache(q, k, v, kv_layout="HND")
    assert isinstance(o, np.ndarray) and o.shape == q.shape


def test_decode_cpu_torch_tensors(rng):
    """torch CPU tensors take the CPU path and come back as torch tensors."""
    try:
        import torch
    except ImportError:
        pytest.skip("skipped: no torch")
    q, k, v = make_qkv(rng, 2, 64, 9, "NHD", np.float32)
    o, lse = tessera.single_decode_with_kv_cache(torch.from_numpy(q).half(), torch.from_numpy(k).half(),
                                                 torch.from_numpy(v).half(), return_lse=True)
    assert isinstance(o, torch.Tensor) and o.dtype == torch.float16 and lse.dtype == torch.float32
    o_ref, lse_ref = ref_decode(q.astype(np.float16), k.astype(np.float16), v.astype(np.float16))
    assert rel_error(to_np(o), o_ref) < TOL["float16"]
    assert_lse_close(to_np(lse), lse_ref, 1e-4)


# ======================================================================= GPU
def to_gpu(torch, x, dtype):
    return torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32)).to("cuda").to(getattr(torch, dtype))


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("head_dim", [64, 128, 256])
@pytest.mark.parametrize("group", [1, 4, 8])
@pytest.mark.parametrize("layout", ["NHD", "HND"])
@pytest.mark.parametrize("kv_len", [1, 33, 4097])
def test_decode_gpu(torch_cuda, rng, poison, dtype, head_dim, group, layout, kv_len):
    torch = torch_cuda
    q, k, v = make_qkv(rng, group, head_dim, kv_len, layout, np.float32)
    tq, tk, tv = (to_gpu(torch, x, dtype) for x in (q, k, v))
    o, lse = tessera.single_decode_with_kv_cache(tq, tk, tv, kv_layout=layout, return_lse=True)
    torch.cuda.synchronize()
    assert o.is_cuda and o.dtype == tq.dtype and o.shape == tq.shape
    assert lse.dtype == torch.float32 and lse.shape == (tq.shape[0],)
    o_ref, lse_ref = ref_decode(to_np(tq), to_np(tk), to_np(tv), layout)
    err = rel_error(to_np(o), o_ref)
    assert err < TOL[dtype], f"error {err}"
    assert_lse_close(to_np(lse), lse_ref, 1e-3)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_decode_gpu_strided_kv_and_side_stream(torch_cuda, rng, poison, dtype):
    """KV as a slice of a wider cache (padded strides), launched on a non-default torch stream."""
    torch = torch_cuda
    q, k, v = make_qkv(rng, 4, 128, 517, "NHD", np.float32)
    wide_k = to_gpu(torch, np.concatenate([k, k], axis=-1), dtype)  # [L, Hkv, 2D]
    wide_v = to_gpu(torch, np.concatenate([v, v], axis=-1), dtype)
    tk, tv, tq = wide_k[..., :128], wide_v[..., :128], to_gpu(torch, q, dtype)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        o, lse = tessera.single_decode_with_kv_cache(tq, tk, tv, return_lse=True)
    side.synchronize()
    o_ref, lse_ref = ref_decode(to_np(tq), to_np(tk), to_np(tv))
    assert rel_error(to_np(o), o_ref) < TOL[dtype]
    assert_lse_close(to_np(lse), lse_ref, 1e-3)


def test_decode_gpu_deterministic(torch_cuda, rng):
    torch = torch_cuda
    q, k, v = make_qkv(rng, 8, 128, 4097, "HND", np.float32)
    tq, tk, tv = (to_gpu(torch, x, "float16") for x in (q, k, v))
    a = tessera.single_decode_with_kv_cache(tq, tk, tv, kv_layout="HND", return_lse=True)
    b = tessera.single_decode_with_kv_cache(tq, tk, tv, kv_layout="HND", return_lse=True)
    torch.cuda.synchronize()
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])


def test_decode_gpu_lse_merges_with_split_kv(torch_cuda, rng):
    """Decoding two halves of the KV and merging the states equals decoding all of it (base-2 LSE end to end)."""
    torch = torch_cuda
    q, k, v = make_qkv(rng, 4, 128, 1000, "NHD", np.float32)
    tq, tk, tv = (to_gpu(torch, x, "float16") for x in (q, k, v))
    o1, s1 = tessera.single_decode_with_kv_cache(tq, tk[:300], tv[:300], return_lse=True)
    o2, s2 = tessera.single_decode_with_kv_cache(tq, tk[300:], tv[300:], return_lse=True)
    o, s = tessera.merge_state(o1[None], s1[None], o2[None], s2[None])
    torch.cuda.synchronize()
    o_ref, lse_ref = ref_decode(to_np(tq), to_np(tk), to_np(tv))
    assert rel_error(to_np(o[0]), o_ref) < 2e-3
    assert_lse_close(to_np(s[0]), lse_ref, 1e-3)
