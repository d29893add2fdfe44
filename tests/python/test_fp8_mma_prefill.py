"""fp8 tensor cores for fp8 KV caches on the Hopper prefill kernel (C++ PrefillOptions::fp8_mma, Python
wrapper._fp8_mma = True): the kernel splits q into two e4m3 terms (one scale per 16 rows of a query tile)
and rounds the softmax weights P to e4m3, and both GEMMs run on fp8 tensor cores with K and V read as the
cache stores them. The results are checked against the float64 reference on the dequantized cache within
the option's own bound (FP8_MMA_TOL: rounding q and P is the option's error, docs/performance.md states it), next to
the default path on the same inputs; outputs poisoned first, pages shuffled, NaN fails; bitwise re-runs;
a CUDA graph replayed with new scale tensors.

GPU (sm_90, "skipped" elsewhere): dtypes x page sizes x layouts x causal, ragged KV, long rows, the built-in
variants that leave K / V as they are (window, soft cap, ALiBi, custom mask). CPU: the
refusals that need no GPU.
"""

import numpy as np
import pytest

import tessera
from conftest import rel_error, to_np
from prefill_reference import HKV, gather_pages, indptr_of, make_table, uniform, workspace
from test_fp8_prefill import (KS, LENS, VS, fp8_pages, fp8_values, graph_replays_new_scale_tensors, reference,
                              run_variant)

# max |o - ref| / max |ref| of the fp8 tensor-core path, and the LSE's absolute error (base 2), against
# the dequantized float64 reference: P's rounding to e4m3 (q keeps about 7 significant bits).
FP8_MMA_TOL, FP8_MMA_LSE_TOL = 4e-2, 2e-2


def hopper(torch):
    if torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("fp8 tensor cores run on the Hopper kernel (sm_90)")


def check_mma(o, lse, ref_o, ref_lse):
    """The option's bound; -inf LSE exactly where the reference has it. Returns (o error, lse error)."""
    got = to_np(o)
    assert not np.isnan(got).any(), "NaN in output"
    err = rel_error(got, ref_o)
    assert err < FP8_MMA_TOL, f"error {err}"
    lerr = 0.0
    if lse is not None:
        got = to_np(lse)
        assert not np.isnan(got).any(), "NaN in lse"
        np.testing.assert_array_equal(np.isneginf(got), np.isneginf(ref_lse))
        fin = np.isfinite(ref_lse)
        if fin.any():
            lerr = float(np.abs(got[fin] - ref_lse[fin]).max())
            assert lerr < FP8_MMA_LSE_TOL, f"lse error {lerr}"
    return err, lerr


def paged(torch, mma, layout="NHD", **kw):
    w = tessera.BatchPrefillWithPagedKVCacheWrapper(workspace(torch), kv_layout=layout, **kw)
    w._fp8_mma = mma
    return w


CASES = [  # q dtype, kv dtype, group, page_size, layout, interleaved, causal
    ("float16", "float8_e4m3fn", 4, 16, "NHD", False, True),
    ("float16", "float8_e5m2", 4, 1, "HND", False, True),
    ("bfloat16", "float8_e4m3fn", 8, 16, "HND", True, False),
    ("bfloat16", "float8_e5m2", 1, 16, "NHD", False, True),
    ("float16", "float8_e4m3fn", 1, 1, "NHD", True, False),
]


@pytest.mark.parametrize("q_dtype, kv_dtype, group, page_size, layout, interleaved, causal", CASES)
def test_fp8_mma_paged_prefill(torch_cuda, rng, poison, q_dtype, kv_dtype, group, page_size, layout, interleaved,
                               causal):
    torch = torch_cuda
    hopper(torch)
    head_dim, hq = 128, HKV * group
    q_lens, kv_lens = zip(*LENS)
    table = make_table(rng, kv_lens, page_size)
    cache, k, v = fp8_pages(torch, rng, layout, table[3], page_size, head_dim, kv_dtype, interleaved)
    qo = indptr_of(q_lens)
    q = uniform(torch, rng, (int(qo[-1]), hq, head_dim), getattr(torch, q_dtype), -2.0, 2.0)
    kn, vn = to_np(k), to_np(v)
    ref_o, ref_lse = reference(q, qo, lambda i: gather_pages(kn, vn, layout, table, page_size, i), causal, head_dim)
    outs = []
    for mma in (False, True):
        w = paged(torch, mma, layout)
        w.plan(qo, *table[:3], hq, HKV, head_dim, page_size, causal=causal, q_data_type=getattr(torch, q_dtype),
               kv_data_type=getattr(torch, kv_dtype))
        outs.append(w.run(q, cache, k_scale=KS, v_scale=VS, return_lse=True))
        assert outs[-1][0].dtype == q.dtype and outs[-1][0].shape == q.shape
    assert not torch.equal(outs[0][0], outs[1][0])  # the option ran another kernel
    err, lerr = check_mma(*outs[1], ref_o, ref_lse)
    print(f"fp8_mma {q_dtype}/{kv_dtype} group {group}: o {err:.2e}, lse {lerr:.2e}; "
          f"default {rel_error(to_np(outs[0][0]), ref_o):.2e}")


