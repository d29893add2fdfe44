"""A/B of Hopper prefill kernel settings in one process (interleaved rounds,
so clock and temperature drift hit every setting alike), paper Table-1 shape
(batch 16, 16 heads, head dim 128, causal, fp16) unless told otherwise. Each
setting is a set of environment variables the JIT reads when a wrapper plans
(TESSERA_SM90_DEFINES, TESSERA_SM90_RINGS, TESSERA_SM90_TMA, ...).

  python bench/prefill_ab.py --seqs 1024,4096,16384 \\
      --config "base:" --config "nochain:TESSERA_SM90_DEFINES=TESSERA_SM90_CHAIN=0"

--window N adds a causal sliding window (window_left = N) to the mask.
--backend fa2 times the FA2 template instead (its switches come from
TESSERA_PREFILL_DEFINES). The
pseudo-variable CTA_Q=64 forces the query tile (Tessera-only wrapper knob);
WRONG=1 marks a setting that is wrong on purpose (a speed bound).
Every setting's output at the first length is checked against PyTorch SDPA
(max error relative to the reference norm < 1e-3) before it is timed."""
import argparse
import os
import statistics
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402
import prefill as pf  # noqa: E402
import tessera  # noqa: E402


def parse(cfg):
    """NAME:VAR=VALUE|... -> (name, environment, forced query tile or 0)."""
    name, _, rest = cfg.partition(":")
    env = {}
    for kv in filter(None, rest.split("|")):
        k, eq, v = kv.partition("=")
        if not k or not eq:
            raise SystemExit(f"--config {cfg!r}: expected NAME:VAR=VALUE|VAR=VALUE, got {kv!r}")
        env[k] = v
    return name, env, int(env.pop("CTA_Q", 0))


def experiment(env):
    """WRONG=1 (pseudo-variable): the setting is a speed bound that computes
    wrong results on purpose; its error is reported, not enforced."""
    return env.get("WRONG") == "1"


with_env = common.with_env


_last_grid = [None]


def wrapper(L, b, h, window, cta_q=0, backend="fa3"):
    """A planned wrapper and its inputs: b requests of L tokens, causal (+ window)."""
    qo = torch.arange(0, b + 1, dtype=torch.int32) * L
    q = torch.randn(b * L, h, pf.D, dtype=pf.DT, device="cuda")
    k, v = torch.randn_like(q), torch.randn_like(q)
    w = tessera.BatchPrefillWithRaggedKVCacheWrapper(pf.workspace(), "NHD", backend=backend)
    w._cta_q = cta_q
    w.plan(qo, qo, h, h, pf.D, causal=True, window_left=window, q_data_type=pf.DT)
    _last_grid[0] = getattr(w, "grid", None)
    return w, q, k, v


def check(L, b, h, env, window, cta_q, backend, experiment=False):
    def run():
        w, q, k, v = wrapper(L, b, h, window, cta_q, backend)
        out = torch.full_like(q, float("nan"))
        w.run(q, k, v, out=out)
        return q, k, v, out

    q, k, v, out = with_env(env, run)
    print(f"  grid (CTAs per head group, cluster): {_last_grid[0]}", flush=True)
    t = lambda x: x.view(b, L, h, pf.D).transpose(1, 2)
    i = torch.arange(L, device="cuda")
    keep = i[None, :] <= i[:, None]
    if window >= 0:
        keep &= i[None, :] >= i[:, None] - window
    ref = torch.nn.functional.scaled_dot_product_attention(t(q).float(), t(k).float(), t(v).float(), attn_mask=keep)
    ref = ref.transpose(1, 2).reshape(b * L, h, pf.D)
    err = ((out.float() - ref).abs().max() / ref.norm(dim=-1).max()).item()
    if not err < 1e-3 and not experiment:
        raise SystemExit(f"FAILED: {env} at seq {L}: max error / reference norm = {err}")
    return err


def time_ms(L, b, h, window, cta_q, backend):
    w, q, k, v = wrapper(L, b, h, window, cta_q, backend)
    out = torch.empty_like(q)
    return common.bench_ms(lambda: w.run(q, k, v, out=out))


