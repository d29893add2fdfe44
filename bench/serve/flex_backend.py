"""FlexAttention over the paged cache: the keys are the physical page pool
([1, kv_heads, pages * page_size, head_dim], a view of the cache, no copy)
and a BlockMask built from the page table says which pages each query block
reads (KV block = one page), as torch's PagedAttention does.

* Decode rows (one query per request): one block row per request; its pages
  but the last are full blocks (no mask_mod call), the last page a partial
  block. Compiled with static shapes per batch bucket (the flex decoding
  kernel needs a static batch) and captured in the engine's CUDA graphs;
  decode rows of a mixed step are padded to a bucket too, so every decode
  call hits one of those kernels.
* Prefill chunks: queries padded to blocks of 128 rows; per (request, query
  block), the pages wholly before the block's first query are full blocks,
  those up to its last query partial. Compiled with dynamic shapes.

mask_mod is exact on its own (key's logical position from a physical ->
logical page map per request row, then < kv_len and bottom-right causal), so
the eager fallback used on the CPU computes the same attention as the
compiled kernels, which only skip the blocks the mask lists as empty.

The mask's tensors are fixed buffers (sliced, never reallocated), so a
captured graph reads each step's mask.
"""
import numpy as np
import torch

from .backends import Backend

Q_BLOCK = 128


def _flex_decode(q, k, v, block_mask, scale, kernel_options):
    from torch.nn.attention.flex_attention import flex_attention
    return flex_attention(q, k, v, block_mask=block_mask, scale=scale, enable_gqa=True,
                          kernel_options=kernel_options)


def _flex_prefill(q, k, v, block_mask, scale, kernel_options):  # its own code object: its own compile cache
    from torch.nn.attention.flex_attention import flex_attention
    return flex_attention(q, k, v, block_mask=block_mask, scale=scale, enable_gqa=True,
                          kernel_options=kernel_options)


def flex_available():
    """'' when FlexAttention can be imported, else why not."""
    try:
        import torch.nn.attention.flex_attention as fa
    except Exception as e:  # an old torch
        return f"{type(e).__name__}: {e}"
    if not hasattr(fa, "flex_attention") or not hasattr(fa.BlockMask, "from_kv_blocks"):
        return "this torch has no flex_attention / BlockMask.from_kv_blocks"
    return ""


