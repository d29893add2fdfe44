"""MLA (DeepSeek-style latent attention, absorbed) decode benchmark: Tessera's
BatchMLAPagedAttentionWrapper, and FlashInfer's when it is installed, on
issue 30's grid: batch 1..256 x KV 1k..32k, H = 16 and 128, q_len 1 and 2
(causal among the new tokens), page 64, bf16 (or --dtype float16).

Timing follows bench/decode.py's conventions: each run() replayed back to back
from one CUDA graph over rotating copies of the latent cache (together at
least twice L2, so every call reads HBM; common.bench_graph_ms), peers timed
in interleaved rounds (common.interleaved), medians over rounds. Reported per
workload: time, TB/s of the latent bytes the batch needs (each request's ckv
and kpe rows once, q and o), its fraction of the HBM read ceiling measured in
the same run (common.hbm_ceilings), TFLOP/s (2 x rows x keys x (576 + 512)
per head, causal keys only) and its fraction of the dense fp16 tensor-core
rate measured in the same run (common.matmul_ceiling_tflops), and the speedup
over FlashInfer (paired by round). Results: bench/results/mla.json.

Tessera's kernels: --backends auto (default; the Hopper kernel on sm_90),
or several of auto / fa2 / fa3 / 16bit (auto over caches of q's dtype, the
baseline of an fp8 run) timed in the same rounds (the first is the row's
headline, the others are reported as its speedup over them). A backend may
pin the query tile: fa3:16 (the Hopper kernel's 16-row form), fa3:64, fa2:32.

--kv-dtype float8_e4m3fn (or float8_e5m2) times fp8 latent caches (unit
scales; the Hopper kernel), FlashInfer's fp8 path beside them (e4m3 only).

--single H:q_len:batch:kv runs that one workload eight times, untimed, on the
first backend (or FlashInfer's wrapper with --peer flashinfer), for a
profiler: bench/ncu_prefill.sh with NCU_BENCH="bench/mla.py --single ..." and
NCU_KERNEL=regex:tessera_mla (FlashInfer's: regex:BatchMLA).

Usage: python bench/mla.py [--quick] [--rounds 3] [--dtype bfloat16|float16] [--kv-dtype DTYPE]
                           [--backends auto,fa2] [--workloads H:q_len:batch:kv,...] [--save-as NAME]
       python bench/mla.py --single H:q_len:batch:kv [--backends fa3:64] [--peer flashinfer]
"""
import argparse
import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402
from common import torch, tessera  # noqa: E402

DC, DR, PAGE = 512, 64, 64
SM_SCALE = 1 / math.sqrt(192)  # DeepSeek-V3: q / k head dim 192 before absorption
GRID = [(h, q, b, kv) for h in (16, 128) for q in (1, 2) for b in (1, 16, 64, 128, 256)
        for kv in (1024, 4096, 32768)]
QUICK = [(16, 1, 64, 4096), (128, 1, 64, 4096), (128, 2, 64, 4096), (16, 1, 1, 32768), (128, 1, 256, 1024)]
MEM_LIMIT = 40 << 30  # skip a workload whose rotated caches would exceed this


def parse(w):
    h, q, b, kv = (int(x) for x in w.split(":"))
    return h, q, b, kv


def latent_bytes(h, q, b, kv, elem, kv_elem):
    return b * kv * (DC + DR) * kv_elem + b * q * h * (DC + DR + DC) * elem  # cache once, q in, o out


def flops(h, q, b, kv):
    keys = sum(kv - q + 1 + j for j in range(q))  # causal among the new tokens
    return 2.0 * b * h * keys * (DC + DR + DC)


