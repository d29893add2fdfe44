"""Study 3, Streaming-LLM (paper section 4.3): attention sinks + a sliding
window over a paged cache, RoPE at the cache position.

Each sample's cache is its sink pages (the first tokens, kept forever) and a
ring of window + 1 pages: the window's full pages, oldest first, then the
page being filled. When that page fills, the oldest window page is evicted
and refilled: the page table is sinks + ring (eviction is a page-table edit,
nothing moves). Keys are cached without RoPE; a key's angle is its position
in the cache (its index in that table), so positions shift as pages leave,
as in StreamingLLM, and every step needs the cached keys rotated again:

* fused: Tessera's decode wrapper with pos_encoding_mode="ROPE_LLAMA" rotates
  q (at kv_len - 1) and each key (at its index) in the kernel: no extra pass;
* unfused: RoPE by separate kernels before attention: the step's q, and the
  layer's cached keys (a copy into a scratch pool, then Tessera's RoPE kernel
  in place at every slot's cache position), then the same decode wrapper
  without positional encoding over (scratch K, V). The pool is sized to the
  live pages, so the pass covers the live keys (plus half a page per sample).
  Two passes over K where one would do: the public RoPE functions write new
  tensors or in place, with no out= to write a rotated copy.

No window_left: FlashInfer's window masks every key left of it, the sinks
too, while after eviction the table holds exactly sinks + window, so neither
arm needs a mask (Tessera's AttentionSink variant masks sinks + window over
a full cache, through AttentionWrapper, without fused RoPE).

Decode only (the caches start full of random K / V at a steady state), every
step from a CUDA graph; ITL = step time. A sink page holds 16 tokens where
StreamingLLM keeps 4 (page granularity). The first step of both arms starts
from the same cache and tokens: their logits must agree (reported).
"""
import collections
import time
import types

import numpy as np
import torch

from .backends import KVCache, WrapperBackend
from .engine import Engine
from .pages import PagePool, Seq


class UnfusedRopeBackend(WrapperBackend):
    """The decode wrapper without positional encoding, after RoPE of q and of every cached key."""

    def __init__(self, *args, **kw):
        super().__init__(*args, **kw)
        self.rope_in_model = False
        self.scratch = torch.empty_like(self.cache.k(0))
        self.page_logical = torch.zeros(self.cache.num_pages, dtype=torch.int32, device=self.device)
        ps = self.cache.page_size
        self.offsets = torch.arange(ps, dtype=torch.int32, device=self.device)
        self.slot_pos = torch.zeros(self.cache.num_pages * ps, dtype=torch.int32, device=self.device)

    def attend(self, layer, q, k, v):
        lib, c, sd = self.lib, self.cfg, self.sd
        kc, vc = self.cache.k(layer), self.cache.v(layer)
        lib.append_paged_kv_cache(k, v, sd.batch_indices, sd.positions, (kc, vc), sd.kv_indices_full, sd.kv_indptr,
                                  sd.last_page_len, "NHD")
        if layer == 0:  # every slot's cache position, from each page's index in its table (inside the graph)
            ps = self.cache.page_size
            torch.add(self.page_logical[:, None] * ps, self.offsets[None, :], out=self.slot_pos.view(-1, ps))
        theta = float(c.rope_theta)
        hq, hk = c.q_heads // 2, c.kv_heads // 2  # q / k of one call: the two halves of the heads
        lib.apply_rope_pos_ids_inplace(q[:, :hq], q[:, hq:], sd.positions, rope_scale=1.0, rope_theta=theta)
        self.scratch.copy_(kc)
        rows = self.scratch.view(-1, c.kv_heads, c.head_dim)
        lib.apply_rope_pos_ids_inplace(rows[:, :hk], rows[:, hk:], self.slot_pos, rope_scale=1.0, rope_theta=theta)
        return self.cur.run(q, (self.scratch, vc), enable_pdl=self.pdl)


class _Sched:
    def __init__(self, dummy_slot):
        self.dummy_slot = dummy_slot


def _seqs(batch, sink_pages, window_pages, page_size, vocab, rng):
    """Samples at a steady state: sinks + window full, the current page filled to b % page_size."""
    ring_len = window_pages + 1
    seqs = []
    for b in range(batch):
        base = 1 + b * (sink_pages + ring_len)
        req = types.SimpleNamespace(prompt_len=1, prompt_ids=np.zeros(1, np.int64), rid=b, arrival=0.0)
        s = Seq(req, b, b, 1 << 30)
        s.prefilled = 1
        s.sink = list(range(base, base + sink_pages))
        s.ring = collections.deque(range(base + sink_pages, base + sink_pages + ring_len))
        s.fill = b % page_size
        s.pages = np.array(s.sink + list(s.ring), dtype=np.int32)
        s.kv_len = (sink_pages + window_pages) * page_size + s.fill
        seqs.append(s)
    return seqs


