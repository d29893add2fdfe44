"""tessera.BatchMLAPagedAttentionWrapper (FlashInfer's MLA wrapper) and
append_paged_mla_kv_cache: argument checks without a GPU (each error names
its argument), and on a GPU the outputs against a float64 numpy reference of
expanded attention over the latent KV (shuffled pages, NaN in every unused
cache slot and in the outputs before the run), CUDA-graph replay across
plans and the append. GPU tests skip with "skipped: no GPU"."""

import math

import numpy as np
import pytest

import tessera
from conftest import to_np

DC, DR = 512, 64


def ref_mla(q_nope, q_pe, ckv, kpe, qo_indptr, kv_indptr, kv_indices, kv_lens, causal, sm_scale):
    """float64 (o [T, H, 512], lse [T, H] base 2)."""
    q_nope, q_pe, ckv, kpe = (to_np(x) for x in (q_nope, q_pe, ckv, kpe))
    T_, H = q_nope.shape[:2]
    o = np.zeros((T_, H, DC))
    lse = np.full((T_, H), -np.inf)
    for b in range(len(kv_lens)):
        n = int(kv_lens[b])
        pages = kv_indices[kv_indptr[b]:kv_indptr[b + 1]]
        c = np.concatenate([ckv[p] for p in pages])[:n] if n else np.zeros((0, DC))
        r = np.concatenate([kpe[p] for p in pages])[:n] if n else np.zeros((0, DR))
        q0, q1 = int(qo_indptr[b]), int(qo_indptr[b + 1])
        for j in range(q1 - q0):
            vis = min(n, max(0, j + n - (q1 - q0) + 1)) if causal else n
            if vis == 0:
                continue
            s = (q_nope[q0 + j] @ c[:vis].T + q_pe[q0 + j] @ r[:vis].T) * sm_scale  # [H, vis]
            m = s.max(axis=1, keepdims=True)
            p = np.exp(s - m)
            o[q0 + j] = (p / p.sum(axis=1, keepdims=True)) @ c[:vis]
            lse[q0 + j] = (m[:, 0] + np.log(p.sum(axis=1))) / math.log(2)
    return o, lse


# ------------------------------------------------------------------ without a GPU
def test_exported_at_top_level_and_in_page():
    assert tessera.BatchMLAPagedAttentionWrapper is tessera.mla.BatchMLAPagedAttentionWrapper
    assert tessera.page.append_paged_mla_kv_cache is tessera.append_paged_mla_kv_cache


def plan_args(**over):
    args = dict(qo_indptr=np.array([0, 1, 2], np.int32), kv_indptr=np.array([0, 1, 3], np.int32),
                kv_indices=np.array([2, 0, 1], np.int32), kv_len_arr=np.array([5, 70], np.int32), num_heads=16,
                head_dim_ckv=512, head_dim_kpe=64, page_size=64, causal=False, sm_scale=0.07,
                q_data_type="bfloat16", kv_data_type="bfloat16")
    args.update(over)
    return args


@pytest.mark.parametrize("over, exc, name", [
    (dict(head_dim_ckv=256), ValueError, "head_dim_ckv"),
    (dict(head_dim_kpe=128), ValueError, "head_dim_kpe"),
    (dict(num_heads=0), ValueError, "num_heads"),
    (dict(page_size=0), ValueError, "page_size"),
    (dict(sm_scale=-1.0), ValueError, "sm_scale"),
    (dict(q_data_type="float32"), TypeError, "q_data_type"),
    (dict(kv_data_type="float16"), TypeError, "kv_data_type"),
    (dict(kv_data_type="float32"), TypeError, "kv_data_type"),
    (dict(scale_mode="kv-per-tensor"), ValueError, "scale_mode"),
    (dict(scale_mode="bmm-scalar", kv_data_type="float8_e4m3fn"), ValueError, "scale_mode"),
    (dict(kv_indptr=np.array([0, 1], np.int32)), ValueError, "kv_indptr"),
    (dict(kv_len_arr=np.array([5], np.int32)), ValueError, "kv_len_arr"),
    (dict(qo_indptr=np.array([0.0, 1.0])), TypeError, "qo_indptr"),
    (dict(kv_indices=None), TypeError, "kv_indices"),
])
def test_plan_names_bad_arguments_before_needing_a_gpu(over, exc, name):
    w = tessera.BatchMLAPagedAttentionWrapper(np.zeros(16, np.uint8))
    with pytest.raises(exc, match=name):
        w.plan(**plan_args(**over))


