"""Planning on the GPU: plan(..., on_device=True, batch_size=...) of the
paged decode and prefill wrappers, the ragged prefill wrapper, the cascade
and POD wrappers enqueues the C++ device planner, which reads the step (batch
size, indptr, page ids, last-page lengths) from int32 CUDA tensors sized for
the bounds, so plan() and run() can be captured in one CUDA graph that serves
any batch up to the bounds.

CPU tests check the argument handling, which raises before any GPU work (a
numpy workspace would fail the workspace check, naming
float_workspace_buffer, if it were reached). GPU tests compare steps planned
on the GPU with the same steps planned on the host (bitwise) and with the
float64 references, replay one captured graph for several batch sizes, and
check that a bad device input is raised by the next call.
"""

import inspect

import numpy as np
import pytest

import tessera
import decode_reference as DR
import prefill_reference as PR
from conftest import to_np

HQ, HKV, HEAD_DIM = DR.HQ, DR.HKV, DR.HEAD_DIM


# ======================================================================= CPU
def cpu_decode(**kwargs):
    return tessera.BatchDecodeWithPagedKVCacheWrapper(np.zeros(1024, dtype=np.uint8), **kwargs)


def cpu_prefill(**kwargs):
    return tessera.BatchPrefillWithPagedKVCacheWrapper(np.zeros(1024, dtype=np.uint8), **kwargs)


def i32(values):
    return np.asarray(values, dtype=np.int32)


def decode_args(**overrides):
    """plan() arguments of a small step planned on the device, with host (numpy) tensors unless overridden."""
    args = dict(indptr=i32([0, 1, 3, 3]), indices=i32([0, 2, 1, 5]), last_page_len=i32([5, 16, 1]),
                num_qo_heads=HQ, num_kv_heads=HKV, head_dim=HEAD_DIM, page_size=16, on_device=True,
                batch_size=i32([2]))
    args.update(overrides)
    return args


def prefill_args(**overrides):
    args = dict(qo_indptr=i32([0, 2, 5, 5]), paged_kv_indptr=i32([0, 1, 3, 3]), paged_kv_indices=i32([0, 2, 1, 5]),
                paged_kv_last_page_len=i32([5, 16, 1]), num_qo_heads=HQ, num_kv_heads=HKV, head_dim_qk=HEAD_DIM,
                page_size=16, causal=True, on_device=True, batch_size=i32([2]), max_total_q=16)
    args.update(overrides)
    return args


def expect(error, name, wrapper, **args):
    """wrapper.plan(**args) raises `error` naming `name` first, and builds nothing."""
    with pytest.raises(error, match=f"^{name}"):
        wrapper.plan(**args)
    assert wrapper._native is None and wrapper._planned is None


def test_new_keywords_are_keyword_only_with_defaults():
    for fn, names in ((tessera.BatchDecodeWithPagedKVCacheWrapper._plan_impl, ("on_device", "batch_size")),
                      (tessera.BatchPrefillWithPagedKVCacheWrapper.plan, ("on_device", "batch_size", "max_total_q")),
                      (tessera.BatchPrefillWithRaggedKVCacheWrapper.plan,
                       ("on_device", "batch_size", "max_total_q", "max_kv_tokens")),
                      (tessera.MultiLevelCascadeAttentionWrapper.plan, ("on_device", "batch_size", "max_total_q")),
                      (tessera.PODWithPagedKVCacheWrapper.plan, ("on_device", "batch_size"))):
        params = inspect.signature(fn).parameters
        assert list(params)[-len(names):] == list(names)
        for name in names:
            assert params[name].kind == inspect.Parameter.KEYWORD_ONLY
        assert params["on_device"].default is False
        assert all(params[n].default is None for n in names[1:])


@pytest.mark.parametrize("make, args", [(cpu_decode, decode_args), (cpu_prefill, prefill_args)])
def test_on_device_flag_and_batch_size(make, args):
    expect(TypeError, "on_device", make(), **args(on_device=1))
    expect(TypeError, "on_device", make(), **args(on_device="yes"))
    expect(ValueError, "batch_size", make(), **args(batch_size=None))
    # batch_size belongs to plans on the GPU only
    host = args(on_device=False, batch_size=i32([2]))
    host.pop("max_total_q", None)
    expect(ValueError, "batch_size", make(), **host)


