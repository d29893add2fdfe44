"""FlashInfer's pos_encoding_mode ("ROPE_LLAMA", "ALIBI") on the decode and
prefill wrappers and the single-request functions, alone and with a sliding
window and a logits soft cap. ROPE_LLAMA is Llama RoPE fused into the kernel,
checked against a float64 reference that rotates q and k first, from the
formula (half-split pairs (j, j + d/2) turning by pos / rope_scale *
rope_theta^(-2j/d) radians; query i of a request at position i + kv_len -
qo_len, key j at j), then runs plain attention. ALIBI adds slope[h] * (j - i)
to each logit (FlashInfer's convention: i the query's index among the
request's new tokens), the standard slopes of the query heads. CPU
tests (single_decode / single_prefill on numpy, the argument checks) run
everywhere; GPU tests ("skipped: no GPU" without torch + CUDA) cover batch
decode on both paths, paged and ragged prefill on both templates, fp16 and
bf16, with outputs poisoned with NaN."""

import numpy as np
import pytest

import tessera
from conftest import TOL, ref_decode, rel_error, to_np
from prefill_reference import (HKV, check, expect, gather_pages, indptr_of, make_table, random_cache, ref_batch,
                               ref_request, run_batch, uniform, workspace)

ROPE_PARAMS = [(None, None), (2.0, 5e5)]  # (rope_scale, rope_theta); None = FlashInfer's defaults 1, 1e4


def rope_ref(x, pos, rope_scale=None, rope_theta=None):
    """x [n, heads, d] rotated at positions pos [n] (float64), Llama half-split layout."""
    x = np.asarray(x, dtype=np.float64)
    scale = 1.0 if rope_scale is None else rope_scale
    theta = 1e4 if rope_theta is None else rope_theta
    half = x.shape[-1] // 2
    freq = theta ** (-2.0 * np.arange(half) / x.shape[-1]) / scale
    ang = np.asarray(pos, dtype=np.float64)[:, None, None] * freq[None, None, :]
    c, s = np.cos(ang), np.sin(ang)
    a, b = x[..., :half], x[..., half:]
    return np.concatenate([a * c - b * s, b * c + a * s], axis=-1)


def rope_request(q, k, rope_scale, rope_theta):
    """One request's q [n, Hq, D] and k [L, Hkv, D], rotated at their bottom-right-aligned positions."""
    n, L = q.shape[0], k.shape[0]
    return (rope_ref(q, np.arange(n) + L - n, rope_scale, rope_theta), rope_ref(k, np.arange(L), rope_scale, rope_theta))


def rope_kwargs(rope_scale, rope_theta):
    return dict(pos_encoding_mode="ROPE_LLAMA", rope_scale=rope_scale, rope_theta=rope_theta)


# ======================================================================= CPU
@pytest.mark.parametrize("rope_scale, rope_theta", ROPE_PARAMS)
@pytest.mark.parametrize("layout", ["NHD", "HND"])
def test_single_decode_rope_cpu(rng, rope_scale, rope_theta, layout):
    hq, d, L = 8, 64, 37
    q = rng.standard_normal((hq, d)).astype(np.float32)
    k, v = (rng.standard_normal((L, HKV, d)).astype(np.float32) for _ in range(2))
    kk, vv = (k, v) if layout == "NHD" else (k.transpose(1, 0, 2).copy(), v.transpose(1, 0, 2).copy())
    o, lse = tessera.single_decode_with_kv_cache(q, kk, vv, kv_layout=layout, return_lse=True,
                                                 **rope_kwargs(rope_scale, rope_theta))
    qr, kr = rope_request(q[None], k, rope_scale, rope_theta)
    ref_o, ref_lse = ref_decode(qr[0], kr, v)
    assert rel_error(o, ref_o) < TOL["float32"]
    np.testing.assert_allclose(lse, ref_lse, atol=1e-4)
    # RoPE changes the result (the test would pass with the rotation ignored otherwise).
    assert rel_error(tessera.single_decode_with_kv_cache(q, kk, vv, kv_layout=layout), ref_o) > 1e-2


