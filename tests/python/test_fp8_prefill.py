"""fp8 KV caches (float8_e4m3fn / float8_e5m2) on the tensor-core kernels: batch
prefill (paged, ragged), cascade levels, single_prefill, and batch decode with
use_tensor_cores=True, on the FA2 template (which widens staged fp8 fragments
in registers, or into 16-bit tiles for variants that transform K / V) and
(backend "auto" on sm_90) the Hopper template (whose producer widens them). Checked against the float64 prefill reference on the
dequantized cache (stored value x k_scale / v_scale), so the tests measure the
kernels, not the quantization: fp16 queries within 1e-3 of the reference norm,
bf16 within 1e-2, outputs poisoned with NaN first, pages shuffled.

GPU ("skipped: no GPU" without torch + CUDA): dtypes x layouts x page sizes x
head dims x causal; window, soft cap, ALiBi and a custom mask on an fp8 cache;
scales as floats and as 1-element tensors, a CUDA graph replayed with new
scale values; uint8 caches standing for the planned type; bitwise re-runs;
bad input. CPU: the plan-time checks that need no GPU.
"""

import numpy as np
import pytest

import tessera
from conftest import to_np
from prefill_reference import (HKV, check, gather_pages, indptr_of, make_table, ref_batch, ref_request, uniform,
                               workspace)
from test_pos_encoding import rope_request

FP8 = ["float8_e4m3fn", "float8_e5m2"]
KS, VS = 0.0131, 0.0097  # dequantization scales (not powers of two)
LENS = [(0, 10), (5, 0), (1, 300), (37, 37), (100, 190), (64, 577), (9, 3)]  # (q_len, kv_len)


def fp8_values(torch, rng, shape, kv_dtype):
    """A CUDA fp8 tensor whose values span most of the format (|x| <= 200)."""
    x = np.clip(rng.standard_normal(shape) * 60, -200, 200).astype(np.float32)
    return torch.from_numpy(x).to("cuda").to(getattr(torch, kv_dtype))


def fp8_pages(torch, rng, layout, num_pages, page_size, head_dim, kv_dtype, interleaved):
    """(paged_kv_cache as run() takes it, k_cache, v_cache) in fp8."""
    page = (page_size, HKV) if layout == "NHD" else (HKV, page_size)
    if interleaved:
        cache = fp8_values(torch, rng, (num_pages, 2) + page + (head_dim,), kv_dtype)
        return cache, cache[:, 0], cache[:, 1]
    k, v = (fp8_values(torch, rng, (num_pages,) + page + (head_dim,), kv_dtype) for _ in range(2))
    return (k, v), k, v


def reference(q, qo, kv_of, causal, head_dim, k_scale=KS, v_scale=VS, **options):
    """float64 on the dequantized cache: k_scale folds into the softmax scale, v_scale scales the output."""
    o, lse = ref_batch(to_np(q), qo, kv_of, causal, sm_scale=k_scale / np.sqrt(head_dim), **options)
    return o * v_scale, lse


def paged_wrapper(torch, layout="NHD", **kw):
    return tessera.BatchPrefillWithPagedKVCacheWrapper(workspace(torch), kv_layout=layout, **kw)


# ======================================================================= GPU: batch prefill
PAGED_CASES = [  # q dtype, kv dtype, head_dim, group, page_size, layout, interleaved, causal
    ("float16", "float8_e4m3fn", 128, 4, 16, "NHD", False, True),
    ("float16", "float8_e5m2", 128, 4, 1, "HND", False, True),
    ("bfloat16", "float8_e4m3fn", 128, 8, 16, "HND", True, False),
    ("bfloat16", "float8_e5m2", 64, 1, 16, "NHD", False, True),
    ("float16", "float8_e4m3fn", 64, 4, 1, "NHD", True, False),
    ("float16", "float8_e5m2", 256, 4, 16, "NHD", False, True),
    ("bfloat16", "float8_e4m3fn", 256, 1, 1, "HND", False, True),
    ("float16", "float8_e4m3fn", 256, 8, 16, "HND", True, False),
]


