"""Attention variants from Python: specs (built-ins and user code with extras),
tessera.AttentionWrapper with extras passed by keyword, and the RoPE ops.

The user variant is the docs' example (read from docs/variants.md, so the
documented code is what runs): one extra tensor (head_scale) and two extra
scalars (decay, max_distance). References are float64 numpy written from the
formulas. GPU tests poison outputs (NaN never passes) and skip with
"skipped: no GPU"; CPU tests check spec validation and the RoPE ops' CPU path.
"""

import os
import re

import numpy as np
import pytest

import tessera
from conftest import TOL, rel_error, to_np

DOCS = os.path.join(os.path.dirname(__file__), "..", "..", "docs", "variants.md")


def docs_example_code():
    """The first ```cpp block of docs/variants.md (the example variant)."""
    with open(DOCS) as f:
        return re.search(r"```cpp\n(.*?)```", f.read(), re.S).group(1)


def docs_spec():
    return tessera.VariantSpec("DecayBias", docs_example_code(), extra_tensors={"head_scale": "float32"},
                               extra_scalars={"decay": "float32", "max_distance": "int32"})


def rope_np(x, pos, interleave, scale=1.0, theta=1e4):
    """x [n, H, D] rotated at positions pos [n] (float64)."""
    x = np.array(x, dtype=np.float64)
    d = x.shape[-1]
    j = np.arange(d // 2)
    ang = (np.asarray(pos, dtype=np.float64)[:, None] / scale) * theta ** (-2.0 * j / d)
    c, s = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
    a, b = (2 * j, 2 * j + 1) if interleave else (j, j + d // 2)
    xa, xb = x[..., a].copy(), x[..., b].copy()
    x[..., a], x[..., b] = xa * c - xb * s, xb * c + xa * s
    return x


def ref_attention(q, k, v, logits_fn=None, causal=False, rope=None):
    """One request: q [nq, Hq, D], k/v [nk, Hkv, D]; logits_fn(logits [Hq, nq, nk], q_pos, kv_pos) -> logits."""
    q, k, v = (np.asarray(x, dtype=np.float64) for x in (q, k, v))
    nq, hq, d = q.shape
    nk, hkv = k.shape[0], k.shape[1]
    q_pos, kv_pos = np.arange(nq) + nk - nq, np.arange(nk)
    if rope is not None:
        q, k = rope_np(q, q_pos, **rope), rope_np(k, kv_pos, **rope)
    kk, vv = np.repeat(k, hq // hkv, axis=1), np.repeat(v, hq // hkv, axis=1)
    logits = np.einsum("qhd,khd->hqk", q, kk) / np.sqrt(d)
    if logits_fn is not None:
        logits = logits_fn(logits, q_pos, kv_pos)
    if causal:
        logits = np.where(kv_pos[None, None, :] <= q_pos[None, :, None], logits, -np.inf)
    m = logits.max(-1, keepdims=True)
    p = np.exp(logits - m)
    return np.einsum("hqk,khd->qhd", p / p.sum(-1, keepdims=True), vv)


def docs_logits(head_scale, decay, max_distance):
    def fn(logits, q_pos, kv_pos):
        clipped = np.clip(q_pos[:, None] - kv_pos[None, :], 0, max_distance)
        return logits * np.asarray(head_scale, dtype=np.float64)[:, None, None] - decay * clipped[None]
    return fn


# ------------------------------------------------------------------ CPU
def test_builtin_specs():
    a = tessera.variants.alibi(causal=True)
    assert a.name == "CausalAlibi" and a.causal and a.extra_tensors == (("alibi_slopes", "float32"),)
    s = tessera.variants.flash_sigmoid()
    assert not s.use_softmax and [n for n, _ in s.extra_scalars] == ["sigmoid_scale", "sigmoid_bias"]
    assert tessera.variants.attention_sink().extra_scalars == (("sink_size", "int32"), ("window_left", "int32"))
    r = tessera.variants.rope(interleave=True)
    assert not r.code and r.headers == ("tessera/device/variants/rope.cuh",) and "kAdjacent" in r.struct_name
    assert tessera.variants.soft_cap(30, causal=True).name == "CausalSoftCap_30"
    np.testing.assert_allclose(tessera.variants.alibi_slopes(4), [2 ** -2, 2 ** -4, 2 ** -6, 2 ** -8])
    assert docs_spec().extra_scalars == (("decay", "float32"), ("max_distance", "int32"))


def test_window_left_reaches_the_scheduler():
    # The built-in declares its window (the planners skip keys left of it);
    # a user spec may declare one too, and a bad one is an error.
    assert tessera.variants.sliding_window(1024, causal=True).window_left == 1024
    assert tessera.variants.causal().window_left == -1
    code = "struct V : tessera::VariantBase {};"
    assert tessera.VariantSpec("V", code, window_left=16).window_left == 16
    with pytest.raises(ValueError, match="window_left"):
        tessera.VariantSpec("V", code, window_left=-2)
    with pytest.raises(TypeError, match="window_left"):
        tessera.VariantSpec("V", code, window_left=1.5)


def test_spec_errors_name_the_argument():
    code = "struct V : tessera::VariantBase {};"
    with pytest.raises(ValueError, match="variant.name"):
        tessera.VariantSpec("not an identifier", code)
    with pytest.raises(ValueError, match="scale: declared twice"):
        tessera.VariantSpec("V", code, extra_scalars={"scale": "float"}, extra_tensors={"scale": "float32"})
    with pytest.raises(TypeError, match="extra_scalars"):
        tessera.VariantSpec("V", code, extra_scalars={"scale": "float16"})
    with pytest.raises(TypeError, match="extra_tensors"):
        tessera.VariantSpec("V", code, extra_tensors={"t": "complex64"})
    with pytest.raises(ValueError, match="keyword of run"):
        tessera.VariantSpec("V", code, extra_scalars={"sm_scale": "float"})
    with pytest.raises(ValueError, match="kind"):
        tessera.variants._builtin("nope")


def test_builtins_name_their_device_structs():
    # Built-ins carry no code: the C++ spec's header and struct, which the JIT includes and names.
    s = tessera.variants.soft_cap(30, causal=True)
    assert s.code == "" and s.headers == ("tessera/device/variants/soft_cap.cuh",)
    assert s.struct_name == "tessera::variants::SoftCap<0x41f00000u>" and s.causal
    assert tessera.variants.causal().struct_name == "tessera::variants::CausalAttention"
    assert tessera.variants.sliding_window(64).struct_name == "tessera::variants::SlidingWindow<64>"
    assert tessera.VariantSpec("V", "struct V : tessera::VariantBase {};").headers == ()
    header = ("tessera/device/variants/causal.cuh",)
    with pytest.raises(ValueError, match="variant.code"):
        tessera.VariantSpec("C", "struct C {};", headers=header, struct_name="tessera::variants::CausalAttention")
    with pytest.raises(ValueError, match="variant.headers"):
        tessera.VariantSpec("C", "", headers=("my_variant.cuh",), struct_name="C")
    with pytest.raises(TypeError, match="headers"):
        tessera.VariantSpec("C", "", headers="tessera/device/variants/causal.cuh", struct_name="C")


@pytest.mark.parametrize("interleave", [False, True])
def test_apply_rope_cpu(interleave, rng):
    q = rng.uniform(-2, 2, (7, 4, 128)).astype(np.float16)
    k = rng.uniform(-2, 2, (7, 2, 128)).astype(np.float16)
    pos = np.array([0, 3, 9, 100, 4000, 1, 2], dtype=np.int32)
    qr, kr = tessera.apply_rope_pos_ids(q, k, pos, interleave=interleave, rope_scale=2.0, rope_theta=5e5)
    assert rel_error(qr, rope_np(q, pos, interleave, 2.0, 5e5)) < TOL["float16"]
    assert rel_error(kr, rope_np(k, pos, interleave, 2.0, 5e5)) < TOL["float16"]
    # indptr / offsets: requests [0, 3) at 10 and [3, 7) at 0, in place.
    q2, k2 = q.copy(), k.copy()
    tessera.apply_rope_inplace(q2, k2, [0, 3, 7], [10, 0], interleave=interleave)
    want = rope_np(q, [10, 11, 12, 0, 1, 2, 3], interleave)
    assert rel_error(q2, want) < TOL["float16"]
    # rotary_dim: the last features stay as they were.
    q3, _ = tessera.apply_rope_pos_ids(q, k, pos, rotary_dim=64, interleave=interleave)
    np.testing.assert_array_equal(q3[..., 64:], q[..., 64:])


def test_apply_rope_errors():
    q, k = np.zeros((3, 4, 128), np.float16), np.zeros((3, 2, 128), np.float16)
    with pytest.raises(ValueError, match="rotary_dim"):
        tessera.apply_rope_pos_ids(q, k, [0, 1, 2], rotary_dim=24)
    with pytest.raises(ValueError, match="pos_ids"):
        tessera.apply_rope_pos_ids(q, k, [0, 1])
    with pytest.raises(TypeError, match="pos_ids"):
        tessera.apply_rope_pos_ids(q, k, np.zeros(3, np.float32))
    with pytest.raises(TypeError, match="k"):
        tessera.apply_rope_pos_ids(q, k.astype(np.float32), [0, 1, 2])
    with pytest.raises(ValueError, match="rope_theta"):
        tessera.apply_rope_pos_ids(q, k, [0, 1, 2], rope_theta=-1.0)
    with pytest.raises(ValueError, match="indptr"):
        tessera.apply_rope(q, k, [0, 2], [0])


# ------------------------------------------------------------------ GPU
def wrapper(torch, spec, hq=8, hkv=2, page_size=16, **kw):
    ws = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    task = tessera.TaskInfo(hq, hkv, page_size=page_size, max_batch=16, max_pages=1024, max_total_q=1024)
    return tessera.AttentionWrapper(spec, task, ws, **kw)


def paged(torch, rng, lens, page_size, hkv, d, dtype):
    """(indptr, indices, last, k_cache, v_cache) over shuffled pages, caches [pages, ps, hkv, d] on the GPU."""
    pages = [(n + page_size - 1) // page_size for n in lens]
    indptr = np.concatenate([[0], np.cumsum(pages)]).astype(np.int32)
    indices = rng.permutation(int(indptr[-1]) + 2)[: indptr[-1]].astype(np.int32)
    last = np.array([n - (p - 1) * page_size if p else 0 for n, p in zip(lens, pages)], dtype=np.int32)
    shape = (int(indptr[-1]) + 2, page_size, hkv, d)
    k = torch.empty(shape, dtype=dtype, device="cuda").uniform_(-1, 1)
    v = torch.empty(shape, dtype=dtype, device="cuda").uniform_(-1, 1)
    return indptr, indices, last, k, v


def gather(cache, indptr, indices, last, b, page_size):
    pages = indices[indptr[b]: indptr[b + 1]]
    n = 0 if len(pages) == 0 else (len(pages) - 1) * page_size + int(last[b])
    return to_np(cache)[pages].reshape(-1, cache.shape[2], cache.shape[3])[:n]


@pytest.mark.parametrize("dtype_name", ["float16", "bfloat16"])
def test_user_spec_with_extras_decode_and_prefill(torch_cuda, poison, rng, dtype_name):
    torch = torch_cuda
    dtype = getattr(torch, dtype_name)
    spec = tessera.AttentionSpec(docs_spec(), q_dtype=dtype, head_dim=128)
    head_scale = torch.tensor([0.5 + 0.25 * (h % 5) for h in range(8)], dtype=torch.float32, device="cuda")
    extras = dict(head_scale=head_scale, decay=0.05, max_distance=64)
    fn = docs_logits(to_np(head_scale), np.float32(0.05), 64)
    # Decode over a paged cache (every request one query: the wrapper picks decode).
    lens = [1, 70, 513, 2000]
    indptr, indices, last, kc, vc = paged(torch, rng, lens, 16, 2, 128, dtype)
    q = torch.empty(len(lens), 8, 128, dtype=dtype, device="cuda").uniform_(-2, 2)
    attn = wrapper(torch, spec)
    attn.plan(np.arange(len(lens) + 1, dtype=np.int32), indptr, indices, last)
    assert attn.kind == "decode"
    o = attn.run(q, (kc, vc), **extras)
    want = np.stack([ref_attention(to_np(q)[b:b + 1], gather(kc, indptr, indices, last, b, 16),
                                   gather(vc, indptr, indices, last, b, 16), fn)[0] for b in range(len(lens))])
    assert rel_error(to_np(o), want) < TOL[dtype_name]
    # Prefill over ragged KV.
    q_lens, kv_lens = [5, 37, 1], [9, 300, 40]
    qo, kvp = np.cumsum([0] + q_lens).astype(np.int32), np.cumsum([0] + kv_lens).astype(np.int32)
    qp = torch.empty(int(qo[-1]), 8, 128, dtype=dtype, device="cuda").uniform_(-2, 2)
    k = torch.empty(int(kvp[-1]), 2, 128, dtype=dtype, device="cuda").uniform_(-1, 1)
    v = torch.empty_like(k).uniform_(-1, 1)
    pre = wrapper(torch, spec)
    pre.plan_ragged(qo, kvp)
    assert pre.kind == "prefill"
    o = pre.run_ragged(qp, k, v, **extras)
    want = np.concatenate([ref_attention(to_np(qp)[qo[i]:qo[i + 1]], to_np(k)[kvp[i]:kvp[i + 1]],
                                         to_np(v)[kvp[i]:kvp[i + 1]], fn) for i in range(3)])
    assert rel_error(to_np(o), want) < TOL[dtype_name]


def test_wrong_or_missing_extras(torch_cuda, rng):
    torch = torch_cuda
    spec = tessera.AttentionSpec(docs_spec(), q_dtype=torch.float16, head_dim=128)
    indptr, indices, last, kc, vc = paged(torch, rng, [20, 40], 16, 2, 128, torch.float16)
    q = torch.zeros(2, 8, 128, dtype=torch.float16, device="cuda")
    attn = wrapper(torch, spec)
    attn.plan([0, 1, 2], indptr, indices, last)
    good = dict(head_scale=torch.ones(8, device="cuda"), decay=0.1, max_distance=4)
    attn.run(q, (kc, vc), **good)
    with pytest.raises(ValueError, match="max_distance: missing"):
        attn.run(q, (kc, vc), head_scale=good["head_scale"], decay=0.1)
    with pytest.raises(ValueError, match="decai: not an extra of variant DecayBias"):
        attn.run(q, (kc, vc), **good, decai=0.1)
    with pytest.raises(TypeError, match="head_scale"):
        attn.run(q, (kc, vc), **dict(good, head_scale=torch.ones(8, dtype=torch.float16, device="cuda")))
    with pytest.raises(TypeError, match="head_scale: expected device"):
        attn.run(q, (kc, vc), **dict(good, head_scale=torch.ones(8)))
    with pytest.raises(TypeError, match="max_distance: expected an int32 scalar"):
        attn.run(q, (kc, vc), **dict(good, max_distance=4.5))
    with pytest.raises(TypeError, match="max_distance"):
        attn.run(q, (kc, vc), **dict(good, max_distance=True))
    with pytest.raises(TypeError, match="decay: expected a float32 scalar, got a tensor"):
        attn.run(q, (kc, vc), **dict(good, decay=torch.ones(1, device="cuda")))
    with pytest.raises(ValueError, match="run_ragged"):
        attn.run_ragged(q, kc, vc, **good)


@pytest.mark.parametrize("variant", ["alibi", "rope"])
def test_builtin_decode(torch_cuda, poison, rng, variant):
    torch = torch_cuda
    lens = [3, 257, 1100]
    indptr, indices, last, kc, vc = paged(torch, rng, lens, 16, 2, 128, torch.float16)
    q = torch.empty(3, 8, 128, dtype=torch.float16, device="cuda").uniform_(-2, 2)
    if variant == "alibi":
        spec, slopes = tessera.variants.alibi(causal=True), tessera.variants.alibi_slopes(8)
        extras, kw = dict(alibi_slopes=torch.from_numpy(slopes).cuda()), {}
        fn = lambda lg, qp, kp: lg + slopes[:, None, None].astype(np.float64) * (kp[None, None, :] - qp[None, :, None])  # noqa: E731
    else:
        spec, fn = tessera.variants.rope(), None
        extras, kw = dict(rope_scale=1.0, rope_theta=1e4), dict(rope=dict(interleave=False))
    attn = wrapper(torch, tessera.AttentionSpec(spec, q_dtype=torch.float16))
    attn.plan([0, 1, 2, 3], indptr, indices, last)
    o, lse = attn.run(q, (kc, vc), return_lse=True, **extras)
    want = np.stack([ref_attention(to_np(q)[b:b + 1], gather(kc, indptr, indices, last, b, 16),
                                   gather(vc, indptr, indices, last, b, 16), fn, **kw)[0] for b in range(3)])
    assert rel_error(to_np(o), want) < TOL["float16"]
    assert not torch.isnan(lse).any()


@pytest.mark.parametrize("backend", ["auto", "fa2"])
def test_sliding_window_prefill_skips_keys_left_of_the_window(torch_cuda, poison, rng, backend):
    # Long rows with a short window: most tiles left of it are never loaded
    # (the plan starts each query tile at its window), and the result still
    # matches attention with the window mask.
    torch = torch_cuda
    window = 100
    spec = tessera.AttentionSpec(tessera.variants.sliding_window(window, causal=True), q_dtype=torch.float16)
    q_lens, kv_lens = [700, 3, 260], [700, 900, 1000]
    qo, kvp = np.cumsum([0] + q_lens).astype(np.int32), np.cumsum([0] + kv_lens).astype(np.int32)
    qp = torch.empty(int(qo[-1]), 8, 128, dtype=torch.float16, device="cuda").uniform_(-2, 2)
    k = torch.empty(int(kvp[-1]), 2, 128, dtype=torch.float16, device="cuda").uniform_(-1, 1)
    v = torch.empty_like(k).uniform_(-1, 1)
    pre = wrapper(torch, spec, backend=backend)
    pre.plan_ragged(qo, kvp)
    o = pre.run_ragged(qp, k, v)
    fn = lambda lg, qpos, kpos: np.where(kpos[None, None, :] >= qpos[None, :, None] - window, lg, -np.inf)  # noqa: E731
    want = np.concatenate([ref_attention(to_np(qp)[qo[i]:qo[i + 1]], to_np(k)[kvp[i]:kvp[i + 1]],
                                         to_np(v)[kvp[i]:kvp[i + 1]], fn, causal=True) for i in range(3)])
    assert rel_error(to_np(o), want) < TOL["float16"]


def test_graph_capture_with_extras(torch_cuda, rng):
    torch = torch_cuda
    spec = tessera.AttentionSpec(docs_spec(), q_dtype=torch.float16)
    indptr, indices, last, kc, vc = paged(torch, rng, [100, 900], 16, 2, 128, torch.float16)
    q = torch.empty(2, 8, 128, dtype=torch.float16, device="cuda").uniform_(-2, 2)
    out = torch.empty_like(q)
    extras = dict(head_scale=torch.full((8,), 0.75, device="cuda"), decay=0.01, max_distance=32)
    attn = wrapper(torch, spec, kind="decode")
    attn.plan([0, 1, 2], indptr, indices, last)
    attn.run(q, (kc, vc), out=out, **extras)  # warm-up (JIT, lazy loads) outside the capture
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        attn.run(q, (kc, vc), out=out, **extras)
    out.fill_(float("nan"))
    g.replay()
    torch.cuda.synchronize()
    fn = docs_logits(np.full(8, 0.75), np.float32(0.01), 32)
    want = np.stack([ref_attention(to_np(q)[b:b + 1], gather(kc, indptr, indices, last, b, 16),
                                   gather(vc, indptr, indices, last, b, 16), fn)[0] for b in range(2)])
    assert rel_error(to_np(out), want) < TOL["float16"]


@pytest.mark.parametrize("interleave", [False, True])
def test_apply_rope_gpu_matches_cpu(torch_cuda, rng, interleave):
    torch = torch_cuda
    q = torch.empty(300, 8, 128, dtype=torch.bfloat16).uniform_(-3, 3)
    k = torch.empty(300, 2, 128, dtype=torch.bfloat16).uniform_(-3, 3)
    # Positions below ~1000: float RoPE frequencies carry ~1e-7 relative error (see rope.cuh).
    pos = torch.from_numpy(rng.integers(0, 1000, 300).astype(np.int64))  # int64 is converted
    qg, kg = tessera.apply_rope_pos_ids(q.cuda(), k.cuda(), pos.cuda(), interleave=interleave)
    want_q, want_k = rope_np(to_np(q), to_np(pos), interleave), rope_np(to_np(k), to_np(pos), interleave)
    assert rel_error(to_np(qg), want_q) < TOL["bfloat16"]
    assert rel_error(to_np(kg), want_k) < TOL["bfloat16"]
    qi, ki = q.cuda(), k.cuda()
    tessera.apply_rope_inplace(qi, ki, torch.tensor([0, 100, 300]), torch.tensor([5, 0]), interleave=interleave)
    want = rope_np(to_np(q), np.concatenate([np.arange(100) + 5, np.arange(200)]), interleave)
    assert rel_error(to_np(qi), want) < TOL["bfloat16"]
