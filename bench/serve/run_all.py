"""The serving loop's three studies in one command, on every backend that is
available: Tessera, FlashInfer (when importable), torch SDPA on padded KV,
FlexAttention with a paged block mask.

  python bench/serve/run_all.py [--out bench/results/serve.json]   full run (~7 min on an H100)
  python bench/serve/run_all.py --quick                          4 layers, fewer requests (~3 min)
  python bench/serve/run_all.py --check                          only the logits check
  python bench/serve/run_all.py --device cpu --tiny --quick      CPU smoke run (sdpa, flex eager)

Full run (Llama-3.1-8B shape, fp16), in this order: for Tessera and
FlashInfer the logits check, then Study 1 at 12 / 32 / 80 requests/s, each a
6 s Poisson window of the ShareGPT-like trace (72 / 192 / 480 requests;
prompts capped at 2048, outputs at 1024 tokens), every run cut at 30 s; the
check of Tessera's shared_prefix="auto" arm; Study 2 (Tessera, n = 1 .. 64,
about 128 samples each, outputs capped at 256); Study 3 (Tessera, batch 1 /
16 / 64, sink 16 + window 2048 tokens, 64 steps); then check + Study 1 for
SDPA and FlexAttention (the slow ones: gathers, compiles). A deadline (540 s
full, 230 s quick) skips what is left rather than overrun, saying so. Writes
JSON, markdown and PNG beside --out (and into $OUT when set), the JSON after
every study.
"""
import argparse
import datetime
import os
import platform
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))  # bench/: `serve` is a package there

MODES = {  # defaults per mode; command-line flags override
    "full": dict(layers=32, rates="12,32,80", window=6.0, run_limit=30.0, output_cap=1024, par_ns="1,2,4,8,16,32,64",
                 par_samples=128, par_rounds=3, stream_batches="1,16,64", deadline=540.0, max_running=256),
    "quick": dict(layers=4, rates="16,64", window=3.0, run_limit=20.0, output_cap=512, par_ns="1,8,64",
                  par_samples=64, par_rounds=1, stream_batches="16", deadline=230.0, max_running=128),
}