@pytest.mark.parametrize("backend", ["fa2", "auto"])
@pytest.mark.parametrize("q_dtype, kv_dtype, head_dim, group, page_size, layout, interleaved, causal", PAGED_CASES)
def test_fp8_paged_prefill(torch_cuda, rng, poison, q_dtype, kv_dtype, head_dim, group, page_size, layout,
                           interleaved, causal, backend):
    torch = torch_cuda
    hq = HKV * group
    q_lens, kv_lens = zip(*LENS)
    table = make_table(rng, kv_lens, page_size)
    cache, k, v = fp8_pages(torch, rng, layout, table[3], page_size, head_dim, kv_dtype, interleaved)
    qo = indptr_of(q_lens)
    q = uniform(torch, rng, (int(qo[-1]), hq, head_dim), getattr(torch, q_dtype), -2.0, 2.0)
    w = paged_wrapper(torch, layout, backend=backend)
    w.plan(qo, *table[:3], hq, HKV, head_dim, page_size, causal=causal, q_data_type=getattr(torch, q_dtype),
           kv_data_type=getattr(torch, kv_dtype))
    o, lse = w.run(q, cache, k_scale=KS, v_scale=VS, return_lse=True)
    assert o.dtype == q.dtype and o.shape == q.shape
    kn, vn = to_np(k), to_np(v)
    ref_o, ref_lse = reference(q, qo, lambda i: gather_pages(kn, vn, layout, table, page_size, i), causal, head_dim)
    check(o, lse, ref_o, ref_lse, q_dtype)


@pytest.mark.parametrize("cta_q, tile", [(16, (64, 0, 0, 3)), (16, (64, 0, 0, 4)), (64, (32, 0, 0, 3)),
                                         (128, (16, 0, 0, 4))])
@pytest.mark.parametrize("page_size", [1, 16])
def test_fp8_paged_prefill_deep_pipelines(torch_cuda, rng, poison, cta_q, tile, page_size):
    """The FA2 template with 3-4 stages over fp8 pages: page ids arrive STAGES tiles ahead through a ring."""
    torch = torch_cuda
    head_dim, hq = 128, HKV * 4
    q_lens, kv_lens = zip(*LENS)
    table = make_table(rng, kv_lens, page_size)
    cache, k, v = fp8_pages(torch, rng, "NHD", table[3], page_size, head_dim, "float8_e4m3fn", False)
    qo = indptr_of(q_lens)
    q = uniform(torch, rng, (int(qo[-1]), hq, head_dim), torch.float16, -2.0, 2.0)
    w = paged_wrapper(torch, backend="fa2")
    w._cta_q, w._tile = cta_q, tile
    w.plan(qo, *table[:3], hq, HKV, head_dim, page_size, causal=True, q_data_type=torch.float16,
           kv_data_type=torch.float8_e4m3fn)
    o, lse = w.run(q, cache, k_scale=KS, v_scale=VS, return_lse=True)
    kn, vn = to_np(k), to_np(v)
    ref_o, ref_lse = reference(q, qo, lambda i: gather_pages(kn, vn, "NHD", table, page_size, i), True, head_dim)
    check(o, lse, ref_o, ref_lse, "float16")


@pytest.mark.parametrize("q_dtype, kv_dtype, head_dim, group, causal", [
    ("float16", "float8_e4m3fn", 128, 4, True), ("bfloat16", "float8_e5m2", 64, 1, False),
    ("float16", "float8_e5m2", 256, 2, True)])
