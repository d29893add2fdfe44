"""Workspaces below the ideal size (FlashInfer callers allocate fixed
buffers, commonly 16 MB): the wrappers accept anything from the minimum
(min_workspace_size) up, give the split-KV partial states whatever fits and
split less KV. CPU tests: the size queries (16 MB is below the ideal on an
H100 and above the minimum) and the wrappers' choice of bounds
(_wrapper_util.fit_workspace) with its error, which BatchAttention parses.
GPU tests (skipped without one): the paged prefill and decode wrappers (both
decode kernels) on a 16 MB int8 buffer and on exactly the minimum, against
the float64 references, on long-KV batches that would split; one byte less
than the minimum is refused."""

import re

import pytest

import tessera
from tessera import _C
from tessera import _wrapper_util as W
from tessera.attention import _TOO_SMALL

MB = 1 << 20


# ======================================================================= CPU
def test_sixteen_megabytes_are_between_the_minimum_and_the_ideal():
    """On an H100 (132 SMs) the ideal prefill workspace of a one-request bound is over 32 MB of partial states."""
    def prefill(fn, batch, total_q, pages):
        return fn("float16", "float16", "float16", 128, 32, 8, 16, "NHD", True, batch, total_q, pages, num_sms=132)

    for bounds in [(1, 8, 1), (256, 8192, 65536)]:
        ideal = prefill(_C.BatchPrefill.workspace_size, *bounds)
        least = prefill(_C.BatchPrefill.min_workspace_size, *bounds)
        assert least[0] < 16 * MB < ideal[0], bounds
        assert least[1] == ideal[1]  # the pinned staging buffer does not shrink
    assert prefill(_C.BatchPrefill.workspace_size, 1, 8, 1)[0] > 32 * MB

    def decode(fn, **kw):
        return fn("float16", "float16", "float16", 128, 32, 8, 16, "NHD", 256, 65536, num_sms=132, **kw)

    for kw in [dict(use_tensor_cores=True), dict(cuda_cores=True), {}]:
        least, ideal = decode(_C.BatchDecode.min_workspace_size, **kw), decode(_C.BatchDecode.workspace_size, **kw)
        assert least[0] < min(16 * MB, ideal[0]), kw
        assert least[1] == ideal[1]

    cascade = ("float16", "float16", "float16", 128, 32, 8, 16, "NHD", 2, True, 8, 256, 64)
    least = _C.CascadeAttention.min_workspace_size(*cascade, num_sms=132)
    assert least[0] < _C.CascadeAttention.workspace_size(*cascade, num_sms=132)[0]

    spec = tessera.AttentionSpec(tessera.variants.standard(), head_dim=128)
    config = (spec.variant._tuple(), "float16", "float16", "float16", 128, 32, 8, 16, "NHD", 64, 4096, 8192)
    for kind in ("auto", "decode", "prefill"):
        least = _C.AttentionWrapper.min_workspace_size(*config, num_sms=132, kind=kind)
        assert least[0] < _C.AttentionWrapper.workspace_size(*config, num_sms=132, kind=kind)[0], kind


BOUNDS = (W.Bound("max_batch", "indptr", "batch size"), W.Bound("max_pages", "indices", "page count"))


def fake_size(ideal_per_unit, min_per_unit):
    """size(bounds) of a fake wrapper: bytes proportional to the bounds' sum."""
    return lambda w: (ideal_per_unit * sum(w), min_per_unit * sum(w), 7 * sum(w))


@pytest.mark.parametrize("have, expected", [
    (100 * 40, (20, 20)),  # the doubled bounds' ideal layout fits
    (100 * 30, (10, 10)),  # only the needed bounds' ideal does
    (10 * 40, (20, 20)),  # neither ideal: the doubled bounds' minimum (fewer partial rows)
    (10 * 20, (10, 10)),  # only the needed bounds' minimum
])
def test_fit_workspace_prefers_the_ideal_then_the_minimum(have, expected):
    want, host = W.fit_workspace((20, 20), (10, 10), have, fake_size(100, 10), BOUNDS)
    assert want == expected and host == 7 * sum(expected)