def test_decode_host_tensors_and_dtypes_refused():
    w = cpu_decode
    # dtypes and shapes first, for every tensor (the host can tell them), then the device
    expect(TypeError, "batch_size", w(), **decode_args(batch_size=np.array([2], np.int64)))
    expect(TypeError, "indptr", w(), **decode_args(indptr=np.array([0, 1, 3, 3], np.int64)))
    expect(TypeError, "indices", w(), **decode_args(indices=np.array([0, 2, 1], np.float32)))
    expect(TypeError, "last_page_len", w(), **decode_args(last_page_len=np.array([5, 16, 1], np.uint8)))
    expect(TypeError, "indptr", w(), **decode_args(indptr=[0, 1, 3, 3]))  # a list: no device to stay on
    expect(ValueError, "indptr", w(), **decode_args(indptr=i32([[0, 1], [3, 3]])))
    expect(ValueError, "batch_size", w(), **decode_args(batch_size=i32([2, 2])))
    expect(ValueError, "indices", w(), **decode_args(indices=None))
    # int32 host tensors: the first one named is refused for not being on the GPU
    with pytest.raises(TypeError, match="^batch_size: expected a CUDA tensor"):
        w().plan(**decode_args())
    with pytest.raises(TypeError, match="^batch_size: expected a CUDA tensor"):
        w().plan(**decode_args(batch_size=np.array(2, np.int32)))  # 0-d: one element


def test_decode_options_that_need_the_host():
    w = cpu_decode
    expect(ValueError, "shared_prefix", w(), **decode_args(shared_prefix="auto"))
    expect(ValueError, "seq_lens", w(), **decode_args(seq_lens=i32([21, 32, 0])))
    expect(ValueError, "q_len_per_req", w(), **decode_args(q_len_per_req=2))
    # FlashInfer's checks still come first
    expect(ValueError, "shared_prefix", w(), **decode_args(shared_prefix="sometimes"))
    expect(ValueError, "block_tables", w(), **decode_args(block_tables=i32([[0]])))


def test_prefill_host_tensors_and_dtypes_refused():
    w = cpu_prefill
    expect(TypeError, "qo_indptr", w(), **prefill_args(qo_indptr=np.array([0, 2, 5, 5], np.int64)))
    expect(TypeError, "paged_kv_indptr", w(), **prefill_args(paged_kv_indptr=np.zeros(4, np.float32)))
    expect(TypeError, "paged_kv_indices", w(), **prefill_args(paged_kv_indices=[0, 2, 1, 5]))
    expect(TypeError, "paged_kv_last_page_len",
           w(), **prefill_args(paged_kv_last_page_len=np.array([5, 16, 1], np.int64)))
    expect(ValueError, "paged_kv_indices", w(), **prefill_args(paged_kv_indices=i32([[0, 2], [1, 5]])))
    with pytest.raises(TypeError, match="^batch_size: expected a CUDA tensor"):
        w().plan(**prefill_args())
    # one query per request: qo_indptr None, and no max_total_q (the bound is max_batch)
    with pytest.raises(TypeError, match="^batch_size: expected a CUDA tensor"):
        w().plan(**prefill_args(qo_indptr=None, max_total_q=None))


def test_prefill_max_total_q():
    w = cpu_prefill
    expect(ValueError, "max_total_q", w(), **prefill_args(max_total_q=None))
    expect(ValueError, "max_total_q", w(), **prefill_args(max_total_q=0))
    expect(TypeError, "max_total_q", w(), **prefill_args(max_total_q="16"))
    expect(ValueError, "max_total_q", w(), **prefill_args(qo_indptr=None, max_total_q=16))
    host = prefill_args(on_device=False, batch_size=None)
    expect(ValueError, "max_total_q", w(), **host)