@pytest.mark.parametrize("backend", ["fa2", "auto"])
def test_fp8_ragged_prefill(torch_cuda, rng, poison, q_dtype, kv_dtype, head_dim, group, causal, backend):
    torch = torch_cuda
    hq = HKV * group
    q_lens, kv_lens = zip(*LENS)
    qo, kv = indptr_of(q_lens), indptr_of(kv_lens)
    q = uniform(torch, rng, (int(qo[-1]), hq, head_dim), getattr(torch, q_dtype), -2.0, 2.0)
    k, v = (fp8_values(torch, rng, (int(kv[-1]), HKV, head_dim), kv_dtype) for _ in range(2))
    w = tessera.BatchPrefillWithRaggedKVCacheWrapper(workspace(torch), backend=backend)
    w.plan(qo, kv, hq, HKV, head_dim, causal=causal, q_data_type=getattr(torch, q_dtype), kv_data_type=kv_dtype)
    o, lse = w.run(q, k, v, k_scale=KS, v_scale=VS, return_lse=True)
    kn, vn = to_np(k), to_np(v)
    ref_o, ref_lse = reference(q, qo, lambda i: (kn[kv[i]:kv[i + 1]], vn[kv[i]:kv[i + 1]]), causal, head_dim)
    check(o, lse, ref_o, ref_lse, q_dtype)


def run_variant(torch, rng, variant, check_out, fp8_mma=False, cta_q=0):
    """A built-in variant over a paged e4m3 cache against the float64 reference on the dequantized cache;
    check_out(o, lse, ref_o, ref_lse) judges it (fp8_mma: the wrapper's fp8 tensor-core option; cta_q: a
    query tile to pin)."""
    head_dim, hq, page_size = 128, 8, 16
    q_lens, kv_lens = [37, 100, 1], [37, 190, 300]
    table = make_table(rng, kv_lens, page_size)
    cache, k, v = fp8_pages(torch, rng, "NHD", table[3], page_size, head_dim, "float8_e4m3fn", False)
    qo = indptr_of(q_lens)
    q = uniform(torch, rng, (int(qo[-1]), hq, head_dim), torch.float16, -2.0, 2.0)
    plan, ref_opts, causal = {}, {}, True
    if variant == "window":
        plan = ref_opts = dict(window_left=40)
    elif variant == "soft_cap":
        plan = ref_opts = dict(logits_soft_cap=2.0)
    elif variant == "alibi":
        plan = dict(pos_encoding_mode="ALIBI")
        ref_opts = dict(alibi_slopes=np.array(tessera._C.alibi_slopes(hq)))
    elif variant == "rope":
        plan = dict(pos_encoding_mode="ROPE_LLAMA")
    masks = [rng.random((a, b)) < 0.6 for a, b in zip(q_lens, kv_lens)]
    if variant == "custom_mask":
        causal = False
        plan = dict(custom_mask=torch.from_numpy(np.concatenate([m.ravel() for m in masks])).cuda())
    w = paged_wrapper(torch)
    w._fp8_mma, w._cta_q = fp8_mma, cta_q
    w.plan(qo, *table[:3], hq, HKV, head_dim, page_size, causal=causal, q_data_type=torch.float16,
           kv_data_type=torch.float8_e4m3fn, **plan)
    o, lse = w.run(q, cache, k_scale=KS, v_scale=VS, return_lse=True)
    kn, vn = to_np(k), to_np(v)
    qn, o_ref, lse_ref = to_np(q), [], []
    for i in range(len(q_lens)):
        ki, vi = gather_pages(kn, vn, "NHD", table, page_size, i)
        qi = qn[qo[i]:qo[i + 1]]
        if variant == "rope":
            qi, ki = rope_request(qi, ki, None, None)
        vis = masks[i] if variant == "custom_mask" else None
        a, b = ref_request(qi, ki, vi, causal, KS / np.sqrt(head_dim), visible=vis, **ref_opts)
        o_ref.append(a * VS)
        lse_ref.append(b)
    check_out(o, lse, np.concatenate(o_ref), np.concatenate(lse_ref))


