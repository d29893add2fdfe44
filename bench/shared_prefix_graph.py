"""shared_prefix="auto" in CUDA-graph decode: what a serving step's attention
costs with and without it, GPU and host, side by side in one run.

A step of B decode rows (GQA 32/8, head dim 128, page 16, fp16): P prompts
of L tokens (or, for a --prefixes entry L1+L2+..., prompts of those lengths
in turn, as Study 2's n = 64 step has 528 and 1936), each forked into n
samples (B = P x n) that share the prompt's full pages, each sample with
its own suffix (uniform 32..256 tokens). Two
decode wrappers in use_cuda_graph mode with CUDA-graph buffers of B rows,
as an engine holds one per batch bucket:
  none:  plan() of the flat page table;
  auto:  plan(..., shared_prefix="auto"): the unique level on the wrapper's
         decode kernel, the shared level on a prefill kernel merging into
         its output (groups of at least GRAPH_MIN_SHARED_TOKENS tokens);
  auto-any: the same with every group, of any length, size or saving (for
         comparison).
--capture-first captures each arm's graph the way a serving engine does:
after a plan of dummy rows (one key each, page 0), then re-plans the step.
Per arm, one CUDA graph holds `layers` run() calls, each over its own K / V
pool (distinct memory per layer, as a model's layers are), replayed back to
back: GPU time per step (median of replays). Host time: plan() per step
(median), which a synchronous engine adds to every step. Each arm's first
layer is checked against an eager flat decode (fp16 relative error).
--kernels: each arm's GPU time per kernel (median over the graph's launches,
torch.profiler), e.g. the unique and shared levels apart; with --no-pdl the
launches run without programmatic dependent launch, so each kernel's span
is its own (with it, a kernel's span includes its wait for the one before).
Usage: python bench/shared_prefix_graph.py [--quick] [--layers N] [--capture-first] [--arms none,auto,...]
                                           [--kernels] [--no-pdl] [--prefixes 256,512,528+1936] [--ns 1,4,16,64]
"""
import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402
from common import torch, tessera  # noqa: E402

HQ, HKV, D, PS = 32, 8, 128, 16


