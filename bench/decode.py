"""Batch decode benchmark: Tessera (CUDA-core kernel, and the tensor-core path
with use_tensor_cores=True) against PyTorch SDPA (flash, cuDNN) on padded
dense KV, FlexAttention with a length block mask and FlashInfer when it is
installed, in one process. Page 16 and 1, fp16, head dim 128.

Modes:
  (default)      the grid: per workload time, TB/s of the KV bytes the batch
                 needs (each request's K and V once, plus q and o), the fraction
                 of the HBM read ceiling measured in the same run, speedups over
                 each peer and over Tessera's own no-split ablation, then the
                 plan() host time table; results: decode.json
  --plan-only    only the plan() host time table (256 requests)
  --ab CFG ...   settings of the wrapper timed in interleaved rounds on the
                 issue-3 workloads (or --workloads), SDPA-cuDNN beside them;
                 CFG = NAME:KEY=VALUE,... with KEY tc (1: tensor cores, the
                 default here; 0: CUDA cores), split (0: the planner without KV
                 splitting), pdl (1: run(enable_pdl=True)), tile (the
                 tensor-core query tile: 8, 16 or 64). --timing graph
                 times every kernel over rotating cache copies replayed from a
                 CUDA graph (common.bench_graph_ms); results: decode-ab.json
  --step-timing  one step per workload timed four ways: after do_bench's
                 flush (dirty L2), with a clean L2, back to back on a stream,
                 from a CUDA graph; results: decode-step-timing.json
  --fp8          an fp8 (e4m3) KV cache against fp16 on the same shapes
                 (FP8_WORKLOADS or --workloads): fp16 and fp8 each on the
                 CUDA-core kernel, and as the wrapper picks; fp8 also on
                 64-row tensor-core tiles (sm_90: the Hopper kernel) and on
                 16-row ones (the FA2 template); timed in interleaved
                 rounds from CUDA graphs over rotating cache copies; fp8 /
                 fp16 time ratios (paired by round) and TB/s counting the
                 fp8 bytes read, as a fraction of the HBM read ceiling;
                 with FlashInfer installed, its fp16 default and its fp8
                 paths (CUDA cores, tensor cores) beside them, every call
                 with programmatic dependent launch; results: decode-fp8.json
--save-as NAME writes bench/results/NAME.json instead (the grid's --quick run: decode-quick).

Usage: python bench/decode.py [--quick] [--no-flex] [--plan-only]
       python bench/decode.py --fp8 [--rounds 5] [--layout HND] [--workloads 32/8:const:4096:64,...]
       python bench/decode.py --ab base: --ab nosplit:split=0 [--timing graph] [--workloads W,...] [--rounds 5]
       python bench/decode.py --step-timing [--workloads 32/8:uniform:512-1024:16]
"""
import argparse
import itertools
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402
from common import torch, tessera  # noqa: E402

D = 128
DTYPE = torch.float16 if torch else None
PLAN_REPEATS = 20  # re-plans timed per case
MEM_LIMIT = 24 << 30  # skip a peer whose (padded) KV would exceed this
WORKLOADS = [  # issue 3's decode workloads: (hq, hkv), lengths, batch
    ((32, 32), "const:4096", 128),
    ((32, 8), "const:4096", 128),
    ((32, 8), "const:1024", 16),
    ((32, 8), "zipf:1024", 16),
    ((32, 8), "uniform:512-1024", 64),
    ((32, 8), "zipf:1024", 128),
    ((32, 32), "const:32768", 1),
    ((32, 8), "const:32768", 2),
]


FP8_WORKLOADS = [(h, d, b) for h in ((32, 8), (32, 32)) for d, b in (("const:1024", 16), ("const:4096", 64),
                                                                    ("const:4096", 128))]


