"""SM clock, board power and throttle reasons while one prefill kernel runs
back to back (nvidia-smi sampled every 100 ms), for Tessera's kernels and
the peers in turn: is a kernel limited by its schedule, or by the power
limit pulling the clock down, and how much work does it do per joule
(GFLOP/J = TFLOP/s / W x 1000)? Paper Table-1 shape (batch 16, 16 heads,
head dim 128, causal, fp16), at each --seq.
Usage: python bench/power_probe.py [--seq 4096,8192,16384] [--seconds 4]
           [--peers tessera-fa3,tessera-fa2,flashinfer-fa3,flashinfer-fa2,sdpa-cudnn,sdpa-flash] [--save-as NAME]
Results: bench/results/power-probe.json (or NAME.json)."""
import argparse
import os
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402
import prefill as pf  # noqa: E402
from common import torch  # noqa: E402

QUERY = "clocks.sm,power.draw,temperature.gpu,clocks_throttle_reasons.active"


def sample_while(fn, seconds):
    """Runs fn back to back for `seconds`; returns (calls per second, smi rows)."""
    smi = subprocess.Popen(["nvidia-smi", f"--query-gpu={QUERY}", "--format=csv,noheader,nounits", "-lms", "100"],
                           stdout=subprocess.PIPE, text=True)
    time.sleep(0.3)
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    calls, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        for _ in range(5):
            fn()
        calls += 5
        torch.cuda.synchronize()
    rate = calls / (time.perf_counter() - t0)
    smi.terminate()
    out, _ = smi.communicate()
    rows = []
    for line in out.strip().splitlines():
        f = [x.strip() for x in line.split(",")]
        try:
            rows.append(dict(clock_mhz=float(f[0]), power_w=float(f[1]), temp_c=float(f[2]), throttle=f[3]))
        except (ValueError, IndexError):
            pass
    # Drop the samples taken before the kernels started (the first 0.3 s).
    return rate, rows[3:] if len(rows) > 6 else rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seq", default="16384", help="comma-separated sequence lengths")
    ap.add_argument("--seconds", type=float, default=4.0)
    ap.add_argument("--peers", default="tessera-fa3,sdpa-cudnn,sdpa-flash",
                    help="comma-separated: tessera-fa3, tessera-fa2, flashinfer-fa3, flashinfer-fa2, sdpa-cudnn, "
                         "sdpa-flash")
    ap.add_argument("--save-as", metavar="NAME", help="results file bench/results/NAME.json (default: power-probe)")
    args = ap.parse_args()
    common.require()
    try:
        seqs = [int(x) for x in args.seq.split(",") if x.strip()]
    except ValueError:
        ap.error(f"--seq: expected comma-separated integers, got {args.seq!r}")
    if not seqs or min(seqs) < 1:
        ap.error(f"--seq: expected lengths >= 1, got {args.seq!r}")
    names = [n.strip() for n in args.peers.split(",") if n.strip()]
    known = ("tessera-fa3", "tessera-fa2", "flashinfer-fa3", "flashinfer-fa2", "sdpa-cudnn", "sdpa-flash")
    for n in names:
        if n not in known:
            ap.error(f"--peers: unknown kernel {n!r}; expected some of {', '.join(known)}")
    b, h = 16, 16
    results = {}
    for L in seqs:
        fl = pf.flops([L] * b, [L] * b, h, True)

        def tessera(backend):  # its own workspace: a later plan into a shared one would replace this one
            return pf.tessera_ragged_fn([L] * b, [L] * b, h, h, True, backend, ws=common.new_workspace())

        makers = {"tessera-fa3": lambda: tessera("fa3"),
                  "tessera-fa2": lambda: tessera("fa2"),
                  "flashinfer-fa3": lambda: pf.flashinfer_fn([L] * b, [L] * b, h, h, True, "fa3"),
                  "flashinfer-fa2": lambda: pf.flashinfer_fn([L] * b, [L] * b, h, h, True, "fa2"),
                  "sdpa-cudnn": lambda: pf.sdpa_fn(b, h, h, L, L, True, "cudnn"),
                  "sdpa-flash": lambda: pf.sdpa_fn(b, h, h, L, L, True, "flash")}
        peers = {n: makers[n]() for n in names}
        print(f"seq {L}: median over {args.seconds:.0f} s of back-to-back calls")
        print(f"{'kernel':14s} {'TFLOP/s':>8s} {'MHz':>6s} {'W':>6s} {'GFLOP/J':>8s} {'C':>4s}  "
              "throttle reasons (bitmask: count)")
        for name, fn in peers.items():
            if fn is None:
                print(f"{name:14s} unavailable")
                continue
            time.sleep(2.0)  # let the clock recover between kernels
            rate, rows = sample_while(fn, args.seconds)
            reasons = {}
            for r in rows:
                reasons[r["throttle"]] = reasons.get(r["throttle"], 0) + 1
            med = lambda k: statistics.median(r[k] for r in rows) if rows else float("nan")
            tflops, watts = fl * rate / 1e12, med("power_w")
            res = dict(tflops=tflops, clock_mhz=med("clock_mhz"), power_w=watts, gflop_per_j=tflops / watts * 1e3,
                       temp_c=med("temp_c"), throttle=reasons, samples=rows)
            results[f"{name}@{L}"] = res
            print(f"{name:14s} {tflops:8.1f} {res['clock_mhz']:6.0f} {watts:6.0f} {res['gflop_per_j']:8.1f} "
                  f"{res['temp_c']:4.0f}  {reasons}")
    path = common.save_results(args.save_as or "power-probe", dict(setting=dict(batch=b, heads=h, head_dim=128, seqs=seqs,
                                                                causal=True, seconds=args.seconds), results=results))
    print("results:", path)

if __name__ == "__main__":
    main()