def test_unsupported_options_are_named():
    with pytest.raises(ValueError, match="backend"):
        tessera.BatchMLAPagedAttentionWrapper(np.zeros(16, np.uint8), backend="cutlass")
    w = tessera.BatchMLAPagedAttentionWrapper(np.zeros(16, np.uint8))
    with pytest.raises(ValueError, match="skip_softmax"):
        w.plan(**plan_args(), skip_softmax=True)
    with pytest.raises(ValueError, match="query_layout"):
        w.plan(**plan_args(), query_layout="interleaved")
    with pytest.raises(ValueError, match="kv_cache_layout"):
        w.plan(**plan_args(), kv_cache_layout="paged")
    with pytest.raises(ValueError, match="output_dtype"):
        w.plan(**plan_args(), output_dtype="float16")  # q is bfloat16
    with pytest.raises(ValueError, match="use_profiler"):
        w.plan(**plan_args(use_profiler=True))
    with pytest.raises(ValueError, match="run"):
        w.run(np.zeros(1), np.zeros(1), np.zeros(1), np.zeros(1))
    with pytest.raises(ValueError, match="sinks"):
        w.run(np.zeros(1), np.zeros(1), np.zeros(1), np.zeros(1), sinks=np.zeros(1))


def dense_of(qo_indptr, kv_indptr, kv_indices, kv_len_arr, width, fill=-7):
    """A dense page table [batch, width] of the CSR one, padded with fill."""
    table = np.full((len(kv_len_arr), width), fill, np.int32)
    for b in range(len(kv_len_arr)):
        row = kv_indices[kv_indptr[b]:kv_indptr[b + 1]]
        table[b, :len(row)] = row
    return table