class _MaskRows:
    """Fixed buffers of one kind of call (decode or prefill): per row (request) its physical -> logical page
    map, KV length and causal offset (kv_len - q_len), and the block lists."""

    def __init__(self, rows, num_pages, max_pages, q_blocks, device):
        i32 = dict(dtype=torch.int32, device=device)
        # What mask_mod reads is int64, as its index arithmetic is: int32 lookups made inductor's Triton code
        # mix int32 and int64 in one conditional ("Ternary expression with dynamic condition has inconsistent
        # types int64 and int32").
        i64 = dict(dtype=torch.int64, device=device)
        self.phys2log = torch.full((rows, num_pages), -1, **i64)
        self.kv_len = torch.zeros(rows, **i64)
        self.prefix = torch.zeros(rows, **i64)
        self.num = torch.zeros(rows, 1, q_blocks, **i32)
        # Block lists as wide as the pool: BlockMask sizes its dense form by their last dimension, and the
        # entries are physical page ids (up to num_pages - 1), not positions in a request.
        width = max(max_pages, num_pages)
        self.idx = torch.zeros(rows, 1, q_blocks, width, **i32)
        self.fnum = torch.zeros(rows, 1, q_blocks, **i32)
        self.fidx = torch.zeros(rows, 1, q_blocks, width, **i32)
        self._used = 0  # rows whose phys2log entries are set (cleared before the next fill)

    def mask_mod(self, page_size):
        phys2log, kv_len, prefix = self.phys2log, self.kv_len, self.prefix

        def mask(b, h, q_idx, kv_idx):
            lp = phys2log[b, kv_idx // page_size]
            logical = lp * page_size + kv_idx % page_size
            return (lp >= 0) & (logical < kv_len[b]) & (logical <= q_idx + prefix[b])
        return mask

    def fill_pages(self, rows, pages, logical, kv_lens, prefix, device):
        """Row rows[i] holds physical page pages[i] at logical index logical[i] (flat int arrays)."""
        n = len(kv_lens)
        if self._used:
            self.phys2log[: self._used].fill_(-1)
        t = lambda a, dt=torch.long: torch.from_numpy(np.ascontiguousarray(a)).to(device, dt)  # noqa: E731
        self.phys2log.index_put_((t(rows), t(pages)), t(logical))
        self.kv_len[:n].copy_(t(kv_lens))
        self.prefix[:n].copy_(t(prefix))
        self._used = n


def _flat_tables(h, reqs, pad=0):
    """The page tables of requests `reqs` (+ `pad` dummy rows of page 0) as flat arrays: (counts per row,
    row of each entry, physical page, logical index)."""
    start, end = h.kv_indptr[reqs].astype(np.int64), h.kv_indptr[reqs + 1].astype(np.int64)
    counts = np.concatenate([end - start, np.ones(pad, np.int64)])
    rows = np.repeat(np.arange(len(counts)), counts)
    first = np.concatenate([[0], np.cumsum(counts)[:-1]])
    logical = np.arange(int(counts.sum())) - first[rows]
    src = np.concatenate([start, np.zeros(pad, np.int64)])[rows] + logical
    pages = np.where(rows < len(reqs), h.kv_indices[np.minimum(src, max(len(h.kv_indices) - 1, 0))], 0)
    return counts, rows, pages.astype(np.int64), logical


class FlexBackend(Backend):
    name = "flex"
    supports_graphs = True
    pad_decode = True

    def __init__(self, cfg, cache, device, dtype, *, max_batch, max_pages, buckets, max_prefill_reqs=16,
                 compile=None, kernel_options=None):
        super().__init__(cfg, cache, device, dtype)
        from torch.nn.attention.flex_attention import BlockMask
        self.BlockMask = BlockMask
        self.buckets = sorted(b for b in buckets if b <= max_batch) or [max_batch]
        if self.buckets[-1] < max_batch:
            self.buckets.append(max_batch)
        self.max_pages = int(max_pages)
        ps, P = cache.page_size, cache.num_pages
        self.dec = _MaskRows(self.buckets[-1], P, self.max_pages, 1, self.device)
        self.pre_rows = int(max_prefill_reqs)
        self.pre = _MaskRows(self.pre_rows, P, self.max_pages, 1, self.device)  # block lists re-made per step
        self.dec_mask = self.dec.mask_mod(ps)
        self.pre_mask = self.pre.mask_mod(ps)
        compile = self.device.type == "cuda" if compile is None else compile
        # Kernel options to try, in order, until a call compiles (then kept): the KV block is one page (16
        # keys), and torch's forward kernel refuses a default tile wider than the block unless BLOCK_N is given
        # (newer versions narrow it themselves).
        if kernel_options is not None:
            self.options = [kernel_options]
        else:
            self.options = [{"BLOCK_N": ps}, None] if compile else [None]
        self.chosen = {}  # "decode" / "prefill" -> index into self.options once a call succeeded
        if compile:
            import torch._dynamo
            for name, value in (("cache_size_limit", 1000), ("accumulated_cache_size_limit", 4000),
                                ("recompile_limit", 1000), ("accumulated_recompile_limit", 4000)):
                if hasattr(torch._dynamo.config, name):
                    setattr(torch._dynamo.config, name, value)
            self.decode_fn = torch.compile(_flex_decode, dynamic=False, fullgraph=True)
            self.prefill_fn = torch.compile(_flex_prefill, dynamic=True, fullgraph=True)
        else:
            self.decode_fn, self.prefill_fn = _flex_decode, _flex_prefill
        self.bucket_masks = {}

    def _call(self, which, fn, *args):
        """fn(*args, kernel_options), trying self.options in turn until one works for this kind of call."""
        i, first = self.chosen.get(which, 0), None
        while True:
            try:
                out = fn(*args, self.options[i])
            except Exception as e:
                first = first or e
                if which in self.chosen or i + 1 >= len(self.options):
                    raise first from (e if e is not first else None)
                i += 1
                continue
            self.chosen.setdefault(which, i)
            return out

    def stats(self):
        return {k: str(self.options[i]) for k, i in self.chosen.items()}

    def _kv(self, layer):
        c, n = self.cfg, self.cache.num_pages * self.cache.page_size
        k = self.cache.rows(self.cache.k(layer)).view(1, n, c.kv_heads, c.head_dim).transpose(1, 2)
        v = self.cache.rows(self.cache.v(layer)).view(1, n, c.kv_heads, c.head_dim).transpose(1, 2)
        return k, v

    def _bucket(self, n):
        for b in self.buckets:
            if b >= n:
                return b
        raise ValueError(f"flex: {n} decode rows exceed the largest bucket {self.buckets[-1]}")

    def _decode_mask(self, bucket):
        bm = self.bucket_masks.get(bucket)
        if bm is None:  # views of the fixed buffers: a captured graph reads every later step's mask
            d = self.dec
            bm = self.BlockMask.from_kv_blocks(d.num[:bucket], d.idx[:bucket], d.fnum[:bucket], d.fidx[:bucket],
                                               BLOCK_SIZE=(Q_BLOCK, self.cache.page_size), mask_mod=self.dec_mask,
                                               seq_lengths=(1, self.cache.num_pages * self.cache.page_size))
            self.bucket_masks[bucket] = bm
        return bm

    def prepare_graph(self, bucket):
        self._decode_mask(bucket)

    def _plan_decode(self, sd, reqs):
        """Decode rows `reqs` (indices into the step's requests), padded to a bucket with dummy rows
        (page 0, one key)."""
        h, n = sd.host, len(reqs)
        bucket = self._bucket(n)
        counts, rows, pages, logical = _flat_tables(h, reqs, bucket - n)
        if counts.max() > self.max_pages:
            raise ValueError(f"flex: a request holds {counts.max()} pages, more than max_pages {self.max_pages}")
        kv = np.concatenate([h.kv_lens[reqs], np.ones(bucket - n, np.int64)]).astype(np.int64)
        d = self.dec
        d.fill_pages(rows, pages, logical, kv, kv - 1, self.device)
        full = np.zeros((bucket, d.fidx.shape[-1]), np.int32)
        inner = logical < (counts - 1)[rows]  # every page but a row's last is a full block
        full[rows[inner], logical[inner]] = pages[inner]
        last = pages[np.cumsum(counts) - 1]
        t = lambda a: torch.from_numpy(np.ascontiguousarray(a, dtype=np.int32)).to(self.device)  # noqa: E731
        d.fidx[:bucket, 0, 0].copy_(t(full))
        d.fnum[:bucket, 0, 0].copy_(t(counts - 1))
        d.idx[:bucket, 0, 0, 0].copy_(t(last))
        d.num[:bucket, 0, 0].fill_(1)
        qrows = torch.from_numpy(h.qo_indptr[reqs].astype(np.int64)).to(self.device)
        return bucket, qrows, self._decode_mask(bucket)

    def _plan_prefill(self, sd, reqs):
        h, ps = sd.host, self.cache.page_size
        n = len(reqs)
        if n > self.pre_rows:
            raise ValueError(f"flex: {n} prefill chunks in a step, more than max_prefill_reqs {self.pre_rows}")
        ql = h.q_lens[reqs].astype(np.int64)
        kvl = h.kv_lens[reqs].astype(np.int64)
        prefix = kvl - ql
        lq = -(-int(ql.max()) // Q_BLOCK) * Q_BLOCK
        nqb = lq // Q_BLOCK
        counts, rows, flat_pages, logical = _flat_tables(h, reqs)
        if counts.max() > self.max_pages:
            raise ValueError(f"flex: a request holds {counts.max()} pages, more than max_pages {self.max_pages}")
        self.pre.fill_pages(rows, flat_pages, logical, kvl, prefix, self.device)
        pages = np.split(flat_pages.astype(np.int32), np.cumsum(counts)[:-1])
        num = np.zeros((n, 1, nqb), np.int32)
        fnum = np.zeros((n, 1, nqb), np.int32)
        width = max(self.max_pages, self.cache.num_pages)  # as _MaskRows: BlockMask's dense width
        idx = np.zeros((n, 1, nqb, width), np.int32)
        fidx = np.zeros((n, 1, nqb, width), np.int32)
        for b in range(n):
            p = pages[b]
            for qb in range(nqb):
                first = qb * Q_BLOCK
                if first >= ql[b]:
                    break  # padding block: no keys, output rows dropped
                last_row = min(first + Q_BLOCK, int(ql[b])) - 1
                n_full = min((int(prefix[b]) + first + 1) // ps, len(p))
                n_any = min((int(prefix[b]) + last_row) // ps + 1, len(p))
                fnum[b, 0, qb], num[b, 0, qb] = n_full, n_any - n_full
                fidx[b, 0, qb, :n_full] = p[:n_full]
                idx[b, 0, qb, : n_any - n_full] = p[n_full:n_any]
        t = lambda a: torch.from_numpy(a).to(self.device)  # noqa: E731
        bm = self.BlockMask.from_kv_blocks(t(num), t(idx), t(fnum), t(fidx), BLOCK_SIZE=(Q_BLOCK, ps),
                                           mask_mod=self.pre_mask,
                                           seq_lengths=(lq, self.cache.num_pages * ps))
        i = np.arange(lq)[None, :]
        qvalid = i < ql[:, None]
        qrows = np.where(qvalid, h.qo_indptr[reqs][:, None].astype(np.int64) + i, 0)
        return torch.from_numpy(qrows).to(self.device), torch.from_numpy(qvalid).to(self.device), bm

    def plan(self, sd):
        h = sd.host
        single = np.nonzero(h.q_lens == 1)[0]
        multi = np.nonzero(h.q_lens > 1)[0]
        self.sd = sd
        self.dec_plan = self._plan_decode(sd, single) if len(single) else None
        self.pre_plan = self._plan_prefill(sd, multi) if len(multi) else None
        self.only_decode = len(multi) == 0 and self.dec_plan[0] == len(single)

    def attend(self, layer, q, k, v):
        c = self.cfg
        self.scatter_append(layer, k, v, self.sd)
        kk, vv = self._kv(layer)
        if self.only_decode:  # a decode-only step, already padded to its bucket: rows are the requests
            o = self._call("decode", self.decode_fn, q.unsqueeze(2), kk, vv, self.dec_plan[2], self.sm_scale)
            return o.squeeze(2)
        out = q.new_empty(q.shape)
        if self.dec_plan is not None:
            bucket, rows, bm = self.dec_plan
            qd = q.new_zeros(bucket, c.q_heads, 1, c.head_dim)
            qd[: rows.shape[0], :, 0] = q.index_select(0, rows)
            o = self._call("decode", self.decode_fn, qd, kk, vv, bm, self.sm_scale)
            out.index_copy_(0, rows, o[: rows.shape[0], :, 0])
        if self.pre_plan is not None:
            qrows, qvalid, bm = self.pre_plan
            qp = q[qrows].transpose(1, 2)  # [n, Hq, lq, d]
            o = self._call("prefill", self.prefill_fn, qp, kk, vv, bm, self.sm_scale).transpose(1, 2)
            out[qrows[qvalid]] = o[qvalid]
        return out
