"""Head dims beyond 64 / 128 / 256 on the GPU ("skipped: no GPU" without
torch + CUDA): head_dim_qk 192 with head_dim_vo 128 (DeepSeek-style prefill,
FlashInfer's plan(head_dim_qk=192, head_dim_vo=128)) on the ragged and paged
wrappers and single_prefill, and head dim 512 (Gemma 3) on batch decode
(use_tensor_cores False and True: both run the tensor-core path), single
decode, paged / ragged batch prefill and single prefill. Outputs are
poisoned with NaN first and compared with the float64 reference
(prefill_reference.py; rel. error below 1e-3 for fp16, 1e-2 for bf16); a
second run must repeat the bits. The CPU checks of the same shapes are in
test_head_dims_cpu.py.
"""

import numpy as np
import pytest

import tessera
from conftest import TOL, ref_decode, rel_error, to_np
from prefill_reference import (HKV, check, gather_pages, indptr_of, make_table, random_cache, ref_batch, ref_request,
                               run_batch, uniform, workspace)

# (q_len, kv_len): no keys, one query over a prime length, chunked prefill, q_len > kv_len, a long KV that the
# planner splits over CTAs (split-KV merge).
LENS = [(5, 0), (1, 97), (100, 190), (9, 3), (40, 4099)]


# ======================================================================= 192 / 128 batch prefill
MLA_CASES = [  # source, dtype, group, causal
    ("ragged", "float16", 1, True), ("ragged", "bfloat16", 4, False), ("ragged", "float16", 8, False),
    ("paged", "float16", 4, True), ("paged", "bfloat16", 1, True), ("paged", "bfloat16", 8, False),
]


@pytest.mark.parametrize("source, dtype, group, causal", MLA_CASES)
def test_head_dim_qk_192_vo_128(torch_cuda, rng, poison, source, dtype, group, causal):
    """q, k [.., 192], v, out [.., 128]; default sm_scale 1 / sqrt(192); GQA; a long request splits its KV."""
    torch = torch_cuda
    tdt = getattr(torch, dtype)
    hq = HKV * group
    q_lens, kv_lens = zip(*LENS)
    qo = indptr_of(q_lens)
    q = uniform(torch, rng, (int(qo[-1]), hq, 192), tdt, -2.0, 2.0)
    page_size = 16 if source == "paged" else 0
    state = rng.bit_generator.state

    def run():
        rng.bit_generator.state = state  # the same KV both times
        return run_batch(torch, rng, q, qo, kv_lens, hq, 192, tdt, page_size, dict(causal=causal), head_dim_vo=128)

    o, lse, kv_of = run()
    torch.cuda.synchronize()
    assert o.shape == (q.shape[0], hq, 128) and o.dtype == tdt
    ref_o, ref_lse = ref_batch(to_np(q), qo, kv_of, causal)
    check(o, lse, ref_o, ref_lse, dtype)
    o2, lse2, _ = run()
    torch.cuda.synchronize()
    assert torch.equal(o, o2) and torch.equal(lse, lse2)


def test_head_dim_192_128_out_and_fa3(torch_cuda, rng):
    """A caller's out must have v's head dim; backend='fa3' names head_dim (on sm_90; elsewhere the GPU)."""
    torch = torch_cuda
    qo, kv = indptr_of([7, 20]), indptr_of([30, 64])
    q = uniform(torch, rng, (int(qo[-1]), 8, 192), torch.float16)
    k = uniform(torch, rng, (int(kv[-1]), HKV, 192), torch.float16)
    v = uniform(torch, rng, (int(kv[-1]), HKV, 128), torch.float16)
    w = tessera.BatchPrefillWithRaggedKVCacheWrapper(workspace(torch))
    w.plan(qo, kv, 8, HKV, 192, head_dim_vo=128, causal=True)
    with pytest.raises(ValueError, match="^o:"):
        w.run(q, k, v, out=torch.empty_like(q))
    with pytest.raises(ValueError, match="^v:"):
        w.run(q, k, k)
    out = torch.full((q.shape[0], 8, 128), float("nan"), dtype=torch.float16, device="cuda")
    assert w.run(q, k, v, out=out) is out
    ref_o, _ = ref_batch(to_np(q), qo, lambda i: (to_np(k)[kv[i]: kv[i + 1]], to_np(v)[kv[i]: kv[i + 1]]), True)
    assert rel_error(to_np(out), ref_o) < TOL["float16"]
    fa3 = tessera.BatchPrefillWithRaggedKVCacheWrapper(workspace(torch), backend="fa3")
    with pytest.raises(ValueError, match="head_dim|sm_90"):
        fa3.plan(qo, kv, 8, HKV, 192, head_dim_vo=128)


def test_single_prefill_192_128(torch_cuda, rng, poison):
    torch = torch_cuda
    q = uniform(torch, rng, (33, 8, 192), torch.bfloat16, -2.0, 2.0)
    k = uniform(torch, rng, (301, HKV, 192), torch.bfloat16)
    v = uniform(torch, rng, (301, HKV, 128), torch.bfloat16)
    o, lse = tessera.single_prefill_with_kv_cache(q, k, v, causal=True, return_lse=True)
    torch.cuda.synchronize()
    assert o.shape == (33, 8, 128)
    ref_o, ref_lse = ref_request(to_np(q), to_np(k), to_np(v), True)
    check(o, lse, ref_o, ref_lse, "bfloat16")


# ======================================================================= head dim 512: batch decode
DECODE_CASES = [  # dtype, page_size, use_tensor_cores, layout
    ("float16", 16, False, "NHD"), ("float16", 1, True, "NHD"), ("bfloat16", 1, False, "HND"),
    ("bfloat16", 16, True, "HND"),
]


