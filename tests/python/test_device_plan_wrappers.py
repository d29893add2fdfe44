"""Planning on the GPU for the ragged prefill, cascade and POD wrappers
(plan(..., on_device=True)): each step planned on the GPU gives bitwise the
outputs of the same step planned on the host; the cascade's levels replay in
one CUDA graph for steps whose groups and lengths change; a cascade level
whose rows differ from level 0's is raised by name. Argument checks: in
test_device_plan.py.
"""

import numpy as np
import pytest

import tessera
import prefill_reference as PR
from conftest import to_np
from test_device_plan import HEAD_DIM, HKV, HQ, Step, cuda_i32, random_lens


@pytest.mark.parametrize("backend", ["auto", "fa2"])
def test_ragged_device_plan_bitwise_the_host_plan(torch_cuda, rng, backend):
    """Ragged prefill, 12 random causal batches: planned on the GPU (k / v of max_kv_tokens rows), bitwise the
    same step planned on the host, and close to the float64 reference."""
    torch = torch_cuda
    max_batch, max_q, max_kv = 8, 384, 8 * 1500
    dtype = torch.float16
    k = PR.uniform(torch, rng, (max_kv, HKV, HEAD_DIM), dtype)
    v = PR.uniform(torch, rng, (max_kv, HKV, HEAD_DIM), dtype)
    q = PR.uniform(torch, rng, (max_q, HQ, HEAD_DIM), dtype, -2.0, 2.0)
    kn, vn, qn = to_np(k), to_np(v), to_np(q)
    dev = tessera.BatchPrefillWithRaggedKVCacheWrapper(PR.workspace(torch), backend=backend)
    host = tessera.BatchPrefillWithRaggedKVCacheWrapper(PR.workspace(torch), backend=backend)
    dev._cta_q = host._cta_q = 64  # one tile for both, whatever their first plans bring
    batch_size, qo_t, kv_t = cuda_i32(torch, 1), cuda_i32(torch, max_batch + 1), cuda_i32(torch, max_batch + 1)
    for i in range(12):
        batch = int(rng.integers(1, max_batch + 1))
        kv_lens = random_lens(rng, batch, 1500)
        qo_lens = [min(n, int(rng.integers(0, 90))) for n in kv_lens]
        qo, kv = np.minimum(PR.indptr_of(qo_lens), max_q).astype(np.int32), PR.indptr_of(kv_lens)
        rows = int(qo[-1])
        batch_size.fill_(batch)
        qo_t[:batch + 1].copy_(torch.from_numpy(qo))
        kv_t[:batch + 1].copy_(torch.from_numpy(kv))
        dev.plan(qo_t, kv_t, HQ, HKV, HEAD_DIM, causal=True, q_data_type=dtype, on_device=True,
                 batch_size=batch_size, max_total_q=max_q, max_kv_tokens=max_kv)
        o_dev, lse_dev = dev.run(q, k, v, return_lse=True)
        host.plan(qo, kv, HQ, HKV, HEAD_DIM, causal=True, q_data_type=dtype)
        o_host, lse_host = host.run(q[:rows], k[:int(kv[-1])], v[:int(kv[-1])], return_lse=True)
        torch.cuda.synchronize()
        assert o_dev.shape[0] == max_q
        assert torch.equal(o_dev[:rows], o_host) and torch.equal(lse_dev[:rows], lse_host), f"batch {i}"
        if i % 4 == 0:
            ref_o, ref_lse = PR.ref_batch(qn[:rows], qo, lambda r: (kn[kv[r]:kv[r + 1]], vn[kv[r]:kv[r + 1]]),
                                          causal=True)
            PR.check(o_dev[:rows], lse_dev[:rows], ref_o, ref_lse, "float16")
    with pytest.raises(ValueError, match="^k: expected shape"):  # k below the bound
        dev.run(q, k[:max_kv - 1], v)
    with pytest.raises(ValueError, match="^q: expected 384 rows"):
        dev.run(q[:10], k, v)


