"""tessera.VariableBlockSparseAttentionWrapper (flashinfer.sparse): block
masks per KV head with variable block sizes (some empty), GQA, causal
within each block row's gathered keys, against float64 references (the
dense per-head mask without causal, the gathered keys with it) with outputs
poisoned; its host plan (the key ids) against a loop and, on the CPU,
against the dense-mask attention; argument errors without a GPU.
"""

import numpy as np
import pytest

import tessera
from conftest import to_np
from prefill_reference import check, expect, ref_request
from tessera.variable_sparse import variable_block_plan


def random_sizes(rng, heads, blocks, total):
    """[heads, blocks] non-negative sizes adding up to `total` per head (some 0)."""
    out = np.zeros((heads, blocks), np.int32)
    for h in range(heads):
        cuts = np.sort(rng.integers(0, total + 1, blocks - 1))
        out[h] = np.diff(np.concatenate([[0], cuts, [total]]))
    return out


def random_pattern(rng, hkv, mb, nb, M, N):
    mask = rng.random((hkv, mb, nb)) < 0.45
    mask[0, 0] = False  # a block row without keys
    return mask, random_sizes(rng, hkv, mb, M), random_sizes(rng, hkv, nb, N)


def dense_masks(mask, rows, cols):
    """[Hkv, M, N] bool: what each KV head's queries see."""
    hkv, M, N = mask.shape[0], int(rows[0].sum()), int(cols[0].sum())
    out = np.zeros((hkv, M, N), bool)
    for h in range(hkv):
        r0 = np.concatenate([[0], np.cumsum(rows[h])])
        c0 = np.concatenate([[0], np.cumsum(cols[h])])
        for i, c in zip(*np.nonzero(mask[h])):
            out[h, r0[i]: r0[i + 1], c0[c]: c0[c + 1]] = True
    return out


def gathered_keys(mask, rows, cols, h, i):
    """Head h, block row i: its visible keys in column order (what causal is relative to)."""
    c0 = np.concatenate([[0], np.cumsum(cols[h])])
    return np.concatenate([np.arange(c0[c], c0[c + 1]) for c in np.nonzero(mask[h, i])[0]] +
                          [np.zeros(0, np.int64)]).astype(np.int64)


def reference(q, k, v, mask, rows, cols, causal, sm_scale=None):
    """float64 (o [Hq, M, D], lse [Hq, M]) of the head-major inputs."""
    q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
    hq, M, d = q.shape
    hkv = k.shape[0]
    g = hq // hkv
    o, lse = np.zeros(q.shape), np.full((hq, M), -np.inf)
    for h in range(hkv):
        qh = q[h * g:(h + 1) * g].transpose(1, 0, 2)  # [M, g, D]
        if not causal:
            vis = dense_masks(mask, rows, cols)[h]
            oh, lh = ref_request(qh, k[h][:, None], v[h][:, None], False, sm_scale, visible=vis)
        else:
            oh, lh = np.zeros(qh.shape), np.full(qh.shape[:2], -np.inf)
            r0 = np.concatenate([[0], np.cumsum(rows[h])])
            for i in range(mask.shape[1]):
                keys = gathered_keys(mask, rows, cols, h, i)
                a, b = r0[i], r0[i + 1]
                oh[a:b], lh[a:b] = ref_request(qh[a:b], k[h][keys][:, None], v[h][keys][:, None], True, sm_scale)
        o[h * g:(h + 1) * g] = oh.transpose(1, 0, 2)
        lse[h * g:(h + 1) * g] = lh.T
    return o, lse


# ======================================================================= CPU
def test_plan_ids_match_a_loop(rng):
    for _ in range(10):
        hkv, mb, nb = int(rng.integers(1, 4)), int(rng.integers(1, 6)), int(rng.integers(1, 6))
        M, N = int(rng.integers(0, 40)), int(rng.integers(0, 40))
        mask, rows, cols = random_pattern(rng, hkv, mb, nb, M, N)
        qo, kv, ids, m, n = variable_block_plan(mask.astype(np.uint8), rows, cols, hkv)
        assert (m, n) == (M, N)
        want_qo, want_kv, want_ids = [0], [0], []
        for h in range(hkv):
            for i in range(mb):
                want_qo.append(want_qo[-1] + int(rows[h, i]))
                keys = gathered_keys(mask, rows, cols, h, i) + h * N
                want_ids += keys.tolist()
                want_kv.append(len(want_ids))
        np.testing.assert_array_equal(qo, want_qo)
        np.testing.assert_array_equal(kv, want_kv)
        np.testing.assert_array_equal(ids, want_ids)
        assert qo.dtype == kv.dtype == ids.dtype == np.int32