@pytest.mark.parametrize("dtype, page_size, use_tensor_cores, layout", DECODE_CASES)
def test_decode_head_dim_512(torch_cuda, rng, poison, dtype, page_size, use_tensor_cores, layout):
    """Lengths 1, a prime and a long one (split over CTAs); either flag runs the tensor-core path."""
    torch = torch_cuda
    tdt = getattr(torch, dtype)
    lens = [1, 97, 2500, 0, 33]
    hq = HKV * 4
    table = make_table(rng, lens, page_size)
    cache, k, v = random_cache(torch, rng, layout, table[3], page_size, 512, tdt, False)
    q = uniform(torch, rng, (len(lens), hq, 512), tdt, -2.0, 2.0)
    w = tessera.BatchDecodeWithPagedKVCacheWrapper(workspace(torch), kv_layout=layout,
                                                   use_tensor_cores=use_tensor_cores)
    w.plan(table[0], table[1], table[2], hq, HKV, 512, page_size, q_data_type=tdt)
    o, lse = w.run(q, cache, return_lse=True)
    torch.cuda.synchronize()
    kn, vn = to_np(k), to_np(v)
    ref_o, ref_lse = ref_batch(to_np(q), indptr_of([1] * len(lens)),
                               lambda i: gather_pages(kn, vn, layout, table, page_size, i), False)
    check(o, lse, ref_o, ref_lse, dtype)
    o2, lse2 = w.run(q, cache, return_lse=True)
    torch.cuda.synchronize()
    assert torch.equal(o, o2)


@pytest.mark.parametrize("dtype, layout, window_left, logits_soft_cap", [
    ("float16", "NHD", -1, None), ("bfloat16", "HND", 40, 30.0)])
def test_single_decode_head_dim_512(torch_cuda, rng, poison, dtype, layout, window_left, logits_soft_cap):
    torch = torch_cuda
    tdt = getattr(torch, dtype)
    shape = (1031, HKV, 512) if layout == "NHD" else (HKV, 1031, 512)
    k, v = uniform(torch, rng, shape, tdt), uniform(torch, rng, shape, tdt)
    q = uniform(torch, rng, (8, 512), tdt, -2.0, 2.0)
    o, lse = tessera.single_decode_with_kv_cache(q, k, v, kv_layout=layout, window_left=window_left,
                                                 logits_soft_cap=logits_soft_cap, return_lse=True)
    torch.cuda.synchronize()
    ref_o, ref_lse = ref_decode(to_np(q), to_np(k), to_np(v), layout, window_left=window_left,
                                logits_soft_cap=logits_soft_cap or 0.0)
    assert rel_error(to_np(o), ref_o) < TOL[dtype]
    np.testing.assert_allclose(to_np(lse), ref_lse, atol=1e-2)


# ======================================================================= head dim 512: prefill
PREFILL_512_CASES = [  # source, dtype, group, causal, window_left, logits_soft_cap
    ("paged", "float16", 4, True, -1, None), ("paged", "bfloat16", 1, True, 64, 30.0),
    ("paged", "float16", 8, False, 100, None), ("ragged", "bfloat16", 4, True, -1, None),
    ("ragged", "float16", 1, False, -1, 20.0),
]


@pytest.mark.parametrize("source, dtype, group, causal, window_left, logits_soft_cap", PREFILL_512_CASES)
def test_prefill_head_dim_512(torch_cuda, rng, poison, source, dtype, group, causal, window_left, logits_soft_cap):
    torch = torch_cuda
    tdt = getattr(torch, dtype)
    hq = HKV * group
    q_lens, kv_lens = zip(*LENS)
    qo = indptr_of(q_lens)
    q = uniform(torch, rng, (int(qo[-1]), hq, 512), tdt, -2.0, 2.0)
    opts = dict(causal=causal, window_left=window_left, logits_soft_cap=logits_soft_cap)
    state = rng.bit_generator.state

    def run():
        rng.bit_generator.state = state
        return run_batch(torch, rng, q, qo, kv_lens, hq, 512, tdt, 16 if source == "paged" else 0, opts)

    o, lse, kv_of = run()
    torch.cuda.synchronize()
    ref_o, ref_lse = ref_batch(to_np(q), qo, kv_of, causal, window_left=window_left,
                               logits_soft_cap=logits_soft_cap or 0.0)
    check(o, lse, ref_o, ref_lse, dtype)
    o2, _, _ = run()
    torch.cuda.synchronize()
    assert torch.equal(o, o2)


@pytest.mark.parametrize("dtype, causal, window_left, logits_soft_cap", [
    ("float16", True, 50, 30.0), ("bfloat16", False, -1, None), ("float16", True, -1, None)])
def test_single_prefill_head_dim_512(torch_cuda, rng, poison, dtype, causal, window_left, logits_soft_cap):
    torch = torch_cuda
    tdt = getattr(torch, dtype)
    q = uniform(torch, rng, (77, 8, 512), tdt, -2.0, 2.0)
    k, v = (uniform(torch, rng, (333, HKV, 512), tdt) for _ in range(2))
    o, lse = tessera.single_prefill_with_kv_cache(q, k, v, causal=causal, window_left=window_left,
                                                  logits_soft_cap=logits_soft_cap, return_lse=True)
    torch.cuda.synchronize()
    ref_o, ref_lse = ref_request(to_np(q), to_np(k), to_np(v), causal, window_left=window_left,
                                 logits_soft_cap=logits_soft_cap or 0.0)
    check(o, lse, ref_o, ref_lse, dtype)
    fa3 = tessera.BatchPrefillWithRaggedKVCacheWrapper(workspace(torch), backend="fa3")
    with pytest.raises(ValueError, match="head_dim|sm_90"):
        fa3.plan([0, 77], [0, 333], 8, HKV, 512)
