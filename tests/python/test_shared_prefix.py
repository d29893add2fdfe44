"""tessera.BatchDecodeWithSharedPrefixPagedKVCacheWrapper and
BatchPrefillWithSharedPrefixPagedKVCacheWrapper (flashinfer.cascade): a
contiguous shared prefix (also empty) plus shuffled paged suffixes (one
empty), NHD / HND, interleaved caches, GQA, causal suffixes, fp16 / bf16,
against the float64 reference over [prefix; suffix] with the outputs the
wrapper allocates poisoned; argument errors without a GPU.
"""

import numpy as np
import pytest

import tessera
from conftest import to_np
from prefill_reference import HKV, check, expect, indptr_of, make_table, ref_request


def suffix_kv(k_cache, v_cache, layout, table, page_size, lens, i):
    """Request i's suffix (k, v) [len, Hkv, D] in float64 through the page table."""
    kn, vn = to_np(k_cache), to_np(v_cache)
    if layout == "HND":
        kn, vn = kn.transpose(0, 2, 1, 3), vn.transpose(0, 2, 1, 3)
    indptr, indices = table[:2]
    sel = indices[indptr[i]: indptr[i + 1]]
    return kn[sel].reshape(-1, HKV, kn.shape[-1])[: lens[i]], vn[sel].reshape(-1, HKV, vn.shape[-1])[: lens[i]]


def reference(q, qo, k_shared, v_shared, layout, suffix_of, causal, sm_scale=None):
    """Every query sees the whole prefix; its suffix bottom-right causal (or whole)."""
    q = to_np(q)
    ks, vs = to_np(k_shared), to_np(v_shared)
    if layout == "HND":
        ks, vs = ks.transpose(1, 0, 2), vs.transpose(1, 0, 2)
    P = ks.shape[0]
    o = np.zeros(q.shape)
    for i in range(len(qo) - 1):
        a, b = qo[i], qo[i + 1]
        ku, vu = suffix_of(i)
        S, n = ku.shape[0], b - a
        vis = np.ones((n, P + S), bool)
        if causal:
            vis[:, P:] = np.arange(S)[None, :] <= np.arange(n)[:, None] + S - n
        o[a:b] = ref_request(q[a:b], np.concatenate([ks, ku]), np.concatenate([vs, vu]), False, sm_scale,
                             visible=vis)[0]
    return o


def random_kv(torch, rng, shape, dtype):
    return torch.from_numpy(rng.uniform(-1, 1, shape).astype(np.float32)).cuda().to(dtype)


# ======================================================================= CPU
def test_errors_without_gpu():
    buf = np.zeros(16, np.uint8)
    for cls in (tessera.BatchDecodeWithSharedPrefixPagedKVCacheWrapper,
                tessera.BatchPrefillWithSharedPrefixPagedKVCacheWrapper):
        expect(ValueError, "^kv_layout", lambda: cls(buf, "NDH"))
        expect(TypeError, "^float_workspace_buffer", lambda: cls([0] * 16))
        w = cls(buf, "HND")
        expect(ValueError, "^forward: expected begin_forward", lambda: w.forward(None, None, None, None))
    dec = tessera.BatchDecodeWithSharedPrefixPagedKVCacheWrapper(buf)
    args = ([0, 1, 3], [0, 2, 1], [5, 16], 8, HKV, 128, 16)
    expect(TypeError, "^float_workspace_buffer", lambda: dec.begin_forward(*args))  # every check passed
    expect(TypeError, "^float_workspace_buffer", lambda: dec.begin_forward(*args, data_type="bfloat16"))
    expect(TypeError, "^data_type", lambda: dec.begin_forward(*args, data_type="float32"))
    expect(ValueError, "^num_qo_heads", lambda: dec.begin_forward([0, 1, 3], [0, 2, 1], [5, 16], 0, HKV, 128, 16))
    pre = tessera.BatchPrefillWithSharedPrefixPagedKVCacheWrapper(buf)
    expect(TypeError, "^float_workspace_buffer", lambda: pre.begin_forward([0, 2, 5], *args))
    expect(ValueError, "^paged_kv_indptr", lambda: pre.begin_forward([0, 2, 5, 6], *args))


# ======================================================================= GPU
SUFFIX_LENS = [17, 0, 40, 1, 33]


@pytest.mark.parametrize("dtype, head_dim, group, page_size, layout, prefix_len, interleaved", [
    ("float16", 128, 4, 16, "NHD", 300, False), ("bfloat16", 64, 1, 1, "HND", 77, True),
    ("float16", 256, 8, 5, "HND", 0, False), ("bfloat16", 128, 2, 16, "NHD", 1, True)])
