"""rope_quantize_fp8, mla_rope_quantize_fp8 and rope_quantize_fp8_append_paged_kv_cache (flashinfer.rope
names): argument checks that raise before any GPU work and the CPU path against a numpy reference (numpy
everywhere: uint8 outputs stand for the fp8 dtype named by quantize_dtype); on a GPU, the fused kernel
against a torch composition (torch RoPE in float32, then (x * scale) clamped and cast to the fp8 dtype),
byte for byte, with poisoned outputs and caches (skipped with "skipped: no GPU")."""

import contextlib

import numpy as np
import pytest

import tessera
from tessera import rope as R

FP8 = ("float8_e4m3fn", "float8_e5m2")


# ---------------------------------------------------------------- numpy reference (independent of Tessera)
def fp8_table(name):
    """Value of every non-NaN code of the format (NaN codes: nan)."""
    man_bits, bias = (3, 7) if name == "float8_e4m3fn" else (2, 15)
    codes = np.arange(256)
    sign = np.where(codes & 0x80, -1.0, 1.0)
    exp = (codes >> man_bits) & ((1 << (7 - man_bits)) - 1)
    man = codes & ((1 << man_bits) - 1)
    val = np.where(exp == 0, man / (1 << man_bits) * 2.0 ** (1 - bias), (1 + man / (1 << man_bits)) * 2.0 ** (exp - bias))
    val = sign * val
    if name == "float8_e4m3fn":
        val[(codes & 0x7F) == 0x7F] = np.nan
    else:
        val[exp == 31] = np.nan  # inf and NaN codes: never produced by saturating rounding
    return val


def to_fp8(x, name):
    """Round-to-nearest-even, saturating, into fp8 codes (NaN -> 0x7f): the nearest code of the value's
    sign (so a tiny negative value gives -0), a tie going to the even code."""
    table = fp8_table(name)
    big = np.nanmax(table)
    x = np.asarray(x, dtype=np.float64).ravel()
    out = np.empty(x.size, dtype=np.uint8)
    for i, v in enumerate(x):
        if np.isnan(v):
            out[i] = 0x7F
            continue
        half = np.arange(128) + (0x80 if np.signbit(v) else 0)  # codes of v's sign
        vals = table[half]
        ok = ~np.isnan(vals)
        codes, d = half[ok], np.abs(vals[ok] - min(max(v, -big), big))
        best = codes[d == d.min()]
        even = [c for c in best if c % 2 == 0]
        out[i] = even[0] if even else best[0]
    return out


def np_rope(x, cos_sin, pos, is_neox):
    """float32 RoPE with one rounding per operation; x [..., rope_dim] rows of nnz tokens."""
    x = x.astype(np.float32)
    half = x.shape[-1] // 2
    cs = cos_sin[pos]
    c, s = cs[:, :half], cs[:, half:]
    if x.ndim == 3:
        c, s = c[:, None, :], s[:, None, :]
    if is_neox:
        a, b = x[..., :half], x[..., half:]
        return np.concatenate([a * c - b * s, b * c + a * s], axis=-1)
    a, b = x[..., 0::2], x[..., 1::2]
    return np.stack([a * c - b * s, b * c + a * s], axis=-1).reshape(x.shape)


def np_quant(x, scale, name):
    return to_fp8(x.astype(np.float32) * np.float32(scale), name).reshape(x.shape)


