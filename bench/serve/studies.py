"""Studies 1 and 2 and their metrics.

Study 1 (paper section 4.1): each backend serves the same ShareGPT-like trace
at several Poisson request rates; per rate, median and p99 ITL and TTFT and
the running batch sizes reached.

Study 2 (paper section 4.4), parallel generation: P prompts x n samples
(n = 1 .. 64, P x n about --par-samples), all arriving at once, for each
prompt-length median of --par-prompt-median (ShareGPT-like 250 tokens and
long 1500-token prompts by default); each prompt is prefilled once and
forked, its samples sharing the prompt's full pages. --par-rounds
interleaved rounds of both arms per n, ratios paired by round (medians).
Tessera with plan(..., shared_prefix="auto") against plan() without it
(at n = 1 without it twice, before and after, to show the noise band),
decode steps from CUDA graphs in both arms (with graphs the option runs the
cascade on every decode step, groups being runs of adjacent samples), page
ids given on the host in both (the detection reads them there).
"""
import gc
import math
import time

import numpy as np
import torch

from . import trace as tr


def pct(xs, q):
    return float(np.percentile(xs, q)) if len(xs) else float("nan")


def summarize(seqs, log, truncated, duration=None):
    """Latency and batch metrics of one run (times in ms)."""
    first = {}
    for s in seqs:  # TTFT per request: its samples share the prompt's first token
        if s.token_times:
            first[s.req.rid] = min(first.get(s.req.rid, math.inf), s.token_times[0] - s.req.arrival)
    ttft = np.array(list(first.values())) * 1e3
    itl = np.concatenate([np.diff(s.token_times) for s in seqs if len(s.token_times) > 1] or [np.zeros(0)]) * 1e3
    batch = np.array([e[1] for e in log]) if log else np.zeros(1)
    dec = [(e[5] - e[4]) * 1e3 for e in log if e[0] == "decode"]
    mixed = [(e[5] - e[4]) * 1e3 for e in log if e[0] == "mixed"]
    dec_plan = [e[8] for e in log if e[0] == "decode"]  # host plan() and GPU forward of decode steps (ms)
    dec_gpu = [e[9] for e in log if e[0] == "decode"]
    dec_stage = [e[10] for e in log if e[0] == "decode"]  # host staging and launch of decode steps (ms)
    dec_launch = [e[11] for e in log if e[0] == "decode"]
    span = (log[-1][5] - log[0][4]) if log else 0.0
    tokens = sum(len(s.token_times) for s in seqs)
    spans = [(e[5] - e[4], e[1]) for e in log]
    return dict(requests=len(first), samples=len(seqs), finished=sum(1 for s in seqs if s.finished),
                truncated=bool(truncated), duration_s=float(duration if duration is not None else span),
                output_tokens=int(tokens), tokens_per_s=float(tokens / span) if span else 0.0,
                ttft_ms=dict(median=pct(ttft, 50), p99=pct(ttft, 99), mean=float(ttft.mean()) if ttft.size else None),
                itl_ms=dict(median=pct(itl, 50), p99=pct(itl, 99), mean=float(itl.mean()) if itl.size else None),
                batch=dict(max=int(batch.max()), mean=float(batch.mean()),
                           time_weighted=float(sum(t * b for t, b in spans) / max(sum(t for t, _ in spans), 1e-9))),
                steps=dict(total=len(log), decode=len(dec), mixed=len(mixed),
                           decode_ms_median=pct(dec, 50), mixed_ms_median=pct(mixed, 50),
                           decode_plan_ms_median=pct(dec_plan, 50), decode_gpu_ms_median=pct(dec_gpu, 50),
                           decode_stage_ms_median=pct(dec_stage, 50), decode_launch_ms_median=pct(dec_launch, 50)))


def fmt_run(name, rate, m):
    return (f"{name:>10} rate {rate:>6}: ITL {m['itl_ms']['median']:7.2f} / {m['itl_ms']['p99']:7.2f} ms, "
            f"TTFT {m['ttft_ms']['median']:8.1f} / {m['ttft_ms']['p99']:8.1f} ms (median / p99), batch max "
            f"{m['batch']['max']:>3} mean {m['batch']['mean']:6.1f}, {m['requests']} requests, "
            f"{m['steps']['total']} steps ({m['steps']['decode']} decode {m['steps']['decode_ms_median']:.2f} ms "
            f"(plan {m['steps']['decode_plan_ms_median']:.2f}, GPU {m['steps']['decode_gpu_ms_median']:.2f}), "
            f"{m['steps']['mixed']} mixed {m['steps']['mixed_ms_median']:.2f} ms), {m['duration_s']:.1f} s"
            + ("  TRUNCATED" if m["truncated"] else ""))


