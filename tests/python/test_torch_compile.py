"""torch.compile(fullgraph=True) of functions that call the run paths (tessera._ops' custom ops): the compiled
results equal eager bitwise (the same kernel on the same inputs) and match the float64 references; a new plan()
with other lengths reuses the compiled graph; torch.library.opcheck passes on each op; the fake (meta)
implementations give the real outputs' shapes and dtypes. GPU tests skip with "skipped: no GPU"; the CPU tests
need torch (skipped without it)."""

import numpy as np
import pytest

import tessera
from conftest import ref_decode, to_np
import decode_reference as D
import prefill_reference as P

BACKENDS = ["aot_eager", "inductor"]  # aot_eager: functionalization and the fake impls; inductor: the default


@pytest.fixture
def compiler(torch_cuda):
    """torch with a fresh Dynamo cache (the test functions below share code objects across parameters), and a
    function making a counting fullgraph compile."""
    torch = torch_cuda
    import torch._dynamo
    import torch._dynamo.testing
    torch._dynamo.reset()

    def compile_fn(fn, backend):
        counter = torch._dynamo.testing.CompileCounterWithBackend(backend)
        return torch.compile(fn, fullgraph=True, backend=counter), counter

    yield torch, compile_fn
    torch._dynamo.reset()


def _same(a, b):
    """Equality of two tensors: shape, dtype and every value (-inf included)."""
    assert a.shape == b.shape and a.dtype == b.dtype
    assert bool((a == b).all()), f"max difference {(a.float() - b.float()).abs().max()}"


# ======================================================================= batch decode
def _decode_step(torch, rng, wrapper, lens, page_size, layout, dtype):
    indptr, indices, last, num_pages = D.make_table(rng, lens, page_size)
    cache, k, v = D.random_cache(torch, rng, layout, num_pages, page_size, dtype, False)
    q = D.random_q(torch, rng, len(lens), dtype)
    wrapper.plan(indptr, indices, last, D.HQ, D.HKV, D.HEAD_DIM, page_size, q_data_type=dtype)
    return q, cache, k, v, (indptr, indices, last)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("use_tensor_cores", [False, True])
def test_compile_batch_decode(compiler, rng, backend, use_tensor_cores):
    torch, compile_fn = compiler
    layout, page_size, dtype = "NHD", 16, torch.float16
    wrapper = tessera.BatchDecodeWithPagedKVCacheWrapper(D.workspace(torch), layout,
                                                         use_tensor_cores=use_tensor_cores)

    def step(q, cache):
        o, lse = wrapper.run(q * 1.0, cache, return_lse=True)  # graph ops on both sides of the custom op
        return o.float() * 2.0, lse

    fn, counter = compile_fn(step, backend)
    for lens in ([0, 1, 7, 300, 2900, 33], [5, 129, 1, 64, 700, 2]):  # a new plan, same configuration
        q, cache, k, v, table = _decode_step(torch, rng, wrapper, lens, page_size, layout, dtype)
        o_c, lse_c = fn(q, cache)
        o_e, lse_e = step(q, cache)
        torch.cuda.synchronize()
        _same(o_c, o_e)
        _same(lse_c, lse_e)
        ref_o, ref_lse = D.ref_batch_decode(to_np(q), to_np(k), to_np(v), layout, *table, page_size)
        D.check(o_c / 2.0, lse_c, ref_o, ref_lse, "float16")
    # The second step's cache has another shape: Dynamo recompiles once for it and marks the dimension dynamic.
    # A plan() alone (its lengths and page ids live outside the graph) adds nothing beyond that.
    assert counter.frame_count <= 2, "a new plan() recompiled run()"


