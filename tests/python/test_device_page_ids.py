"""Page ids that stay on the GPU: plan() given a CUDA index tensor copies it
without reading it (as FlashInfer's plan() does), the kernels check the ids,
and a bad id is raised (ValueError, naming it) by the next plan() or run():
batch decode (both paths), paged prefill (both templates, and a custom mask,
whose plan takes host ids), the generic AttentionWrapper; the cascade's
test is in test_cascade.py.

GPU tests compare against the same wrapper planned with the same ids on the
host (same bits) and against the float64 reference; the CPU tests cover the
argument handling that needs no GPU.
"""

import numpy as np
import pytest

import tessera
from tessera import _wrapper_util as W
from decode_reference import HEAD_DIM, HKV, HQ, check, make_table, random_cache, random_q, ref_batch_decode, workspace

LENS = [0, 1, 700, 33, 2900, 129]


def plan_decode(wrapper, indptr, indices, last, page_size, dtype):
    wrapper.plan(indptr, indices, last, HQ, HKV, HEAD_DIM, page_size, q_data_type=dtype)


# ======================================================================= GPU
@pytest.mark.parametrize("tensor_cores", [False, True])
@pytest.mark.parametrize("page_size", [1, 16])
def test_decode_device_ids_same_bits_as_host_ids(torch_cuda, rng, tensor_cores, page_size):
    torch = torch_cuda
    indptr, indices, last, num_pages = make_table(rng, LENS, page_size)
    cache, k, v = random_cache(torch, rng, "NHD", num_pages, page_size, torch.float16, False)
    q = random_q(torch, rng, len(LENS), torch.float16)
    wrapper = tessera.BatchDecodeWithPagedKVCacheWrapper(workspace(torch), use_tensor_cores=tensor_cores)
    wrapper._cuda_cores = not tensor_cores
    plan_decode(wrapper, indptr, indices, last, page_size, torch.float16)
    o_host, lse_host = wrapper.run(q, cache, return_lse=True)
    ref_o, ref_lse = ref_batch_decode(q.cpu().float().numpy(), k.cpu().float().numpy(), v.cpu().float().numpy(),
                                      "NHD", indptr, indices, last, page_size)
    check(o_host, lse_host, ref_o, ref_lse, "float16")
    # int32 with a longer buffer (FlashInfer's fixed buffers), and int64
    longer = torch.full((len(indices) + 5,), -9, dtype=torch.int32, device="cuda")
    longer[: len(indices)] = torch.from_numpy(indices).cuda()
    for ids in (longer, torch.from_numpy(indices).cuda().long()):
        plan_decode(wrapper, indptr, ids, last, page_size, torch.float16)
        o, lse = wrapper.run(q, cache, return_lse=True)
        torch.cuda.synchronize()
        assert torch.equal(o, o_host) and torch.equal(lse, lse_host)


