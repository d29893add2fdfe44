"""8-row query tiles of the FA2 template on 16-bit caches (the keys as the mma's rows: S^T = K Q^T, O^T = V^T
P^T), through the prefill wrapper (wrapper._cta_q = 8) and tensor-core decode (wrapper._tc_cta_q = 8): the
float64 reference, outputs poisoned with NaN first, pages shuffled, bitwise re-runs. GPU only ("skipped: no
GPU" without torch + CUDA); fp8 caches on these tiles are in test_fp8_prefill.py."""

import numpy as np
import pytest

import tessera
from conftest import to_np
from prefill_reference import HKV, check, gather_pages, indptr_of, make_table, ref_batch, uniform, workspace

LENS = [(0, 10), (5, 0), (1, 300), (37, 37), (100, 190), (64, 577), (9, 3)]  # (q_len, kv_len)


@pytest.mark.parametrize("head_dim, group, page_size, tile, causal", [
    (128, 4, 16, None, True), (128, 8, 1, None, False), (64, 1, 16, None, True), (256, 2, 16, None, True),
    (128, 4, 16, (128, 0, 0, 2), True), (64, 8, 1, (32, 0, 2, 3), False)])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_eight_row_tiles_16bit(torch_cuda, rng, poison, head_dim, group, page_size, tile, causal, dtype):
    torch = torch_cuda
    hq, t = HKV * group, getattr(torch_cuda, dtype)
    q_lens, kv_lens = zip(*LENS)
    table = make_table(rng, kv_lens, page_size)
    k = uniform(torch, rng, (table[3], page_size, HKV, head_dim), t, -3.0, 3.0)
    v = uniform(torch, rng, (table[3], page_size, HKV, head_dim), t, -3.0, 3.0)
    qo = indptr_of(q_lens)
    q = uniform(torch, rng, (int(qo[-1]), hq, head_dim), t, -2.0, 2.0)
    w = tessera.BatchPrefillWithPagedKVCacheWrapper(workspace(torch), "NHD", backend="auto")
    w._cta_q = 8
    if tile is not None:
        w._tile = tile
    w.plan(qo, *table[:3], hq, HKV, head_dim, page_size, causal=causal, q_data_type=t)
    o, lse = w.run(q, (k, v), return_lse=True)
    assert w._native.cta_q == 8
    kn, vn = to_np(k), to_np(v)
    ref_o, ref_lse = ref_batch(to_np(q), qo, lambda i: gather_pages(kn, vn, "NHD", table, page_size, i), causal,
                               sm_scale=1 / np.sqrt(head_dim))
    check(o, lse, ref_o, ref_lse, dtype)
    o2, lse2 = w.run(q, (k, v), return_lse=True)
    assert torch.equal(o, o2) and torch.equal(lse, lse2)


@pytest.mark.parametrize("group", [1, 4, 8])
def test_eight_row_tiles_16bit_decode(torch_cuda, rng, poison, group):
    torch = torch_cuda
    head_dim, hq, page_size = 128, HKV * group, 16
    kv_lens = [0, 1, 7, 300, 2900, 33, 129, 16]
    table = make_table(rng, kv_lens, page_size)
    k = uniform(torch, rng, (table[3], HKV, page_size, head_dim), torch.float16, -3.0, 3.0)
    v = uniform(torch, rng, (table[3], HKV, page_size, head_dim), torch.float16, -3.0, 3.0)
    q = uniform(torch, rng, (len(kv_lens), hq, head_dim), torch.float16, -2.0, 2.0)
    w = tessera.BatchDecodeWithPagedKVCacheWrapper(workspace(torch), "HND", use_tensor_cores=True)
    w._tc_cta_q = 8
    w.plan(*table[:3], hq, HKV, head_dim, page_size, q_data_type=torch.float16)
    o, lse = w.run(q, (k, v), return_lse=True)
    kn, vn = to_np(k), to_np(v)
    ref_o, ref_lse = ref_batch(to_np(q), np.arange(len(kv_lens) + 1),
                               lambda i: gather_pages(kn, vn, "HND", table, page_size, i), False,
                               sm_scale=1 / np.sqrt(head_dim))
    check(o, lse, ref_o, ref_lse, "float16")
