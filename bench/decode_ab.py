"""A/B of decode settings on the tensor-core path (the Hopper prefill kernel)
in one process: each setting is a set of environment variables read when a
wrapper is built (e.g. TESSERA_DECODE_TC_CTA_Q, TESSERA_SM90_RINGS),
timed in interleaved rounds on issue 3's decode workloads (page 16, fp16,
head dim 128), with SDPA-cuDNN on padded dense KV once per workload and the
read ceiling measured in the same run. Each setting's output is checked
against a float32 softmax on two requests first.

  python bench/decode_ab.py --config "base:" --config "rings:TESSERA_SM90_RINGS=3,4,1" [--quick] [--timing graph]

--timing graph times every kernel, ours and cuDNN's, over rotating cache
copies replayed from a CUDA graph (common.bench_graph_ms) instead of after
do_bench's L2-zeroing flush.
"""
import argparse
import os
import statistics
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
import common  # noqa: E402
import decode as dec  # noqa: E402
import tessera  # noqa: E402

WORKLOADS = [  # (hq, hkv), lengths, batch
    ((32, 32), "const:4096", 128),
    ((32, 8), "const:4096", 128),
    ((32, 8), "const:1024", 16),
    ((32, 8), "zipf:1024", 16),
    ((32, 8), "uniform:512-1024", 64),
    ((32, 8), "zipf:1024", 128),
    ((32, 32), "const:32768", 1),
    ((32, 8), "const:32768", 2),
]


def parse(cfg):
    name, _, rest = cfg.partition(":")
    env = dict(kv.split("=", 1) for kv in filter(None, rest.split("|")))
    return name, env


def parse_workload(w):
    """HQ/HKV:LENGTHS:BATCH (LENGTHS as common.kv_lengths takes them) -> ((hq, hkv), lengths, batch)."""
    try:
        heads, rest = w.split(":", 1)
        dist, b = rest.rsplit(":", 1)
        hq, hkv = heads.split("/")
        return (int(hq), int(hkv)), dist, int(b)
    except ValueError:
        raise SystemExit(f"--workloads: expected HQ/HKV:LENGTHS:BATCH (e.g. 32/8:const:1024:16), got {w!r}")


def build(lens, hq, hkv, env, seed, copies=1):
    """A planned tensor-core decode wrapper under `env`, with its cache (and
    copies - 1 more caches of the same shape, for rotation)."""
    k, v, indptr, indices, last = dec.paged_cache(lens, 16, hkv, seed=seed)
    ws = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    env = dict(env)
    tc = env.pop("tc", "1") == "1"  # tc=0: the CUDA-core decode kernel instead
    w = tessera.BatchDecodeWithPagedKVCacheWrapper(ws, "NHD", use_tensor_cores=tc)
    if env.pop("split", "1") == "0":
        w._split_kv = False  # Tessera-only switch for the ablation (planner without KV splitting)
    pdl = env.pop("pdl", "0") == "1"  # run(enable_pdl=True)
    common.with_env(env, lambda: w.plan(indptr, indices, last, hq, hkv, dec.D, 16, q_data_type=dec.DTYPE,
                                        kv_data_type=dec.DTYPE))
    caches = [(k, v)] + [(torch.randn_like(k), torch.randn_like(v)) for _ in range(copies - 1)]
    return dict(w=w, ws=ws, k=k, v=v, indptr=indptr, indices=indices, caches=caches, pdl=pdl)