@pytest.mark.parametrize("rope_scale, rope_theta", ROPE_PARAMS)
@pytest.mark.parametrize("causal", [True, False])
def test_single_prefill_rope_cpu(rng, rope_scale, rope_theta, causal):
    hq, d, n, L = 4, 64, 9, 23  # a chunk of queries at the end of the keys
    q = rng.standard_normal((n, hq, d)).astype(np.float32)
    k, v = (rng.standard_normal((L, HKV, d)).astype(np.float32) for _ in range(2))
    o, lse = tessera.single_prefill_with_kv_cache(q, k, v, causal=causal, return_lse=True,
                                                  **rope_kwargs(rope_scale, rope_theta))
    qr, kr = rope_request(q, k, rope_scale, rope_theta)
    ref_o, ref_lse = ref_batch(qr, [0, n], lambda i: (kr, v), causal)
    assert rel_error(o, ref_o) < TOL["float32"]
    np.testing.assert_allclose(lse, ref_lse, atol=1e-4)


def test_rope_argument_errors():
    q, k = np.zeros((8, 64), np.float32), np.zeros((5, HKV, 64), np.float32)
    decode = lambda **kw: tessera.single_decode_with_kv_cache(q, k, k, **kw)  # noqa: E731
    expect(ValueError, "rope_scale", lambda: decode(pos_encoding_mode="ALIBI", rope_scale=2.0))
    expect(ValueError, "pos_encoding_mode", lambda: decode(pos_encoding_mode="XPOS"))
    expect(ValueError, "rope_scale", lambda: decode(pos_encoding_mode="ROPE_LLAMA", rope_scale=0.0))
    expect(ValueError, "rope_theta", lambda: decode(pos_encoding_mode="ROPE_LLAMA", rope_theta=float("inf")))
    expect(TypeError, "rope_scale", lambda: decode(pos_encoding_mode="ROPE_LLAMA", rope_scale="2"))
    expect(ValueError, "rope_theta", lambda: decode(rope_theta=1e4))  # without ROPE_LLAMA
    # The wrappers check at plan(), without a GPU.
    dec = tessera.BatchDecodeWithPagedKVCacheWrapper(np.zeros(1024, np.uint8))
    expect(ValueError, "pos_encoding_mode",
           lambda: dec.plan([0, 1], [0], [3], 8, HKV, 64, 16, pos_encoding_mode="ALiBi"))
    pre = tessera.BatchPrefillWithRaggedKVCacheWrapper(np.zeros(1024, np.uint8))
    expect(ValueError, "rope_theta",
           lambda: pre.plan([0, 2], [0, 4], 8, HKV, 64, pos_encoding_mode="ALIBI", rope_theta=1e4))
    bsr = tessera.BlockSparseAttentionWrapper(np.zeros(1024, np.uint8))
    expect(ValueError, "pos_encoding_mode",
           lambda: bsr.plan([0, 1], [0], 16, 16, 16, 16, 8, HKV, 64, pos_encoding_mode="ROPE_LLAMA"))


POS_MODES = ["ROPE_LLAMA", "ALIBI"]
# (mode, rope_scale, rope_theta) of the GPU tests: RoPE at FlashInfer's defaults and at other values, ALiBi.
POS_CASES = [("ROPE_LLAMA", None, None), ("ROPE_LLAMA", 4.0, 1e6), ("ALIBI", None, None)]
OPTION_SETS = [(-1, 0.0), (12, 0.0), (-1, 5.0), (20, 5.0)]  # (window_left, logits_soft_cap)


def pos_kwargs(mode, rope_scale=2.0, rope_theta=5e5):
    return dict(pos_encoding_mode=mode) if mode == "ALIBI" else rope_kwargs(rope_scale, rope_theta)


def ref_pos(q, k, v, mode, causal, window_left=-1, logits_soft_cap=0.0, rope_scale=2.0, rope_theta=5e5,
            visible=None):
    """One request's float64 (o, lse) with `mode` (pos_kwargs's parameters, or "NONE"), a window, a soft cap
    and an optional custom mask `visible` [n, L]."""
    slopes = None
    if mode == "ROPE_LLAMA":
        q, k = rope_request(np.asarray(q, np.float64), np.asarray(k, np.float64), rope_scale, rope_theta)
    elif mode == "ALIBI":
        slopes = tessera.variants.alibi_slopes(q.shape[1]).astype(np.float64)
    return ref_request(q, k, v, causal, window_left=window_left, logits_soft_cap=logits_soft_cap,
                       alibi_slopes=slopes, visible=visible)


