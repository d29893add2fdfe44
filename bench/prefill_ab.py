"""A/B of Hopper prefill kernel settings in one process (interleaved rounds,
so clock and temperature drift hit every setting alike), paper Table-1 shape
(batch 16, 16 heads, head dim 128, causal, fp16) unless told otherwise. Each
setting is a set of environment variables the JIT reads when a wrapper plans
(TESSERA_SM90_DEFINES, TESSERA_SM90_RINGS, TESSERA_SM90_TMA, ...).

  python bench/prefill_ab.py --seqs 1024,4096,16384 \\
      --config "base:" --config "nochain:TESSERA_SM90_DEFINES=TESSERA_SM90_CHAIN=0"

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
    name, _, rest = cfg.partition(":")
    env = {}
    for kv in filter(None, rest.split("|")):
        k, eq, v = kv.partition("=")
        if not k or not eq:
            raise SystemExit(f"--config {cfg!r}: expected NAME:VAR=VALUE|VAR=VALUE, got {kv!r}")
        env[k] = v
    return name, env


def with_env(env, fn):
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        return fn()
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def check(L, b, h, env):
    qo = torch.arange(0, b + 1, dtype=torch.int32) * L
    q = torch.randn(b * L, h, pf.D, dtype=pf.DT, device="cuda")
    k, v = torch.randn_like(q), torch.randn_like(q)

    def run():
        w = tessera.BatchPrefillWithRaggedKVCacheWrapper(pf.workspace(), "NHD", backend="fa3")
        w.plan(qo, qo, h, h, pf.D, causal=True, q_data_type=pf.DT)
        out = torch.full_like(q, float("nan"))
        w.run(q, k, v, out=out)
        return out

    out = with_env(env, run)
    t = lambda x: x.view(b, L, h, pf.D).transpose(1, 2)
    ref = torch.nn.functional.scaled_dot_product_attention(t(q).float(), t(k).float(), t(v).float(), is_causal=True)
    ref = ref.transpose(1, 2).reshape(b * L, h, pf.D)
    err = ((out.float() - ref).abs().max() / ref.norm(dim=-1).max()).item()
    if not err < 1e-3:
        raise SystemExit(f"FAILED: {env} at seq {L}: max error / reference norm = {err}")
    return err


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seqs", default="1024,2048,4096,16384")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--config", action="append", default=[], help="NAME:VAR=VALUE|VAR=VALUE ('NAME:' = defaults)")
    ap.add_argument("--tag", default="ab", help="results file: bench/results/prefill-TAG-DEVICE-DATE.json")
    args = ap.parse_args()
    configs = [parse(c) for c in (args.config or ["base:"])]
    seqs = [int(s) for s in args.seqs.split(",")]
    errors = {}
    for name, env in configs:
        errors[name] = check(seqs[0], args.batch, args.heads, env)
        print(f"check {name}: error {errors[name]:.2e}", flush=True)
    times = {(n, L): [] for n, _ in configs for L in seqs}
    for _ in range(args.rounds):
        for L in seqs:
            lens = [L] * args.batch
            for name, env in configs:
                times[(name, L)].append(with_env(env, lambda: pf.tessera_ragged(lens, lens, args.heads, args.heads, True,
                                                                                backend="fa3")))
    print("TFLOP/s (median of rounds)")
    print("seq      " + "".join(f"{n:>12s}" for n, _ in configs))
    rows = []
    for L in seqs:
        fl = pf.flops([L] * args.batch, [L] * args.batch, args.heads, True)
        tf = {n: pf.tflops(fl, statistics.median(times[(n, L)])) for n, _ in configs}
        rows.append(dict(seq=L, tflops=tf, ms_rounds={n: times[(n, L)] for n, _ in configs}))
        print(f"{L:<9d}" + "".join(f"{tf[n]:12.1f}" for n, _ in configs))
    path = common.save_results(f"prefill-{args.tag}", dict(
        setting=dict(batch=args.batch, heads=args.heads, head_dim=pf.D, dtype="float16", causal=True, backend="fa3",
                     rounds=args.rounds),
        configs={n: env for n, env in configs}, check_error=errors, rows=rows))
    print("results:", path)


if __name__ == "__main__":
    main()
