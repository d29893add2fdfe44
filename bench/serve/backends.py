"""Attention backends of the serving loop: plan(step) once per step, then
attend(layer, q, k, v) per layer (append this step's K / V to the layer's
paged cache, return the attention output [tokens, q_heads, head_dim]).

* WrapperBackend: Tessera or FlashInfer through the same FlashInfer API calls
  (BatchPrefillWithPagedKVCacheWrapper for steps with prefill chunks,
  BatchDecodeWithPagedKVCacheWrapper for decode-only steps, one decode
  wrapper per CUDA-graph batch bucket in use_cuda_graph mode, as engines do:
  FlashInfer fixes the batch size of a graph wrapper). Tessera appends with
  tessera.append_paged_kv_cache; FlashInfer with a torch scatter into the
  cache rows (FlashInfer's own append is a JIT module that nvcc would build
  for minutes on a machine without its prebuilt kernels).
* SdpaBackend: torch SDPA on K / V gathered from the page table into a
  padded dense batch (decode rows and prefill chunks as two calls); the
  query-head group is folded into the query length, so every SDPA kernel
  that takes a mask works, with or without GQA support.
* FlexBackend (flex_backend.py): FlexAttention over the physical page pool
  with a block mask built from the page table.

Steps come from engine.StepData: host numpy arrays (qo_indptr, kv_indptr,
kv_indices, last_page_len, kv_lens, q_lens) and device views of the engine's
fixed buffers (the same addresses every step, so captured graphs stay valid).
"""
import math

import numpy as np
import torch
import torch.nn.functional as F


class KVCache:
    """One tensor [layers, 2, pages, page_size, kv_heads, head_dim] (NHD pages); k(l) / v(l) are contiguous."""

    def __init__(self, cfg, num_pages, page_size, device, dtype):
        self.num_pages, self.page_size = num_pages, page_size
        self.data = torch.zeros(cfg.layers, 2, num_pages, page_size, cfg.kv_heads, cfg.head_dim, device=device,
                                dtype=dtype)

    def k(self, layer):
        return self.data[layer, 0]

    def v(self, layer):
        return self.data[layer, 1]

    def rows(self, t):
        """A layer's K or V as [pages * page_size, kv_heads, head_dim] rows (slot = page * page_size + offset)."""
        return t.view(-1, t.shape[-2], t.shape[-1])

    def copy_pages(self, src, dst):
        """Every layer's K and V of page src[i] into page dst[i] (forks' copy-on-write)."""
        if len(dst):
            s = torch.as_tensor(src, dtype=torch.long, device=self.data.device)
            d = torch.as_tensor(dst, dtype=torch.long, device=self.data.device)
            self.data[:, :, d] = self.data[:, :, s]


class Backend:
    name = "?"
    supports_graphs = False  # decode-only steps may be captured in CUDA graphs (one per batch bucket)
    pad_decode = False  # decode-only steps must be padded to a bucket even without graphs
    rope_in_model = True

    def __init__(self, cfg, cache, device, dtype):
        self.cfg, self.cache, self.device, self.dtype = cfg, cache, torch.device(device), dtype
        self.sm_scale = 1.0 / math.sqrt(cfg.head_dim)

    def prepare_graph(self, bucket):
        """Per-bucket state before capturing that bucket's decode graph."""

    def scatter_append(self, layer, k, v, sd):
        """Appends by writing each token's K / V at its cache row (sd.slots: page * page_size + offset)."""
        self.cache.rows(self.cache.k(layer)).index_copy_(0, sd.slots, k)
        self.cache.rows(self.cache.v(layer)).index_copy_(0, sd.slots, v)

    def stats(self):
        return {}