@pytest.mark.parametrize("mode", POS_MODES)
@pytest.mark.parametrize("window_left, cap", OPTION_SETS)
def test_single_decode_pos_options_cpu(rng, mode, window_left, cap):
    hq, d, L = 8, 64, 45
    q = rng.standard_normal((hq, d)).astype(np.float32)
    k, v = (rng.standard_normal((L, HKV, d)).astype(np.float32) for _ in range(2))
    o, lse = tessera.single_decode_with_kv_cache(q, k, v, return_lse=True, window_left=window_left,
                                                 logits_soft_cap=cap or None, **pos_kwargs(mode))
    ref_o, ref_lse = ref_pos(q[None], k, v, mode, False, window_left, cap)
    assert rel_error(o, ref_o[0]) < TOL["float32"]
    np.testing.assert_allclose(lse, ref_lse[0], atol=1e-4)
    plain = tessera.single_decode_with_kv_cache(q, k, v, window_left=window_left, logits_soft_cap=cap or None)
    assert rel_error(plain, ref_o[0]) > 1e-2  # the encoding changes the result


@pytest.mark.parametrize("mode", POS_MODES)
@pytest.mark.parametrize("window_left, cap", OPTION_SETS)
@pytest.mark.parametrize("causal", [True, False])
def test_single_prefill_pos_options_cpu(rng, mode, window_left, cap, causal):
    hq, d, n, L = 4, 64, 9, 31
    q = rng.standard_normal((n, hq, d)).astype(np.float32)
    k, v = (rng.standard_normal((L, HKV, d)).astype(np.float32) for _ in range(2))
    o, lse = tessera.single_prefill_with_kv_cache(q, k, v, causal=causal, return_lse=True, window_left=window_left,
                                                  logits_soft_cap=cap or None, **pos_kwargs(mode))
    ref_o, ref_lse = ref_pos(q, k, v, mode, causal, window_left, cap)
    assert rel_error(o, ref_o) < TOL["float32"]
    np.testing.assert_allclose(lse, ref_lse, atol=1e-4)


@pytest.mark.parametrize("mode", ["NONE"] + POS_MODES)
@pytest.mark.parametrize("window_left, cap", OPTION_SETS[1:])
def test_single_prefill_custom_mask_with_options_cpu(rng, mode, window_left, cap):
    """A custom mask combines with RoPE / ALiBi, a window and a soft cap: every rule applies."""
    hq, d, n, L = 4, 64, 9, 31
    q = rng.standard_normal((n, hq, d)).astype(np.float32)
    k, v = (rng.standard_normal((L, HKV, d)).astype(np.float32) for _ in range(2))
    mask = rng.random((n, L)) < 0.6
    kw = pos_kwargs(mode) if mode != "NONE" else {}
    o, lse = tessera.single_prefill_with_kv_cache(q, k, v, custom_mask=mask, return_lse=True, window_left=window_left,
                                                  logits_soft_cap=cap or None, **kw)
    ref_o, ref_lse = ref_pos(q, k, v, mode, False, window_left, cap, visible=mask)
    assert rel_error(o, ref_o) < TOL["float32"]
    np.testing.assert_allclose(lse, ref_lse, atol=1e-4)


# ======================================================================= GPU
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_single_rope_gpu_matches_cpu(torch_cuda, rng, dtype):
    """single_decode / single_prefill with ROPE_LLAMA: the GPU kernels against the CPU reference path."""
    torch = torch_cuda
    tdt = getattr(torch, dtype)
    q1 = uniform(torch, rng, (8, 128), tdt)
    qn = uniform(torch, rng, (40, 8, 128), tdt)
    k, v = (uniform(torch, rng, (700, HKV, 128), tdt) for _ in range(2))
    opts = rope_kwargs(3.0, 2e5)
    got = tessera.single_decode_with_kv_cache(q1, k, v, **opts)
    want = tessera.single_decode_with_kv_cache(q1.cpu().float(), k.cpu().float(), v.cpu().float(), **opts)
    assert rel_error(to_np(got), to_np(want)) < TOL[dtype]
    got = tessera.single_prefill_with_kv_cache(qn, k, v, causal=True, **opts)
    want = tessera.single_prefill_with_kv_cache(qn.cpu().float(), k.cpu().float(), v.cpu().float(), causal=True,
                                                **opts)
    assert rel_error(to_np(got), to_np(want)) < TOL[dtype]