def test_plan_ids_give_the_dense_mask_attention(rng):
    """Attention over each request's listed keys (the kernel's view of the plan) equals the dense-mask
    attention per head, in float64 on the CPU."""
    hkv, g, d, M, N = 2, 3, 16, 23, 31
    mask, rows, cols = random_pattern(rng, hkv, 4, 5, M, N)
    q = rng.standard_normal((hkv * g, M, d))
    k, v = rng.standard_normal((hkv, N, d)), rng.standard_normal((hkv, N, d))
    qo, kv, ids, _, _ = variable_block_plan(mask, rows, cols, hkv)
    rows_q = q.reshape(hkv, g, M, d).transpose(0, 2, 1, 3).reshape(hkv * M, g, d)
    flat_k, flat_v = k.reshape(hkv * N, 1, d), v.reshape(hkv * N, 1, d)
    o, lse = np.zeros(rows_q.shape), np.full(rows_q.shape[:2], -np.inf)
    for r in range(qo.size - 1):
        sel = ids[kv[r]: kv[r + 1]]
        o[qo[r]: qo[r + 1]], lse[qo[r]: qo[r + 1]] = ref_request(rows_q[qo[r]: qo[r + 1]], flat_k[sel], flat_v[sel],
                                                                 False)
    o = o.reshape(hkv, M, g, d).transpose(0, 2, 1, 3).reshape(hkv * g, M, d)
    lse = lse.reshape(hkv, M, g).transpose(0, 2, 1).reshape(hkv * g, M)
    ref_o, ref_lse = reference(q, k, v, mask, rows, cols, False)
    np.testing.assert_allclose(o, ref_o, atol=1e-12)
    np.testing.assert_array_equal(np.isneginf(lse), np.isneginf(ref_lse))
    fin = np.isfinite(ref_lse)
    np.testing.assert_allclose(lse[fin], ref_lse[fin], atol=1e-12)
    assert np.isneginf(ref_lse).any() and fin.any()  # the pattern has rows without keys and rows with


def test_plan_errors_without_gpu():
    w = tessera.VariableBlockSparseAttentionWrapper(np.zeros(16, np.uint8))
    mask = np.ones((2, 2, 3), bool)
    rows, cols = np.array([[3, 5], [4, 4]]), np.array([[2, 2, 2], [1, 1, 4]])

    def plan(**kw):
        args = dict(block_mask_map=mask, block_row_sz=rows, block_col_sz=cols, num_qo_heads=4, num_kv_heads=2,
                    head_dim=128)
        args.update(kw)
        return lambda: w.plan(**args)

    expect(TypeError, "^float_workspace_buffer", plan())  # every argument check passed
    expect(TypeError, "^float_workspace_buffer", plan(causal=True, logits_soft_cap=5.0, q_data_type="bfloat16"))
    expect(ValueError, "^block_mask_map: expected num_kv_heads=1", plan(num_kv_heads=1, num_qo_heads=4))
    expect(ValueError, "^num_qo_heads: expected a multiple", plan(num_qo_heads=3))
    expect(ValueError, "^block_mask_map: expected a 3-D", plan(block_mask_map=mask[0]))
    expect(TypeError, "^block_mask_map: expected a bool", plan(block_mask_map=mask.astype(np.float32)))
    expect(ValueError, "^block_row_sz: expected every KV head's sizes to add up",
           plan(block_row_sz=np.array([[3, 5], [4, 5]])))
    expect(ValueError, "^block_col_sz: expected shape \\(2, 3\\)", plan(block_col_sz=np.array([[3, 3], [3, 3]])))
    expect(ValueError, "^block_col_sz: expected sizes >= 0", plan(block_col_sz=np.array([[8, -2, 0], [1, 1, 4]])))
    expect(TypeError, "^block_row_sz: expected an integer", plan(block_row_sz=rows.astype(np.float32)))
    expect(ValueError, "^block_row_sz: expected 2 rows", plan(block_row_sz=rows[:1]))
    expect(tessera.NotSupportedError, "^pos_encoding_mode='ROPE_LLAMA': not supported yet",
           plan(pos_encoding_mode="ROPE_LLAMA"))
    expect(ValueError, "^rope_theta", plan(rope_theta=1e4))
    expect(TypeError, "^q_data_type", plan(q_data_type="float32"))
    expect(ValueError, "^head_dim", plan(head_dim=100))
    expect(ValueError, "^run: expected plan", lambda: w.run(None, None, None))
    expect(ValueError, "^forward: expected plan", lambda: w.forward(None, None, None))
    for backend in ("cake", "cake_cute"):
        expect(tessera.NotSupportedError, "^backend", lambda: tessera.VariableBlockSparseAttentionWrapper(
            np.zeros(16, np.uint8), backend))