def paged_cache(lens, page_size, hkv, seed, shuffle=True):
    g = torch.Generator(device="cuda").manual_seed(seed)
    pages = [(n + page_size - 1) // page_size for n in lens]
    total = sum(pages)
    k = torch.randn(total, page_size, hkv, D, dtype=DTYPE, device="cuda", generator=g)
    v = torch.randn(total, page_size, hkv, D, dtype=DTYPE, device="cuda", generator=g)
    perm = (torch.randperm(total, generator=torch.Generator().manual_seed(seed)) if shuffle
            else torch.arange(total)).to(torch.int32)
    indptr = torch.zeros(len(lens) + 1, dtype=torch.int32)
    indptr[1:] = torch.cumsum(torch.tensor(pages, dtype=torch.int32), 0)
    last = torch.tensor([n - (p - 1) * page_size if p else 0 for n, p in zip(lens, pages)], dtype=torch.int32)
    return k, v, indptr, perm, last


def needed_bytes(lens, hq, hkv, kv_bytes=2):
    """Bytes a step must move: each request's K and V once (kv_bytes a value), q and o (fp16)."""
    return sum(lens) * hkv * D * 2 * kv_bytes + 2 * len(lens) * hq * D * 2


def spot_check(lens, q, out, k, v, indptr, indices, hq, hkv, kv_dtype=None):
    """Max error, relative to the reference's max, of the first and last
    request against a float32 softmax. kv_dtype: the fp8 type of uint8 k, v
    (gathered as bytes, then widened)."""
    errs = []
    for r in (0, len(lens) - 1):
        pages = indices[indptr[r]:indptr[r + 1]].long().cuda()
        kk, vv = k[pages], v[pages]
        if kv_dtype is not None:
            kk, vv = kk.view(kv_dtype), vv.view(kv_dtype)
        kk = kk.reshape(-1, hkv, D)[: lens[r]].float()
        vv = vv.reshape(-1, hkv, D)[: lens[r]].float()
        qq = q[r].float().view(hkv, hq // hkv, D)
        s = torch.einsum("hgd,nhd->hgn", qq, kk) / D**0.5
        ref = torch.einsum("hgn,nhd->hgd", torch.softmax(s, -1), vv).reshape(hq, D)
        errs.append(((out[r].float() - ref).abs().max() / ref.abs().max()).item())
    return max(errs)


def decode_wrapper(lib, lens, page_size, hq, hkv, seed, tensor_cores=False, split=True, shuffle=True,
                   device_ids=False, ws=None, cuda_cores=False, fixed_split_size=None, tc_cta_q=0):
    """A planned paged decode wrapper of `lib` (tessera or flashinfer) and its cache; cuda_cores forces
    Tessera's CUDA-core kernel (use_tensor_cores=False alone lets the wrapper pick); tc_cta_q pins Tessera's
    tensor-core query tile."""
    k, v, indptr, indices, last = paged_cache(lens, page_size, hkv, seed=seed, shuffle=shuffle)
    if device_ids:  # the page table stays on the GPU, as serving engines keep it (plan() never reads it)
        indices = indices.cuda()
    ws = common.new_workspace(256 << 20) if ws is None else ws
    w = lib.BatchDecodeWithPagedKVCacheWrapper(ws, "NHD", use_tensor_cores=tensor_cores)
    if cuda_cores:
        w._cuda_cores = True  # Tessera-only: the CUDA-core kernel whatever the wrapper would pick
    if not split:
        w._split_kv = False  # Tessera-only switch for the ablation (planner without KV splitting)
    if tc_cta_q:
        w._tc_cta_q = tc_cta_q
    extra = {} if fixed_split_size is None else dict(fixed_split_size=fixed_split_size)
    w.plan(indptr, indices, last, hq, hkv, D, page_size, q_data_type=DTYPE, kv_data_type=DTYPE, **extra)
    return dict(w=w, ws=ws, k=k, v=v, indptr=indptr, indices=indices, last=last)


def run_tessera(lens, page_size, hq, hkv, q, split=True, check=False, shuffle=True, tensor_cores=False, bench=True,
                device_ids=False):
    # tensor_cores=False times the CUDA-core kernel itself (the wrapper would pick tensor cores on sm_90).
    st = decode_wrapper(tessera, lens, page_size, hq, hkv, len(lens) + page_size, tensor_cores, split, shuffle,
                        device_ids, cuda_cores=not tensor_cores)
    w, k, v = st["w"], st["k"], st["v"]
    # plan() runs once per generation step: the first one also loads the
    # kernel and sizes the workspace, so the host time that matters is that of
    # the plans after it (median of re-plans; C++ time inside plan(), and the
    # whole Python call). A step ends with the host waiting for its tokens, so
    # each timed plan starts with the GPU idle: back-to-back plans would
    # instead time the wait for the previous plan's upload (~10 us), which a
    # serving loop never sees.
    first_plan_us = w.last_plan_us
    cpp_us, py_us = [], []
    for _ in range(PLAN_REPEATS):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        w.plan(st["indptr"], st["indices"], st["last"], hq, hkv, D, page_size, q_data_type=DTYPE, kv_data_type=DTYPE)
        py_us.append((time.perf_counter() - t0) * 1e6)
        cpp_us.append(w.last_plan_us)
    plan_us = dict(first=first_plan_us, cpp=common.median(cpp_us), python=common.median(py_us))
    out = torch.empty_like(q)
    fn = lambda: w.run(q, (k, v), out=out)  # noqa: E731
    ms = common.bench_ms(fn) if bench else None
    err = spot_check(lens, q, out, k, v, st["indptr"], st["indices"], hq, hkv) if check else None
    return ms, err, plan_us


def run_sdpa(lens, hq, hkv, backend):
    fns, why = common.sdpa_decode_fns(lens, hq, hkv, backend, D, mem_limit=MEM_LIMIT)
    return (common.bench_ms(fns[0]), None) if fns else (None, why)


def run_flex(lens, hq, hkv):
    b, lmax = len(lens), (max(lens) + 127) // 128 * 128
    if 2 * b * hkv * lmax * D * 2 > MEM_LIMIT:
        return None, "padded KV too large"
    lens_t = torch.tensor(lens, device="cuda")
    fn = common.flex_fn(b, hq, hkv, 1, lmax, lambda bb, h, qi, kv: kv < lens_t[bb], mask_batch=b, d=D)
    return (common.bench_ms(fn), None) if fn else (None, "compile failed")


def run_flashinfer(lens, hq, hkv, q, tensor_cores):
    fi = common.flashinfer()
    if fi is None:
        return None
    try:
        st = decode_wrapper(fi, lens, 16, hq, hkv, len(lens) + 16, tensor_cores)
        out = torch.empty_like(q)
        return common.bench_ms(lambda: st["w"].run(q, (st["k"], st["v"]), out=out))
    except Exception as e:  # a peer that refuses a shape is reported, not fatal
        print(f"# flashinfer: {type(e).__name__}: {str(e)[:80]}", flush=True)
        return None


def plan_timing():
    """Host time of a steady-state plan() for 256 requests, both decode paths, page ids on the host and the GPU."""
    rows = []
    print("# plan() host time, 256 requests, 32/8 heads: median of re-plans (C++ inside plan() | whole Python call)")
    for dist in ("const:1024", "zipf:1024", "const:8192"):
        lens = common.kv_lengths(dist, 256, seed=256)
        q = torch.randn(256, 32, D, dtype=DTYPE, device="cuda")
        for ps in (16, 1):
            for tc, dev in itertools.product((False, True), (False, True)):
                pages = sum((n + ps - 1) // ps for n in lens)
                if pages * ps * 8 * D * 4 > MEM_LIMIT:
                    continue
                _, _, plan_us = run_tessera(lens, ps, 32, 8, q, tensor_cores=tc, bench=False, device_ids=dev)
                rows.append(dict(part="plan", lengths=dist, batch=256, page_size=ps, pages=pages, tensor_cores=tc,
                                 page_ids="gpu" if dev else "host", plan_cpp_us=plan_us["cpp"],
                                 plan_python_us=plan_us["python"], first_plan_us=plan_us["first"]))
                print(f"  {dist:>12} page {ps:>2} ({pages:>7} page ids on the {'gpu ' if dev else 'host'}) "
                      f"{'tc' if tc else 'cc'}: {plan_us['cpp']:7.1f} us C++ | {plan_us['python']:7.1f} us Python | "
                      f"first plan {plan_us['first']:8.1f} us", flush=True)
        del q
        torch.cuda.empty_cache()
    return rows


def grid(args):
    read_tbps, copy_tbps = common.hbm_ceilings()
    read_tbps = max(read_tbps, common.read_probe_best())
    ceiling = max(read_tbps, copy_tbps)
    print(f"# {common.device_name()}: HBM read ceiling {read_tbps:.2f} TB/s (sum), copy {copy_tbps:.2f} TB/s (R+W); "
          f"fractions below use {ceiling:.2f}")
    heads = [(32, 32), (32, 8)]
    dists = ["const:1024", "const:8192", "uniform:512-1024", "zipf:1024"]
    batches = [16, 64, 128, 256]
    extra = [("const:4096", 128), ("const:32768", 1), ("const:32768", 2), ("const:32768", 4)]
    if args.quick:
        dists, batches, extra = ["const:1024", "zipf:1024"], [16, 128], [("const:4096", 128), ("const:32768", 1)]
    work = [(h, d, b) for h in heads for d in dists for b in batches] + [(h, d, b) for h in heads for d, b in extra]
    rows = []
    print(f"{'Hq/Hkv':>6} {'lengths':>16} {'B':>4} {'pg':>3} {'us':>8} {'TB/s':>5} {'ceil':>5} | "
          f"{'tc us':>8} {'TB/s':>5} | {'tc':>7} {'nosplit':>7} {'sdpa-fl':>7} {'cudnn':>7} {'flex':>7} {'fi':>7}"
          f"  (x = Tessera (CUDA cores) speedup; tc = use_tensor_cores=True; fi = FlashInfer, tensor cores)")
    checked = set()
    for (hq, hkv), dist, b in work:
        lens = common.kv_lengths(dist, b, seed=b)
        nb = needed_bytes(lens, hq, hkv)
        if nb > MEM_LIMIT:
            continue
        q = torch.randn(b, hq, D, dtype=DTYPE, device="cuda")
        peers = {"sdpa-flash": run_sdpa(lens, hq, hkv, "flash"), "sdpa-cudnn": run_sdpa(lens, hq, hkv, "cudnn")}
        peers["flex"] = (None, "off") if args.no_flex or b > 16 else run_flex(lens, hq, hkv)
        fi_ms = run_flashinfer(lens, hq, hkv, q, tensor_cores=True)
        peers["flashinfer"] = (fi_ms, None if fi_ms else "not installed or refused")
        for ps in (1, 16):
            check = (hq, hkv, ps) not in checked
            checked.add((hq, hkv, ps))
            ms, err, plan_us = run_tessera(lens, ps, hq, hkv, q, check=check)
            if err is not None and err > 1e-3:
                raise SystemExit(f"Tessera decode spot check failed: rel err {err:.2e}")
            ms_ns = run_tessera(lens, ps, hq, hkv, q, split=False)[0] if ps == 16 else None
            ms_tc, err_tc, plan_us_tc = run_tessera(lens, ps, hq, hkv, q, check=check, tensor_cores=True)
            if err_tc is not None and err_tc > 1e-3:
                raise SystemExit(f"Tessera tensor-core decode spot check failed: rel err {err_tc:.2e}")
            tbps, tbps_tc = nb / (ms * 1e-3) / 1e12, nb / (ms_tc * 1e-3) / 1e12
            row = dict(hq=hq, hkv=hkv, lengths=dist, batch=b, page_size=ps, us=ms * 1e3, tbps=tbps,
                       frac_ceiling=tbps / ceiling, plan_us=plan_us, spot_check_err=err,
                       no_split_us=ms_ns * 1e3 if ms_ns else None, max_len=max(lens), mean_len=sum(lens) / b)
            # The tensor-core path, under the same field names with the "tessera-tc_" prefix.
            row.update({"tessera-tc_us": ms_tc * 1e3, "tessera-tc_tbps": tbps_tc,
                        "tessera-tc_frac_ceiling": tbps_tc / ceiling, "tessera-tc_plan_us": plan_us_tc,
                        "tessera-tc_spot_check_err": err_tc})
            for name, (pms, why) in peers.items():
                row[name + "_us"] = pms * 1e3 if pms else None
                row[name + "_note"] = why
            rows.append(row)
            ratio = lambda other: f"{other / ms:6.2f}x" if other else f"{'-':>7}"  # noqa: E731
            print(f"{hq:>3}/{hkv:<2} {dist:>16} {b:>4} {ps:>3} {ms * 1e3:8.1f} {tbps:5.2f} {tbps / ceiling:5.0%} | "
                  f"{ms_tc * 1e3:8.1f} {tbps_tc:5.2f} | {ratio(ms_tc)} {ratio(ms_ns)} {ratio(peers['sdpa-flash'][0])} "
                  f"{ratio(peers['sdpa-cudnn'][0])} {ratio(peers['flex'][0])} {ratio(fi_ms)}", flush=True)
        del q
        torch.cuda.empty_cache()
    # Page placement: the grid above scatters pages at random over the pool (a
    # worst case for locality); a fresh cache allocates them in order.
    lens = [4096] * 128
    q = torch.randn(128, 32, D, dtype=DTYPE, device="cuda")
    ms_seq = run_tessera(lens, 16, 32, 32, q, shuffle=False)[0]
    ms_seq_tc = run_tessera(lens, 16, 32, 32, q, shuffle=False, tensor_cores=True)[0]
    tb, tb_tc = (needed_bytes(lens, 32, 32) / (m * 1e-3) / 1e12 for m in (ms_seq, ms_seq_tc))
    print(f"# 32/32 const:4096 B128 pg16 with pages in order: {ms_seq * 1e3:.1f} us, {tb:.2f} TB/s, {tb / ceiling:.0%} of "
          f"ceiling; tensor cores {ms_seq_tc * 1e3:.1f} us, {tb_tc:.2f} TB/s")
    rows.append({"hq": 32, "hkv": 32, "lengths": "const:4096", "batch": 128, "page_size": 16, "pages": "in order",
                 "us": ms_seq * 1e3, "tbps": tb, "frac_ceiling": tb / ceiling, "tessera-tc_us": ms_seq_tc * 1e3,
                 "tessera-tc_tbps": tb_tc, "tessera-tc_frac_ceiling": tb_tc / ceiling})
    rows += plan_timing()
    name = args.save_as or ("decode-quick" if args.quick else "decode")
    return common.save_results(name, dict(read_ceiling_tbps=read_tbps, copy_tbps=copy_tbps, ceiling_tbps=ceiling,
                                              head_dim=D, dtype="float16", rows=rows))


def ab(args, workloads):
    """Wrapper settings in interleaved rounds, SDPA-cuDNN once per workload."""
    configs = [common.parse_config(c, ("tc", "split", "pdl", "tile")) for c in args.ab]
    ceiling = common.read_probe_best()
    print(f"# read ceiling {ceiling:.2f} TB/s; page 16, fp16, d 128; us (TB/s of needed KV); timing: {args.timing}")
    print(f"{'heads':>6} {'lengths':>16} {'B':>4} | " + " | ".join(f"{n:>16}" for n, _ in configs) + " |  sdpa-cudnn")
    rows = []
    for (hq, hkv), dist, b in workloads:
        lens = common.kv_lengths(dist, b, seed=b)
        nb = needed_bytes(lens, hq, hkv)
        q = torch.randn(b, hq, D, dtype=DTYPE, device="cuda")
        out = torch.empty_like(q)
        copies = common.rotation_copies(nb) if args.timing == "graph" else 1
        fns, errs = {}, {}
        for name, opt in configs:
            tc = opt.get("tc", "1") == "1"  # tc=0: the CUDA-core kernel itself
            st = decode_wrapper(tessera, lens, 16, hq, hkv, seed=b + 16, tensor_cores=tc, cuda_cores=not tc,
                                split=opt.get("split", "1") == "1", tc_cta_q=int(opt.get("tile", "0")))
            pdl = opt.get("pdl", "0") == "1"
            out.fill_(float("nan"))
            st["w"].run(q, (st["k"], st["v"]), out=out)
            errs[name] = spot_check(lens, q, out, st["k"], st["v"], st["indptr"], st["indices"], hq, hkv)
            if not errs[name] < 1e-3:
                raise SystemExit(f"{name}: error {errs[name]:.2e} on {hq}/{hkv} {dist} B{b}")
            caches = [(st["k"], st["v"])] + [(torch.randn_like(st["k"]), torch.randn_like(st["v"]))
                                             for _ in range(copies - 1)]
            calls = [lambda kv=kv, w=st["w"], pdl=pdl: w.run(q, kv, out=out, enable_pdl=pdl) for kv in caches]
            fns[name] = (calls, st)
        if args.timing == "graph":
            times = common.interleaved({n: c for n, (c, _) in fns.items()}, args.rounds, common.bench_graph_ms)
        else:
            times = common.interleaved({n: c[0] for n, (c, _) in fns.items()}, args.rounds)
        del fns
        torch.cuda.empty_cache()
        cd_fns, _ = common.sdpa_decode_fns(lens, hq, hkv, "cudnn", D, copies, MEM_LIMIT)
        cd = None if cd_fns is None else (common.bench_graph_ms(cd_fns) if args.timing == "graph"
                                          else common.bench_ms(cd_fns[0]))
        med = {n: common.median(t) for n, t in times.items()}
        cells = [f"{med[n] * 1e3:8.1f} ({nb / med[n] / 1e9:4.2f})" for n, _ in configs]
        cud = f"{cd * 1e3:8.1f} ({nb / cd / 1e9:4.2f})" if cd else "-"
        print(f"{hq}/{hkv:<3} {dist:>16} {b:>4} | " + " | ".join(cells) + f" | {cud}", flush=True)
        rows.append(dict(hq=hq, hkv=hkv, lengths=dist, batch=b, needed_bytes=nb, us={n: m * 1e3 for n, m in med.items()},
                         rounds_ms=times, check_err=errs, sdpa_cudnn_us=cd and cd * 1e3, timing=args.timing,
                         copies=copies))
        torch.cuda.empty_cache()
    return common.save_results(args.save_as or "decode-ab", dict(read_ceiling_tbps=ceiling, configs=dict(configs),
                                                             rows=rows))


def step_timing(workloads, save_as):
    """One step per workload: flushed (do_bench), clean L2, back to back on a stream, CUDA graph; both paths and cuDNN."""
    rows = []
    for (hq, hkv), dist, b in workloads:
        lens = common.kv_lengths(dist, b)
        kv_bytes = sum(lens) * hkv * D * 2 * 2
        copies = max(2, common.rotation_copies(kv_bytes, factor=3))
        caches = [paged_cache(lens, 16, hkv, seed=i) for i in range(copies)]
        q = torch.randn(b, hq, D, dtype=DTYPE, device="cuda")
        tb = lambda us: kv_bytes / us / 1e6  # noqa: E731
        for tc in (False, True):
            _, _, indptr, indices, last = caches[0]
            w = tessera.BatchDecodeWithPagedKVCacheWrapper(common.workspace(), "NHD", use_tensor_cores=tc)
            w._cuda_cores = not tc  # both kernels, whatever the wrapper would pick
            w.plan(indptr, indices, last, hq, hkv, D, 16, q_data_type=DTYPE, kv_data_type=DTYPE)
            out = torch.empty_like(q)
            # One plan (copy 0's page table) for every copy: the copies have the
            # same number of pages, so each launch reads the same amount of
            # memory from its own storage (timing only; values are not checked).
            calls = [lambda kv=(c[0], c[1]): w.run(q, kv, out=out) for c in caches]
            flushed, clean = common.bench_ms(calls[0]) * 1e3, common.bench_ms_clean(calls[0]) * 1e3
            n = 60
            for c in calls:
                c()
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda.synchronize()
            s.record()
            for i in range(n):
                calls[i % len(calls)]()
            e.record()
            torch.cuda.synchronize()
            stream = s.elapsed_time(e) * 1e3 / n
            graph = common.bench_graph_ms(calls) * 1e3
            print(f"{'tc' if tc else 'cc'} {hq}/{hkv} batch {b} {dist} page 16 ({kv_bytes / 1e6:.1f} MB): flushed "
                  f"{flushed:.1f} us ({tb(flushed):.2f} TB/s), clean {clean:.1f} ({tb(clean):.2f}), stream {stream:.1f} "
                  f"({tb(stream):.2f}), graph {graph:.1f} ({tb(graph):.2f})", flush=True)
            rows.append(dict(hq=hq, hkv=hkv, lengths=dist, batch=b, kv_bytes=kv_bytes, kernel="tc" if tc else "cc",
                             flushed_us=flushed, clean_us=clean, stream_us=stream, graph_us=graph))
        fns, _ = common.sdpa_decode_fns(lens, hq, hkv, "cudnn", D, mem_limit=MEM_LIMIT)
        if fns:  # the peer on its best case (dense padded KV, no page table), both L2 states
            fl, cl = common.bench_ms(fns[0]) * 1e3, common.bench_ms_clean(fns[0]) * 1e3
            print(f"sdpa-cudnn (dense, padded to {max(lens)}): flushed {fl:.1f} us ({tb(fl):.2f} TB/s), clean {cl:.1f} us "
                  f"({tb(cl):.2f})", flush=True)
            rows.append(dict(hq=hq, hkv=hkv, lengths=dist, batch=b, kv_bytes=kv_bytes, kernel="sdpa-cudnn",
                             flushed_us=fl, clean_us=cl))
        del caches
        torch.cuda.empty_cache()
    return common.save_results(save_as or "decode-step-timing", dict(page_size=16, head_dim=D, rows=rows))


def fp8_rows(args, workloads):
    """fp8 (e4m3) against fp16 KV on the same shapes, in interleaved rounds (CUDA graphs, rotating copies)."""
    read_tbps, copy_tbps = common.hbm_ceilings()
    ceiling = max(read_tbps, common.read_probe_best())
    e4m3 = torch.float8_e4m3fn
    fi = common.flashinfer()
    print(f"# {common.device_name()}: HBM read ceiling {ceiling:.2f} TB/s; {args.layout}, page 16, d {D}, fp16 q / o; "
          f"us (TB/s of the "
          f"bytes each step reads, fp8 counted as 1 byte); ratios: median over rounds of fp8 / fp16 time")
    rows = []
    for (hq, hkv), dist, b in workloads:
        lens = common.kv_lengths(dist, b, seed=b)
        k, v, indptr, indices, last = paged_cache(lens, 16, hkv, seed=b)
        q = torch.randn(b, hq, D, dtype=DTYPE, device="cuda")
        # name: (kv dtype, kernel: "cc" CUDA cores, "tc" tensor cores, "pick" the wrapper's default)
        # "tc64": the tensor cores on 64-row query tiles (on sm_90 the Hopper kernel; fp8 caches default to
        # the FA2 template there: 8-row tiles with the keys as the mma's rows for groups of up to 8 heads);
        # "tc16": the FA2 template's 16-row tiles.
        configs = {"fp16-cc": (DTYPE, "cc"), "fp16": (DTYPE, "pick"), "fp8-cc": (e4m3, "cc"), "fp8-tc64": (e4m3, "tc64"),
                   "fp8-tc16": (e4m3, "tc16"), "fp8": (e4m3, "pick")}
        if fi is not None:  # FlashInfer's fp16 default and its fp8 paths (CUDA cores, tensor cores)
            configs.update({"fi-fp16": (DTYPE, "fi"), "fi-fp8": (e4m3, "fi"), "fi-fp8-tc": (e4m3, "fi-tc")})
        caches = {}
        as_layout = (lambda x: x.transpose(1, 2).contiguous()) if args.layout == "HND" else (lambda x: x)
        as_nhd = (lambda x: x.transpose(1, 2)) if args.layout == "HND" else (lambda x: x)  # spot_check's order
        for kv_dtype in (DTYPE, e4m3):
            n = common.rotation_copies(needed_bytes(lens, hq, hkv, 2 if kv_dtype == DTYPE else 1))
            caches[kv_dtype] = [(as_layout(k.to(kv_dtype)), as_layout(v.to(kv_dtype)))] + [
                (as_layout(torch.randn_like(k).to(kv_dtype)), as_layout(torch.randn_like(v).to(kv_dtype)))
                for _ in range(n - 1)]
        fns, errs, nbytes, keep = {}, {}, {}, []
        for name, (kv_dtype, kernel) in configs.items():
            lib = fi if kernel.startswith("fi") else tessera
            w = lib.BatchDecodeWithPagedKVCacheWrapper(common.new_workspace(256 << 20), args.layout,
                                                       use_tensor_cores=kernel in ("tc64", "tc16", "fi-tc"))
            if lib is tessera:
                w._cuda_cores = kernel == "cc"
                w._tc_cta_q = {"tc64": 64, "tc16": 16}.get(kernel, 0)
            w.plan(indptr, indices, last, hq, hkv, D, 16, q_data_type=DTYPE, kv_data_type=kv_dtype)
            out = torch.full_like(q, float("nan"))
            kv0 = caches[kv_dtype][0]
            w.run(q, kv0, out=out, enable_pdl=True)
            torch.cuda.synchronize()
            fp8 = kv_dtype == e4m3
            errs[name] = spot_check(lens, q, out, *(as_nhd(x.view(torch.uint8) if fp8 else x) for x in kv0), indptr,
                                    indices,
                                    hq, hkv, e4m3 if fp8 else None)
            if not errs[name] < 1e-3:
                raise SystemExit(f"{name}: error {errs[name]:.2e} on {hq}/{hkv} {dist} x {b}")
            nbytes[name] = needed_bytes(lens, hq, hkv, 1 if fp8 else 2)
            calls = [lambda kv=kv, w=w, o=out: w.run(q, kv, out=o, enable_pdl=True) for kv in caches[kv_dtype]]
            fns[name] = lambda calls=calls: common.bench_graph_ms(calls)
            keep.append(w)
        times = common.interleaved(fns, args.rounds, timer=lambda f: f())
        us = {n: common.median(t) * 1e3 for n, t in times.items()}
        tbps = {n: nbytes[n] / (us[n] * 1e-6) / 1e12 for n in us}
        ratio = {f"{n}/{base}": common.paired_ratio(times, n, base) for n in configs if n.startswith("fp8")
                 for base in ("fp16-cc", "fp16")}
        if fi is not None:  # FlashInfer's time over ours (> 1: Tessera faster)
            ratio.update({f"{n}/{mine}": common.paired_ratio(times, n, mine)
                          for n, mine in (("fi-fp16", "fp16"), ("fi-fp8", "fp8"), ("fi-fp8-tc", "fp8"))})
        rows.append(dict(hq=hq, hkv=hkv, lengths=dist, batch=b, us=us, tbps=tbps,
                         frac_ceiling={n: t / ceiling for n, t in tbps.items()}, ratios=ratio, check_err=errs,
                         rounds_ms=times))
        cells = " | ".join(f"{n} {us[n]:7.1f} ({tbps[n]:4.2f}, {tbps[n] / ceiling:4.0%})" for n in configs)
        print(f"{hq:>3}/{hkv:<2} {dist:>11} {b:>4} | {cells} | fp8-cc/fp16-cc {ratio['fp8-cc/fp16-cc']:.3f}, "
              f"fp8-tc64/fp16 {ratio['fp8-tc64/fp16']:.3f}, fp8-tc16/fp16 {ratio['fp8-tc16/fp16']:.3f}, "
              f"fp8/fp16 {ratio['fp8/fp16']:.3f}" + ("".join(f", {n} {ratio[n]:.3f}" for n in ratio if n.startswith("fi-"))),
              flush=True)
        del keep, caches, fns, k, v
        torch.cuda.empty_cache()
    return common.save_results(args.save_as or "decode-fp8", dict(read_ceiling_tbps=ceiling, copy_tbps=copy_tbps,
                                                                head_dim=D, page_size=16, layout=args.layout,
                                                                kv_dtype="float8_e4m3fn",
                                                                rows=rows))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="grid: a small grid")
    ap.add_argument("--no-flex", action="store_true", help="grid: skip FlexAttention")
    ap.add_argument("--plan-only", action="store_true", help="only the plan() host-time table")
    ap.add_argument("--ab", action="append", default=[], metavar="NAME:KEY=VALUE,...",
                    help="a setting to A/B (repeatable; 'base:' = tensor-core defaults); keys: tc, split, pdl")
    ap.add_argument("--step-timing", action="store_true", help="one step timed flushed / clean / stream / graph")
    ap.add_argument("--fp8", action="store_true", help="an fp8 (e4m3) KV cache against fp16, same shapes")
    ap.add_argument("--workloads", default="",
                    help="--ab / --step-timing: HQ/HKV:LENGTHS:BATCH,... (e.g. 32/8:const:1024:16); "
                         "default: issue 3's list (--ab), 32/8:uniform:512-1024:16 (--step-timing)")
    ap.add_argument("--quick-workloads", action="store_true", help="--ab: the first four of issue 3's workloads")
    ap.add_argument("--timing", choices=("flush", "graph"), default="flush",
                    help="--ab: flush = do_bench (L2 zeroed between calls); graph = rotating cache copies (>= 2x L2) "
                         "replayed back to back from a CUDA graph")
    ap.add_argument("--rounds", type=int, default=5, help="--ab / --fp8: interleaved rounds")
    ap.add_argument("--layout", choices=("NHD", "HND"), default="NHD", help="--fp8: the caches' layout")
    ap.add_argument("--save-as", metavar="NAME", help="results file bench/results/NAME.json")
    args = ap.parse_args()
    workloads = [common.parse_workload(w) for w in args.workloads.split(",")] if args.workloads else None
    common.require()
    if args.plan_only:
        plan_timing()
        return
    if args.fp8:
        path = fp8_rows(args, workloads or FP8_WORKLOADS)
    elif args.ab:
        path = ab(args, workloads or (WORKLOADS[:4] if args.quick_workloads else WORKLOADS))
    elif args.step_timing:
        path = step_timing(workloads or [((32, 8), "uniform:512-1024", 16)], args.save_as)
    else:
        path = grid(args)
    print(f"# results: {path}")


if __name__ == "__main__":
    main()
