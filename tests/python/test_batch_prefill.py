"""tessera prefill (paged / ragged / block-sparse wrappers, single_prefill)
against a float64 reference from the formula, per request: softmax(q k^T *
sm_scale) v, query head h reading KV head h // group; causal is bottom-right
(query i of q_len sees key j <= i + kv_len - q_len); rows that see no key give
o = 0, lse = -inf (base 2; prefill_reference.py). GPU tests ("skipped: no
GPU" without torch + CUDA) cover ~40 representative combinations of dtype,
head dim, group, page size, cache form, layout, causal and BSR block size,
with empty requests and q_len < / > kv_len, outputs poisoned with NaN; plus
CUDA-graph replay, growth and bad input. The CPU tests (validation,
single_prefill's CPU path, the oracle) are in test_batch_prefill_cpu.py.
"""

import numpy as np
import pytest

import tessera
from conftest import rel_error, to_np
from prefill_reference import (HKV, check, dense_mask, expect, gather_pages, indptr_of, make_table, random_bsr,
                               random_cache, ref_batch, ref_bsr_gathered, ref_request, uniform, workspace)

# (q_len, kv_len): no queries; no keys; one query; q_len == kv_len; chunked
# prefill (q_len < kv_len, several KV tiles); q_len > kv_len (under causal the
# first rows see nothing).
LENS = [(0, 10), (5, 0), (1, 300), (37, 37), (100, 190), (64, 577), (9, 3)]


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
                 q_data_type=tdt, o_data_type=tdt)  # FlashInfer's o_data_type default is float16 whatever q is
    o, lse = wrapper.run(q, k, v, return_lse=True)
    torch.cuda.synchronize()
    assert o.shape == (M, hq, head_dim) and lse.shape == (M, hq)
    qn, kn, vn = to_np(q), to_np(k), to_np(v)
    if causal:
        ref_o, ref_lse = ref_bsr_gathered(qn, kn, vn, indptr, indices, R, C, True)
    else:
        ref_o, ref_lse = ref_request(qn, kn, vn, False, visible=dense_mask(indptr, indices, M, N, R, C))
    check(o, lse, ref_o, ref_lse, dtype)


@pytest.mark.parametrize("R, C, dtype, head_dim, group, packed", [
    (1, 1, "float16", 128, 4, False), (4, 16, "bfloat16", 128, 1, True), (16, 4, "float16", 256, 8, False),
    (16, 16, "bfloat16", 64, 4, True), (4, 1, "float16", 128, 4, True)])
def test_bsr_mask_inside_blocks_gpu(torch_cuda, rng, poison, R, C, dtype, head_dim, group, packed):
    """FlashInfer's mask= / packed_mask= of the block-sparse plan: each block [R, C] keeps only its masked
    elements (rows that keep none get o = 0 and lse = -inf)."""
    torch = torch_cuda
    tdt = getattr(torch, dtype)
    hq, MB, NB = HKV * group, 6, 64 // C + 5
    M, N = MB * R, NB * C
    indptr, indices = random_bsr(rng, MB, NB)
    nnz = int(indptr[-1])
    elem = rng.random((nnz, R, C)) < 0.5
    elem[0] = False  # a block that hides everything
    visible = np.zeros((M, N), bool)
    for r in range(MB):
        for b in range(indptr[r], indptr[r + 1]):
            c = indices[b]
            visible[r * R:(r + 1) * R, c * C:(c + 1) * C] = elem[b]
    q = uniform(torch, rng, (M, hq, head_dim), tdt, -2.0, 2.0)
    k, v = uniform(torch, rng, (N, HKV, head_dim), tdt), uniform(torch, rng, (N, HKV, head_dim), tdt)
    mask = torch.from_numpy(elem).cuda()
    kw = dict(packed_mask=tessera.packbits(mask.reshape(-1), bitorder="little")) if packed else dict(mask=mask)
    wrapper = tessera.BlockSparseAttentionWrapper(workspace(torch))
    wrapper.plan(torch.from_numpy(indptr), torch.from_numpy(indices), M, N, R, C, hq, HKV, head_dim,
                 q_data_type=tdt, o_data_type=tdt, **kw)
    o, lse = wrapper.run(q, k, v, return_lse=True)
    torch.cuda.synchronize()
    ref_o, ref_lse = ref_request(to_np(q), to_np(k), to_np(v), False, visible=visible)
    check(o, lse, ref_o, ref_lse, dtype)
    o2 = wrapper.run(q, k, v)
    torch.cuda.synchronize()
    assert torch.equal(o2, o)


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
    expect(ValueError, "k_scale", lambda: wrapper.run(q, cache, k_scale=float("inf")))
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
