"""Tile/pipeline sweep of Tessera's decode kernel on the workloads that the
decode acceptance criteria name, plus the best peer (SDPA cuDNN) on dense
padded KV and several HBM read probes. Used to pick the default configuration.
Usage: python bench/decode_sweep.py [TILE:STAGES ...]   (0:0 = heuristic)"""
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402
import decode as dec  # noqa: E402


def read_probes():
    n = 1 << 31
    x = torch.empty(n, dtype=torch.float16, device="cuda").uniform_(-1, 1)
    out = {}
    for name, fn in [("sum-f16", lambda: torch.sum(x, dtype=torch.float32)),
                     ("amax-i64", lambda: x.view(torch.int64).amax()),
                     ("sum-f32view", lambda: x.view(torch.float32).sum())]:
        out[name] = x.numel() * 2 / (common.bench_ms(fn, warmup=5, rep=30) * 1e-3) / 1e12
    del x
    torch.cuda.empty_cache()
    return out


def main():
    configs = sys.argv[1:] or ["0:0", "32:3", "32:2", "16:4", "16:6", "64:2", "64:3"]
    probes = read_probes()
    print("# read probes (TB/s): " + ", ".join(f"{k} {v:.2f}" for k, v in probes.items()))
    work = [((32, 32), "const:4096", 128, 16), ((32, 32), "const:4096", 128, 1), ((32, 8), "const:4096", 128, 16),
            ((32, 8), "zipf:1024", 64, 16), ((32, 8), "uniform:512-1024", 128, 16), ((32, 32), "const:32768", 1, 16),
            ((32, 8), "const:32768", 2, 16), ((32, 8), "const:1024", 16, 16)]
    print(f"{'workload':>34} | cudnn TB/s | " + " | ".join(f"{c:>6}" for c in configs))
    for (hq, hkv), dist, b, ps in work:
        lens = common.kv_lengths(dist, b, seed=b)
        nb = dec.needed_bytes(lens, hq, hkv)
        q = torch.randn(b, hq, dec.D, dtype=dec.DTYPE, device="cuda")
        cd, _ = dec.run_sdpa(lens, hq, hkv, "cudnn")
        cells = []
        for c in configs:
            tile, stages = c.split(":")
            os.environ["TESSERA_DECODE_TILE"], os.environ["TESSERA_DECODE_STAGES"] = tile, stages
            ms = dec.run_tessera(lens, ps, hq, hkv, q)[0]
            cells.append(f"{nb / (ms * 1e-3) / 1e12:6.2f}")
        name = f"{hq}/{hkv} {dist} B{b} pg{ps}"
        print(f"{name:>34} | {nb / (cd * 1e-3) / 1e12 if cd else float('nan'):10.2f} | " + " | ".join(cells), flush=True)


if __name__ == "__main__":
    main()