def test_prefill_options_that_need_the_host():
    w = cpu_prefill
    mask = np.ones(2 * 21 + 3 * 32, dtype=bool)
    expect(ValueError, "custom_mask", w(), **prefill_args(causal=False, custom_mask=mask))
    expect(ValueError, "packed_custom_mask", w(), **prefill_args(causal=False, packed_custom_mask=np.packbits(mask)))
    expect(ValueError, "shared_prefix", w(), **prefill_args(shared_prefix="auto"))
    expect(ValueError, "fixed_split_size", w(), **prefill_args(fixed_split_size=4))
    for name in ("seq_lens", "seq_lens_q"):
        expect(ValueError, name, w(), **prefill_args(**{name: i32([21, 32, 0])}))
    for name in ("max_token_per_sequence", "max_sequence_kv"):
        expect(ValueError, name, w(), **prefill_args(**{name: 64}))
    expect(TypeError, "disable_split_kv", w(), **prefill_args(disable_split_kv=1))
    # fixed_split_size -1 and uniform_q_len are what the host plan accepts too
    with pytest.raises(TypeError, match="^batch_size: expected a CUDA tensor"):
        w().plan(**prefill_args(fixed_split_size=-1, uniform_q_len=3, disable_split_kv=True))


def ragged_args(**overrides):
    args = dict(qo_indptr=i32([0, 2, 5]), kv_indptr=i32([0, 9, 20]), num_qo_heads=HQ, num_kv_heads=HKV,
                head_dim_qk=HEAD_DIM, causal=True, on_device=True, batch_size=i32([2]), max_total_q=16,
                max_kv_tokens=64)
    args.update(overrides)
    return args


def test_ragged_plan_on_device_arguments():
    """Ragged KV on the GPU: the bounds, the options that need the host and host tensors, each refused by name
    before any GPU work."""
    w = lambda: tessera.BatchPrefillWithRaggedKVCacheWrapper(np.zeros(1024, dtype=np.uint8))  # noqa: E731
    expect(TypeError, "on_device", w(), **ragged_args(on_device="yes"))
    expect(ValueError, "batch_size", w(), **ragged_args(batch_size=None))
    for bad in (None, 0, 2 ** 31):
        expect(ValueError, "max_kv_tokens", w(), **ragged_args(max_kv_tokens=bad))
    expect(TypeError, "max_kv_tokens", w(), **ragged_args(max_kv_tokens=2.5))
    expect(ValueError, "max_total_q", w(), **ragged_args(max_total_q=None))
    expect(ValueError, "max_total_q", w(), **ragged_args(qo_indptr=None))  # one query per request: no bound
    expect(ValueError, "max_kv_tokens", w(), **ragged_args(on_device=False, batch_size=None, max_total_q=None))
    expect(ValueError, "seq_lens", w(), **ragged_args(seq_lens=i32([9, 11])))
    expect(ValueError, "v_indptr", w(), **ragged_args(v_indptr=i32([0, 9, 20])))
    expect(ValueError, "custom_mask", w(), **ragged_args(causal=False, custom_mask=np.ones(47, bool)))
    expect(TypeError, "batch_size", w(), **ragged_args())  # host tensors: refused by their type
    expect(TypeError, "kv_indptr", w(), **ragged_args(kv_indptr=i32([0, 9, 20]).astype(np.int64)))


def test_cascade_and_pod_plan_on_device_arguments():
    buf = np.zeros(1024, dtype=np.uint8)
    levels = [[i32([0, 3]), i32([0, 3])], [i32([0, 1]), i32([0, 2])], [i32([0, 1, 4]), i32([1, 2])],
              [i32([5]), i32([3, 16])]]
    w = tessera.MultiLevelCascadeAttentionWrapper(2, buf)
    with pytest.raises(ValueError, match="^batch_size"):
        w.plan(*levels, HQ, HKV, HEAD_DIM, 16, on_device=True)
    with pytest.raises(ValueError, match="^batch_size: expected a list of 2"):
        w.plan(*levels, HQ, HKV, HEAD_DIM, 16, on_device=True, batch_size=[i32([1])], max_total_q=8)
    with pytest.raises(TypeError, match=r"^batch_size\[0\]"):  # host tensors: refused by their type
        w.plan(*levels, HQ, HKV, HEAD_DIM, 16, on_device=True, batch_size=[i32([1]), i32([1])], max_total_q=8)
    with pytest.raises(ValueError, match="^max_total_q"):
        w.plan(*levels, HQ, HKV, HEAD_DIM, 16, max_total_q=8)
    assert w._planned is None
    with pytest.raises(TypeError, match="^on_device"):
        tessera.PODWithPagedKVCacheWrapper(buf).plan(i32([0, 1]), i32([0]), i32([5]), HQ, HKV, HEAD_DIM, 16,
                                                     on_device=1)