def test_cascade_device_plan_one_graph(torch_cuda, rng):
    """A three-level cascade planned on the GPU: one CUDA graph of plan() and run() replays steps whose groups and
    lengths change, each bitwise the same step planned on the host; a level ending elsewhere is raised by name."""
    from test_cascade import make_levels
    torch = torch_cuda
    steps = [([1, 3, 1, 5, 1, 2, 4], [[7], [3, 1, 3], [1] * 7], [[40], [70, 0, 33], [5, 9, 1, 130, 12, 2, 4]]),
             ([2, 1, 1, 3, 1], [[5], [2, 3], [1] * 5], [[700], [90, 0], [8, 3, 1, 250, 16]])]
    built = [make_levels(*s, 16, rng) for s in steps]
    pool = max(b[2] for b in built)
    max_batch, max_pages, max_q = 8, pool, 24
    k = torch.randn(pool, 16, HKV, HEAD_DIM, device="cuda", dtype=torch.bfloat16)
    v = torch.randn_like(k)
    q = torch.randn(max_q, HQ, HEAD_DIM, device="cuda", dtype=torch.bfloat16)
    dev = tessera.MultiLevelCascadeAttentionWrapper(3, PR.workspace(torch), use_cuda_graph=True)
    host = tessera.MultiLevelCascadeAttentionWrapper(3, PR.workspace(torch))
    bufs = [[cuda_i32(torch, 1), cuda_i32(torch, max_batch + 1), cuda_i32(torch, max_batch + 1),
             cuda_i32(torch, max_pages), cuda_i32(torch, max_batch)] for _ in range(3)]

    def write(levels):
        for b, lv in zip(bufs, levels):
            b[0].fill_(len(lv[3]))
            for dst, src in zip(b[1:], lv):
                if len(src):
                    dst[:len(src)].copy_(torch.from_numpy(src))

    def plan_dev():
        dev.plan([b[1] for b in bufs], [b[2] for b in bufs], [b[3] for b in bufs], [b[4] for b in bufs], HQ, HKV,
                 HEAD_DIM, 16, causal=True, q_data_type=torch.bfloat16, on_device=True,
                 batch_size=[b[0] for b in bufs], max_total_q=max_q)

    out = torch.empty_like(q)
    write(built[0][0])
    plan_dev()
    dev.run(q, (k, v), out=out)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        plan_dev()
        dev.run(q, (k, v), out=out)
    for levels, _, _ in (built[0], built[1], built[0]):
        write(levels)
        out.fill_(float("nan"))
        graph.replay()
        rows = int(levels[0][0][-1])
        host.plan(*[list(x) for x in zip(*levels)], HQ, HKV, HEAD_DIM, 16, causal=True, q_data_type=torch.bfloat16)
        o_host = host.run(q[:rows], (k, v))
        torch.cuda.synchronize()
        assert torch.equal(out[:rows], o_host)
        assert torch.isnan(out[rows:]).all()  # rows past the step are left as they are
    bad = built[0][0][1][0].copy()
    bad[-1] -= 1
    bufs[1][1][:len(bad)].copy_(torch.from_numpy(bad))
    graph.replay()
    torch.cuda.synchronize()
    with pytest.raises(ValueError, match=r"^levels\[1\]: qo_indptr"):
        dev.run(q, (k, v), out=out)


def test_pod_decode_planned_on_device(torch_cuda, rng):
    """POD with the decode batch planned on the GPU: the same bits as the host-planned decode side."""
    torch = torch_cuda
    max_batch, page_size, max_len = 6, 16, 900
    pool = max_batch * (max_len // page_size + 1) + 3
    dtype = torch.float16
    cache, _, _ = PR.random_cache(torch, rng, "NHD", pool, page_size, HEAD_DIM, dtype, False)
    q_d = PR.uniform(torch, rng, (max_batch, HQ, HEAD_DIM), dtype)
    q_p = PR.uniform(torch, rng, (40, HQ, HEAD_DIM), dtype)
    k_p, v_p = (PR.uniform(torch, rng, (90, HKV, HEAD_DIM), dtype) for _ in range(2))
    ws = lambda: torch.empty(128 << 20, dtype=torch.uint8, device="cuda")  # noqa: E731
    dev, host = tessera.PODWithPagedKVCacheWrapper(ws()), tessera.PODWithPagedKVCacheWrapper(ws())
    step = Step(torch, max_batch, pool)
    for batch in (max_batch, 3):
        table = PR.make_table(rng, random_lens(rng, batch, max_len), page_size)[:3]
        step.write(*table)
        dev.plan(step.indptr, step.indices, step.last, HQ, HKV, HEAD_DIM, page_size, q_data_type=dtype,
                 on_device=True, batch_size=step.batch_size)
        p_dev, d_dev = dev.run(q_p, k_p, v_p, q_d, cache, causal_p=True)
        host.plan(*[torch.from_numpy(np.asarray(x, np.int32)).cuda() for x in table], HQ, HKV, HEAD_DIM, page_size,
                  q_data_type=dtype)
        p_host, d_host = host.run(q_p, k_p, v_p, q_d[:batch], cache, causal_p=True)
        torch.cuda.synchronize()
        assert torch.equal(p_dev, p_host) and torch.equal(d_dev[:batch], d_host), f"batch {batch}"