@pytest.mark.parametrize("backend", BACKENDS)
def test_compile_batch_decode_out_lse_and_interleaved(compiler, rng, backend):
    """Caller buffers (mutated inside the graph), an interleaved HND cache, float scales."""
    torch, compile_fn = compiler
    layout, page_size, dtype = "HND", 8, torch.bfloat16
    wrapper = tessera.BatchDecodeWithPagedKVCacheWrapper(D.workspace(torch), layout)
    lens = [3, 40, 257, 1]
    indptr, indices, last, num_pages = D.make_table(rng, lens, page_size)
    cache, k, v = D.random_cache(torch, rng, layout, num_pages, page_size, dtype, True)
    q = D.random_q(torch, rng, len(lens), dtype)
    wrapper.plan(indptr, indices, last, D.HQ, D.HKV, D.HEAD_DIM, page_size, q_data_type=dtype, sm_scale=0.07)

    def step(q, cache, out, lse):
        wrapper.run(q, cache, out=out, lse=lse, k_scale=0.5, v_scale=2.0)
        return wrapper.run(q, cache, return_lse=True)

    fn, _ = compile_fn(step, backend)
    out_c, lse_c = torch.full_like(q, float("nan")), torch.full(q.shape[:2], float("nan"), device="cuda")
    out_e, lse_e = torch.full_like(q, float("nan")), torch.full(q.shape[:2], float("nan"), device="cuda")
    o2_c, l2_c = fn(q, cache, out_c, lse_c)
    o2_e, l2_e = step(q, cache, out_e, lse_e)
    torch.cuda.synchronize()
    for a, b in ((out_c, out_e), (lse_c, lse_e), (o2_c, o2_e), (l2_c, l2_e)):
        _same(a, b)
    ref_o, ref_lse = D.ref_batch_decode(to_np(q), to_np(k), to_np(v), layout, indptr, indices, last, page_size,
                                        sm_scale=0.07 * 0.5)
    D.check(out_c.float() / 2.0, lse_c, ref_o, ref_lse, "bfloat16")


# ======================================================================= batch prefill
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("causal", [False, True])
def test_compile_batch_prefill_paged(compiler, rng, backend, causal):
    torch, compile_fn = compiler
    layout, page_size, dtype, head_dim, hq = "NHD", 16, torch.float16, 128, 8
    wrapper = tessera.BatchPrefillWithPagedKVCacheWrapper(P.workspace(torch), kv_layout=layout)

    def step(q, cache):
        return wrapper.run(q, cache, return_lse=True)

    fn, counter = compile_fn(step, backend)
    for q_lens, kv_lens in (([0, 5, 1, 37, 100], [10, 0, 300, 37, 190]), ([64, 9, 3], [577, 3, 90])):
        table = P.make_table(rng, kv_lens, page_size)
        cache, k, v = P.random_cache(torch, rng, layout, table[3], page_size, head_dim, dtype, False)
        qo = P.indptr_of(q_lens)
        q = P.uniform(torch, rng, (int(qo[-1]), hq, head_dim), dtype, -2.0, 2.0)
        wrapper.plan(qo, table[0], table[1], table[2], hq, P.HKV, head_dim, page_size, causal=causal,
                     q_data_type=dtype)
        o_c, lse_c = fn(q, cache)
        o_e, lse_e = step(q, cache)
        torch.cuda.synchronize()
        _same(o_c, o_e)
        _same(lse_c, lse_e)
        kn, vn = to_np(k), to_np(v)
        ref_o, ref_lse = P.ref_batch(to_np(q), qo, lambda i: P.gather_pages(kn, vn, layout, table, page_size, i),
                                     causal)
        P.check(o_c, lse_c, ref_o, ref_lse, "float16")
    # The second step's cache has another shape: Dynamo recompiles once for it and marks the dimension dynamic.
    # A plan() alone (its lengths and page ids live outside the graph) adds nothing beyond that.
    assert counter.frame_count <= 2, "a new plan() recompiled run()"