def test_block_sparse_plans_on_the_host():
    """Block-sparse KV has no plan on the GPU: the keyword is refused by name."""
    buf = np.zeros(1024, dtype=np.uint8)
    with pytest.raises(TypeError, match="on_device"):
        tessera.BlockSparseAttentionWrapper(buf).plan(i32([0, 1]), i32([0]), 16, 16, 16, 16, HQ, HKV, HEAD_DIM,
                                                      on_device=True)


# ======================================================================= GPU
def cuda_i32(torch, n):
    return torch.zeros(max(n, 1), dtype=torch.int32, device="cuda")


class Step:
    """The device tensors of a step, sized for the bounds, written in place (copy_) for each step."""

    def __init__(self, torch, max_batch, max_pages, with_qo=False):
        self.torch = torch
        self.batch_size = cuda_i32(torch, 1)
        self.qo_indptr = cuda_i32(torch, max_batch + 1) if with_qo else None
        self.indptr = cuda_i32(torch, max_batch + 1)
        self.indices = cuda_i32(torch, max_pages)
        self.last = cuda_i32(torch, max_batch)

    def write(self, indptr, indices, last, qo_indptr=None):
        torch = self.torch
        self.batch_size.fill_(len(indptr) - 1)
        for dst, src in ((self.indptr, indptr), (self.indices, indices), (self.last, last),
                         (self.qo_indptr, qo_indptr)):
            if src is not None and len(src):
                dst[: len(src)].copy_(torch.from_numpy(np.ascontiguousarray(src, dtype=np.int32)))


def random_lens(rng, batch, max_len):
    """KV lengths with empty, short and long requests."""
    kinds = rng.integers(0, 8, size=batch)
    lens = np.where(kinds == 0, 0, np.where(kinds < 5, rng.integers(1, 600, size=batch),
                                            rng.integers(1, max_len, size=batch)))
    return [int(n) for n in lens]


def decode_wrapper(torch, tensor_cores, max_batch, max_pages, **kwargs):
    wrapper = tessera.BatchDecodeWithPagedKVCacheWrapper(
        DR.workspace(torch), use_tensor_cores=tensor_cores,
        paged_kv_indptr_buffer=cuda_i32(torch, max_batch + 1), paged_kv_indices_buffer=cuda_i32(torch, max_pages),
        paged_kv_last_page_len_buffer=cuda_i32(torch, max_batch), **kwargs)
    wrapper._cuda_cores = not tensor_cores  # on sm_90 the wrapper would pick the tensor cores for both
    return wrapper


def plan_decode(wrapper, torch, step, page_size, **kwargs):
    wrapper.plan(step.indptr, step.indices, step.last, HQ, HKV, HEAD_DIM, page_size, q_data_type=torch.float16,
                 on_device=True, batch_size=step.batch_size, **kwargs)