@pytest.mark.parametrize("tensor_cores", [False, True])
def test_decode_bad_device_id_raised_by_the_next_call(torch_cuda, rng, tensor_cores):
    torch = torch_cuda
    indptr, indices, last, num_pages = make_table(rng, [90, 1, 300], 16)
    cache, k, v = random_cache(torch, rng, "HND", num_pages, 16, torch.float16, False)
    q = random_q(torch, rng, 3, torch.float16)
    wrapper = tessera.BatchDecodeWithPagedKVCacheWrapper(workspace(torch), kv_layout="HND",
                                                         use_tensor_cores=tensor_cores)
    for bad in (num_pages, -4):
        ids = indices.copy()
        ids[len(ids) // 2] = bad
        plan_decode(wrapper, indptr, torch.from_numpy(ids).cuda(), last, 16, torch.float16)  # never reads the ids
        wrapper.run(q, cache)
        torch.cuda.synchronize()
        with pytest.raises(ValueError, match=f"kv_indices: .*page id {bad}"):
            wrapper.run(q, cache)
        plan_decode(wrapper, indptr, torch.from_numpy(indices).cuda(), last, 16, torch.float16)
        o = wrapper.run(q, cache)
        torch.cuda.synchronize()
        ref_o, _ = ref_batch_decode(q.cpu().float().numpy(), k.cpu().float().numpy(), v.cpu().float().numpy(), "HND",
                                    indptr, indices, last, 16)
        check(o, None, ref_o, None, "float16")
    ids = indices.copy()
    ids[-1] = num_pages + 50
    plan_decode(wrapper, indptr, torch.from_numpy(ids).cuda(), last, 16, torch.float16)
    wrapper.run(q, cache)
    torch.cuda.synchronize()
    with pytest.raises(ValueError, match="kv_indices"):  # plan() raises it too
        plan_decode(wrapper, indptr, indices, last, 16, torch.float16)


def test_decode_device_ids_argument_errors(torch_cuda, rng):
    torch = torch_cuda
    indptr, indices, last, _ = make_table(rng, [40, 3], 16)
    wrapper = tessera.BatchDecodeWithPagedKVCacheWrapper(workspace(torch))
    ids = torch.from_numpy(indices).cuda()
    with pytest.raises(TypeError, match="^indices:"):
        plan_decode(wrapper, indptr, ids.float(), last, 16, torch.float16)
    with pytest.raises(ValueError, match="^indices:"):
        plan_decode(wrapper, indptr, ids.view(-1, 1), last, 16, torch.float16)
    with pytest.raises(ValueError, match="^indices: expected at least"):
        plan_decode(wrapper, indptr, ids[:-1], last, 16, torch.float16)
    with pytest.raises(ValueError, match="last_page_len"):
        plan_decode(wrapper, indptr, ids, np.array([0, 3], dtype=np.int32), 16, torch.float16)


@pytest.mark.parametrize("backend", ["auto", "fa2"])
@pytest.mark.parametrize("page_size", [1, 16])
def test_prefill_device_ids_same_bits_and_bad_id(torch_cuda, rng, backend, page_size):
    torch = torch_cuda
    q_len, kv_len = [0, 5, 1, 100, 37], [10, 0, 300, 190, 37]
    indptr, indices, last, num_pages = make_table(rng, kv_len, page_size)
    cache, _, _ = random_cache(torch, rng, "NHD", num_pages, page_size, torch.bfloat16, False)
    qo = np.concatenate([[0], np.cumsum(q_len)]).astype(np.int32)
    q = torch.from_numpy(rng.standard_normal((int(qo[-1]), HQ, HEAD_DIM)).astype(np.float32)).cuda().bfloat16()
    wrapper = tessera.BatchPrefillWithPagedKVCacheWrapper(workspace(torch), backend=backend)

    def plan(ids):
        wrapper.plan(qo, indptr, ids, last, HQ, HKV, HEAD_DIM, page_size, causal=True, q_data_type=torch.bfloat16)

    plan(indices)
    o_host, lse_host = wrapper.run(q, cache, return_lse=True)
    plan(torch.from_numpy(indices).cuda())
    o, lse = wrapper.run(q, cache, return_lse=True)
    torch.cuda.synchronize()
    assert torch.equal(o, o_host) and torch.equal(lse, lse_host)
    bad = indices.copy()
    bad[-2] = num_pages + 3
    plan(torch.from_numpy(bad).cuda())
    wrapper.run(q, cache)
    torch.cuda.synchronize()
    with pytest.raises(ValueError, match=f"page id {num_pages + 3}"):
        wrapper.run(q, cache)
    plan(torch.from_numpy(indices).cuda())
    o = wrapper.run(q, cache)
    torch.cuda.synchronize()
    assert torch.equal(o, o_host)


def test_prefill_custom_mask_with_device_ids(torch_cuda, rng):
    """A custom mask's plan takes host ids: CUDA ids are copied to the host there."""
    torch = torch_cuda
    q_len, kv_len = [3, 17], [20, 40]
    indptr, indices, last, num_pages = make_table(rng, kv_len, 16)
    cache, _, _ = random_cache(torch, rng, "NHD", num_pages, 16, torch.float16, False)
    qo = np.concatenate([[0], np.cumsum(q_len)]).astype(np.int32)
    q = torch.from_numpy(rng.standard_normal((int(qo[-1]), HQ, HEAD_DIM)).astype(np.float32)).cuda().half()
    mask = torch.from_numpy(rng.random(sum(a * b for a, b in zip(q_len, kv_len))) < 0.6).cuda()
    outs = []
    for ids in (indices, torch.from_numpy(indices).cuda()):
        wrapper = tessera.BatchPrefillWithPagedKVCacheWrapper(workspace(torch))
        wrapper.plan(qo, indptr, ids, last, HQ, HKV, HEAD_DIM, 16, custom_mask=mask, q_data_type=torch.float16)
        outs.append(wrapper.run(q, cache))
    torch.cuda.synchronize()
    assert torch.equal(outs[0], outs[1])


@pytest.mark.parametrize("q_len", [1, 7])
def test_attention_wrapper_device_ids(torch_cuda, rng, q_len):
    """The generic AttentionWrapper (decode when every query length is 1, else prefill), soft-cap spec."""
    torch = torch_cuda
    lens = [40, 700, 1, 333]
    indptr, indices, last, num_pages = make_table(rng, lens, 16)
    cache, _, _ = random_cache(torch, rng, "NHD", num_pages, 16, torch.float16, False)
    qo = np.arange(0, len(lens) * q_len + 1, q_len, dtype=np.int32)
    q = torch.randn(int(qo[-1]), HQ, HEAD_DIM, device="cuda", dtype=torch.float16)
    spec = tessera.AttentionSpec(tessera.variants.soft_cap(30.0), q_dtype=torch.float16, head_dim=HEAD_DIM)
    task = tessera.TaskInfo(HQ, HKV, page_size=16, max_batch=8, max_pages=num_pages, max_total_q=64)
    outs = []
    for ids in (indices, torch.from_numpy(indices).cuda()):
        attn = tessera.AttentionWrapper(spec, task, workspace(torch))
        attn.plan(qo, indptr, ids, last)
        assert attn.kind == ("decode" if q_len == 1 else "prefill")
        outs.append(attn.run(q, cache))
    torch.cuda.synchronize()
    assert torch.equal(outs[0], outs[1])


# ======================================================================= CPU
def test_page_ids_on_the_host_are_cut_to_count():
    got = W.page_ids([4, 2, 9, 7], 3, "indices", None)
    assert got.dtype == np.int32 and got.tolist() == [4, 2, 9]
    assert W.page_ids(np.array([1, 2], dtype=np.int64), 2, "indices", None).dtype == np.int32
    with pytest.raises(TypeError, match="^indices:"):
        W.page_ids(np.array([1.0, 2.0]), 2, "indices", None)