def sdpa_graph_ms(lens, hq, hkv, copies):
    """SDPA-cuDNN on padded dense KV, timed as bench_graph_ms over `copies` caches."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    b, lmax = len(lens), max(lens)
    if 2 * b * hkv * lmax * dec.D * 2 * copies > dec.MEM_LIMIT:
        return None
    q = torch.randn(b, hq, 1, dec.D, dtype=dec.DTYPE, device="cuda")
    kvs = [(torch.randn(b, hkv, lmax, dec.D, dtype=dec.DTYPE, device="cuda"),
            torch.randn(b, hkv, lmax, dec.D, dtype=dec.DTYPE, device="cuda")) for _ in range(copies)]
    with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
        calls = [lambda k=k, v=v: F.scaled_dot_product_attention(q, k, v, enable_gqa=hq != hkv) for k, v in kvs]
        return common.bench_graph_ms(calls)


def check(st, lens, q, out, hq, hkv):
    errs = []
    for r in (0, len(lens) - 1):
        pages = st["indices"][st["indptr"][r]:st["indptr"][r + 1]].long().cuda()
        kk = st["k"][pages].reshape(-1, hkv, dec.D)[: lens[r]].float()
        vv = st["v"][pages].reshape(-1, hkv, dec.D)[: lens[r]].float()
        qq = q[r].float().view(hkv, hq // hkv, dec.D)
        s = torch.einsum("hgd,nhd->hgn", qq, kk) / dec.D**0.5
        ref = torch.einsum("hgn,nhd->hgd", torch.softmax(s, -1), vv).reshape(hq, dec.D)
        errs.append(((out[r].float() - ref).abs().max() / ref.abs().max()).item())
    return max(errs)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", action="append", default=[],
                    help="NAME:VAR=VALUE|VAR=VALUE ('NAME:' = defaults; 'split=0': the planner without KV splitting; "
                         "'pdl=1': run(enable_pdl=True); 'tc=0': the CUDA-core kernel)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--quick", action="store_true", help="the first four workloads")
    ap.add_argument("--tag", default="ab")
    ap.add_argument("--workloads", default="",
                    help="instead of the issue's list: HQ/HKV:LENGTHS:BATCH,... (e.g. 32/8:const:1024:16)")
    ap.add_argument("--timing", choices=("flush", "graph"), default="flush",
                    help="flush: do_bench (L2 zeroed between calls); graph: calls over rotating cache copies "
                         "(>= 2x L2) replayed back to back from a CUDA graph (common.bench_graph_ms)")
    args = ap.parse_args()
    configs = [parse(c) for c in (args.config or ["base:"])]
    workloads = ([parse_workload(w) for w in args.workloads.split(",")] if args.workloads
                 else WORKLOADS[:4] if args.quick else WORKLOADS)
    ceiling = common.read_probe_best()
    print(f"# read ceiling {ceiling:.2f} TB/s; decode on tensor cores unless tc=0, page 16, fp16, d 128; us (TB/s of needed KV); "
          f"timing: {args.timing}")
    print(f"{'heads':>6} {'lengths':>16} {'B':>4} | " + " | ".join(f"{n:>16}" for n, _ in configs) + " |  sdpa-cudnn")
    rows = []
    for (hq, hkv), dist, b in workloads:
        lens = common.kv_lengths(dist, b, seed=b)
        nb = dec.needed_bytes(lens, hq, hkv)
        q = torch.randn(b, hq, dec.D, dtype=dec.DTYPE, device="cuda")
        out = torch.empty_like(q)
        states = {}
        errs = {}
        copies = common.rotation_copies(nb) if args.timing == "graph" else 1
        for name, env in configs:
            st = build(lens, hq, hkv, env, seed=b + 16, copies=copies)
            out.fill_(float("nan"))
            st["w"].run(q, (st["k"], st["v"]), out=out)
            errs[name] = check(st, lens, q, out, hq, hkv)
            if not errs[name] < 1e-3:
                raise SystemExit(f"{name}: error {errs[name]:.2e} on {hq}/{hkv} {dist} B{b}")
            states[name] = st
        times = {name: [] for name, _ in configs}
        for _ in range(args.rounds):
            for name, _ in configs:
                st = states[name]
                if args.timing == "graph":
                    calls = [lambda kv=kv, w=st["w"], pdl=st["pdl"]: w.run(q, kv, out=out, enable_pdl=pdl)
                             for kv in st["caches"]]
                    times[name].append(common.bench_graph_ms(calls))
                else:
                    times[name].append(common.bench_ms(lambda: st["w"].run(q, (st["k"], st["v"]), out=out,
                                                                           enable_pdl=st["pdl"])))
        del states
        torch.cuda.empty_cache()
        cd = sdpa_graph_ms(lens, hq, hkv, copies) if args.timing == "graph" else dec.run_sdpa(lens, hq, hkv, "cudnn")[0]
        med = {n: statistics.median(t) for n, t in times.items()}
        cells = [f"{med[n] * 1e3:8.1f} ({nb / med[n] / 1e9:4.2f})" for n, _ in configs]
        cud = f"{cd * 1e3:8.1f} ({nb / cd / 1e9:4.2f})" if cd else "-"
        print(f"{hq}/{hkv:<3} {dist:>16} {b:>4} | " + " | ".join(cells) + f" | {cud}", flush=True)
        rows.append(dict(hq=hq, hkv=hkv, lengths=dist, batch=b, needed_bytes=nb, us={n: m * 1e3 for n, m in med.items()},
                         rounds_ms=times, check_err=errs, sdpa_cudnn_us=cd and cd * 1e3, timing=args.timing,
                         copies=copies))
        torch.cuda.empty_cache()
    path = common.save_results(f"decode-{args.tag}", dict(read_ceiling_tbps=ceiling, configs={n: e for n, e in configs},
                                                          rows=rows))
    print(f"results: {path}")


if __name__ == "__main__":
    main()
