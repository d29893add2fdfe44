"""The call sequences serving engines make on FlashInfer's API, made on tessera
with only the import changed, each checked against float64 attention.

* vLLM's FlashInfer backend: a decode wrapper over caller-owned index buffers
  in CUDA-graph mode with use_tensor_cores=True, planned through
  fast_decode_plan, run(q, kv_cache, k_scale=, v_scale=, out=) inside a
  captured graph; KV caches laid out (num_blocks, 2, page, Hkv, D) or HND
  (num_blocks, 2, Hkv, page, D), pages of 16 / 32 / 64; the plan attributes
  it reads back (_window_left, _logits_soft_cap, _sm_scale, _causal).
* SGLang's: page_size=1; an extend step as ragged attention over the new
  tokens merged with paged attention over the cached prefix (merge_state);
  CUDA-graph decode whose page ids are written into the wrapper's
  _paged_kv_indices_buf before plan(); speculative verification with a tree
  mask through custom_mask_buf / mask_indptr_buf in CUDA-graph mode.
"""

import functools
import math

import numpy as np
import pytest

import tessera

HQ, HKV, D = 16, 4, 128


def attention_ref(torch, q, k, v, sm_scale, causal=False, visible=None, window_left=-1, cap=0.0):
    """float64 (o [n, Hq, D], lse base 2 [n, Hq]) of q [n, Hq, D] over k, v [L, Hkv, D] (bottom-right causal)."""
    q, k, v = q.double(), k.double(), v.double()
    n, L = q.shape[0], k.shape[0]
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    s = torch.einsum("nhd,lhd->hnl", q, k) * sm_scale
    if cap:
        s = cap * torch.tanh(s / cap)
    keep = torch.ones(n, L, dtype=torch.bool, device=q.device) if visible is None else visible.clone()
    diag = torch.arange(n, device=q.device)[:, None] + (L - n)
    keys = torch.arange(L, device=q.device)[None, :]
    if causal:
        keep &= keys <= diag
    if window_left >= 0:
        keep &= keys >= diag - window_left
    s = s.masked_fill(~keep[None], -math.inf)
    lse = torch.logsumexp(s, -1)
    o = torch.einsum("hnl,lhd->nhd", torch.nan_to_num(torch.exp(s - lse[..., None])), v)
    return o, (lse / math.log(2)).transpose(0, 1)


def close(torch, got, ref, dtype):
    assert torch.isfinite(got).all()
    err = (got.double() - ref).abs().max().item() / max(ref.norm().item(), 1e-12)
    assert err < (1e-3 if dtype == torch.float16 else 1e-2), err