@pytest.mark.parametrize("variant", ["window", "soft_cap", "alibi", "custom_mask", "rope"])
def test_fp8_prefill_variants(torch_cuda, rng, poison, variant):
    """The built-in variants on an fp8 cache: the same functors, K / V widened first (RoPE: the keys are
    rotated after widening, in the Hopper kernel's producer)."""
    run_variant(torch_cuda, rng, variant, lambda o, lse, ref_o, ref_lse: check(o, lse, ref_o, ref_lse, "float16"))


def test_fp8_prefill_scale_tensors_uint8_views_and_determinism(torch_cuda, rng, poison):
    torch = torch_cuda
    head_dim, hq = 128, 8
    q_lens, kv_lens = zip(*LENS)
    table = make_table(rng, kv_lens, 16)
    cache, k, v = fp8_pages(torch, rng, "NHD", table[3], 16, head_dim, "float8_e5m2", False)
    qo = indptr_of(q_lens)
    q = uniform(torch, rng, (int(qo[-1]), hq, head_dim), torch.float16, -2.0, 2.0)
    w = paged_wrapper(torch)
    w.plan(qo, *table[:3], hq, HKV, head_dim, 16, causal=True, q_data_type=torch.float16, kv_data_type="e5m2")
    kt = torch.tensor([KS], dtype=torch.float32, device="cuda")
    vt = torch.tensor([VS], dtype=torch.float32, device="cuda")
    a = w.run(q, cache, k_scale=kt, v_scale=vt)
    kn, vn = to_np(k), to_np(v)
    ref_o, _ = reference(q, qo, lambda i: gather_pages(kn, vn, "NHD", table, 16, i), True, head_dim)
    check(a, None, ref_o, None, "float16")
    b = w.run(q, (k.view(torch.uint8), v.view(torch.uint8)), k_scale=kt, v_scale=vt)  # uint8: the planned type
    c = w.run(q, cache, k_scale=KS, v_scale=VS)  # floats fold into the same scales
    assert torch.equal(a, b) and torch.equal(a, w.run(q, cache, k_scale=kt, v_scale=vt))
    check(c, None, ref_o, None, "float16")