def step_table(prompts, n, lengths, rng):
    """Flat page table of one step: each sample lists its prompt's pages, then its own.
    Prompt p is lengths[p % len(lengths)] tokens long."""
    starts = np.concatenate([[0], np.cumsum([lengths[p % len(lengths)] // PS for p in range(prompts)])])
    suffix = rng.integers(32, 257, size=prompts * n)
    ids, nxt = [], int(starts[-1])
    for i, s in enumerate(suffix):
        own = -(-int(s) // PS)
        p = i // n
        ids.append(np.concatenate([np.arange(starts[p], starts[p + 1]), np.arange(nxt, nxt + own)]))
        nxt += own
    perm = rng.permutation(nxt).astype(np.int32)  # pages anywhere in the pool
    ids = [perm[x] for x in ids]
    indptr = np.concatenate([[0], np.cumsum([len(x) for x in ids])]).astype(np.int32)
    last = np.array([int(s) - (-(-int(s) // PS) - 1) * PS for s in suffix], np.int32)
    return indptr, np.concatenate(ids), last, nxt


def dummy_table(batch):
    """A serving engine's capture step: every row one key on page 0."""
    return (np.arange(batch + 1, dtype=np.int32), np.zeros(batch, np.int32), np.ones(batch, np.int32))


def arm(auto, table, caches, q, layers, batch, max_pages, capture_first=False, pdl=True):
    i32 = dict(dtype=torch.int32, device="cuda")
    w = tessera.BatchDecodeWithPagedKVCacheWrapper(
        common.new_workspace(256 << 20), "NHD", use_cuda_graph=True, use_tensor_cores=True,
        paged_kv_indptr_buffer=torch.zeros(batch + 1, **i32), paged_kv_indices_buffer=torch.zeros(max_pages, **i32),
        paged_kv_last_page_len_buffer=torch.zeros(batch, **i32))
    kw = dict(shared_prefix="auto") if auto else {}
    if auto == "any":  # every group, of any length, size or saving (what the option's limits avoid)
        w._shared_prefix_limits = (1, 2, 0)

    def plan(t=table):
        w.plan(*t, HQ, HKV, D, PS, q_data_type="float16", **kw)
    plan(dummy_table(batch) if capture_first else table)
    outs = [torch.empty_like(q) for _ in range(layers)]

    def step():
        for i in range(layers):
            w.run(q, caches[i % len(caches)], out=outs[i], enable_pdl=pdl)
    step()
    torch.cuda.synchronize()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step()
    torch.cuda.current_stream().wait_stream(side)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        step()
    if capture_first:
        plan()
    host = []
    for _ in range(30):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        plan()
        host.append((time.perf_counter() - t0) * 1e6)
    torch.cuda.synchronize()
    # The wrapper too: its workspace holds the plan the graph reads.
    return g, outs, float(np.median(host)), w.shared_prefix_stats if auto else None, w


def kernel_times(graph, replays=3):
    """{kernel name: (median GPU us per launch, launches per replay)} of a captured graph."""
    from torch.profiler import ProfilerActivity, profile
    graph.replay()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(replays):
            graph.replay()
        torch.cuda.synchronize()
    spans = {}
    for e in prof.events():
        if e.device_type.name == "CUDA":
            spans.setdefault(e.name, []).append(e.device_time)
    return {k: (float(np.median(v)), len(v) // replays) for k, v in spans.items()}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--capture-first", action="store_true", help="capture after a plan of dummy rows, as engines do")
    ap.add_argument("--arms", default="none,auto,auto-any", help="of none, auto, auto-any (none first)")
    ap.add_argument("--kernels", action="store_true", help="also each arm's GPU time per kernel (torch.profiler)")
    ap.add_argument("--no-pdl", action="store_true", help="launch without programmatic dependent launch")
    ap.add_argument("--prefixes", default=None,
                    help="shared prompt lengths, L or L1+L2+... in turn (default 256,512,1536; --quick 1536)")
    ap.add_argument("--ns", default=None, help="samples per prompt (default 1,4,16,64; --quick 1,16)")
    args = ap.parse_args(argv)
    names = args.arms.split(",")
    if names[0] != "none" or not set(names) <= {"none", "auto", "auto-any"} or "auto" not in names:
        raise SystemExit(f"--arms: expected none first, auto, and any of auto-any / auto-64, got {args.arms}")
    common.require()
    rng = np.random.default_rng(0)
    ns = [int(x) for x in args.ns.split(",")] if args.ns else [1, 16] if args.quick else [1, 4, 16, 64]
    prefixes = ([[int(x) for x in e.split("+")] for e in args.prefixes.split(",")] if args.prefixes else
                [[1536]] if args.quick else [[256], [512], [1536]])
    if any(p % PS or p < PS for e in prefixes for p in e) or any(n < 1 or args.batch % n for n in ns):
        raise SystemExit(f"--prefixes: positive multiples of {PS}; --ns: divisors of --batch {args.batch}")
    rows = []
    for lengths in prefixes:
        prefix = "+".join(map(str, lengths))
        for n in ns:
            prompts = args.batch // n
            table = step_table(prompts, n, lengths, rng)
            pages = table[3]
            # Distinct K / V per layer up to ~24 GiB, reused round-robin beyond (all far beyond L2).
            per = pages * PS * HKV * D * 2 * 2
            pools = max(1, min(args.layers, (24 << 30) // max(per, 1)))
            caches = [(torch.randn(pages, PS, HKV, D, dtype=torch.float16, device="cuda"),
                       torch.randn(pages, PS, HKV, D, dtype=torch.float16, device="cuda")) for _ in range(pools)]
            q = torch.randn(args.batch, HQ, D, dtype=torch.float16, device="cuda")
            arms = {name: arm({"none": False, "auto": True, "auto-any": "any"}[name], table[:3], caches, q,
                              args.layers, args.batch, len(table[1]), args.capture_first, not args.no_pdl)
                    for name in names}
            times = {name: [] for name in arms}
            for r in range(args.rounds):
                for name in (list(arms) if r % 2 == 0 else list(arms)[::-1]):
                    times[name] += [ms * 1e3 for ms in common.graph_replay_ms(arms[name][0], 5)]
            flat = tessera.BatchDecodeWithPagedKVCacheWrapper(common.new_workspace(256 << 20), "NHD",
                                                              use_tensor_cores=True)
            flat.plan(*table[:3], HQ, HKV, D, PS, q_data_type="float16")
            ref = flat.run(q, caches[0]).float()  # eager, layer 0's pool
            errs = {name: ((a[1][0].float() - ref).abs().max() / ref.abs().max()).item() for name, a in arms.items()}
            err = max(errs.values())
            gpu = {name: float(np.median(t)) for name, t in times.items()}
            host = {name: arms[name][2] for name in arms}
            row = dict(prefix=prefix, n=n, prompts=prompts, batch=args.batch, layers=args.layers,
                       gpu_us=gpu, host_plan_us=host, rel_err=errs, stats=arms["auto"][3],
                       step_ratio=(gpu["none"] + host["none"]) / (gpu["auto"] + host["auto"]))
            if args.kernels:
                row["kernel_us"] = {name: kernel_times(a[0]) for name, a in arms.items()}
            rows.append(row)
            others = "; ".join(f"{k} {gpu[k]:8.1f}" for k in names if k not in ("none", "auto"))
            print(f"L {prefix:>5s} n {n:3d}: GPU {gpu['none']:8.1f} -> {gpu['auto']:8.1f} us "
                  f"({gpu['none'] / gpu['auto']:.3f}x; {others}), plan "
                  f"{host['none']:6.1f} -> {host['auto']:6.1f} us, step none / auto {row['step_ratio']:.3f}, "
                  f"err {' / '.join(f'{e:.1e}' for e in errs.values())}, groups {arms['auto'][3]['groups']}", flush=True)
            for name, ks in row.get("kernel_us", {}).items():
                print(f"    {name:8s} per launch: " + "; ".join(f"{us:.1f} us x {n} {k}" for k, (us, n) in ks.items()))
            assert err < 2e-3, f"an arm differs from the eager flat decode: {errs}"
            del arms, caches
            torch.cuda.empty_cache()
    common.save_results("shared-prefix-graph", dict(rows=rows, capture_first=args.capture_first, arms=names,
                                                    pdl=not args.no_pdl))


if __name__ == "__main__":
    main()