@pytest.mark.parametrize("backend", BACKENDS)
def test_compile_batch_prefill_paged_lse_ln_and_out(compiler, rng, backend):
    torch, compile_fn = compiler
    page_size, dtype, head_dim, hq = 1, torch.bfloat16, 64, 2
    wrapper = tessera.BatchPrefillWithPagedKVCacheWrapper(P.workspace(torch), kv_layout="HND")
    q_lens, kv_lens = [3, 70, 16], [40, 700, 16]
    table = P.make_table(rng, kv_lens, page_size)
    cache, k, v = P.random_cache(torch, rng, "HND", table[3], page_size, head_dim, dtype, True)
    qo = P.indptr_of(q_lens)
    q = P.uniform(torch, rng, (int(qo[-1]), hq, head_dim), dtype, -2.0, 2.0)
    wrapper.plan(qo, table[0], table[1], table[2], hq, P.HKV, head_dim, page_size, causal=True, q_data_type=dtype)

    def step(q, cache, out):
        return wrapper.run(q, cache, out=out, return_lse=True, lse_base="ln")

    fn, _ = compile_fn(step, backend)
    out_c, out_e = torch.empty_like(q), torch.empty_like(q)
    o_c, lse_c = fn(q, cache, out_c)
    o_e, lse_e = step(q, cache, out_e)
    torch.cuda.synchronize()
    _same(o_c, o_e)
    _same(out_c, out_e)
    _same(lse_c, lse_e)
    kn, vn = to_np(k), to_np(v)
    ref_o, ref_lse = P.ref_batch(to_np(q), qo, lambda i: P.gather_pages(kn, vn, "HND", table, page_size, i), True)
    P.check(out_c, lse_c / np.log(2.0), ref_o, ref_lse, "bfloat16")


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("layout", ["NHD", "HND"])
def test_compile_batch_prefill_ragged(compiler, rng, backend, layout):
    torch, compile_fn = compiler
    dtype, head_dim, hq = torch.float16, 128, 4
    wrapper = tessera.BatchPrefillWithRaggedKVCacheWrapper(P.workspace(torch), kv_layout=layout)

    def step(q, k, v):
        o = wrapper.run(q, k, v)
        o2, lse = wrapper.run(q, k, v, return_lse=True)
        return o, o2, lse

    fn, counter = compile_fn(step, backend)
    for q_lens, kv_lens in (([0, 5, 37, 100], [10, 0, 37, 190]), ([64, 9, 1], [577, 3, 33])):
        qo, kv = P.indptr_of(q_lens), P.indptr_of(kv_lens)
        q = P.uniform(torch, rng, (int(qo[-1]), hq, head_dim), dtype, -2.0, 2.0)
        shape = (int(kv[-1]), P.HKV, head_dim) if layout == "NHD" else (P.HKV, int(kv[-1]), head_dim)
        k, v = P.uniform(torch, rng, shape, dtype), P.uniform(torch, rng, shape, dtype)
        wrapper.plan(qo, kv, hq, P.HKV, head_dim, causal=True, q_data_type="float16")
        got = fn(q, k, v)
        want = step(q, k, v)
        torch.cuda.synchronize()
        for a, b in zip(got, want):
            _same(a, b)
        _same(got[0], got[1])
        kn, vn = to_np(k), to_np(v)
        if layout == "HND":
            kn, vn = kn.transpose(1, 0, 2), vn.transpose(1, 0, 2)
        ref_o, ref_lse = P.ref_batch(to_np(q), qo, lambda i: (kn[kv[i]: kv[i + 1]], vn[kv[i]: kv[i + 1]]), True)
        P.check(got[1], got[2], ref_o, ref_lse, "float16")
    # The second step's cache has another shape: Dynamo recompiles once for it and marks the dimension dynamic.
    # A plan() alone (its lengths and page ids live outside the graph) adds nothing beyond that.
    assert counter.frame_count <= 2, "a new plan() recompiled run()"