def graph_replays_new_scale_tensors(torch, rng, check_out, fp8_mma=False):
    """A paged bf16 / e4m3 prefill captured in a CUDA graph with 1-element scale tensors, replayed with new
    values; check_out(out, ref_o) judges each replay (fp8_mma: the wrapper's fp8 tensor-core option)."""
    head_dim, hq, batch, pool = 128, 8, 4, 200
    q_lens, kv_lens = [30, 1, 64, 7], [500, 1, 900, 77]
    table = make_table(rng, kv_lens, 16, spare=pool - sum((n + 15) // 16 for n in kv_lens))
    cache, k, v = fp8_pages(torch, rng, "NHD", pool, 16, head_dim, "float8_e4m3fn", False)
    qo = indptr_of(q_lens)
    q = uniform(torch, rng, (int(qo[-1]), hq, head_dim), torch.bfloat16, -2.0, 2.0)
    i32 = dict(dtype=torch.int32, device="cuda")
    w = paged_wrapper(torch, use_cuda_graph=True, qo_indptr_buf=torch.empty(batch + 1, **i32),
                      paged_kv_indptr_buf=torch.empty(batch + 1, **i32), paged_kv_indices_buf=torch.empty(pool, **i32),
                      paged_kv_last_page_len_buf=torch.empty(batch, **i32))
    w._fp8_mma = fp8_mma
    w.plan(qo, *table[:3], hq, HKV, head_dim, 16, causal=True, q_data_type=torch.bfloat16,
           kv_data_type=torch.float8_e4m3fn)
    kt, vt = torch.ones(1, device="cuda"), torch.ones(1, device="cuda")
    out = torch.empty_like(q)
    w.run(q, cache, k_scale=kt, v_scale=vt, out=out)  # JIT outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        w.run(q, cache, k_scale=kt, v_scale=vt, out=out)
    kn, vn = to_np(k), to_np(v)
    for ks, vs in ((KS, VS), (0.05, 0.002), (0.003, 0.02)):
        kt.fill_(ks)
        vt.fill_(vs)
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        ref_o, _ = reference(q, qo, lambda i: gather_pages(kn, vn, "NHD", table, 16, i), True, head_dim,
                             np.float32(ks), np.float32(vs))
        check_out(out, ref_o)


def test_fp8_prefill_cuda_graph_replays_new_scale_tensors(torch_cuda, rng):
    graph_replays_new_scale_tensors(torch_cuda, rng, lambda out, ref_o: check(out, None, ref_o, None, "bfloat16"))


@pytest.mark.parametrize("kv_dtype", FP8)
@pytest.mark.parametrize("causal", [False, True])
def test_fp8_single_prefill(torch_cuda, rng, poison, kv_dtype, causal):
    torch = torch_cuda
    q = uniform(torch, rng, (70, 8, 128), torch.float16, -2.0, 2.0)
    k, v = (fp8_values(torch, rng, (333, HKV, 128), kv_dtype) for _ in range(2))
    o, lse = tessera.single_prefill_with_kv_cache(q, k, v, causal=causal, k_scale=KS, v_scale=VS, return_lse=True)
    ref_o, ref_lse = reference(q, [0, 70], lambda i: (to_np(k), to_np(v)), causal, 128)
    check(o, lse, ref_o, ref_lse, "float16")


@pytest.mark.parametrize("head_dim, group, page_size, tile", [
    (128, 4, 16, None), (128, 8, 1, None), (128, 1, 16, None), (64, 4, 16, None), (256, 2, 16, None),
    (128, 4, 16, (128, 0, 0, 2)), (128, 4, 1, (64, 0, 0, 3)), (64, 8, 16, (32, 0, 2, 2))])
@pytest.mark.parametrize("kv_dtype, q_dtype", [("float8_e4m3fn", "float16"), ("float8_e5m2", "bfloat16")])
def test_fp8_eight_row_tiles(torch_cuda, rng, poison, head_dim, group, page_size, tile, kv_dtype, q_dtype):
    """8-row query tiles (the keys as the mma's rows) through the prefill wrapper: several queries per
    request (a tile holds 8 / group of them, the rest in the next tiles), causal, split KV, pipeline depths."""
    torch = torch_cuda
    hq = HKV * group
    q_lens, kv_lens = zip(*LENS)
    table = make_table(rng, kv_lens, page_size)
    cache, k, v = fp8_pages(torch, rng, "NHD", table[3], page_size, head_dim, kv_dtype, False)
    qo = indptr_of(q_lens)
    q = uniform(torch, rng, (int(qo[-1]), hq, head_dim), getattr(torch, q_dtype), -2.0, 2.0)
    w = paged_wrapper(torch, backend="auto")
    w._cta_q = 8
    if tile is not None:
        w._tile = tile
    w.plan(qo, *table[:3], hq, HKV, head_dim, page_size, causal=True, q_data_type=getattr(torch, q_dtype),
           kv_data_type=getattr(torch, kv_dtype))
    o, lse = w.run(q, cache, k_scale=KS, v_scale=VS, return_lse=True)
    assert w._native.cta_q == 8
    kn, vn = to_np(k), to_np(v)
    ref_o, ref_lse = reference(q, qo, lambda i: gather_pages(kn, vn, "NHD", table, page_size, i), True, head_dim)
    check(o, lse, ref_o, ref_lse, q_dtype)
    o2, lse2 = w.run(q, cache, k_scale=KS, v_scale=VS, return_lse=True)
    assert torch.equal(o, o2) and torch.equal(lse, lse2)  # bitwise: no atomics in the reductions


@pytest.mark.parametrize("variant", ["window", "soft_cap", "alibi"])
def test_fp8_eight_row_tile_variants(torch_cuda, rng, poison, variant):
    """The built-in variants on 8-row tiles: masks and logits transforms over the transposed S."""
    run_variant(torch_cuda, rng, variant, lambda o, lse, ref_o, ref_lse: check(o, lse, ref_o, ref_lse, "float16"),
                cta_q=8)


@pytest.mark.parametrize("group", [1, 4, 8, 16])
@pytest.mark.parametrize("head_dim", [64, 128, 256])
def test_fp8_tensor_core_decode_groups(torch_cuda, rng, poison, group, head_dim):
    """Decode's default tile on an fp8 cache per group size: 8 rows (keys as the mma's rows) up to 8 heads,
    16 rows beyond; one query per request, lengths 0 .. 2900."""
    torch = torch_cuda
    hq, page_size = HKV * group, 16
    kv_lens = [0, 1, 7, 300, 2900, 33, 129, 16]
    table = make_table(rng, kv_lens, page_size)
    cache, k, v = fp8_pages(torch, rng, "HND", table[3], page_size, head_dim, "float8_e4m3fn", False)
    q = uniform(torch, rng, (len(kv_lens), hq, head_dim), torch.float16, -2.0, 2.0)
    w = tessera.BatchDecodeWithPagedKVCacheWrapper(workspace(torch), "HND", use_tensor_cores=True)
    w.plan(*table[:3], hq, HKV, head_dim, page_size, q_data_type=torch.float16, kv_data_type=torch.float8_e4m3fn)
    o, lse = w.run(q, cache, k_scale=KS, v_scale=VS, return_lse=True)
    kn, vn = to_np(k), to_np(v)
    ref_o, ref_lse = reference(q, np.arange(len(kv_lens) + 1),
                               lambda i: gather_pages(kn, vn, "HND", table, page_size, i), False, head_dim)
    check(o, lse, ref_o, ref_lse, "float16")


@pytest.mark.parametrize("kv_dtype", FP8)
@pytest.mark.parametrize("layout", ["NHD", "HND"])
@pytest.mark.parametrize("hkv, group, kv_heads", [(2, 4, 2), (6, 2, 2), (4, 1, 2), (3, 2, 1), (2, 8, 1)])
def test_fp8_kv_head_pairs(torch_cuda, rng, poison, kv_dtype, layout, hkv, group, kv_heads):
    """8-row tiles read two adjacent KV heads a CTA where both heads' query rows fill the tile (fp8, head dim
    128, group <= 4, an even head count), else one: causal prefill (several queries a tile, so the heads' rows
    and the query positions interleave along the tile) and decode over the same shuffled pages."""
    torch = torch_cuda
    head_dim, page_size, hq, dt = 128, 16, hkv * group, getattr(torch_cuda, kv_dtype)
    q_lens, kv_lens = zip(*LENS)
    table = make_table(rng, kv_lens, page_size)
    page = (page_size, hkv) if layout == "NHD" else (hkv, page_size)
    k, v = (fp8_values(torch, rng, (table[3],) + page + (head_dim,), kv_dtype) for _ in range(2))
    kn, vn = to_np(k), to_np(v)
    qo = indptr_of(q_lens)
    q = uniform(torch, rng, (int(qo[-1]), hq, head_dim), torch.float16, -2.0, 2.0)
    w = paged_wrapper(torch, layout, backend="fa2")
    w._cta_q = 8
    w.plan(qo, *table[:3], hq, hkv, head_dim, page_size, causal=True, q_data_type=torch.float16, kv_data_type=dt)
    o, lse = w.run(q, (k, v), k_scale=KS, v_scale=VS, return_lse=True)
    assert w._native.kv_heads_per_cta == kv_heads
    ref_o, ref_lse = reference(q, qo, lambda i: gather_pages(kn, vn, layout, table, page_size, i), True, head_dim)
    check(o, lse, ref_o, ref_lse, "float16")
    o2, lse2 = w.run(q, (k, v), k_scale=KS, v_scale=VS, return_lse=True)
    assert torch.equal(o, o2) and torch.equal(lse, lse2)

    qd = uniform(torch, rng, (len(kv_lens), hq, head_dim), torch.float16, -2.0, 2.0)
    d = tessera.BatchDecodeWithPagedKVCacheWrapper(workspace(torch), layout, use_tensor_cores=True)
    d.plan(*table[:3], hq, hkv, head_dim, page_size, q_data_type=torch.float16, kv_data_type=dt)
    od, lsed = d.run(qd, (k, v), k_scale=KS, v_scale=VS, return_lse=True)
    ref_o, ref_lse = reference(qd, np.arange(len(kv_lens) + 1),
                               lambda i: gather_pages(kn, vn, layout, table, page_size, i), False, head_dim)
    check(od, lsed, ref_o, ref_lse, "float16")


@pytest.mark.parametrize("q_dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("kv_dtype", FP8)
@pytest.mark.parametrize("layout", ["NHD", "HND"])
@pytest.mark.parametrize("cta_q", [0, 16])
def test_fp8_tensor_core_decode(torch_cuda, rng, poison, q_dtype, kv_dtype, layout, cta_q):
    """BatchDecodeWithPagedKVCacheWrapper(use_tensor_cores=True) on an fp8 cache: one query per request, on the
    default query tile and on 16-row tiles (the FA2 template on every device)."""
    torch = torch_cuda
    head_dim, hq, page_size = 128, 8, 16
    kv_lens = [0, 1, 7, 300, 2900, 33, 129]
    table = make_table(rng, kv_lens, page_size)
    cache, k, v = fp8_pages(torch, rng, layout, table[3], page_size, head_dim, kv_dtype, False)
    q = uniform(torch, rng, (len(kv_lens), hq, head_dim), getattr(torch, q_dtype), -2.0, 2.0)
    w = tessera.BatchDecodeWithPagedKVCacheWrapper(workspace(torch), layout, use_tensor_cores=True)
    w._tc_cta_q = cta_q
    w.plan(*table[:3], hq, HKV, head_dim, page_size, q_data_type=getattr(torch, q_dtype),
           kv_data_type=getattr(torch, kv_dtype))
    assert w._native.use_tensor_cores
    kt = torch.tensor([KS], device="cuda")
    o, lse = w.run(q, cache, k_scale=kt, v_scale=VS, return_lse=True)
    kn, vn = to_np(k), to_np(v)
    ref_o, ref_lse = reference(q, np.arange(len(kv_lens) + 1),
                               lambda i: gather_pages(kn, vn, layout, table, page_size, i), False, head_dim)
    check(o, lse, ref_o, ref_lse, q_dtype)


@pytest.mark.parametrize("kv_dtype, page_size, causal", [("float8_e4m3fn", 16, True), ("float8_e5m2", 1, False)])
def test_fp8_cascade(torch_cuda, rng, poison, kv_dtype, page_size, causal):
    """Three cascade levels over one fp8 cache; every level applies the scales, so their merge is scaled alike."""
    from test_cascade import GROUPS, Q_LEN, make_levels, reference as cascade_reference, tokens_for

    torch = torch_cuda
    levels, runs, n_pages = make_levels(Q_LEN, GROUPS, tokens_for(causal), page_size, rng)
    hq, head_dim = 8, 128
    k, v = (fp8_values(torch, rng, (n_pages, page_size, HKV, head_dim), kv_dtype) for _ in range(2))
    q = uniform(torch, rng, (sum(Q_LEN), hq, head_dim), torch.float16, -2.0, 2.0)
    w = tessera.MultiLevelCascadeAttentionWrapper(3, workspace(torch), "NHD")
    w.plan(*[list(x) for x in zip(*levels)], hq, HKV, head_dim, page_size, causal=causal, q_data_type=torch.float16,
           kv_data_type=kv_dtype)
    o, lse = w.run(q, (k, v), return_lse=True, k_scale=KS, v_scale=torch.tensor([VS], device="cuda"))
    ref_o, ref_lse = cascade_reference(to_np(q), Q_LEN, runs, to_np(k) * KS, to_np(v) * VS, causal)
    check(o, lse, ref_o, ref_lse, "float16")
    assert torch.equal(o, w.run(q, (k.view(torch.uint8), v.view(torch.uint8)), k_scale=KS,
                                v_scale=torch.tensor([VS], device="cuda")))


def test_fp8_prefill_bad_input_gpu(torch_cuda, rng):
    torch = torch_cuda
    table = make_table(rng, [40, 3], 16)
    cache, k, v = fp8_pages(torch, rng, "NHD", table[3], 16, 128, "float8_e4m3fn", False)
    q = torch.zeros(2, 4, 128, dtype=torch.float16, device="cuda")
    w = paged_wrapper(torch)
    w.plan([0, 1, 2], *table[:3], 4, HKV, 128, 16, q_data_type=torch.float16, kv_data_type=torch.float8_e4m3fn)
    with pytest.raises(TypeError, match="paged_kv_cache"):  # another fp8 type than planned
        w.run(q, (k.float().to(torch.float8_e5m2), v.float().to(torch.float8_e5m2)))
    with pytest.raises(TypeError, match="k_scale"):
        w.run(q, cache, k_scale=torch.ones(1, dtype=torch.float16, device="cuda"))
    with pytest.raises(ValueError, match="v_scale"):
        w.run(q, cache, v_scale=torch.ones(2, device="cuda"))
    with pytest.raises(TypeError, match="k_scale"):
        w.run(q, cache, k_scale=torch.ones(1))  # on the CPU
    if torch.cuda.get_device_capability()[0] == 9:  # the Hopper kernel takes head dims 64 / 128 / 256 only
        with pytest.raises((TypeError, ValueError), match="head_dim|fa3"):
            paged_wrapper(torch, backend="fa3").plan([0, 1, 2], *table[:3], 4, HKV, 512, 16, q_data_type=torch.float16,
                                                     kv_data_type=torch.float8_e4m3fn)
    w16 = paged_wrapper(torch)  # scale tensors belong to fp8 caches
    w16.plan([0, 1, 2], *table[:3], 4, HKV, 128, 16, q_data_type=torch.float16)
    kv16 = (k.half(), v.half())
    with pytest.raises((TypeError, ValueError), match="scale"):
        w16.run(q, kv16, k_scale=torch.ones(1, device="cuda"))
    k3, v3 = k[:, 0], v[:, 0]  # [tokens, heads, dim]
    with pytest.raises((TypeError, ValueError), match="dtype"):
        tessera.single_prefill_with_kv_cache(q, k3, v3.half())


# ======================================================================= CPU
def cpu_prefill():
    return tessera.BatchPrefillWithPagedKVCacheWrapper(np.zeros(1024, dtype=np.uint8))


def test_fp8_prefill_plan_checks_without_gpu():
    args = ([0, 1, 2], [0, 1, 3], [0, 2, 1], [5, 16], 8, HKV)
    with pytest.raises(TypeError, match="q_data_type"):
        cpu_prefill().plan(*args, 128, 16, q_data_type="float8_e4m3fn", kv_data_type="float8_e4m3fn")
    with pytest.raises(TypeError, match="kv_dtype"):  # fp8 at head dims the FA2 fp8 kernels do not take
        cpu_prefill().plan(*args, 192, 16, head_dim_vo=128, kv_data_type="float8_e4m3fn")
    with pytest.raises(TypeError, match="kv_dtype"):
        cpu_prefill().plan(*args, 512, 16, kv_data_type="float8_e5m2")
    # A valid fp8 plan passes the dtype checks; the host workspace is what it refuses.
    with pytest.raises(TypeError, match="float_workspace_buffer"):
        cpu_prefill().plan(*args, 128, 16, kv_data_type="float8_e5m2")
