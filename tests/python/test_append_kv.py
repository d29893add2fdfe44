"""tessera.append_paged_kv_cache against a reference that places each token by
its page table, written here with plain indexing: the numpy CPU path
everywhere, the torch CUDA path on a GPU (skipped with "skipped: no GPU").
The whole cache is compared bit for bit, so a stray write anywhere shows.
"""

import contextlib

import numpy as np
import pytest

import tessera

HKV, HEAD_DIM = 2, 64


def page_shape(layout, num_pages, page_size, heads=HKV, head_dim=HEAD_DIM):
    return (num_pages, page_size, heads, head_dim) if layout == "NHD" else (num_pages, heads, page_size, head_dim)


def make_append(rng, old_lens, add_lens, page_size, spare=3):
    """Page table of the cache after the append, plus the tokens appended (shuffled order)."""
    lens = [o + a for o, a in zip(old_lens, add_lens)]
    pages = [(n + page_size - 1) // page_size for n in lens]
    num_pages = sum(pages) + spare
    indptr = np.concatenate([[0], np.cumsum(pages)]).astype(np.int32)
    indices = rng.permutation(num_pages)[: indptr[-1]].astype(np.int32)
    last = np.array([n - (p - 1) * page_size if p else 0 for n, p in zip(lens, pages)], dtype=np.int32)
    batch_indices = np.concatenate([np.full(a, b) for b, a in enumerate(add_lens)]).astype(np.int32)
    positions = np.concatenate([np.arange(o, o + a) for o, a in zip(old_lens, add_lens)]).astype(np.int32)
    order = rng.permutation(len(positions))
    return dict(indptr=indptr, indices=indices, last=last, num_pages=num_pages, batch_indices=batch_indices[order],
                positions=positions[order])


def reference(k, v, key, value, t, layout, page_size):
    """The cache after the append (copies), by page-table lookup of every token."""
    k, v = k.copy(), v.copy()
    for i, (b, pos) in enumerate(zip(t["batch_indices"], t["positions"])):
        page = t["indices"][t["indptr"][b] + pos // page_size]
        slot = pos % page_size
        if layout == "NHD":
            k[page, slot], v[page, slot] = key[i], value[i]
        else:
            k[page, :, slot], v[page, :, slot] = key[i], value[i]
    return k, v


def append_args(t):
    return t["batch_indices"], t["positions"]


OLD, ADD = [0, 5, 16, 31, 100, 7], [3, 1, 1, 2, 40, 0]


# ======================================================================= CPU (numpy)
@pytest.mark.parametrize("layout", ["NHD", "HND"])
@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("page_size", [1, 16, 5])
def test_append_cpu(rng, layout, interleaved, page_size):
    t = make_append(rng, OLD, ADD, page_size)
    shape = page_shape(layout, t["num_pages"], page_size)
    nnz = len(t["positions"])
    key = rng.standard_normal((nnz, HKV, HEAD_DIM)).astype(np.float16)
    value = rng.standard_normal((nnz, HKV, HEAD_DIM)).astype(np.float16)
    if interleaved:
        kv = rng.standard_normal((shape[0], 2) + shape[1:]).astype(np.float16)
        ref_k, ref_v = reference(kv[:, 0], kv[:, 1], key, value, t, layout, page_size)
        cache = kv
    else:
        k = rng.standard_normal(shape).astype(np.float16)
        v = rng.standard_normal(shape).astype(np.float16)
        ref_k, ref_v = reference(k, v, key, value, t, layout, page_size)
        cache = (k, v)
    tessera.append_paged_kv_cache(key, value, *append_args(t), cache, t["indices"], t["indptr"], t["last"],
                                  kv_layout=layout)
    got_k, got_v = (kv[:, 0], kv[:, 1]) if interleaved else cache
    np.testing.assert_array_equal(got_k.view(np.uint16), ref_k.view(np.uint16))
    np.testing.assert_array_equal(got_v.view(np.uint16), ref_v.view(np.uint16))


def test_append_cpu_strided_rows(rng):
    """Rows that are a slice of a wider [nnz, H, 2D] buffer (e.g. a fused projection)."""
    t = make_append(rng, [3, 0], [4, 9], 16)
    nnz = len(t["positions"])
    wide = rng.standard_normal((nnz, HKV, 2 * HEAD_DIM)).astype(np.float16)
    key, value = wide[..., :HEAD_DIM], wide[..., HEAD_DIM:]
    k = np.zeros(page_shape("NHD", t["num_pages"], 16), np.float16)
    v = np.zeros_like(k)
    ref_k, ref_v = reference(k, v, key, value, t, "NHD", 16)
    tessera.append_paged_kv_cache(key, value, *append_args(t), (k, v), t["indices"], t["indptr"], t["last"])
    np.testing.assert_array_equal(k, ref_k)
    np.testing.assert_array_equal(v, ref_v)


def unequal_dims_problem(rng, layout):
    """An append of K rows of 192 features and V rows of 128 into caches of those widths: (table, key, value,
    k cache, v cache, expected k, expected v)."""
    t = make_append(rng, OLD, ADD, 16)
    nnz = len(t["positions"])
    key = rng.standard_normal((nnz, HKV, 192)).astype(np.float16)
    value = rng.standard_normal((nnz, HKV, 128)).astype(np.float16)
    k = rng.standard_normal(page_shape(layout, t["num_pages"], 16, head_dim=192)).astype(np.float16)
    v = rng.standard_normal(page_shape(layout, t["num_pages"], 16, head_dim=128)).astype(np.float16)
    ref_k, ref_v = reference(k, v, key, value, t, layout, 16)
    return t, key, value, k, v, ref_k, ref_v


@pytest.mark.parametrize("layout", ["NHD", "HND"])
def test_append_cpu_unequal_head_dims(rng, layout):
    """K rows of 192 features and V rows of 128 (DeepSeek-style prefill caches), each into its own cache."""
    t, key, value, k, v, ref_k, ref_v = unequal_dims_problem(rng, layout)
    tessera.append_paged_kv_cache(key, value, *append_args(t), (k, v), t["indices"], t["indptr"], t["last"],
                                  kv_layout=layout)
    np.testing.assert_array_equal(k.view(np.uint16), ref_k.view(np.uint16))
    np.testing.assert_array_equal(v.view(np.uint16), ref_v.view(np.uint16))
    with pytest.raises(ValueError, match="append_value"):  # each row tensor has its cache's width
        tessera.append_paged_kv_cache(key, key, *append_args(t), (k, v), t["indices"], t["indptr"], t["last"],
                                      kv_layout=layout)


def test_get_batch_indices_positions_and_seq_lens():
    append_indptr = np.array([0, 2, 2, 5], np.int32)
    seq_lens = np.array([10, 4, 3], np.int32)
    batch, positions = tessera.get_batch_indices_positions(append_indptr, seq_lens, 5)
    assert batch.dtype == np.int32 and positions.dtype == np.int32
    np.testing.assert_array_equal(batch, [0, 0, 2, 2, 2])
    np.testing.assert_array_equal(positions, [8, 9, 0, 1, 2])
    lens = tessera.get_seq_lens(np.array([0, 2, 2, 3]), np.array([5, 0, 16]), 16)
    np.testing.assert_array_equal(lens, [21, 0, 16])


def small_case(rng):
    t = make_append(rng, [5, 20], [2, 3], 16)
    k = np.zeros(page_shape("NHD", t["num_pages"], 16), np.float16)
    key = np.ones((5, HKV, HEAD_DIM), np.float16)
    return t, k, np.zeros_like(k), key


def test_append_cpu_bad_input(rng):
    t, k, v, key = small_case(rng)

    def call(**over):
        a = dict(append_key=key, append_value=key, batch_indices=t["batch_indices"], positions=t["positions"],
                 paged_kv_cache=(k, v), kv_indices=t["indices"], kv_indptr=t["indptr"], kv_last_page_len=t["last"])
        a.update(over)
        tessera.append_paged_kv_cache(**a)

    bad_pos = t["positions"].copy()
    bad_pos[0] = 23 if t["batch_indices"][0] == 1 else 7  # == the request's length after the append
    with pytest.raises(ValueError, match="positions"):
        call(positions=bad_pos)
    bad_b = t["batch_indices"].copy()
    bad_b[1] = 2
    with pytest.raises(ValueError, match="batch_indices"):
        call(batch_indices=bad_b)
    bad_idx = t["indices"].copy()
    bad_idx[:] = t["num_pages"]
    with pytest.raises(ValueError, match="kv_indices"):
        call(kv_indices=bad_idx)
    with pytest.raises(TypeError, match="batch_indices"):  # int64 is read as int32 (test_flashinfer_compat.py)
        call(batch_indices=t["batch_indices"].astype(np.float32))
    with pytest.raises(TypeError, match="append_key"):
        call(append_key=key.astype(np.float32))
    with pytest.raises(ValueError, match="append_value"):
        call(append_value=key[:4])
    with pytest.raises(ValueError, match="positions"):
        call(positions=t["positions"][:4])
    with pytest.raises(ValueError, match="kv_layout"):
        call(kv_layout="NDH")
    with pytest.raises(TypeError, match="paged_kv_cache"):
        call(paged_kv_cache=[k.tolist(), v])
    read_only = k.copy()
    read_only.flags.writeable = False
    with pytest.raises(TypeError, match="k"):
        call(paged_kv_cache=(read_only, v))
    assert not k.any() and not v.any()  # nothing was written by any rejected call


# ======================================================================= GPU (torch)
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("layout", ["NHD", "HND"])
@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("page_size", [1, 16])
def test_append_gpu(torch_cuda, rng, dtype, layout, interleaved, page_size):
    torch = torch_cuda
    tdt = getattr(torch, dtype)
    t = make_append(rng, OLD, ADD, page_size)
    shape = page_shape(layout, t["num_pages"], page_size)
    nnz = len(t["positions"])
    key, value = (torch.from_numpy(rng.standard_normal((nnz, HKV, HEAD_DIM)).astype(np.float32)).cuda().to(tdt)
                  for _ in range(2))
    if interleaved:
        kv = torch.randn((shape[0], 2) + shape[1:], device="cuda").to(tdt)
        k, v, cache = kv[:, 0], kv[:, 1], kv
    else:
        k, v = (torch.randn(shape, device="cuda").to(tdt) for _ in range(2))
        cache = (k, v)
    ref_k, ref_v = k.clone(), v.clone()
    cpu = {name: torch.from_numpy(t[name]) for name in ("indptr", "indices", "batch_indices", "positions")}
    pages = cpu["indices"][(cpu["indptr"][cpu["batch_indices"].long()] + cpu["positions"] // page_size).long()].cuda()
    slots = (cpu["positions"] % page_size).cuda()
    if layout == "NHD":
        ref_k[pages.long(), slots.long()] = key
        ref_v[pages.long(), slots.long()] = value
    else:
        ref_k[pages.long(), :, slots.long()] = key
        ref_v[pages.long(), :, slots.long()] = value
    g = {name: torch.from_numpy(t[name]).cuda() for name in ("indptr", "indices", "last", "batch_indices", "positions")}
    tessera.append_paged_kv_cache(key, value, g["batch_indices"], g["positions"], cache, g["indices"], g["indptr"],
                                  g["last"], kv_layout=layout)
    torch.cuda.synchronize()
    assert torch.equal(k.view(torch.int16), ref_k.view(torch.int16))
    assert torch.equal(v.view(torch.int16), ref_v.view(torch.int16))


@pytest.mark.parametrize("layout", ["NHD", "HND"])
def test_append_gpu_unequal_head_dims(torch_cuda, rng, layout):
    """K rows of 192 features and V rows of 128 on the GPU, bit for bit against the host placement."""
    torch = torch_cuda
    t, key, value, k, v, ref_k, ref_v = unequal_dims_problem(rng, layout)
    gk, gv = torch.from_numpy(k).cuda(), torch.from_numpy(v).cuda()
    g = {name: torch.from_numpy(t[name]).cuda() for name in ("indptr", "indices", "last", "batch_indices", "positions")}
    tessera.append_paged_kv_cache(torch.from_numpy(key).cuda(), torch.from_numpy(value).cuda(), g["batch_indices"],
                                  g["positions"], (gk, gv), g["indices"], g["indptr"], g["last"], kv_layout=layout)
    torch.cuda.synchronize()
    np.testing.assert_array_equal(gk.cpu().numpy().view(np.uint16), ref_k.view(np.uint16))
    np.testing.assert_array_equal(gv.cpu().numpy().view(np.uint16), ref_v.view(np.uint16))


def test_append_gpu_batch_indices_positions_and_guard(torch_cuda, rng):
    """get_batch_indices_positions on CUDA tensors; out-of-range tokens are skipped on the device."""
    torch = torch_cuda
    old, add = [4, 0, 30], [3, 2, 5]
    t = make_append(rng, old, add, 16)
    lens = torch.tensor([o + a for o, a in zip(old, add)], dtype=torch.int32, device="cuda")
    append_indptr = torch.tensor(np.concatenate([[0], np.cumsum(add)]), dtype=torch.int32, device="cuda")
    batch, positions = tessera.get_batch_indices_positions(append_indptr, lens, sum(add))
    assert batch.is_cuda and batch.dtype == torch.int32
    assert batch.tolist() == [0, 0, 0, 1, 1, 2, 2, 2, 2, 2]
    assert positions.tolist() == [4, 5, 6, 0, 1, 30, 31, 32, 33, 34]
    k = torch.zeros(page_shape("NHD", t["num_pages"], 16), dtype=torch.float16, device="cuda")
    v = torch.zeros_like(k)
    key = torch.ones((10, HKV, HEAD_DIM), dtype=torch.float16, device="cuda")
    positions[3] = 2  # request 1 holds 2 tokens: position 2 is outside it
    batch[5] = 7      # no such request
    g = {name: torch.from_numpy(t[name]).cuda() for name in ("indptr", "indices", "last")}
    tessera.append_paged_kv_cache(key, key, batch, positions, (k, v), g["indices"], g["indptr"], g["last"])
    torch.cuda.synchronize()
    assert int(k.sum().item()) == 8 * HKV * HEAD_DIM  # the 8 valid tokens, nothing else
    assert torch.equal(k, v)


# ======================================================================= tables that grow under a CUDA graph
def test_int32_capacity(monkeypatch):
    """How far the kernel may read an index vector: to the end of the storage behind a 1-D int32 view of stride
    1 (CUDA tensors only; the arithmetic is checked on CPU tensors here), else the vector's own length."""
    torch = pytest.importorskip("torch")
    from tessera import _tensors as T

    buf = torch.zeros(100, dtype=torch.int32)
    assert T.int32_capacity(buf[:7]) == 7  # a CPU tensor: the CPU path reads the views only
    monkeypatch.setattr(T, "is_cuda", T.is_torch)  # as if on the GPU
    assert T.int32_capacity(buf[:7]) == 100
    assert T.int32_capacity(buf[10:17]) == 90
    assert T.int32_capacity(buf.view(2, 50)[1]) == 50
    assert T.int32_capacity(buf[::2][:5]) == 5  # strided: its own length
    assert T.int32_capacity(buf[:7].long()) == 7  # not int32
    assert T.int32_capacity(buf[:7].clone()) == 7  # a copy owns its storage
    assert T.int32_capacity(buf.view(10, 10)) == 10  # not 1-D: left to the C++ checks
    assert T.int32_capacity(np.zeros(5, np.int32)) == 5


def test_append_passes_buffer_capacity(monkeypatch):
    """CUDA calls hand the bindings max_batch = min(capacity(kv_indptr) - 1, capacity(kv_last_page_len)) and
    max_indices = capacity(kv_indices); int64 tables (converted) are bounded by their own length. The
    bindings are stubbed and CPU tensors stand in for CUDA ones."""
    torch = pytest.importorskip("torch")
    from tessera import _tensors as T
    from tessera import page

    calls = []
    monkeypatch.setattr(T, "is_cuda", T.is_torch)
    monkeypatch.setattr(T, "on_device_of", lambda x: contextlib.nullcontext())
    monkeypatch.setattr(T, "stream_of", lambda x: 0)
    monkeypatch.setattr(page, "_C", type("C", (), {"append_paged_kv_cache": staticmethod(
        lambda *a, **kw: calls.append(kw))}))
    indptr_buf = torch.zeros(33, dtype=torch.int32)
    last_buf = torch.zeros(20, dtype=torch.int32)
    indices_buf = torch.zeros(500, dtype=torch.int32)
    k = torch.zeros((8, 16, HKV, HEAD_DIM), dtype=torch.float16)
    rows = torch.zeros((4, HKV, HEAD_DIM), dtype=torch.float16)
    ints = torch.zeros(4, dtype=torch.int32)
    tessera.append_paged_kv_cache(rows, rows, ints, ints, (k, k), indices_buf[:3], indptr_buf[:3], last_buf[:2])
    assert calls[-1]["max_batch"] == 20 and calls[-1]["max_indices"] == 500  # kv_last_page_len's buffer ends first
    tessera.append_paged_kv_cache(rows, rows, ints, ints, (k, k), indices_buf[100:103], indptr_buf[:3], last_buf[:2])
    assert calls[-1]["max_batch"] == 20 and calls[-1]["max_indices"] == 400
    tessera.append_paged_kv_cache(rows, rows, ints, ints, (k, k), indices_buf[:3], indptr_buf[:3].long(),
                                  last_buf[:2])
    assert calls[-1]["max_batch"] == 2 and calls[-1]["max_indices"] == 500
    tessera.append_paged_kv_cache(rows, rows, ints, ints, (k, k), indices_buf[:3], indptr_buf[20:23], last_buf[:2])
    assert calls[-1]["max_batch"] == 12  # kv_indptr's buffer ends first


def test_append_gpu_cuda_graph_tables_grow(torch_cuda, rng):
    """A CUDA graph captured with views of preallocated int32 tables for a 2-request batch (kv_indptr_buf[:3],
    ...) appends, on replay, by the larger tables written into the same buffers since (more requests, more
    pages), as a serving engine replays one graph per padded batch size: every row lands bitwise in its slot
    and nothing else changes (the cache is poisoned first). Rows past the step's tokens are padding (batch
    index -1)."""
    torch = torch_cuda
    page_size, num_pages, nnz, max_batch = 16, 96, 48, 12
    shape = page_shape("NHD", num_pages, page_size)
    k, v = (torch.empty(shape, dtype=torch.float16, device="cuda") for _ in range(2))
    indptr_buf = torch.zeros(max_batch + 1, dtype=torch.int32, device="cuda")
    last_buf = torch.zeros(max_batch, dtype=torch.int32, device="cuda")
    indices_buf = torch.zeros(num_pages, dtype=torch.int32, device="cuda")
    bi_buf = torch.full((nnz,), -1, dtype=torch.int32, device="cuda")
    pos_buf = torch.zeros(nnz, dtype=torch.int32, device="cuda")
    key_buf, value_buf = (torch.zeros((nnz, HKV, HEAD_DIM), dtype=torch.float16, device="cuda") for _ in range(2))

    def write_step(old, add):
        """The step's tables, tokens and rows written into the buffers; returns (tables, key, value) on the host."""
        used = sum((o + a + page_size - 1) // page_size for o, a in zip(old, add))
        t = make_append(rng, old, add, page_size, spare=num_pages - used)
        n = len(t["positions"])
        key = rng.standard_normal((n, HKV, HEAD_DIM)).astype(np.float16)
        value = rng.standard_normal((n, HKV, HEAD_DIM)).astype(np.float16)
        for buf, x in ((indptr_buf, t["indptr"]), (last_buf, t["last"]), (indices_buf, t["indices"]),
                       (bi_buf, t["batch_indices"]), (pos_buf, t["positions"]), (key_buf, key), (value_buf, value)):
            buf[:len(x)].copy_(torch.from_numpy(x))
        bi_buf[n:] = -1
        return t, key, value

    def poison():
        k.view(torch.int16).fill_(0x7E00)  # an fp16 NaN no appended row holds
        v.view(torch.int16).fill_(0x7E00)

    small, _, _ = write_step([5, 20], [2, 3])
    n_small = int(small["indptr"][-1])

    def append():
        tessera.append_paged_kv_cache(key_buf, value_buf, bi_buf, pos_buf, (k, v), indices_buf[:n_small],
                                      indptr_buf[:3], last_buf[:2])

    poison()
    append()  # warm-up outside the capture (loads the kernel)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        append()
    steps = ([5, 20, 0, 31, 100, 7, 16, 2], [2, 3, 4, 1, 9, 1, 1, 20]), ([64, 0, 3, 200], [1, 30, 1, 1])
    for old, add in steps:
        t, key, value = write_step(old, add)
        assert len(old) > 2 and int(t["indptr"][-1]) > n_small
        poison()
        graph.replay()
        torch.cuda.synchronize()
        empty = np.full(shape, 0x7E00, np.int16).view(np.float16)
        ref_k, ref_v = reference(empty, empty, key, value, t, "NHD", page_size)
        np.testing.assert_array_equal(k.cpu().numpy().view(np.int16), ref_k.view(np.int16))
        np.testing.assert_array_equal(v.cpu().numpy().view(np.int16), ref_v.view(np.int16))
