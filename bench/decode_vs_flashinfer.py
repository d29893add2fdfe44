"""Batch decode beside FlashInfer, both called as serving engines call them
(use_tensor_cores=False, FlashInfer's default, and True), in one process.

Per workload (page 16, fp16, head dim 128): Tessera with use_tensor_cores
False (the wrapper's pick) and True, Tessera's CUDA-core kernel forced, and
FlashInfer with use_tensor_cores False and True. Every build runs the same
cache (shuffled pages) and queries; outputs are checked against a float32
softmax (first and last request) and must agree with FlashInfer's within
2e-3. Timed in interleaved rounds over rotating cache copies (>= 2x L2)
replayed from a CUDA graph (common.bench_graph_ms), the same for every
callable, programmatic dependent launch on for both (FlashInfer's sm_90 default); ratios are the median over rounds of FlashInfer's time / ours
(> 1: Tessera faster), paired by round.

With --fixed PAGES, also Tessera's batch-invariant mode (fixed_split_size =
PAGES, use_tensor_cores=False) and its cost against the default plan.

Usage: python bench/decode_vs_flashinfer.py [--rounds 5] [--batches 16,64,128]
           [--heads 32/8,32/32] [--lengths const:1024,const:4096,uniform:512-4096,zipf:2048] [--fixed 64]
Results: bench/results/decode-vs-flashinfer.json
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402
import decode as dec  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--batches", default="16,64,128")
    ap.add_argument("--heads", default="32/8,32/32")
    ap.add_argument("--lengths", default="const:1024,const:4096,uniform:512-4096,zipf:2048")
    ap.add_argument("--fixed", type=int, default=0, help="fixed_split_size in pages for a batch-invariant row")
    args = ap.parse_args()
    tessera = common.require()
    torch = common.torch
    fi = common.flashinfer()
    if fi is None:
        raise SystemExit("flashinfer is not importable: this benchmark needs it (see ../shared/peers/flashinfer)")
    callers = {  # name: (library, use_tensor_cores, force Tessera's CUDA-core kernel)
        "tessera": (tessera, False, False), "tessera-tc": (tessera, True, False),
        "tessera-cc": (tessera, False, True), "fi": (fi, False, False), "fi-tc": (fi, True, False)}
    if args.fixed:
        callers["tessera-fixed"] = (tessera, False, False)
    rows = []
    print(f"{'Hq/Hkv':>6} {'lengths':>18} {'B':>4} | " + " ".join(f"{n + ' us':>13}" for n in callers) +
          " | fi/tessera fi-tc/tessera-tc fi/tessera-cc")
    for heads in args.heads.split(","):
        hq, hkv = (int(x) for x in heads.split("/"))
        for dist in args.lengths.split(","):
            for b in (int(x) for x in args.batches.split(",")):
                lens = common.kv_lengths(dist, b, seed=b)
                torch.manual_seed(b)
                q = torch.randn(b, hq, dec.D, dtype=dec.DTYPE, device="cuda")
                copies = common.rotation_copies(dec.needed_bytes(lens, hq, hkv))
                fns, errs, outs, keep = {}, {}, {}, []
                base = None
                for name, (lib, tc, cc) in callers.items():
                    fixed = name == "tessera-fixed"  # its partial states need a larger workspace
                    st = dec.decode_wrapper(lib, lens, 16, hq, hkv, seed=b + 16, tensor_cores=tc, cuda_cores=cc,
                                            fixed_split_size=args.fixed if fixed else None,
                                            ws=common.new_workspace(3 << 30) if fixed else None)
                    if base is None:
                        base = st
                        caches = [(st["k"], st["v"])] + [(torch.randn_like(st["k"]), torch.randn_like(st["v"]))
                                                         for _ in range(copies - 1)]
                    out = torch.full_like(q, float("nan"))
                    st["w"].run(q, caches[0], out=out, enable_pdl=True)
                    torch.cuda.synchronize()
                    errs[name] = dec.spot_check(lens, q, out, base["k"], base["v"], base["indptr"], base["indices"],
                                                hq, hkv)
                    outs[name] = out.clone()
                    calls = [lambda kv=kv, w=st["w"], o=out: w.run(q, kv, out=o, enable_pdl=True) for kv in caches]
                    fns[name] = lambda calls=calls: common.bench_graph_ms(calls)
                    keep.append(st)
                worst = max(errs.values())
                agree = max((outs[n].float() - outs["fi"].float()).abs().max().item() for n in outs)
                if not worst < 2e-3 or not agree < 2e-3:
                    raise SystemExit(f"{heads} {dist} x {b}: outputs disagree (errors {errs}, vs FlashInfer {agree})")
                times = common.interleaved(fns, args.rounds, timer=lambda f: f())
                med = {n: common.median(t) * 1e3 for n, t in times.items()}
                ratio = {"fi/tessera": common.paired_ratio(times, "fi", "tessera"),
                         "fi-tc/tessera-tc": common.paired_ratio(times, "fi-tc", "tessera-tc"),
                         "fi/tessera-cc": common.paired_ratio(times, "fi", "tessera-cc"),
                         "fi-tc/tessera": common.paired_ratio(times, "fi-tc", "tessera")}
                if args.fixed:  # the batch-invariant mode's cost: > 1 means slower than the default plan
                    ratio["fixed/default"] = common.paired_ratio(times, "tessera-fixed", "tessera")
                rows.append(dict(hq=hq, hkv=hkv, lengths=dist, batch=b, us=med, ratios=ratio, check_err=errs,
                                 max_diff_vs_flashinfer=agree, rounds_ms=times))
                print(f"{hq:>3}/{hkv:<2} {dist:>18} {b:>4} | " + " ".join(f"{med[n]:13.1f}" for n in callers) +
                      f" | {ratio['fi/tessera']:10.3f} {ratio['fi-tc/tessera-tc']:16.3f} {ratio['fi/tessera-cc']:13.3f}",
                      flush=True)
                del keep, caches, fns
                torch.cuda.empty_cache()
    lo = {k: min(r["ratios"][k] for r in rows) for k in rows[0]["ratios"]} if rows else {}
    print("# min ratios: " + ", ".join(f"{k} {v:.3f}" for k, v in lo.items()))
    common.save_results("decode-vs-flashinfer", dict(rounds=args.rounds, rows=rows, min_ratios=lo))


if __name__ == "__main__":
    main()