@pytest.mark.parametrize("kv_dtype", ["float8_e4m3fn", "float8_e5m2"])
def test_fp8_mma_ragged_long_rows(torch_cuda, rng, poison, kv_dtype):
    """Ragged KV and rows of up to 6000 keys: many small softmax weights (P is scaled by 2^8 before its
    e4m3 rounding, so they keep their bits)."""
    torch = torch_cuda
    hopper(torch)
    head_dim, hq = 128, HKV * 4
    q_lens, kv_lens = [1, 200, 37, 130], [6000, 4000, 37, 2500]
    qo, kv = indptr_of(q_lens), indptr_of(kv_lens)
    q = uniform(torch, rng, (int(qo[-1]), hq, head_dim), torch.float16, -2.0, 2.0)
    k, v = (fp8_values(torch, rng, (int(kv[-1]), HKV, head_dim), kv_dtype) for _ in range(2))
    w = tessera.BatchPrefillWithRaggedKVCacheWrapper(workspace(torch))
    w._fp8_mma = True
    w.plan(qo, kv, hq, HKV, head_dim, causal=True, q_data_type=torch.float16, kv_data_type=kv_dtype)
    o, lse = w.run(q, k, v, k_scale=KS, v_scale=VS, return_lse=True)
    kn, vn = to_np(k), to_np(v)
    ref_o, ref_lse = reference(q, qo, lambda i: (kn[kv[i]:kv[i + 1]], vn[kv[i]:kv[i + 1]]), True, head_dim)
    err, lerr = check_mma(o, lse, ref_o, ref_lse)
    print(f"fp8_mma ragged {kv_dtype}: o {err:.2e}, lse {lerr:.2e}")
    assert torch.equal(o, w.run(q, k, v, k_scale=KS, v_scale=VS))  # deterministic


@pytest.mark.parametrize("variant", ["window", "soft_cap", "alibi", "custom_mask"])
def test_fp8_mma_prefill_variants(torch_cuda, rng, poison, variant):
    """The built-in variants that leave K / V rows as they are, on fp8 tensor cores: their functors see the
    logits with q's scale folded in."""
    hopper(torch_cuda)
    run_variant(torch_cuda, rng, variant, lambda o, lse, ref_o, ref_lse: check_mma(o, lse, ref_o, ref_lse),
                fp8_mma=True)


def test_fp8_mma_cuda_graph_replays_new_scale_tensors(torch_cuda, rng):
    hopper(torch_cuda)
    graph_replays_new_scale_tensors(torch_cuda, rng, lambda out, ref_o: check_mma(out, None, ref_o, None),
                                    fp8_mma=True)


def test_fp8_mma_refused_on_fa2_gpu(torch_cuda, rng):
    torch = torch_cuda
    table = make_table(rng, [40, 3], 16)
    w = paged(torch, True, backend="fa2")
    with pytest.raises(ValueError, match="fp8_mma"):
        w.plan([0, 1, 2], *table[:3], 4, HKV, 128, 16, q_data_type=torch.float16, kv_data_type=torch.float8_e4m3fn)


# ======================================================================= CPU
def test_fp8_mma_plan_checks_without_gpu():
    args = ([0, 1, 2], [0, 1, 3], [0, 2, 1], [5, 16], 8, HKV)

    def wrapper():
        w = tessera.BatchPrefillWithPagedKVCacheWrapper(np.zeros(1024, dtype=np.uint8))
        w._fp8_mma = True
        return w
    with pytest.raises(ValueError, match="fp8_mma.*kv_dtype"):  # a 16-bit cache
        wrapper().plan(*args, 128, 16, q_data_type="float16")
    with pytest.raises(ValueError, match="fp8_mma.*head_dim 128"):
        wrapper().plan(*args, 64, 16, kv_data_type="float8_e4m3fn")
    with pytest.raises(ValueError, match="fp8_mma.*KeyTransform"):  # fused RoPE rotates K in shared memory
        wrapper().plan(*args, 128, 16, kv_data_type="float8_e4m3fn", pos_encoding_mode="ROPE_LLAMA")
    # A valid fp8_mma plan passes the checks; the host workspace is what it refuses.
    with pytest.raises(TypeError, match="float_workspace_buffer"):
        wrapper().plan(*args, 128, 16, kv_data_type="float8_e5m2")
