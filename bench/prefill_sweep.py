"""Tile sweep of Tessera's tensor-core prefill on the paper's Table-1 setting
(batch 16, 16 heads, head dim 128, causal, fp16) next to SDPA's flash and
cuDNN backends. Used to pick the heuristic's defaults.
Usage: python bench/prefill_sweep.py [--seqs=1024,4096,16384] [BACKEND:CTA_KV,WARPS_Q,WARPS_KV,STAGES ...]
  BACKEND fa2 / fa3 / auto (default fa2); 0,0,0,0 = the heuristic's tile; a suffix @N forces
  the query tile to N rows (Tessera-only knob)."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import prefill as pf  # noqa: E402


def main():
    args = sys.argv[1:]
    lens = [1024, 4096, 16384]
    if args and args[0].startswith("--seqs="):
        lens = [int(x) for x in args.pop(0).split("=", 1)[1].split(",")]
    configs = args or ["fa2:0,0,0,0", "fa3:0,0,0,0"]
    print(f"{'L':>6} | {'flash':>6} | {'cudnn':>6} | " + " | ".join(f"{c:>9}" for c in configs))
    for L in lens:
        b = 16
        fl = pf.flops([L] * b, [L] * b, 16, True)
        fa = pf.sdpa(b, 16, 16, L, L, True, "flash")
        cd = pf.sdpa(b, 16, 16, L, L, True, "cudnn")
        cells = []
        for c in configs:
            backend, _, tile = c.rpartition(":")
            tile, _, cta_q = tile.partition("@")
            os.environ["TESSERA_PREFILL_TILE"] = tile
            try:
                ms = pf.tessera_ragged([L] * b, [L] * b, 16, 16, True, backend=backend or "fa2", cta_q=int(cta_q or 0))
                cells.append(f"{pf.tflops(fl, ms):9.0f}")
            except Exception as e:  # noqa: BLE001 - a config may not fit; show why and go on
                cells.append(f"{'err':>9}")
                print(f"# {c}: {e}", file=sys.stderr)
        os.environ.pop("TESSERA_PREFILL_TILE", None)
        f = lambda ms: f"{pf.tflops(fl, ms):6.0f}" if ms else "   n/a"  # noqa: E731
        print(f"{L:>6} | {f(fa)} | {f(cd)} | " + " | ".join(cells), flush=True)


if __name__ == "__main__":
    main()