def flops(L, b, h, window):
    if window < 0:
        return pf.flops([L] * b, [L] * b, h, True)
    keys = sum(min(i + 1, window + 1) for i in range(L))  # row i sees keys max(0, i - window) .. i
    return 4 * keys * b * h * pf.D


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seqs", default="1024,2048,4096,16384")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--config", action="append", default=[], help="NAME:VAR=VALUE|VAR=VALUE ('NAME:' = defaults)")
    ap.add_argument("--window", type=int, default=-1, help="causal sliding window: window_left (-1: none)")
    ap.add_argument("--tag", default="ab", help="results file: bench/results/prefill-TAG-DEVICE-DATE.json")
    ap.add_argument("--head-dim", type=int, default=128, choices=[64, 128, 256])
    ap.add_argument("--backend", default="fa3", choices=["fa2", "fa3"], help="kernel template to A/B")
    ap.add_argument("--peers", default="", help="comma-separated SDPA backends timed in the same rounds (flash, cudnn)")
    args = ap.parse_args()
    peers = [x.strip() for x in args.peers.split(",") if x.strip()]
    for x in peers:
        if x not in ("flash", "cudnn"):
            ap.error(f"--peers: expected flash and/or cudnn, got {x!r}")
    if peers and args.window >= 0:
        ap.error("--peers: SDPA peers time the causal mask only (no --window)")
    pf.D = args.head_dim
    configs = [parse(c) for c in (args.config or ["base:"])]
    seqs = [int(s) for s in args.seqs.split(",")]
    errors = {}
    for name, env, cta_q in configs:
        errors[name] = check(seqs[0], args.batch, args.heads, env, args.window, cta_q, args.backend, experiment(env))
        print(f"check {name}: error {errors[name]:.2e}", flush=True)
    names = [n for n, _, _ in configs] + ["sdpa-" + x for x in peers]
    times = {(n, L): [] for n in names for L in seqs}
    for _ in range(args.rounds):
        for L in seqs:
            for name, env, cta_q in configs:
                run = lambda: time_ms(L, args.batch, args.heads, args.window, cta_q, args.backend)  # noqa: E731
                times[(name, L)].append(with_env(env, run))
            for x in peers:
                fn = pf.sdpa_fn(args.batch, args.heads, args.heads, L, L, True, x)
                times[("sdpa-" + x, L)].append(common.bench_ms(fn) if fn else float("nan"))
                del fn
    print("TFLOP/s (median of rounds)")
    print("seq      " + "".join(f"{n:>12s}" for n in names))
    rows = []
    for L in seqs:
        fl = flops(L, args.batch, args.heads, args.window)
        tf = {n: pf.tflops(fl, statistics.median(times[(n, L)])) for n in names}
        row = dict(seq=L, tflops=tf, ms_rounds={n: times[(n, L)] for n in names})
        line = f"{L:<9d}" + "".join(f"{tf[n]:12.1f}" for n in names)
        if "flash" in peers:
            # Per-round ratios to SDPA-flash (rounds interleave, so round i of
            # both ran back to back): all rounds in the JSON, the median printed.
            row["vs_sdpa_flash"] = {n: [f / t for t, f in zip(times[(n, L)], times[("sdpa-flash", L)])]
                                    for n, _, _ in configs}
            line += "   vs flash: " + " ".join(
                f"{n} {statistics.median(r):.3f}" for n, r in row["vs_sdpa_flash"].items())
        rows.append(row)
        print(line)
    path = common.save_results(f"prefill-{args.tag}", dict(
        setting=dict(batch=args.batch, heads=args.heads, head_dim=pf.D, dtype="float16", causal=True, backend=args.backend,
                     window_left=args.window, rounds=args.rounds, peers=peers),
        configs={n: dict(env, **({"CTA_Q": str(q)} if q else {})) for n, env, q in configs}, check_error=errors, rows=rows))
    print("results:", path)


if __name__ == "__main__":
    main()