class WrapperBackend(Backend):
    """Tessera or FlashInfer (lib) through FlashInfer's wrapper API."""

    supports_graphs = True

    def __init__(self, name, lib, cfg, cache, device, dtype, *, max_pages, use_tensor_cores=True, pdl=True,
                 shared_prefix=None, host_page_ids=False, pos_encoding=None, workspace_mb=512, scatter_append=None,
                 shared_prefix_limits=None):
        super().__init__(cfg, cache, device, dtype)
        self.name, self.lib = name, lib
        self.is_tessera = lib.__name__.split(".")[0] == "tessera"
        self.tc, self.pdl, self.max_pages = bool(use_tensor_cores), bool(pdl), int(max_pages)
        self.host_page_ids = bool(host_page_ids or shared_prefix)  # shared_prefix reads the ids on the host
        self.ws_bytes = workspace_mb << 20
        self.plan_kw = dict(q_data_type=dtype, kv_data_type=dtype)
        if pos_encoding is not None:  # fused RoPE at the cache position (the Streaming-LLM study)
            self.plan_kw.update(pos_encoding_mode="ROPE_LLAMA", rope_scale=1.0, rope_theta=float(cfg.rope_theta))
            self.rope_in_model = False
        if shared_prefix is not None:
            if not self.is_tessera:
                raise ValueError("shared_prefix: a Tessera-only plan() option")
            self.plan_kw["shared_prefix"] = shared_prefix
        self.use_scatter = (not self.is_tessera) if scatter_append is None else bool(scatter_append)
        # shared_prefix_limits: the CUDA-graph split's (min_shared_tokens, min_members, min_saved_tokens), a
        # Tessera wrapper attribute (tessera/_auto_prefix.py), for measuring other limits than the defaults.
        self.limits = shared_prefix_limits
        self.prefill = self._limited(lib.BatchPrefillWithPagedKVCacheWrapper(self._ws(), "NHD"))
        self.decode = self._limited(lib.BatchDecodeWithPagedKVCacheWrapper(self._ws(), "NHD", use_tensor_cores=self.tc))
        self.graph_wrappers = {}
        self.cur = None
        self._sp_stats = []

    def _ws(self):
        return torch.zeros(self.ws_bytes, dtype=torch.uint8, device=self.device)

    def _limited(self, wrapper):
        if self.limits is not None:
            wrapper._shared_prefix_limits = tuple(self.limits)
        return wrapper

    def prepare_graph(self, bucket):
        if bucket in self.graph_wrappers:
            return
        i32 = dict(dtype=torch.int32, device=self.device)
        self.graph_wrappers[bucket] = self._limited(self.lib.BatchDecodeWithPagedKVCacheWrapper(
            torch.zeros(128 << 20, dtype=torch.uint8, device=self.device), "NHD", use_cuda_graph=True,
            use_tensor_cores=self.tc, paged_kv_indptr_buffer=torch.zeros(bucket + 1, **i32),
            paged_kv_indices_buffer=torch.zeros(self.max_pages, **i32),
            paged_kv_last_page_len_buffer=torch.zeros(bucket, **i32)))

    def plan(self, sd):
        c, h = self.cfg, sd.host
        kv_indptr = torch.from_numpy(h.kv_indptr)
        last = torch.from_numpy(h.last_page_len)
        if self.host_page_ids:
            ids = torch.from_numpy(h.kv_indices)
        elif self.is_tessera:
            ids = sd.kv_indices_full  # a CUDA buffer: plan() copies its first kv_indptr[-1] ids on the stream
        else:
            ids = sd.kv_indices_full[: len(h.kv_indices)]
        if sd.kind == "decode":
            w = self.graph_wrappers[sd.bucket] if sd.graph else self.decode
            w.plan(kv_indptr, ids, last, c.q_heads, c.kv_heads, c.head_dim, self.cache.page_size, **self.plan_kw)
        else:
            w = self.prefill
            w.plan(torch.from_numpy(h.qo_indptr), kv_indptr, ids, last, c.q_heads, c.kv_heads, c.head_dim,
                   self.cache.page_size, causal=True, **self.plan_kw)
        if "shared_prefix" in self.plan_kw:
            st = w.shared_prefix_stats
            if st is not None:
                self._sp_stats.append(st)
        self.cur, self.sd = w, sd

    def attend(self, layer, q, k, v):
        kc, vc = self.cache.k(layer), self.cache.v(layer)
        sd = self.sd
        if self.use_scatter:
            self.scatter_append(layer, k, v, sd)
        else:
            self.lib.append_paged_kv_cache(k, v, sd.batch_indices, sd.positions, (kc, vc), sd.kv_indices_full,
                                           sd.kv_indptr, sd.last_page_len, "NHD")
        return self.cur.run(q, (kc, vc), enable_pdl=self.pdl)

    def stats(self):
        """shared_prefix="auto": how often a step went through the cascade, pages saved, detection time."""
        s = self._sp_stats
        if not s:
            return {}
        return dict(shared_prefix_plans=len(s), split_fraction=float(np.mean([x["split"] for x in s])),
                    grouped_fraction=float(np.mean([x["groups"] > 0 for x in s])),
                    saved_pages_mean=float(np.mean([x["saved_pages"] for x in s])),
                    detect_us_median=float(np.median([x["detect_us"] for x in s])))


