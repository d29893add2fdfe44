"""fp8 KV caches (torch.float8_e4m3fn / float8_e5m2, kv_data_type) through the
FlashInfer-style API, against a float64 reference on the dequantized cache
(stored value x k_scale / v_scale).

GPU ("skipped: no GPU" without torch + CUDA): BatchDecodeWithPagedKVCacheWrapper
over fp16 / bf16 queries x e4m3 / e5m2 x NHD / HND x page sizes 1 / 16 x
(k, v) / interleaved caches, outputs starting as NaN; scales as floats and as
1-element float32 tensors, uint8 caches standing for the planned fp8 type,
bitwise re-runs; a CUDA graph replayed after new values are written into the
scale tensors; single_decode_with_kv_cache; append_paged_kv_cache quantizing
fp16 / bf16 rows (bit for bit as torch's own conversion of value / scale),
copying fp8 rows; the end-to-end error of a quantized cache against the fp16
reference; bad input. CPU: dtype names, the refusals that need no GPU, and
the C++ CPU path on fp8 K / V (with ml_dtypes, also through the public API).
"""

import numpy as np
import pytest

import tessera
from conftest import TOL, assert_lse_close, rel_error, to_np
from decode_reference import HEAD_DIM, HKV, HQ, make_table, page_shape, ref_batch_decode, workspace
from tessera import _C
from tessera._errors import NotSupportedError

FP8 = ["float8_e4m3fn", "float8_e5m2"]
KS, VS = 0.0131, 0.0097  # the dequantization scales (not powers of two)
LENS = [0, 1, 7, 300, 2900, 33, 129, 1]


def fp8_cache(torch, rng, shape, kv_dtype):
    """A CUDA fp8 tensor of `shape` whose values span most of the format (|x| <= 200)."""
    x = np.clip(rng.standard_normal(shape) * 60, -200, 200).astype(np.float32)
    return torch.from_numpy(x).to("cuda").to(getattr(torch, kv_dtype))


def reference(q, k, v, layout, table, page_size, k_scale=KS, v_scale=VS):
    """float64 decode on the dequantized cache: k_scale folded into the softmax scale, v_scale times the output."""
    indptr, indices, last = table[:3]
    o, lse = ref_batch_decode(to_np(q), to_np(k), to_np(v), layout, indptr, indices, last, page_size,
                              sm_scale=k_scale / np.sqrt(q.shape[-1]))
    return o * v_scale, lse


def planned(torch, table, page_size, q_dtype, kv_dtype, layout="NHD", **kw):
    w = tessera.BatchDecodeWithPagedKVCacheWrapper(workspace(torch), kv_layout=layout, **kw)
    w.plan(*(torch.from_numpy(x) for x in table[:3]), HQ, HKV, HEAD_DIM, page_size, q_data_type=q_dtype,
           kv_data_type=kv_dtype)
    return w