def warm_up(engine, vocab, prompt_cap=2048):
    """Untimed runs that reach every kernel a timed run will (JITs, FlexAttention compiles: one and several
    prefill chunks of one and of several 128-row blocks, decode rows beside chunks)."""
    for lens in ((50,), (300,), (60, 40), (700, 90, 20)):
        lens = [min(n, prompt_cap) for n in lens]
        engine.run(tr.fixed_requests(lens, [3] * len(lens), seed=len(lens), vocab=vocab))


def warm_up_forks(engine, vocab, prompt_cap, max_running):
    """Untimed: two prompts forked into many samples beside a third prompt long enough for a second chunk,
    so shared_prefix="auto" splits in decode steps and in a step mixing decode rows with a chunk: the
    cascade's kernels load and its workspace is allocated before anything is timed."""
    n = max(2, min(32, (max_running - 1) // 2))
    p = min(600, prompt_cap)
    engine.run(tr.fixed_requests([p, p, min(1500, prompt_cap)], [6, 6, 4], seed=11, vocab=vocab,
                                 n_samples=[n, n, 1]))


def serving(model, make_engine, backends, rates, args, log=print, deadline=None):
    """Study 1. make_engine(name, make_backend) -> (engine, cleanup); returns result rows."""
    rows = []
    for name, make in backends.items():
        if deadline is not None and time.perf_counter() + 60 > deadline:  # setup (graphs, compiles) takes time
            log(f"# serving {name}: skipped (the run's deadline)")
            rows.append(dict(backend=name, skipped="deadline"))
            continue
        t0 = time.perf_counter()
        try:
            engine, cleanup = make_engine(name, make)
            why = engine.try_capture_graphs(engine.new_scheduler())
            if why:
                log(f"# serving {name}: CUDA graphs failed ({why}); running without them")
            warm_up(engine, model.cfg.vocab, args.prompt_cap)
        except Exception as e:
            log(f"# serving {name}: cannot run: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
            rows.append(dict(backend=name, skipped=f"{type(e).__name__}: {e}"[:300]))
            gc.collect()
            continue
        log(f"# serving {name}: ready in {time.perf_counter() - t0:.1f} s (graphs "
            f"{'on, ' + str(len(engine.graphs)) + ' buckets' if engine.graphs_on else 'off'})")
        for i, rate in enumerate(rates):
            if deadline is not None and time.perf_counter() + args.run_limit + 5 > deadline:
                log(f"# serving {name} rate {rate}: skipped (the run's deadline)")
                rows.append(dict(backend=name, rate=rate, skipped="deadline"))
                continue
            reqs = tr.sharegpt_like(max(8, int(round(rate * args.window))), rate, seed=args.seed + i,
                                    vocab=model.cfg.vocab, prompt_cap=args.prompt_cap, output_cap=args.output_cap)
            try:
                seqs, steps, truncated = engine.run(reqs, time_limit=args.run_limit)
            except Exception as e:  # reported; this backend's later rates would start from a broken state
                why = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:300]
                log(f"# serving {name} rate {rate}: FAILED: {why}")
                rows.append(dict(backend=name, rate=rate, skipped=f"failed: {why}"))
                break
            m = summarize(seqs, steps, truncated)
            m.update(backend=name, rate=rate, graphs=engine.graphs_on, graphs_failed=why, trace=tr.describe(reqs),
                     backend_stats=engine.backend.stats())
            rows.append(m)
            log("# " + fmt_run(name, rate, m))
        cleanup(engine)
    return rows


def median_run(runs):
    """Of one arm's rounds, the run with the median ITL median (the lower middle of an even count), with
    every round's ITL median and decode-step GPU median beside it."""
    pick = sorted(runs, key=lambda m: m["itl_ms"]["median"])[(len(runs) - 1) // 2]
    return dict(pick, rounds=len(runs), itl_median_rounds=[m["itl_ms"]["median"] for m in runs],
                decode_gpu_ms_rounds=[m["steps"]["decode_gpu_ms_median"] for m in runs])


def parallel(model, make_engine, ns, args, log=print, deadline=None):
    """Study 2: rows per (n, arm). With args.par_rounds R > 1 each n runs R rounds of both arms (which
    goes first alternating), each arm's row is its median round (median_run) and the auto row's
    itl_ratio is the median of the rounds' paired none / auto ITL median ratios."""
    rows = []
    engines = {}
    for arm in ("none", "auto"):
        engines[arm] = make_engine(arm)
        why = engines[arm][0].try_capture_graphs(engines[arm][0].new_scheduler())
        if why:
            log(f"# parallel, arm {arm}: CUDA graphs failed ({why}); running without them")
        warm_up(engines[arm][0], model.cfg.vocab, args.prompt_cap)
        warm_up_forks(engines[arm][0], model.cfg.vocab, args.prompt_cap, args.max_running)
    medians = [int(m) for m in str(args.par_prompt_median).split(",")]
    rounds = int(getattr(args, "par_rounds", 1))
    for median, n in ((m, n) for m in medians for n in ns):
        if deadline is not None and time.perf_counter() > deadline:
            log(f"# parallel prompts ~{median} n={n}: skipped (the run's deadline)")
            rows.append(dict(n=n, prompt_median=median, skipped="deadline"))
            continue
        prompts = max(1, args.par_samples // n)
        reqs = tr.sharegpt_like(prompts, math.inf, seed=args.seed + 100, vocab=model.cfg.vocab,
                                prompt_cap=args.prompt_cap, output_cap=args.par_output_cap, n_samples=n,
                                prompt_median=median)
        runs = {}
        for r in range(rounds):
            order = ("none", "auto") if (n + r) % 2 else ("auto", "none")  # alternate which arm runs first
            if n == 1 and r == 0:  # none / auto / none again: the second none run is the noise band at n = 1
                order = ("none", "auto", "none-again")
            for arm in order:
                engine = engines[arm.split("-")[0]][0]
                engine.backend._sp_stats = []
                seqs, steps, truncated = engine.run(reqs, time_limit=args.run_limit)
                m = summarize(seqs, steps, truncated)
                m.update(n=n, prompts=prompts, prompt_median=median, arm=arm, graphs=engine.graphs_on,
                         trace=tr.describe(reqs), backend_stats=engine.backend.stats())
                runs.setdefault(arm, []).append(m)
        out = {arm: median_run(ms) for arm, ms in runs.items()}
        ratios = [b["itl_ms"]["median"] / a["itl_ms"]["median"] for a, b in zip(runs["auto"], runs["none"])]
        out["auto"].update(itl_ratio=float(np.median(ratios)), itl_ratio_rounds=ratios)
        rows += list(out.values())
        a, b = out["auto"], out["none"]
        log(f"# parallel prompts ~{median} n={n:>2} ({prompts} prompts, batch max {a['batch']['max']}): ITL median "
            f"{b['itl_ms']['median']:.2f} -> {a['itl_ms']['median']:.2f} ms (none / auto "
            f"{a['itl_ratio']:.3f}{'' if rounds == 1 else f', median of {rounds} rounds paired'}), "
            f"TTFT median {b['ttft_ms']['median']:.1f} -> "
            f"{a['ttft_ms']['median']:.1f} ms; decode step plan + GPU {b['steps']['decode_plan_ms_median']:.2f} + "
            f"{b['steps']['decode_gpu_ms_median']:.2f} -> {a['steps']['decode_plan_ms_median']:.2f} + "
            f"{a['steps']['decode_gpu_ms_median']:.2f} ms; cascade on {a['backend_stats'].get('split_fraction', 0):.0%} of plans, "
            f"groups in {a['backend_stats'].get('grouped_fraction', 0):.0%}, "
            f"detection {a['backend_stats'].get('detect_us_median', float('nan')):.1f} us"
            + (f"; none / none again {b['itl_ms']['median'] / out['none-again']['itl_ms']['median']:.3f}"
               if "none-again" in out else ""))
    for arm, (engine, cleanup) in engines.items():
        cleanup(engine)
    return rows


def release():
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
