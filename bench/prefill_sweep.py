"""Tile sweep of Tessera's tensor-core prefill on the paper's Table-1 setting
(batch 16, 16 heads, head dim 128, causal, fp16) next to SDPA's flash and
cuDNN backends. Used to pick the heuristic's defaults.
Usage: python bench/prefill_sweep.py [CTA_KV,WARPS_Q,WARPS_KV,STAGES ...]   (0,0,0,0 = heuristic)"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import prefill as pf  # noqa: E402


def main():
    configs = sys.argv[1:] or ["0,0,0,0", "32,0,0,0", "32,0,0,3", "64,8,0,0", "32,8,0,3"]
    lens = [1024, 4096, 16384]
    print(f"{'L':>6} | {'flash':>6} | {'cudnn':>6} | " + " | ".join(f"{c:>9}" for c in configs))
    for L in lens:
        b = 16
        fl = pf.flops([L] * b, [L] * b, 16, True)
        fa = pf.sdpa(b, 16, 16, L, L, True, "flash")
        cd = pf.sdpa(b, 16, 16, L, L, True, "cudnn")
        cells = []
        for c in configs:
            os.environ["TESSERA_PREFILL_TILE"] = c
            try:
                cells.append(f"{pf.tflops(fl, pf.tessera_ragged([L] * b, [L] * b, 16, 16, True)):9.0f}")
            except Exception as e:  # noqa: BLE001 - a config may not fit; show why and go on
                cells.append(f"{'err':>9}")
                print(f"# {c}: {e}", file=sys.stderr)
        os.environ.pop("TESSERA_PREFILL_TILE", None)
        f = lambda ms: f"{pf.tflops(fl, ms):6.0f}" if ms else "   n/a"  # noqa: E731
        print(f"{L:>6} | {f(fa)} | {f(cd)} | " + " | ".join(cells), flush=True)


if __name__ == "__main__":
    main()
