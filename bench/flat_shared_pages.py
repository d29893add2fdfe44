"""Flat batch decode over pages the requests share (prefix caching without
cascade levels), beside FlashInfer, in one process.

n requests (default 64) share `--shared` tokens (8192) and own `--own` (256)
each; GQA 32/8, fp16, head dim 128, pages of 16 shuffled over one cache, so
the shared pages stay in L2 and the step is bound by math and L2 reads.
Tessera on tensor cores with its default query tile (8 rows for a 4-head
group), the Hopper kernel's 64-row tile, and with shared_prefix="auto" (plan()
finds the shared pages and attends them once, as a cascade level); FlashInfer
on tensor cores and on CUDA cores. Timed in interleaved rounds replayed from CUDA graphs
(common.bench_graph_ms), PDL on for every call; outputs must agree with
FlashInfer's tensor-core path (else with Tessera's default) within 2e-3.

Usage: python bench/flat_shared_pages.py [--requests 64] [--shared 8192] [--own 256] [--rounds 5]
Results: bench/results/flat-shared-pages.json
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

D, PS, HQ, HKV = 128, 16, 32, 8


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=64)
    ap.add_argument("--shared", type=int, default=8192, help="tokens every request shares (a multiple of 16)")
    ap.add_argument("--own", type=int, default=256, help="tokens of each request's own (a multiple of 16)")
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    tessera = common.require()
    torch = common.torch
    fi = common.flashinfer()
    if args.shared % PS or args.own % PS or args.requests < 1:
        raise SystemExit("--shared and --own: multiples of 16 tokens; --requests >= 1")
    n, sp, op = args.requests, args.shared // PS, args.own // PS
    total = sp + n * op
    g = torch.Generator(device="cuda").manual_seed(0)
    k = torch.randn(total, PS, HKV, D, dtype=torch.float16, device="cuda", generator=g)
    v = torch.randn(total, PS, HKV, D, dtype=torch.float16, device="cuda", generator=g)
    perm = torch.randperm(total, generator=torch.Generator().manual_seed(1)).to(torch.int32)
    indices = torch.cat([torch.cat([perm[:sp], perm[sp + r * op: sp + (r + 1) * op]]) for r in range(n)])
    indptr = torch.arange(n + 1, dtype=torch.int32) * (sp + op)
    last = torch.full((n,), PS, dtype=torch.int32)
    q = torch.randn(n, HQ, D, dtype=torch.float16, device="cuda")
    callers = {"tessera": (tessera, 0), "tessera-64": (tessera, 64), "tessera-auto": (tessera, "auto")}
    if fi is not None:
        callers.update({"fi-tc": (fi, True), "fi": (fi, False)})
    fns, outs, keep = {}, {}, []
    for name, (lib, arg) in callers.items():
        tc = arg if lib is fi else True
        w = lib.BatchDecodeWithPagedKVCacheWrapper(common.new_workspace(512 << 20), "NHD", use_tensor_cores=tc)
        if lib is tessera and isinstance(arg, int) and arg:
            w._tc_cta_q = arg  # Tessera-only: pins the tensor-core query tile
        table = (indptr.cuda(), indices.cuda(), last.cuda()) if lib is fi else (indptr, indices, last)
        extra = {"shared_prefix": "auto"} if arg == "auto" else {}
        w.plan(*table, HQ, HKV, D, PS, q_data_type=torch.float16, kv_data_type=torch.float16, **extra)
        out = torch.full_like(q, float("nan"))
        w.run(q, (k, v), out=out, enable_pdl=True)
        torch.cuda.synchronize()
        outs[name] = out
        fns[name] = lambda w=w, o=out: common.bench_graph_ms([lambda: w.run(q, (k, v), out=o, enable_pdl=True)])
        keep.append(w)
    ref = outs["fi-tc" if fi is not None else "tessera"]
    diffs = {name: (o.float() - ref.float()).abs().max().item() for name, o in outs.items()}
    if not all(d < 2e-3 for d in diffs.values()):
        raise SystemExit(f"outputs disagree: {diffs}")
    times = common.interleaved(fns, args.rounds, timer=lambda f: f())
    us = {name: common.median(t) * 1e3 for name, t in times.items()}
    ratios = {f"{peer}/tessera": common.paired_ratio(times, peer, "tessera") for peer in us if peer != "tessera"}
    ratios.update({f"{peer}/tessera-auto": common.paired_ratio(times, peer, "tessera-auto")
                   for peer in ("fi-tc", "fi") if peer in us})
    print(f"# {n} requests x ({args.shared} shared + {args.own} own) tokens, GQA {HQ}/{HKV}, page {PS}; us, "
          f"ratios: peer time / Tessera's (> 1: Tessera faster)")
    print(" | ".join(f"{name} {u:.1f}" for name, u in us.items()) + " | " +
          ", ".join(f"{r} {x:.3f}" for r, x in ratios.items()), flush=True)
    common.save_results("flat-shared-pages", dict(requests=n, shared=args.shared, own=args.own, rounds=args.rounds,
                                                  us=us, ratios=ratios, max_diff=diffs, rounds_ms=times))


if __name__ == "__main__":
    main()
