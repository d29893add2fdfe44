"""Attention-state merges against FlashInfer and the copy rate.

merge_state (out = a (+) b), merge_state_in_place (a = a (+) b) and
merge_states (K states per row) at [tokens, 32 heads, 128], fp16 and bf16,
Tessera beside FlashInfer's functions of the same names (when flashinfer
imports) and beside a torch copy of the same number of bytes (a merge reads
and writes each byte once, so a copy is its ceiling). Every callable runs on
rotating input copies (>= 2x L2) replayed from one CUDA graph
(common.bench_graph_ms), in interleaved rounds; the ratio is the paired
median of FlashInfer's time over Tessera's (> 1: Tessera faster) and
"% copy" is the copy's time over the merge's. Tessera's merges launch with
programmatic dependent launch (their default, enable_pdl=None), so each call
starts while the one before it ends; FlashInfer's merges have no such
option. "no PDL" is Tessera's merge with enable_pdl=False in the same
rounds. The outputs of the two libraries are compared once per case.
Usage: python bench/merge.py [--rounds N] [--tokens 512,4096,16384]
                             [--ops pair,in_place,states] [--states K]
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402
from common import torch, tessera  # noqa: E402

HEADS, DIM = 32, 128


def state_bytes(rows, dtype, states=1):
    """Bytes of `states` states of [rows, HEADS, DIM] values plus their fp32 LSEs."""
    elem = torch.tensor([], dtype=dtype).element_size()
    return states * rows * HEADS * (DIM * elem + 4)


def make_inputs(op, rows, dtype, k):
    """One set of random inputs of `op` (LSEs in [-8, 8], base 2)."""
    def v(*shape):
        return torch.randn(*shape, dtype=dtype, device="cuda")

    def s(*shape):
        return torch.rand(*shape, dtype=torch.float32, device="cuda") * 16 - 8
    if op == "states":
        return (v(rows, k, HEADS, DIM), s(rows, k, HEADS))
    return (v(rows, HEADS, DIM), s(rows, HEADS), v(rows, HEADS, DIM), s(rows, HEADS))


def call(lib, op, inp, **kw):
    if op == "pair":
        return lambda: lib.merge_state(*inp, **kw)
    if op == "in_place":
        return lambda: lib.merge_state_in_place(*inp, **kw)
    return lambda: lib.merge_states(*inp, **kw)


def max_diff(op, fi, inp):
    """Largest |Tessera - FlashInfer| over values and LSEs, on copies of one input set."""
    if op == "in_place":
        a, b = [x.clone() for x in inp], [x.clone() for x in inp]
        tessera.merge_state_in_place(*a)
        fi.merge_state_in_place(*b)
        got, want = (a[0], a[1]), (b[0], b[1])
    else:
        got, want = call(tessera, op, inp)(), call(fi, op, inp)()
    return max(float((g.float() - w.float()).abs().max()) for g, w in zip(got, want))


def run_case(op, rows, dtype, k, fi, rounds):
    moved = state_bytes(rows, dtype, k if op == "states" else 2) + state_bytes(rows, dtype)  # read + written
    read = moved - state_bytes(rows, dtype)
    sets = [make_inputs(op, rows, dtype, k) for _ in range(common.rotation_copies(read))]
    fns = {"tessera": [call(tessera, op, x) for x in sets],
           "tessera_no_pdl": [call(tessera, op, x, enable_pdl=False) for x in sets]}
    diff = None
    if fi is not None:
        try:
            diff = max_diff(op, fi, sets[0])
            fns["flashinfer"] = [call(fi, op, x) for x in sets]
        except Exception as e:  # a dtype its prebuilt module lacks: reported, not fatal
            print(f"# flashinfer {op} {dtype}: {type(e).__name__}: {str(e).splitlines()[0][:100]}", flush=True)
    half = moved // 2  # a copy of moved / 2 bytes reads and writes `moved`
    bufs = [(torch.empty(half, dtype=torch.uint8, device="cuda"), torch.empty(half, dtype=torch.uint8, device="cuda"))
            for _ in range(common.rotation_copies(half))]
    fns["copy"] = [(lambda d, s: lambda: d.copy_(s))(d, s) for s, d in bufs]
    times = common.interleaved(fns, rounds, timer=lambda calls: common.bench_graph_ms(calls, reps=5, target_ms=10.0))
    us = {n: common.median(t) * 1e3 for n, t in times.items()}
    row = dict(op=op, tokens=rows, heads=HEADS, head_dim=DIM, dtype=str(dtype).replace("torch.", ""),
               states=k if op == "states" else 2, bytes=moved, us=us,
               tessera_TBps=moved / (us["tessera"] * 1e-6) / 1e12, copy_TBps=moved / (us["copy"] * 1e-6) / 1e12,
               frac_copy=common.paired_ratio(times, "copy", "tessera"),
               no_pdl_ratio=common.paired_ratio(times, "tessera_no_pdl", "tessera"),
               max_abs_diff=diff)
    if "flashinfer" in times:
        row["ratio"] = common.paired_ratio(times, "flashinfer", "tessera")
        row["flashinfer_frac_copy"] = common.paired_ratio(times, "copy", "flashinfer")
        row["ratio_no_pdl"] = common.paired_ratio(times, "flashinfer", "tessera_no_pdl")
    del sets, bufs
    torch.cuda.empty_cache()
    return row


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--tokens", default="512,4096,16384")
    ap.add_argument("--ops", default="pair,in_place,states")
    ap.add_argument("--states", type=int, default=4, help="K of merge_states")
    ap.add_argument("--no-ceiling", action="store_true", help="skip common.hbm_ceilings() (4 GiB read and copy)")
    args = ap.parse_args()
    common.require()
    fi = common.flashinfer()
    print(f"# {common.device_name()}; flashinfer {getattr(fi, '__version__', 'not installed')}", flush=True)
    ceiling = None
    if not args.no_ceiling:
        try:
            read, copy = common.hbm_ceilings()
            ceiling = dict(read_TBps=read, copy_TBps=copy)
            print(f"# HBM ceilings (4 GiB): read {read:.2f} TB/s, copy {copy:.2f} TB/s (read + written)", flush=True)
        except Exception as e:  # triton's do_bench missing: the per-case copies still give the ceiling
            print(f"# HBM ceilings skipped: {type(e).__name__}: {e}", flush=True)
    print(f"{'op':9} {'tokens':>6} {'dtype':9} {'tessera us':>10} {'flashinfer us':>13} {'fi/tessera':>10} "
          f"{'no PDL us':>9} {'fi/no PDL':>9} {'copy us':>8} {'% copy':>7} {'fi % copy':>9} {'TB/s':>6} "
          f"{'max diff':>9}", flush=True)
    rows = []
    for op in args.ops.split(","):
        for n in (int(x) for x in args.tokens.split(",")):
            for dtype in (torch.float16, torch.bfloat16):
                r = run_case(op, n, dtype, args.states, fi, args.rounds)
                rows.append(r)
                print(f"{op:9} {n:6d} {r['dtype']:9} {r['us']['tessera']:10.1f} "
                      f"{common.fmt(r['us'].get('flashinfer'), 1):>13} {common.fmt(r.get('ratio')):>10} "
                      f"{r['us']['tessera_no_pdl']:9.1f} {common.fmt(r.get('ratio_no_pdl')):>9} "
                      f"{r['us']['copy']:8.1f} {100 * r['frac_copy']:6.1f}% "
                      f"{common.fmt(100 * r['flashinfer_frac_copy'] if 'flashinfer_frac_copy' in r else None, 1):>8}% "
                      f"{r['tessera_TBps']:6.2f} {common.fmt(r['max_abs_diff'], 4):>9}", flush=True)
    path = common.save_results("merge", dict(heads=HEADS, head_dim=DIM, rounds=args.rounds, hbm_ceilings=ceiling,
                                             flashinfer=getattr(fi, "__version__", None), rows=rows))
    print(f"# saved {path}")


if __name__ == "__main__":
    main()