def test_shared_prefix_decode(torch_cuda, rng, poison, dtype, head_dim, group, page_size, layout, prefix_len,
                              interleaved):
    torch = torch_cuda
    tdt = getattr(torch, dtype)
    hq = HKV * group
    table = make_table(rng, SUFFIX_LENS, page_size)
    page = (page_size, HKV, head_dim) if layout == "NHD" else (HKV, page_size, head_dim)
    k_cache, v_cache = random_kv(torch, rng, (table[3],) + page, tdt), random_kv(torch, rng, (table[3],) + page, tdt)
    cache = torch.stack([k_cache, v_cache], 1) if interleaved else (k_cache, v_cache)
    shared = (prefix_len, HKV, head_dim) if layout == "NHD" else (HKV, prefix_len, head_dim)
    ks, vs = random_kv(torch, rng, shared, tdt), random_kv(torch, rng, shared, tdt)
    q = random_kv(torch, rng, (len(SUFFIX_LENS), hq, head_dim), tdt) * 2
    w = tessera.BatchDecodeWithSharedPrefixPagedKVCacheWrapper(torch.empty(128 << 20, dtype=torch.uint8,
                                                                           device="cuda"), layout)
    w.begin_forward(*(torch.from_numpy(x).cuda() for x in table[:3]), hq, HKV, head_dim, page_size, data_type=tdt)
    o = w.forward(q, ks, vs, cache)
    ref = reference(q, np.arange(len(SUFFIX_LENS) + 1), ks, vs, layout,
                    lambda i: suffix_kv(k_cache, v_cache, layout, table, page_size, SUFFIX_LENS, i), False)
    assert o.dtype == tdt and tuple(o.shape) == tuple(q.shape)
    check(o, None, ref, None, dtype)
    assert torch.equal(w.forward(q, ks, vs, cache), o)


@pytest.mark.parametrize("dtype, head_dim, group, page_size, layout, prefix_len, causal", [
    ("float16", 128, 4, 16, "NHD", 200, True), ("bfloat16", 128, 1, 1, "HND", 33, True),
    ("float16", 64, 8, 16, "HND", 0, False), ("bfloat16", 256, 2, 3, "NHD", 129, False)])
def test_shared_prefix_prefill(torch_cuda, rng, poison, dtype, head_dim, group, page_size, layout, prefix_len,
                               causal):
    torch = torch_cuda
    tdt = getattr(torch, dtype)
    hq = HKV * group
    q_lens = [5, 3, 40, 1, 33]  # request 1 has no suffix keys: its queries see the prefix only
    qo = indptr_of(q_lens)
    table = make_table(rng, SUFFIX_LENS, page_size)
    page = (page_size, HKV, head_dim) if layout == "NHD" else (HKV, page_size, head_dim)
    k_cache, v_cache = random_kv(torch, rng, (table[3],) + page, tdt), random_kv(torch, rng, (table[3],) + page, tdt)
    shared = (prefix_len, HKV, head_dim) if layout == "NHD" else (HKV, prefix_len, head_dim)
    ks, vs = random_kv(torch, rng, shared, tdt), random_kv(torch, rng, shared, tdt)
    q = random_kv(torch, rng, (int(qo[-1]), hq, head_dim), tdt) * 2
    w = tessera.BatchPrefillWithSharedPrefixPagedKVCacheWrapper(torch.empty(128 << 20, dtype=torch.uint8,
                                                                            device="cuda"), layout)
    w.begin_forward(qo, *table[:3], hq, HKV, head_dim, page_size)
    o = w.forward(q, ks, vs, (k_cache, v_cache), causal=causal, sm_scale=0.07)
    suffix_of = lambda i: suffix_kv(k_cache, v_cache, layout, table, page_size, SUFFIX_LENS, i)  # noqa: E731
    ref = reference(q, qo, ks, vs, layout, suffix_of, causal, 0.07)
    check(o, None, ref, None, dtype)
    assert o.dtype == tdt
    # Other options re-plan the suffixes: the default scale now.
    o2 = w.forward(q, ks, vs, torch.stack([k_cache, v_cache], 1), causal=causal)
    check(o2, None, reference(q, qo, ks, vs, layout, suffix_of, causal), None, dtype)
    expect(ValueError, "^rope_scale", lambda: w.forward(q, ks, vs, (k_cache, v_cache), rope_scale=2.0))