def parse(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--check", action="store_true", help="only the logits check")
    ap.add_argument("--out", default=None, help="JSON path (default bench/results/serve[-quick|-check].json)")
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    ap.add_argument("--tiny", action="store_true", help="small shapes (2 layers, hidden 256, 8/2 heads): CPU runs")
    ap.add_argument("--layers", type=int)
    ap.add_argument("--dtype", default="float16", choices=("float16", "bfloat16"))
    ap.add_argument("--backends", default="tessera,flashinfer,sdpa,flex")
    ap.add_argument("--studies", default="1,2,3", help="which studies (the check always runs first unless 0)")
    ap.add_argument("--no-check", action="store_true")
    ap.add_argument("--rates", help="requests/s, comma-separated")
    ap.add_argument("--window", type=float, help="seconds of Poisson arrivals per rate")
    ap.add_argument("--run-limit", type=float, help="seconds after which a run is cut (reported as truncated)")
    ap.add_argument("--deadline", type=float, help="seconds for the whole command; later work is skipped")
    ap.add_argument("--prompt-cap", type=int, default=2048)
    ap.add_argument("--output-cap", type=int)
    ap.add_argument("--max-running", type=int, help="running samples at most (full 256, quick 128)")
    ap.add_argument("--token-budget", type=int, default=2048)
    ap.add_argument("--max-prefill", type=int, default=16, help="prompt chunks per step at most")
    ap.add_argument("--kv-gb", type=float, default=32.0, help="KV cache size (all layers)")
    ap.add_argument("--no-graphs", action="store_true")
    ap.add_argument("--pdl", type=int, default=1, help="programmatic dependent launch in Tessera / FlashInfer run()")
    ap.add_argument("--decode-tc", type=int, default=1, help="use_tensor_cores of the decode wrappers")
    ap.add_argument("--par-ns")
    ap.add_argument("--par-samples", type=int)
    ap.add_argument("--par-limits", help="min_shared_tokens,min_members,min_saved_tokens of the auto arm's "
                    "CUDA-graph split (AutoSharedPrefix; -1: its default)")
    ap.add_argument("--par-output-cap", type=int, default=256)
    ap.add_argument("--par-rounds", type=int, help="Study 2's interleaved rounds of both arms per n (full 3, "
                    "quick 1); ratios paired by round, medians reported")
    ap.add_argument("--par-prompt-median", default="250,1500",
                    help="Study 2's prompt-length medians, comma-separated (every n per median)")
    ap.add_argument("--stream-batches")
    ap.add_argument("--stream-window", type=int, default=2048, help="window tokens (a multiple of 16)")
    ap.add_argument("--stream-steps", type=int, default=64)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    mode = "check" if args.check else "quick" if args.quick else "full"
    if args.tiny and args.layers is None:
        args.layers = 2
    for k, v in MODES["quick" if args.quick else "full"].items():
        if getattr(args, k, None) is None:
            setattr(args, k, v)
    if args.tiny:
        args.kv_gb = min(args.kv_gb, 1 / 32)  # 1024 pages: eager FlexAttention on the CPU scores every slot
    if args.par_rounds < 1:
        raise SystemExit(f"--par-rounds: expected >= 1, got {args.par_rounds}")
    args.mode = mode
    return args


def parse_limits(text):
    """--par-limits: None, or (min_shared_tokens, min_members, min_saved_tokens) as ints."""
    if not text:
        return None
    parts = text.split(",")
    try:
        limits = tuple(int(x) for x in parts)
    except ValueError:
        limits = ()
    if len(limits) != 3 or limits[0] < 1:
        raise SystemExit(f"--par-limits: expected min_shared_tokens (>= 1),min_members,min_saved_tokens, got {text!r}")
    return limits


def main(argv=None):
    args = parse(argv)
    import torch
    from serve import backends as BK, check as CK, flex_backend as FX, report, streaming, studies
    from serve import model as M
    from serve.engine import BUCKETS, Engine
    from serve.pages import PagePool, cdiv

    t_start = time.perf_counter()
    deadline = t_start + args.deadline
    log_lines = []

    def log(msg):
        print(msg, flush=True)
        log_lines.append(msg)

    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("run_all: no CUDA device (use --device cpu --tiny for the CPU smoke run)")
    dev = torch.device(args.device)
    dtype = getattr(torch, args.dtype)
    cfg = M.tiny(layers=args.layers) if args.tiny else M.Config(layers=args.layers)
    model = M.Model(cfg, dev, dtype, seed=args.seed)
    log(f"# model: {cfg.layers} layers, hidden {cfg.hidden}, {cfg.q_heads}/{cfg.kv_heads} heads, "
        f"{model.nbytes() / 2**30:.1f} GiB of {args.dtype} weights on {dev}")
    page_bytes = cfg.layers * 2 * 16 * cfg.kv_heads * cfg.head_dim * model.embed.element_size()
    num_pages = max(64, int(args.kv_gb * 2**30 // page_bytes))
    max_pages_req = cdiv(args.prompt_cap + max(args.output_cap, args.par_output_cap), 16) + 1
    if args.tiny:
        args.prompt_cap, args.output_cap = min(args.prompt_cap, 256), min(args.output_cap, 64)
        max_pages_req = cdiv(args.prompt_cap + args.output_cap, 16) + 1

    # ------------------------------------------------------------ backends
    libs, skipped = {}, {}
    want = [b.strip() for b in args.backends.split(",") if b.strip()]
    if "tessera" in want:
        sys.path.insert(0, os.path.normpath(os.path.join(HERE, "..", "..", "python")))
        try:
            import tessera
            if dev.type == "cuda" and not tessera.gpu_available():
                raise RuntimeError(tessera.no_gpu_reason())
            if dev.type != "cuda":
                raise RuntimeError("Tessera's wrappers run on CUDA tensors only")
            libs["tessera"] = tessera
        except Exception as e:
            skipped["tessera"] = f"{type(e).__name__}: {e}"
    if "flashinfer" in want:
        try:
            if dev.type != "cuda":
                raise RuntimeError("FlashInfer runs on CUDA only")
            try:
                import flashinfer
            except ImportError:  # scripts/gpu_bench.sh sets PYTHONPATH itself: look where setup.sh installs it
                site = os.environ.get("FI_SITE", "/tmp/fisite")
                if not os.path.isdir(os.path.join(site, "flashinfer")):
                    raise
                sys.path.append(site)
                import flashinfer
            libs["flashinfer"] = flashinfer
        except Exception as e:
            skipped["flashinfer"] = f"not importable ({type(e).__name__}: {e}); see ../shared/peers/flashinfer"
    if "flex" in want and FX.flex_available():
        skipped["flex"] = f"FlexAttention unavailable: {FX.flex_available()}"
    for name, why in skipped.items():
        log(f"# backend {name}: skipped: {why}")

    def factory(name):
        common = dict(max_pages=num_pages + args.max_running, use_tensor_cores=bool(args.decode_tc),
                      pdl=bool(args.pdl))
        if name in libs:
            return lambda cache: BK.WrapperBackend(name, libs[name], cfg, cache, dev, dtype, **common)
        if name == "sdpa":
            return lambda cache: BK.SdpaBackend(cfg, cache, dev, dtype)
        return lambda cache: FX.FlexBackend(cfg, cache, dev, dtype, max_batch=args.max_running,
                                            max_pages=max_pages_req, buckets=BUCKETS,
                                            max_prefill_reqs=args.max_prefill)
    names = [n for n in want if n not in skipped and (n in libs or n in ("sdpa", "flex"))]

    doc = dict(device=torch.cuda.get_device_name() if dev.type == "cuda" else platform.processor() or "cpu",
               date=datetime.date.today().isoformat(), mode=args.mode, torch=torch.__version__, host=platform.node(),
               command="python " + " ".join([os.path.relpath(sys.argv[0], os.path.join(HERE, "..", ".."))]
                                            + sys.argv[1:]),
               model={k: getattr(cfg, k) for k in ("layers", "hidden", "q_heads", "kv_heads", "head_dim",
                                                    "intermediate", "vocab", "rope_theta")},
               dtype=args.dtype, config=dict(token_budget=args.token_budget, max_running=args.max_running,
                                             max_prefill=args.max_prefill, page_size=16, kv_pages=num_pages,
                                             buckets=list(BUCKETS), graphs=not args.no_graphs, pdl=bool(args.pdl),
                                             decode_tensor_cores=bool(args.decode_tc), rates=args.rates,
                                             window_s=args.window, run_limit_s=args.run_limit,
                                             prompt_cap=args.prompt_cap, output_cap=args.output_cap),
               skipped=skipped, check={}, serving=[], parallel=[], streaming=[], notes={})
    out = args.out or os.path.join(HERE, "..", "results",
                                   {"full": "serve.json", "quick": "serve-quick.json", "check": "serve-check.json"}
                                   [args.mode])
    out = os.path.abspath(out)

    def save():
        doc["elapsed_s"] = round(time.perf_counter() - t_start, 1)
        doc["log"] = log_lines
        report.write_json(out, doc)

    def bundle(name, pages):
        pool = PagePool(pages, 16)
        cache = BK.KVCache(cfg, pages, 16, dev, dtype)
        return pool, factory(name)(cache)

    studies_on = {s.strip() for s in args.studies.split(",")} if args.mode != "check" else set()
    rates = [float(r) for r in args.rates.split(",")] if "1" in studies_on else []

    # ------------------------------------------------------------ check + study 1, one backend at a time
    check_refs = {}  # reference logits by token sequence, shared by the backends' checks
    check_pages = sum(cdiv(r.prompt_len + o - 1, 16) for r in CK.check_requests(cfg.vocab)
                      for o in (r.sample_output_lens or (r.output_len,))) + 64

    def run_backend(name):
        # Eager FlexAttention (the CPU) scores every slot of the pool: only the check runs there.
        serve_here = bool(rates) and not (dev.type == "cpu" and name == "flex")
        if time.perf_counter() + 60 > deadline:  # a backend's setup alone (graphs, compiles) takes up to a minute
            log(f"# {name}: skipped (the run's deadline)")
            doc["serving"].append(dict(backend=name, skipped="deadline"))
            return
        pool, backend = bundle(name, num_pages if serve_here else check_pages)
        if not args.no_check:
            doc["check"][name] = CK.check_one(model, name, pool, backend, graphs=not args.no_graphs, refs=check_refs,
                                              log=log)
            save()
        if rates and not serve_here:
            log(f"# serving {name}: skipped on the CPU (eager FlexAttention scores every cache slot)")
            doc["serving"].append(dict(backend=name, skipped="CPU: eager FlexAttention scores every cache slot"))
        elif rates:
            def make_engine(_name, _make):
                e = Engine(model, backend, pool, max_running=args.max_running, token_budget=args.token_budget,
                           max_prefill_reqs=args.max_prefill, graphs=not args.no_graphs, buckets=BUCKETS)
                return e, lambda engine: None
            doc["serving"] += studies.serving(model, make_engine, {name: None}, rates, args, log=log,
                                              deadline=deadline)
            save()

    # ------------------------------------------------------------ study 2
    def run_study2():
        if "tessera" not in libs:
            doc["notes"]["study 2"] = "skipped: needs Tessera on a GPU"
            log("# study 2 (parallel generation): skipped: needs Tessera on a GPU")
            return
        if time.perf_counter() > deadline:
            doc["notes"]["study 2"] = "skipped: deadline"
            return
        pool = PagePool(num_pages, 16)
        cache = BK.KVCache(cfg, num_pages, 16, dev, dtype)
        limits = parse_limits(args.par_limits)

        def make_engine(arm):
            be = BK.WrapperBackend(f"tessera-{arm}", libs["tessera"], cfg, cache, dev, dtype,
                                   max_pages=num_pages + args.max_running, use_tensor_cores=bool(args.decode_tc),
                                   pdl=bool(args.pdl), shared_prefix="auto" if arm == "auto" else None,
                                   host_page_ids=True, shared_prefix_limits=limits)
            e = Engine(model, be, pool, max_running=args.max_running, token_budget=args.token_budget,
                       max_prefill_reqs=args.max_prefill, graphs=not args.no_graphs, buckets=BUCKETS)
            return e, lambda engine: None
        ns = [int(n) for n in args.par_ns.split(",")]
        doc["parallel"] = studies.parallel(model, make_engine, ns, args, log=log, deadline=deadline)
        doc["notes"]["study 2"] = ("Tessera, decode steps from CUDA graphs in both arms unless --no-graphs (with "
                                   "graphs, shared_prefix='auto' runs the cascade on every decode step and groups "
                                   "adjacent samples); page ids given on the host in both arms"
                                   + (f"; auto arm's limits {limits}" if limits else ""))
        save()

    # ------------------------------------------------------------ study 3
    def run_study3():
        if "tessera" not in libs:
            doc["notes"]["study 3"] = "skipped: needs Tessera on a GPU"
            log("# study 3 (Streaming-LLM): skipped: needs Tessera on a GPU")
            return
        if time.perf_counter() > deadline:
            doc["notes"]["study 3"] = "skipped: deadline"
            return
        doc["streaming"] = streaming.study(model, libs["tessera"],
                                           batches=[int(b) for b in args.stream_batches.split(",")],
                                           window_pages=args.stream_window // 16, steps=args.stream_steps,
                                           log=log, pdl=bool(args.pdl), use_tensor_cores=bool(args.decode_tc))
        save()
        studies.release()

    def check_shared_prefix():
        """Study 2's arm: plan(..., shared_prefix="auto") with the split forced on, so the forked request runs
        through the cascade: the eager path's threshold at 0 (a Tessera-only attribute its tests lower too), and
        in graph-mode decode groups of any size sharing one full page (the defaults leave a check's short
        prompts and three samples on the unique level)."""
        pool = PagePool(check_pages, 16)
        cache = BK.KVCache(cfg, check_pages, 16, dev, dtype)
        be = BK.WrapperBackend("tessera", libs["tessera"], cfg, cache, dev, dtype, max_pages=check_pages + 64,
                               use_tensor_cores=bool(args.decode_tc), pdl=bool(args.pdl), shared_prefix="auto",
                               shared_prefix_limits=(cache.page_size, 2, 0))
        be.prefill._shared_prefix_min_bytes = be.decode._shared_prefix_min_bytes = 0
        name = "tessera+shared_prefix"
        doc["check"][name] = CK.check_one(model, name, pool, be, graphs=not args.no_graphs, refs=check_refs, log=log)
        save()

    # Tessera and FlashInfer first, then the Tessera-only studies, then the slow peers (SDPA's gathers, flex's
    # compiles): a run that meets its deadline loses peer rows, not whole studies.
    def guarded(what, fn, *a):
        """Runs one part; a failure is logged and recorded, and the other parts still run."""
        try:
            fn(*a)
        except Exception as e:
            why = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:300]
            log(f"# {what}: FAILED: {why}")
            doc["notes"][what] = f"failed: {why}"
            save()
        studies.release()  # what the part allocated (caches, graphs) went with its locals

    fast = [n for n in names if n in libs]
    for name in fast:
        guarded(name, run_backend, name)
    if "tessera" in libs and not args.no_check and (args.mode == "check" or "2" in studies_on):
        guarded("check tessera+shared_prefix", check_shared_prefix)
    if "2" in studies_on:
        guarded("study 2", run_study2)
    if "3" in studies_on:
        guarded("study 3", run_study3)
    for name in names:
        if name not in fast:
            guarded(name, run_backend, name)
    if "1" in studies_on and not rates:
        log("# study 1: no rates")

    # ------------------------------------------------------------ outputs
    save()
    md = os.path.splitext(out)[0] + ".md"
    png = os.path.splitext(out)[0] + ".png"
    with open(md, "w") as f:
        f.write(report.markdown(doc))
    why = report.plot(doc, png) if args.mode != "check" else "nothing to plot in a check run"
    if why:
        log(f"# plot: {why}")
    paths = [out, md] + ([] if why else [png])
    if os.environ.get("OUT"):
        import shutil
        for p in paths:
            dst = os.path.join(os.environ["OUT"], os.path.basename(p))
            if os.path.abspath(p) != os.path.abspath(dst):  # --out may point into $OUT already
                shutil.copy(p, dst)
    bad = [n for n, r in doc["check"].items() if not r.get("ok")]
    log(f"# done in {time.perf_counter() - t_start:.0f} s: {', '.join(paths)}"
        + (f"; logits check FAILED for {', '.join(bad)}" if bad else ""))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