# ======================================================================= single-request functions, merge_state
@pytest.mark.parametrize("backend", BACKENDS)
def test_compile_single_decode_prefill_and_merge(compiler, rng, backend):
    torch, compile_fn = compiler
    dtype = torch.float16
    q1 = P.uniform(torch, rng, (8, 128), dtype, -2.0, 2.0)
    kd, vd = P.uniform(torch, rng, (300, 2, 128), dtype), P.uniform(torch, rng, (300, 2, 128), dtype)
    qp = P.uniform(torch, rng, (50, 8, 128), dtype, -2.0, 2.0)
    kp, vp = P.uniform(torch, rng, (120, 2, 128), dtype), P.uniform(torch, rng, (120, 2, 128), dtype)

    def step(q1, kd, vd, qp, kp, vp):
        od, lsed = tessera.single_decode_with_kv_cache(q1, kd, vd, return_lse=True, logits_soft_cap=30.0)
        od2 = tessera.single_decode_with_kv_cache(q1, kd, vd, sm_scale=0.1)
        op, lsep = tessera.single_prefill_with_kv_cache(qp, kp, vp, causal=True, return_lse=True)
        # split the KV in two and merge the halves: the same attention
        oa, la = tessera.single_prefill_with_kv_cache(qp, kp[:60], vp[:60], return_lse=True)
        ob, lb = tessera.single_prefill_with_kv_cache(qp, kp[60:], vp[60:], return_lse=True)
        om, lm = tessera.merge_state(oa, la, ob, lb)
        return od, lsed, od2, op, lsep, om, lm

    fn, _ = compile_fn(step, backend)
    got = fn(q1, kd, vd, qp, kp, vp)
    want = step(q1, kd, vd, qp, kp, vp)
    torch.cuda.synchronize()
    for a, b in zip(got, want):
        _same(a, b)
    od, lsed, od2, op, lsep, om, lm = got
    ref_o, ref_lse = ref_decode(to_np(q1), to_np(kd), to_np(vd), logits_soft_cap=30.0)
    D.check(od, lsed, ref_o, ref_lse, "float16")
    D.check(od2, None, ref_decode(to_np(q1), to_np(kd), to_np(vd), sm_scale=0.1)[0], None, "float16")
    ref_o, ref_lse = P.ref_request(to_np(qp), to_np(kp), to_np(vp), True)
    P.check(op, lsep, ref_o, ref_lse, "float16")
    ref_o, ref_lse = P.ref_request(to_np(qp), to_np(kp), to_np(vp), False)
    P.check(om, lm, ref_o, ref_lse, "float16")


# ======================================================================= opcheck, fake vs real
def test_opcheck_and_fake_shapes(torch_cuda, rng):
    """torch.library.opcheck on every op (schema and mutations, fake tensors, AOT dispatch), and the fake
    implementations' outputs against the real ones."""
    torch = torch_cuda
    from torch._subclasses.fake_tensor import FakeTensorMode
    opcheck = getattr(torch.library, "opcheck", None)
    dtype = torch.float16
    wrapper = tessera.BatchDecodeWithPagedKVCacheWrapper(D.workspace(torch), "NHD")
    q, cache, _, _, _ = _decode_step(torch, rng, wrapper, [3, 40, 0], 16, "NHD", dtype)
    out, lse = torch.empty_like(q), torch.empty(q.shape[:2], device="cuda")
    cases = [(torch.ops.tessera.batch_decode_run.default,
              (wrapper._handle, q, cache[0], cache[1], out, lse, None, None, None, None, None, None, None, None))]
    pw = tessera.BatchPrefillWithPagedKVCacheWrapper(P.workspace(torch))
    table = P.make_table(rng, [20, 33], 16)
    pcache, _, _ = P.random_cache(torch, rng, "NHD", table[3], 16, 128, dtype, False)
    qo = P.indptr_of([4, 7])
    pq = P.uniform(torch, rng, (11, 4, 128), dtype)
    pw.plan(qo, table[0], table[1], table[2], 4, P.HKV, 128, 16, causal=True)
    cases.append((torch.ops.tessera.batch_prefill_paged_run.default,
                  (pw._handle, pq, pcache[0], pcache[1], torch.empty_like(pq), torch.empty(11, 4, device="cuda"),
                   None, None, None, None, None, True, "log2", None, None, None)))
    rw = tessera.BatchPrefillWithRaggedKVCacheWrapper(P.workspace(torch))
    rk, rv = P.uniform(torch, rng, (53, P.HKV, 128), dtype), P.uniform(torch, rng, (53, P.HKV, 128), dtype)
    rw.plan(qo, P.indptr_of([20, 33]), 4, P.HKV, 128, causal=False)
    cases.append((torch.ops.tessera.batch_prefill_ragged_run.default,
                  (rw._handle, pq, rk, rv, torch.empty_like(pq), None, None, None, None, None, None, False, "log2",
                   None)))
    sq = P.uniform(torch, rng, (4, 128), dtype)
    cases.append((torch.ops.tessera.single_decode.default,
                  (sq, rk, rv, "NHD", "NONE", None, None, None, None, None, -1, None, None, None, None)))
    cases.append((torch.ops.tessera.single_prefill.default,
                  (pq, rk, rv, torch.float16, None, None, True, "NHD", "NONE", None, -1, None, None, None, "auto",
                   None, None)))
    lse_a = torch.randn(11, 4, device="cuda")
    cases.append((torch.ops.tessera.merge_state.default, (pq, lse_a, pq.flip(0), lse_a.flip(0))))
    for op, args in cases:
        if opcheck is not None:
            opcheck(op, args)
        real = op(*args)
        if real is None:  # the wrapper ops write their buffers: the fake one must leave them alone and return None
            continue
        with FakeTensorMode() as mode:
            fake = op(*[mode.from_tensor(a) if isinstance(a, torch.Tensor) else a for a in args])
        for r, m in zip(real, fake):
            assert r.shape == m.shape and r.dtype == m.dtype and r.stride() == m.stride(), op


