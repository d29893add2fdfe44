"""shared_prefix="auto" (tessera/_auto_prefix.py): composable formats found
from the page table.

CPU: tessera._C.find_shared_prefixes through the binding, on random tables
(forks at and inside page boundaries, several interleaved groups, requests
inside the shared prefix, ids reused at other positions): both levels,
expanded to per-request key lists in the caller's row order, give each
request exactly its keys, once, in order; deterministic; the host time of a
256 x 4k-token step; the plan() argument checks.

GPU (skipped without one): decode and paged prefill with "auto" against the
float64 reference on tables that share (the cascade path, forced with a zero
byte threshold), causal prefill with queries that cut the shared prefix, and
steps without sharing worth it: the normal path, bitwise equal to
shared_prefix=None; the decode wrapper's CUDA-graph mode, split by the C++
wrapper (one captured graph replaying steps with and without groups).
"""

import time

import numpy as np
import pytest

import tessera
from tessera import _C
from conftest import to_np

PAGE = 16


# ======================================================================= tables
def table_of(requests, page_size=PAGE):
    """(kv_indptr, kv_indices, last_page_len) int32 of [(page ids, tokens)]."""
    indptr = np.concatenate([[0], np.cumsum([len(p) for p, _ in requests])]).astype(np.int32)
    indices = np.array([i for p, _ in requests for i in p], dtype=np.int32)
    last = np.array([t - (len(p) - 1) * page_size if p else 0 for p, t in requests], dtype=np.int32)
    return indptr, indices, last


def random_requests(rng, page_size, n_requests, n_prompts=3, prompt_pages=6):
    """Requests continuing random prompts: forks at page boundaries, inside a page (a copied page, new id) or
    ending inside a prompt page; then own pages, some of them ids other requests hold at other positions.
    Returns (requests, number of page ids used)."""
    next_id = 0
    prompts = []
    for _ in range(n_prompts):
        prompts.append(list(range(next_id, next_id + int(rng.integers(1, prompt_pages + 1)))))
        next_id += len(prompts[-1])
    reqs, recent = [], []
    for _ in range(n_requests):
        pages, tokens, ends_inside = [], 0, False
        which = int(rng.integers(-1, n_prompts))
        if which >= 0:
            p = prompts[which]
            tokens = int(rng.integers(0, len(p) * page_size + 1))
            whole, part = divmod(tokens, page_size)
            pages = p[:whole]
            if part:
                ends_inside = bool(rng.integers(0, 3) == 0)
                pages = pages + [p[whole] if ends_inside else next_id]
                next_id += 0 if ends_inside else 1
        own = 0 if ends_inside else int(rng.integers(0, 3 * page_size + 1))
        if own:
            room = page_size - tokens % page_size if tokens % page_size else 0
            left = own - min(own, room)
            tokens += own
            while left > 0:
                if recent and rng.integers(0, 6) == 0:
                    pages.append(recent[int(rng.integers(0, len(recent)))])
                else:
                    pages.append(next_id)
                    next_id += 1
                left -= min(left, page_size)
        if not pages:
            tokens = 0
        recent.extend(pages[1:])
        reqs.append((pages, tokens))
    return reqs, next_id


def keys_of(indptr, indices, last, e, page_size):
    """[(page id, slot)] of entry e of a page table (level)."""
    out = []
    for j in range(indptr[e], indptr[e + 1]):
        n = last[e] if j + 1 == indptr[e + 1] else page_size
        out.extend((int(indices[j]), s) for s in range(n))
    return out


def check_levels(split, table, qo, page_size, causal=False):
    """The levels of a split, expanded per caller row: each row's keys are its request's flat keys."""
    indptr, indices, last = table
    n = len(indptr) - 1
    qo = np.arange(n + 1, dtype=np.int32) if qo is None else qo
    total = int(qo[-1])
    row_order = split["row_order"] if not split["identity_order"] else np.arange(total)
    assert len(row_order) == total and sorted(row_order.tolist()) == list(range(total))
    sh, un = split["shared"], split["unique"]
    assert sh[0][-1] == total and un[0][-1] == total
    request_of_row = np.repeat(np.arange(n), np.diff(qo))
    for level_row, row in enumerate(row_order):
        r = request_of_row[row]
        got = []
        for lv in (sh, un):
            e = int(np.searchsorted(lv[0], level_row, side="right")) - 1
            got.extend(keys_of(lv[1], lv[2], lv[3], e, page_size))
        want = keys_of(indptr, indices, last, r, page_size)
        assert got == want, f"row {row} (request {r})"
        if causal:  # unmasked shared keys precede every query of the request
            e = int(np.searchsorted(sh[0], level_row, side="right")) - 1
            shared = len(keys_of(sh[1], sh[2], sh[3], e, page_size))
            assert shared == 0 or shared <= len(want) - (qo[r + 1] - qo[r])


