"""Where a short decode step's time goes across the grid (tensor-core path,
TESSERA_SM90_TRACE=3, prefill_sm90_trace.cuh): every CTA's first consumer
thread stamps the global timer at its start, when its first K tile has
landed, after its last main loop and at its end. One launch after each of
two L2 states (a written flush buffer, as triton's do_bench leaves it, whose
dirty lines must go back to HBM during the step; and a read one, which leaves
L2 clean), then percentiles over the CTAs, relative to the earliest start.
With --prefill L: the same for causal prefill of --batch requests of L tokens
(--hq heads, the Hopper kernel on ragged KV).
Usage: python bench/decode_trace.py [--dump US] [--slow N] [--shared-prefix N] [--hq 32] [--hkv 8] [--batch 1] [--lengths const:32768] [--page 16] [--prefill L]"""
import argparse
import os
import subprocess
import sys

D = 128


def child(a):
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import torch
    import common
    import decode as dec
    import tessera
    if a.prefill:  # the Table-1 shape: a.batch requests of a.prefill tokens, causal, a.hq heads
        qo = torch.arange(0, a.batch + 1, dtype=torch.int32) * a.prefill
        q = torch.randn(a.batch * a.prefill, a.hq, D, dtype=torch.float16, device="cuda")
        kr, vr = torch.randn_like(q), torch.randn_like(q)
        w = tessera.BatchPrefillWithRaggedKVCacheWrapper(common.workspace(), "NHD", backend="fa3")
        w.plan(qo, qo, a.hq, a.hq, D, causal=True, q_data_type=torch.float16)
        out = torch.empty_like(q)
        run = lambda: w.run(q, kr, vr, out=out)  # noqa: E731
    elif a.shared_prefix:  # a cascade's shared level: --batch query rows (one request) over a paged prefix
        pages = a.shared_prefix // a.page
        k = torch.randn(pages, a.page, a.hkv, D, dtype=torch.float16, device="cuda")
        v = torch.randn_like(k)
        q = torch.randn(a.batch, a.hq, D, dtype=torch.float16, device="cuda")
        w = tessera.BatchPrefillWithPagedKVCacheWrapper(common.workspace(), "NHD")
        w.plan(torch.tensor([0, a.batch], dtype=torch.int32), torch.tensor([0, pages], dtype=torch.int32),
               torch.randperm(pages).int(), torch.tensor([a.page], dtype=torch.int32), a.hq, a.hkv, D, a.page,
               q_data_type=torch.float16)
        print("grid", w.grid, "cta_q", w.cta_q, flush=True)
        out = torch.empty_like(q)
        run = lambda: w.run(q, (k, v), out=out)  # noqa: E731
    else:
        lens = common.kv_lengths(a.lengths, a.batch)
        k, v, indptr, indices, last = dec.paged_cache(lens, a.page, a.hkv, seed=1)
        q = torch.randn(a.batch, a.hq, D, dtype=torch.float16, device="cuda")
        w = tessera.BatchDecodeWithPagedKVCacheWrapper(common.workspace(), "NHD", use_tensor_cores=True)
        w.plan(indptr, indices, last, a.hq, a.hkv, D, a.page, q_data_type=torch.float16, kv_data_type=torch.float16)
        out = torch.empty_like(q)
        run = lambda: w.run(q, (k, v), out=out)  # noqa: E731
    flush = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    run()  # load and warm
    torch.cuda.synchronize()
    for state in ("written", "read"):
        for _ in range(3):
            if state == "written":
                flush.zero_()
            else:
                flush.view(torch.int64).amax()
            torch.cuda.synchronize()
            print(f"RUN {state}", flush=True)
            run()
            torch.cuda.synchronize()


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(p / 100 * len(xs)))]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--hq", type=int, default=32)
    ap.add_argument("--hkv", type=int, default=8)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--lengths", default="const:32768")
    ap.add_argument("--page", type=int, default=16)
    ap.add_argument("--prefill", type=int, default=0, help="trace causal prefill of --batch x this many tokens instead")
    ap.add_argument("--shared-prefix", type=int, default=0,
                    help="trace a cascade's shared level instead: --batch query rows over this many paged keys")
    ap.add_argument("--dump", type=float, default=0, help="also list CTAs whose end - last loop exceeds this many us")
    ap.add_argument("--slow", type=int, default=0, help="also list the N CTAs whose last loop ended latest (with SM)")
    ap.add_argument("--child", action="store_true")
    a = ap.parse_args()
    if a.child:
        return child(a)
    env = dict(os.environ, TESSERA_SM90_DEFINES="TESSERA_SM90_TRACE=3")
    out = subprocess.run([sys.executable, __file__, "--child"] + sys.argv[1:], env=env, capture_output=True, text=True)
    if out.returncode:
        print(out.stdout[-2000:], out.stderr[-4000:])
        raise SystemExit(out.returncode)
    runs, cur = [], None
    for line in out.stdout.splitlines():
        if line.startswith("RUN "):
            cur = (line.split()[1], [])
            runs.append(cur)
        elif line.startswith("GRID ") and cur is not None:
            f = line.split()
            cur[1].append(dict(cta=int(f[1]), sm=int(f[2]), items=int(f[3]), tiles=int(f[4]),
                               t=[int(x) for x in f[5:9]]))
    what = (f"prefill {a.batch} x {a.prefill}, {a.hq} heads" if a.prefill else
            f"shared prefix {a.shared_prefix}, {a.batch} rows, {a.hq}/{a.hkv}" if a.shared_prefix else
            f"{a.hq}/{a.hkv} batch {a.batch} {a.lengths} page {a.page}")
    for line in out.stdout.splitlines():
        if line.startswith("grid "):
            print(line)
    print(f"{what}: us from the earliest CTA start "
          "(p10 / p50 / p90 / max over CTAs)")
    for state, ctas in runs:
        busy = [c for c in ctas if c["tiles"] > 0]
        t0 = min(c["t"][0] for c in ctas)
        col = lambda i, cs=busy: [(c["t"][i] - t0) / 1e3 for c in cs]  # noqa: E731
        q = lambda xs: " / ".join(f"{pct(xs, p):6.1f}" for p in (10, 50, 90, 100))  # noqa: E731
        print(f"L2 {state}: {len(ctas)} CTAs ({len(busy)} with tiles; tiles p50 {pct([c['tiles'] for c in busy], 50)}"
              f" max {max(c['tiles'] for c in busy)})")
        print(f"  start      {q(col(0, ctas))}")
        print(f"  first K    {q(col(1))}")
        print(f"  last loop  {q(col(2))}")
        print(f"  end        {q(col(3, ctas))}")
        print(f"  first K - start {q([(c['t'][1] - c['t'][0]) / 1e3 for c in busy])}; "
              f"end - last loop {q([(c['t'][3] - c['t'][2]) / 1e3 for c in busy])}")
        if a.slow:
            late = sorted(busy, key=lambda c: -c["t"][2])[:a.slow]
            print("    latest last loops (cta/sm: us): " + ", ".join(
                f"{c['cta']}/{c['sm']}: {(c['t'][2] - t0) / 1e3:.1f}" for c in late))
        if a.dump:
            for c in ctas:
                if (c["t"][3] - c["t"][2]) / 1e3 > a.dump:
                    print(f"    cta {c['cta']} sm {c['sm']} items {c['items']} tiles {c['tiles']}: "
                          + " ".join(f"{(x - t0) / 1e3:.1f}" for x in c["t"]))


if __name__ == "__main__":
    main()
