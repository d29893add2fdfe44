"""Attention sinks (FlashInfer's run(sinks=...), as gpt-oss uses them): a
virtual key per query head whose logit is sinks[h] (natural units, not scaled
by sm_scale) and whose value is zero joins every row's softmax. Checked
against a float64 softmax over the keys plus that virtual key, for decode
(both kernels) and causal paged prefill, fp16 and bf16, empty requests
included; outputs start as NaN. GPU tests skip with "skipped: no GPU"."""

import numpy as np
import pytest

import tessera
from conftest import TOL, rel_error, to_np

HQ, HKV, D, PAGE = 8, 2, 128, 16


def ref_rows(q_rows, k, v, sinks, scale, causal_offset=None):
    """float64 (o [rows, Hq, D], lse2 [rows, Hq]) of q_rows [rows, Hq, D] over k, v [L, Hkv, D] plus the sink key;
    causal_offset: row r sees keys j <= causal_offset + r (None: all)."""
    rows, group = q_rows.shape[0], HQ // HKV
    o, lse = np.zeros((rows, HQ, D)), np.zeros((rows, HQ))
    for r in range(rows):
        n = k.shape[0] if causal_offset is None else min(k.shape[0], causal_offset + r + 1)
        for h in range(HQ):
            logits = np.concatenate([k[:n, h // group] @ q_rows[r, h] * scale, [sinks[h]]])
            mx = logits.max()
            p = np.exp(logits - mx)
            o[r, h] = p[:-1] @ v[:n, h // group] / p.sum()
            lse[r, h] = (mx + np.log(p.sum())) / np.log(2.0)
    return o, lse


def paged(torch, rng, lens, dtype):
    pages = [(n + PAGE - 1) // PAGE for n in lens]
    indptr = np.concatenate([[0], np.cumsum(pages)]).astype(np.int32)
    total = int(indptr[-1]) + 2
    indices = rng.permutation(total)[: indptr[-1]].astype(np.int32)
    last = np.array([n - (p - 1) * PAGE if p else 0 for n, p in zip(lens, pages)], dtype=np.int32)
    k = torch.from_numpy(rng.standard_normal((total, PAGE, HKV, D)).astype(np.float32)).cuda().to(dtype)
    v = torch.from_numpy(rng.standard_normal((total, PAGE, HKV, D)).astype(np.float32)).cuda().to(dtype)
    kv_of = [(to_np(k)[indices[indptr[i]:indptr[i + 1]]].reshape(-1, HKV, D)[:n],
              to_np(v)[indices[indptr[i]:indptr[i + 1]]].reshape(-1, HKV, D)[:n]) for i, n in enumerate(lens)]
    return (k, v), indptr, indices, last, kv_of


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("kernel", ["picked", "cuda_cores"])
def test_decode_sinks_gpu(torch_cuda, rng, dtype, kernel):
    torch = torch_cuda
    tdt = getattr(torch, dtype)
    lens = [0, 1, 300, 2100, 17]
    cache, indptr, indices, last, kv_of = paged(torch, rng, lens, tdt)
    q = torch.from_numpy(rng.standard_normal((len(lens), HQ, D)).astype(np.float32) * 2).cuda().to(tdt)
    sinks = torch.from_numpy(rng.standard_normal(HQ).astype(np.float32) * 3).cuda()
    w = tessera.BatchDecodeWithPagedKVCacheWrapper(torch.empty(64 << 20, dtype=torch.uint8, device="cuda"))
    w._cuda_cores = kernel == "cuda_cores"
    w.plan(indptr, indices, last, HQ, HKV, D, PAGE, q_data_type=tdt)
    out = torch.full_like(q, float("nan"))
    o, lse = w.run(q, cache, out=out, return_lse=True, sinks=sinks)
    torch.cuda.synchronize()
    for i, (k, v) in enumerate(kv_of):
        ref_o, ref_lse = ref_rows(to_np(q)[i:i + 1].astype(np.float64), k, v, to_np(sinks), 1 / np.sqrt(D))
        assert rel_error(to_np(o)[i:i + 1], ref_o) < TOL[dtype], f"request {i}"
        np.testing.assert_allclose(to_np(lse)[i], ref_lse[0], atol=2e-3, rtol=0)
    plain = w.run(q, cache)  # the sinks change the result (and are not left behind)
    assert rel_error(to_np(plain), to_np(o)) > 1e-2
    again = w.run(q, cache, sinks=sinks)
    assert torch.equal(again, o)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_prefill_sinks_gpu(torch_cuda, rng, dtype):
    torch = torch_cuda
    tdt = getattr(torch, dtype)
    q_lens, kv_lens = [5, 64, 0], [40, 200, 10]
    cache, indptr, indices, last, kv_of = paged(torch, rng, kv_lens, tdt)
    qo = np.concatenate([[0], np.cumsum(q_lens)]).astype(np.int32)
    q = torch.from_numpy(rng.standard_normal((int(qo[-1]), HQ, D)).astype(np.float32)).cuda().to(tdt)
    sinks = torch.from_numpy(rng.standard_normal(HQ).astype(np.float32) * 3).cuda()
    w = tessera.BatchPrefillWithPagedKVCacheWrapper(torch.empty(64 << 20, dtype=torch.uint8, device="cuda"))
    w.plan(qo, indptr, indices, last, HQ, HKV, D, PAGE, causal=True, q_data_type=tdt)
    out = torch.full_like(q, float("nan"))
    w.run(q, cache, out=out, sinks=sinks)
    torch.cuda.synchronize()
    for i, (k, v) in enumerate(kv_of):
        rows = slice(qo[i], qo[i + 1])
        if q_lens[i] == 0:
            continue
        ref_o, _ = ref_rows(to_np(q)[rows].astype(np.float64), k, v, to_np(sinks), 1 / np.sqrt(D),
                            causal_offset=kv_lens[i] - q_lens[i])
        assert rel_error(to_np(out)[rows], ref_o) < TOL[dtype], f"request {i}"


def test_sinks_bad_input_gpu(torch_cuda, rng):
    torch = torch_cuda
    cache, indptr, indices, last, _ = paged(torch, rng, [10, 20], torch.float16)
    q = torch.randn(2, HQ, D, dtype=torch.float16, device="cuda")
    w = tessera.BatchDecodeWithPagedKVCacheWrapper(torch.empty(64 << 20, dtype=torch.uint8, device="cuda"))
    w.plan(indptr, indices, last, HQ, HKV, D, PAGE, q_data_type=torch.float16)
    with pytest.raises(ValueError, match="^sinks"):
        w.run(q, cache, sinks=torch.zeros(HQ + 1, device="cuda"))
    with pytest.raises(TypeError, match="^sinks"):
        w.run(q, cache, sinks=torch.zeros(HQ, dtype=torch.int32, device="cuda"))
    with pytest.raises(TypeError, match="^sinks"):
        w.run(q, cache, sinks=np.zeros(HQ, np.float32))