def _gather_plan(sd, reqs, page_size, device):
    """Device [n, L] cache rows of requests `reqs` (their kv_lens keys, padded to L = a multiple of the page
    size with row 0) and the valid-key mask [n, L]."""
    h = sd.host
    kv_lens = h.kv_lens[reqs]
    L = max(page_size, -(-int(kv_lens.max()) // page_size) * page_size)
    start = torch.from_numpy(h.kv_indptr[reqs].astype(np.int64)).to(device, non_blocking=True)
    lens = torch.from_numpy(kv_lens.astype(np.int64)).to(device, non_blocking=True)
    j = torch.arange(L, device=device)
    valid = j[None, :] < lens[:, None]
    page_pos = (start[:, None] + j[None, :] // page_size).clamp_(max=max(len(h.kv_indices) - 1, 0))
    rows = sd.kv_indices_full[page_pos].long() * page_size + (j % page_size)[None, :]
    return torch.where(valid, rows, torch.zeros_like(rows)), valid


class SdpaBackend(Backend):
    """torch SDPA on KV gathered and padded from the page table (no CUDA graphs: shapes change every step)."""

    name = "sdpa"

    def plan(self, sd):
        h, ps, dev = sd.host, self.cache.page_size, self.device
        single = np.nonzero(h.q_lens == 1)[0]
        multi = np.nonzero(h.q_lens > 1)[0]
        self.sd, self.dec, self.pre = sd, None, None
        self.all_single = len(multi) == 0
        if len(single):  # one query per request: the group of query heads is the query length
            rows, valid = _gather_plan(sd, single, ps, dev)
            qrows = torch.from_numpy(h.qo_indptr[single].astype(np.int64)).to(dev, non_blocking=True)
            self.dec = (rows, valid[:, None, None, :], qrows)
        if len(multi):  # prefill chunks: padded queries, bottom-right causal mask
            rows, kvalid = _gather_plan(sd, multi, ps, dev)
            ql = h.q_lens[multi].astype(np.int64)
            lq = int(ql.max())
            i = torch.arange(lq, device=dev)
            qlen = torch.from_numpy(ql).to(dev, non_blocking=True)
            prefix = torch.from_numpy(h.kv_lens[multi].astype(np.int64) - ql).to(dev, non_blocking=True)
            qstart = torch.from_numpy(h.qo_indptr[multi].astype(np.int64)).to(dev, non_blocking=True)
            qvalid = i[None, :] < qlen[:, None]
            qrows = torch.where(qvalid, qstart[:, None] + i[None, :], torch.zeros_like(qvalid, dtype=torch.long))
            j = torch.arange(rows.shape[1], device=dev)
            mask = kvalid[:, None, :] & (j[None, None, :] <= (i[None, :] + prefix[:, None])[:, :, None])
            mask[:, :, 0] |= ~qvalid  # padded query rows see key 0 (no all-masked row, no NaN); dropped later
            g = self.cfg.q_heads // self.cfg.kv_heads
            n, L = rows.shape
            mask = mask[:, None].expand(n, g, lq, L).reshape(n, 1, g * lq, L)
            self.pre = (rows, mask, qrows, qvalid)

    def _kv(self, layer, rows):
        kr, vr = self.cache.rows(self.cache.k(layer)), self.cache.rows(self.cache.v(layer))
        return kr[rows].transpose(1, 2), vr[rows].transpose(1, 2)  # [n, Hkv, L, d]

    def attend(self, layer, q, k, v):
        c = self.cfg
        g, hkv, d = c.q_heads // c.kv_heads, c.kv_heads, c.head_dim
        self.scatter_append(layer, k, v, self.sd)
        out = q.new_empty(q.shape) if not self.all_single else None
        if self.dec is not None:
            rows, mask, qrows = self.dec
            kk, vv = self._kv(layer, rows)
            qd = q.index_select(0, qrows).view(-1, hkv, g, d)
            o = F.scaled_dot_product_attention(qd, kk, vv, attn_mask=mask, scale=self.sm_scale)
            o = o.reshape(-1, c.q_heads, d)
            if out is None:
                return o  # a decode-only step: rows are the requests in order
            out.index_copy_(0, qrows, o)
        if self.pre is not None:
            rows, mask, qrows, qvalid = self.pre
            n, lq = qrows.shape
            kk, vv = self._kv(layer, rows)
            qp = q[qrows].view(n, lq, hkv, g, d).permute(0, 2, 3, 1, 4).reshape(n, hkv, g * lq, d)
            o = F.scaled_dot_product_attention(qp, kk, vv, attn_mask=mask, scale=self.sm_scale)
            o = o.view(n, hkv, g, lq, d).permute(0, 3, 1, 2, 4).reshape(n, lq, c.q_heads, d)
            out[qrows[qvalid]] = o[qvalid]
        return out