class PagedCache:
    """A vLLM-layout cache with shuffled pages: (num_blocks, 2, page, Hkv, D) or, HND, (num_blocks, 2, Hkv, page, D)."""

    def __init__(self, torch, rng, lens, page, dtype, layout="NHD", blocks=None):
        pages = [(n + page - 1) // page for n in lens]
        total = sum(pages)
        blocks = total + 3 if blocks is None else blocks  # a fixed count keeps a captured graph's cache shape
        assert blocks >= total
        ids = rng.permutation(blocks)[:total].astype(np.int32)
        shape = (blocks, 2, page, HKV, D) if layout == "NHD" else (blocks, 2, HKV, page, D)
        self.cache = torch.randn(shape, dtype=dtype, device="cuda")
        self.indptr = torch.tensor(np.concatenate([[0], np.cumsum(pages)]), dtype=torch.int32, device="cuda")
        self.indices = torch.from_numpy(ids).cuda()
        self.last = torch.tensor([(n - 1) % page + 1 if n else 0 for n in lens], dtype=torch.int32, device="cuda")
        self.lens, self.page, self.layout = list(lens), page, layout

    def kv(self, i):
        """Request i's (k, v) [len, Hkv, D]."""
        a, b = int(self.indptr[i]), int(self.indptr[i + 1])
        rows = self.cache[self.indices[a:b].long()]
        if self.layout == "HND":
            rows = rows.transpose(2, 3)
        k = rows[:, 0].reshape(-1, HKV, D)[: self.lens[i]]
        v = rows[:, 1].reshape(-1, HKV, D)[: self.lens[i]]
        return k, v


def workspace(torch):
    return torch.empty(128 << 20, dtype=torch.int8, device="cuda")  # vLLM and SGLang allocate int8 / uint8


@pytest.mark.parametrize("layout, page", [("NHD", 16), ("HND", 32), ("NHD", 64)])
def test_vllm_decode_graph_with_fast_plan(torch_cuda, rng, layout, page):
    torch = torch_cuda
    dtype, batch, max_pages = torch.float16, 8, 512
    indptr_buf = torch.zeros(batch + 1, dtype=torch.int32, device="cuda")
    indices_buf = torch.zeros(max_pages, dtype=torch.int32, device="cuda")
    last_buf = torch.zeros(batch, dtype=torch.int32, device="cuda")
    w = tessera.BatchDecodeWithPagedKVCacheWrapper(workspace(torch), layout, use_cuda_graph=True,
                                                   use_tensor_cores=True, paged_kv_indptr_buffer=indptr_buf,
                                                   paged_kv_indices_buffer=indices_buf,
                                                   paged_kv_last_page_len_buffer=last_buf)
    w.plan = functools.partial(tessera.fast_decode_plan, w)
    scale = 1.0 / math.sqrt(D)
    q = torch.empty(batch, HQ, D, dtype=dtype, device="cuda")
    out = torch.empty_like(q)
    graph = None
    for step in range(3):
        lens = rng.integers(1, 40 * page, batch)
        c = PagedCache(torch, rng, lens, page, dtype, layout, blocks=max_pages)
        q.copy_(torch.randn_like(q))
        w.plan(c.indptr.cpu(), c.indices, c.last, HQ, HKV, D, page, pos_encoding_mode="NONE", window_left=-1,
               logits_soft_cap=None, q_data_type=dtype, kv_data_type=dtype, sm_scale=scale)
        assert (w._window_left, w._logits_soft_cap, w._sm_scale) == (-1, 0.0, scale)
        cache = c.cache
        if graph is None:
            static_cache = cache.clone()
            w.run(q, static_cache, k_scale=1.0, v_scale=1.0, out=out)  # warm-up outside the capture
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                w.run(q, static_cache, k_scale=1.0, v_scale=1.0, out=out)
        static_cache.copy_(cache)
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        for i in range(batch):
            k, v = c.kv(i)
            ref, _ = attention_ref(torch, q[i:i + 1], k, v, scale)
            close(torch, out[i:i + 1], ref, dtype)


@pytest.mark.parametrize("window_left, cap", [(-1, None), (100, 30.0)])
def test_vllm_prefill_attributes_and_scales(torch_cuda, rng, window_left, cap):
    torch = torch_cuda
    dtype, page = torch.bfloat16, 16
    q_lens, kv_lens = [5, 77, 1, 200], [40, 77, 300, 650]
    c = PagedCache(torch, rng, kv_lens, page, dtype)
    qo = torch.tensor(np.concatenate([[0], np.cumsum(q_lens)]), dtype=torch.int32, device="cuda")
    q = torch.randn(int(qo[-1]), HQ, D, dtype=dtype, device="cuda")
    scale = 0.1
    w = tessera.BatchPrefillWithPagedKVCacheWrapper(workspace(torch), "NHD")
    w.plan(qo, c.indptr, c.indices, c.last, HQ, HKV, D, page, causal=True, sm_scale=scale, window_left=window_left,
           logits_soft_cap=cap, q_data_type=dtype, kv_data_type=dtype)
    assert w._causal is True and w._sm_scale == scale and w._window_left == window_left
    assert w._logits_soft_cap == (cap or 0.0)
    out = torch.full_like(q, float("nan"))
    w.run(q, c.cache, k_scale=1.0, v_scale=1.0, out=out)
    torch.cuda.synchronize()
    for i in range(len(q_lens)):
        k, v = c.kv(i)
        a, b = int(qo[i]), int(qo[i + 1])
        ref, _ = attention_ref(torch, q[a:b], k, v, scale, causal=True, window_left=window_left, cap=cap or 0.0)
        close(torch, out[a:b], ref, dtype)


def test_sglang_extend_ragged_plus_paged_prefix(torch_cuda, rng):
    """SGLang's extend: new tokens (ragged, causal) and the cached prefix (paged, page_size=1, not causal) as two
    states merged with merge_state; equals causal attention over prefix + new tokens."""
    torch = torch_cuda
    dtype = torch.float16
    new, prefix = [3, 50, 1, 130], [0, 200, 17, 900]
    c = PagedCache(torch, rng, prefix, 1, dtype)
    qo = torch.tensor(np.concatenate([[0], np.cumsum(new)]), dtype=torch.int32, device="cuda")
    n = int(qo[-1])
    q = torch.randn(n, HQ, D, dtype=dtype, device="cuda")
    k_new, v_new = (torch.randn(n, HKV, D, dtype=dtype, device="cuda") for _ in range(2))
    scale = 1.0 / math.sqrt(D)
    ragged = tessera.BatchPrefillWithRaggedKVCacheWrapper(workspace(torch), "NHD")
    paged = tessera.BatchPrefillWithPagedKVCacheWrapper(workspace(torch), "NHD")
    ragged.begin_forward(qo, qo, HQ, HKV, D, q_data_type=dtype)
    paged.begin_forward(qo, c.indptr, c.indices, c.last, HQ, HKV, D, 1, q_data_type=dtype)
    o1, s1 = ragged.forward_return_lse(q, k_new, v_new, causal=True, sm_scale=scale, logits_soft_cap=None)
    o2, s2 = paged.forward_return_lse(q, c.cache, causal=False, sm_scale=scale, logits_soft_cap=None)
    o, _ = tessera.merge_state(o1, s1, o2, s2)
    torch.cuda.synchronize()
    for i in range(len(new)):
        a, b = int(qo[i]), int(qo[i + 1])
        kp, vp = c.kv(i)
        ref, _ = attention_ref(torch, q[a:b], torch.cat([kp, k_new[a:b]]), torch.cat([vp, v_new[a:b]]), scale,
                               causal=True)
        close(torch, o[a:b], ref, dtype)


def test_sglang_decode_graph_writes_indices_buffer(torch_cuda, rng):
    torch = torch_cuda
    dtype, max_batch, max_tokens = torch.bfloat16, 6, 6000
    indptr_buf = torch.zeros(max_batch + 1, dtype=torch.int32, device="cuda")
    last_buf = torch.ones(max_batch, dtype=torch.int32, device="cuda")
    w = tessera.BatchDecodeWithPagedKVCacheWrapper(
        workspace(torch), "NHD", use_cuda_graph=True, use_tensor_cores=False, paged_kv_indptr_buffer=indptr_buf,
        paged_kv_indices_buffer=torch.zeros(max_tokens, dtype=torch.int32, device="cuda"),
        paged_kv_last_page_len_buffer=last_buf)
    assert w.is_cuda_graph_enabled and w._paged_kv_indptr_buf is indptr_buf
    q = torch.zeros(max_batch, HQ, D, dtype=dtype, device="cuda")
    graph, static_cache = None, None
    for step in range(2):
        lens = rng.integers(1, 900, max_batch)
        c = PagedCache(torch, rng, lens, 1, dtype, blocks=max_tokens)
        # SGLang fills the wrapper's own index buffer (a Triton kernel there), then plans over it.
        w._paged_kv_indices_buf[: len(c.indices)].copy_(c.indices)
        indptr_buf.copy_(c.indptr)
        w.begin_forward(indptr_buf, w._paged_kv_indices_buf, last_buf, HQ, HKV, D, 1, data_type=dtype,
                        q_data_type=dtype)
        q.copy_(torch.randn_like(q))
        if graph is None:
            static_cache = c.cache.clone()
            out = w.forward(q, static_cache)  # warm-up
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                out = w.forward(q, static_cache)
        static_cache.copy_(c.cache)
        graph.replay()
        torch.cuda.synchronize()
        for i in range(max_batch):
            k, v = c.kv(i)
            ref, _ = attention_ref(torch, q[i:i + 1], k, v, 1.0 / math.sqrt(D))
            close(torch, out[i:i + 1], ref, dtype)


def test_sglang_speculative_verify_tree_mask_graph(torch_cuda, rng):
    """Draft tokens verified against a tree mask: prefix keys all visible, draft keys by the tree, in CUDA-graph
    mode with the mask copied into custom_mask_buf at each plan()."""
    torch = torch_cuda
    dtype, batch, draft = torch.float16, 4, 6
    max_kv = 1200
    qo_buf = torch.zeros(batch + 1, dtype=torch.int32, device="cuda")
    kv_buf = torch.zeros(batch + 1, dtype=torch.int32, device="cuda")
    last_buf = torch.ones(batch, dtype=torch.int32, device="cuda")
    idx_buf = torch.zeros(batch * max_kv, dtype=torch.int32, device="cuda")
    mask_buf = torch.zeros(batch * draft * max_kv // 8 + 64, dtype=torch.uint8, device="cuda")
    mask_indptr_buf = torch.zeros(batch + 1, dtype=torch.int32, device="cuda")
    w = tessera.BatchPrefillWithPagedKVCacheWrapper(workspace(torch), "NHD", use_cuda_graph=True, qo_indptr_buf=qo_buf,
                                                    paged_kv_indptr_buf=kv_buf, paged_kv_indices_buf=idx_buf,
                                                    paged_kv_last_page_len_buf=last_buf, custom_mask_buf=mask_buf,
                                                    mask_indptr_buf=mask_indptr_buf)
    assert w._custom_mask_buf is mask_buf and w._mask_indptr_buf is mask_indptr_buf
    q = torch.zeros(batch * draft, HQ, D, dtype=dtype, device="cuda")
    qo = torch.arange(0, batch * draft + 1, draft, dtype=torch.int32, device="cuda")
    graph = None
    for step in range(2):
        lens = rng.integers(draft + 1, max_kv - 200, batch)
        c = PagedCache(torch, rng, lens, 1, dtype, blocks=batch * max_kv)
        masks = []
        for L in lens:  # a random tree over the draft tokens: each sees its ancestors and itself
            parent = [-1] + [int(rng.integers(0, j)) for j in range(1, draft)]
            tree = np.zeros((draft, draft), bool)
            for j in range(draft):
                a = j
                while a >= 0:
                    tree[j, a] = True
                    a = parent[a]
            masks.append(np.concatenate([np.ones((draft, L - draft), bool), tree], axis=1))
        flat = torch.from_numpy(np.concatenate([m.reshape(-1) for m in masks])).cuda()
        w.plan(qo, c.indptr, c.indices, c.last, HQ, HKV, D, 1, custom_mask=flat, q_data_type=dtype)
        q.copy_(torch.randn_like(q))
        if graph is None:
            static_cache = c.cache.clone()
            out = w.run(q, static_cache)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                out = w.run(q, static_cache)
        static_cache.copy_(c.cache)
        graph.replay()
        torch.cuda.synchronize()
        for i in range(batch):
            k, v = c.kv(i)
            a = i * draft
            vis = torch.from_numpy(masks[i]).cuda()
            ref, _ = attention_ref(torch, q[a:a + draft], k, v, 1.0 / math.sqrt(D), visible=vis)
            close(torch, out[a:a + draft], ref, dtype)


def test_plan_attributes_recorded_without_gpu():
    """The recording itself: FlashInfer's names and conventions (logits_soft_cap None -> 0.0)."""
    from tessera._compat import _record_plan_options

    class Wrapper:
        def plan(self, indptr, causal=False, window_left=-1, logits_soft_cap=None, sm_scale=None):
            pass

    w = Wrapper()
    _record_plan_options(w, Wrapper.plan, ([0, 1],), dict(causal=True, window_left=7))
    assert (w._causal, w._window_left, w._logits_soft_cap, w._sm_scale) == (True, 7, 0.0, None)
    _record_plan_options(w, Wrapper.plan, ([0, 1], False, -1, 20.0, 0.5), {})
    assert (w._causal, w._window_left, w._logits_soft_cap, w._sm_scale) == (False, -1, 20.0, 0.5)
    assert not hasattr(w, "_rope_scale")