def _advance(s, page_size):
    """After a step appended one token: fill the page, and when it is full evict the window's oldest."""
    s.fill += 1
    s.kv_len += 1
    if s.fill == page_size:
        s.ring.rotate(-1)  # the oldest full page becomes the page being filled
        s.fill = 0
        s.kv_len -= page_size
        s.pages = np.array(s.sink + list(s.ring), dtype=np.int32)


def run_arm(model, lib, arm, batch, sink_pages=1, window_pages=128, steps=64, warmup=8, seed=0, pdl=True,
            use_tensor_cores=True, first_logits=None):
    """ITL of one arm ('fused' / 'unfused'); returns (result dict, the first step's logits)."""
    cfg, ps = model.cfg, 16
    P = 1 + batch * (sink_pages + window_pages + 1)
    pool = PagePool(P, ps)
    cache = KVCache(cfg, P, ps, model.device, model.dtype)
    g = torch.Generator(device=model.device).manual_seed(seed)
    cache.data.normal_(generator=g)  # the same cached K / V for both arms
    common = dict(max_pages=P + batch, use_tensor_cores=use_tensor_cores, pdl=pdl, host_page_ids=False)
    if arm == "fused":
        backend = WrapperBackend("tessera-fused-rope", lib, cfg, cache, model.device, model.dtype,
                                 pos_encoding="ROPE_LLAMA", **common)
    else:
        backend = UnfusedRopeBackend("tessera-unfused-rope", lib, cfg, cache, model.device, model.dtype, **common)
    engine = Engine(model, backend, pool, max_running=batch, token_budget=batch + 1, graphs=True, buckets=(batch,))
    sched = _Sched(batch)
    rng = np.random.default_rng(seed)
    engine.last_token[:batch] = torch.from_numpy(rng.integers(0, cfg.vocab, batch)).to(model.device)
    seqs = _seqs(batch, sink_pages, window_pages, ps, cfg.vocab, rng)
    engine.capture_graphs(sched)
    times, logits0 = [], None
    with torch.no_grad():
        for it in range(warmup + steps):
            if arm == "unfused":
                logical = np.zeros(P, np.int32)
                for s in seqs:
                    logical[s.pages] = np.arange(len(s.pages), dtype=np.int32)
                backend.page_logical.copy_(torch.from_numpy(logical))
            engine.sync()
            t = time.perf_counter()
            sd, T, n_dec, n_logits = engine.stage([(s, 1) for s in seqs], sched)
            out = engine.step(sd, T, n_dec, n_logits)
            engine.sync()
            times.append(time.perf_counter() - t)
            if it == 0:
                logits0 = out[:batch].float().cpu()
            for s in seqs:
                _advance(s, ps)
    itl = np.array(times[warmup:]) * 1e3
    res = dict(arm=arm, batch=batch, sink_tokens=sink_pages * ps, window_tokens=window_pages * ps,
               kv_len=int(np.mean([s.kv_len for s in seqs])), steps=steps,
               itl_ms=dict(median=float(np.median(itl)), p99=float(np.percentile(itl, 99)), mean=float(itl.mean())))
    if first_logits is not None:
        ref = first_logits
        res["vs_fused_first_step"] = float((logits0 - ref).abs().max() / ref.abs().max().clamp_min(1e-30))
    del engine, backend, cache
    return res, logits0


def study(model, lib, batches=(1, 16, 64), sink_pages=1, window_pages=128, steps=64, log=print, **kw):
    rows = []
    for b in batches:
        fused, l0 = run_arm(model, lib, "fused", b, sink_pages, window_pages, steps, **kw)
        unfused, _ = run_arm(model, lib, "unfused", b, sink_pages, window_pages, steps, first_logits=l0, **kw)
        ratio = unfused["itl_ms"]["median"] / fused["itl_ms"]["median"]
        rows += [fused, unfused]
        log(f"# streaming batch {b:>3} (kv ~{fused['kv_len']}): fused ITL {fused['itl_ms']['median']:.2f} ms "
            f"(p99 {fused['itl_ms']['p99']:.2f}), unfused {unfused['itl_ms']['median']:.2f} ms "
            f"(p99 {unfused['itl_ms']['p99']:.2f}): unfused / fused {ratio:.3f}; first-step logits differ by "
            f"{unfused['vs_fused_first_step']:.2e}")
        torch.cuda.empty_cache()
    return rows