@pytest.mark.parametrize("use_tensor_cores", [False, True])
@pytest.mark.parametrize("mode, rope_scale, rope_theta", POS_CASES)
@pytest.mark.parametrize("dtype, page_size, layout, window_left, cap", [
    ("float16", 16, "NHD", -1, 0.0), ("bfloat16", 1, "HND", 100, 0.0), ("float16", 8, "HND", -1, 30.0),
    ("float16", 16, "NHD", 200, 30.0)])
def test_batch_decode_pos_options_gpu(torch_cuda, rng, poison, use_tensor_cores, mode, rope_scale, rope_theta, dtype,
                                      page_size, layout, window_left, cap):
    torch = torch_cuda
    tdt = getattr(torch, dtype)
    hq, d = 4 * HKV, 128
    lens = [0, 1, 37, 300, 1500]
    table = make_table(rng, lens, page_size)
    cache, k, v = random_cache(torch, rng, layout, table[3], page_size, d, tdt, False)
    q = uniform(torch, rng, (len(lens), hq, d), tdt, -2.0, 2.0)
    w = tessera.BatchDecodeWithPagedKVCacheWrapper(workspace(torch), layout, use_tensor_cores=use_tensor_cores)
    w._cuda_cores = not use_tensor_cores
    w.plan(*(torch.from_numpy(x) for x in table[:3]), hq, HKV, d, page_size, q_data_type=tdt,
           window_left=window_left, logits_soft_cap=cap or None, **pos_kwargs(mode, rope_scale, rope_theta))
    o, lse = w.run(q, cache, return_lse=True)
    torch.cuda.synchronize()
    kn, vn, qn = to_np(k), to_np(v), to_np(q)
    ref_o, ref_lse = np.zeros(qn.shape), np.full(qn.shape[:2], -np.inf)
    for b in range(len(lens)):
        kb, vb = gather_pages(kn, vn, layout, table, page_size, b)
        if len(kb):
            ro, rl = ref_pos(qn[b][None], kb, vb, mode, False, window_left, cap, rope_scale, rope_theta)
            ref_o[b], ref_lse[b] = ro[0], rl[0]
    check(o, lse, ref_o, ref_lse, dtype)
    assert torch.equal(o, w.run(q, cache))  # bitwise the same on a second run


@pytest.mark.parametrize("kind", ["paged", "ragged"])
@pytest.mark.parametrize("backend", ["fa2", "auto"])
@pytest.mark.parametrize("mode, rope_scale, rope_theta", POS_CASES)
@pytest.mark.parametrize("dtype, causal, window_left, cap", [
    ("float16", True, -1, 0.0), ("bfloat16", True, 64, 30.0), ("float16", False, -1, 30.0)])
def test_batch_prefill_pos_options_gpu(torch_cuda, rng, poison, kind, backend, mode, rope_scale, rope_theta, dtype,
                                       causal, window_left, cap):
    torch = torch_cuda
    tdt = getattr(torch, dtype)
    hq, d, page_size = 4 * HKV, 128, 16
    q_lens, kv_lens = zip(*[(0, 10), (1, 300), (37, 37), (100, 190), (64, 577)])
    qo = indptr_of(q_lens)
    q = uniform(torch, rng, (int(qo[-1]), hq, d), tdt, -2.0, 2.0)
    o, lse, kv_of = run_batch(torch, rng, q, qo, kv_lens, hq, d, tdt, page_size if kind == "paged" else 0,
                              dict(causal=causal, window_left=window_left, logits_soft_cap=cap or None,
                                   **pos_kwargs(mode, rope_scale, rope_theta)), dict(backend=backend))
    torch.cuda.synchronize()
    qn = to_np(q)
    ref_o, ref_lse = np.zeros(qn.shape), np.full(qn.shape[:2], -np.inf)
    for i in range(len(q_lens)):
        a, b = qo[i], qo[i + 1]
        kb, vb = kv_of(i)
        ref_o[a:b], ref_lse[a:b] = ref_pos(qn[a:b], kb, vb, mode, causal, window_left, cap, rope_scale, rope_theta)
    check(o, lse, ref_o, ref_lse, dtype)


