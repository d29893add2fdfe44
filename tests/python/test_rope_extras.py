"""FlashInfer's Llama 3.1 RoPE (apply_llama31_rope*) and the vLLM / SGLang
style cos/sin cache RoPE (apply_rope_with_cos_sin_cache*), against float64
numpy references written from the formulas: Hugging Face's "llama3"
frequency rule by wavelength, and the rotation x' = x cos - partner sin,
partner' = partner cos + x sin with each pair's cos / sin read from the
cache. CPU tests use numpy inputs (the C++ CPU path); GPU tests poison nothing
they do not check and skip with "skipped: no GPU".
"""

import numpy as np
import pytest

import tessera
from conftest import TOL, rel_error, to_np


def pair_columns(rd, interleave):
    """(first, second) feature indices of the rotary_dim / 2 pairs."""
    if interleave:
        return np.arange(0, rd, 2), np.arange(1, rd, 2)
    return np.arange(rd // 2), np.arange(rd // 2, rd)


def rotate_np(x, cos, sin, interleave):
    """x [n, H, D] with pair j of row n turned by cos[n, j], sin[n, j] (rotary_dim = 2 * cos.shape[1])."""
    x = np.array(x, dtype=np.float64)
    a_idx, b_idx = pair_columns(2 * cos.shape[1], interleave)
    a, b = x[..., a_idx].copy(), x[..., b_idx].copy()
    c, s = cos[:, None, :], sin[:, None, :]
    x[..., a_idx] = a * c - b * s
    x[..., b_idx] = b * c + a * s
    return x


def llama31_freqs(rd, scale, theta, low, high, old):
    """Radians per position of each pair under Llama 3.1 scaling (by wavelength, as Hugging Face writes it)."""
    f = theta ** (-2.0 * np.arange(rd // 2) / rd)
    wavelen = 2 * np.pi / f
    blend = (old / wavelen - low) / (high - low)
    return np.where(wavelen < old / high, f, np.where(wavelen > old / low, f / scale, (1 - blend) * f / scale + blend * f))


def rope_freqs_np(x, pos, freqs, interleave):
    ang = np.asarray(pos, dtype=np.float64)[:, None] * freqs[None, :]
    return rotate_np(x, np.cos(ang), np.sin(ang), interleave)


def qk(rng, n=9, hq=4, hk=2, d=128, dtype=np.float16):
    return rng.uniform(-2, 2, (n, hq, d)).astype(dtype), rng.uniform(-2, 2, (n, hk, d)).astype(dtype)


# ------------------------------------------------------------------ Llama 3.1
@pytest.mark.parametrize("interleave", [False, True])
def test_llama31_rope_cpu(interleave, rng):
    q, k = qk(rng)
    pos = np.array([0, 5, 100, 999, 4000, 8191, 20000, 65000, 123456], np.int32)
    opts = dict(rope_scale=4.0, rope_theta=1e5, low_freq_factor=2, high_freq_factor=8.0, old_context_len=2048)
    freqs = llama31_freqs(128, 4.0, 1e5, 2, 8.0, 2048)
    qr, kr = tessera.apply_llama31_rope_pos_ids(q, k, pos, interleave=interleave, **opts)
    assert rel_error(qr, rope_freqs_np(q, pos, freqs, interleave)) < TOL["float16"]
    assert rel_error(kr, rope_freqs_np(k, pos, freqs, interleave)) < TOL["float16"]
    q2, k2 = q.copy(), k.copy()
    assert tessera.apply_llama31_rope_pos_ids_inplace(q2, k2, pos, interleave=interleave, **opts) is None
    np.testing.assert_array_equal(q2, qr)
    np.testing.assert_array_equal(k2, kr)
    # Ragged: requests [0, 4) at 7000 and [4, 9) at 0.
    ragged = np.concatenate([np.arange(4) + 7000, np.arange(5)])
    qr, kr = tessera.apply_llama31_rope(q, k, [0, 4, 9], [7000, 0], interleave=interleave, **opts)
    assert rel_error(qr, rope_freqs_np(q, ragged, freqs, interleave)) < TOL["float16"]
    assert rel_error(kr, rope_freqs_np(k, ragged, freqs, interleave)) < TOL["float16"]
    q3, k3 = q.copy(), k.copy()
    tessera.apply_llama31_rope_inplace(q3, k3, np.array([0, 4, 9]), np.array([7000, 0]), interleave=interleave, **opts)
    np.testing.assert_array_equal(q3, qr)
    # rotary_dim: Llama 3.1 frequencies of the first 64 features, the rest unchanged.
    q4, _ = tessera.apply_llama31_rope_pos_ids(q, k, pos, rotary_dim=64, interleave=interleave, **opts)
    want = rope_freqs_np(q[..., :64], pos, llama31_freqs(64, 4.0, 1e5, 2, 8.0, 2048), interleave)
    assert rel_error(q4[..., :64], want) < TOL["float16"]
    np.testing.assert_array_equal(q4[..., 64:], q[..., 64:])


def test_llama31_rope_defaults_are_flashinfers(rng):
    """rope_scale=8, rope_theta=5e5, low 1, high 4, old_context_len 8192; not the linear rule at the same scale."""
    q, k = qk(rng, n=4)
    pos = np.array([10, 3000, 50000, 131000], np.int32)
    qr, _ = tessera.apply_llama31_rope_pos_ids(q, k, pos)
    assert rel_error(qr, rope_freqs_np(q, pos, llama31_freqs(128, 8, 5e5, 1, 4, 8192), False)) < TOL["float16"]
    linear, _ = tessera.apply_rope_pos_ids(q, k, pos, rope_scale=8, rope_theta=5e5)
    assert rel_error(qr, linear) > 0.1


def test_llama31_rope_errors():
    q, k = np.zeros((3, 4, 128), np.float16), np.zeros((3, 2, 128), np.float16)
    with pytest.raises(ValueError, match="^low_freq_factor"):
        tessera.apply_llama31_rope_pos_ids(q, k, [0, 1, 2], low_freq_factor=0)
    with pytest.raises(ValueError, match="^high_freq_factor"):
        tessera.apply_llama31_rope_pos_ids(q, k, [0, 1, 2], low_freq_factor=4, high_freq_factor=4)
    with pytest.raises(ValueError, match="^old_context_len"):
        tessera.apply_llama31_rope(q, k, [0, 3], [0], old_context_len=0)
    with pytest.raises(TypeError, match="^old_context_len"):
        tessera.apply_llama31_rope_inplace(q, k, [0, 3], [0], old_context_len="8192")
    with pytest.raises(TypeError, match="^high_freq_factor"):
        tessera.apply_llama31_rope_pos_ids_inplace(q, k, [0, 1, 2], high_freq_factor=None)
    with pytest.raises(ValueError, match="^rope_scale"):
        tessera.apply_llama31_rope_pos_ids(q, k, [0, 1, 2], rope_scale=-8)
    with pytest.raises(ValueError, match="^rotary_dim"):
        tessera.apply_llama31_rope_pos_ids(q, k, [0, 1, 2], rotary_dim=40)
    with pytest.raises(ValueError, match="^offsets"):
        tessera.apply_llama31_rope(q, k, [0, 3], [0, 0])


# ------------------------------------------------------------------ cos/sin cache
def random_cache(rng, rows, rd):
    """Arbitrary values, not unit (cos, sin) pairs: a misread column cannot pass."""
    return rng.uniform(-1.25, 1.25, (rows, rd)).astype(np.float32)


def cache_np(x, pos, cache, interleave):
    half = cache.shape[1] // 2
    c, s = cache[pos, :half].astype(np.float64), cache[pos, half:].astype(np.float64)
    x = np.array(x, dtype=np.float64)
    rd = cache.shape[1]
    out = x.copy()
    out[..., :rd] = rotate_np(x[..., :rd], c, s, interleave)
    return out


@pytest.mark.parametrize("is_neox", [True, False])
@pytest.mark.parametrize("rd", [128, 64])
def test_cos_sin_cache_cpu(is_neox, rd, rng):
    n, hq, hk, d = 7, 4, 2, 128
    query = rng.uniform(-2, 2, (n, hq * d)).astype(np.float16)
    key = rng.uniform(-2, 2, (n, hk * d)).astype(np.float16)
    cache = random_cache(rng, 50, rd)
    positions = np.array([0, 49, 3, 3, 20, 7, 11], np.int64)
    q_out, k_out = tessera.apply_rope_with_cos_sin_cache(positions, query, key, d, cache, is_neox=is_neox)
    assert q_out.shape == query.shape and k_out.shape == key.shape and q_out.dtype == np.float16
    want_q = cache_np(query.reshape(n, hq, d), positions, cache, not is_neox).reshape(n, -1)
    want_k = cache_np(key.reshape(n, hk, d), positions, cache, not is_neox).reshape(n, -1)
    assert rel_error(q_out, want_q) < TOL["float16"]
    assert rel_error(k_out, want_k) < TOL["float16"]
    q2, k2 = query.copy(), key.copy()
    assert tessera.apply_rope_with_cos_sin_cache_inplace(positions, q2, k2, d, cache, is_neox) is None
    np.testing.assert_array_equal(q2, q_out)
    np.testing.assert_array_equal(k2, k_out)


@pytest.mark.parametrize("is_neox", [True, False])
def test_cos_sin_cache_of_real_angles_matches_apply_rope(is_neox, rng):
    """A vLLM-built cache (cos | sin of pos * theta^(-2j / rd)) gives apply_rope_pos_ids' result."""
    n, d, rd = 6, 64, 32
    query = rng.uniform(-2, 2, (n, 3 * d)).astype(np.float16)
    key = rng.uniform(-2, 2, (n, 1 * d)).astype(np.float16)
    inv_freq = 1e4 ** (-np.arange(0, rd, 2) / rd)
    ang = np.arange(300)[:, None] * inv_freq[None, :]
    cache = np.concatenate([np.cos(ang), np.sin(ang)], axis=1).astype(np.float32)
    positions = rng.integers(0, 300, n)
    q_out, k_out = tessera.apply_rope_with_cos_sin_cache(positions, query, key, d, cache, is_neox)
    q_ref, k_ref = tessera.apply_rope_pos_ids(query.reshape(n, 3, d), key.reshape(n, 1, d), positions, rotary_dim=rd,
                                              interleave=not is_neox)
    assert rel_error(q_out.reshape(n, 3, d), to_np(q_ref)) < TOL["float16"]
    assert rel_error(k_out.reshape(n, 1, d), to_np(k_ref)) < TOL["float16"]


def test_cos_sin_cache_takes_3d_and_strided_rows(rng):
    n, d = 5, 64
    q3 = rng.uniform(-2, 2, (n, 2, d)).astype(np.float16)
    k3 = rng.uniform(-2, 2, (n, 1, d)).astype(np.float16)
    wide = random_cache(rng, 12, 64)
    cache = wide[:, :48]  # rows 64 floats apart
    pos = np.array([11, 0, 4, 4, 9])
    qo, ko = tessera.apply_rope_with_cos_sin_cache(pos, q3, k3, d, cache)
    assert qo.shape == q3.shape
    assert rel_error(qo, cache_np(q3, pos, cache, False)) < TOL["float16"]
    assert rel_error(ko, cache_np(k3, pos, cache, False)) < TOL["float16"]


def test_cos_sin_cache_errors(rng):
    n, d = 3, 128
    query, key = np.zeros((n, 4 * d), np.float16), np.zeros((n, 2 * d), np.float16)
    cache, pos = np.zeros((10, 64), np.float32), np.array([0, 1, 2])
    f = tessera.apply_rope_with_cos_sin_cache
    with pytest.raises(ValueError, match="^cos_sin_cache: expected float32"):
        f(pos, query, key, d, cache.astype(np.float16))
    with pytest.raises(ValueError, match="^cos_sin_cache"):
        f(pos, query, key, d, np.zeros((10, 24), np.float32))
    with pytest.raises(ValueError, match="^cos_sin_cache"):
        f(pos, query, key, d, np.zeros((10, 256), np.float32))  # rotary_dim > head_size
    with pytest.raises(ValueError, match="^head_size"):
        f(pos, query, key, 96, cache)
    with pytest.raises(TypeError, match="^head_size"):
        f(pos, query, key, 128.0, cache)
    with pytest.raises(ValueError, match="^query"):
        f(pos, np.zeros((n, 200), np.float16), key, d, cache)
    with pytest.raises(ValueError, match="^key"):
        f(pos, query, np.zeros((n + 1, 2 * d), np.float16), d, cache)
    with pytest.raises(ValueError, match="^positions: expected shape"):
        f(np.array([0, 1]), query, key, d, cache)
    with pytest.raises(ValueError, match="^positions: expected values in"):
        f(np.array([0, 10, 1]), query, key, d, cache)
    with pytest.raises(ValueError, match="^positions: expected values in"):
        f(np.array([0, -1, 1]), query, key, d, cache)
    with pytest.raises(TypeError, match="^positions"):
        f(np.array([0.0, 1.0, 2.0]), query, key, d, cache)
    with pytest.raises(TypeError, match="^key"):
        f(pos, query, key.astype(np.float32), d, cache)
    with pytest.raises(TypeError, match="^query"):
        f(pos, query.tolist(), key, d, cache)
    # query is seen as [n, heads, head_size] without a copy (in place must reach it), features contiguous.
    with pytest.raises(ValueError, match="^query: expected a layout"):
        tessera.apply_rope_with_cos_sin_cache_inplace(pos, np.zeros((n, 4, d), np.float16).transpose(0, 2, 1), key, d,
                                                      cache)
    with pytest.raises(ValueError, match="^query: expected contiguous features"):
        tessera.apply_rope_with_cos_sin_cache_inplace(pos, np.zeros((4 * d, n), np.float16).T, key, d, cache)


# ------------------------------------------------------------------ GPU
@pytest.mark.parametrize("interleave", [False, True])
def test_llama31_rope_gpu(torch_cuda, rng, interleave):
    torch = torch_cuda
    q = torch.empty(300, 8, 128, dtype=torch.float16).uniform_(-3, 3)
    k = torch.empty(300, 2, 128, dtype=torch.float16).uniform_(-3, 3)
    # Positions below ~1000 (float frequencies carry ~1e-7 relative error); a short old context so every band shows.
    pos = torch.from_numpy(rng.integers(0, 1000, 300).astype(np.int64))
    opts = dict(rope_scale=8, rope_theta=5e5, low_freq_factor=1, high_freq_factor=5, old_context_len=600)
    freqs = llama31_freqs(128, 8, 5e5, 1, 5, 600)
    qg, kg = tessera.apply_llama31_rope_pos_ids(q.cuda(), k.cuda(), pos.cuda(), interleave=interleave, **opts)
    assert rel_error(to_np(qg), rope_freqs_np(to_np(q), to_np(pos), freqs, interleave)) < TOL["float16"]
    assert rel_error(to_np(kg), rope_freqs_np(to_np(k), to_np(pos), freqs, interleave)) < TOL["float16"]
    qi, ki = q.cuda(), k.cuda()
    tessera.apply_llama31_rope_inplace(qi, ki, torch.tensor([0, 100, 300]), torch.tensor([5, 0]),
                                       interleave=interleave, **opts)
    ragged = np.concatenate([np.arange(100) + 5, np.arange(200)])
    assert rel_error(to_np(qi), rope_freqs_np(to_np(q), ragged, freqs, interleave)) < TOL["float16"]
    assert rel_error(to_np(ki), rope_freqs_np(to_np(k), ragged, freqs, interleave)) < TOL["float16"]
    # The GPU agrees with the CPU path.
    qc, _ = tessera.apply_llama31_rope_pos_ids(q, k, pos, interleave=interleave, **opts)
    assert rel_error(to_np(qg), to_np(qc)) < TOL["float16"]


@pytest.mark.parametrize("is_neox", [True, False])
@pytest.mark.parametrize("rd", [128, 64])
def test_cos_sin_cache_gpu(torch_cuda, rng, is_neox, rd):
    torch = torch_cuda
    n, hq, hk, d, rows = 257, 8, 2, 128, 4096
    query = torch.empty(n, hq * d, dtype=torch.bfloat16, device="cuda").uniform_(-3, 3)
    key = torch.empty(n, hk * d, dtype=torch.bfloat16, device="cuda").uniform_(-3, 3)
    cache = torch.from_numpy(random_cache(rng, rows, rd)).cuda()
    positions = torch.from_numpy(rng.integers(0, rows, n)).cuda()  # int64, as vLLM passes them
    q_out, k_out = tessera.apply_rope_with_cos_sin_cache(positions, query, key, d, cache, is_neox)
    assert q_out.shape == query.shape and q_out.dtype == query.dtype and q_out.device == query.device
    pos_np = to_np(positions).astype(np.int64)
    want_q = cache_np(to_np(query).reshape(n, hq, d), pos_np, to_np(cache), not is_neox).reshape(n, -1)
    want_k = cache_np(to_np(key).reshape(n, hk, d), pos_np, to_np(cache), not is_neox).reshape(n, -1)
    assert rel_error(to_np(q_out), want_q) < TOL["bfloat16"]
    assert rel_error(to_np(k_out), want_k) < TOL["bfloat16"]
    q2, k2 = query.clone(), key.clone()
    tessera.apply_rope_with_cos_sin_cache_inplace(positions, q2, k2, d, cache, is_neox)
    assert torch.equal(q2, q_out) and torch.equal(k2, k_out)
    # A position past the cache: NaN in that row's rotated features (never a read out of bounds).
    far = positions.clone()
    far[0] = rows
    q3, _ = tessera.apply_rope_with_cos_sin_cache(far, query, key, d, cache, is_neox)
    row = q3[0].view(hq, d)
    assert torch.isnan(row[:, :rd]).all() and torch.equal(row[:, rd:], query[0].view(hq, d)[:, rd:])
    assert not torch.isnan(q3[1:]).any()
