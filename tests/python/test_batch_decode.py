"""tessera.BatchDecodeWithPagedKVCacheWrapper against a float64 reference
computed from the paged cache itself (pages gathered through the page table,
then the decode formula of conftest.ref_decode).

GPU tests cover float16/bfloat16 x NHD/HND x (k, v) tuple / interleaved cache
x page sizes 1/16, with GQA group 4 and KV lengths 0, 1, short and long (long
ones are split over CTAs); outputs start as NaN. Also: CUDA-graph capture of
run() for two layers replayed after re-planning with new lengths, workspace
bounds, growth without CUDA graphs, and bad input. use_tensor_cores=True
(decode on the tensor-core prefill kernel) gets the same checks over groups
1/4/8 and head dims 64/128/256, and both paths run FlashInfer's window_left /
logits_soft_cap options. CPU-only tests check option validation and the
workspace-size query; GPU tests skip with "skipped: no GPU".
"""

import numpy as np
import pytest

import tessera
from conftest import rel_error, to_np
from decode_reference import (HEAD_DIM, HKV, HQ, WORKSPACE_BYTES, check, make_table, page_shape, random_cache,
                              random_q, ref_batch_decode, workspace)
from tessera import _C

# ======================================================================= GPU
LENS = [0, 1, 7, 300, 2900, 33, 129, 1]


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("layout", ["NHD", "HND"])
@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("kernel", ["picked", "cuda_cores"])
def test_batch_decode_gpu(torch_cuda, rng, poison, dtype, layout, interleaved, page_size, kernel):
    torch = torch_cuda
    tdt = getattr(torch, dtype)
    indptr, indices, last, num_pages = make_table(rng, LENS, page_size)
    cache, k, v = random_cache(torch, rng, layout, num_pages, page_size, tdt, interleaved)
    q = random_q(torch, rng, len(LENS), tdt)
    wrapper = tessera.BatchDecodeWithPagedKVCacheWrapper(workspace(torch), kv_layout=layout)
    wrapper._cuda_cores = kernel == "cuda_cores"  # else the wrapper picks (tensor cores on sm_90)
    # FlashInfer users often keep the page table on the GPU: plan copies it.
    wrapper.plan(torch.from_numpy(indptr).cuda(), torch.from_numpy(indices).cuda(), torch.from_numpy(last).cuda(),
                 HQ, HKV, HEAD_DIM, page_size, q_data_type=tdt)
    o, lse = wrapper.run(q, cache, return_lse=True)
    torch.cuda.synchronize()
    assert o.shape == q.shape and o.dtype == tdt and o.is_cuda
    assert lse.shape == (len(LENS), HQ) and lse.dtype == torch.float32
    ref_o, ref_lse = ref_batch_decode(to_np(q), to_np(k), to_np(v), layout, indptr, indices, last, page_size)
    check(o, lse, ref_o, ref_lse, dtype)
    assert np.all(to_np(o)[0] == 0) and np.all(np.isneginf(to_np(lse)[0]))  # the empty request


def test_batch_decode_gpu_out_lse_and_sm_scale(torch_cuda, rng):
    """Caller-provided (NaN-filled) out and lse; sm_scale from plan; return_lse=False returns out only."""
    torch = torch_cuda
    indptr, indices, last, num_pages = make_table(rng, [5, 600, 64], 16)
    cache, k, v = random_cache(torch, rng, "NHD", num_pages, 16, torch.float16, False)
    q = random_q(torch, rng, 3, torch.float16)
    wrapper = tessera.BatchDecodeWithPagedKVCacheWrapper(workspace(torch))
    wrapper.plan(indptr, indices, last, HQ, HKV, HEAD_DIM, 16, q_data_type="float16", sm_scale=0.05)
    out = torch.full_like(q, float("nan"))
    lse = torch.full((3, HQ), float("nan"), device="cuda")
    got = wrapper.run(q, cache, out=out, lse=lse)
    torch.cuda.synchronize()
    assert got is out
    ref_o, ref_lse = ref_batch_decode(to_np(q), to_np(k), to_np(v), "NHD", indptr, indices, last, 16, sm_scale=0.05)
    check(out, lse, ref_o, ref_lse, "float16")
    o2, lse2 = wrapper.run_return_lse(q, cache)
    torch.cuda.synchronize()
    assert torch.equal(o2, out) and torch.equal(lse2, lse)  # deterministic


