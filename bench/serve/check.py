"""The loop's logits check: serve a few requests with a backend, keep the
logits of every token the loop produced, and compare them with a dense
no-cache forward pass of the same weights over the same token sequences
(model.dense_logits) in float32.

The requests are chosen to hit what a paged loop gets wrong: prompts of 1,
15, 16, 17 tokens (page edges), prompts longer than the token budget (chunked
prefill over several steps, chunks beside decode rows), a request forked into
3 samples (shared prompt pages + the copied partial page), and decode-only
steps long enough to run from CUDA graphs (with padded rows).

Error: err = max |logits - reference| / max |reference| over every checked
row. The bound: err <= max(4 * control, floor) where control is the same error
for the dense forward pass run in the model's dtype (torch SDPA, no cache):
the rounding the dtype itself causes. A correct loop differs from that pass
only in the attention kernel's summation order and in which pass rounds
where, so it lands within a small multiple of it; floor (2e-3 for 16-bit
dtypes, 1e-5 for float32) keeps the bound meaningful when the control is
tiny. A wrong page, position, mask or fork moves logits by an O(1) fraction
of their range (attention is peaked by construction, model.Config.q_logit_std),
far above the bound: tests/python/test_serve_loop.py checks that a shifted
position and a dropped page both fail.
"""
import math

import numpy as np
import torch

from . import trace as tr
from .backends import KVCache
from .engine import Engine
from .model import dense_logits
from .pages import PagePool

PROMPTS = (1, 15, 16, 17, 70, 130, 41)
OUTPUTS = (6, 9, 5, 12, 4, 7, 6)
SAMPLES = (1, 1, 1, 1, 1, 1, 3)  # the last request forks into 3 samples
TOKEN_BUDGET, MAX_RUNNING = 48, 16
FLOOR = {torch.float16: 2e-3, torch.bfloat16: 2e-3, torch.float32: 1e-5}
FACTOR = 4.0


def check_requests(vocab, seed=7):
    return tr.fixed_requests(PROMPTS, OUTPUTS, seed=seed, vocab=vocab, n_samples=SAMPLES)


def make_bundle(model, make_backend, requests, page_size=16, extra_pages=8):
    """A page pool just large enough for `requests` and a backend over a new cache of that size."""
    need = sum(-(-(r.prompt_len + o - 1) // page_size) for r in requests
               for o in (r.sample_output_lens or (r.output_len,)))
    pool = PagePool(need + extra_pages, page_size)
    cache = KVCache(model.cfg, pool.num_pages, page_size, model.device, model.dtype)
    return pool, make_backend(cache)


def serve_and_record(model, pool, backend, requests, graphs=True, token_budget=TOKEN_BUDGET,
                     max_running=MAX_RUNNING, buckets=None, corrupt=None):
    """Runs the loop with record=True; returns [(seq, position, logits float32 [vocab])] for every token made,
    the samples and the engine. corrupt(engine) may sabotage the loop (the tests' negative controls)."""
    kw = {} if buckets is None else dict(buckets=buckets)
    engine = Engine(model, backend, pool, max_running=max_running, token_budget=token_budget, graphs=graphs,
                    record=True, **kw)
    if corrupt is not None:
        corrupt(engine)
    sched = engine.new_scheduler()
    engine.graphs_failed = engine.try_capture_graphs(sched) if engine.graphs_on else ""
    records = []

    def on_step(step, sd, logits, n_logits):
        i = 0
        for s, n in step:
            if s.decoding or s.prefilled + n == s.prompt_len:
                records.append((s, s.kv_len + n - 1, logits[i].float().cpu()))
                i += 1
    seqs, _, _ = engine.run(requests, sched=sched, on_step=on_step)
    return records, seqs, engine


def compare(model, records, seqs, cache=None):
    """(err, control, rows): the loop's and the dense model-dtype pass's errors against float32. cache: a
    dict reused across backends (token sequence -> reference logits), since backends usually produce the
    same tokens."""
    cache = {} if cache is None else cache
    by_seq = {}
    for s, p, row in records:
        by_seq.setdefault(s.sid, []).append((p, row))
    toks = {s.sid: np.concatenate([s.req.prompt_ids, np.asarray(s.tokens[:-1], dtype=np.int64)]) for s in seqs}
    todo = [t for t in {tuple(t): t for t in toks.values()}.values() if tuple(t) not in cache]
    if todo:
        ts = [torch.from_numpy(t).to(model.device) for t in todo]
        refs = dense_logits(model, ts, torch.float32)
        lows = dense_logits(model, ts, model.dtype) if model.dtype != torch.float32 else refs
        for t, r, lo in zip(todo, refs, lows):
            cache[tuple(t)] = (r.cpu(), lo.cpu())
    num = den = ctl = 0.0
    rows = 0
    for s in seqs:  # a fork child has its own decode rows; its first token is its parent's row
        ref, low = cache[tuple(toks[s.sid])]
        for p, row in by_seq.get(s.sid, []):
            num = max(num, (row - ref[p]).abs().max().item())
            ctl = max(ctl, (low[p] - ref[p]).abs().max().item())
            den = max(den, ref[p].abs().max().item())
            rows += 1
    return num / max(den, 1e-30), ctl / max(den, 1e-30), rows


def bound(control, dtype):
    return max(FACTOR * control, FLOOR.get(dtype, 2e-3))


def check_one(model, name, pool, backend, graphs=True, refs=None, log=print):
    """The check of one backend on its pool; a result dict (result['ok'] says whether it passed)."""
    reqs = check_requests(model.cfg.vocab)
    try:
        records, seqs, engine = serve_and_record(model, pool, backend, reqs, graphs=graphs)
    except Exception as e:  # a backend that cannot run is reported, not fatal to the others
        res = dict(ok=False, error=f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
        log(f"# check {name}: FAILED to run: {res['error']}")
        return res
    err, ctl, rows = compare(model, records, seqs, refs)
    b = bound(ctl, model.dtype)
    kinds = [e[0] for e in engine.log]
    res = dict(ok=bool(err <= b and math.isfinite(err)), err=err, control=ctl, bound=b, rows=rows,
               samples=len(seqs), steps=len(kinds), decode_steps=kinds.count("decode"),
               mixed_steps=kinds.count("mixed"), graphs=engine.graphs_on, graphs_failed=engine.graphs_failed,
               extra=engine.backend.stats())
    log(f"# check {name}: {'ok' if res['ok'] else 'FAILED'}  err {err:.2e}  (control {ctl:.2e}, bound {b:.2e}; "
        f"{rows} logit rows of {len(seqs)} samples, {res['mixed_steps']} mixed + {res['decode_steps']} decode "
        f"steps, graphs {'on' if engine.graphs_on else 'off'}"
        + (f" (capture failed: {engine.graphs_failed})" if engine.graphs_failed else "")
        + (f", cascade on {res['extra']['split_fraction']:.0%} of plans" if "split_fraction" in res["extra"] else "")
        + ")")
    return res


def run_check(model, backends, graphs=True, log=print):
    """backends: {name: make_backend(cache)}; each on a pool sized for the check. Returns {name: result}."""
    refs, results = {}, {}
    reqs = check_requests(model.cfg.vocab)
    for name, make in backends.items():
        pool, backend = make_bundle(model, make, reqs)
        results[name] = check_one(model, name, pool, backend, graphs, refs, log)
    return results