# ======================================================================= CPU: detection through the binding
@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("mode", ["decode", "prefill", "causal"])
def test_detection_recomposes_every_key(rng, page_size, mode):
    splits = reordered = 0
    for _ in range(150):
        reqs, _ = random_requests(rng, page_size, int(rng.integers(1, 20)))
        table = table_of(reqs, page_size)
        qo = None
        if mode != "decode":
            # Causal: mostly fewer queries than keys (else nothing can be shared), some more.
            most = [max(2, t // 2 if mode == "causal" else 30) for _, t in reqs]
            q_lens = np.where(rng.integers(0, 4, len(reqs)) == 0, 0, [int(rng.integers(1, m + 1)) for m in most])
            qo = np.concatenate([[0], np.cumsum(q_lens)]).astype(np.int32)
        split = _C.find_shared_prefixes(*table, page_size, qo, causal=mode == "causal")
        again = _C.find_shared_prefixes(*table, page_size, qo, causal=mode == "causal")
        for key in ("order", "row_order", "groups"):
            np.testing.assert_array_equal(split[key], again[key])
        for a, b in zip(split["shared"] + split["unique"], again["shared"] + again["unique"]):
            np.testing.assert_array_equal(a, b)
        if not split["split"]:
            assert split["groups"].shape[0] == 0
            continue
        splits += 1
        reordered += not split["identity_order"]
        check_levels(split, table, qo, page_size, causal=mode == "causal")
    assert splits > 30 and reordered > 5


def test_detection_rule_by_hand():
    ps = PAGE
    reqs = [([0, 1, 2], 40),     # shares pages 0, 1 with request 3
            ([10, 11, 12], 48),  # shares 10, 11 with 4 and 5
            ([20], 3),           # alone
            ([0, 1, 3], 33),
            ([10, 11, 13], 40),
            ([10, 11], 32)]      # every page shared (its last page full)
    table = table_of(reqs, ps)
    split = _C.find_shared_prefixes(*table, ps, None)
    assert split["split"]
    np.testing.assert_array_equal(split["groups"], [[0, 2, 2], [2, 3, 2]])
    np.testing.assert_array_equal(split["order"], [0, 3, 1, 4, 5, 2])
    assert split["saved_pages"] == 2 + 4
    check_levels(split, table, None, ps)
    # A fork inside page 2 (request 0 fills 5 of its slots): page 2 is not shared.
    fork = table_of([([0, 1, 2], 37), ([0, 1, 2, 3], 55)], ps)
    split = _C.find_shared_prefixes(*fork, ps, None)
    np.testing.assert_array_equal(split["groups"], [[0, 2, 2]])
    # Ids reused at other positions are not shared.
    moved = table_of([([5, 6, 7], 48), ([9, 5, 6], 48), ([7, 6, 5], 48)], ps)
    assert not _C.find_shared_prefixes(*moved, ps, None)["split"]
    # Below min_saved_pages: found, not split.
    split = _C.find_shared_prefixes(*fork, ps, None, min_saved_pages=3)
    assert not split["split"] and split["saved_pages"] == 2 and split["groups"].shape[0] == 1


def test_graph_mode_detection_keeps_order_and_long_prompts():
    """The CUDA-graph mode's detection (what DecodeOptions::shared_prefix runs: keep_order, always_levels, groups
    of at least GRAPH_MIN_SHARED_TOKENS tokens): levels on every step, groups only of adjacent requests, the
    caller's row order; still exact."""
    from tessera import _auto_prefix
    pages = -(-_auto_prefix.GRAPH_MIN_SHARED_TOKENS // PAGE)
    long_a, long_b, short = list(range(pages)), list(range(100, 100 + pages)), [200, 201]
    reqs = [(long_a + [300], pages * PAGE + 5), (long_a + [301], pages * PAGE + 9),  # adjacent: a group
            (short + [302], 2 * PAGE + 1), (short + [303], 2 * PAGE + 2),            # too short: none
            (long_b + [304], pages * PAGE + 1), ([400], 7), (long_b + [305], pages * PAGE + 3),  # apart: none
            (long_a + [306], pages * PAGE + 4)]                                      # apart from its prompt's run
    table = table_of(reqs)

    def graph_mode(t):
        return _C.find_shared_prefixes(*t, PAGE, None, min_shared_pages=pages, min_saved_pages=0, keep_order=True,
                                       always_levels=True)
    split = graph_mode(table)
    assert split["split"] and split["identity_order"]
    np.testing.assert_array_equal(split["groups"], [[0, 2, pages]])
    check_levels(split, table, None, PAGE)
    alone = table_of([([r], 7) for r in range(4)])
    split = graph_mode(alone)  # nothing shared: levels all the same
    assert split["split"] and split["groups"].shape[0] == 0
    check_levels(split, alone, None, PAGE)
    host = _auto_prefix.AutoPrefix("NHD", "auto")  # without graphs: the short prompt and the runs apart group
    assert host.detect(*table, PAGE, None, False, 0)["groups"].shape[0] == 3


def test_detection_errors_name_the_argument():
    indptr, indices, last = table_of([([0, 1], 20), ([0, 1], 20)])
    with pytest.raises(ValueError, match="page_size"):
        _C.find_shared_prefixes(indptr, indices, last, 0, None)
    with pytest.raises(ValueError, match="last_page_len"):
        _C.find_shared_prefixes(indptr, indices, np.array([4, 17], np.int32), PAGE, None)
    with pytest.raises(ValueError, match="qo_indptr"):
        _C.find_shared_prefixes(indptr, indices, last, PAGE, np.array([0, 1], np.int32))
    with pytest.raises(ValueError, match="min_shared_pages"):
        _C.find_shared_prefixes(indptr, indices, last, PAGE, None, min_shared_pages=0)
    with pytest.raises(TypeError, match="kv_indices"):
        _C.find_shared_prefixes(indptr, indices.astype(np.int64), last, PAGE, None)


def test_detection_host_time_256_requests_4k_tokens():
    """256 requests x 4096 tokens (page 16), 32 prompts of 2048 tokens shared by 8 requests each: the C++ time
    and the binding call's (numpy arrays out)."""
    pages, shared = 4096 // PAGE, 2048 // PAGE
    reqs, nxt = [], 0
    for r in range(256):
        if r % 8 == 0:
            prompt = list(range(nxt, nxt + shared))
            nxt += shared
        reqs.append((prompt + list(range(nxt, nxt + pages - shared)), pages * PAGE - 7))
        nxt += pages - shared
    table = table_of(reqs)
    cpp, call = [], []
    for _ in range(31):
        t0 = time.perf_counter()
        split = _C.find_shared_prefixes(*table, PAGE, None)
        call.append((time.perf_counter() - t0) * 1e6)
        cpp.append(split["host_us"])
    assert split["split"] and split["groups"].shape[0] == 32
    print(f"\nfind_shared_prefixes 256 x 4096 tokens: {np.median(cpp):.1f} us in C++, "
          f"{np.median(call):.1f} us per binding call (median of 31)")
    assert np.median(cpp) < 20000  # a guard against a quadratic path, not a benchmark bound


# ======================================================================= CPU: plan() arguments
def test_shared_prefix_argument_is_checked():
    table = table_of([([0, 1], 20), ([0, 1], 20)])
    buf = np.zeros(1024, np.uint8)
    d = tessera.BatchDecodeWithPagedKVCacheWrapper(buf)
    with pytest.raises(ValueError, match="shared_prefix"):
        d.plan(*table, 8, 2, 128, PAGE, shared_prefix="always")
    with pytest.raises(ValueError, match="shared_prefix"):
        d.plan(*table, 8, 2, 128, PAGE, shared_prefix=True)
    p = tessera.BatchPrefillWithPagedKVCacheWrapper(buf)
    with pytest.raises(ValueError, match="shared_prefix"):
        p.plan(np.array([0, 1, 2], np.int32), *table, 8, 2, 128, PAGE, shared_prefix="on")


@pytest.mark.parametrize("name, kwargs", [
    ("window_left", dict(window_left=64)),
    ("pos_encoding_mode", dict(pos_encoding_mode="ROPE_LLAMA")),
    ("kv_data_type", dict(kv_data_type="float8_e4m3fn")),
    ("o_data_type", dict(o_data_type="bfloat16")),
    ("fixed_split_size", dict(fixed_split_size=4)),
    ("disable_split_kv", dict(disable_split_kv=True)),
    ("q_len_per_req", dict(q_len_per_req=2)),
])
def test_decode_auto_refuses_what_it_does_not_combine_with(name, kwargs):
    table = table_of([([0, 1], 20), ([0, 1], 20)])
    for graph in (False, True):
        w = tessera.BatchDecodeWithPagedKVCacheWrapper(np.zeros(1024, np.uint8), use_cuda_graph=graph)
        with pytest.raises(tessera.NotSupportedError, match=name):
            w.plan(*table, 8, 2, 128, PAGE, shared_prefix="auto", **kwargs)


@pytest.mark.parametrize("name, kwargs", [
    ("window_left", dict(window_left=64)),
    ("pos_encoding_mode", dict(pos_encoding_mode="ALIBI")),
    ("custom_mask", dict(custom_mask=np.ones(2 * 20, bool))),
    ("head_dim_vo", dict(head_dim_qk=192, head_dim_vo=128)),
    ("o_data_type", dict(o_data_type="bfloat16")),
    ("fixed_split_size", dict(fixed_split_size=4)),
    ("disable_split_kv", dict(disable_split_kv=True)),
])
def test_prefill_auto_refuses_what_it_does_not_combine_with(name, kwargs):
    indptr, indices, last = table_of([([0, 1], 20), ([0, 1], 20)])
    qo = np.array([0, 1, 2], np.int32)
    args = dict(head_dim_qk=128)
    args.update(kwargs)
    for graph in (False, True):
        w = tessera.BatchPrefillWithPagedKVCacheWrapper(np.zeros(1024, np.uint8), use_cuda_graph=graph)
        with pytest.raises(tessera.NotSupportedError, match=name):
            w.plan(qo, indptr, indices, last, 8, 2, page_size=PAGE, shared_prefix="auto", **args)


# ======================================================================= GPU
HKV, HQ, D = 2, 8, 128
TOL = {"float16": 2e-3, "bfloat16": 1.6e-2}


def gpu_cache(torch, rng, num_pages, dtype):
    k, v = (torch.from_numpy(rng.uniform(-1, 1, (num_pages, PAGE, HKV, D)).astype(np.float32)).to("cuda").to(dtype)
            for _ in range(2))
    return k, v


def reference(q, qo, table, k, v, causal):
    """float64 (o, lse base 2) of each request over its keys through the flat table."""
    from prefill_reference import ref_request
    indptr, indices, last = table
    kn, vn = to_np(k), to_np(v)
    q = to_np(q)
    o, lse = np.zeros(q.shape), np.full(q.shape[:2], -np.inf)
    for r in range(len(indptr) - 1):
        keys = keys_of(indptr, indices, last, r, PAGE)
        kk = np.stack([kn[p, s] for p, s in keys]) if keys else np.zeros((0, HKV, D))
        vv = np.stack([vn[p, s] for p, s in keys]) if keys else np.zeros((0, HKV, D))
        a, b = qo[r], qo[r + 1]
        o[a:b], lse[a:b] = ref_request(q[a:b], kk, vv, causal)
    return o, lse


def check(o, lse, ref_o, ref_lse, dtype):
    got = to_np(o)
    assert not np.isnan(got).any()
    err = np.abs(got - ref_o).max() / max(np.abs(ref_o).max(), 1e-6)
    assert err < TOL[dtype], f"error {err}"
    fin = np.isfinite(ref_lse)
    np.testing.assert_array_equal(np.isneginf(to_np(lse)), np.isneginf(ref_lse))
    assert np.abs(to_np(lse)[fin] - ref_lse[fin]).max() < 1e-3 * max(1.0, np.abs(ref_lse[fin]).max())


def sharing_requests(rng, n=12):
    """Interleaved groups, a mid-page fork, a request inside the prefix, a reused id, requests alone."""
    reqs, _ = random_requests(rng, PAGE, n, n_prompts=3, prompt_pages=8)
    reqs += [(list(range(0, 4)), 4 * PAGE)]  # continues prompt 0 exactly: shares its pages if they match
    return reqs


def workspace(torch):
    return torch.empty(128 << 20, dtype=torch.uint8, device="cuda")


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_decode_auto_matches_reference(torch_cuda, poison, rng, dtype):
    torch = torch_cuda
    for seed in range(4):
        rng = np.random.default_rng(seed)
        reqs = sharing_requests(rng)
        table = table_of(reqs)
        num_pages = max(int(table[1].max()) + 1, 1) + 2
        k, v = gpu_cache(torch, rng, num_pages, getattr(torch, dtype))
        q = torch.from_numpy(rng.standard_normal((len(reqs), HQ, D)).astype(np.float32)).to("cuda").to(
            getattr(torch, dtype))
        w = tessera.BatchDecodeWithPagedKVCacheWrapper(workspace(torch))
        w._shared_prefix_min_bytes = 0  # split whenever a group shares a page
        w.plan(*table, HQ, HKV, D, PAGE, q_data_type=dtype, shared_prefix="auto")
        stats = w.shared_prefix_stats
        split = _C.find_shared_prefixes(*table, PAGE, None, min_saved_pages=0)
        assert stats["split"] == split["split"]
        o, lse = w.run(q, (k, v), return_lse=True)
        ref_o, ref_lse = reference(q, np.arange(len(reqs) + 1), table, k, v, False)
        check(o, lse, ref_o, ref_lse, dtype)


def test_decode_auto_takes_the_cascade_and_scales(torch_cuda, rng):
    """Parallel samples of one prompt, interleaved with other requests: the cascade path, with q_scale /
    v_scale and sinks as run() options; tensor scales are refused."""
    torch = torch_cuda
    prompt = list(range(40))
    reqs, nxt = [], 100
    for r in range(16):
        if r % 3 == 2:
            reqs.append((list(range(nxt, nxt + 5)), 5 * PAGE - 3))
            nxt += 5
        else:
            reqs.append((prompt + [nxt], 40 * PAGE + 1 + r))
            nxt += 1
    table = table_of(reqs)
    k, v = gpu_cache(torch, rng, nxt + 1, torch.float16)
    q = torch.from_numpy(rng.standard_normal((16, HQ, D)).astype(np.float32)).to("cuda").half()
    w = tessera.BatchDecodeWithPagedKVCacheWrapper(workspace(torch))
    w._shared_prefix_min_bytes = 0
    w.plan(*table, HQ, HKV, D, PAGE, shared_prefix="auto")
    assert w.shared_prefix_stats["split"] and w.shared_prefix_stats["groups"] == 1
    o, lse = w.run(q, (k, v), return_lse=True)
    ref_o, ref_lse = reference(q, np.arange(17), table, k, v, False)
    check(o, lse, ref_o, ref_lse, "float16")
    o2 = w.run(q, (k, v), q_scale=2.0, v_scale=0.5)
    ref2, _ = reference(q * 2, np.arange(17), table, k, v, False)
    assert np.abs(to_np(o2) - 0.5 * ref2).max() / np.abs(ref2).max() < TOL["float16"]
    # Sinks: each row's state merged with (0, sink * log2(e)).
    sinks = torch.linspace(-2.0, 3.0, HQ, device="cuda")
    o3, lse3 = w.run(q, (k, v), return_lse=True, sinks=sinks)
    s = to_np(sinks)[None, :] * np.log2(np.e)
    keep = 1.0 / (1.0 + np.exp2(s - ref_lse))
    check(o3, lse3, ref_o * keep[..., None], np.logaddexp2(ref_lse, s), "float16")
    with pytest.raises(tessera.NotSupportedError, match="k_scale"):
        w.run(q, (k, v), k_scale=torch.ones(1, device="cuda"))


@pytest.mark.parametrize("tables", ["unique", "below_threshold"])
def test_decode_without_sharing_is_the_normal_path(torch_cuda, rng, tables):
    torch = torch_cuda
    if tables == "unique":
        reqs = [(list(range(5 * r, 5 * r + 5)), 5 * PAGE - r) for r in range(8)]
    else:  # shares, but far below 16 MiB of reads
        reqs = [([0, 1] + [10 + r], 2 * PAGE + 3) for r in range(8)]
    table = table_of(reqs)
    k, v = gpu_cache(torch, rng, int(table[1].max()) + 1, torch.float16)
    q = torch.from_numpy(rng.standard_normal((8, HQ, D)).astype(np.float32)).to("cuda").half()
    outs = []
    for auto in (None, "auto"):
        w = tessera.BatchDecodeWithPagedKVCacheWrapper(workspace(torch))
        w.plan(*table, HQ, HKV, D, PAGE, shared_prefix=auto)
        outs.append(w.run(q, (k, v), return_lse=True))
        if auto:
            assert not w.shared_prefix_stats["split"]
    assert torch.equal(outs[0][0], outs[1][0]) and torch.equal(outs[0][1], outs[1][1])


def captured(torch, run):
    """A CUDA graph of run(), captured after two warm-up calls (the JIT loads outside the capture)."""
    for _ in range(2):
        run()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        run()
    return graph


def test_decode_auto_in_cuda_graphs(torch_cuda, rng):
    """use_cuda_graph=True: one graph captured on a step without sharing replays later plans with adjacent
    groups (merged into the output by the shared level's kernel), groups the batch does not keep together,
    prompts shorter than GRAPH_MIN_SHARED_TOKENS and one without sharing again, each against the float64
    reference; counts beyond the graph buffers name them."""
    from tessera import _auto_prefix
    torch = torch_cuda
    B, P = 12, 400
    pages_a = -(-_auto_prefix.GRAPH_MIN_SHARED_TOKENS // PAGE) + 2
    i32 = dict(dtype=torch.int32, device="cuda")
    w = tessera.BatchDecodeWithPagedKVCacheWrapper(workspace(torch), use_cuda_graph=True,
                                                   paged_kv_indptr_buffer=torch.zeros(B + 1, **i32),
                                                   paged_kv_indices_buffer=torch.zeros(P, **i32),
                                                   paged_kv_last_page_len_buffer=torch.zeros(B, **i32))
    w._shared_prefix_limits = (_auto_prefix.GRAPH_MIN_SHARED_TOKENS, 2, 0)  # groups whatever they save
    k, v = gpu_cache(torch, rng, 200, torch.float16)
    q_buf = torch.empty(B, HQ, D, dtype=torch.float16, device="cuda")
    out = torch.full((B, HQ, D), float("nan"), dtype=torch.float16, device="cuda")
    lse = torch.full((B, HQ), float("nan"), dtype=torch.float32, device="cuda")

    def step(reqs):
        table = table_of(reqs)
        w.plan(*table, HQ, HKV, D, PAGE, shared_prefix="auto")
        q_buf.copy_(torch.from_numpy(rng.standard_normal((B, HQ, D)).astype(np.float32)).half())
        return table

    def own(r, n):  # n pages of request r's own
        return list(range(100 + 5 * r, 100 + 5 * r + n))

    alone = [(own(r, 3), 3 * PAGE - r) for r in range(B)]
    table = step(alone)
    st = w.shared_prefix_stats  # the C++ wrapper's (DecodeOptions::shared_prefix)
    assert {k: st[k] for k in ("split", "groups", "groups_found", "requests_in_groups", "saved_pages",
                               "replanned")} == dict(split=True, groups=0, groups_found=0, requests_in_groups=0,
                                                     saved_pages=0, replanned=True)
    w.plan(*table, HQ, HKV, D, PAGE, shared_prefix="auto")
    assert not w.shared_prefix_stats["replanned"]  # the same (empty) shared level keeps its plan
    graph = captured(torch, lambda: w.run(q_buf, (k, v), out=out, lse=lse))
    prompt_a, prompt_b = list(range(0, pages_a)), list(range(40, 40 + pages_a - 1))
    n_a, n_b = len(prompt_a), len(prompt_b)
    adjacent = [(prompt_a + own(r, 1), n_a * PAGE + 1 + r) for r in range(5)] + \
               [(prompt_b + own(r, 2), (n_b + 1) * PAGE + r) for r in range(5, 9)] + alone[9:]
    scattered = [(prompt_a + own(r, 1), n_a * PAGE + 2) if r % 3 == 0 else alone[r] for r in range(B)]
    short = [(list(range(20, 26)) + own(r, 1), 6 * PAGE + 1 + r) for r in range(6)] + alone[6:]
    for reqs, groups in ((adjacent, 2), (scattered, 0), (short, 0), (alone, 0)):
        table = step(reqs)
        assert w.shared_prefix_stats["groups"] == groups
        out.fill_(float("nan"))
        graph.replay()
        n = len(reqs)
        ref_o, ref_lse = reference(q_buf[:n], np.arange(n + 1), table, k, v, False)
        check(out[:n], lse[:n], ref_o, ref_lse, "float16")
        w.run(q_buf, (k, v), out=out, lse=lse)  # the same launches outside the graph: bitwise equal
        again = out[:n].clone()
        graph.replay()
        assert torch.equal(out[:n], again)
    # Limits these groups miss (they save a few thousand tokens): found, left on the unique level.
    d = tessera.BatchDecodeWithPagedKVCacheWrapper(workspace(torch), use_cuda_graph=True)
    d._shared_prefix_limits = (_auto_prefix.GRAPH_MIN_SHARED_TOKENS, 4, 32768)
    table = table_of(adjacent)
    d.plan(*table, HQ, HKV, D, PAGE, shared_prefix="auto")
    st = d.shared_prefix_stats
    assert st["groups_found"] == 2 and st["groups"] == 0 and st["saved_pages"] == 0
    o, lse_d = d.run(q_buf, (k, v), return_lse=True)
    check(o, lse_d, *reference(q_buf, np.arange(B + 1), table, k, v, False), "float16")
    with pytest.raises(ValueError, match="max_pages"):
        w.plan(*table_of([(list(range(P + 1)), (P + 1) * PAGE)]), HQ, HKV, D, PAGE, shared_prefix="auto")
    with pytest.raises(ValueError, match="paged_kv_indptr_buffer"):
        w.plan(*table_of([([r], 5) for r in range(B + 1)]), HQ, HKV, D, PAGE, shared_prefix="auto")


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_prefill_auto_matches_reference(torch_cuda, poison, causal, dtype):
    torch = torch_cuda
    tdt = getattr(torch, dtype)
    for seed in range(4):
        rng = np.random.default_rng(seed)
        reqs = sharing_requests(rng)
        table = table_of(reqs)
        kv_lens = [t for _, t in reqs]
        # Query lengths up to the KV length: long ones cut (causal) or end the shared prefix.
        q_lens = [int(rng.integers(0, max(t, 1) + 1)) if causal else int(rng.integers(1, 40)) for t in kv_lens]
        qo = np.concatenate([[0], np.cumsum(q_lens)]).astype(np.int32)
        k, v = gpu_cache(torch, rng, max(int(table[1].max()) + 1, 1) + 2, tdt)
        q = torch.from_numpy(rng.standard_normal((int(qo[-1]), HQ, D)).astype(np.float32)).to("cuda").to(tdt)
        w = tessera.BatchPrefillWithPagedKVCacheWrapper(workspace(torch))
        w._shared_prefix_min_bytes = 0
        w.plan(qo, *table, HQ, HKV, D, PAGE, causal=causal, q_data_type=dtype, shared_prefix="auto")
        split = _C.find_shared_prefixes(*table, PAGE, qo, min_saved_pages=0, causal=causal)
        assert w.shared_prefix_stats["split"] == split["split"]
        o, lse = w.run(q, (k, v), return_lse=True)
        ref_o, ref_lse = reference(q, qo, table, k, v, causal)
        check(o, lse, ref_o, ref_lse, dtype)
        _, lse_ln = w.run(q, (k, v), return_lse=True, lse_base="ln")
        fin = np.isfinite(ref_lse)
        assert np.abs(to_np(lse_ln)[fin] - ref_lse[fin] * np.log(2)).max() < 2e-3 * max(1, np.abs(ref_lse).max())


def test_prefill_causal_cut_keeps_the_mask_exact(torch_cuda, rng):
    """Requests whose queries start inside the shared pages: they share only the pages before their first
    query (a request whose queries cover the whole prefix shares none), and the result stays exact."""
    torch = torch_cuda
    prompt = list(range(8))
    reqs = [(prompt + [20 + r], 8 * PAGE + 5) for r in range(6)]
    q_lens = [1, 5, 3 * PAGE + 2, 8 * PAGE + 5, 17, 2]
    qo = np.concatenate([[0], np.cumsum(q_lens)]).astype(np.int32)
    table = table_of(reqs)
    split = _C.find_shared_prefixes(*table, PAGE, qo, causal=True)
    assert split["split"] and split["groups"].shape[0] == 1
    assert split["groups"][0, 1] == 5 and split["groups"][0, 2] == 5  # request 3 joins no group; cut to 5 pages
    k, v = gpu_cache(torch, rng, 30, torch.float16)
    q = torch.from_numpy(rng.standard_normal((int(qo[-1]), HQ, D)).astype(np.float32)).to("cuda").half()
    w = tessera.BatchPrefillWithPagedKVCacheWrapper(workspace(torch))
    w._shared_prefix_min_bytes = 0
    w.plan(qo, *table, HQ, HKV, D, PAGE, causal=True, shared_prefix="auto")
    assert w.shared_prefix_stats["split"]
    o, lse = w.run(q, (k, v), return_lse=True)
    check(o, lse, *reference(q, qo, table, k, v, True), "float16")


def test_prefill_without_sharing_is_the_normal_path(torch_cuda, rng):
    torch = torch_cuda
    reqs = [(list(range(4 * r, 4 * r + 4)), 4 * PAGE - r) for r in range(6)]
    table = table_of(reqs)
    qo = np.array([0, 3, 10, 11, 30, 31, 40], np.int32)
    k, v = gpu_cache(torch, rng, 24, torch.float16)
    q = torch.from_numpy(rng.standard_normal((40, HQ, D)).astype(np.float32)).to("cuda").half()
    outs = []
    for auto in (None, "auto"):
        w = tessera.BatchPrefillWithPagedKVCacheWrapper(workspace(torch))
        w.plan(qo, *table, HQ, HKV, D, PAGE, causal=True, shared_prefix=auto)
        outs.append(w.run(q, (k, v), return_lse=True))
    assert torch.equal(outs[0][0], outs[1][0]) and torch.equal(outs[0][1], outs[1][1])


def test_prefill_auto_in_cuda_graphs(torch_cuda, rng):
    """use_cuda_graph=True: the C++ wrapper splits every step itself (PrefillOptions::shared_prefix). One graph
    captured on a step without sharing replays a causal step whose adjacent requests share a long prompt (their
    queries cutting it to the pages before them) and one without again, each against the float64 reference."""
    from tessera import _auto_prefix
    torch = torch_cuda
    q_lens = [1, 3, 2, 5, 1, 4]
    B, bound = len(q_lens), 200
    qo = np.concatenate([[0], np.cumsum(q_lens)]).astype(np.int32)
    i32 = dict(dtype=torch.int32, device="cuda")
    w = tessera.BatchPrefillWithPagedKVCacheWrapper(workspace(torch), use_cuda_graph=True,
                                                    qo_indptr_buf=torch.empty(B + 1, **i32),
                                                    paged_kv_indptr_buf=torch.empty(B + 1, **i32),
                                                    paged_kv_indices_buf=torch.empty(bound, **i32),
                                                    paged_kv_last_page_len_buf=torch.empty(B, **i32))
    w._shared_prefix_limits = (_auto_prefix.GRAPH_MIN_SHARED_TOKENS, 2, 0)  # groups whatever they save
    k, v = gpu_cache(torch, rng, 200, torch.float16)
    q = torch.empty(int(qo[-1]), HQ, D, dtype=torch.float16, device="cuda")
    out = torch.full((int(qo[-1]), HQ, D), float("nan"), dtype=torch.float16, device="cuda")
    lse = torch.full((int(qo[-1]), HQ), float("nan"), dtype=torch.float32, device="cuda")

    def own(r, n):
        return list(range(100 + 5 * r, 100 + 5 * r + n))
    alone = [(own(r, 2), 2 * PAGE - r) for r in range(B)]
    w.plan(qo, *table_of(alone), HQ, HKV, D, PAGE, causal=True, shared_prefix="auto")
    assert w.shared_prefix_stats["groups"] == 0
    graph = captured(torch, lambda: w.run(q, (k, v), out=out, lse=lse))
    pages = -(-_auto_prefix.GRAPH_MIN_SHARED_TOKENS // PAGE) + 1  # one page more: request 3's 5 queries cut one
    grouped = [(list(range(pages)) + own(r, 1), pages * PAGE + 1 + r) for r in range(4)] + alone[4:]
    for reqs, groups in ((grouped, 1), (alone, 0)):
        table = table_of(reqs)
        w.plan(qo, *table, HQ, HKV, D, PAGE, causal=True, shared_prefix="auto")
        st = w.shared_prefix_stats
        assert st["groups"] == groups and st["requests_in_groups"] == 4 * groups
        q.copy_(torch.from_numpy(rng.standard_normal(tuple(q.shape)).astype(np.float32)).half())
        out.fill_(float("nan"))
        graph.replay()
        check(out, lse, *reference(q, qo, table, k, v, True), "float16")