GRAPH_BATCH, GRAPH_PAGE_SIZE, GRAPH_POOL = 6, 16, 700


def check_cuda_graph_replay(torch, rng, wrapper, layout, dtype, return_lse, empty_request):
    """Captures wrapper.run() (a use_cuda_graph wrapper with buffers for GRAPH_BATCH requests over GRAPH_POOL
    pages) for two layers once, then re-plans with new lengths and replays three steps, checking o (and lse
    with return_lse) against the reference. Every step holds one long, split request and, with empty_request,
    an empty one."""
    batch, page_size, pool = GRAPH_BATCH, GRAPH_PAGE_SIZE, GRAPH_POOL
    tdt = getattr(torch, dtype)
    layers = [random_cache(torch, rng, layout, pool, page_size, tdt, False) for _ in range(2)]
    qs = [random_q(torch, rng, batch, tdt) for _ in range(2)]

    def step_table(step):
        lens = list(rng.integers(0, 500, size=batch))
        if empty_request:
            lens[(step + 1) % batch] = 0
        lens[step % batch] = 3000 + 700 * step  # one long, split request
        return make_table(rng, lens, page_size, spare=pool - sum((n + page_size - 1) // page_size for n in lens))

    def plan(table):
        indptr, indices, last, _ = table
        wrapper.plan(indptr, indices, last, HQ, HKV, HEAD_DIM, page_size, q_data_type=tdt)

    table = step_table(0)
    plan(table)
    for l in range(2):  # eager warm-up outside the capture
        wrapper.run(qs[l], layers[l][0])
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outs = [wrapper.run(qs[l], layers[l][0], return_lse=return_lse) for l in range(2)]
    if not return_lse:
        outs = [(o, None) for o in outs]
    for step in range(3):
        if step > 0:
            table = step_table(step)
            plan(table)
        for o, lse in outs:
            o.fill_(float("nan"))
            if lse is not None:
                lse.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        indptr, indices, last, _ = table
        for l in range(2):
            _, k, v = layers[l]
            ref_o, ref_lse = ref_batch_decode(to_np(qs[l]), to_np(k), to_np(v), layout, indptr, indices, last,
                                              page_size)
            check(outs[l][0], outs[l][1], ref_o, ref_lse, dtype)


def test_batch_decode_gpu_cuda_graph_replay(torch_cuda, rng):
    """Capture run() for two layers once; re-plan with new lengths and replay."""
    torch = torch_cuda
    wrapper = tessera.BatchDecodeWithPagedKVCacheWrapper(
        workspace(torch), "HND", use_cuda_graph=True,
        paged_kv_indptr_buffer=torch.empty(GRAPH_BATCH + 1, dtype=torch.int32, device="cuda"),
        paged_kv_indices_buffer=torch.empty(GRAPH_POOL, dtype=torch.int32, device="cuda"),
        paged_kv_last_page_len_buffer=torch.empty(GRAPH_BATCH, dtype=torch.int32, device="cuda"))
    check_cuda_graph_replay(torch, rng, wrapper, "HND", "bfloat16", return_lse=False, empty_request=False)


def test_batch_decode_gpu_grows_without_cuda_graph(torch_cuda, rng):
    """Without CUDA graphs a later, larger plan re-sizes the workspace sections."""
    torch = torch_cuda
    wrapper = tessera.BatchDecodeWithPagedKVCacheWrapper(workspace(torch))
    for lens in ([3, 9], [100, 2000, 5, 0, 77, 64, 1]):
        indptr, indices, last, num_pages = make_table(rng, lens, 16)
        cache, k, v = random_cache(torch, rng, "NHD", num_pages, 16, torch.float16, True)
        q = random_q(torch, rng, len(lens), torch.float16)
        wrapper.plan(indptr, indices, last, HQ, HKV, HEAD_DIM, 16)
        o = wrapper.run(q, cache)
        torch.cuda.synchronize()
        ref_o, _ = ref_batch_decode(to_np(q), to_np(k), to_np(v), "NHD", indptr, indices, last, 16)
        check(o, None, ref_o, None, "float16")


def test_batch_decode_gpu_after_append(torch_cuda, rng):
    """End to end: a decode step's new tokens are appended, then attended to."""
    torch = torch_cuda
    page_size, old = 16, [15, 0, 40]
    new = [n + 1 for n in old]
    indptr, indices, last, num_pages = make_table(rng, new, page_size)
    cache, k, v = random_cache(torch, rng, "NHD", num_pages, page_size, torch.float16, False)
    key = torch.from_numpy(rng.standard_normal((3, HKV, HEAD_DIM)).astype(np.float32)).cuda().half()
    value = torch.from_numpy(rng.standard_normal((3, HKV, HEAD_DIM)).astype(np.float32)).cuda().half()
    t = {name: torch.from_numpy(x).cuda() for name, x in (("indptr", indptr), ("indices", indices), ("last", last))}
    batch_indices, positions = tessera.get_batch_indices_positions(
        torch.arange(4, dtype=torch.int32, device="cuda"), torch.tensor(new, dtype=torch.int32, device="cuda"), 3)
    tessera.append_paged_kv_cache(key, value, batch_indices, positions, cache, t["indices"], t["indptr"], t["last"])
    q = random_q(torch, rng, 3, torch.float16)
    wrapper = tessera.BatchDecodeWithPagedKVCacheWrapper(workspace(torch))
    wrapper.plan(t["indptr"], t["indices"], t["last"], HQ, HKV, HEAD_DIM, page_size)
    o = wrapper.run(q, cache)
    torch.cuda.synchronize()
    ref_o, _ = ref_batch_decode(to_np(q), to_np(k), to_np(v), "NHD", indptr, indices, last, page_size)
    check(o, None, ref_o, None, "float16")
    # The appended token is the last one of each request.
    for b in range(3):
        page = indices[indptr[b + 1] - 1]
        assert torch.equal(k[page, last[b] - 1], key[b]) and torch.equal(v[page, last[b] - 1], value[b])


def test_batch_decode_gpu_bad_input(torch_cuda, rng):
    torch = torch_cuda
    indptr, indices, last, num_pages = make_table(rng, [4, 20], 16)
    cache, _, _ = random_cache(torch, rng, "NHD", num_pages + 4, 16, torch.float16, False)
    q = random_q(torch, rng, 2, torch.float16)

    graph_wrapper = tessera.BatchDecodeWithPagedKVCacheWrapper(workspace(torch), use_cuda_graph=True)
    graph_wrapper.plan(indptr, indices, last, HQ, HKV, HEAD_DIM, 16)
    big = make_table(rng, [4, 20, 1], 16)
    with pytest.raises(ValueError, match="max_batch"):
        graph_wrapper.plan(big[0], big[1], big[2], HQ, HKV, HEAD_DIM, 16)
    more_pages = make_table(rng, [4, 200], 16)
    with pytest.raises(ValueError, match="max_pages"):
        graph_wrapper.plan(more_pages[0], more_pages[1], more_pages[2], HQ, HKV, HEAD_DIM, 16)

    buffered = tessera.BatchDecodeWithPagedKVCacheWrapper(
        workspace(torch), paged_kv_indptr_buffer=torch.empty(3, dtype=torch.int32, device="cuda"))
    with pytest.raises(ValueError, match="max_batch"):
        buffered.plan(big[0], big[1], big[2], HQ, HKV, HEAD_DIM, 16)

    wrapper = tessera.BatchDecodeWithPagedKVCacheWrapper(workspace(torch))
    wrapper.plan(indptr, indices, last, HQ, HKV, HEAD_DIM, 16, q_data_type=torch.float16)
    with pytest.raises(TypeError, match="q"):
        wrapper.run(q.bfloat16(), cache)
    with pytest.raises(TypeError, match="kv"):
        wrapper.run(q, (cache[0].bfloat16(), cache[1].bfloat16()))
    with pytest.raises(ValueError, match="q"):
        wrapper.run(q[:1], cache)
    with pytest.raises(ValueError, match="paged_kv_cache"):
        wrapper.run(q, (cache[0],))
    with pytest.raises(TypeError, match="q"):
        wrapper.run(q.cpu(), cache)
    with pytest.raises(ValueError, match="k_scale"):
        wrapper.run(q, cache, k_scale=0.0)
    with pytest.raises(ValueError, match="kv_indices"):  # the cache is smaller than the page table says
        wrapper.run(q, (cache[0][:2], cache[1][:2]))
    small = tessera.BatchDecodeWithPagedKVCacheWrapper(torch.empty(1024, dtype=torch.uint8, device="cuda"))
    with pytest.raises(ValueError, match="float_workspace_buffer"):
        small.plan(indptr, indices, last, HQ, HKV, HEAD_DIM, 16)
    # torch index tensors (CPU int32 is the fast path) are still checked for rank and dtype
    ti = lambda a: torch.from_numpy(np.asarray(a, dtype=np.int32))  # noqa: E731
    with pytest.raises(ValueError, match="^indptr:"):
        wrapper.plan(ti(indptr).view(1, -1), ti(indices), ti(last), HQ, HKV, HEAD_DIM, 16)
    with pytest.raises(ValueError, match="^indices:"):
        wrapper.plan(ti(indptr), ti(indices).view(-1, 1), ti(last), HQ, HKV, HEAD_DIM, 16)
    with pytest.raises(TypeError, match="^last_page_len:"):
        wrapper.plan(ti(indptr), ti(indices), ti(last).float(), HQ, HKV, HEAD_DIM, 16)
    wrapper.plan(ti(indptr), ti(indices), ti(last), HQ, HKV, HEAD_DIM, 16, q_data_type=torch.float16)
    o = wrapper.run(q, cache)
    torch.cuda.synchronize()
    ref_o, _ = ref_batch_decode(to_np(q), to_np(cache[0]), to_np(cache[1]), "NHD", indptr, indices, last, 16)
    check(o, None, ref_o, None, "float16")


# ------------------------------------------------------------ use_tensor_cores
def random_problem(torch, rng, lens, layout, page_size, dtype, hkv, group, head_dim, interleaved=False):
    """(indptr, indices, last, cache, k, v, q) on the GPU for hkv KV heads and group * hkv query heads."""
    indptr, indices, last, num_pages = make_table(rng, lens, page_size)
    shape = page_shape(layout, num_pages, page_size, hkv, head_dim)
    rand = lambda shp: torch.from_numpy(rng.standard_normal(shp).astype(np.float32)).to("cuda").to(dtype)  # noqa: E731
    if interleaved:
        cache = rand((shape[0], 2) + shape[1:])
        k, v = cache[:, 0], cache[:, 1]
    else:
        k, v = rand(shape), rand(shape)
        cache = (k, v)
    q = rand((len(lens), hkv * group, head_dim)) * 2
    return indptr, indices, last, cache, k, v, q


TC_LENS = [0, 1, 7, 300, 6000, 33, 129, 1, 513]


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("layout", ["NHD", "HND"])
@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("group, head_dim", [(1, 128), (4, 64), (4, 128), (8, 256)])
def test_batch_decode_gpu_tensor_cores(torch_cuda, rng, poison, dtype, layout, page_size, group, head_dim):
    torch = torch_cuda
    tdt = getattr(torch, dtype)
    hkv = 2
    indptr, indices, last, cache, k, v, q = random_problem(torch, rng, TC_LENS, layout, page_size, tdt, hkv, group,
                                                           head_dim, interleaved=page_size == 1)
    wrapper = tessera.BatchDecodeWithPagedKVCacheWrapper(workspace(torch), layout, False, True)  # FlashInfer's order
    assert wrapper.use_tensor_cores
    wrapper.plan(indptr, indices, last, hkv * group, hkv, head_dim, page_size, q_data_type=tdt)
    assert wrapper._native.use_tensor_cores and wrapper.last_plan_us > 0
    o, lse = wrapper.run(q, cache, return_lse=True)
    torch.cuda.synchronize()
    assert o.shape == q.shape and o.dtype == tdt
    ref_o, ref_lse = ref_batch_decode(to_np(q), to_np(k), to_np(v), layout, indptr, indices, last, page_size)
    check(o, lse, ref_o, ref_lse, dtype)
    assert np.all(to_np(o)[0] == 0) and np.all(np.isneginf(to_np(lse)[0]))  # the empty request
    o2, lse2 = wrapper.run(q, cache, return_lse=True)
    torch.cuda.synchronize()
    assert torch.equal(o2, o) and torch.equal(lse2, lse)  # bitwise deterministic
    # Same attention as the CUDA-core path, to rounding.
    cuda_cores = tessera.BatchDecodeWithPagedKVCacheWrapper(workspace(torch), layout)
    cuda_cores._cuda_cores = True
    cuda_cores.plan(indptr, indices, last, hkv * group, hkv, head_dim, page_size, q_data_type=tdt)
    check(o, None, to_np(cuda_cores.run(q, cache)), None, dtype)


@pytest.mark.parametrize("tensor_cores", [False, True])
@pytest.mark.parametrize("window_left, logits_soft_cap", [(100, None), (0, None), (-1, 30.0), (37, 5.0)])
def test_batch_decode_gpu_window_and_soft_cap(torch_cuda, rng, poison, tensor_cores, window_left, logits_soft_cap):
    """FlashInfer's plan() options: a sliding window (keys >= kv_len - 1 - window_left), a logits soft cap, both."""
    torch = torch_cuda
    indptr, indices, last, cache, k, v, q = random_problem(torch, rng, TC_LENS, "NHD", 16, torch.float16, 2, 4, 128)
    wrapper = tessera.BatchDecodeWithPagedKVCacheWrapper(workspace(torch), "NHD", use_tensor_cores=tensor_cores)
    wrapper._cuda_cores = not tensor_cores
    wrapper.plan(indptr, indices, last, 8, 2, 128, 16, window_left=window_left, logits_soft_cap=logits_soft_cap,
                 q_data_type=torch.float16)
    o, lse = wrapper.run(q, cache, return_lse=True, window_left=window_left)
    torch.cuda.synchronize()
    ref_o, ref_lse = ref_batch_decode(to_np(q), to_np(k), to_np(v), "NHD", indptr, indices, last, 16,
                                      window_left=window_left, logits_soft_cap=logits_soft_cap or 0.0)
    check(o, lse, ref_o, ref_lse, "float16")
    plain = tessera.BatchDecodeWithPagedKVCacheWrapper(workspace(torch), "NHD", use_tensor_cores=tensor_cores)
    plain._cuda_cores = not tensor_cores
    plain.plan(indptr, indices, last, 8, 2, 128, 16, q_data_type=torch.float16)
    assert rel_error(to_np(plain.run(q, cache)), ref_o) > 1e-2  # the options change the result
    with pytest.raises(ValueError, match="window_left"):
        wrapper.run(q, cache, window_left=window_left + 1)


def test_batch_decode_gpu_tensor_cores_cuda_graph_replay(torch_cuda, rng):
    """use_tensor_cores: capture run() for two layers; re-plan with new lengths and replay."""
    torch = torch_cuda
    batch, page_size = GRAPH_BATCH, GRAPH_PAGE_SIZE
    wrapper = tessera.BatchDecodeWithPagedKVCacheWrapper(
        workspace(torch), "NHD", use_cuda_graph=True, use_tensor_cores=True,
        paged_kv_indptr_buffer=torch.empty(batch + 1, dtype=torch.int32, device="cuda"),
        paged_kv_indices_buffer=torch.empty(GRAPH_POOL, dtype=torch.int32, device="cuda"))
    check_cuda_graph_replay(torch, rng, wrapper, "NHD", "float16", return_lse=True, empty_request=True)
    with pytest.raises(ValueError, match="max_batch"):
        big = make_table(rng, [5] * (batch + 1), page_size)
        wrapper.plan(big[0], big[1], big[2], HQ, HKV, HEAD_DIM, page_size)


def test_batch_decode_gpu_tensor_cores_grows_and_rejects_mixed_dtypes(torch_cuda, rng):
    torch = torch_cuda
    wrapper = tessera.BatchDecodeWithPagedKVCacheWrapper(workspace(torch), use_tensor_cores=True)
    for lens in ([3, 9], [100, 2000, 5, 0, 77, 64, 1]):  # the second plan re-sizes the sections
        indptr, indices, last, num_pages = make_table(rng, lens, 16)
        cache, k, v = random_cache(torch, rng, "NHD", num_pages, 16, torch.bfloat16, True)
        q = random_q(torch, rng, len(lens), torch.bfloat16)
        wrapper.plan(indptr, indices, last, HQ, HKV, HEAD_DIM, 16, q_data_type="bfloat16")
        o = wrapper.run(q, cache)
        torch.cuda.synchronize()
        ref_o, _ = ref_batch_decode(to_np(q), to_np(k), to_np(v), "NHD", indptr, indices, last, 16)
        check(o, None, ref_o, None, "bfloat16")
    with pytest.raises(TypeError, match="q_dtype"):
        wrapper.plan(indptr, indices, last, HQ, HKV, HEAD_DIM, 16, q_data_type="float16", kv_data_type="bfloat16")
    with pytest.raises(TypeError, match="q"):
        wrapper.run(q.half(), cache)


# ======================================================================= CPU
def cpu_wrapper(**kwargs):
    return tessera.BatchDecodeWithPagedKVCacheWrapper(np.zeros(1024, dtype=np.uint8), **kwargs)


def plan_args(**kwargs):
    args = dict(indptr=[0, 1, 3], indices=[0, 2, 1], last_page_len=[5, 16], num_qo_heads=HQ, num_kv_heads=HKV,
                head_dim=HEAD_DIM, page_size=16)
    args.update(kwargs)
    return args


def test_wrapper_constructor_options():
    with pytest.raises(ValueError, match="kv_layout"):
        cpu_wrapper(kv_layout="NDH")
    with pytest.raises(ValueError, match="not supported yet"):
        cpu_wrapper(backend="trtllm-gen")
    with pytest.raises(ValueError, match="not supported yet"):
        cpu_wrapper(jit_args=["x"])
    with pytest.raises(TypeError, match="float_workspace_buffer"):
        tessera.BatchDecodeWithPagedKVCacheWrapper([0] * 16)
    with pytest.raises(ValueError, match="paged_kv_last_page_len_buffer"):
        cpu_wrapper(paged_kv_indptr_buffer=np.zeros(5, np.int32), paged_kv_last_page_len_buffer=np.zeros(3, np.int32))
    w = cpu_wrapper(use_cuda_graph=True, use_tensor_cores=True, backend="fa2")
    assert w.is_cuda_graph_enabled and w.use_tensor_cores
    w = tessera.BatchDecodeWithPagedKVCacheWrapper(np.zeros(1024, dtype=np.uint8), "HND", False, True)
    assert w.use_tensor_cores and not w.is_cuda_graph_enabled  # FlashInfer's positional order
    assert not cpu_wrapper().use_tensor_cores


def test_wrapper_tensor_cores_validation_without_gpu():
    w = cpu_wrapper(use_tensor_cores=True)
    # The tensor-core prefill kernel reads q and KV with one mma type.
    with pytest.raises(TypeError, match="q_dtype"):
        w.plan(**plan_args(q_data_type="float16", kv_data_type="bfloat16"))
    with pytest.raises(ValueError, match="head_dim"):
        w.plan(**plan_args(head_dim=80))
    for dt in ("float16", "bfloat16"):  # valid: the workspace is what is wrong
        with pytest.raises(TypeError, match="float_workspace_buffer"):
            w.plan(**plan_args(q_data_type=dt))


@pytest.mark.parametrize("option, value", [("pos_encoding_mode", "XPOS"), ("pos_encoding_mode", "rope"),
                                           ("rope_scale", 2.0), ("rope_theta", 1e4)])
def test_wrapper_plan_rejects_unsupported_options(option, value):
    """Only NONE, ROPE_LLAMA and ALIBI; RoPE's parameters only with ROPE_LLAMA (test_pos_encoding.py runs it)."""
    with pytest.raises(ValueError, match=option):
        cpu_wrapper().plan(**plan_args(**{option: value}))


WINDOW_CAP_ERRORS = [  # (window_left, logits_soft_cap), error, what the message names
    ((-2, None), ValueError, "^window_left:"), ((1.5, None), TypeError, "^window_left:"),
    ((True, None), TypeError, "^window_left:"), ((2**31, None), ValueError, "^window_left:"),
    ((-1, -1.0), ValueError, "^logits_soft_cap:"), ((-1, float("nan")), ValueError, "^logits_soft_cap:"),
    ((-1, float("inf")), ValueError, "^logits_soft_cap:"), ((-1, 1e-50), ValueError, "^logits_soft_cap:"),
    ((-1, "30"), TypeError, "^logits_soft_cap:"),
]


@pytest.mark.parametrize("options, error, name", WINDOW_CAP_ERRORS)
def test_wrapper_plan_window_and_soft_cap_validation(options, error, name):
    with pytest.raises(error, match=name):
        cpu_wrapper().plan(**plan_args(window_left=options[0], logits_soft_cap=options[1]))


@pytest.mark.parametrize("window_left, logits_soft_cap", [(128, None), (0, 30.0), (-1, 50.0), (-1, 0.0)])
def test_wrapper_plan_accepts_window_and_soft_cap(window_left, logits_soft_cap):
    """Valid options pass every check (a CPU workspace is then what is wrong)."""
    with pytest.raises(TypeError, match="float_workspace_buffer"):
        cpu_wrapper().plan(**plan_args(window_left=window_left, logits_soft_cap=logits_soft_cap))
    with pytest.raises(TypeError, match="float_workspace_buffer"):
        cpu_wrapper(use_tensor_cores=True).plan(**plan_args(window_left=window_left, logits_soft_cap=logits_soft_cap))


def test_wrapper_plan_validation_without_gpu():
    w = cpu_wrapper()
    with pytest.raises(TypeError, match="q_data_type"):
        w.plan(**plan_args(q_data_type="float32"))
    with pytest.raises(TypeError, match="kv_data_type"):
        w.plan(**plan_args(kv_data_type=np.float64))
    with pytest.raises(ValueError, match="head_dim"):
        w.plan(**plan_args(head_dim=80))
    with pytest.raises(ValueError, match="num_qo_heads"):
        w.plan(**plan_args(num_qo_heads=6, num_kv_heads=4))
    with pytest.raises(ValueError, match="page_size"):
        w.plan(**plan_args(page_size=0))
    with pytest.raises(ValueError, match="sm_scale"):
        w.plan(**plan_args(sm_scale=-1.0))
    with pytest.raises(TypeError, match="indptr"):
        w.plan(**plan_args(indptr=np.array([0.0, 1.0, 3.0])))
    with pytest.raises(ValueError, match="indices"):
        w.plan(**plan_args(indices=np.zeros((3, 1), np.int32)))
    # Valid options (dtype aliases included): the workspace is what is wrong.
    for dt in ("half", "bfloat16", np.float16):
        with pytest.raises(TypeError, match="float_workspace_buffer"):
            w.plan(**plan_args(q_data_type=dt))
    with pytest.raises(ValueError, match="plan"):
        w.run(np.zeros((2, HQ, HEAD_DIM), np.float16), (None, None))


def test_wrapper_plan_rechecks_changed_arguments_without_gpu():
    # plan() checks its scalar arguments only when they change between steps:
    # a valid plan (stopped by the workspace) must not let a later bad one through.
    w = cpu_wrapper()
    with pytest.raises(TypeError, match="float_workspace_buffer"):
        w.plan(**plan_args())
    with pytest.raises(ValueError, match="num_qo_heads"):
        w.plan(**plan_args(num_qo_heads=6, num_kv_heads=4))
    with pytest.raises(TypeError, match="float_workspace_buffer"):
        w.plan(**plan_args(page_size=1))
    with pytest.raises(ValueError, match="page_size"):
        w.plan(**plan_args(page_size=True))  # == 1, but a bool is not a page size
    with pytest.raises(TypeError, match="float_workspace_buffer"):
        w.plan(**plan_args())
    with pytest.raises(TypeError, match="indptr"):  # index arrays are checked every time
        w.plan(**plan_args(indptr=np.array([0.0, 1.0, 3.0])))


def test_workspace_size_query():
    def size(batch, pages, sms=132):
        return _C.BatchDecode.workspace_size("float16", "float16", "float16", 128, 32, 8, 16, "NHD", batch, pages,
                                             num_sms=sms)

    dev, host = size(64, 4096)
    assert 0 < host <= dev
    assert size(256, 4096)[0] > dev and size(64, 65536)[0] > dev
    assert size(64, 4096, sms=16)[0] < dev  # fewer CTAs, fewer partial-state slots
    assert size(64, 4096)[0] < WORKSPACE_BYTES
    with pytest.raises(ValueError, match="max_batch"):
        size(0, 16)
    with pytest.raises(ValueError, match="kv_layout"):
        _C.BatchDecode.workspace_size("float16", "float16", "float16", 128, 32, 8, 16, "XYZ", 1, 1, num_sms=1)


def test_workspace_size_query_tensor_cores():
    """use_tensor_cores sizes the prefill wrapper's sections: max_total_q = max_batch, 8-row tiles (4-head groups)."""
    def size(batch, pages, **kw):
        return _C.BatchDecode.workspace_size("bfloat16", "bfloat16", "bfloat16", 128, 32, 8, 16, "HND", batch, pages,
                                             num_sms=132, use_tensor_cores=True, **kw)

    prefill = _C.BatchPrefill.workspace_size("bfloat16", "bfloat16", "bfloat16", 128, 32, 8, 16, "HND", False, 64, 64,
                                             4096, num_sms=132, cta_q=8)
    assert size(64, 4096) == prefill
    assert size(256, 4096)[0] > size(64, 4096)[0]
    assert size(64, 4096, max_sms=16)[0] < size(64, 4096)[0]
    assert size(256, 65536)[0] < WORKSPACE_BYTES
    with pytest.raises(TypeError, match="q_dtype"):
        _C.BatchDecode.workspace_size("float16", "bfloat16", "float16", 128, 32, 8, 16, "NHD", 1, 1, num_sms=1,
                                      use_tensor_cores=True)
