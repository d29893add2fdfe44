"""Custom attention masks (FlashInfer's custom_mask / packed_custom_mask) and bit packing.

CPU: tessera.packbits / segment_packbits against numpy.packbits (numpy and,
when torch imports, torch CPU inputs); the wrappers' and single_prefill's mask
checks, raised before the workspace is looked at; single_prefill's CPU path
with a mask against the float64 reference. GPU ("skipped: no GPU" without
torch + CUDA): paged (page sizes 1 and 16) and ragged wrappers with random
masks (fully masked rows included), tree-attention masks (speculative
decoding: each draft query sees the prefix and its ancestors) and structured
masks (causal, banded, documents: whole tiles masked and trimmed), given unpacked
or packed, fp16/bf16, head dims 64/128/256, groups 1 and 4, outputs poisoned;
single_prefill on the GPU; CUDA-graph replay after a re-plan with a new mask.
"""

import numpy as np
import pytest

import tessera
from conftest import to_np
import prefill_reference
from prefill_reference import (HKV, check, cpu_paged, expect, indptr_of, ref_request, run_batch, uniform, workspace)
from tessera import _C


# ======================================================================= masks
def random_mask(rng, q_lens, kv_lens, density=0.5):
    """Flat bool mask; every 5th row of each request fully masked."""
    parts = []
    for n, L in zip(q_lens, kv_lens):
        m = rng.random((n, L)) < density
        m[3::5] = False
        parts.append(m.reshape(-1))
    return np.concatenate(parts) if parts else np.zeros(0, bool)


def tree_mask(rng, q_lens, kv_lens):
    """Draft token i is key kv_len - q_len + i; it sees the prefix, its ancestors and itself."""
    parts = []
    for n, L in zip(q_lens, kv_lens):
        prefix = L - n
        m = np.zeros((n, L), bool)
        m[:, :prefix] = True
        parent = [-1] + [int(rng.integers(-1, i)) for i in range(1, n)]
        for i in range(n):
            a = i
            while a >= 0:
                m[i, prefix + a] = True
                a = parent[a]
        parts.append(m.reshape(-1))
    return np.concatenate(parts) if parts else np.zeros(0, bool)