@pytest.mark.parametrize("kind", ["paged", "ragged"])
@pytest.mark.parametrize("mode, dtype, window_left, cap", [
    ("NONE", "float16", 40, 0.0), ("NONE", "bfloat16", -1, 30.0), ("ROPE_LLAMA", "float16", -1, 0.0),
    ("ALIBI", "bfloat16", 64, 30.0), ("ROPE_LLAMA", "bfloat16", 100, 30.0)])
def test_batch_prefill_custom_mask_with_options_gpu(torch_cuda, rng, poison, kind, mode, dtype, window_left, cap):
    """FlashInfer's custom mask together with pos_encoding_mode, window_left and logits_soft_cap."""
    torch = torch_cuda
    tdt = getattr(torch, dtype)
    hq, d, page_size = 4 * HKV, 128, 16
    q_lens, kv_lens = zip(*[(1, 300), (37, 37), (100, 190), (64, 577)])
    qo = indptr_of(q_lens)
    masks = [rng.random((n, L)) < 0.7 for n, L in zip(q_lens, kv_lens)]
    flat = torch.from_numpy(np.concatenate([m.reshape(-1) for m in masks])).cuda()
    q = uniform(torch, rng, (int(qo[-1]), hq, d), tdt, -2.0, 2.0)
    kw = pos_kwargs(mode) if mode != "NONE" else {}
    o, lse, kv_of = run_batch(torch, rng, q, qo, kv_lens, hq, d, tdt, page_size if kind == "paged" else 0,
                              dict(custom_mask=flat, window_left=window_left, logits_soft_cap=cap or None, **kw),
                              dict(backend="auto"))
    torch.cuda.synchronize()
    qn = to_np(q)
    ref_o, ref_lse = np.zeros(qn.shape), np.full(qn.shape[:2], -np.inf)
    for i in range(len(q_lens)):
        a, b = qo[i], qo[i + 1]
        kb, vb = kv_of(i)
        ref_o[a:b], ref_lse[a:b] = ref_pos(qn[a:b], kb, vb, mode, False, window_left, cap, visible=masks[i])
    check(o, lse, ref_o, ref_lse, dtype)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_single_alibi_gpu_matches_cpu(torch_cuda, rng, dtype):
    """single_decode / single_prefill with ALIBI: the GPU kernels against the CPU path, LSE included."""
    torch = torch_cuda
    tdt = getattr(torch, dtype)
    q1 = uniform(torch, rng, (8, 128), tdt)
    qn = uniform(torch, rng, (40, 8, 128), tdt)
    k, v = (uniform(torch, rng, (700, HKV, 128), tdt) for _ in range(2))
    cpu = lambda x: x.cpu().float()  # noqa: E731
    got, got_lse = tessera.single_decode_with_kv_cache(q1, k, v, pos_encoding_mode="ALIBI", return_lse=True)
    want, want_lse = tessera.single_decode_with_kv_cache(cpu(q1), cpu(k), cpu(v), pos_encoding_mode="ALIBI",
                                                         return_lse=True)
    assert rel_error(to_np(got), to_np(want)) < TOL[dtype]
    np.testing.assert_allclose(to_np(got_lse), to_np(want_lse), atol=2e-2)
    got = tessera.single_prefill_with_kv_cache(qn, k, v, causal=True, pos_encoding_mode="ALIBI")
    want = tessera.single_prefill_with_kv_cache(cpu(qn), cpu(k), cpu(v), causal=True, pos_encoding_mode="ALIBI")
    assert rel_error(to_np(got), to_np(want)) < TOL[dtype]