def make_calls(lib, h, q, b, kv, dtype, ws, backend=None, kv_dtype=None):
    """One run() closure per rotating cache copy, all on one plan, and what they read and write (the
    wrapper, the caches, q_nope / q_pe / out, the page ids: kv_indices[i * pages_per:] are request i's)."""
    pages_per = (kv + PAGE - 1) // PAGE
    pool = b * pages_per
    kv_dtype = kv_dtype or dtype
    elem = torch.finfo(kv_dtype).bits // 8
    copies = common.rotation_copies(pool * PAGE * (DC + DR) * elem)
    if copies * pool * PAGE * (DC + DR) * elem > MEM_LIMIT:
        return None
    qo_indptr = torch.arange(0, (b + 1) * q, q, dtype=torch.int32)
    kv_indptr = torch.arange(0, (b + 1) * pages_per, pages_per, dtype=torch.int32)
    kv_indices = torch.randperm(pool, dtype=torch.int32, device="cuda")
    kv_lens = torch.full((b,), kv, dtype=torch.int32)
    if backend is None:
        w = lib.BatchMLAPagedAttentionWrapper(ws)
    else:
        name, _, tile = backend.partition(":")
        w = lib.BatchMLAPagedAttentionWrapper(ws, backend=name)
        w._cta_q = int(tile or 0)  # Tessera-only: pins the query tile
    w.plan(qo_indptr, kv_indptr, kv_indices, kv_lens, h, DC, DR, PAGE, q > 1, SM_SCALE, dtype, kv_dtype)
    q_nope = torch.randn(b * q, h, DC, dtype=dtype, device="cuda")
    q_pe = torch.randn(b * q, h, DR, dtype=dtype, device="cuda")
    out = torch.empty(b * q, h, DC, dtype=dtype, device="cuda")
    caches = [(torch.randn(pool, PAGE, DC, dtype=dtype, device="cuda").to(kv_dtype),
               torch.randn(pool, PAGE, DR, dtype=dtype, device="cuda").to(kv_dtype)) for _ in range(copies)]
    scales = dict(ckv_scale=1.0, kpe_scale=1.0) if kv_dtype != dtype else {}
    calls = [lambda c=c: w.run(q_nope, q_pe, c[0], c[1], out=out, **scales) for c in caches]
    return calls, dict(w=w, caches=caches, q_nope=q_nope, q_pe=q_pe, out=out, kv_indices=kv_indices,
                       pages_per=pages_per)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16"))
    ap.add_argument("--workloads", default="")
    ap.add_argument("--backends", default="auto")
    ap.add_argument("--kv-dtype", default="", choices=("", "float8_e4m3fn", "float8_e5m2"))
    ap.add_argument("--save-as", default="")
    ap.add_argument("--single", default="", help="H:q_len:batch:kv, run eight times untimed (for ncu)")
    ap.add_argument("--peer", default="", choices=("", "flashinfer"), help="--single: FlashInfer's wrapper")
    args = ap.parse_args()
    common.require()
    dtype = getattr(torch, args.dtype)
    kv_dtype = getattr(torch, args.kv_dtype) if args.kv_dtype else dtype
    if args.single:
        h, q, b, kv = parse(args.single)
        lib = common.flashinfer() if args.peer else tessera
        if lib is None:
            raise SystemExit("--peer flashinfer: flashinfer is not installed")
        backend = None if args.peer else args.backends.split(",")[0]
        made = make_calls(lib, h, q, b, kv, dtype, common.new_workspace(256 << 20), backend, kv_dtype)
        if made is None:
            raise SystemExit(f"--single {args.single}: the rotated caches exceed the memory limit")
        for i in range(8):
            made[0][i % len(made[0])]()
        torch.cuda.synchronize()
        print(f"--single {args.single}: 8 runs of {'flashinfer' if args.peer else backend}")
        return
    elem, kv_elem = 2, torch.finfo(kv_dtype).bits // 8
    workloads = [parse(w) for w in args.workloads.split(",") if w] or (QUICK if args.quick else GRID)
    read_tbps, _ = common.hbm_ceilings()
    mm_tflops = common.matmul_ceiling_tflops()
    fi = common.flashinfer()
    print(f"device: {common.device_name()}  HBM read ceiling {read_tbps:.2f} TB/s  dense fp16 mma "
          f"{mm_tflops:.0f} TFLOP/s  flashinfer: {'yes' if fi else 'not installed'}")
    print(f"{'H':>4} {'q':>2} {'batch':>5} {'kv':>6} | {'us':>8} {'TB/s':>6} {'%read':>6} {'TFLOP/s':>8} "
          f"{'%mma':>5} | {'vs FI':>6}")
    backends = [x for x in args.backends.split(",") if x]
    rows = []
    for h, q, b, kv in workloads:
        made = make_calls(tessera, h, q, b, kv, dtype, common.new_workspace(256 << 20), backends[0], kv_dtype)
        if made is None:
            print(f"{h:>4} {q:>2} {b:>5} {kv:>6} | skipped (memory)")
            continue
        fns = {"tessera": lambda calls=made[0]: common.bench_graph_ms(calls)}
        keep = [made]
        for be in backends[1:]:
            # "16bit": the same kernel choice over caches of q's dtype (an fp8 run's baseline)
            other = make_calls(tessera, h, q, b, kv, dtype, common.new_workspace(256 << 20),
                               "auto" if be == "16bit" else be, dtype if be == "16bit" else kv_dtype)
            fns["tessera-" + be] = lambda calls=other[0]: common.bench_graph_ms(calls)
            keep.append(other)
        if fi is not None:
            try:
                made_fi = make_calls(fi, h, q, b, kv, dtype, common.new_workspace(256 << 20), None, kv_dtype)
                if made_fi is not None:
                    fns["flashinfer"] = lambda calls=made_fi[0]: common.bench_graph_ms(calls)
                    keep.append(made_fi)
            except Exception as e:  # a peer that cannot run this shape is reported, not fatal
                print(f"  flashinfer: {type(e).__name__}: {e}")
        times = common.interleaved(fns, args.rounds, timer=lambda f: f())
        ms = common.median(times["tessera"])
        tbps = latent_bytes(h, q, b, kv, elem, kv_elem) / (ms * 1e-3) / 1e12
        tflops = flops(h, q, b, kv) / (ms * 1e-3) / 1e12
        vs = common.paired_ratio(times, "flashinfer", "tessera") if "flashinfer" in times else float("nan")
        vs_own = {be: common.paired_ratio(times, "tessera-" + be, "tessera") for be in backends[1:]}
        own = "".join(f"  vs {be} {common.fmt(r)}" for be, r in vs_own.items())
        print(f"{h:>4} {q:>2} {b:>5} {kv:>6} | {ms * 1e3:8.1f} {tbps:6.2f} {100 * tbps / read_tbps:5.1f}% "
              f"{tflops:8.1f} {100 * tflops / mm_tflops:4.1f}% | {common.fmt(vs)}{own}")
        rows.append(dict(heads=h, q_len=q, batch=b, kv=kv, us=ms * 1e3, tbps=tbps, read_frac=tbps / read_tbps,
                         tflops=tflops, mma_frac=tflops / mm_tflops, vs_flashinfer=vs, vs_backends=vs_own,
                         times_ms={k: v for k, v in times.items()}))
        del keep, made
        torch.cuda.empty_cache()
    path = common.save_results(args.save_as or "mla", dict(dtype=args.dtype, kv_dtype=str(kv_dtype).split(".")[-1],
                                                          page_size=PAGE, backends=backends,
                                                          hbm_read_tbps=read_tbps,
                                                          mma_tflops=mm_tflops, rows=rows))
    print(f"results: {path}")


if __name__ == "__main__":
    main()
