"""One Tessera prefill configuration, run a few times: the target for a
profiler (ncu -k regex:tessera_prefill ...) or a quick timing.
Usage: python bench/prefill_one.py [--seq L] [--batch B] [--heads H] [--kv-heads H]
                                   [--non-causal] [--backend fa3] [--kv ragged|paged:P|bsr]
                                   [--sdpa flash|cudnn]
--sdpa times PyTorch SDPA's backend on the same dense shape instead (a peer
for the profiler: NCU_KERNEL=regex:flash bench/ncu_prefill.sh ...)."""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import prefill as pf  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seq", type=int, default=4096)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--kv-heads", type=int, default=0)
    ap.add_argument("--non-causal", action="store_true")
    ap.add_argument("--backend", default="fa3")
    ap.add_argument("--kv", default="ragged", help="ragged, paged:PAGE_SIZE or bsr (Br 16, Bc 1; non-causal)")
    ap.add_argument("--sdpa", choices=["flash", "cudnn"], help="time PyTorch SDPA's backend instead of Tessera")
    args = ap.parse_args()
    L, b, h = args.seq, args.batch, args.heads
    causal = not args.non_causal
    hkv = args.kv_heads or h
    if args.sdpa:
        ms = pf.sdpa(b, h, hkv, L, L, causal, args.sdpa)
        args.backend, args.kv = "sdpa-" + args.sdpa, "dense"
    elif args.kv.startswith("paged:"):
        ms = pf.tessera_paged([L] * b, [L] * b, h, hkv, causal, int(args.kv[6:]), backend=args.backend)
    elif args.kv == "bsr":
        causal = False  # block-sparse masks are the sparsity pattern: no causal flag
        ms = pf.tessera_bsr_vector(L, L, b, h, hkv, backend=args.backend)
    else:
        ms = pf.tessera_ragged([L] * b, [L] * b, h, hkv, causal, backend=args.backend)
    fl = pf.flops([L] * b, [L] * b, h, causal)
    print(f"seq {L} batch {b} heads {h} causal {causal} {args.backend} {args.kv}: {ms * 1e3:.1f} us, {pf.tflops(fl, ms):.1f} TFLOP/s")


if __name__ == "__main__":
    main()