# ======================================================================= GPU
@pytest.mark.parametrize("dtype, head_dim, hkv, group, causal", [
    ("float16", 128, 2, 4, False), ("bfloat16", 64, 3, 1, True), ("float16", 128, 1, 8, True),
    ("bfloat16", 256, 2, 2, False)])
def test_matches_reference(torch_cuda, rng, poison, dtype, head_dim, hkv, group, causal):
    torch = torch_cuda
    tdt = getattr(torch, dtype)
    M, N = 150, 203
    mask, rows, cols = random_pattern(rng, hkv, 6, 7, M, N)
    hq = hkv * group
    q = torch.from_numpy(rng.uniform(-2, 2, (hq, M, head_dim)).astype(np.float32)).cuda().to(tdt)
    k, v = (torch.from_numpy(rng.uniform(-1, 1, (hkv, N, head_dim)).astype(np.float32)).cuda().to(tdt)
            for _ in range(2))
    w = tessera.VariableBlockSparseAttentionWrapper(torch.empty(128 << 20, dtype=torch.uint8, device="cuda"))
    w.plan(torch.from_numpy(mask).cuda(), torch.from_numpy(rows).cuda(), torch.from_numpy(cols).cuda(), hq, hkv,
           head_dim, causal=causal, q_data_type=tdt)
    o, lse = w.run(q, k, v, return_lse=True)
    assert tuple(o.shape) == (hq, M, head_dim) and o.dtype == tdt and tuple(lse.shape) == (hq, M)
    ref_o, ref_lse = reference(to_np(q), to_np(k), to_np(v), mask, rows, cols, causal)
    check(o.reshape(hq * M, 1, head_dim), lse.reshape(hq * M, 1), ref_o.reshape(hq * M, 1, head_dim),
          ref_lse.reshape(hq * M, 1), dtype)
    # Caller's outputs, NaN-filled: head-major (filled in place) and FlashInfer's kernel layout.
    out, s = torch.full_like(q, float("nan")), torch.full((hq, M), float("nan"), device="cuda")
    o2, s2 = w.run(q, k, v, out=out, lse=s, return_lse=True)
    assert o2 is out and s2 is s and torch.equal(out, o) and torch.equal(s, lse)
    out_k = torch.full((hkv * M, group, head_dim), float("nan"), device="cuda", dtype=tdt)
    o3 = w.run(q, k, v, out=out_k)
    assert torch.equal(o3, o) and not out_k.isnan().any()
    expect(ValueError, "^out: expected shape", lambda: w.run(q, k, v, out=torch.empty(3, device="cuda", dtype=tdt)))
    expect(ValueError, "^q: expected shape", lambda: w.run(q[:, 1:], k, v))
    expect(ValueError, "^k: expected shape", lambda: w.run(q, k[:, 1:], v))


def test_forward_replans_with_its_options(torch_cuda, rng, poison):
    torch = torch_cuda
    hkv, group, d, M, N = 2, 2, 128, 64, 96
    mask, rows, cols = random_pattern(rng, hkv, 4, 4, M, N)
    q = torch.randn(hkv * group, M, d, device="cuda", dtype=torch.float16)
    k, v = torch.randn(hkv, N, d, device="cuda", dtype=torch.float16), torch.randn(hkv, N, d, device="cuda",
                                                                                   dtype=torch.float16)
    w = tessera.VariableBlockSparseAttentionWrapper(torch.empty(64 << 20, dtype=torch.uint8, device="cuda"))
    w.plan(mask, rows, cols, hkv * group, hkv, d)
    o = w.forward(q, k, v, sm_scale=0.3, logits_soft_cap=3.0)
    qn, kn, vn = to_np(q), to_np(k), to_np(v)
    vis = dense_masks(mask, rows, cols)
    ref = np.zeros(qn.shape)
    for h in range(hkv * group):
        ref[h] = ref_request(qn[h][:, None], kn[h // group][:, None], vn[h // group][:, None], False, 0.3,
                             visible=vis[h // group], logits_soft_cap=3.0)[0][:, 0]
    check(o.reshape(-1, 1, d), None, ref.reshape(-1, 1, d), None, "float16")
    assert torch.equal(w.run(q, k, v), o)  # the options stay for later runs
