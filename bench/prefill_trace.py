"""Timeline of one CTA of the Hopper prefill kernel: where the cycles between
work items and KV tiles go (TESSERA_SM90_TRACE, prefill_sm90_trace.cuh).
Runs the ragged Table-1 setting in a child process with the trace compiled
in, reads the clock stamps the kernel prints, and summarizes per item.
With --tiles, the two consumer warpgroups' points within each KV tile of
their first item instead (TESSERA_SM90_TRACE=2): when each waited for K,
took its ping-pong turn, issued, got S, finished the softmax, got O.
Usage: python bench/prefill_trace.py [--seq L] [--batch B] [--heads H] [--non-causal] [--tiles]"""
import argparse
import os
import subprocess
import sys

TILE = ["k_wait", "turn", "issue", "s_wait", "softmax", "o_wait", "pack"]
CONSUMER = ["top", "header", "q", "k0", "s0", "softmax0", "loop", "last_pv", "epilogue"]


def child(args):
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import torch
    import tessera
    import common
    L, b, h = args.seq, args.batch, args.heads
    qo = torch.arange(0, b + 1, dtype=torch.int32) * L
    q = torch.randn(b * L, h, 128, dtype=torch.float16, device="cuda")
    k, v = torch.randn_like(q), torch.randn_like(q)
    w = tessera.BatchPrefillWithRaggedKVCacheWrapper(common.workspace(), "NHD", backend="fa3")
    w.plan(qo, qo, h, h, 128, causal=not args.non_causal, q_data_type=torch.float16)
    out = torch.empty_like(q)
    for _ in range(3):
        w.run(q, k, v, out=out)
    torch.cuda.synchronize()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--non-causal", action="store_true")
    ap.add_argument("--tiles", action="store_true")
    ap.add_argument("--child", action="store_true")
    args = ap.parse_args()
    if args.child:
        return child(args)
    env = dict(os.environ)
    env["TESSERA_SM90_DEFINES"] = (env.get("TESSERA_SM90_DEFINES", "") + f" TESSERA_SM90_TRACE={2 if args.tiles else 1}").strip()
    out = subprocess.run([sys.executable, __file__, "--child"] + sys.argv[1:], env=env, capture_output=True, text=True)
    if out.returncode != 0:
        print(out.stdout[-3000:], out.stderr[-3000:])
        sys.exit(1)
    rows = {}
    for line in out.stdout.splitlines():
        f = line.split()
        if f and f[0] == "TRACE":
            rows[(int(f[1]), int(f[2]))] = [int(x) for x in f[3:]]  # the last launch wins
    if args.tiles:
        return tile_table(rows, args)
    cons = [rows[k] for k in sorted(k for k in rows if k[0] == 0)]
    prod = {k[1]: rows[k] for k in rows if k[0] == 1}
    if not cons:
        print("no trace lines")
        sys.exit(1)
    t0 = cons[0][0]
    print(f"seq {args.seq} batch {args.batch} heads {args.heads} causal {not args.non_causal}: CTA (0,0), cycles")
    print("item tiles | " + " ".join(f"{n:>8}" for n in CONSUMER[1:]) + " | per-tile  gap | prod: q_empty q_issued k0")
    tot = {n: 0 for n in CONSUMER[1:]}
    tiles = 0
    for i, c in enumerate(cons):
        n = c[9]
        d = [c[j] - c[j - 1] for j in range(1, 9)]
        gap = cons[i + 1][0] - c[8] if i + 1 < len(cons) else 0
        per = d[5] / (n - 1) if n > 1 else 0
        p = prod.get(i)
        ps = f"{p[1] - t0:>8} {p[2] - t0:>8} {p[3] - t0:>8}" if p else ""
        print(f"{i:>4} {n:>5} | " + " ".join(f"{x:>8}" for x in d) + f" | {per:>8.0f} {gap:>4} | {ps}  (top {c[0] - t0})")
        for name, x in zip(CONSUMER[1:], d):
            tot[name] += x
        tiles += n
    span = cons[-1][8] - cons[0][0]
    print(f"span {span} cycles over {len(cons)} items, {tiles} tiles: {span / tiles:.0f} per tile")
    print("share of span: " + ", ".join(f"{k} {100 * v / span:.1f}%" for k, v in tot.items()))


def tile_table(rows, args):
    """Per tile t >= 1 of the first item: each warpgroup's time in each step
    (cycles), and when it issued its GEMMs relative to warpgroup 0's."""
    wgs = [{k[1]: rows[k] for k in rows if k[0] == r} for r in (0, 2)]
    print(f"seq {args.seq} causal {not args.non_causal}: CTA (0,0), first item, cycles per step")
    print("tile wg | " + " ".join(f"{n:>7}" for n in TILE) + " |  period issue_at | s_issue  v_wait pv_issue")
    for t in range(2, 24):
        for i, wg in enumerate(wgs):
            if t not in wg or t - 1 not in wg or wg[t][7] == 0:
                continue
            c = wg[t]
            d = [c[j + 1] - c[j] for j in range(7)]
            period = c[7] - wg[t - 1][7]
            split = f"{c[8] - c[2]:>7} {c[9] - c[8]:>7} {c[3] - c[9]:>7}"
            print(f"{t:>4} {i:>2} | " + " ".join(f"{x:>7}" for x in d) + f" | {period:>7} {c[2] - wgs[0][t][2]:>7} | {split}")


if __name__ == "__main__":
    main()