# ======================================================================= GPU
@pytest.mark.parametrize("q_dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("kv_dtype", FP8)
@pytest.mark.parametrize("layout", ["NHD", "HND"])
@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("interleaved", [False, True])
def test_fp8_batch_decode(torch_cuda, rng, poison, q_dtype, kv_dtype, layout, page_size, interleaved):
    torch = torch_cuda
    table = make_table(rng, LENS, page_size)
    shape = page_shape(layout, table[3], page_size)
    if interleaved:
        cache = fp8_cache(torch, rng, (shape[0], 2) + shape[1:], kv_dtype)
        k, v = cache[:, 0], cache[:, 1]
    else:
        k, v = fp8_cache(torch, rng, shape, kv_dtype), fp8_cache(torch, rng, shape, kv_dtype)
        cache = (k, v)
    q = torch.from_numpy(rng.uniform(-2, 2, (len(LENS), HQ, HEAD_DIM)).astype(np.float32)).cuda().to(
        getattr(torch, q_dtype))
    w = planned(torch, table, page_size, getattr(torch, q_dtype), getattr(torch, kv_dtype), layout)
    o, lse = w.run(q, cache, k_scale=KS, v_scale=VS, return_lse=True)
    ref_o, ref_lse = reference(q, k, v, layout, table, page_size)
    assert o.dtype == q.dtype
    assert rel_error(to_np(o), ref_o) < TOL[q_dtype]
    assert_lse_close(to_np(lse), ref_lse, 1e-3)


def test_fp8_scale_tensors_uint8_cache_and_determinism(torch_cuda, rng, poison):
    torch = torch_cuda
    table = make_table(rng, LENS, 16)
    shape = page_shape("HND", table[3], 16)
    k, v = fp8_cache(torch, rng, shape, "float8_e4m3fn"), fp8_cache(torch, rng, shape, "float8_e4m3fn")
    q = torch.from_numpy(rng.uniform(-2, 2, (len(LENS), HQ, HEAD_DIM)).astype(np.float32)).cuda().half()
    w = planned(torch, table, 16, torch.float16, "float8_e4m3fn", "HND")
    kt = torch.tensor([KS], dtype=torch.float32, device="cuda")
    vt = torch.tensor([VS], dtype=torch.float32, device="cuda")
    ref_o, _ = reference(q, k, v, "HND", table, 16)
    a = w.run(q, (k, v), k_scale=kt, v_scale=vt)
    assert rel_error(to_np(a), ref_o) < TOL["float16"]
    # serving engines keep fp8 caches as uint8: the planned fp8 type reads them
    b = w.run(q, (k.view(torch.uint8), v.view(torch.uint8)), k_scale=kt, v_scale=vt)
    assert torch.equal(a, b)
    c = w.run(q, (k, v), q_scale=2.0, k_scale=KS / 2, v_scale=VS)  # q_scale * k_scale multiplies the softmax scale
    assert rel_error(to_np(c), ref_o) < TOL["float16"]


def test_fp8_cuda_graph_replays_new_scale_tensors(torch_cuda, rng):
    torch = torch_cuda
    table = make_table(rng, [3000, 40, 900, 0, 1200], 16)
    shape = page_shape("NHD", table[3], 16)
    k, v = fp8_cache(torch, rng, shape, "float8_e5m2"), fp8_cache(torch, rng, shape, "float8_e5m2")
    q = torch.from_numpy(rng.uniform(-2, 2, (5, HQ, HEAD_DIM)).astype(np.float32)).cuda().half()
    w = tessera.BatchDecodeWithPagedKVCacheWrapper(workspace(torch), use_cuda_graph=True)
    w.plan(*(torch.from_numpy(x) for x in table[:3]), HQ, HKV, HEAD_DIM, 16, q_data_type=torch.float16,
           kv_data_type=torch.float8_e5m2)
    kt = torch.ones(1, dtype=torch.float32, device="cuda")
    vt = torch.ones(1, dtype=torch.float32, device="cuda")
    out = torch.empty_like(q)
    w.run(q, (k, v), k_scale=kt, v_scale=vt, out=out)  # warm up (JIT) outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        w.run(q, (k, v), k_scale=kt, v_scale=vt, out=out)
    for ks, vs in ((KS, VS), (0.05, 0.002), (0.003, 0.02)):
        kt.fill_(ks)
        vt.fill_(vs)
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        ref_o, _ = reference(q, k, v, "NHD", table, 16, np.float32(ks), np.float32(vs))
        assert rel_error(to_np(out), ref_o) < TOL["float16"]


@pytest.mark.parametrize("kv_dtype", FP8)
@pytest.mark.parametrize("layout", ["NHD", "HND"])
@pytest.mark.parametrize("scales", ["floats", "tensors"])
def test_fp8_single_decode(torch_cuda, rng, poison, kv_dtype, layout, scales):
    torch = torch_cuda
    kv_len, d = 777, 128
    shape = (kv_len, HKV, d) if layout == "NHD" else (HKV, kv_len, d)
    k, v = fp8_cache(torch, rng, shape, kv_dtype), fp8_cache(torch, rng, shape, kv_dtype)
    q = torch.from_numpy(rng.uniform(-2, 2, (HQ, d)).astype(np.float32)).cuda().to(torch.bfloat16)
    ks, vs = KS, VS
    if scales == "tensors":
        ks = torch.tensor([KS], device="cuda")
        vs = torch.tensor([VS], device="cuda")
    o, lse = tessera.single_decode_with_kv_cache(q, k, v, kv_layout=layout, k_scale=ks, v_scale=vs, return_lse=True)
    kk, vv = (x if layout == "NHD" else x.transpose(0, 1) for x in (k, v))
    table = (np.array([0, kv_len], np.int32), np.arange(kv_len, dtype=np.int32), np.array([1], np.int32))
    ref_o, ref_lse = reference(q[None], kk[:, None], vv[:, None], "NHD", table, 1)
    assert rel_error(to_np(o), ref_o[0]) < TOL["bfloat16"]
    assert_lse_close(to_np(lse), ref_lse[0], 1e-3)


@pytest.mark.parametrize("rows", ["float16", "bfloat16"])
@pytest.mark.parametrize("kv_dtype", FP8)
@pytest.mark.parametrize("layout", ["NHD", "HND"])
def test_fp8_append_quantizes_like_torch(torch_cuda, rng, rows, kv_dtype, layout):
    """value / scale rounded to nearest even: torch's conversion of the same quotient, bit for bit (values in range)."""
    torch = torch_cuda
    lens, page_size = [5, 40, 1], 16
    table = make_table(rng, lens, page_size)
    indptr, indices, last = (torch.from_numpy(x).cuda() for x in table[:3])
    shape = page_shape(layout, table[3], page_size)
    k_cache = torch.zeros(shape, dtype=getattr(torch, kv_dtype), device="cuda")
    v_cache = torch.zeros_like(k_cache)
    nnz = sum(lens)
    key = torch.from_numpy(rng.uniform(-3, 3, (nnz, HKV, HEAD_DIM)).astype(np.float32)).cuda().to(getattr(torch, rows))
    value = torch.from_numpy(rng.uniform(-3, 3, (nnz, HKV, HEAD_DIM)).astype(np.float32)).cuda().to(getattr(torch, rows))
    seq = torch.tensor(lens, dtype=torch.int32, device="cuda")
    batch, pos = tessera.get_batch_indices_positions(torch.tensor([0] + list(np.cumsum(lens)), dtype=torch.int32,
                                                                  device="cuda"), seq, nnz)
    kt = torch.tensor([0.02], device="cuda")
    tessera.append_paged_kv_cache(key, value, batch, pos, (k_cache, v_cache), indices, indptr, last, layout,
                                  k_scale=0.01, v_scale=kt)
    # Gather (as bytes) what landed where the page table says; compare with torch's conversion.
    pages = torch.from_numpy(table[1]).cuda().long()  # every request's pages, in order
    starts = np.concatenate([[0], np.cumsum([(n + page_size - 1) // page_size for n in lens])]) * page_size

    def landed(cache):
        x = cache.view(torch.uint8)
        flat = (x if layout == "NHD" else x.transpose(1, 2))[pages].reshape(-1, HKV, HEAD_DIM)
        return torch.cat([flat[s: s + n] for s, n in zip(starts, lens)])

    want_k = (key.float() / 0.01).to(getattr(torch, kv_dtype))
    want_v = (value.float() / kt).to(getattr(torch, kv_dtype))
    assert torch.equal(landed(k_cache), want_k.view(torch.uint8))
    assert torch.equal(landed(v_cache), want_v.view(torch.uint8))
    # fp8 rows into the fp8 cache: a copy (FlashInfer's own call)
    tessera.append_paged_kv_cache(want_v, want_k, batch, pos, (k_cache, v_cache), indices, indptr, last, layout)
    assert torch.equal(landed(k_cache), want_v.view(torch.uint8))


@pytest.mark.parametrize("kv_dtype", FP8)
def test_fp8_end_to_end_error_against_fp16(torch_cuda, rng, kv_dtype):
    """fp16 K / V quantized (scale = amax / the format's largest value), decoded: close to the fp16 reference
    within the quantization's own error (a loose bound; the value is printed)."""
    torch = torch_cuda
    table = make_table(rng, [1500, 300, 4000, 77], 16)
    shape = page_shape("NHD", table[3], 16)
    k16 = torch.from_numpy(rng.uniform(-3, 3, shape).astype(np.float32)).cuda().half()
    v16 = torch.from_numpy(rng.uniform(-3, 3, shape).astype(np.float32)).cuda().half()
    q = torch.from_numpy(rng.uniform(-2, 2, (4, HQ, HEAD_DIM)).astype(np.float32)).cuda().half()
    fmax = 448.0 if kv_dtype == "float8_e4m3fn" else 57344.0
    ks = vs = 3.0 / fmax
    k8 = (k16.float() / ks).to(getattr(torch, kv_dtype))
    v8 = (v16.float() / vs).to(getattr(torch, kv_dtype))
    w = planned(torch, table, 16, torch.float16, kv_dtype)
    o = w.run(q, (k8, v8), k_scale=ks, v_scale=vs)
    exact, _ = ref_batch_decode(to_np(q), to_np(k16), to_np(v16), "NHD", *table[:3], 16)
    err = rel_error(to_np(o), exact)
    print(f"fp8 end-to-end {kv_dtype}: error vs the fp16 reference {err:.2e}")
    assert err < (0.2 if kv_dtype == "float8_e4m3fn" else 0.35)
    assert rel_error(to_np(o), reference(q, k8, v8, "NHD", table, 16, ks, vs)[0]) < TOL["float16"]


def test_fp8_bad_input_gpu(torch_cuda, rng):
    torch = torch_cuda
    table = make_table(rng, [40, 3], 16)
    shape = page_shape("NHD", table[3], 16)
    k, v = fp8_cache(torch, rng, shape, "float8_e4m3fn"), fp8_cache(torch, rng, shape, "float8_e4m3fn")
    q = torch.zeros(2, HQ, HEAD_DIM, dtype=torch.float16, device="cuda")
    w = planned(torch, table, 16, torch.float16, torch.float8_e4m3fn)
    with pytest.raises(TypeError, match="paged_kv_cache"):
        w.run(q, (k.float().to(torch.float8_e5m2), v.float().to(torch.float8_e5m2)))
    with pytest.raises(TypeError, match="kv"):
        w.run(q, (k.half(), v.half()))
    with pytest.raises(TypeError, match="k_scale"):
        w.run(q, (k, v), k_scale=torch.ones(1, dtype=torch.float16, device="cuda"))
    with pytest.raises(ValueError, match="v_scale"):
        w.run(q, (k, v), v_scale=torch.ones(2, device="cuda"))
    with pytest.raises(TypeError, match="k_scale"):
        w.run(q, (k, v), k_scale=torch.ones(1))  # on the CPU
    with pytest.raises(NotSupportedError, match="q_scale"):
        w.run(q, (k, v), q_scale=torch.ones(1, device="cuda"))


# ======================================================================= CPU
def cpu_wrapper(**kwargs):
    return tessera.BatchDecodeWithPagedKVCacheWrapper(np.zeros(1024, dtype=np.uint8), **kwargs)


def plan_args(**kwargs):
    args = dict(indptr=[0, 1, 3], indices=[0, 2, 1], last_page_len=[5, 16], num_qo_heads=HQ, num_kv_heads=HKV,
                head_dim=HEAD_DIM, page_size=16)
    args.update(kwargs)
    return args


@pytest.mark.parametrize("name, want", [("float8_e4m3fn", "float8_e4m3fn"), ("e4m3", "float8_e4m3fn"),
                                        ("float8_e5m2", "float8_e5m2"), ("fp8_e5m2", "float8_e5m2")])
def test_fp8_dtype_names(name, want):
    from tessera import _wrapper_util as W

    assert W.dtype_arg(name, "kv_data_type", fp8=True) == want
    with pytest.raises(TypeError, match="q_data_type"):
        W.dtype_arg(name, "q_data_type")
    with pytest.raises(TypeError, match="kv_data_type"):
        W.dtype_arg(name, "kv_data_type")  # a wrapper that reads only 16-bit caches


def test_fp8_refusals_without_gpu():
    with pytest.raises(TypeError, match="q_data_type"):
        cpu_wrapper().plan(**plan_args(q_data_type="float8_e4m3fn"))
    with pytest.raises(TypeError, match="o_data_type"):
        cpu_wrapper().plan(**plan_args(kv_data_type="float8_e4m3fn", o_data_type="float8_e4m3fn"))
    # Tensor-core decode takes fp8 caches (the FA2 prefill template): past the dtype checks, the
    # CPU workspace is what it refuses.
    with pytest.raises(TypeError, match="float_workspace_buffer"):
        cpu_wrapper(use_tensor_cores=True).plan(**plan_args(kv_data_type="float8_e5m2"))


def test_fp8_workspace_size_without_gpu():
    """fp8 KV plans on the CUDA-core kernel: the C++ size query accepts it with 16-bit q / o only."""
    size = _C.BatchDecode.workspace_size("float16", "float8_e4m3fn", "float16", 128, 32, 8, 16, "NHD", 16, 1024,
                                         num_sms=132)
    assert size[0] > 0
    with pytest.raises(TypeError, match="q_dtype"):
        _C.BatchDecode.workspace_size("float8_e4m3fn", "float8_e4m3fn", "float16", 128, 32, 8, 16, "NHD", 16, 1024,
                                      num_sms=132)


def fp8_bits(x, kv_dtype):
    """x rounded to fp8 as uint8 codes, through the C++ conversion (the CPU append of one-token pages)."""
    n, h, d = x.shape
    cache = np.zeros((n, 1, h, d), np.uint8)  # the public path needs ml_dtypes arrays; the binding takes uint8 + the name
    _C.append_paged_kv_cache(x, x, np.zeros(n, np.int32), np.arange(n, dtype=np.int32), cache, cache.copy(),
                             np.arange(n, dtype=np.int32), np.array([0, n], np.int32), np.array([1], np.int32), "NHD",
                             0, cache_dtype=kv_dtype)
    return cache[:, 0]


@pytest.mark.parametrize("kv_dtype", FP8)
def test_fp8_cpu_attention_matches_reference(rng, kv_dtype):
    """The C++ CPU path on fp8 K / V (uint8 codes named by kv_dtype) with scales, against the float64 reference."""
    q = rng.uniform(-2, 2, (1, 8, 64)).astype(np.float16)
    k = fp8_bits(rng.uniform(-200, 200, (50, 2, 64)).astype(np.float16), kv_dtype)
    v = fp8_bits(rng.uniform(-200, 200, (50, 2, 64)).astype(np.float16), kv_dtype)
    ref_o, ref_lse = _C.reference_attention_ragged(q, [0, 1], k, v, [0, 50], kv_dtype=kv_dtype, k_scale=KS,
                                                   v_scale=VS)
    o, lse = np.empty((1, 8, 64), np.float32), np.empty((1, 8), np.float32)
    _C.cpu_attention_ragged(q, [0, 1], k, v, [0, 50], o, lse, kv_dtype=kv_dtype, k_scale=KS, v_scale=VS)
    assert rel_error(o, ref_o) < 1e-4
    np.testing.assert_allclose(lse, ref_lse, rtol=1e-5)
    with pytest.raises(TypeError, match="k"):
        _C.cpu_attention_ragged(q, [0, 1], k, v, [0, 50], o, lse)  # uint8 without its fp8 name


def test_fp8_public_cpu_path_with_ml_dtypes(rng):
    """numpy fp8 arrays (ml_dtypes) through single_decode_with_kv_cache and append_paged_kv_cache on the CPU."""
    ml_dtypes = pytest.importorskip("ml_dtypes")
    k16 = rng.uniform(-3, 3, (20, 2, 64)).astype(np.float16)
    cache = np.zeros((20, 1, 2, 64), ml_dtypes.float8_e4m3fn)
    vcache = np.zeros_like(cache)
    n = 20
    tessera.append_paged_kv_cache(k16, k16, np.zeros(n, np.int32), np.arange(n, dtype=np.int32), (cache, vcache),
                                  np.arange(n, dtype=np.int32), np.array([0, n], np.int32), np.array([1], np.int32),
                                  k_scale=0.01, v_scale=0.01)
    want = (k16.astype(np.float32) / np.float32(0.01)).astype(ml_dtypes.float8_e4m3fn)
    np.testing.assert_array_equal(cache[:, 0].view(np.uint8), want.view(np.uint8))
    q = rng.uniform(-2, 2, (8, 64)).astype(np.float16)
    o = tessera.single_decode_with_kv_cache(q, cache[:, 0], vcache[:, 0], k_scale=0.01, v_scale=0.01)
    kd = cache[:, 0].astype(np.float64) * 0.01
    from conftest import ref_decode

    ref_o, _ = ref_decode(q, kd, kd)
    assert rel_error(o, ref_o) < TOL["float16"]