# ======================================================================= CPU: registration and fake tensors
def _torch_cpu():
    torch = pytest.importorskip("torch")
    if not hasattr(torch.library, "custom_op"):
        pytest.skip("torch.library.custom_op needs torch >= 2.4")
    return torch


def test_ops_registered_and_fake_metadata():
    torch = _torch_cpu()
    from tessera import _ops  # noqa: F401 (registers the ops)
    for name in ("batch_decode_run", "batch_prefill_paged_run", "batch_prefill_ragged_run", "single_decode",
                 "single_prefill", "merge_state"):
        assert hasattr(torch.ops.tessera, name), name
    from torch._subclasses.fake_tensor import FakeTensorMode
    with FakeTensorMode():
        _fake_metadata(torch)


def _fake_metadata(torch):
    m = "cpu"  # fake tensors: the fake implementations run, whatever the device
    q = torch.empty(4, 128, dtype=torch.bfloat16, device=m)
    k = torch.empty(70, 2, 128, dtype=torch.bfloat16, device=m)
    o, lse = torch.ops.tessera.single_decode(q, k, k, "NHD", "NONE", None, None, None, None, None, -1, None, None,
                                             None, None)
    assert (o.shape, o.dtype, lse.shape, lse.dtype) == (q.shape, q.dtype, (4,), torch.float32)
    qp = torch.empty(9, 4, 128, dtype=torch.float16, device=m)
    o, lse = torch.ops.tessera.single_prefill(qp, k, k, torch.bfloat16, None, None, True, "NHD", "NONE", None, -1,
                                              None, None, None, "auto", None, None)
    assert (o.shape, o.dtype, lse.shape, lse.dtype) == (qp.shape, torch.bfloat16, (9, 4), torch.float32)
    o, lse = torch.ops.tessera.single_prefill(qp, k, k, None, None, None, False, "NHD", "NONE", None, -1, None, None,
                                              None, "auto", None, None)
    assert o.dtype == torch.float16
    s = torch.empty(9, 4, device=m)
    v, s2 = torch.ops.tessera.merge_state(qp, s, qp, s)
    assert (v.shape, v.dtype, s2.shape, s2.dtype) == (qp.shape, qp.dtype, s.shape, torch.float32)
    out = torch.empty_like(qp)
    assert torch.ops.tessera.batch_prefill_ragged_run(0, qp, k, k, out, None, None, None, None, None, None, False,
                                                      "log2", None) is None
    with pytest.raises(ValueError, match="q: expected a 2-D"):
        torch.ops.tessera.single_decode(qp, k, k, "NHD", "NONE", None, None, None, None, None, -1, None, None, None,
                                        None)


def test_eager_calls_skip_the_ops():
    """Outside torch.compile the run paths never reach the custom ops (no dispatcher overhead in eager run())."""
    torch = _torch_cpu()
    from tessera import _tensors as T
    assert T.torch_ops(torch.empty(2)) is None
    assert T.torch_ops(np.zeros(2)) is None


def test_wrapper_handles():
    from tessera import _wrapper_util as W
    ws = np.zeros(16, np.uint8)
    a = tessera.BatchDecodeWithPagedKVCacheWrapper(ws)
    b = tessera.BatchPrefillWithRaggedKVCacheWrapper(ws)
    c = tessera.BatchPrefillWithPagedKVCacheWrapper(ws)
    assert len({a._handle, b._handle, c._handle}) == 3
    assert W.wrapper_of(b._handle) is b
    h = a._handle
    del a
    import gc
    gc.collect()
    with pytest.raises(ValueError, match=f"wrapper handle {h}"):
        W.wrapper_of(h)
