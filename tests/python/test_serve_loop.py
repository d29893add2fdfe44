"""The serving loop of bench/serve on the CPU (tiny shapes, the sdpa and eager flex backends): its
logits against the dense float32 reference, the check's power to catch a broken loop, the scheduler's
invariants, and the Tessera calls that run on host tensors (append, the unfused-RoPE arm's RoPE) or
validate without a GPU (every plan() the Tessera backend makes). Skipped without torch."""

import math
import os
import sys

import numpy as np
import pytest

try:
    import torch
except Exception:  # the CI image has no torch: the loop needs it
    torch = None

pytestmark = [pytest.mark.skipif(torch is None, reason="skipped: torch not available"),
              # the CPU runs FlexAttention eagerly on purpose (tiny shapes; the GPU compiles it)
              pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")]

BENCH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench")
if BENCH not in sys.path:
    sys.path.insert(0, BENCH)


def _serve():
    from serve import backends, check, engine, model, pages, scheduler, trace
    return backends, check, engine, model, pages, scheduler, trace


def _tessera():
    try:
        import tessera
        tessera.gpu_available()
        return tessera
    except Exception as e:
        pytest.skip(f"skipped: tessera not importable ({type(e).__name__})")


@pytest.fixture(scope="module")
def tiny16():
    _, _, _, M, _, _, _ = _serve()
    return M.Model(M.tiny(layers=2), "cpu", torch.float16, seed=3)


@pytest.fixture(scope="module")
def tiny32():
    _, _, _, M, _, _, _ = _serve()
    return M.Model(M.tiny(layers=2), "cpu", torch.float32, seed=3)


def sdpa(model):
    BK = _serve()[0]
    return lambda cache: BK.SdpaBackend(model.cfg, cache, "cpu", model.dtype)


def flex(model):
    from serve import flex_backend as FX
    if FX.flex_available():
        pytest.skip(f"skipped: {FX.flex_available()}")
    return lambda cache: FX.FlexBackend(model.cfg, cache, "cpu", model.dtype, max_batch=16, max_pages=16,
                                        buckets=(1, 2, 4, 8, 16))


def run_check(model, make, **kw):
    _, CK, *_ = _serve()
    reqs = CK.check_requests(model.cfg.vocab)
    pool, backend = CK.make_bundle(model, make, reqs)
    records, seqs, engine = CK.serve_and_record(model, pool, backend, reqs, **kw)
    err, ctl, rows = CK.compare(model, records, seqs)
    return err, ctl, rows, seqs, engine


@pytest.mark.parametrize("backend", ["sdpa", "flex"])
def test_logits_match_dense_float32(tiny32, backend):
    """float32 end to end: the loop (chunked prefill, mixed steps, forks, page edges) equals the dense
    no-cache pass up to summation order."""
    err, ctl, rows, seqs, engine = run_check(tiny32, sdpa(tiny32) if backend == "sdpa" else flex(tiny32))
    assert rows == sum(s.output_len for s in seqs) - 2  # the 2 forked samples' first rows are their parent's
    assert {"mixed", "decode"} <= {e[0] for e in engine.log}
    assert err < 1e-5, err


@pytest.mark.parametrize("backend", ["sdpa", "flex"])
def test_logits_check_fp16_within_bound(tiny16, backend):
    _, CK, *_ = _serve()
    err, ctl, rows, _, _ = run_check(tiny16, sdpa(tiny16) if backend == "sdpa" else flex(tiny16))
    assert 0 < ctl < 5e-3, ctl
    assert err <= CK.bound(ctl, torch.float16), (err, ctl)


def _shift_positions(engine):
    """Decode rows rotate their q and new k two positions late (a uniform shift of every position would
    change nothing: RoPE is relative)."""
    stage = engine.stage

    def shifted(step, sched):
        out = stage(step, sched)
        n_dec = sum(1 for s, _ in step if s.decoding)
        out[0].positions[:n_dec].add_(2)
        return out
    engine.stage = shifted


def _foreign_page(engine):
    """Request rows read one page of another request's in place of their first page (from the second step)."""
    stage = engine.stage
    calls = [0]

    def swapped(step, sched):
        out = stage(step, sched)
        calls[0] += 1
        h = out[0].host
        if calls[0] > 1 and len(h.kv_indptr) > 2:
            a, b = int(h.kv_indptr[0]), int(h.kv_indptr[1])
            other = int(h.kv_indices[b])  # the second request's first page
            out[0].kv_indices_full[a] = other
            h.kv_indices[a] = other
        return out
    engine.stage = swapped


@pytest.mark.parametrize("corrupt", [_shift_positions, _foreign_page])
def test_check_catches_a_broken_loop(tiny16, corrupt):
    _, CK, *_ = _serve()
    err, ctl, _, _, _ = run_check(tiny16, sdpa(tiny16), corrupt=corrupt)
    assert err > 10 * CK.bound(ctl, torch.float16), (err, ctl)


def test_scheduler_invariants(tiny32):
    """A random trace with forks through the real loop: budgets, ordering, slots, pages and lengths."""
    BK, _, E, _, PG, SC, TR = _serve()
    reqs = TR.sharegpt_like(14, 400.0, seed=5, vocab=tiny32.cfg.vocab, prompt_cap=150, output_cap=20)
    reqs += TR.fixed_requests([33, 64], [7, 3], seed=9, vocab=tiny32.cfg.vocab, n_samples=[4, 2])
    for i, r in enumerate(reqs):
        r.rid = i
    ps, budget, max_running = 16, 40, 8
    pool = PG.PagePool(90, ps)  # too small for everything at once: admission must wait for pages
    cache = BK.KVCache(tiny32.cfg, pool.num_pages, ps, "cpu", torch.float32)
    engine = E.Engine(tiny32, BK.SdpaBackend(tiny32.cfg, cache, "cpu", torch.float32), pool,
                      max_running=max_running, token_budget=budget, max_prefill_reqs=3)
    sched = engine.new_scheduler()
    schedule = sched.schedule
    seen = []

    def checked():
        step = schedule()
        seen.append((len(step), sum(1 for s, _ in step if s.decoding)))  # (samples, decode rows) when scheduled
        n_tokens = sum(n for _, n in step)
        assert n_tokens <= budget
        kinds = [s.decoding for s, _ in step]
        assert kinds == sorted(kinds, reverse=True)  # decode rows first
        assert all(n == 1 for s, n in step if s.decoding)
        assert sum(1 for s, _ in step if not s.decoding) <= 3
        assert all(0 < n <= s.prompt_len - s.prefilled for s, n in step if not s.decoding)
        assert len(sched.running) + sum(len(s.pending_children) for s in sched.running) <= max_running
        slots = [s.slot for s in sched.running] + [c[0] for s in sched.running for c in s.pending_children]
        assert len(slots) == len(set(slots))
        for s in sched.running:  # every page a sample reads is held for it
            assert (pool.refs[s.pages] > 0).all()
        return step
    sched.schedule = checked
    seqs, log, truncated = engine.run(reqs, sched=sched)
    assert not truncated and not sched.running and not sched.waiting
    assert pool.in_use() == 0 and pool.refs[0] == 1 and (pool.refs[1:] == 0).all()
    assert len(seqs) == sum(r.n_samples for r in reqs)
    for s in seqs:
        assert s.finished and s.n_out == s.output_len == len(s.token_times)
        assert s.kv_len == s.max_kv_len and len(s.pages) * ps >= s.max_kv_len
        assert all(b >= a for a, b in zip(s.token_times, s.token_times[1:]))
    forked = [s for s in seqs if s.req.n_samples == 4]
    shared = forked[0].prompt_len // ps
    assert len({tuple(s.pages[:shared]) for s in forked}) == 1  # the prompt's full pages, shared
    assert len({int(s.pages[shared]) for s in forked}) == 4  # each sample's own copy of the partial page
    assert any(0 < dec < n for n, dec in seen)  # steps mixing decode rows and prompt chunks happened
    assert max(n for n, _ in seen) == max_running


def test_trace_is_seeded_and_capped():
    *_, TR = _serve()
    a = TR.sharegpt_like(500, 10.0, seed=1)
    b = TR.sharegpt_like(500, 10.0, seed=1)
    assert [(r.prompt_len, r.output_len, r.arrival) for r in a] == [(r.prompt_len, r.output_len, r.arrival) for r in b]
    d = TR.describe(a)
    assert 180 < d["prompt_median"] < 330 and 140 < d["output_median"] < 270
    assert d["prompt_max"] <= TR.PROMPT_CAP and d["output_max"] <= TR.OUTPUT_CAP
    gaps = np.diff([r.arrival for r in a])
    assert (gaps >= 0).all() and 0.07 < gaps.mean() < 0.13  # Poisson at 10 / s
    assert all(r.arrival == 0 for r in TR.sharegpt_like(5, math.inf))


def test_tessera_append_convention(tiny16):
    """The Tessera backend's append call (the fixed page-id buffer longer than the step's table, device-style
    int32 views) on host tensors: the loop still matches the reference."""
    tessera = _tessera()
    BK, CK, *_ = _serve()

    class TesseraAppendSdpa(BK.SdpaBackend):
        def scatter_append(self, layer, k, v, sd):
            tessera.append_paged_kv_cache(k, v, sd.batch_indices, sd.positions, (self.cache.k(layer),
                                          self.cache.v(layer)), sd.kv_indices_full, sd.kv_indptr,
                                          sd.last_page_len, "NHD")
    err, ctl, _, _, _ = run_check(tiny16, lambda cache: TesseraAppendSdpa(tiny16.cfg, cache, "cpu", torch.float16))
    assert err <= CK.bound(ctl, torch.float16)


def test_unfused_rope_on_head_halves_matches_model_rope(tiny16):
    """Study 3's unfused arm rotates [rows, heads, d] in one call as q = heads[:h/2], k = heads[h/2:]."""
    tessera = _tessera()
    _, _, _, M, *_ = _serve()
    cfg = tiny16.cfg
    x = torch.randn(37, 8, cfg.head_dim, dtype=torch.float16)
    pos = torch.randint(0, 3000, (37,), dtype=torch.int32)
    got = x.clone()
    tessera.apply_rope_pos_ids_inplace(got[:, :4], got[:, 4:], pos, rope_scale=1.0, rope_theta=cfg.rope_theta)
    want = M.apply_rope(x, tiny16.cos[pos.long()], tiny16.sin[pos.long()])
    assert (got.float() - want.float()).abs().max().item() < 2e-2  # fp16 outputs, angles up to 3000 rad


def test_tessera_plans_pass_validation_without_gpu(tiny16):
    """Every plan() the Tessera backend makes (prefill, decode, fused RoPE, shared_prefix="auto") passes
    Tessera's argument checks; only the CUDA workspace is missing on the CPU."""
    tessera = _tessera()
    BK, CK, E, _, PG, _, _ = _serve()
    pool = PG.PagePool(200, 16)
    cache = BK.KVCache(tiny16.cfg, 200, 16, "cpu", torch.float16)
    for kw in (dict(), dict(shared_prefix="auto"), dict(pos_encoding="ROPE_LLAMA")):
        be = BK.WrapperBackend("tessera", tessera, tiny16.cfg, cache, "cpu", torch.float16, max_pages=400, **kw)
        engine = E.Engine(tiny16, be, pool, max_running=16, token_budget=48, graphs=False)
        sched = engine.new_scheduler()
        for r in CK.check_requests(tiny16.cfg.vocab):
            sched.arrive(r)
        sd = engine.stage(sched.schedule(), sched)[0]
        for kind in ("mixed", "decode"):
            sd.kind = kind
            with pytest.raises(TypeError, match="float_workspace_buffer"):
                be.plan(sd)
        be.prepare_graph(8)  # the graph wrappers' constructor arguments


def test_forks_are_found_by_shared_prefix_detection(tiny32):
    """The page tables the loop builds after a fork are what Tessera's detection groups (identical full page ids
    at identical positions): every step with the 3 decoding samples of the forked request splits."""
    tessera = _tessera()
    _, CK, E, *_ = _serve()
    reqs = CK.check_requests(tiny32.cfg.vocab)
    pool, backend = CK.make_bundle(tiny32, sdpa(tiny32), reqs)
    engine = E.Engine(tiny32, backend, pool, max_running=16, token_budget=48)
    found = []

    def detect(step, sd, logits, n_logits):
        h = sd.host
        members = sum(1 for s, _ in step if s.req.n_samples == 3)
        if members < 3 or not all(s.decoding for s, _ in step if s.req.n_samples == 3):
            return
        for causal, qo in ((False, None), (True, h.qo_indptr)):
            split = tessera._C.find_shared_prefixes(h.kv_indptr, h.kv_indices, h.last_page_len, 16, qo,
                                                    min_saved_pages=0, causal=causal)
            groups = split["groups"]
            found.append((bool(split["split"]), int(groups[:, 1].max()) if groups.size else 0))
    engine.run(reqs, on_step=detect)
    assert found and all(ok and members == 3 for ok, members in found), found


def test_parallel_study_driver(tiny32):
    """Study 2's driver end to end, with the sdpa backend standing in for both Tessera arms."""
    import types
    BK, _, E, _, PG, _, _ = _serve()
    from serve import report, studies
    pool = PG.PagePool(1500, 16)
    cache = BK.KVCache(tiny32.cfg, pool.num_pages, 16, "cpu", torch.float32)

    def make_engine(arm):
        be = BK.SdpaBackend(tiny32.cfg, cache, "cpu", torch.float32)
        return E.Engine(tiny32, be, pool, max_running=32, token_budget=256, graphs=False), lambda e: None
    args = types.SimpleNamespace(par_samples=8, seed=0, prompt_cap=200, par_output_cap=12, par_prompt_median=60,
                                 run_limit=None, max_running=32)
    lines = []
    rows = studies.parallel(tiny32, make_engine, [1, 4], args, log=lines.append)
    assert [(r["n"], r["arm"]) for r in rows] == [(1, "none"), (1, "auto"), (1, "none-again"), (4, "auto"),
                                                  (4, "none")]
    assert all(r["samples"] == 8 and r["requests"] == 8 // r["n"] for r in rows)
    assert all(r["steps"][f"decode_{part}_ms_median"] >= 0 for r in rows for part in ("stage", "plan", "launch"))
    assert pool.in_use() == 0 and len(lines) == 2 and "none / none again" in lines[0]
    doc = dict(model=dict(layers=2, hidden=256, q_heads=8, kv_heads=2, head_dim=128), dtype="float32",
               config=dict(token_budget=256, max_running=32), parallel=rows)
    md = report.markdown(doc)
    assert "## Study 2" in md
    n1 = next(line for line in md.splitlines() if line.startswith("| 60 | 1 |"))
    assert n1.count("|") == 12 and n1.split("|")[6].strip() != ""  # the none / none again column
    # Rounds: one row per arm (its median round), the ratio the median of the rounds' paired ratios.
    args.par_rounds = 3
    rows = studies.parallel(tiny32, make_engine, [4], args, log=lines.append)
    assert sorted(r["arm"] for r in rows) == ["auto", "none"] and all(r["rounds"] == 3 for r in rows)
    auto = next(r for r in rows if r["arm"] == "auto")
    assert len(auto["itl_ratio_rounds"]) == 3 and auto["itl_ratio"] == sorted(auto["itl_ratio_rounds"])[1]
    assert all(r["itl_ms"]["median"] == sorted(r["itl_median_rounds"])[1] for r in rows)
    assert "median of 3 rounds paired" in lines[-1] and pool.in_use() == 0


def test_run_all_par_rounds():
    """--par-rounds: 3 in the full mode, 1 in the quick one; below 1 refused by name."""
    from serve import run_all
    assert run_all.parse([]).par_rounds == 3 and run_all.parse(["--quick"]).par_rounds == 1
    with pytest.raises(SystemExit, match="--par-rounds"):
        run_all.parse(["--par-rounds", "0"])


def test_run_all_cpu_smoke(tmp_path):
    from serve import run_all
    out = tmp_path / "serve.json"
    rc = run_all.main(["--device", "cpu", "--tiny", "--quick", "--backends", "sdpa", "--rates", "20",
                       "--window", "0.5", "--studies", "1", "--out", str(out)])
    assert rc == 0
    import json
    doc = json.loads(out.read_text())
    assert doc["check"]["sdpa"]["ok"]
    (row,) = [r for r in doc["serving"] if r.get("backend") == "sdpa"]
    assert row["requests"] == 10 and row["itl_ms"]["median"] > 0 and not row["truncated"]
    assert (tmp_path / "serve.md").read_text().startswith("# Serving loop")


def test_par_limits_argument():
    from serve import run_all
    assert run_all.parse_limits(None) is None
    assert run_all.parse_limits("512,4,32768") == (512, 4, 32768)
    assert run_all.parse_limits("1,-1,-1") == (1, -1, -1)
    for bad in ("512,4", "0,4,1", "a,b,c"):
        with pytest.raises(SystemExit, match="--par-limits"):
            run_all.parse_limits(bad)
