"""Batch-invariant decode and prefill (FlashInfer's fixed_split_size, and
disable_split_kv for prefill): a request's output is bitwise the same
whatever else is in the batch, where it sits in it and which pages hold its
KV, on both decode kernels (eagerly and replayed from a CUDA graph captured
for another batch) and on paged and ragged prefill; and it matches the
float64 reference.
GPU tests skip with "skipped: no GPU"."""

import numpy as np
import pytest

import tessera
from conftest import TOL, rel_error, to_np
from decode_reference import HEAD_DIM, HKV, HQ, check, page_shape, ref_batch_decode

PAGE = 16
# Fixed chunks need partial states for every chunk of every long request: on
# the tensor-core path each holds a whole query tile (see the decode docs).
WORKSPACE_BYTES = 1 << 30


def workspace(torch):
    return torch.empty(WORKSPACE_BYTES, dtype=torch.uint8, device="cuda")
TARGET = 3001  # the request followed through every batch: several fixed chunks, a partial last page
# (other requests' lengths, the target's position among them)
BATCHES = [([], 0), ([50, 7000], 1), ([100] * 40, 40), ([8000] * 6 + [1, 0], 3), ([5000] * 63, 17)]


def batch_problem(torch, rng, target_k, target_v, others, pos):
    """A page pool holding the target's KV (shuffled pages) beside random others': (cache, indptr, indices, last)."""
    lens = list(others[:pos]) + [TARGET] + list(others[pos:])
    pages = [(n + PAGE - 1) // PAGE for n in lens]
    num_pages = sum(pages) + 2
    indptr = np.concatenate([[0], np.cumsum(pages)]).astype(np.int32)
    indices = rng.permutation(num_pages)[: indptr[-1]].astype(np.int32)
    last = np.array([n - (p - 1) * PAGE if p else 0 for n, p in zip(lens, pages)], dtype=np.int32)
    k = torch.randn(page_shape("NHD", num_pages, PAGE), dtype=torch.float16, device="cuda")
    v = torch.randn_like(k)
    mine = torch.from_numpy(indices[indptr[pos]: indptr[pos + 1]].astype(np.int64)).cuda()
    k[mine], v[mine] = target_k, target_v
    return (k, v), indptr, indices, last


@pytest.mark.parametrize("kernel", ["picked", "cuda_cores", "tensor_cores"])
def test_fixed_split_size_output_independent_of_batch(torch_cuda, rng, kernel):
    torch = torch_cuda
    n_pages = (TARGET + PAGE - 1) // PAGE
    target_k = torch.randn((n_pages,) + page_shape("NHD", 1, PAGE)[1:], dtype=torch.float16, device="cuda")
    target_v = torch.randn_like(target_k)
    target_q = torch.randn(HQ, HEAD_DIM, dtype=torch.float16, device="cuda") * 2
    seen = []
    for others, pos in BATCHES:
        cache, indptr, indices, last = batch_problem(torch, rng, target_k, target_v, others, pos)
        q = torch.randn(len(others) + 1, HQ, HEAD_DIM, dtype=torch.float16, device="cuda")
        q[pos] = target_q
        w = tessera.BatchDecodeWithPagedKVCacheWrapper(workspace(torch), use_tensor_cores=kernel == "tensor_cores")
        w._cuda_cores = kernel == "cuda_cores"
        w.plan(indptr, indices, last, HQ, HKV, HEAD_DIM, PAGE, q_data_type=torch.float16, fixed_split_size=8)
        out = torch.full_like(q, float("nan"))
        w.run(q, cache, out=out)
        torch.cuda.synchronize()
        seen.append(out[pos].clone())
        if len(others) <= 2:  # the reference is slow: the target's row of the small batches
            k, v = to_np(cache[0]), to_np(cache[1])
            ref_o, _ = ref_batch_decode(to_np(q), k, v, "NHD", indptr, indices, last, PAGE)
            check(out[pos: pos + 1], None, ref_o[pos: pos + 1], None, "float16")
    for i, o in enumerate(seen[1:], 1):
        assert torch.equal(o, seen[0]), f"batch {i} changed the target's output (max diff {(o - seen[0]).abs().max()})"


def test_fixed_split_size_cuda_graph_replay(torch_cuda, rng):
    """Captured once for a batch of 64; re-planned for other batches (up to the bounds) and replayed: the target's
    output is bitwise the eager one of its first batch."""
    torch = torch_cuda
    n_pages = (TARGET + PAGE - 1) // PAGE
    target_k = torch.randn((n_pages,) + page_shape("NHD", 1, PAGE)[1:], dtype=torch.float16, device="cuda")
    target_v = torch.randn_like(target_k)
    target_q = torch.randn(HQ, HEAD_DIM, dtype=torch.float16, device="cuda") * 2
    max_batch, max_pages = 64, 64 * 5000 // PAGE + 200
    problems = [batch_problem(torch, rng, target_k, target_v, o, p) for o, p in BATCHES]
    pool = max(c[0].shape[0] for c, *_ in problems)
    k = torch.zeros(page_shape("NHD", pool, PAGE), dtype=torch.float16, device="cuda")
    v = torch.zeros_like(k)
    q = torch.zeros(max_batch, HQ, HEAD_DIM, dtype=torch.float16, device="cuda")
    out = torch.zeros_like(q)
    indptr_buf = torch.zeros(max_batch + 1, dtype=torch.int32, device="cuda")
    indices_buf = torch.zeros(max_pages, dtype=torch.int32, device="cuda")
    last_buf = torch.zeros(max_batch, dtype=torch.int32, device="cuda")
    w = tessera.BatchDecodeWithPagedKVCacheWrapper(workspace(torch), "NHD", True, False, indptr_buf, indices_buf,
                                                   last_buf)

    def load(i):
        (ck, cv), indptr, indices, last = problems[i]
        k[: ck.shape[0]], v[: cv.shape[0]] = ck, cv
        batch = len(indptr) - 1
        q[:batch] = torch.randn(batch, HQ, HEAD_DIM, dtype=torch.float16, device="cuda")
        q[BATCHES[i][1]] = target_q
        w.plan(indptr, indices, last, HQ, HKV, HEAD_DIM, PAGE, q_data_type=torch.float16, fixed_split_size=8)
        return batch

    load(len(problems) - 1)  # the batch of 64 fixes nothing but the captured launch
    w.run(q, (k, v), out=out)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        w.run(q, (k, v), out=out)
    want = None
    for i in range(len(problems)):
        batch = load(i)
        graph.replay()
        torch.cuda.synchronize()
        got = out[BATCHES[i][1]].clone()
        eager = torch.full_like(q[:batch], float("nan"))
        w.run(q[:batch], (k, v), out=eager)
        torch.cuda.synchronize()
        assert torch.equal(got, eager[BATCHES[i][1]])
        want = got if want is None else want
        assert torch.equal(got, want), f"batch {i}: replayed output differs from batch 0's"


# ======================================================================= prefill
# The target of the prefill tests: a chunk of queries at the end of its KV (causal), several fixed chunks long.
P_TARGET = (37, 3001)
# (other requests' (q_len, kv_len), the target's position among them)
P_BATCHES = [([], 0), ([(1, 50), (200, 7000)], 1), ([(16, 100)] * 30, 30), ([(512, 8000)] * 4 + [(1, 1)], 2)]


def prefill_problem(torch, rng, kind, target, others, pos):
    """(q, qo_indptr, plan args, run args) of one batch holding the target request (its q / k / v given, its
    pages shuffled among the others' in the paged case)."""
    tq, tk, tv = target
    reqs = list(others[:pos]) + [P_TARGET] + list(others[pos:])
    q_lens, kv_lens = [r[0] for r in reqs], [r[1] for r in reqs]
    qo = np.concatenate([[0], np.cumsum(q_lens)]).astype(np.int32)
    q = torch.randn(int(qo[-1]), HQ, HEAD_DIM, dtype=torch.float16, device="cuda")
    q[qo[pos]: qo[pos + 1]] = tq
    if kind == "ragged":
        kv = np.concatenate([[0], np.cumsum(kv_lens)]).astype(np.int32)
        k = torch.randn(int(kv[-1]), HKV, HEAD_DIM, dtype=torch.float16, device="cuda")
        v = torch.randn_like(k)
        k[kv[pos]: kv[pos + 1]], v[kv[pos]: kv[pos + 1]] = tk, tv
        return q, qo, (qo, kv), (k, v)
    pages = [(n + PAGE - 1) // PAGE for n in kv_lens]
    num_pages = sum(pages) + 2
    indptr = np.concatenate([[0], np.cumsum(pages)]).astype(np.int32)
    indices = rng.permutation(num_pages)[: indptr[-1]].astype(np.int32)
    last = np.array([n - (p - 1) * PAGE for n, p in zip(kv_lens, pages)], dtype=np.int32)
    k = torch.randn(page_shape("NHD", num_pages, PAGE), dtype=torch.float16, device="cuda")
    v = torch.randn_like(k)
    mine = torch.from_numpy(indices[indptr[pos]: indptr[pos + 1]].astype(np.int64)).cuda()
    n = tk.shape[0]
    pad = pages[pos] * PAGE - n
    fill = lambda x: torch.cat([x, torch.zeros((pad,) + tuple(x.shape[1:]), dtype=x.dtype, device="cuda")])  # noqa
    k[mine], v[mine] = fill(tk).view(-1, PAGE, HKV, HEAD_DIM), fill(tv).view(-1, PAGE, HKV, HEAD_DIM)
    return q, qo, (qo, indptr, indices, last), ((k, v),)


@pytest.mark.parametrize("kind", ["paged", "ragged"])
@pytest.mark.parametrize("backend", ["fa2", "auto"])
@pytest.mark.parametrize("mode", [dict(fixed_split_size=64), dict(disable_split_kv=True)])
def test_prefill_output_independent_of_batch(torch_cuda, rng, kind, backend, mode):
    """Prefill with fixed_split_size (pages; tokens for ragged KV) or disable_split_kv: the target's rows are
    bitwise the same in every batch, and match the float64 reference."""
    from prefill_reference import ref_request
    torch = torch_cuda
    nq, nk = P_TARGET
    target = (torch.randn(nq, HQ, HEAD_DIM, dtype=torch.float16, device="cuda") * 2,
              torch.randn(nk, HKV, HEAD_DIM, dtype=torch.float16, device="cuda"),
              torch.randn(nk, HKV, HEAD_DIM, dtype=torch.float16, device="cuda"))
    opts = dict(mode)
    if kind == "ragged" and "fixed_split_size" in opts:
        opts["fixed_split_size"] *= PAGE  # the same chunks, counted in tokens
    seen = []
    for others, pos in P_BATCHES:
        q, qo, plan_args, run_args = prefill_problem(torch, rng, kind, target, others, pos)
        cls = (tessera.BatchPrefillWithPagedKVCacheWrapper if kind == "paged"
               else tessera.BatchPrefillWithRaggedKVCacheWrapper)
        w = cls(workspace(torch), backend=backend)
        extra = (PAGE,) if kind == "paged" else ()
        w.plan(*plan_args, HQ, HKV, HEAD_DIM, *extra, causal=True, q_data_type=torch.float16, **opts)
        out = torch.full_like(q, float("nan"))
        w.run(q, *run_args, out=out)
        torch.cuda.synchronize()
        seen.append(out[qo[pos]: qo[pos + 1]].clone())
    for i, o in enumerate(seen[1:], 1):
        assert torch.equal(o, seen[0]), f"batch {i}: the target's rows changed"
    ref_o, _ = ref_request(*(to_np(x) for x in target), True)
    got = to_np(seen[0])
    assert not np.isnan(got).any()
    assert rel_error(got, ref_o) < TOL["float16"]
