"""tessera.MultiLevelCascadeAttentionWrapper (composable formats) against a
float64 reference over each request's concatenated tokens (every level's
pages of its groups, in level order): three levels (a prefix all requests
share, group prefixes with one empty group, unique suffixes), page sizes 1
and 16, causal last level, soft-cap, GQA, fp16 / bf16, outputs poisoned;
CUDA-graph replay after re-plans with new lengths; argument errors (CPU).
"""

import numpy as np
import pytest

import tessera
from conftest import to_np
from prefill_reference import check, ref_request

HKV = 2
WORKSPACE_BYTES = 128 << 20


def make_levels(q_len, groups, tokens, page_size, rng):
    """Per level (qo_indptr, kv_indptr, indices, last) over a shuffled page
    pool, and per request the list of its (page ids, token count) runs."""
    n_pages = sum(-(-t // page_size) for lv in tokens for t in lv) + 2
    perm = rng.permutation(n_pages).astype(np.int32)
    nxt, levels, runs = 0, [], [[] for _ in q_len]
    for lv_groups, lv_tokens in zip(groups, tokens):
        qo, kv, idx, last, r = [0], [0], [], [], 0
        for size, t in zip(lv_groups, lv_tokens):
            pages = -(-t // page_size)
            ids = perm[nxt:nxt + pages]
            nxt += pages
            rows = 0
            for _ in range(size):
                rows += q_len[r]
                runs[r].append((ids, t))
                r += 1
            qo.append(qo[-1] + rows)
            idx.extend(ids.tolist())
            kv.append(len(idx))
            last.append(t - (pages - 1) * page_size if pages else 0)
        levels.append(tuple(np.array(a, dtype=np.int32) for a in (qo, kv, idx, last)))
    return levels, runs, n_pages


def reference(q, q_len, runs, k_pages, v_pages, causal, cap=0.0):
    """float64 (o, lse) of every request over its concatenated runs (k_pages: [pages, P, Hkv, D], NHD)."""
    P = k_pages.shape[1]
    o, lse, at = np.zeros(q.shape), np.full(q.shape[:2], -np.inf), 0
    for r, n in enumerate(q_len):
        toks = [(ids[j // P], j % P) for ids, t in runs[r] for j in range(t)]
        k = np.stack([k_pages[p, s] for p, s in toks]) if toks else np.zeros((0,) + k_pages.shape[2:])
        v = np.stack([v_pages[p, s] for p, s in toks]) if toks else np.zeros((0,) + v_pages.shape[2:])
        o[at:at + n], lse[at:at + n] = ref_request(q[at:at + n], k, v, causal, logits_soft_cap=cap)
        at += n
    return o, lse


Q_LEN = [1, 3, 1, 5, 1, 2, 4]
GROUPS = [[7], [3, 1, 3], [1] * 7]


def tokens_for(causal):
    return [[40], [70, 0, 33], [5, 9, 1 if causal else 0, 130, 12, 2, 4]]


@pytest.mark.parametrize("dtype,head_dim,group,page_size,causal,cap", [
    ("float16", 128, 4, 16, True, 0.0),
    ("float16", 128, 1, 1, False, 0.0),
    ("bfloat16", 64, 4, 1, True, 0.0),
    ("bfloat16", 128, 8, 16, False, 30.0),
    ("float16", 64, 1, 16, False, 0.0),
])
def test_cascade_matches_reference(torch_cuda, poison, rng, dtype, head_dim, group, page_size, causal, cap):
    torch = torch_cuda
    # Reproducible data. The fp16 error of a three-level cascade sits close to
    # the 1e-3 bound: each level's output is rounded to fp16 before the merges
    # (as in FlashInfer), 4e-4 .. 9e-4 over 12 seeds of the first case on the
    # H100, and one draw that depended on the suite's test order gave 1.0002e-3.
    torch.manual_seed(0)
    tdt = getattr(torch, dtype)
    tokens = tokens_for(causal)
    levels, runs, n_pages = make_levels(Q_LEN, GROUPS, tokens, page_size, rng)
    hq = HKV * group
    k = torch.randn(n_pages, page_size, HKV, head_dim, device="cuda").to(tdt)
    v = torch.randn_like(k)
    q = (2 * torch.randn(sum(Q_LEN), hq, head_dim, device="cuda")).to(tdt)
    ws = torch.empty(WORKSPACE_BYTES, dtype=torch.uint8, device="cuda")
    w = tessera.MultiLevelCascadeAttentionWrapper(3, ws, "NHD")
    w.plan(*[list(x) for x in zip(*levels)], hq, HKV, head_dim, page_size, causal=causal,
           logits_soft_cap=cap or None, q_data_type=tdt)
    o, lse = w.run(q, (k, v), return_lse=True)
    ref_o, ref_lse = reference(to_np(q).astype(np.float64), Q_LEN, runs, to_np(k).astype(np.float64),
                               to_np(v).astype(np.float64), causal, cap)
    check(o, lse, ref_o, ref_lse, dtype)
    again = w.run(q, (k, v))
    assert torch.equal(again, o)  # deterministic
    # HND cache, interleaved: the same bits
    w2 = tessera.MultiLevelCascadeAttentionWrapper(3, torch.empty_like(ws), "HND")
    w2.plan(*[list(x) for x in zip(*levels)], hq, HKV, head_dim, page_size, causal=causal,
            logits_soft_cap=cap or None, q_data_type=tdt)
    kv_hnd = torch.stack([k.transpose(1, 2), v.transpose(1, 2)], 1).contiguous()
    assert torch.equal(w2.run(q, kv_hnd), o)


def test_cascade_device_page_ids(torch_cuda, rng):
    """Page ids as CUDA tensors stay on the GPU: the same bits as host ids; a bad one is raised by the next run()."""
    torch = torch_cuda
    levels, _, n_pages = make_levels(Q_LEN, GROUPS, tokens_for(True), 16, rng)
    k = torch.randn(n_pages, 16, HKV, 128, device="cuda", dtype=torch.float16)
    v = torch.randn_like(k)
    q = torch.randn(sum(Q_LEN), 8, 128, device="cuda", dtype=torch.float16)
    w = tessera.MultiLevelCascadeAttentionWrapper(3, torch.empty(WORKSPACE_BYTES, dtype=torch.uint8, device="cuda"))
    qo, kv, idx, last = (list(x) for x in zip(*levels))

    def plan(ids):
        w.plan(qo, kv, ids, last, 8, HKV, 128, 16, causal=True)

    plan(idx)
    o_host = w.run(q, (k, v))
    plan([torch.from_numpy(np.append(x, -1).astype(np.int32)).cuda() for x in idx])  # longer buffers are fine
    assert torch.equal(w.run(q, (k, v)), o_host)
    bad = [torch.from_numpy(x.copy()).cuda() for x in idx]
    bad[1][2] = n_pages + 11
    plan(bad)
    w.run(q, (k, v))
    torch.cuda.synchronize()
    with pytest.raises(ValueError, match=f"page id {n_pages + 11}"):
        w.run(q, (k, v))
    plan([torch.from_numpy(x).cuda() for x in idx])
    assert torch.equal(w.run(q, (k, v)), o_host)


def test_cascade_single_level_equals_batch_prefill(torch_cuda, rng):
    """One level is a batch prefill: same bits as BatchPrefillWithPagedKVCacheWrapper."""
    torch = torch_cuda
    levels, _, n_pages = make_levels(Q_LEN, [[1] * 7], [[5, 9, 1, 130, 12, 2, 4]], 16, rng)
    k = torch.randn(n_pages, 16, HKV, 128, device="cuda", dtype=torch.float16)
    v = torch.randn_like(k)
    q = torch.randn(sum(Q_LEN), 8, 128, device="cuda", dtype=torch.float16)
    w = tessera.MultiLevelCascadeAttentionWrapper(1, torch.empty(WORKSPACE_BYTES, dtype=torch.uint8, device="cuda"))
    w.plan(*[list(x) for x in zip(*levels)], 8, HKV, 128, 16, causal=True)
    p = tessera.BatchPrefillWithPagedKVCacheWrapper(torch.empty(WORKSPACE_BYTES, dtype=torch.uint8, device="cuda"))
    p.plan(*levels[0], 8, HKV, 128, 16, causal=True)
    o, lse = w.run(q, (k, v), return_lse=True)
    o2, lse2 = p.run(q, (k, v), return_lse=True)
    assert torch.equal(o, o2) and torch.equal(lse, lse2)


def test_cascade_cuda_graph_replay(torch_cuda, rng):
    """Parallel generation: a shared prefix plus unique suffixes, captured once and replayed after re-plans
    (new prefix split, new lengths, more rows) within the first plan's bounds."""
    torch = torch_cuda
    steps = [([1] * 6, [[6], [1] * 6], [[1500], [3, 40, 17, 100, 1, 64]]),
             ([1, 2, 1, 1, 3, 1], [[2, 4], [1] * 6], [[900, 2100], [4, 41, 18, 101, 5, 65]]),
             ([1] * 6, [[6], [1] * 6], [[700], [9, 4, 1, 200, 16, 3]])]
    hq, d, P, rows_max = 8, 128, 16, 20  # buffers larger than the bound (16 rows) the first plan sets
    ws = torch.empty(WORKSPACE_BYTES, dtype=torch.uint8, device="cuda")
    w = tessera.MultiLevelCascadeAttentionWrapper(2, ws, use_cuda_graph=True)
    pool = 400
    k = torch.zeros(pool, P, HKV, d, device="cuda", dtype=torch.float16)
    v = torch.zeros_like(k)
    q = torch.zeros(rows_max, hq, d, device="cuda", dtype=torch.float16)
    out = torch.zeros(rows_max, hq, d, device="cuda", dtype=torch.float16)
    # The largest bounds first: 2 groups sharing all pool pages, then 16 one-row requests of one page each.
    w.plan([np.array([0, 8, 16], np.int32), np.arange(17, dtype=np.int32)],
           [np.array([0, 1, pool], np.int32), np.arange(17, dtype=np.int32)],
           [np.arange(pool, dtype=np.int32), np.arange(16, dtype=np.int32)],
           [np.array([16, 16], np.int32), np.full(16, 16, np.int32)], hq, HKV, d, P, causal=True)
    w.run(q, (k, v), out=out)  # loads the kernels
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        w.run(q, (k, v), out=out)
    for q_len, groups, tokens in steps:
        levels, runs, n_pages = make_levels(q_len, groups, tokens, P, rng)
        assert n_pages <= pool
        w.plan(*[list(x) for x in zip(*levels)], hq, HKV, d, P, causal=True)
        k.normal_()
        v.normal_()
        q.normal_()
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        n = sum(q_len)
        ref_o, ref_lse = reference(to_np(q[:n]).astype(np.float64), q_len, runs, to_np(k).astype(np.float64),
                                   to_np(v).astype(np.float64), True)
        check(out, None, ref_o, ref_lse, "float16", rows=n)
        assert torch.isnan(out[n:]).all()  # rows beyond the plan are left as they were
    with pytest.raises(ValueError, match="max_total_q"):
        w.plan([np.array([0, 17], np.int32), np.array([0, 17], np.int32)], [np.array([0, 1], np.int32)] * 2,
               [np.array([0], np.int32)] * 2, [np.array([16], np.int32)] * 2, hq, HKV, d, P, causal=True)


# ------------------------------------------------------------------ argument errors (no GPU needed)
def _ws():
    return np.zeros(16, dtype=np.uint8)


def test_cascade_constructor_errors():
    with pytest.raises(ValueError, match="num_levels"):
        tessera.MultiLevelCascadeAttentionWrapper(0, _ws())
    with pytest.raises(ValueError, match="kv_layout"):
        tessera.MultiLevelCascadeAttentionWrapper(2, _ws(), "NDH")
    with pytest.raises(ValueError, match="backend"):
        tessera.MultiLevelCascadeAttentionWrapper(2, _ws(), backend="cudnn")
    with pytest.raises(ValueError, match="qo_indptr_buf_arr: expected a list of 2"):
        tessera.MultiLevelCascadeAttentionWrapper(2, _ws(), qo_indptr_buf_arr=[np.zeros(3, np.int32)])


def test_cascade_plan_errors():
    w = tessera.MultiLevelCascadeAttentionWrapper(2, _ws())
    qo = [np.array([0, 3], np.int32), np.array([0, 1, 3], np.int32)]
    kv = [np.array([0, 1], np.int32), np.array([0, 1, 2], np.int32)]
    idx = [np.array([0], np.int32), np.array([1, 2], np.int32)]
    last = [np.array([16], np.int32), np.array([4, 7], np.int32)]
    args = (8, 2, 128, 16)
    with pytest.raises(ValueError, match="qo_indptr_arr: expected a list of 2"):
        w.plan(qo[:1], kv, idx, last, *args)
    with pytest.raises(ValueError, match="window_left"):
        w.plan(qo, kv, idx, last, *args, window_left=128)
    with pytest.raises(ValueError, match="pos_encoding_mode"):
        w.plan(qo, kv, idx, last, *args, pos_encoding_mode="ROPE_LLAMA")
    with pytest.raises(ValueError, match="num_qo_heads"):
        w.plan(qo, kv, idx, last, 6, 4, 128, 16)
    with pytest.raises(TypeError, match="q_data_type"):
        w.plan(qo, kv, idx, last, *args, q_data_type="float32")
    with pytest.raises(TypeError, match="qo_indptr_arr\\[1\\]"):
        w.plan([qo[0], np.array([0.0, 3.0])], kv, idx, last, *args)
    with pytest.raises(ValueError, match="run: expected plan"):
        w.run(np.zeros((3, 8, 128), np.float16), (np.zeros(1), np.zeros(1)))


def test_cascade_plan_errors_gpu(torch_cuda):
    """Level checks that need the C++ object (a CUDA workspace): totals that differ, bad page ids, q rows."""
    torch = torch_cuda
    w = tessera.MultiLevelCascadeAttentionWrapper(2, torch.empty(WORKSPACE_BYTES, dtype=torch.uint8, device="cuda"))
    qo = [np.array([0, 3], np.int32), np.array([0, 1, 3], np.int32)]
    kv = [np.array([0, 1], np.int32), np.array([0, 1, 2], np.int32)]
    idx = [np.array([0], np.int32), np.array([1, 2], np.int32)]
    last = [np.array([16], np.int32), np.array([4, 7], np.int32)]
    with pytest.raises(ValueError, match=r"levels\[1\]\.qo_indptr: expected the last entry"):
        w.plan(qo[:1] + [np.array([0, 1, 4], np.int32)], kv, idx, last, 8, 2, 128, 16)
    with pytest.raises(ValueError, match=r"levels\[1\]: indices"):
        w.plan(qo, kv, idx[:1] + [np.array([1, -2], np.int32)], last, 8, 2, 128, 16)
    w.plan(qo, kv, idx, last, 8, 2, 128, 16)
    k = torch.randn(3, 16, 2, 128, device="cuda", dtype=torch.float16)
    with pytest.raises(ValueError, match="q: expected at least the planned total"):
        w.run(torch.randn(2, 8, 128, device="cuda", dtype=torch.float16), (k, k))
    with pytest.raises(TypeError, match="q"):
        w.run(torch.randn(3, 8, 128, device="cuda", dtype=torch.bfloat16), (k, k))
    o = w.run(torch.randn(3, 8, 128, device="cuda", dtype=torch.float16), (k, k))
    assert not torch.isnan(o).any()
