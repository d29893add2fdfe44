"""tessera prefill (paged / ragged / block-sparse wrappers, single_prefill)
against a float64 reference from the formula, per request: softmax(q k^T *
sm_scale) v, query head h reading KV head h // group; causal is bottom-right
(query i of q_len sees key j <= i + kv_len - q_len); rows that see no key give
o = 0, lse = -inf (base 2). GPU tests ("skipped: no GPU" without torch + CUDA)
cover ~40 representative combinations of dtype, head dim, group, page size,
cache form, layout, causal and BSR block size, with empty requests and
q_len < / > kv_len, outputs poisoned with NaN; plus CUDA-graph replay, growth
and bad input. CPU tests: validation, single_prefill's CPU path, the oracle.
"""

import numpy as np
import pytest

import tessera
from conftest import TOL, rel_error, to_np
from tessera import _C

HKV = 2
WORKSPACE_BYTES = 128 << 20
# (q_len, kv_len): no queries; no keys; one query; q_len == kv_len; chunked
# prefill (q_len < kv_len, several KV tiles); q_len > kv_len (under causal the
# first rows see nothing).
LENS = [(0, 10), (5, 0), (1, 300), (37, 37), (100, 190), (64, 577), (9, 3)]


# ======================================================================= reference
def ref_request(q, k, v, causal, sm_scale=None, visible=None, window_left=-1, logits_soft_cap=0.0):
    """float64 (o [n, Hq, D], lse [n, Hq]) of q [n, Hq, D] over k, v [L, Hkv, D]; visible: optional bool [n, L].

    window_left >= 0: query i sees keys j >= i + L - n - window_left; logits_soft_cap > 0: each logit x (after
    sm_scale) becomes cap * tanh(x / cap)."""
    q, k, v = (np.asarray(x, dtype=np.float64) for x in (q, k, v))
    (n, hq, d), L = q.shape, k.shape[0]
    group = hq // k.shape[1]
    scale = 1.0 / np.sqrt(d) if sm_scale is None else sm_scale
    vis = np.ones((n, L), dtype=bool) if visible is None else np.asarray(visible, dtype=bool).copy()
    if causal:
        vis &= np.arange(L)[None, :] <= np.arange(n)[:, None] + (L - n)
    if window_left >= 0:
        vis &= np.arange(L)[None, :] >= np.arange(n)[:, None] + (L - n) - window_left
    o, lse = np.zeros((n, hq, d)), np.full((n, hq), -np.inf)
    for h in range(hq):
        s = q[:, h, :] @ k[:, h // group, :].T * scale  # natural-base logits
        if logits_soft_cap:
            s = logits_soft_cap * np.tanh(s / logits_soft_cap)
        s = np.where(vis, s, -np.inf)
        m = s.max(axis=1, initial=-np.inf)
        ok = np.isfinite(m)
        p = np.exp(s - np.where(ok, m, 0.0)[:, None])  # 0 where masked
        denom = p.sum(axis=1)
        o[ok, h] = (p[ok] @ v[:, h // group, :]) / denom[ok, None]
        lse[ok, h] = (m[ok] + np.log(denom[ok])) / np.log(2.0)
    return o, lse


def ref_batch(q, qo_indptr, kv_of, causal, sm_scale=None, **options):
    """Concatenated per-request references; kv_of(i) -> (k, v) [kv_len_i, Hkv, D] of request i."""
    q = np.asarray(q, dtype=np.float64)
    o, lse = np.zeros(q.shape), np.full(q.shape[:2], -np.inf)
    for i in range(len(qo_indptr) - 1):
        a, b = qo_indptr[i], qo_indptr[i + 1]
        k, v = kv_of(i)
        o[a:b], lse[a:b] = ref_request(q[a:b], k, v, causal, sm_scale, **options)  # window_left, logits_soft_cap
    return o, lse


def check(o, lse, ref_o, ref_lse, dtype, rows=None):
    """rel_error of o (NaN fails) and the base-2 LSE: -inf exactly where the reference has it."""
    got = to_np(o)[:rows]
    assert not np.isnan(got).any(), "NaN in output"
    err = rel_error(got, ref_o)
    assert err < TOL[dtype], f"error {err}"
    if lse is not None:
        got = to_np(lse)[:rows]
        assert not np.isnan(got).any(), "NaN in lse"
        np.testing.assert_array_equal(np.isneginf(got), np.isneginf(ref_lse))
        fin = np.isfinite(ref_lse)
        if fin.any():
            lerr = np.abs(got[fin] - ref_lse[fin]).max()
            assert lerr <= 1e-3 * max(1.0, np.abs(ref_lse[fin]).max()), f"lse error {lerr}"


# ======================================================================= data
def indptr_of(lens):
    return np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)


def make_table(rng, kv_lens, page_size, spare=3):
    """A page table over shuffled pages: (indptr, indices, last_page_len, num_pages) as int32 numpy."""
    pages = [(n + page_size - 1) // page_size for n in kv_lens]
    num_pages = sum(pages) + spare
    indptr = indptr_of(pages)
    indices = rng.permutation(num_pages)[: indptr[-1]].astype(np.int32)
    last = np.array([n - (p - 1) * page_size if p else 0 for n, p in zip(kv_lens, pages)], dtype=np.int32)
    return indptr, indices, last, num_pages


def gather_pages(k_cache, v_cache, layout, table, page_size, i):
    """Request i's (k, v) [kv_len, Hkv, D] float64 from numpy caches through the page table."""
    indptr, indices, last = table[:3]
    if layout == "HND":
        k_cache, v_cache = k_cache.transpose(0, 2, 1, 3), v_cache.transpose(0, 2, 1, 3)
    pages = indices[indptr[i]: indptr[i + 1]]
    n = 0 if len(pages) == 0 else (len(pages) - 1) * page_size + int(last[i])
    hkv, d = k_cache.shape[2], k_cache.shape[3]
    return k_cache[pages].reshape(-1, hkv, d)[:n], v_cache[pages].reshape(-1, hkv, d)[:n]


def uniform(torch, rng, shape, dtype, lo=-1.0, hi=1.0):
    return torch.from_numpy(rng.uniform(lo, hi, size=shape).astype(np.float32)).to("cuda").to(dtype)


def random_cache(torch, rng, layout, num_pages, page_size, head_dim, dtype, interleaved):
    """(paged_kv_cache as run() takes it, k_cache, v_cache) on the GPU."""
    page = (page_size, HKV, head_dim) if layout == "NHD" else (HKV, page_size, head_dim)
    if interleaved:
        cache = uniform(torch, rng, (num_pages, 2) + page, dtype)
        return cache, cache[:, 0], cache[:, 1]
    k, v = (uniform(torch, rng, (num_pages,) + page, dtype) for _ in range(2))
    return (k, v), k, v


def expect(error, name, fn):
    """fn() raises `error` whose message names `name`."""
    with pytest.raises(error, match=name):
        fn()


def workspace(torch):
    return torch.empty(WORKSPACE_BYTES, dtype=torch.uint8, device="cuda")


# ======================================================================= GPU: paged
PAGED_CASES = [  # dtype, head_dim, group, page_size, layout, interleaved, causal
    ("float16", 128, 4, 16, "NHD", False, True), ("float16", 128, 4, 1, "NHD", False, True),
    ("bfloat16", 128, 4, 16, "HND", True, True), ("bfloat16", 64, 1, 1, "HND", False, False),
    ("float16", 256, 8, 16, "NHD", True, False), ("float16", 64, 8, 16, "HND", False, True),
    ("bfloat16", 256, 1, 16, "NHD", False, True), ("float16", 128, 1, 1, "NHD", True, False),
    ("bfloat16", 128, 8, 1, "HND", True, True), ("float16", 256, 4, 1, "HND", False, True),
    ("bfloat16", 64, 4, 16, "NHD", True, False), ("float16", 64, 1, 16, "NHD", False, True),
]


@pytest.mark.parametrize("dtype, head_dim, group, page_size, layout, interleaved, causal", PAGED_CASES)
def test_paged_gpu(torch_cuda, rng, poison, dtype, head_dim, group, page_size, layout, interleaved, causal):
    torch = torch_cuda
    tdt = getattr(torch, dtype)
    hq = HKV * group
    q_lens, kv_lens = zip(*LENS)
    table = make_table(rng, kv_lens, page_size)
    cache, k, v = random_cache(torch, rng, layout, table[3], page_size, head_dim, tdt, interleaved)
    qo = indptr_of(q_lens)
    q = uniform(torch, rng, (int(qo[-1]), hq, head_dim), tdt, -2.0, 2.0)
    wrapper = tessera.BatchPrefillWithPagedKVCacheWrapper(workspace(torch), kv_layout=layout)
    # FlashInfer users often keep the index arrays on the GPU: plan copies them.
    wrapper.plan(torch.from_numpy(qo).cuda(), torch.from_numpy(table[0]).cuda(), torch.from_numpy(table[1]).cuda(),
                 torch.from_numpy(table[2]).cuda(), hq, HKV, head_dim, page_size, causal=causal, q_data_type=tdt)
    o, lse = wrapper.run(q, cache, return_lse=True)
    torch.cuda.synchronize()
    assert o.shape == q.shape and o.dtype == tdt and lse.shape == q.shape[:2] and lse.dtype == torch.float32
    kn, vn = to_np(k), to_np(v)
    ref_o, ref_lse = ref_batch(to_np(q), qo, lambda i: gather_pages(kn, vn, layout, table, page_size, i), causal)
    check(o, lse, ref_o, ref_lse, dtype)
    rows = slice(qo[1], qo[2])  # the request without keys
    assert np.all(to_np(o)[rows] == 0) and np.all(np.isneginf(to_np(lse)[rows]))


def test_paged_gpu_out_lse_sm_scale_and_determinism(torch_cuda, rng):
    """Caller-provided (NaN-filled) out and lse; sm_scale from plan; repeated runs are bitwise equal."""
    torch = torch_cuda
    q_lens, kv_lens = [3, 70, 16], [40, 700, 16]
    table = make_table(rng, kv_lens, 16)
    cache, k, v = random_cache(torch, rng, "NHD", table[3], 16, 128, torch.float16, False)
    qo = indptr_of(q_lens)
    q = uniform(torch, rng, (int(qo[-1]), 8, 128), torch.float16, -2.0, 2.0)
    wrapper = tessera.BatchPrefillWithPagedKVCacheWrapper(workspace(torch))
    wrapper.plan(qo, table[0], table[1], table[2], 8, HKV, 128, 16, causal=True, sm_scale=0.05)
    out = torch.full_like(q, float("nan"))
    lse = torch.full(q.shape[:2], float("nan"), device="cuda")
    got = wrapper.run(q, cache, out=out, lse=lse)
    torch.cuda.synchronize()
    assert got is out
    kn, vn = to_np(k), to_np(v)
    ref_o, ref_lse = ref_batch(to_np(q), qo, lambda i: gather_pages(kn, vn, "NHD", table, 16, i), True, 0.05)
    check(out, lse, ref_o, ref_lse, "float16")
    o2, lse2 = wrapper.run_return_lse(q, cache)
    torch.cuda.synchronize()
    assert torch.equal(o2, out) and torch.equal(lse2, lse)
    assert wrapper.cta_q in (16, 32, 64, 128) and wrapper.last_plan_us > 0


# ======================================================================= GPU: ragged
RAGGED_CASES = [  # dtype, head_dim, group, layout, causal
    ("float16", 128, 4, "NHD", True), ("bfloat16", 128, 4, "HND", True), ("float16", 64, 1, "HND", False),
    ("bfloat16", 256, 8, "NHD", False), ("float16", 256, 1, "NHD", True), ("bfloat16", 64, 8, "HND", True),
    ("float16", 128, 8, "NHD", False), ("bfloat16", 128, 1, "NHD", True),
]


@pytest.mark.parametrize("dtype, head_dim, group, layout, causal", RAGGED_CASES)
def test_ragged_gpu(torch_cuda, rng, poison, dtype, head_dim, group, layout, causal):
    torch = torch_cuda
    tdt = getattr(torch, dtype)
    hq = HKV * group
    q_lens, kv_lens = zip(*LENS)
    qo, kv = indptr_of(q_lens), indptr_of(kv_lens)
    q = uniform(torch, rng, (int(qo[-1]), hq, head_dim), tdt, -2.0, 2.0)
    shape = (int(kv[-1]), HKV, head_dim) if layout == "NHD" else (HKV, int(kv[-1]), head_dim)
    k, v = uniform(torch, rng, shape, tdt), uniform(torch, rng, shape, tdt)
    wrapper = tessera.BatchPrefillWithRaggedKVCacheWrapper(workspace(torch), kv_layout=layout)
    wrapper.plan(qo, kv, hq, HKV, head_dim, causal=causal, q_data_type=dtype)
    o, lse = wrapper.run(q, k, v, return_lse=True)
    torch.cuda.synchronize()
    kn, vn = to_np(k), to_np(v)
    if layout == "HND":
        kn, vn = kn.transpose(1, 0, 2), vn.transpose(1, 0, 2)
    ref_o, ref_lse = ref_batch(to_np(q), qo, lambda i: (kn[kv[i]: kv[i + 1]], vn[kv[i]: kv[i + 1]]), causal)
    check(o, lse, ref_o, ref_lse, dtype)


WINDOW_CAP_CASES = [  # source, dtype, head_dim, group, causal, window_left, logits_soft_cap
    ("paged", "float16", 128, 4, True, 48, 30.0), ("paged", "bfloat16", 64, 1, True, 0, None),
    ("paged", "float16", 128, 8, False, 100, None), ("ragged", "float16", 128, 1, True, 130, 20.0),
    ("ragged", "bfloat16", 256, 8, True, -1, 5.0), ("ragged", "float16", 64, 4, False, 7, 2.0),
    ("single", "float16", 128, 4, True, 37, 20.0), ("single", "bfloat16", 128, 1, False, -1, 3.0),
]


@pytest.mark.parametrize("source, dtype, head_dim, group, causal, window_left, logits_soft_cap", WINDOW_CAP_CASES)
def test_window_and_soft_cap_gpu(torch_cuda, rng, poison, source, dtype, head_dim, group, causal, window_left,
                                 logits_soft_cap):
    """FlashInfer's plan() options window_left / logits_soft_cap, alone and together (Gemma 2), on every source."""
    torch = torch_cuda
    tdt = getattr(torch, dtype)
    hq = HKV * group
    lens = LENS if source != "single" else [(100, 190)]
    q_lens, kv_lens = zip(*lens)
    qo, kv = indptr_of(q_lens), indptr_of(kv_lens)
    q = uniform(torch, rng, (int(qo[-1]), hq, head_dim), tdt, -3.0, 3.0)
    opts = dict(window_left=window_left, logits_soft_cap=logits_soft_cap)
    if source == "paged":
        table = make_table(rng, kv_lens, 16)
        cache, k, v = random_cache(torch, rng, "NHD", table[3], 16, head_dim, tdt, False)
        w = tessera.BatchPrefillWithPagedKVCacheWrapper(workspace(torch))
        w.plan(qo, table[0], table[1], table[2], hq, HKV, head_dim, 16, causal=causal, q_data_type=tdt, **opts)
        o, lse = w.run(q, cache, return_lse=True, window_left=window_left)
        kn, vn = to_np(k), to_np(v)
        kv_of = lambda i: gather_pages(kn, vn, "NHD", table, 16, i)  # noqa: E731
    else:
        k, v = (uniform(torch, rng, (int(kv[-1]), HKV, head_dim), tdt) for _ in range(2))
        if source == "ragged":
            w = tessera.BatchPrefillWithRaggedKVCacheWrapper(workspace(torch))
            w.plan(qo, kv, hq, HKV, head_dim, causal=causal, q_data_type=tdt, **opts)
            o, lse = w.run(q, k, v, return_lse=True)
        else:
            o, lse = tessera.single_prefill_with_kv_cache(q, k, v, causal=causal, return_lse=True, **opts)
        kn, vn = to_np(k), to_np(v)
        kv_of = lambda i: (kn[kv[i]: kv[i + 1]], vn[kv[i]: kv[i + 1]])  # noqa: E731
    torch.cuda.synchronize()
    ref_o, ref_lse = ref_batch(to_np(q), qo, kv_of, causal, window_left=window_left,
                               logits_soft_cap=logits_soft_cap or 0.0)
    check(o, lse, ref_o, ref_lse, dtype)
    plain_o, _ = ref_batch(to_np(q), qo, kv_of, causal)
    assert rel_error(ref_o, plain_o) > 1e-2  # the options change the result
    if source == "paged":  # FlashInfer's paged run() takes window_left (the ragged one does not)
        with pytest.raises(ValueError, match="window_left"):
            w.run(q, cache, window_left=window_left + 1)


def test_ragged_gpu_grows_without_cuda_graph(torch_cuda, rng):
    """A later, larger plan re-sizes the workspace sections (batch and total query length)."""
    torch = torch_cuda
    wrapper = tessera.BatchPrefillWithRaggedKVCacheWrapper(workspace(torch))
    for q_lens, kv_lens in (([3, 9], [3, 20]), ([100, 300, 5, 0, 77, 64, 1], [100, 900, 5, 4, 80, 64, 1])):
        qo, kv = indptr_of(q_lens), indptr_of(kv_lens)
        q = uniform(torch, rng, (int(qo[-1]), 8, 128), torch.float16, -2.0, 2.0)
        k, v = (uniform(torch, rng, (int(kv[-1]), HKV, 128), torch.float16) for _ in range(2))
        wrapper.plan(qo, kv, 8, HKV, 128, causal=True)
        o = wrapper.run(q, k, v)
        torch.cuda.synchronize()
        kn, vn = to_np(k), to_np(v)
        ref_o, _ = ref_batch(to_np(q), qo, lambda i: (kn[kv[i]: kv[i + 1]], vn[kv[i]: kv[i + 1]]), True)
        check(o, None, ref_o, None, "float16")


# ======================================================================= GPU: block-sparse
def random_bsr(rng, MB, NB, empty_row=2):
    """indptr, indices of a random block pattern (shuffled columns; block row `empty_row` has none)."""
    indptr, indices = [0], []
    for r in range(MB):
        n = 0 if r == empty_row else int(rng.integers(1, NB + 1))
        indices.extend(rng.permutation(NB)[:n])
        indptr.append(len(indices))
    return np.array(indptr, np.int32), np.array(indices, np.int32)


def dense_mask(indptr, indices, M, N, R, C):
    """The [M, N] visibility the BSR pattern implies."""
    mask = np.zeros((M, N), dtype=bool)
    for r in range(M // R):
        for c in indices[indptr[r]: indptr[r + 1]]:
            mask[r * R: (r + 1) * R, c * C: (c + 1) * C] = True
    return mask


def ref_bsr_gathered(q, k, v, indptr, indices, R, C, causal, sm_scale=None):
    """Each block row as one request over its column blocks in indices order (how causal is defined)."""
    def kv_of(r):
        rows = np.concatenate([np.arange(c * C, (c + 1) * C) for c in indices[indptr[r]: indptr[r + 1]]] +
                              [np.zeros(0, np.int64)]).astype(np.int64)
        return k[rows], v[rows]
    return ref_batch(q, np.arange(0, q.shape[0] + 1, R), kv_of, causal, sm_scale)


BSR_CASES = [  # R, C, dtype, head_dim, group, causal
    (1, 1, "float16", 128, 4, False), (1, 4, "bfloat16", 64, 1, False), (1, 16, "float16", 256, 8, False),
    (4, 1, "float16", 64, 4, False), (4, 4, "float16", 128, 4, False), (4, 16, "bfloat16", 128, 8, False),
    (16, 1, "bfloat16", 256, 4, False), (16, 4, "float16", 128, 1, False), (16, 16, "float16", 128, 4, False),
    (16, 16, "bfloat16", 64, 4, True),
]


@pytest.mark.parametrize("R, C, dtype, head_dim, group, causal", BSR_CASES)
def test_bsr_gpu(torch_cuda, rng, poison, R, C, dtype, head_dim, group, causal):
    torch = torch_cuda
    tdt = getattr(torch, dtype)
    hq, MB, NB = HKV * group, 6, 64 // C + 5
    M, N = MB * R, NB * C
    indptr, indices = random_bsr(rng, MB, NB)
    q = uniform(torch, rng, (M, hq, head_dim), tdt, -2.0, 2.0)
    k, v = uniform(torch, rng, (N, HKV, head_dim), tdt), uniform(torch, rng, (N, HKV, head_dim), tdt)
    wrapper = tessera.BlockSparseAttentionWrapper(workspace(torch))
    wrapper.plan(torch.from_numpy(indptr), torch.from_numpy(indices), M, N, R, C, hq, HKV, head_dim, causal=causal,
                 q_data_type=tdt)
    o, lse = wrapper.run(q, k, v, return_lse=True)
    torch.cuda.synchronize()
    assert o.shape == (M, hq, head_dim) and lse.shape == (M, hq)
    qn, kn, vn = to_np(q), to_np(k), to_np(v)
    if causal:
        ref_o, ref_lse = ref_bsr_gathered(qn, kn, vn, indptr, indices, R, C, True)
    else:
        ref_o, ref_lse = ref_request(qn, kn, vn, False, visible=dense_mask(indptr, indices, M, N, R, C))
    check(o, lse, ref_o, ref_lse, dtype)


# ======================================================================= GPU: single request
SINGLE_CASES = [  # dtype, head_dim, group, layout, causal, q_len, kv_len
    ("float16", 128, 4, "NHD", True, 128, 128), ("bfloat16", 128, 4, "HND", True, 77, 1000),
    ("float16", 64, 1, "HND", False, 1, 33), ("bfloat16", 256, 8, "NHD", False, 300, 300),
    ("float16", 256, 4, "HND", True, 200, 50), ("float16", 64, 8, "NHD", True, 513, 2000),
]


@pytest.mark.parametrize("dtype, head_dim, group, layout, causal, q_len, kv_len", SINGLE_CASES)
def test_single_prefill_gpu(torch_cuda, rng, poison, dtype, head_dim, group, layout, causal, q_len, kv_len):
    torch = torch_cuda
    tdt = getattr(torch, dtype)
    q = uniform(torch, rng, (q_len, HKV * group, head_dim), tdt, -2.0, 2.0)
    shape = (kv_len, HKV, head_dim) if layout == "NHD" else (HKV, kv_len, head_dim)
    k, v = uniform(torch, rng, shape, tdt), uniform(torch, rng, shape, tdt)
    o, lse = tessera.single_prefill_with_kv_cache(q, k, v, causal=causal, kv_layout=layout, return_lse=True)
    torch.cuda.synchronize()
    assert o.shape == q.shape and o.dtype == tdt and o.is_cuda
    kn, vn = to_np(k), to_np(v)
    if layout == "HND":
        kn, vn = kn.transpose(1, 0, 2), vn.transpose(1, 0, 2)
    ref_o, ref_lse = ref_request(to_np(q), kn, vn, causal)
    check(o, lse, ref_o, ref_lse, dtype)
    o2 = tessera.single_prefill_with_kv_cache(q, k, v, causal=causal, kv_layout=layout)
    torch.cuda.synchronize()
    assert torch.equal(o2, o)


# ======================================================================= GPU: CUDA graphs
def test_paged_gpu_cuda_graph_replay(torch_cuda, rng):
    """Capture run() for two layers; re-plan with new lengths within the bounds and replay."""
    torch = torch_cuda
    batch, page_size, pool, max_q = 5, 16, 300, 240
    wrapper = tessera.BatchPrefillWithPagedKVCacheWrapper(
        workspace(torch), "HND", use_cuda_graph=True,
        qo_indptr_buf=torch.empty(batch + 1, dtype=torch.int32, device="cuda"),
        paged_kv_indptr_buf=torch.empty(batch + 1, dtype=torch.int32, device="cuda"),
        paged_kv_indices_buf=torch.empty(pool, dtype=torch.int32, device="cuda"),
        paged_kv_last_page_len_buf=torch.empty(batch, dtype=torch.int32, device="cuda"))
    layers = [random_cache(torch, rng, "HND", pool, page_size, 128, torch.bfloat16, False) for _ in range(2)]
    qs = [uniform(torch, rng, (max_q, 8, 128), torch.bfloat16, -2.0, 2.0) for _ in range(2)]

    def step(total):
        q_lens = rng.multinomial(total, np.full(batch, 1.0 / batch))
        kv_lens = q_lens + rng.integers(0, 600, size=batch)
        pages = sum((n + page_size - 1) // page_size for n in kv_lens)
        return q_lens, kv_lens, make_table(rng, kv_lens, page_size, spare=pool - pages)

    def plan(s):
        # The first plan fixes max_total_q: it brings the largest step.
        wrapper.plan(indptr_of(s[0]), *s[2][:3], 8, HKV, 128, page_size, causal=True, q_data_type=torch.bfloat16)

    s = step(max_q)
    plan(s)
    for l in range(2):  # eager warm-up outside the capture
        wrapper.run(qs[l], layers[l][0])
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outs = [wrapper.run(qs[l], layers[l][0]) for l in range(2)]
    for i in range(4):
        if i > 0:
            s = step(int(rng.integers(max_q // 2, max_q + 1)))
            plan(s)
        for o in outs:
            o.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        qo, rows = indptr_of(s[0]), int(np.sum(s[0]))
        for l in range(2):
            _, k, v = layers[l]
            kn, vn = to_np(k), to_np(v)
            ref_o, _ = ref_batch(to_np(qs[l])[:rows], qo, lambda j: gather_pages(kn, vn, "HND", s[2], page_size, j),
                                 True)
            check(outs[l], None, ref_o, None, "bfloat16", rows=rows)
    big = step(max_q)
    big = (big[0] + np.eye(batch, dtype=np.int64)[0],) + big[1:]  # one more query than the first plan
    expect(ValueError, "max_total_q", lambda: plan(big))


def test_ragged_gpu_cuda_graph_replay(torch_cuda, rng):
    """Ragged: q and k / v allocated for the largest step; shorter steps replay the same graph."""
    torch = torch_cuda
    batch, max_q, max_kv = 3, 150, 1200
    wrapper = tessera.BatchPrefillWithRaggedKVCacheWrapper(
        workspace(torch), use_cuda_graph=True, qo_indptr_buf=torch.empty(batch + 1, dtype=torch.int32, device="cuda"))
    q = uniform(torch, rng, (max_q, 4, 64), torch.float16, -2.0, 2.0)
    k, v = (uniform(torch, rng, (max_kv, HKV, 64), torch.float16) for _ in range(2))
    steps = [([50, 50, 50], [400, 400, 400]), ([0, 120, 7], [10, 900, 7]), ([3, 1, 140], [3, 1000, 99])]
    for i, (q_lens, kv_lens) in enumerate(steps):
        qo, kv = indptr_of(q_lens), indptr_of(kv_lens)
        wrapper.plan(qo, kv, 4, HKV, 64, causal=True)
        if i == 0:
            wrapper.run(q, k, v)
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                out = wrapper.run(q, k, v)
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        kn, vn = to_np(k), to_np(v)
        ref_o, _ = ref_batch(to_np(q)[: qo[-1]], qo, lambda j: (kn[kv[j]: kv[j + 1]], vn[kv[j]: kv[j + 1]]), True)
        check(out, None, ref_o, None, "float16", rows=int(qo[-1]))


# ======================================================================= GPU: bad input
def test_gpu_bad_input(torch_cuda, rng):
    torch = torch_cuda
    q_lens, kv_lens = [4, 20], [4, 40]
    qo = indptr_of(q_lens)
    table = make_table(rng, kv_lens, 16)
    cache, _, _ = random_cache(torch, rng, "NHD", table[3], 16, 128, torch.float16, False)
    q = uniform(torch, rng, (24, 8, 128), torch.float16)

    wrapper = tessera.BatchPrefillWithPagedKVCacheWrapper(workspace(torch))
    wrapper.plan(qo, *table[:3], 8, HKV, 128, 16)
    expect(TypeError, "^q:", lambda: wrapper.run(q.bfloat16(), cache))
    expect(TypeError, "^kv:", lambda: wrapper.run(q, (cache[0].bfloat16(), cache[1].bfloat16())))
    expect(ValueError, "^q:", lambda: wrapper.run(q[:10], cache))
    expect(TypeError, "^q:", lambda: wrapper.run(q.cpu(), cache))
    expect(ValueError, "paged_kv_cache", lambda: wrapper.run(q, (cache[0],)))
    # The cache is smaller than the page table says.
    expect(ValueError, "^kv_indices:", lambda: wrapper.run(q, (cache[0][:1], cache[1][:1])))
    expect(ValueError, "not supported yet", lambda: wrapper.run(q, cache, k_scale=2.0))
    expect(ValueError, "^indices:", lambda: wrapper.plan(qo, table[0], table[1][:-1], table[2], 8, HKV, 128, 16))
    expect(ValueError, "plan", lambda: wrapper.run(q, cache))  # the failed plan left nothing to run

    fixed = tessera.BatchPrefillWithPagedKVCacheWrapper(
        workspace(torch), paged_kv_indptr_buf=torch.empty(2, dtype=torch.int32, device="cuda"),
        paged_kv_indices_buf=torch.empty(3, dtype=torch.int32, device="cuda"))
    expect(ValueError, "max_batch", lambda: fixed.plan(qo, *table[:3], 8, HKV, 128, 16))
    one = make_table(rng, [100], 16)  # 7 pages, 3 allowed
    expect(ValueError, "max_pages", lambda: fixed.plan([0, 4], *one[:3], 8, HKV, 128, 16))

    ragged = tessera.BatchPrefillWithRaggedKVCacheWrapper(workspace(torch))
    ragged.plan(qo, indptr_of(kv_lens), 8, HKV, 128)
    k = uniform(torch, rng, (44, HKV, 128), torch.float16)
    expect(ValueError, "^k:", lambda: ragged.run(q, k[:40], k))
    expect(ValueError, "^v:", lambda: ragged.run(q, k, k[:, :1]))

    bsr = tessera.BlockSparseAttentionWrapper(workspace(torch))
    bsr.plan(np.array([0, 1, 2], np.int32), np.array([0, 1], np.int32), 8, 32, 4, 16, 8, HKV, 128)
    expect(ValueError, "^k:", lambda: bsr.run(q[:8], k[:16], k[:32]))

    small = tessera.BatchPrefillWithPagedKVCacheWrapper(torch.empty(4096, dtype=torch.uint8, device="cuda"))
    expect(ValueError, "float_workspace_buffer", lambda: small.plan(qo, *table[:3], 8, HKV, 128, 16))
    expect(TypeError, "^k:", lambda: tessera.single_prefill_with_kv_cache(q, k.cpu(), k.cpu()))
    expect(TypeError, "^q:", lambda: tessera.single_prefill_with_kv_cache(q.float(), k, k))


# ======================================================================= CPU
def cpu_paged(**kwargs):
    return tessera.BatchPrefillWithPagedKVCacheWrapper(np.zeros(1024, dtype=np.uint8), **kwargs)


def paged_args(**kwargs):
    args = dict(qo_indptr=[0, 2, 5], paged_kv_indptr=[0, 1, 3], paged_kv_indices=[0, 2, 1],
                paged_kv_last_page_len=[5, 16], num_qo_heads=8, num_kv_heads=HKV, head_dim_qk=128, page_size=16)
    args.update(kwargs)
    return args


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


@pytest.mark.parametrize("option, value", [
    ("pos_encoding_mode", "ROPE_LLAMA"), ("rope_scale", 2.0), ("rope_theta", 1e4), ("head_dim_vo", 64)])
def test_plan_rejects_unsupported_options(option, value):
    expect(ValueError, "not supported yet", lambda: cpu_paged().plan(**paged_args(**{option: value})))
    ragged = tessera.BatchPrefillWithRaggedKVCacheWrapper(np.zeros(16, np.uint8))
    expect(ValueError, "not supported yet", lambda: ragged.plan([0, 2], [0, 4], 8, HKV, 128, **{option: value}))
    if option != "head_dim_vo":  # single_prefill has no head_dim_vo argument
        q = np.zeros((3, 8, 128), np.float32)
        expect(ValueError, "not supported yet",
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
    mask = np.ones(2 * 4, bool)
    expect(ValueError, "window_left", lambda: ragged.plan([0, 2], [0, 4], 8, HKV, 128, custom_mask=mask, window_left=3))
    expect(ValueError, "window_left", lambda: tessera.single_prefill_with_kv_cache(
        q[:2], q[:4, :2], q[:4, :2], custom_mask=np.ones((2, 4), bool), logits_soft_cap=5.0))
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
    (dict(mask=np.ones(4, bool)), ValueError, "not supported yet"),
    (dict(packed_mask=np.ones(4, np.uint8)), ValueError, "not supported yet"),
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
