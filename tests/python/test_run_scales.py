"""FlashInfer's run() scales on 16-bit caches (vLLM passes k_scale / v_scale
to every decode and prefill run, 1.0 unless the cache is quantized): q_scale
* k_scale multiplies the softmax scale and v_scale the output (in the
kernels' epilogue). GPU tests
("skipped: no GPU" without torch + CUDA): the scaled run equals the run
with the folded softmax scale, times v_scale; scales of 1 change nothing."""

import numpy as np
import pytest

import tessera
from conftest import rel_error, to_np
from prefill_reference import HKV, indptr_of, make_table, random_cache, uniform, workspace

D = 128


def check_scaled(run, q_scale, k_scale, v_scale, sm_scale, tol):
    """run(**scales) against run(sm_scale=...) * v_scale (the output's rounding apart), and scales of 1
    against no scales, bit for bit."""
    base = run(sm_scale=None)
    assert run(q_scale=1.0, k_scale=1.0, v_scale=1.0).equal(base)
    got = to_np(run(q_scale=q_scale, k_scale=k_scale, v_scale=v_scale)).astype(np.float64)
    want = to_np(run(sm_scale=sm_scale)).astype(np.float64) * v_scale
    assert rel_error(got, want) < tol
    assert rel_error(got, to_np(base).astype(np.float64) * v_scale) > 1e-2  # the softmax scale did change


@pytest.mark.parametrize("use_tensor_cores", [False, True])
def test_batch_decode_scales(torch_cuda, rng, use_tensor_cores):
    torch = torch_cuda
    lens = [5, 300, 1000]
    table = make_table(rng, lens, 16)
    cache, _, _ = random_cache(torch, rng, "NHD", table[3], 16, D, torch.float16, False)
    q = uniform(torch, rng, (len(lens), 4 * HKV, D), torch.float16, -2.0, 2.0)
    w = tessera.BatchDecodeWithPagedKVCacheWrapper(workspace(torch), use_tensor_cores=use_tensor_cores)
    w._cuda_cores = not use_tensor_cores

    def run(sm_scale=None, **scales):
        w.plan(*(torch.from_numpy(x) for x in table[:3]), 4 * HKV, HKV, D, 16, q_data_type=torch.float16,
               sm_scale=sm_scale)
        return w.run(q, cache, **scales)

    check_scaled(run, 0.5, 4.0, 3.0, 2.0 / np.sqrt(D), 2e-3)


@pytest.mark.parametrize("kind", ["paged", "ragged"])
def test_batch_prefill_scales(torch_cuda, rng, kind):
    torch = torch_cuda
    q_lens, kv_lens = [7, 64, 130], [7, 200, 400]
    qo = indptr_of(q_lens)
    q = uniform(torch, rng, (int(qo[-1]), 4 * HKV, D), torch.bfloat16, -2.0, 2.0)
    if kind == "paged":
        table = make_table(rng, kv_lens, 16)
        cache, _, _ = random_cache(torch, rng, "NHD", table[3], 16, D, torch.bfloat16, False)
        w = tessera.BatchPrefillWithPagedKVCacheWrapper(workspace(torch))

        def run(sm_scale=None, **scales):
            w.plan(qo, *table[:3], 4 * HKV, HKV, D, 16, causal=True, q_data_type=torch.bfloat16, sm_scale=sm_scale)
            return w.run(q, cache, **scales)
    else:
        kvi = indptr_of(kv_lens)
        k, v = (uniform(torch, rng, (int(kvi[-1]), HKV, D), torch.bfloat16) for _ in range(2))
        w = tessera.BatchPrefillWithRaggedKVCacheWrapper(workspace(torch))

        def run(sm_scale=None, **scales):
            w.plan(qo, kvi, 4 * HKV, HKV, D, causal=True, q_data_type=torch.bfloat16, sm_scale=sm_scale)
            return w.run(q, k, v, **scales)

    check_scaled(run, 2.0, 0.75, 0.5, 1.5 / np.sqrt(D), 1e-2)


def test_single_decode_scales(torch_cuda, rng):
    """The row-wise kernel's epilogue: a negative v_scale too (any finite value)."""
    torch = torch_cuda
    k, v = (uniform(torch, rng, (700, HKV, D), torch.float16) for _ in range(2))
    q = uniform(torch, rng, (4 * HKV, D), torch.float16, -2.0, 2.0)

    def run(sm_scale=None, **scales):
        return tessera.single_decode_with_kv_cache(q, k, v, sm_scale=sm_scale, **scales)

    check_scaled(run, 0.5, 4.0, -3.0, 2.0 / np.sqrt(D), 2e-3)