def structured_mask(rng, q_lens, kv_lens):
    """Bottom-right aligned causal, banded (40 keys) or document (37-key segments) rows by request,
    every 7th row blank: whole KV tiles are masked, which runs trim off their work items."""
    parts = []
    for r, (n, L) in enumerate(zip(q_lens, kv_lens)):
        pos = np.arange(n)[:, None] + L - n
        j = np.arange(L)[None, :]
        lo = 0 if r % 3 == 0 else (pos - 40 if r % 3 == 1 else pos // 37 * 37)
        m = (j >= lo) & (j <= pos)
        m[3::7] = False
        parts.append(m.reshape(-1))
    return np.concatenate(parts) if parts else np.zeros(0, bool)


MASKS = dict(random=random_mask, tree=tree_mask, structured=structured_mask)


def ref_masked(q, qo, kv_of, mask, q_lens, kv_lens):
    """Per-request float64 reference with the flat mask reshaped to [q_len, kv_len]."""
    o, lse = np.zeros(q.shape), np.full(q.shape[:2], -np.inf)
    pos = 0
    for i, (n, L) in enumerate(zip(q_lens, kv_lens)):
        k, v = kv_of(i)
        vis = mask[pos: pos + n * L].reshape(n, L)
        pos += n * L
        o[qo[i]: qo[i + 1]], lse[qo[i]: qo[i + 1]] = ref_request(q[qo[i]: qo[i + 1]], k, v, False, visible=vis)
    return o, lse


def pack_per_request(mask, q_lens, kv_lens):
    """packed_custom_mask the FlashInfer way: numpy.packbits(bitorder="little") of each request, concatenated."""
    bits = np.concatenate([[0], np.cumsum(np.multiply(q_lens, kv_lens))])
    return np.concatenate([np.packbits(mask[a:b], bitorder="little") for a, b in zip(bits[:-1], bits[1:])] +
                          [np.zeros(0, np.uint8)])


# ======================================================================= CPU: packing
@pytest.mark.parametrize("bitorder", ["big", "little"])
def test_packbits_matches_numpy(rng, bitorder):
    for n in (0, 1, 7, 8, 9, 64, 1001):
        x = rng.random(n) < 0.5
        np.testing.assert_array_equal(tessera.packbits(x, bitorder=bitorder), np.packbits(x, bitorder=bitorder))
        ints = x.astype(np.int32) * 3  # nonzero is a 1 bit, as numpy
        np.testing.assert_array_equal(tessera.packbits(ints, bitorder), np.packbits(x, bitorder=bitorder))
    np.testing.assert_array_equal(tessera.packbits(np.array([1, 0, 1, 1, 0, 0, 1, 1], bool)), [0b10110011])


@pytest.mark.parametrize("bitorder", ["big", "little"])
def test_segment_packbits_matches_numpy(rng, bitorder):
    lens = [0, 5, 8, 17, 1, 0, 64, 3]
    indptr = indptr_of(lens)
    x = rng.random(int(indptr[-1])) < 0.5
    y, new_indptr = tessera.segment_packbits(x, indptr, bitorder=bitorder)
    assert new_indptr.dtype == np.int32
    np.testing.assert_array_equal(new_indptr, indptr_of([(n + 7) // 8 for n in lens]))
    for i in range(len(lens)):
        np.testing.assert_array_equal(y[new_indptr[i]: new_indptr[i + 1]],
                                      np.packbits(x[indptr[i]: indptr[i + 1]], bitorder=bitorder))
    # FlashInfer's docstring example.
    y, ip = tessera.segment_packbits(np.array([1, 0, 1, 1, 0, 0, 1, 1, 1, 0, 1], bool), np.array([0, 4, 7, 11]))
    assert [bin(b) for b in y] == ["0b10110000", "0b100000", "0b11010000"] and list(ip) == [0, 1, 2, 3]


def test_packing_torch_cpu(rng):
    torch = pytest.importorskip("torch")
    lens = [3, 0, 12, 9]
    indptr = indptr_of(lens)
    x = rng.random(int(indptr[-1])) < 0.5
    for order in ("big", "little"):
        np.testing.assert_array_equal(tessera.packbits(torch.from_numpy(x), order).numpy(),
                                      np.packbits(x, bitorder=order))
        y, ip = tessera.segment_packbits(torch.from_numpy(x), torch.from_numpy(indptr), order)
        ref_y, ref_ip = tessera.segment_packbits(x, indptr, order)
        np.testing.assert_array_equal(y.numpy(), ref_y)
        np.testing.assert_array_equal(ip.numpy(), ref_ip)


def test_packing_bad_input():
    x = np.ones(10, bool)
    expect(ValueError, "bitorder", lambda: tessera.packbits(x, "middle"))
    expect(ValueError, "^x:", lambda: tessera.packbits(np.ones((2, 5), bool)))
    expect(TypeError, "^x:", lambda: tessera.packbits(np.ones(4, np.float32)))
    expect(TypeError, "^x:", lambda: tessera.packbits([1, 0, 1]))
    expect(ValueError, "^x:", lambda: tessera.segment_packbits(x, np.array([0, 4, 9])))
    expect(ValueError, "^indptr:", lambda: tessera.segment_packbits(x, np.array([0, 6, 4, 10])))
    expect(ValueError, "^indptr:", lambda: tessera.segment_packbits(x, np.array([1, 10])))


# ======================================================================= CPU: wrapper checks
def paged_args(**kwargs):
    # kv lengths 5 and 16 + 2: requests of 2 x 5 = 10 bits (2 bytes) and 3 x 18 = 54 bits (7 bytes).
    return prefill_reference.paged_args(**{"paged_kv_last_page_len": [5, 2], **kwargs})


MASK_PLAN_ERRORS = [  # plan() overrides, error, what the message names
    # causal is ignored with a mask (FlashInfer's custom mask mode): the workspace is what is wrong.
    (dict(custom_mask=np.ones(64, bool), causal=True), TypeError, "float_workspace_buffer"),
    (dict(custom_mask=np.ones(64, bool), packed_custom_mask=np.ones(9, np.uint8)), ValueError, "both"),
    (dict(custom_mask=np.ones(63, bool)), ValueError, "^custom_mask: expected sum.* = 64"),
    (dict(custom_mask=np.ones(64, np.float32)), TypeError, "^custom_mask:"),
    (dict(packed_custom_mask=np.ones(8, np.uint8)), ValueError, "^packed_custom_mask: expected at least .* 9"),
    (dict(packed_custom_mask=np.ones(64, bool)), TypeError, "^packed_custom_mask: expected uint8"),
    (dict(packed_custom_mask=np.ones((3, 3), np.uint8)), ValueError, "^packed_custom_mask: expected a 1-D"),
    (dict(custom_mask=[True] * 64), TypeError, "^custom_mask:"),
    (dict(custom_mask=np.ones(64, bool), paged_kv_last_page_len=[5, 17]), ValueError, "^paged_kv_last_page_len:"),
    # Valid masks (flat or any shape with the right size, or packed): the workspace is what is wrong.
    (dict(custom_mask=np.ones((8, 8), bool)), TypeError, "float_workspace_buffer"),
    (dict(packed_custom_mask=np.ones(20, np.uint8)), TypeError, "float_workspace_buffer"),
]


@pytest.mark.parametrize("overrides, error, name", MASK_PLAN_ERRORS)
def test_paged_mask_validation_without_gpu(overrides, error, name):
    with pytest.raises(error, match=name):
        cpu_paged().plan(**paged_args(**overrides))


def test_ragged_and_single_mask_validation_without_gpu():
    ragged = tessera.BatchPrefillWithRaggedKVCacheWrapper(np.zeros(16, np.uint8))
    plan = lambda **kw: ragged.plan([0, 2, 5], [0, 4, 7], 8, HKV, 128, **kw)  # noqa: E731  2x4 + 3x3 = 17 bits
    expect(ValueError, "= 17", lambda: plan(custom_mask=np.ones(16, bool)))
    expect(ValueError, "at least .* 3 bytes", lambda: plan(packed_custom_mask=np.ones(2, np.uint8)))
    expect(TypeError, "float_workspace_buffer", lambda: plan(custom_mask=np.ones(17, bool), causal=True))
    expect(ValueError, "^kv_indptr:", lambda: ragged.plan([0, 2, 5], [0, 4, 3], 8, HKV, 128,
                                                           custom_mask=np.ones(17, bool)))
    expect(TypeError, "float_workspace_buffer", lambda: plan(custom_mask=np.ones(17, bool)))
    q, k = np.zeros((3, 8, 64), np.float32), np.zeros((5, 2, 64), np.float32)
    single = tessera.single_prefill_with_kv_cache
    expect(ValueError, "= 15", lambda: single(q, k, k, custom_mask=np.ones((3, 4), bool)))
    # causal is ignored with a mask, as FlashInfer's custom mask mode (SGLang's tree verify passes both).
    rng = np.random.default_rng(5)
    qr, kr, vr = (rng.standard_normal(x.shape).astype(np.float32) for x in (q, k, k))
    m = rng.random((3, 5)) < 0.6
    m[:, 0] = True
    want = single(qr, kr, vr, custom_mask=m)
    got = single(qr, kr, vr, custom_mask=m, causal=True)
    assert np.array_equal(got, want) and not np.array_equal(got, single(qr, kr, vr, causal=True))
    expect(ValueError, "at least .* 2 bytes", lambda: single(q, k, k, packed_custom_mask=np.ones(1, np.uint8)))
    # The block-sparse wrapper's mask is per block: [indptr[-1], R, C].
    bsr = tessera.BlockSparseAttentionWrapper(np.zeros(16, np.uint8))
    expect(ValueError, r"^mask: expected shape \(indptr\[-1\]=1, R=4, C=16\)",
           lambda: bsr.plan([0, 1], [0], 4, 16, 4, 16, 8, HKV, 128, mask=np.ones(64, bool)))
    expect(TypeError, "^packed_mask: expected a 1-D uint8", lambda: bsr.plan([0, 1], [0], 4, 16, 4, 16, 8, HKV, 128,
                                                                             packed_mask=np.ones(8, np.int32)))
    expect(ValueError, "^packed_mask: expected at least", lambda: bsr.plan([0, 1], [0], 4, 16, 4, 16, 8, HKV, 128,
                                                                           packed_mask=np.ones(7, np.uint8)))
    expect(ValueError, "^causal", lambda: bsr.plan([0, 1], [0], 4, 16, 4, 16, 8, HKV, 128,
                                                   mask=np.ones((1, 4, 16), bool), causal=True))


def test_native_custom_mask_option():
    def size(causal=False, **kw):
        return _C.BatchPrefill.workspace_size("float16", "float16", "float16", 128, 32, 8, 16, "NHD", causal, 64,
                                              8192, 4096, num_sms=132, **kw)

    plain, masked = size(), size(custom_mask=True)
    assert masked[1] > plain[1] and masked[0] >= plain[0]  # the mask_indptr section
    expect(ValueError, "^causal", lambda: size(True, custom_mask=True))


# ======================================================================= CPU: single_prefill
@pytest.mark.parametrize("kind", ["random", "tree"])
def test_single_prefill_cpu_custom_mask(rng, kind):
    q_len, kv_len, hq, d = 9, 21, 8, 64
    q = rng.standard_normal((q_len, hq, d)).astype(np.float32)
    k, v = (rng.standard_normal((kv_len, HKV, d)).astype(np.float32) for _ in range(2))
    flat = (random_mask if kind == "random" else tree_mask)(rng, [q_len], [kv_len])
    mask = flat.reshape(q_len, kv_len)
    o, lse = tessera.single_prefill_with_kv_cache(q, k, v, custom_mask=mask, sm_scale=0.2, return_lse=True)
    ref_o, ref_lse = ref_request(q, k, v, False, 0.2, visible=mask)
    np.testing.assert_allclose(o, ref_o, atol=1e-5)
    np.testing.assert_array_equal(np.isneginf(lse), np.isneginf(ref_lse))
    empty = ~mask.any(axis=1)
    assert (kind != "tree") == bool(empty.any())
    assert np.all(o[empty] == 0) and np.all(np.isneginf(lse[empty]))
    packed = np.packbits(flat, bitorder="little")
    o2, lse2 = tessera.single_prefill_with_kv_cache(q, k, v, packed_custom_mask=packed, sm_scale=0.2,
                                                    return_lse=True)
    np.testing.assert_array_equal(o2, o)
    np.testing.assert_array_equal(lse2, lse)


# ======================================================================= GPU
GPU_CASES = [  # dtype, head_dim, group, page_size (0: ragged), mask kind, packed by the caller
    ("float16", 128, 4, 16, "random", False), ("float16", 128, 1, 1, "tree", True),
    ("bfloat16", 64, 4, 1, "random", True), ("bfloat16", 256, 1, 16, "tree", False),
    ("float16", 64, 1, 0, "random", False), ("bfloat16", 128, 4, 0, "tree", True),
    ("float16", 256, 4, 0, "random", True), ("bfloat16", 128, 1, 16, "random", False),
    ("float16", 128, 4, 16, "structured", True), ("bfloat16", 64, 1, 1, "structured", False),
    ("float16", 128, 1, 0, "structured", False),
]
# q_len <= kv_len (chunked prefill / drafts), a request without queries, a long one that splits.
MASK_LENS = [(0, 10), (5, 5), (1, 300), (37, 61), (100, 190), (16, 1500), (9, 80)]


@pytest.mark.parametrize("dtype, head_dim, group, page_size, kind, packed", GPU_CASES)
def test_batch_prefill_gpu_custom_mask(torch_cuda, rng, poison, dtype, head_dim, group, page_size, kind, packed):
    torch = torch_cuda
    tdt, hq = getattr(torch, dtype), HKV * group
    q_lens, kv_lens = (list(x) for x in zip(*MASK_LENS))
    qo = indptr_of(q_lens)
    q = uniform(torch, rng, (int(qo[-1]), hq, head_dim), tdt, -2.0, 2.0)
    flat = MASKS[kind](rng, q_lens, kv_lens)
    if packed:  # the caller packs on the GPU with tessera.segment_packbits
        bits, _ = tessera.segment_packbits(torch.from_numpy(flat).cuda(),
                                           torch.from_numpy(indptr_of(np.multiply(q_lens, kv_lens))).cuda(),
                                           bitorder="little")
        np.testing.assert_array_equal(bits.cpu().numpy(), pack_per_request(flat, q_lens, kv_lens))
        masks = dict(packed_custom_mask=bits)
    else:
        masks = dict(custom_mask=torch.from_numpy(flat).cuda())
    o, lse, kv_of = run_batch(torch, rng, q, qo, kv_lens, hq, head_dim, tdt, page_size, masks)
    torch.cuda.synchronize()
    ref_o, ref_lse = ref_masked(to_np(q), qo, kv_of, flat, q_lens, kv_lens)
    check(o, lse, ref_o, ref_lse, dtype)
    empty = np.isneginf(ref_lse[:, 0])
    assert (kind != "tree") == bool(empty.any())
    assert np.all(to_np(o)[empty] == 0) and np.all(np.isneginf(to_np(lse)[empty]))


def test_single_prefill_gpu_custom_mask(torch_cuda, rng, poison):
    torch = torch_cuda
    q_len, kv_len, hq, d = 24, 200, 8, 128
    q = uniform(torch, rng, (q_len, hq, d), torch.float16, -2.0, 2.0)
    k, v = (uniform(torch, rng, (kv_len, HKV, d), torch.float16) for _ in range(2))
    mask = tree_mask(rng, [q_len], [kv_len]).reshape(q_len, kv_len)
    o, lse = tessera.single_prefill_with_kv_cache(q, k, v, custom_mask=torch.from_numpy(mask).cuda(),
                                                  return_lse=True)
    ref_o, ref_lse = ref_request(to_np(q), to_np(k), to_np(v), False, visible=mask)
    check(o, lse, ref_o, ref_lse, "float16")


def test_ragged_gpu_custom_mask_cuda_graph(torch_cuda, rng):
    """CUDA-graph mode copies each plan's packed mask into custom_mask_buf, the address the graph holds."""
    torch = torch_cuda
    max_q, max_kv = 64, 600
    buf = torch.empty(4096, dtype=torch.uint8, device="cuda")
    expect(ValueError, "custom_mask_buf", lambda: tessera.BatchPrefillWithRaggedKVCacheWrapper(
        workspace(torch), use_cuda_graph=True).plan([0, 4], [0, 9], 4, HKV, 64, custom_mask=np.ones(36, bool)))
    wrapper = tessera.BatchPrefillWithRaggedKVCacheWrapper(workspace(torch), use_cuda_graph=True, custom_mask_buf=buf)
    q = uniform(torch, rng, (max_q, 4, 64), torch.float16, -2.0, 2.0)
    k, v = (uniform(torch, rng, (max_kv, HKV, 64), torch.float16) for _ in range(2))
    steps = [([30, 34], [250, 350]), ([5, 50], [45, 400]), ([60, 1], [300, 3])]
    for i, (q_lens, kv_lens) in enumerate(steps):
        qo, kv = indptr_of(q_lens), indptr_of(kv_lens)
        flat = tree_mask(rng, q_lens, kv_lens) if i % 2 else random_mask(rng, q_lens, kv_lens)
        wrapper.plan(qo, kv, 4, HKV, 64, custom_mask=torch.from_numpy(flat).cuda())
        if i == 0:
            wrapper.run(q, k, v)
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                out = wrapper.run(q, k, v)
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        kn, vn = to_np(k), to_np(v)
        ref_o, _ = ref_masked(to_np(q)[: qo[-1]], qo, lambda j: (kn[kv[j]: kv[j + 1]], vn[kv[j]: kv[j + 1]]), flat,
                              q_lens, kv_lens)
        check(out, None, ref_o, None, "float16", rows=int(qo[-1]))
    expect(ValueError, "custom_mask_buf", lambda: wrapper.plan([0, 64], [0, 600], 4, HKV, 64,
                                                               custom_mask=np.ones(64 * 600, bool)))


def test_packing_on_gpu_matches_numpy(torch_cuda, rng):
    torch = torch_cuda
    lens = [0, 13, 8, 1000, 7]
    indptr = indptr_of(lens)
    x = rng.random(int(indptr[-1])) < 0.3
    for order in ("big", "little"):
        np.testing.assert_array_equal(tessera.packbits(torch.from_numpy(x).cuda(), order).cpu().numpy(),
                                      np.packbits(x, bitorder=order))
        y, ip = tessera.segment_packbits(torch.from_numpy(x).cuda(), torch.from_numpy(indptr).cuda(), order)
        ref_y, ref_ip = tessera.segment_packbits(x, indptr, order)
        assert y.is_cuda and ip.is_cuda
        np.testing.assert_array_equal(y.cpu().numpy(), ref_y)
        np.testing.assert_array_equal(ip.cpu().numpy(), ref_ip)


@pytest.mark.parametrize("packed", [False, True])
def test_block_sparse_mask_layout(rng, packed):
    """Per-block masks [nnz, R, C] become each block row's [R, nnz_r * C] mask, rows concatenated."""
    from tessera.sparse import _block_row_masks
    R, C = 3, 5
    indptr = np.array([0, 2, 2, 5], np.int64)
    elem = rng.random((5, R, C)) < 0.5
    want = []
    for r in range(3):
        blocks = elem[indptr[r]:indptr[r + 1]]
        want.append(np.concatenate(list(blocks), axis=1).reshape(-1) if len(blocks) else np.zeros(0, bool))
    want = np.concatenate(want)
    arg = (None, np.packbits(elem.reshape(-1), bitorder="little")) if packed else (elem, None)
    got = _block_row_masks(*arg, indptr, R, C)
    assert got.dtype == bool and np.array_equal(got, want)