def test_fit_workspace_refuses_below_the_minimum_naming_it():
    size = fake_size(100, 10)
    assert W.fit_workspace((5, 5), (5, 5), 100, size, BOUNDS) == ((5, 5), 70)  # exactly the minimum
    with pytest.raises(ValueError) as e:
        W.fit_workspace((5, 5), (5, 5), 99, size, BOUNDS)
    msg = str(e.value)
    assert msg.startswith("float_workspace_buffer: expected at least 100 bytes for max_batch=5, max_pages=5, got 99")
    assert "1000 bytes hold every split-KV partial state" in msg
    m = _TOO_SMALL.match(msg)  # BatchAttention grows its own buffer to the number it reads here
    assert m is not None and int(m.group(1)) == 100
    with pytest.raises(ValueError, match="expected at least 200 bytes for max_batch=10, max_pages=10"):
        W.fit_workspace((20, 20), (10, 10), 150, size, BOUNDS)  # the needed bounds' minimum, not the doubled ones'


# ======================================================================= GPU
LONG_KV = [9000, 20000, 700]  # split over the CTAs with the ideal workspace
QO_LENS = [3, 17, 1]


def _minimum(make_wrapper, plan):
    """The minimum a wrapper's plan() asks for, read from its error on a tiny buffer."""
    with pytest.raises(ValueError) as e:
        plan(make_wrapper(4096))
    m = re.match(r"^float_workspace_buffer: expected at least (\d+) bytes", str(e.value))
    assert m is not None, str(e.value)
    return int(m.group(1))


def _check_workspace_sizes(torch, make, plan, run, check):
    """Plans and runs on 16 MB, on exactly the minimum and on a size between, each checked against the
    reference; one byte under the minimum is refused with the minimum in the message."""
    least = _minimum(make, plan)
    assert least < 16 * MB
    for nbytes in (16 * MB, least, least + (16 * MB - least) // 8):
        o, lse = run(plan(make(nbytes)))
        torch.cuda.synchronize()
        check(o, lse)
    with pytest.raises(ValueError, match=f"^float_workspace_buffer: expected at least {least} bytes"):
        plan(make(least - 1))


@pytest.mark.parametrize("causal", [False, True])
def test_prefill_paged_on_small_workspaces(torch_cuda, rng, causal):
    from prefill_reference import HKV, check, gather_pages, indptr_of, make_table, random_cache, ref_batch, uniform
    torch = torch_cuda
    hq, d, ps = 8, 128, 16
    table = make_table(rng, LONG_KV, ps)
    cache, k, v = random_cache(torch, rng, "NHD", table[3], ps, d, torch.float16, False)
    qo = indptr_of(QO_LENS)
    q = uniform(torch, rng, (int(qo[-1]), hq, d), torch.float16)
    kn, vn = k.cpu().float().numpy(), v.cpu().float().numpy()
    ref_o, ref_lse = ref_batch(q.cpu().float().numpy(), qo, lambda i: gather_pages(kn, vn, "NHD", table, ps, i),
                               causal)

    def make(nbytes):
        return tessera.BatchPrefillWithPagedKVCacheWrapper(torch.empty(nbytes, dtype=torch.int8, device="cuda"))

    def plan(w):
        w.plan(qo, *table[:3], hq, HKV, d, ps, causal=causal, q_data_type=torch.float16)
        return w

    _check_workspace_sizes(torch, make, plan, lambda w: w.run(q, cache, return_lse=True),
                           lambda o, lse: check(o, lse, ref_o, ref_lse, "float16"))


@pytest.mark.parametrize("kernel", ["cuda_cores", "tensor_cores"])
def test_decode_on_small_workspaces(torch_cuda, rng, kernel):
    from decode_reference import HEAD_DIM, HKV, HQ, check, make_table, random_cache, random_q, ref_batch_decode
    from conftest import to_np
    torch = torch_cuda
    lens = [0, 30000, 7, 12000, 300]
    indptr, indices, last, num_pages = make_table(rng, lens, 16)
    cache, k, v = random_cache(torch, rng, "NHD", num_pages, 16, torch.float16, False)
    q = random_q(torch, rng, len(lens), torch.float16)
    ref_o, ref_lse = ref_batch_decode(to_np(q), to_np(k), to_np(v), "NHD", indptr, indices, last, 16)

    def make(nbytes):
        w = tessera.BatchDecodeWithPagedKVCacheWrapper(torch.empty(nbytes, dtype=torch.int8, device="cuda"),
                                                       use_tensor_cores=kernel == "tensor_cores")
        w._cuda_cores = kernel == "cuda_cores"
        return w

    def plan(w):
        w.plan(indptr, indices, last, HQ, HKV, HEAD_DIM, 16, q_data_type=torch.float16)
        return w

    _check_workspace_sizes(torch, make, plan, lambda w: w.run(q, cache, return_lse=True),
                           lambda o, lse: check(o, lse, ref_o, ref_lse, "float16"))
