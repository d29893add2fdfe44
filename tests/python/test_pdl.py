"""Programmatic dependent launch (sm_90): a run launched right behind the
kernel that writes its inputs (tessera.append_paged_kv_cache of each
request's newest token, as in serving) sees them, bit for bit the run
without PDL over the full cache, whether asked for (enable_pdl=True) or by
default (None: on, as FlashInfer's wrappers); decode on both paths, paged /
ragged prefill and MLA. Before sm_90 the option is accepted and ignored."""

import numpy as np
import pytest

import tessera
from decode_reference import HEAD_DIM, HKV, HQ, make_table, random_cache, random_q, workspace


def zero_last_tokens(torch, k, v, indptr, indices, last, page_size):
    """Zeroes each request's last token in the caches; returns the append arguments that write it back."""
    b_idx, pos, ak, av = [], [], [], []
    for b in range(len(indptr) - 1):
        n = 0 if indptr[b + 1] == indptr[b] else (indptr[b + 1] - indptr[b] - 1) * page_size + int(last[b])
        if n == 0:
            continue
        page, slot = int(indices[indptr[b] + (n - 1) // page_size]), (n - 1) % page_size
        ak.append(k[page, slot].clone())
        av.append(v[page, slot].clone())
        k[page, slot] = 0
        v[page, slot] = 0
        b_idx.append(b)
        pos.append(n - 1)
    ints = lambda x: torch.tensor(x, dtype=torch.int32, device="cuda")  # noqa: E731
    return (torch.stack(ak), torch.stack(av), ints(b_idx), ints(pos), (k, v), ints(indices), ints(indptr), ints(last))


@pytest.mark.parametrize("kind", ["decode", "decode-tc", "prefill", "prefill-fa2"])
def test_enable_pdl_sees_the_append_before_it(torch_cuda, rng, kind):
    torch = torch_cuda
    lens = [1, 300, 2000, 64, 17]
    indptr, indices, last, num_pages = make_table(rng, lens, 16)
    (k, v), _, _ = random_cache(torch, rng, "NHD", num_pages, 16, torch.float16, False)
    if kind.startswith("decode"):
        q = random_q(torch, rng, len(lens), torch.float16)
        w = tessera.BatchDecodeWithPagedKVCacheWrapper(workspace(torch), use_tensor_cores=kind == "decode-tc")
        w._cuda_cores = kind != "decode-tc"
        w.plan(indptr, indices, last, HQ, HKV, HEAD_DIM, 16)
    else:
        q_len = [1, 7, 30, 2, 5]
        qo = np.concatenate([[0], np.cumsum(q_len)]).astype(np.int32)
        q = torch.randn(int(qo[-1]), HQ, HEAD_DIM, device="cuda", dtype=torch.float16)
        w = tessera.BatchPrefillWithPagedKVCacheWrapper(workspace(torch), backend="fa2" if kind == "prefill-fa2" else "auto")
        w.plan(qo, indptr, indices, last, HQ, HKV, HEAD_DIM, 16, causal=True)
    want = w.run(q, (k, v), enable_pdl=False)
    assert torch.equal(w.run(q, (k, v), enable_pdl=True), want)
    k2, v2 = k.clone(), v.clone()
    args = zero_last_tokens(torch, k2, v2, indptr, indices, last, 16)
    kz, vz = k2.clone(), v2.clone()
    for pdl in (True, None, True):
        k2.copy_(kz)
        v2.copy_(vz)
        tessera.append_paged_kv_cache(*args)
        got = w.run(q, (k2, v2), enable_pdl=pdl)
        torch.cuda.synchronize()
        assert torch.equal(got, want)


def test_enable_pdl_ragged_prefill(torch_cuda):
    torch = torch_cuda
    qo = np.array([0, 5, 70, 71], dtype=np.int32)
    kv = np.array([0, 40, 200, 201], dtype=np.int32)
    q = torch.randn(71, HQ, HEAD_DIM, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(201, HKV, HEAD_DIM, device="cuda", dtype=torch.bfloat16)
    v = torch.randn_like(k)
    w = tessera.BatchPrefillWithRaggedKVCacheWrapper(workspace(torch))
    w.plan(qo, kv, HQ, HKV, HEAD_DIM, causal=True, q_data_type=torch.bfloat16)
    want = w.run(q, k, v, enable_pdl=False)
    assert torch.equal(w.run(q, k * 1, v, enable_pdl=True), want)  # k * 1: written by the kernel just before
    assert torch.equal(w.run(q, k * 1, v), want)


@pytest.mark.parametrize("pdl", [True, None])
def test_enable_pdl_mla(torch_cuda, pdl):
    torch = torch_cuda
    page, lens = 16, [1, 300, 75]
    pages = [(n + page - 1) // page for n in lens]
    kv_indptr = np.concatenate([[0], np.cumsum(pages)]).astype(np.int32)
    kv_indices = np.random.default_rng(3).permutation(int(kv_indptr[-1])).astype(np.int32)
    ckv = torch.randn(int(kv_indptr[-1]), page, 512, device="cuda", dtype=torch.bfloat16)
    kpe = torch.randn(int(kv_indptr[-1]), page, 64, device="cuda", dtype=torch.bfloat16)
    q_nope = torch.randn(len(lens), 16, 512, device="cuda", dtype=torch.bfloat16)
    q_pe = torch.randn(len(lens), 16, 64, device="cuda", dtype=torch.bfloat16)
    qo = np.arange(len(lens) + 1, dtype=np.int32)
    lens = np.array(lens, dtype=np.int32)

    def planned(enable_pdl):
        w = tessera.mla.BatchMLAPagedAttentionWrapper(workspace(torch))
        w.plan(qo_indptr=qo, kv_indptr=kv_indptr, kv_indices=kv_indices, kv_len_arr=lens, num_heads=16,
               head_dim_ckv=512, head_dim_kpe=64, page_size=page, causal=False, sm_scale=0.07,
               q_data_type=torch.bfloat16, kv_data_type=torch.bfloat16, enable_pdl=enable_pdl)
        return w

    want = planned(False).run(q_nope, q_pe, ckv, kpe)
    w = planned(pdl)
    for _ in range(3):
        got = w.run(q_nope, q_pe, ckv * 1, kpe * 1)  # the caches written by the kernels just before
        torch.cuda.synchronize()
        assert torch.equal(got, want)


def test_enable_pdl_defaults_on_as_flashinfer():
    from tessera import _wrapper_util as W
    assert W.pdl_arg(None) is True
    assert W.pdl_arg(False) is False and W.pdl_arg(True) is True