@pytest.mark.parametrize("page", [1, 16, 64])
def test_dense_page_tables_become_the_csr_ones(page):
    rng = np.random.default_rng(page)
    for batch in (0, 1, 7):
        kv_lens = rng.integers(0, 300, batch).astype(np.int32)
        if batch:
            kv_lens[0] = 0  # an empty request: no pages
        qo_indptr = np.concatenate([[0], np.cumsum(rng.integers(1, 4, batch))]).astype(np.int32)
        kv_indptr = np.concatenate([[0], np.cumsum((kv_lens + page - 1) // page)]).astype(np.int32)
        kv_indices = rng.permutation(int(kv_indptr[-1]) + 5)[:kv_indptr[-1]].astype(np.int32)
        width = int(np.diff(kv_indptr).max(initial=0)) + 3
        table = dense_of(qo_indptr, kv_indptr, kv_indices, kv_lens, width)
        for meta in (tessera.mla.MLAPlanMetadata.dense(qo_indptr, table, kv_lens),
                     tessera.mla.MLAPlanMetadata.dense(list(qo_indptr), table.tolist() if batch else table,
                                                       kv_lens.astype(np.int64),
                                                       max_q_len=int(np.diff(qo_indptr).max(initial=0)))):
            qo, ip, ids, lens = tessera.mla._plan_tables(meta, {}, page)
            assert (qo == qo_indptr).all() and (ip == kv_indptr).all() and (lens == kv_lens).all()
            assert ip.dtype == np.int32 and (np.asarray(ids) == kv_indices).all()
        # CSR and dual metadata and the flat forms give the same tables.
        csr = (qo_indptr, kv_indptr, kv_indices, kv_lens)
        for meta in (tessera.mla.MLAPlanMetadata.csr(*csr),
                     tessera.mla.MLAPlanMetadata.dual(*csr, cum_seq_lens_q=qo_indptr, block_tables=table[:, :0],
                                                      seq_lens=kv_lens)):
            assert tessera.mla._plan_tables(meta, {}, page) == csr
        flat = dict(zip(tessera.mla._CSR_FIELDS + tessera.mla._DENSE_FIELDS, (None,) * 8))
        dense = tessera.mla._plan_tables(None, dict(flat, cum_seq_lens_q=qo_indptr, block_tables=table,
                                                    seq_lens=kv_lens), page)
        assert (dense[1] == kv_indptr).all() and (np.asarray(dense[2]) == kv_indices).all()


def test_plan_metadata_errors_are_named():
    w = tessera.BatchMLAPagedAttentionWrapper(np.zeros(16, np.uint8))
    a = plan_args()
    csr = {k: a.pop(k) for k in ("qo_indptr", "kv_indptr", "kv_indices", "kv_len_arr")}
    table = dense_of(csr["qo_indptr"], csr["kv_indptr"], csr["kv_indices"], csr["kv_len_arr"], 2)
    M = tessera.mla.MLAPlanMetadata
    for kw, exc, name in [
        (dict(metadata=M.csr(**csr), qo_indptr=csr["qo_indptr"]), ValueError, "metadata"),
        (dict(metadata=dict(csr)), TypeError, "metadata"),
        (dict(csr, block_tables=table), ValueError, "cum_seq_lens_q"),
        (dict(metadata=M.dense(csr["qo_indptr"], table[:, :1], csr["kv_len_arr"])), ValueError, "block_tables"),
        (dict(metadata=M.dense(csr["qo_indptr"], table[:1], csr["kv_len_arr"])), ValueError, "block_tables"),
        (dict(metadata=M.dense(csr["qo_indptr"], table.astype(np.float32), csr["kv_len_arr"])), TypeError,
         "block_tables"),
        (dict(metadata=M.dense(csr["qo_indptr"], table, csr["kv_len_arr"][:1])), ValueError, "seq_lens"),
        (dict(metadata=M.dense(csr["qo_indptr"], table, -csr["kv_len_arr"])), ValueError, "seq_lens"),
        (dict(metadata=M.dense(csr["qo_indptr"], table, csr["kv_len_arr"], max_q_len=0)), ValueError, "max_q_len"),
        (dict(metadata=M.dense(csr["qo_indptr"], table, csr["kv_len_arr"], max_q_len=1.5)), TypeError, "max_q_len"),
        (dict(metadata=M(cum_seq_lens_q=csr["qo_indptr"], seq_lens=csr["kv_len_arr"])), TypeError, "block_tables"),
        (dict(metadata=M(qo_indptr=csr["qo_indptr"])), TypeError, "kv_indptr"),
    ]:
        with pytest.raises(exc, match=name):
            w.plan(**a, **kw)


def test_workspace_size_on_the_host():
    ideal, host = tessera._C.BatchMLA.workspace_size("float16", "float16", 128, 512, 64, 64, True, 256, 512, 65536,
                                                     num_sms=132)
    least, _ = tessera._C.BatchMLA.min_workspace_size("float16", "float16", 128, 512, 64, 64, True, 256, 512, 65536,
                                                      num_sms=132)
    assert ideal > least > 0 and host > 0
    with pytest.raises(ValueError, match="head_dim_ckv"):
        tessera._C.BatchMLA.workspace_size("float16", "float16", 128, 256, 64, 64, True, 1, 1, 1, num_sms=132)


# ------------------------------------------------------------------ GPU
def make_step(torch, qo_lens, kv_lens, page, H, dtype, rng, extra_pages=3):
    qo_indptr = np.concatenate([[0], np.cumsum(qo_lens)]).astype(np.int32)
    npages = [(k + page - 1) // page for k in kv_lens]
    kv_indptr = np.concatenate([[0], np.cumsum(npages)]).astype(np.int32)
    pool = int(kv_indptr[-1]) + extra_pages
    kv_indices = rng.permutation(pool)[:kv_indptr[-1]].astype(np.int32)
    dev = "cuda"
    q_nope = torch.randn(int(qo_indptr[-1]), H, DC, dtype=dtype, device=dev)
    q_pe = torch.randn(int(qo_indptr[-1]), H, DR, dtype=dtype, device=dev)
    ckv = torch.full((pool, page, DC), float("nan"), dtype=dtype, device=dev)
    kpe = torch.full((pool, page, DR), float("nan"), dtype=dtype, device=dev)
    for b, n in enumerate(kv_lens):  # only the slots requests own hold numbers
        for t in range(n):
            p = int(kv_indices[kv_indptr[b] + t // page])
            ckv[p, t % page] = torch.randn(DC, dtype=dtype, device=dev)
            kpe[p, t % page] = torch.randn(DR, dtype=dtype, device=dev)
    return dict(qo_indptr=qo_indptr, kv_indptr=kv_indptr, kv_indices=kv_indices,
                kv_lens=np.asarray(kv_lens, np.int32), q_nope=q_nope, q_pe=q_pe, ckv=ckv, kpe=kpe)


def check(torch, s, out, lse, causal, scale, dtype):
    o_ref, lse_ref = ref_mla(s["q_nope"], s["q_pe"], s["ckv"], s["kpe"], s["qo_indptr"], s["kv_indptr"],
                             s["kv_indices"], s["kv_lens"], causal, scale)
    o = to_np(out)
    assert not np.isnan(o).any()
    tol = 1e-3 if dtype == torch.float16 else 1e-2
    assert np.abs(o - o_ref).max() / np.abs(o_ref).max() < tol
    l = to_np(lse)
    finite = np.isfinite(lse_ref)
    assert (np.isneginf(l) == ~finite).all()
    assert np.abs(l[finite] - lse_ref[finite]).max() < 1e-3 * max(1.0, np.abs(lse_ref[finite]).max())


@pytest.mark.parametrize("H", [16, 128])
@pytest.mark.parametrize("page", [1, 64])
@pytest.mark.parametrize("q_len, causal", [(1, False), (2, True), (8, True)])
@pytest.mark.parametrize("dtype_name", ["float16", "bfloat16"])
@pytest.mark.parametrize("backend", ["fa2", "fa3"])
def test_matches_reference(torch_cuda, poison, H, page, q_len, causal, dtype_name, backend):
    torch = torch_cuda
    if backend == "fa3" and torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("skipped: the Hopper MLA kernel needs sm_90")
    dtype = getattr(torch, dtype_name)
    rng = np.random.default_rng(H * 1000 + page * 10 + q_len)
    kv_lens = [q_len, 97, 1031 + q_len, 8]
    s = make_step(torch, [q_len] * 4, kv_lens, page, H, dtype, rng)
    ws = torch.empty(128 << 20, dtype=torch.uint8, device="cuda")
    w = tessera.BatchMLAPagedAttentionWrapper(ws, backend=backend)
    scale = 1 / math.sqrt(192)
    w.plan(torch.from_numpy(s["qo_indptr"]), torch.from_numpy(s["kv_indptr"]),
           torch.from_numpy(s["kv_indices"]).cuda(), torch.from_numpy(s["kv_lens"]), H, 512, 64, page, causal, scale,
           dtype, dtype)
    out, lse = w.run(s["q_nope"], s["q_pe"], s["ckv"], s["kpe"], return_lse=True)
    torch.cuda.synchronize()
    assert w._native.hopper == (backend == "fa3")
    check(torch, s, out, lse, causal, scale, dtype)
    # Packed forms through query= / kv_cache=, into caller outputs.
    out2 = torch.full_like(out, float("nan"))
    w.run(query=(s["q_nope"], s["q_pe"]), kv_cache=torch.cat([s["ckv"], s["kpe"]], -1), out=out2)
    torch.cuda.synchronize()
    assert torch.equal(out, out2)


@pytest.mark.parametrize("table_on_gpu", [False, True])
def test_dense_metadata_runs_like_the_csr_plan(torch_cuda, poison, table_on_gpu):
    """plan(metadata=MLAPlanMetadata.dense(...)) with a padded block table,
    packed inputs: the same bits as the CSR plan."""
    torch = torch_cuda
    rng = np.random.default_rng(11)
    H, page, dtype = 16, 16, torch.bfloat16
    s = make_step(torch, [1, 2, 1], [40, 700, 0], page, H, dtype, rng)
    ws = torch.empty(64 << 20, dtype=torch.uint8, device="cuda")
    scale = 1 / math.sqrt(192)
    common = dict(num_heads=H, head_dim_ckv=512, head_dim_kpe=64, page_size=page, causal=True, sm_scale=scale,
                  q_data_type=dtype, kv_data_type=dtype)
    w = tessera.BatchMLAPagedAttentionWrapper(ws)
    w.plan(metadata=tessera.mla.MLAPlanMetadata.csr(s["qo_indptr"], s["kv_indptr"], s["kv_indices"], s["kv_lens"]),
           **common)
    out = w.run(s["q_nope"], s["q_pe"], s["ckv"], s["kpe"])
    table = torch.from_numpy(dense_of(s["qo_indptr"], s["kv_indptr"], s["kv_indices"], s["kv_lens"], 64))
    table = table.cuda() if table_on_gpu else table
    w2 = tessera.BatchMLAPagedAttentionWrapper(torch.empty_like(ws))
    w2.plan(metadata=tessera.mla.MLAPlanMetadata.dense(torch.from_numpy(s["qo_indptr"]), table,
                                                       torch.from_numpy(s["kv_lens"]), max_q_len=2),
            query_layout="packed", kv_cache_layout="packed", output_dtype=dtype, **common)
    out2 = torch.full_like(out, float("nan"))
    w2.run(query=torch.cat([s["q_nope"], s["q_pe"]], -1), kv_cache=torch.cat([s["ckv"], s["kpe"]], -1), out=out2)
    torch.cuda.synchronize()
    check(torch, s, out, w.run(s["q_nope"], s["q_pe"], s["ckv"], s["kpe"], return_lse=True)[1], True, scale, dtype)
    assert torch.equal(out, out2)


@pytest.mark.parametrize("backend", ["fa2", "fa3"])
def test_decode_batch_split_in_few_chunks_is_exact_and_bitwise_stable(torch_cuda, backend):
    """A decode batch whose requests the plan cuts in one to a few chunks (the
    16-row Hopper tile merges a request cut in two from the last chunk's
    registers): reference-exact, the same bits on every run, lengths 0 / 1
    among them."""
    torch = torch_cuda
    if backend == "fa3" and torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("skipped: the Hopper MLA kernel needs sm_90")
    rng = np.random.default_rng(23)
    H, page, dtype, batch = 16, 64, torch.bfloat16, 64
    kv_lens = rng.integers(1500, 2600, batch).astype(np.int32)
    kv_lens[[5, 17]] = [0, 1]
    npages = (kv_lens + page - 1) // page
    kv_indptr = np.concatenate([[0], np.cumsum(npages)]).astype(np.int32)
    pool = int(kv_indptr[-1]) + 5
    kv_indices = rng.permutation(pool)[:kv_indptr[-1]].astype(np.int32)
    ckv = torch.randn(pool, page, DC, dtype=dtype, device="cuda")
    kpe = torch.randn(pool, page, DR, dtype=dtype, device="cuda")
    used = torch.zeros(pool, page, dtype=torch.bool)
    for b in range(batch):  # NaN in every slot no request owns
        for t0 in range(0, int(kv_lens[b]), page):
            used[int(kv_indices[kv_indptr[b] + t0 // page]), :min(page, int(kv_lens[b]) - t0)] = True
    ckv[~used.cuda()] = float("nan")
    kpe[~used.cuda()] = float("nan")
    s = dict(qo_indptr=np.arange(batch + 1, dtype=np.int32), kv_indptr=kv_indptr, kv_indices=kv_indices,
             kv_lens=kv_lens, q_nope=torch.randn(batch, H, DC, dtype=dtype, device="cuda"),
             q_pe=torch.randn(batch, H, DR, dtype=dtype, device="cuda"), ckv=ckv, kpe=kpe)
    w = tessera.BatchMLAPagedAttentionWrapper(torch.empty(128 << 20, dtype=torch.uint8, device="cuda"),
                                              backend=backend)
    scale = 1 / math.sqrt(192)
    w.plan(torch.from_numpy(s["qo_indptr"]), torch.from_numpy(kv_indptr), torch.from_numpy(kv_indices).cuda(),
           torch.from_numpy(kv_lens), H, DC, DR, page, False, scale, dtype, dtype)
    outs = []
    for _ in range(3):
        out = torch.full((batch, H, DC), float("nan"), dtype=dtype, device="cuda")
        lse = torch.full((batch, H), float("nan"), dtype=torch.float32, device="cuda")
        w.run(s["q_nope"], s["q_pe"], ckv, kpe, out=out, lse=lse)
        outs.append((out, lse))
    torch.cuda.synchronize()
    check(torch, s, outs[0][0], outs[0][1], False, scale, dtype)
    for out, lse in outs[1:]:
        assert torch.equal(out, outs[0][0]) and torch.equal(lse, outs[0][1])


@pytest.mark.parametrize("H", [16, 128])
@pytest.mark.parametrize("backend", ["fa2", "fa3"])
def test_few_long_requests_cut_in_many_chunks(torch_cuda, H, backend):
    """One or three long requests cut over every SM (merged on the Hopper
    kernel by all the chunks' CTAs, slice by slice): reference-exact, the
    same bits on every run and after runs of another plan (the merge state
    is back at zero after each run)."""
    torch = torch_cuda
    if backend == "fa3" and torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("skipped: the Hopper MLA kernel needs sm_90")
    rng = np.random.default_rng(29 + H)
    page, dtype, pool = 64, torch.bfloat16, 1024
    ckv = torch.randn(pool, page, DC, dtype=dtype, device="cuda")
    kpe = torch.randn(pool, page, DR, dtype=dtype, device="cuda")
    q_nope = torch.randn(3, H, DC, dtype=dtype, device="cuda")
    q_pe = torch.randn(3, H, DR, dtype=dtype, device="cuda")
    ws = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    w = tessera.BatchMLAPagedAttentionWrapper(ws, backend=backend)
    scale = 1 / math.sqrt(192)

    def step(kv_lens, kv_indices=None):
        kv_lens = np.asarray(kv_lens, np.int32)
        npages = (kv_lens + page - 1) // page
        kv_indptr = np.concatenate([[0], np.cumsum(npages)]).astype(np.int32)
        if kv_indices is None:
            kv_indices = rng.permutation(pool)[:kv_indptr[-1]].astype(np.int32)
        n = len(kv_lens)
        w.plan(np.arange(n + 1, dtype=np.int32), kv_indptr, torch.from_numpy(kv_indices).cuda(), kv_lens, H, DC, DR,
               page, False, scale, dtype, dtype)
        s = dict(qo_indptr=np.arange(n + 1, dtype=np.int32), kv_indptr=kv_indptr, kv_indices=kv_indices,
                 kv_lens=kv_lens, q_nope=q_nope[:n], q_pe=q_pe[:n], ckv=ckv, kpe=kpe)

        def run():
            out = torch.full((n, H, DC), float("nan"), dtype=dtype, device="cuda")
            lse = torch.full((n, H), float("nan"), dtype=torch.float32, device="cuda")
            w.run(s["q_nope"], s["q_pe"], ckv, kpe, out=out, lse=lse)
            torch.cuda.synchronize()
            return out, lse
        return s, run

    s_mixed, run_mixed = step([12000, 7, 5000])  # the first plan sets the task's bounds: the larger batch
    mixed = run_mixed()
    check(torch, s_mixed, mixed[0], mixed[1], False, scale, dtype)
    s_long, run_long = step([30000])
    first = run_long()
    check(torch, s_long, first[0], first[1], False, scale, dtype)
    for _ in range(2):
        again = run_long()
        assert torch.equal(again[0], first[0]) and torch.equal(again[1], first[1])
    _, run_mixed = step([12000, 7, 5000], s_mixed["kv_indices"])  # the first plan again
    again = run_mixed()
    assert torch.equal(again[0], mixed[0]) and torch.equal(again[1], mixed[1])


@pytest.mark.parametrize("kv_name", ["float8_e4m3fn", "float8_e5m2"])
@pytest.mark.parametrize("H, q_len, causal", [(16, 1, False), (128, 1, False), (128, 2, True)])
@pytest.mark.parametrize("dtype_name", ["float16", "bfloat16"])
def test_fp8_caches_match_the_dequantized_reference(torch_cuda, poison, kv_name, H, q_len, causal, dtype_name):
    torch = torch_cuda
    if torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("skipped: fp8 MLA caches need the Hopper kernel (sm_90)")
    dtype, kv_dtype = getattr(torch, dtype_name), getattr(torch, kv_name)
    rng = np.random.default_rng(H + q_len)
    page = 16
    s = make_step(torch, [q_len] * 3, [q_len, 300 + q_len, 2049], page, H, dtype, rng)
    ckv8, kpe8 = s["ckv"].to(kv_dtype), s["kpe"].to(kv_dtype)  # NaN stays NaN in unused slots
    ckv_scale, kpe_scale = 0.7, 1.3
    ws = torch.empty(128 << 20, dtype=torch.uint8, device="cuda")
    w = tessera.BatchMLAPagedAttentionWrapper(ws)
    scale = 1 / math.sqrt(192)
    w.plan(s["qo_indptr"], s["kv_indptr"], s["kv_indices"], s["kv_lens"], H, 512, 64, page, causal, scale, dtype,
           kv_dtype)
    with pytest.raises(ValueError, match="ckv_scale"):
        w.run(s["q_nope"], s["q_pe"], ckv8, kpe8, kpe_scale=kpe_scale)
    out, lse = w.run(s["q_nope"], s["q_pe"], ckv8, kpe8, return_lse=True, ckv_scale=ckv_scale, kpe_scale=kpe_scale)
    torch.cuda.synchronize()
    assert w._native.hopper
    deq = dict(s, ckv=ckv8.float() * ckv_scale, kpe=kpe8.float() * kpe_scale)
    check(torch, deq, out, lse, causal, scale, dtype)


def test_long_context_split_and_graph_replay(torch_cuda):
    torch = torch_cuda
    rng = np.random.default_rng(5)
    H, page, dtype = 16, 64, torch.bfloat16
    ws = torch.empty(128 << 20, dtype=torch.uint8, device="cuda")
    qo_buf = torch.empty(9, dtype=torch.int32, device="cuda")
    idx_buf = torch.empty(4096, dtype=torch.int32, device="cuda")
    w = tessera.BatchMLAPagedAttentionWrapper(ws, use_cuda_graph=True, qo_indptr=qo_buf, kv_indices=idx_buf)
    steps = [([1] * 8, [32000, 1, 5, 700, 64, 65, 3, 4000]), ([2] * 3, [9000, 2, 300])]
    T = max(sum(q) for q, _ in steps)
    pool = 4096
    q_nope = torch.randn(T, H, DC, dtype=dtype, device="cuda")
    q_pe = torch.randn(T, H, DR, dtype=dtype, device="cuda")
    ckv = torch.randn(pool, page, DC, dtype=dtype, device="cuda")
    kpe = torch.randn(pool, page, DR, dtype=dtype, device="cuda")
    out = torch.full((T, H, DC), float("nan"), dtype=dtype, device="cuda")
    lse = torch.full((T, H), float("nan"), dtype=torch.float32, device="cuda")
    graph = None
    for k, (qo, kv) in enumerate(steps):
        qo_indptr = np.concatenate([[0], np.cumsum(qo)]).astype(np.int32)
        kv_indptr = np.concatenate([[0], np.cumsum([(x + page - 1) // page for x in kv])]).astype(np.int32)
        ids = rng.permutation(pool)[:kv_indptr[-1]].astype(np.int32)
        idx_buf[:len(ids)].copy_(torch.from_numpy(ids))
        w.plan(qo_indptr, kv_indptr, idx_buf, np.asarray(kv, np.int32), H, 512, 64, page, True, 0.1, dtype, dtype)
        rows = int(qo_indptr[-1])
        if graph is None:
            graph = torch.cuda.CUDAGraph()
            w.run(q_nope[:rows], q_pe[:rows], ckv, kpe, out=out[:rows], lse=lse[:rows])  # warm-up outside capture
            with torch.cuda.graph(graph):
                w.run(q_nope[:rows], q_pe[:rows], ckv, kpe, out=out[:rows], lse=lse[:rows])
        graph.replay()
        torch.cuda.synchronize()
        s = dict(qo_indptr=qo_indptr, kv_indptr=kv_indptr, kv_indices=ids, kv_lens=np.asarray(kv),
                 q_nope=q_nope[:rows], q_pe=q_pe[:rows], ckv=ckv, kpe=kpe)
        check(torch, s, out[:rows], lse[:rows], True, 0.1, dtype)


def test_append_paged_mla_kv_cache(torch_cuda):
    torch = torch_cuda
    page, pages = 16, 6
    ckv = torch.zeros(pages, page, DC, dtype=torch.float16, device="cuda")
    kpe = torch.zeros(pages, page, DR, dtype=torch.float16, device="cuda")
    append_ckv = torch.randn(20, DC, dtype=torch.float16, device="cuda")
    append_kpe = torch.randn(20, DR, dtype=torch.float16, device="cuda")
    batch = torch.tensor([0] * 17 + [1] * 3, dtype=torch.int32, device="cuda")
    pos = torch.tensor(list(range(17)) + [0, 1, 2], dtype=torch.int32, device="cuda")
    kv_indices = torch.tensor([4, 1, 3], dtype=torch.int32, device="cuda")
    kv_indptr = torch.tensor([0, 2, 3], dtype=torch.int32, device="cuda")
    last = torch.tensor([1, 3], dtype=torch.int32, device="cuda")
    tessera.append_paged_mla_kv_cache(append_ckv, append_kpe, batch, pos, ckv, kpe, kv_indices, kv_indptr, last)
    torch.cuda.synchronize()
    assert torch.equal(ckv[4], append_ckv[:16]) and torch.equal(ckv[1, 0], append_ckv[16])
    assert torch.equal(ckv[3, :3], append_ckv[17:]) and torch.equal(kpe[3, :3], append_kpe[17:])
    assert torch.equal(kpe[4], append_kpe[:16])