def cos_sin_cache(rows, rope_dim):
    j = np.arange(rope_dim // 2)
    a = np.arange(rows)[:, None] * 1e4 ** (-2.0 * j / rope_dim)[None, :]
    return np.concatenate([np.cos(a), np.sin(a)], axis=1).astype(np.float32)


# ---------------------------------------------------------------- CPU: argument checks
def _args(nnz=3, hq=4, hk=2, rd=64, nd=64):
    rng = np.random.default_rng(0)
    return dict(q_rope=rng.standard_normal((nnz, hq, rd)).astype(np.float16),
                k_rope=rng.standard_normal((nnz, hk, rd)).astype(np.float16),
                q_nope=rng.standard_normal((nnz, hq, nd)).astype(np.float16),
                k_nope=rng.standard_normal((nnz, hk, nd)).astype(np.float16),
                cos_sin_cache=cos_sin_cache(32, rd), pos_ids=np.arange(nnz, dtype=np.int32))


def _paged(nnz=3, hk=2, page_size=4, layout="NHD", **kw):
    a = _args(nnz=nnz, hk=hk, **kw)
    d = a["q_rope"].shape[2] + a["q_nope"].shape[2]
    shape = (4, page_size, hk, d) if layout == "NHD" else (4, hk, page_size, d)
    a.update(v=np.random.default_rng(1).standard_normal((nnz, hk, d)).astype(np.float16),
             paged_kv_cache=(np.full(shape, 0xFF, np.uint8), np.full(shape, 0xFF, np.uint8)),
             kv_indices=np.array([2, 0, 3, 1], np.int32), kv_indptr=np.array([0, 2, 4], np.int32),
             batch_indices=np.array([1, 0, -1][:nnz], np.int32), positions=np.array([5, 1, 0][:nnz], np.int32),
             page_size=page_size, kv_layout=layout, quantize_dtype="float8_e4m3fn")
    a["q_rope_out"] = np.full(a["q_rope"].shape, 0xFF, np.uint8)
    a["q_nope_out"] = np.full(a["q_nope"].shape, 0xFF, np.uint8)
    return a


@pytest.mark.parametrize("edit, exc, needle", [
    (dict(cos_sin_cache=np.zeros((32, 64))), ValueError, "cos_sin_cache"),
    (dict(q_rope=np.zeros((3, 64), np.float16)), ValueError, "q_rope"),
    (dict(k_rope=np.zeros((3, 2, 2, 64), np.float16)), ValueError, "k_rope"),
    (dict(is_neox="yes"), TypeError, "is_neox"),
    (dict(quant_scale_q="1"), TypeError, "quant_scale_q"),
    (dict(quantize_dtype="float16"), ValueError, "quantize_dtype"),
    (dict(backend="triton"), ValueError, "backend"),
])
def test_rope_quantize_fp8_argument_errors(edit, exc, needle):
    a = _args()
    a.update(edit)
    with pytest.raises(exc, match=needle):
        R.rope_quantize_fp8(**a)


@pytest.mark.parametrize("edit, exc, needle", [
    (dict(v=None), ValueError, "v"),
    (dict(paged_kv_cache=np.zeros((4, 4, 2, 128), np.uint8)), ValueError, "paged_kv_cache"),
    (dict(kv_layout="NDH"), ValueError, "kv_layout"),
    (dict(page_size=16), ValueError, "page_size"),
    (dict(page_size=4.0), TypeError, "page_size"),
    (dict(quantize_dtype="float8_e5m2", q_rope_out=None, q_nope_out=None,
          paged_kv_cache=(np.zeros((4, 4, 2, 128), np.float16),) * 2), ValueError, "paged_kv_cache"),
    (dict(batch_indices=np.array([2, 0, -1], np.int32)), ValueError, "batch_indices"),
    (dict(positions=np.array([9, 1, 0], np.int32)), ValueError, "positions"),
    (dict(pos_ids=np.array([0, 1, 40], np.int32)), ValueError, "pos_ids"),
    (dict(q_rope_out=np.zeros((3, 4, 64), np.float16)), (TypeError, ValueError), "q_rope_out"),
])
def test_append_argument_errors_write_nothing(edit, exc, needle):
    a = _paged()
    a.update(edit)
    before = [np.array(c) for c in a["paged_kv_cache"]] if isinstance(a["paged_kv_cache"], tuple) else None
    with pytest.raises(exc, match=needle):
        R.rope_quantize_fp8_append_paged_kv_cache(**a)
    if before is not None:
        for b, c in zip(before, a["paged_kv_cache"]):
            assert np.array_equal(b, c)


def test_mla_rejects_v():
    a = _paged()
    a["k_rope"], a["k_nope"] = a["k_rope"][:, 0], a["k_nope"][:, 0]
    with pytest.raises(ValueError, match="v"):
        R.rope_quantize_fp8_append_paged_kv_cache(**a)


def test_exported_where_flashinfer_has_them():
    for name in ("rope_quantize_fp8", "mla_rope_quantize_fp8", "rope_quantize_fp8_append_paged_kv_cache"):
        assert callable(getattr(tessera.rope, name))


# ---------------------------------------------------------------- CPU path against numpy
@pytest.mark.parametrize("layout", ["NHD", "HND"])
@pytest.mark.parametrize("is_neox", [True, False])
def test_cpu_append_matches_numpy(layout, is_neox):
    a = _paged(layout=layout)
    a.update(is_neox=is_neox, quant_scale_q=64.0, quant_scale_kv=0.5)
    R.rope_quantize_fp8_append_paged_kv_cache(**a)
    name, pos = "float8_e4m3fn", a["pos_ids"]
    q = np_quant(np_rope(a["q_rope"], a["cos_sin_cache"], pos, is_neox), 64.0, name)
    qn = np_quant(a["q_nope"], 64.0, name)
    assert np.array_equal(a["q_rope_out"][:2], q[:2]) and np.array_equal(a["q_nope_out"][:2], qn[:2])
    assert (a["q_rope_out"][2] == 0xFF).all()  # padding token: untouched
    k = np.concatenate([np_rope(a["k_rope"], a["cos_sin_cache"], pos, is_neox), a["k_nope"].astype(np.float32)], -1)
    kq, vq = np_quant(k, 0.5, name), np_quant(a["v"], 0.5, name)
    want_k, want_v = np.full_like(a["paged_kv_cache"][0], 0xFF), np.full_like(a["paged_kv_cache"][1], 0xFF)
    for i in range(2):
        b, p = a["batch_indices"][i], a["positions"][i]
        page, slot = a["kv_indices"][a["kv_indptr"][b] + p // 4], p % 4
        for h in range(2):
            at = (page, slot, h) if layout == "NHD" else (page, h, slot)
            want_k[at], want_v[at] = kq[i, h], vq[i, h]
    assert np.array_equal(a["paged_kv_cache"][0], want_k)
    assert np.array_equal(a["paged_kv_cache"][1], want_v)


# ---------------------------------------------------------------- GPU: against a torch composition
def t_rope(torch, x, cs, pos, is_neox):
    x = x.float()
    half = x.shape[-1] // 2
    c, s = cs[pos.long(), :half], cs[pos.long(), half:]
    if x.dim() == 3:
        c, s = c[:, None, :], s[:, None, :]
    if is_neox:
        a, b = x[..., :half], x[..., half:]
        return torch.cat([a * c - b * s, b * c + a * s], dim=-1)
    a, b = x[..., 0::2], x[..., 1::2]
    return torch.stack([a * c - b * s, b * c + a * s], dim=-1).flatten(-2)


def t_quant(torch, x, scale, dt):
    big = torch.finfo(dt).max
    return (x.float() * scale).clamp(-big, big).to(dt)


def _gpu_case(torch, dtype, nnz=40, hq=8, hk=2, rd=64, nd=64, mla=False, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    mk = lambda *s: (torch.rand(*s, generator=g, device="cuda") * 16 - 8).to(dtype)  # noqa: E731
    kshape = (nnz,) if mla else (nnz, hk)
    cs = torch.from_numpy(cos_sin_cache(300, rd)).cuda()
    pos = torch.randint(0, 300, (nnz,), generator=g, device="cuda", dtype=torch.int32)
    return mk(nnz, hq, rd), mk(*kshape, rd), mk(nnz, hq, nd), mk(*kshape, nd), cs, pos


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("fp8", FP8)
@pytest.mark.parametrize("is_neox", [True, False])
def test_gpu_rope_quantize_fp8(torch_cuda, dtype, fp8, is_neox):
    torch = torch_cuda
    dt, qd = getattr(torch, dtype), getattr(torch, fp8)
    for mla in (False, True):
        qr, kr, qn, kn, cs, pos = _gpu_case(torch, dt, mla=mla)
        fn = R.mla_rope_quantize_fp8 if mla else R.rope_quantize_fp8
        outs = fn(qr, kr, qn, kn, cs, pos, is_neox=is_neox, quantize_dtype=qd, quant_scale_q=64.0,
                  quant_scale_kv=0.5)
        want = (t_quant(torch, t_rope(torch, qr, cs, pos, is_neox), 64.0, qd),
                t_quant(torch, t_rope(torch, kr, cs, pos, is_neox), 0.5, qd),
                t_quant(torch, qn, 64.0, qd), t_quant(torch, kn, 0.5, qd))
        for got, w in zip(outs, want):
            assert got.dtype == qd and got.shape == w.shape
            assert torch.equal(got.view(torch.uint8), w.view(torch.uint8))


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("fp8", FP8)
@pytest.mark.parametrize("layout", ["NHD", "HND"])
@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("is_neox", [True, False])
def test_gpu_append_paged_kv_cache(torch_cuda, dtype, fp8, layout, page_size, is_neox):
    torch = torch_cuda
    dt, qd = getattr(torch, dtype), getattr(torch, fp8)
    lens_old, lens_add = [0, 5, 16, 31, 7], [3, 1, 1, 2, 20]
    nnz = sum(lens_add) + 2  # two padding tokens
    hq, hk, rd, nd = 8, 2, 64, 64
    qr, kr, qn, kn, cs, pos = _gpu_case(torch, dt, nnz=nnz, hq=hq, hk=hk, rd=rd, nd=nd, seed=page_size)
    v = (torch.rand(nnz, hk, rd + nd, device="cuda") * 16 - 8).to(dt)
    seq = [o + a for o, a in zip(lens_old, lens_add)]
    pages = [(n + page_size - 1) // page_size for n in seq]
    num_pages = sum(pages) + 3
    kv_indices = torch.randperm(num_pages, device="cuda")[:sum(pages)].int()
    kv_indptr = torch.tensor(np.concatenate([[0], np.cumsum(pages)]), dtype=torch.int32, device="cuda")
    append_indptr = torch.tensor(np.concatenate([[0], np.cumsum(lens_add)]), dtype=torch.int32, device="cuda")
    bi, po = tessera.get_batch_indices_positions(append_indptr, torch.tensor(seq, device="cuda", dtype=torch.int32), nnz)
    shape = (num_pages, page_size, hk, rd + nd) if layout == "NHD" else (num_pages, hk, page_size, rd + nd)
    k_cache = torch.full(shape, 0xFF, dtype=torch.uint8, device="cuda").view(qd)
    v_cache = torch.full(shape, 0xFF, dtype=torch.uint8, device="cuda").view(qd)
    q_rope_out = torch.full(qr.shape, 0xFF, dtype=torch.uint8, device="cuda").view(qd)
    q_nope_out = torch.full(qn.shape, 0xFF, dtype=torch.uint8, device="cuda").view(qd)
    want_k, want_v = k_cache.view(torch.uint8).clone(), v_cache.view(torch.uint8).clone()
    got_q = R.rope_quantize_fp8_append_paged_kv_cache(
        qr, kr, qn, kn, v, cs, pos, (k_cache, v_cache), kv_indices, kv_indptr, bi, po, is_neox=is_neox,
        quant_scale_q=64.0, quant_scale_kv=0.5, page_size=page_size, kv_layout=layout, q_rope_out=q_rope_out,
        q_nope_out=q_nope_out)
    assert got_q[0] is q_rope_out and got_q[1] is q_nope_out
    valid = bi >= 0
    wq = t_quant(torch, t_rope(torch, qr, cs, pos, is_neox), 64.0, qd).view(torch.uint8)
    wqn = t_quant(torch, qn, 64.0, qd).view(torch.uint8)
    assert torch.equal(q_rope_out.view(torch.uint8)[valid], wq[valid])
    assert torch.equal(q_nope_out.view(torch.uint8)[valid], wqn[valid])
    assert (q_rope_out.view(torch.uint8)[~valid] == 0xFF).all()  # padding: untouched
    k_full = torch.cat([t_rope(torch, kr, cs, pos, is_neox), kn.float()], dim=-1)
    kq, vq = t_quant(torch, k_full, 0.5, qd).view(torch.uint8), t_quant(torch, v, 0.5, qd).view(torch.uint8)
    b, p = bi[valid].long(), po[valid].long()
    page = kv_indices[(kv_indptr[b] + p // page_size).long()].long()
    slot = p % page_size
    if layout == "NHD":
        want_k[page, slot], want_v[page, slot] = kq[valid], vq[valid]
    else:
        want_k[page, :, slot], want_v[page, :, slot] = kq[valid], vq[valid]
    assert torch.equal(k_cache.view(torch.uint8), want_k)
    assert torch.equal(v_cache.view(torch.uint8), want_v)


@pytest.mark.parametrize("fp8", FP8)
def test_gpu_append_mla(torch_cuda, fp8):
    torch = torch_cuda
    qd, page_size, nnz = getattr(torch, fp8), 16, 20
    qr, kr, qn, kn, cs, pos = _gpu_case(torch, torch.bfloat16, nnz=nnz, hq=16, rd=64, nd=512, mla=True)
    kv_indices = torch.tensor([3, 1], dtype=torch.int32, device="cuda")
    kv_indptr = torch.tensor([0, 2], dtype=torch.int32, device="cuda")
    bi = torch.zeros(nnz, dtype=torch.int32, device="cuda")
    po = torch.arange(5, 5 + nnz, dtype=torch.int32, device="cuda")
    ckv = torch.full((4, page_size, 512), 0xFF, dtype=torch.uint8, device="cuda").view(qd)
    kpe = torch.full((4, page_size, 64), 0xFF, dtype=torch.uint8, device="cuda").view(qd)
    want_ckv, want_kpe = ckv.view(torch.uint8).clone(), kpe.view(torch.uint8).clone()
    q_rope_out, q_nope_out = R.rope_quantize_fp8_append_paged_kv_cache(
        qr, kr, qn, kn, None, cs, pos, (ckv, kpe), kv_indices, kv_indptr, bi, po, quantize_dtype=qd,
        quant_scale_q=2.0, quant_scale_kv=0.25, page_size=page_size)
    assert q_rope_out.dtype == qd
    assert torch.equal(q_rope_out.view(torch.uint8), t_quant(torch, t_rope(torch, qr, cs, pos, True), 2.0, qd).view(torch.uint8))
    assert torch.equal(q_nope_out.view(torch.uint8), t_quant(torch, qn, 2.0, qd).view(torch.uint8))
    page = kv_indices[(po // page_size).long()].long()
    slot = (po % page_size).long()
    want_ckv[page, slot] = t_quant(torch, kn, 0.25, qd).view(torch.uint8)
    want_kpe[page, slot] = t_quant(torch, t_rope(torch, kr, cs, pos, True), 0.25, qd).view(torch.uint8)
    assert torch.equal(ckv.view(torch.uint8), want_ckv)
    assert torch.equal(kpe.view(torch.uint8), want_kpe)


# ---------------------------------------------------------------- page tables that grow under a CUDA graph
def test_append_passes_buffer_capacity(monkeypatch):
    """CUDA calls hand the bindings max_batch = capacity(kv_indptr) - 1 and max_indices = capacity(kv_indices)
    (to the end of the buffers behind int32 views); an int64 table (converted) is bounded by its own length.
    The bindings are stubbed and CPU tensors stand in for CUDA ones."""
    torch = pytest.importorskip("torch")
    from tessera import _tensors as T

    calls = []
    monkeypatch.setattr(T, "is_cuda", T.is_torch)
    monkeypatch.setattr(T, "on_device_of", lambda x: contextlib.nullcontext())
    monkeypatch.setattr(T, "stream_of", lambda x: 0)
    monkeypatch.setattr(R, "_C", type("C", (), {"rope_quantize_fp8": staticmethod(lambda *a, **kw: calls.append(kw))}))
    a = _paged()
    a = {k: torch.from_numpy(x) if isinstance(x, np.ndarray) else x for k, x in a.items()}
    a["paged_kv_cache"] = tuple(torch.from_numpy(c) for c in _paged()["paged_kv_cache"])
    indptr_buf, indices_buf = torch.zeros(10, dtype=torch.int32), torch.zeros(50, dtype=torch.int32)
    indptr_buf[:3], indices_buf[:4] = a["kv_indptr"], a["kv_indices"]
    R.rope_quantize_fp8_append_paged_kv_cache(**dict(a, kv_indptr=indptr_buf[:3], kv_indices=indices_buf[:4]))
    assert calls[-1]["max_batch"] == 9 and calls[-1]["max_indices"] == 50
    R.rope_quantize_fp8_append_paged_kv_cache(**dict(a, kv_indptr=indptr_buf[:3].long(), kv_indices=indices_buf[6:10]))
    assert calls[-1]["max_batch"] == 2 and calls[-1]["max_indices"] == 44


@pytest.mark.parametrize("mla", [False, True])
def test_gpu_append_graph_tables_grow(torch_cuda, rng, mla):
    """A CUDA graph captured with views of preallocated int32 tables for two requests (kv_indptr_buf[:3],
    kv_indices_buf[:n]) writes, on replay, every token of the larger tables written into the same buffers since
    (more requests, more pages) into its slot: K / V (or ckv / kpe) and q byte for byte against the torch
    composition, padding tokens (batch index -1) and every other cache byte untouched (poisoned)."""
    torch = torch_cuda
    dt, qd, page_size, num_pages, max_batch, nnz = torch.bfloat16, torch.float8_e4m3fn, 16, 64, 10, 48
    hq, hk, rd, nd = (16, 1, 64, 512) if mla else (8, 2, 64, 64)
    qr, kr, qn, kn, cs, pos = _gpu_case(torch, dt, nnz=nnz, hq=hq, hk=hk, rd=rd, nd=nd, mla=mla, seed=7)
    v = None if mla else (torch.rand(nnz, hk, rd + nd, device="cuda") * 16 - 8).to(dt)
    shapes = ((num_pages, page_size, nd), (num_pages, page_size, rd)) if mla else ((num_pages, page_size, hk, rd + nd),) * 2
    cache = tuple(torch.empty(s, dtype=torch.uint8, device="cuda").view(qd) for s in shapes)
    q_rope_out = torch.empty(qr.shape, dtype=torch.uint8, device="cuda").view(qd)
    q_nope_out = torch.empty(qn.shape, dtype=torch.uint8, device="cuda").view(qd)
    indptr_buf = torch.zeros(max_batch + 1, dtype=torch.int32, device="cuda")
    indices_buf = torch.zeros(num_pages, dtype=torch.int32, device="cuda")
    bi = torch.full((nnz,), -1, dtype=torch.int32, device="cuda")
    po = torch.zeros(nnz, dtype=torch.int32, device="cuda")

    def write_step(old, add):
        """The step's page table, batch indices and positions written into the buffers; returns the table."""
        seq = [o + a for o, a in zip(old, add)]
        pages = [(n + page_size - 1) // page_size for n in seq]
        indptr = np.concatenate([[0], np.cumsum(pages)]).astype(np.int32)
        indices = rng.permutation(num_pages)[:indptr[-1]].astype(np.int32)
        indptr_buf[:len(indptr)].copy_(torch.from_numpy(indptr))
        indices_buf[:len(indices)].copy_(torch.from_numpy(indices))
        append_indptr = torch.tensor(np.concatenate([[0], np.cumsum(add)]), dtype=torch.int32, device="cuda")
        tessera.get_batch_indices_positions(append_indptr, torch.tensor(seq, dtype=torch.int32, device="cuda"), nnz,
                                            batch_indices=bi, positions=po)
        return indptr, indices

    def poison():
        for t in cache + (q_rope_out, q_nope_out):
            t.view(torch.uint8).fill_(0xFF)

    n_small = int(write_step([5, 20], [2, 3])[0][-1])

    def append():
        R.rope_quantize_fp8_append_paged_kv_cache(
            qr, kr, qn, kn, v, cs, pos, cache, indices_buf[:n_small], indptr_buf[:3], bi, po, quantize_dtype=qd,
            quant_scale_q=64.0, quant_scale_kv=0.5, page_size=page_size, q_rope_out=q_rope_out,
            q_nope_out=q_nope_out)

    append()  # warm-up outside the capture (loads the kernel)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        append()
    want_q = (t_quant(torch, t_rope(torch, qr, cs, pos, True), 64.0, qd).view(torch.uint8),
              t_quant(torch, qn, 64.0, qd).view(torch.uint8))
    k_full = t_rope(torch, kr, cs, pos, True) if mla else torch.cat([t_rope(torch, kr, cs, pos, True), kn.float()], -1)
    rows = ((t_quant(torch, kn, 0.5, qd), t_quant(torch, k_full, 0.5, qd)) if mla
            else (t_quant(torch, k_full, 0.5, qd), t_quant(torch, v, 0.5, qd)))
    for old, add in (([5, 20, 0, 31, 100, 7, 16, 2], [2, 3, 4, 1, 9, 1, 1, 20]), ([64, 0, 3, 200], [1, 30, 1, 1])):
        indptr, indices = write_step(old, add)
        assert indptr[-1] > n_small
        poison()
        graph.replay()
        torch.cuda.synchronize()
        b, p = bi.cpu().numpy(), po.cpu().numpy()
        valid = b >= 0
        assert valid.sum() == sum(add)
        page = torch.from_numpy(indices[indptr[b[valid]] + p[valid] // page_size]).long().cuda()
        slot = torch.from_numpy(p[valid] % page_size).long().cuda()
        vt = torch.from_numpy(valid).cuda()
        for got, w in zip((q_rope_out, q_nope_out), want_q):
            assert torch.equal(got.view(torch.uint8)[vt], w[vt])
            assert (got.view(torch.uint8)[~vt] == 0xFF).all()  # padding: untouched
        for c, r in zip(cache, rows):
            want = torch.full_like(c.view(torch.uint8), 0xFF)
            want[page, slot] = r.view(torch.uint8)[vt]
            assert torch.equal(c.view(torch.uint8), want)


@pytest.mark.parametrize("mla", [False, True])
def test_cpu_unpaged_matches_numpy(mla):
    """rope_quantize_fp8 / mla_rope_quantize_fp8 on host arrays, no non-rotary part (None), e5m2."""
    a = _args(nd=0)
    kr = a["k_rope"][:, 0] if mla else a["k_rope"]
    qo, ko = np.full(a["q_rope"].shape, 0xFF, np.uint8), np.full(kr.shape, 0xFF, np.uint8)
    qno, kno = np.zeros((3, 4, 0), np.uint8), np.zeros(kr.shape[:-1] + (0,), np.uint8)
    fn = R.mla_rope_quantize_fp8 if mla else R.rope_quantize_fp8
    out = fn(a["q_rope"], kr, None, None, a["cos_sin_cache"], a["pos_ids"], False, "float8_e5m2", 2.0, 3.0, qo, ko,
             qno, kno)
    assert out[0] is qo and out[1] is ko
    cs, pos = a["cos_sin_cache"], a["pos_ids"]
    assert np.array_equal(qo, np_quant(np_rope(a["q_rope"], cs, pos, False), 2.0, "float8_e5m2"))
    assert np.array_equal(ko, np_quant(np_rope(kr, cs, pos, False), 3.0, "float8_e5m2"))
