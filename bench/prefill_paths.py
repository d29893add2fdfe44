"""Experiment: the same causal sliding-window prefill through Tessera's two
Python entry points, interleaved in one process: the spec API
(AttentionWrapper + variants.sliding_window, as bench/variants.py runs it)
and the FlashInfer-style ragged wrapper (plan(window_left=...), as
bench/prefill_ab.py runs it). Both must give the same attention; they
should also take the same time (same C++ BatchPrefill underneath).
Usage: python bench/prefill_paths.py [--window 1024] [--seqs 2048,8192,16384]"""
import argparse
import os
import statistics
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
import common  # noqa: E402
import tessera  # noqa: E402

B, H, D, DT = 16, 16, 128, torch.float16


def spec_api(L, window, q, k, v):
    spec = tessera.variants.sliding_window(window, causal=True)
    task = tessera.TaskInfo(H, H, page_size=1, max_batch=B, max_pages=1, max_total_q=B * L)
    w = tessera.AttentionWrapper(tessera.AttentionSpec(spec, q_dtype=DT, head_dim=D), task, common.workspace(),
                                 kind="prefill", backend="fa3")
    indptr = torch.arange(B + 1, dtype=torch.int32) * L
    w.plan_ragged(indptr, indptr)
    out = torch.empty_like(q)
    return lambda: w.run_ragged(q, k, v, out=out), out


def flashinfer_api(L, window, q, k, v):
    indptr = torch.arange(B + 1, dtype=torch.int32) * L
    w = tessera.BatchPrefillWithRaggedKVCacheWrapper(common.workspace(), "NHD", backend="fa3")
    w.plan(indptr, indptr, H, H, D, causal=True, window_left=window, q_data_type=DT)
    out = torch.empty_like(q)
    return lambda: w.run(q, k, v, out=out), out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--window", type=int, default=1024)
    ap.add_argument("--seqs", default="2048,8192,16384")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    rows = []
    for L in [int(s) for s in args.seqs.split(",")]:
        q = torch.randn(B * L, H, D, dtype=DT, device="cuda")
        k, v = torch.randn_like(q), torch.randn_like(q)
        w = min(args.window, L - 1)
        pairs = B * H * (w * (w + 1) // 2 + (L - w) * (w + 1))
        runs = {"spec_api": spec_api(L, args.window, q, k, v), "flashinfer_api": flashinfer_api(L, args.window, q, k, v)}
        outs = {}
        for name, (fn, out) in runs.items():
            fn()
            torch.cuda.synchronize()
            outs[name] = out.clone()
        same = torch.equal(outs["spec_api"], outs["flashinfer_api"])
        times = {n: [] for n in runs}
        for _ in range(args.rounds):
            for name, (fn, _) in runs.items():
                times[name].append(common.bench_ms(fn))
        tf = {n: 4 * D * pairs / (statistics.median(t) * 1e-3) / 1e12 for n, t in times.items()}
        print(f"L {L:>6}: " + " | ".join(f"{n} {tf[n]:6.1f} TFLOP/s" for n in runs) + f" | outputs equal: {same}",
              flush=True)
        rows.append(dict(seq=L, window=args.window, tflops=tf, ms_rounds=times, outputs_equal=same))
    common.save_results("prefill-paths", dict(batch=B, heads=H, head_dim=D, rows=rows))


if __name__ == "__main__":
    main()
