"""Decode with q_len_per_req > 1 (speculative / MTP verification, FlashInfer's
plan(q_len_per_req=n)): request b's n queries are rows [b * n, (b + 1) * n) of
q, its last n positions, attending causally (bottom-right aligned) unless
is_causal=False. Checked against a float64 softmax; also the error for a
run() whose q_len_per_req differs from the plan's, and a plan that goes back
to one query per request. GPU tests skip with "skipped: no GPU"."""

import numpy as np
import pytest

import tessera
from conftest import TOL, rel_error, to_np
from test_sinks import D, HKV, HQ, PAGE, paged, ref_rows

NO_SINK = np.full(HQ, -np.inf)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("n, causal", [(2, None), (3, True), (4, False)])
def test_decode_q_len_per_req_gpu(torch_cuda, rng, dtype, n, causal):
    torch = torch_cuda
    tdt = getattr(torch, dtype)
    lens = [n, 7, 300, 1500]
    cache, indptr, indices, last, kv_of = paged(torch, rng, lens, tdt)
    q = torch.from_numpy(rng.standard_normal((len(lens) * n, HQ, D)).astype(np.float32)).cuda().to(tdt)
    w = tessera.BatchDecodeWithPagedKVCacheWrapper(torch.empty(64 << 20, dtype=torch.uint8, device="cuda"))
    w.plan(indptr, indices, last, HQ, HKV, D, PAGE, q_data_type=tdt, q_len_per_req=n, is_causal=causal)
    out = torch.full_like(q, float("nan"))
    w.run(q, cache, out=out, q_len_per_req=n)
    torch.cuda.synchronize()
    for i, (k, v) in enumerate(kv_of):
        rows = slice(i * n, (i + 1) * n)
        offset = None if causal is False else lens[i] - n
        ref_o, _ = ref_rows(to_np(q)[rows].astype(np.float64), k, v, NO_SINK, 1 / np.sqrt(D), causal_offset=offset)
        assert rel_error(to_np(out)[rows], ref_o) < TOL[dtype], f"request {i}"
    with pytest.raises(ValueError, match="^q_len_per_req"):
        w.run(q, cache, q_len_per_req=1)
    # Back to one query per request: the decode kernels again.
    w.plan(indptr, indices, last, HQ, HKV, D, PAGE, q_data_type=tdt)
    q1 = q[::n].contiguous()
    o1 = w.run(q1, cache)
    torch.cuda.synchronize()
    ref_o, _ = ref_rows(to_np(q1)[3:4].astype(np.float64), *kv_of[3], NO_SINK, 1 / np.sqrt(D))
    assert rel_error(to_np(o1)[3:4], ref_o) < TOL[dtype]
