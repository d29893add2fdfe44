"""The batch-decode tests' float64 reference and problem builders (shared by
test_batch_decode.py and test_device_page_ids.py): page tables over shuffled
pages, the paged reference gathered through the page table (then
conftest.ref_decode), random caches and queries on the GPU, and the check
against the reference."""

import numpy as np

from conftest import TOL, assert_lse_close, ref_decode, rel_error, to_np

HKV, GROUP, HEAD_DIM = 2, 4, 128
HQ = HKV * GROUP
WORKSPACE_BYTES = 128 << 20  # what FlashInfer users allocate


def make_table(rng, lens, page_size, spare=3):
    """A page table over shuffled pages: (indptr, indices, last_page_len, num_pages) as int32 numpy."""
    pages = [(n + page_size - 1) // page_size for n in lens]
    num_pages = sum(pages) + spare
    indptr = np.concatenate([[0], np.cumsum(pages)]).astype(np.int32)
    indices = rng.permutation(num_pages)[: indptr[-1]].astype(np.int32)
    last = np.array([n - (p - 1) * page_size if p else 0 for n, p in zip(lens, pages)], dtype=np.int32)
    return indptr, indices, last, num_pages


def ref_batch_decode(q, k_cache, v_cache, layout, indptr, indices, last, page_size, sm_scale=None, **options):
    """float64 (o [B, Hq, D], lse [B, Hq]) from numpy caches [P, ps, H, D] (NHD) or [P, H, ps, D] (HND)."""
    q, k_cache, v_cache = (np.asarray(x, dtype=np.float64) for x in (q, k_cache, v_cache))
    if layout == "HND":
        k_cache, v_cache = k_cache.transpose(0, 2, 1, 3), v_cache.transpose(0, 2, 1, 3)
    hkv, d = k_cache.shape[2], k_cache.shape[3]
    o, lse = np.zeros(q.shape), np.zeros(q.shape[:2])
    for b in range(q.shape[0]):
        pages = indices[indptr[b]: indptr[b + 1]]
        n = 0 if len(pages) == 0 else (len(pages) - 1) * page_size + int(last[b])
        k = k_cache[pages].reshape(-1, hkv, d)[:n]
        v = v_cache[pages].reshape(-1, hkv, d)[:n]
        o[b], lse[b] = ref_decode(q[b], k, v, "NHD", sm_scale, **options)  # options: window_left, logits_soft_cap
    return o, lse


def page_shape(layout, num_pages, page_size, heads=HKV, head_dim=HEAD_DIM):
    return (num_pages, page_size, heads, head_dim) if layout == "NHD" else (num_pages, heads, page_size, head_dim)


def random_cache(torch, rng, layout, num_pages, page_size, dtype, interleaved):
    """(paged_kv_cache as run() takes it, k_cache, v_cache) on the GPU."""
    shape = page_shape(layout, num_pages, page_size)
    if interleaved:
        kv = rng.standard_normal((shape[0], 2) + shape[1:]).astype(np.float32)
        cache = torch.from_numpy(kv).to("cuda").to(dtype)
        return cache, cache[:, 0], cache[:, 1]
    k, v = (torch.from_numpy(rng.standard_normal(shape).astype(np.float32)).to("cuda").to(dtype) for _ in range(2))
    return (k, v), k, v


def random_q(torch, rng, batch, dtype):
    return torch.from_numpy(rng.standard_normal((batch, HQ, HEAD_DIM)).astype(np.float32) * 2).to("cuda").to(dtype)


def workspace(torch):
    return torch.empty(WORKSPACE_BYTES, dtype=torch.uint8, device="cuda")


def check(o, lse, ref_o, ref_lse, dtype):
    err = rel_error(to_np(o), ref_o)
    assert err < TOL[dtype], f"error {err}"
    if lse is not None:
        assert_lse_close(to_np(lse), ref_lse, 1e-3)