def decode_problem(torch, rng, layout, max_batch, max_len, page_size):
    """A shuffled fp16 cache for max_batch requests of up to max_len keys, a query of max_batch rows (and their
    numpy copies for the reference), the pool size and the step's device tensors."""
    pool = max_batch * (max_len // page_size + 1) + 3
    cache, k, v = DR.random_cache(torch, rng, layout, pool, page_size, torch.float16, False)
    q = DR.random_q(torch, rng, max_batch, torch.float16)
    return cache, to_np(k), to_np(v), q, to_np(q), pool, Step(torch, max_batch, pool)


@pytest.mark.parametrize("tensor_cores", [False, True])
def test_decode_device_plan_bitwise_the_host_plan(torch_cuda, rng, tensor_cores):
    """30 random batches: the step planned on the GPU gives bitwise the outputs of the same step planned on the
    host (same bounds: the host wrapper's are fixed by its index buffers), and matches the float64 reference."""
    torch = torch_cuda
    max_batch, page_size, max_len = 24, 16, 3000
    cache, kn, vn, q, qn, pool, step = decode_problem(torch, rng, "NHD", max_batch, max_len, page_size)
    host = decode_wrapper(torch, tensor_cores, max_batch, pool)
    dev = decode_wrapper(torch, tensor_cores, max_batch, pool)
    for i in range(30):
        batch = int(rng.integers(1, max_batch + 1))
        indptr, indices, last, _ = DR.make_table(rng, random_lens(rng, batch, max_len), page_size)
        host.plan(indptr, indices, last, HQ, HKV, HEAD_DIM, page_size, q_data_type=torch.float16)
        o_host, lse_host = host.run(q[:batch], cache, return_lse=True)
        step.write(indptr, indices, last)
        plan_decode(dev, torch, step, page_size)
        o_dev, lse_dev = dev.run(q, cache, return_lse=True)
        torch.cuda.synchronize()
        assert o_dev.shape[0] == max_batch
        assert torch.equal(o_dev[:batch], o_host) and torch.equal(lse_dev[:batch], lse_host), f"batch {i}"
        ref_o, ref_lse = DR.ref_batch_decode(qn[:batch], kn, vn, "NHD", indptr, indices, last, page_size)
        DR.check(o_dev[:batch], lse_dev[:batch], ref_o, ref_lse, "float16")


@pytest.mark.parametrize("tensor_cores", [False, True])
def test_decode_device_plan_one_cuda_graph_for_every_batch_size(torch_cuda, rng, tensor_cores):
    """One torch.cuda.CUDAGraph holds plan(on_device=True) and run(); each step writes the tensors in place and
    replays it. Rows past the step's batch keep their NaN."""
    torch = torch_cuda
    max_batch, page_size, max_len = 16, 16, 2500
    cache, kn, vn, q, qn, pool, step = decode_problem(torch, rng, "HND", max_batch, max_len, page_size)
    # The wrapper's CUDA-graph buffers are the step's tensors (FlashInfer's CUDA-graph wrapper takes them too).
    wrapper = tessera.BatchDecodeWithPagedKVCacheWrapper(
        DR.workspace(torch), "HND", use_cuda_graph=True, use_tensor_cores=tensor_cores,
        paged_kv_indptr_buffer=step.indptr, paged_kv_indices_buffer=step.indices,
        paged_kv_last_page_len_buffer=step.last)
    wrapper._cuda_cores = not tensor_cores
    out = torch.empty_like(q)
    lse = torch.empty(max_batch, HQ, dtype=torch.float32, device="cuda")

    def layer():
        plan_decode(wrapper, torch, step, page_size)
        wrapper.run(q, cache, out=out, lse=lse, return_lse=True)

    step.write(*DR.make_table(rng, [100, 7], page_size)[:3])
    layer()  # eager warm-up outside the capture: builds the C++ object and loads the kernels
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        layer()
    for batch in (1, 7, max_batch, 3, 0):
        lens = random_lens(rng, batch, max_len)
        if batch > 2:
            lens[1] = max_len - 10  # a long request, split
        indptr, indices, last, _ = DR.make_table(rng, lens, page_size)
        step.write(indptr, indices, last)
        out.fill_(float("nan"))
        lse.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        if batch:
            ref_o, ref_lse = DR.ref_batch_decode(qn[:batch], kn, vn, "HND", indptr, indices, last, page_size)
            DR.check(out[:batch], lse[:batch], ref_o, ref_lse, "float16")
        assert torch.isnan(out[batch:]).all() and torch.isnan(lse[batch:]).all(), f"batch {batch}"


def test_decode_device_plan_never_synchronizes(torch_cuda, rng):
    """plan(on_device=True) reads nothing on the host: no synchronizing call under torch's sync debug mode."""
    torch = torch_cuda
    step = Step(torch, 8, 64)
    step.write(*DR.make_table(rng, [40, 0, 300], 16)[:3])
    wrapper = decode_wrapper(torch, False, 8, 64)
    plan_decode(wrapper, torch, step, 16)  # the first plan builds the C++ object (and waits for the GPU)
    torch.cuda.synchronize()
    previous = torch.cuda.get_sync_debug_mode()
    torch.cuda.set_sync_debug_mode("error")
    try:
        plan_decode(wrapper, torch, step, 16)
    finally:
        torch.cuda.set_sync_debug_mode(previous)
    torch.cuda.synchronize()


@pytest.mark.parametrize("tensor_cores", [False, True])
def test_decode_bad_device_input_raised_by_the_next_call(torch_cuda, rng, tensor_cores):
    torch = torch_cuda
    max_batch, pool, page_size = 8, 64, 16
    cache, k, v = DR.random_cache(torch, rng, "NHD", pool, page_size, torch.float16, False)
    q = DR.random_q(torch, rng, max_batch, torch.float16)
    wrapper = decode_wrapper(torch, tensor_cores, max_batch, pool)
    step = Step(torch, max_batch, pool)
    good = DR.make_table(rng, [30, 200, 7], page_size)[:3]
    for name, bad in (("batch_size", lambda: step.batch_size.fill_(max_batch + 1)),
                      ("kv_indptr", lambda: step.indptr[:4].copy_(torch.tensor([0, 2, 1, 3], dtype=torch.int32))),
                      ("kv_last_page_len", lambda: step.last[:3].copy_(torch.tensor([0, 8, 7], dtype=torch.int32)))):
        step.write(*good)
        bad()
        plan_decode(wrapper, torch, step, page_size)
        torch.cuda.synchronize()  # the planner ran: its error is recorded
        with pytest.raises(ValueError, match=name):
            wrapper.run(q, cache)
        step.write(*good)  # a good step works again
        plan_decode(wrapper, torch, step, page_size)
        o, lse = wrapper.run(q, cache, return_lse=True)
        ref_o, ref_lse = DR.ref_batch_decode(to_np(q)[:3], to_np(k), to_np(v), "NHD", *good, page_size)
        DR.check(o[:3], lse[:3], ref_o, ref_lse, "float16")


def test_device_plan_bounds_and_rows(torch_cuda, rng):
    """The bounds are the tensors' sizes; where buffers fixed them, the tensors must give the same; run() takes
    q of the bound's rows; metadata errors name the argument."""
    torch = torch_cuda
    cache, _, _ = DR.random_cache(torch, rng, "NHD", 64, 16, torch.float16, False)
    wrapper = decode_wrapper(torch, False, 8, 64)
    step = Step(torch, 16, 64)
    step.write(*DR.make_table(rng, [30, 200], 16)[:3])
    with pytest.raises(ValueError, match="^indptr: max_batch"):
        plan_decode(wrapper, torch, step, 16)  # 16 requests, where the buffers fixed 8
    step = Step(torch, 8, 64)
    step.write(*DR.make_table(rng, [30, 200], 16)[:3])
    plan_decode(wrapper, torch, step, 16)
    with pytest.raises(ValueError, match="^q: expected 8 rows"):
        wrapper.run(DR.random_q(torch, rng, 2, torch.float16), cache)
    assert wrapper.run(DR.random_q(torch, rng, 8, torch.float16), cache).shape[0] == 8
    strided = cuda_i32(torch, 18)[::2]
    with pytest.raises(ValueError, match="^indptr: expected a contiguous"):
        wrapper.plan(strided, step.indices, step.last, HQ, HKV, HEAD_DIM, 16, q_data_type=torch.float16,
                     on_device=True, batch_size=step.batch_size)
    with pytest.raises(ValueError, match="^last_page_len"):
        wrapper.plan(step.indptr, step.indices, step.last[:5], HQ, HKV, HEAD_DIM, 16, q_data_type=torch.float16,
                     on_device=True, batch_size=step.batch_size)
    # Without buffers the tensors give the bounds; a host plan afterwards plans on the host again.
    free = tessera.BatchDecodeWithPagedKVCacheWrapper(DR.workspace(torch))
    plan_decode(free, torch, step, 16)
    assert free.run(DR.random_q(torch, rng, 8, torch.float16), cache).shape[0] == 8
    indptr, indices, last, _ = DR.make_table(rng, [30, 200], 16)
    free.plan(indptr, indices, last, HQ, HKV, HEAD_DIM, 16, q_data_type=torch.float16)
    assert free.run(DR.random_q(torch, rng, 2, torch.float16), cache).shape[0] == 2


def prefill_step(rng, batch, max_q, max_len, page_size):
    """(qo_indptr, (indptr, indices, last)) of a random causal step: query lengths within the KV lengths and
    within max_q rows in all."""
    kv_lens = random_lens(rng, batch, max_len)
    kv_lens[0] = max(kv_lens[0], 1)
    qo_lens = [min(n, int(rng.integers(0, 130))) for n in kv_lens]
    qo_lens[0] = max(qo_lens[0], 1)  # at least one query row
    qo = np.minimum(PR.indptr_of(qo_lens), max_q).astype(np.int32)
    return qo, PR.make_table(rng, kv_lens, page_size)[:3]


@pytest.mark.parametrize("backend", ["auto", "fa2"])
def test_prefill_device_plan_bitwise_the_host_plan(torch_cuda, rng, backend):
    """Paged prefill, 20 random causal batches: a step planned on the GPU gives bitwise the outputs of the same
    step planned on the host (one wrapper, planned both ways in turn), and matches the float64 reference."""
    torch = torch_cuda
    max_batch, max_q, page_size, max_len = 8, 512, 16, 2000
    pool = max_batch * (max_len // page_size + 1) + 3
    dtype = torch.bfloat16
    cache, k, v = PR.random_cache(torch, rng, "NHD", pool, page_size, HEAD_DIM, dtype, False)
    kn, vn = to_np(k), to_np(v)
    q = PR.uniform(torch, rng, (max_q, HQ, HEAD_DIM), dtype, -2.0, 2.0)
    qn = to_np(q)
    wrapper = tessera.BatchPrefillWithPagedKVCacheWrapper(PR.workspace(torch), backend=backend)
    step = Step(torch, max_batch, pool, with_qo=True)
    for i in range(20):
        qo, table = prefill_step(rng, int(rng.integers(1, max_batch + 1)), max_q, max_len, page_size)
        rows = int(qo[-1])
        step.write(*table, qo_indptr=qo)
        wrapper.plan(step.qo_indptr, step.indptr, step.indices, step.last, HQ, HKV, HEAD_DIM, page_size,
                     causal=True, q_data_type=dtype, on_device=True, batch_size=step.batch_size, max_total_q=max_q)
        o_dev, lse_dev = wrapper.run(q, cache, return_lse=True)
        wrapper.plan(qo, *table, HQ, HKV, HEAD_DIM, page_size, causal=True, q_data_type=dtype)
        o_host, lse_host = wrapper.run(q[:rows], cache, return_lse=True)
        torch.cuda.synchronize()
        assert o_dev.shape[0] == max_q
        assert torch.equal(o_dev[:rows], o_host) and torch.equal(lse_dev[:rows], lse_host), f"batch {i}"
        if i % 5 == 0:
            ref_o, ref_lse = PR.ref_batch(qn[:rows], qo, lambda r: PR.gather_pages(kn, vn, "NHD", table, page_size, r),
                                          causal=True)
            PR.check(o_dev[:rows], lse_dev[:rows], ref_o, ref_lse, "bfloat16")


def test_prefill_device_plan_one_query_per_request(torch_cuda, rng):
    """qo_indptr None: one query per request, q of max_batch rows; bitwise the host plan with qo_indptr 0..batch."""
    torch = torch_cuda
    max_batch, page_size, max_len = 12, 16, 1500
    pool = max_batch * (max_len // page_size + 1) + 3
    dtype = torch.float16
    cache, k, v = PR.random_cache(torch, rng, "NHD", pool, page_size, HEAD_DIM, dtype, False)
    q = PR.uniform(torch, rng, (max_batch, HQ, HEAD_DIM), dtype)
    wrapper = tessera.BatchPrefillWithPagedKVCacheWrapper(PR.workspace(torch))
    step = Step(torch, max_batch, pool)
    for batch in (max_batch, 5, 1):
        table = PR.make_table(rng, random_lens(rng, batch, max_len), page_size)[:3]
        step.write(*table)
        wrapper.plan(None, step.indptr, step.indices, step.last, HQ, HKV, HEAD_DIM, page_size, causal=True,
                     q_data_type=dtype, on_device=True, batch_size=step.batch_size)
        o_dev, lse_dev = wrapper.run(q, cache, return_lse=True)
        wrapper.plan(np.arange(batch + 1, dtype=np.int32), *table, HQ, HKV, HEAD_DIM, page_size, causal=True,
                     q_data_type=dtype)
        o_host, lse_host = wrapper.run(q[:batch], cache, return_lse=True)
        torch.cuda.synchronize()
        assert torch.equal(o_dev[:batch], o_host) and torch.equal(lse_dev[:batch], lse_host), f"batch {batch}"

