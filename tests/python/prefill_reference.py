"""The float64 prefill reference of the Python tests (from the formula, per
request: softmax(q k^T * sm_scale) v, query head h reading KV head
h // group, causal bottom-right, rows without keys o = 0 and lse = -inf),
with the page-table and block-sparse layouts it is checked on and the
comparison the tests use. Shared by test_batch_prefill.py (GPU) and
test_batch_prefill_cpu.py."""

import numpy as np
import pytest

import tessera

from conftest import TOL, rel_error, to_np

HKV = 2  # KV heads of most cases
WORKSPACE_BYTES = 128 << 20

def ref_request(q, k, v, causal, sm_scale=None, visible=None, window_left=-1, logits_soft_cap=0.0,
                alibi_slopes=None):
    """float64 (o [n, Hq, Dv], lse [n, Hq]) of q [n, Hq, D] over k [L, Hkv, D], v [L, Hkv, Dv] (Dv: D, or
    head_dim_vo); visible: optional bool [n, L]. The default sm_scale is 1 / sqrt(D), q's and k's head dim.

    window_left >= 0: query i sees keys j >= i + L - n - window_left; alibi_slopes [Hq]: FlashInfer's ALiBi, each
    logit (after sm_scale) gains slope * (j - i); logits_soft_cap > 0: then each logit x becomes cap * tanh(x / cap)."""
    q, k, v = (np.asarray(x, dtype=np.float64) for x in (q, k, v))
    (n, hq, d), L = q.shape, k.shape[0]
    group = hq // k.shape[1]
    scale = 1.0 / np.sqrt(d) if sm_scale is None else sm_scale
    vis = np.ones((n, L), dtype=bool) if visible is None else np.asarray(visible, dtype=bool).copy()
    if causal:
        vis &= np.arange(L)[None, :] <= np.arange(n)[:, None] + (L - n)
    if window_left >= 0:
        vis &= np.arange(L)[None, :] >= np.arange(n)[:, None] + (L - n) - window_left
    o, lse = np.zeros((n, hq, v.shape[2])), np.full((n, hq), -np.inf)
    for h in range(hq):
        s = q[:, h, :] @ k[:, h // group, :].T * scale  # natural-base logits
        if alibi_slopes is not None:
            s = s + float(alibi_slopes[h]) * (np.arange(L)[None, :] - np.arange(n)[:, None])
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
    """Concatenated per-request references; kv_of(i) -> (k, v) [kv_len_i, Hkv, D] / [.., Dv] of request i (o has
    v's head dim)."""
    q = np.asarray(q, dtype=np.float64)
    o, lse = np.zeros(q.shape), np.full(q.shape[:2], -np.inf)
    for i in range(len(qo_indptr) - 1):
        a, b = qo_indptr[i], qo_indptr[i + 1]
        k, v = kv_of(i)
        if o.shape[2] != v.shape[2]:
            o = np.zeros(q.shape[:2] + (v.shape[2],))
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
    hkv = k_cache.shape[2]
    return k_cache[pages].reshape(-1, hkv, k_cache.shape[3])[:n], v_cache[pages].reshape(-1, hkv, v_cache.shape[3])[:n]


def uniform(torch, rng, shape, dtype, lo=-1.0, hi=1.0):
    return torch.from_numpy(rng.uniform(lo, hi, size=shape).astype(np.float32)).to("cuda").to(dtype)


def random_cache(torch, rng, layout, num_pages, page_size, head_dim, dtype, interleaved, head_dim_vo=None):
    """(paged_kv_cache as run() takes it, k_cache, v_cache) on the GPU; head_dim_vo: V's head dim (None: head_dim)."""
    page = (page_size, HKV) if layout == "NHD" else (HKV, page_size)
    if interleaved:
        cache = uniform(torch, rng, (num_pages, 2) + page + (head_dim,), dtype)
        return cache, cache[:, 0], cache[:, 1]
    k, v = (uniform(torch, rng, (num_pages,) + page + (d,), dtype) for d in (head_dim, head_dim_vo or head_dim))
    return (k, v), k, v


def run_batch(torch, rng, q, qo, kv_lens, hq, head_dim, dtype, page_size, plan_kwargs, wrapper_kwargs=None,
              head_dim_vo=None):
    """Plans and runs a paged (page_size > 0: shuffled NHD pages) or a ragged (page_size 0) prefill wrapper over
    random KV of kv_lens tokens per request (V of head_dim_vo features, None: head_dim); returns (o, lse, kv_of),
    kv_of(i) -> request i's (k, v) in numpy."""
    wrapper_kwargs = wrapper_kwargs or {}
    if head_dim_vo is not None:
        plan_kwargs = dict(plan_kwargs, head_dim_vo=head_dim_vo)
    if page_size:
        table = make_table(rng, kv_lens, page_size)
        cache, k, v = random_cache(torch, rng, "NHD", table[3], page_size, head_dim, dtype, False, head_dim_vo)
        w = tessera.BatchPrefillWithPagedKVCacheWrapper(workspace(torch), **wrapper_kwargs)
        w.plan(qo, *table[:3], hq, HKV, head_dim, page_size, q_data_type=dtype, **plan_kwargs)
        o, lse = w.run(q, cache, return_lse=True)
        kn, vn = to_np(k), to_np(v)
        return o, lse, lambda i: gather_pages(kn, vn, "NHD", table, page_size, i)
    kv = indptr_of(kv_lens)
    k, v = (uniform(torch, rng, (int(kv[-1]), HKV, d), dtype) for d in (head_dim, head_dim_vo or head_dim))
    w = tessera.BatchPrefillWithRaggedKVCacheWrapper(workspace(torch), **wrapper_kwargs)
    w.plan(qo, kv, hq, HKV, head_dim, q_data_type=dtype, **plan_kwargs)
    o, lse = w.run(q, k, v, return_lse=True)
    kn, vn = to_np(k), to_np(v)
    return o, lse, lambda i: (kn[kv[i]: kv[i + 1]], vn[kv[i]: kv[i + 1]])


def expect(error, name, fn):
    """fn() raises `error` whose message names `name`."""
    with pytest.raises(error, match=name):
        fn()


def workspace(torch):
    return torch.empty(WORKSPACE_BYTES, dtype=torch.uint8, device="cuda")


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


def cpu_paged(**kwargs):
    """A paged prefill wrapper on a host buffer: for plan() checks that need no GPU."""
    return tessera.BatchPrefillWithPagedKVCacheWrapper(np.zeros(1024, dtype=np.uint8), **kwargs)


def paged_args(**kwargs):
    """plan() arguments of a small valid paged batch (two requests, page 16), with overrides."""
    args = dict(qo_indptr=[0, 2, 5], paged_kv_indptr=[0, 1, 3], paged_kv_indices=[0, 2, 1],
                paged_kv_last_page_len=[5, 16], num_qo_heads=8, num_kv_heads=HKV, head_dim_qk=128, page_size=16)
    args.update(kwargs)
    return args
