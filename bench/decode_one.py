"""A few batch-decode configurations side by side (experiments): Tessera on
CUDA cores and on tensor cores (query tile from TESSERA_DECODE_TC_CTA_Q),
NHD and HND caches, and SDPA-cuDNN on dense KV, with achieved TB/s.
Usage: python bench/decode_one.py [--tc-sweep]
  --tc-sweep: the tensor-core path only, under several kernel settings
  (TESSERA_DECODE_TC_CTA_Q, TESSERA_PREFILL_TILE, TESSERA_SM90_RINGS), on the
  decode acceptance workloads."""
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
import common  # noqa: E402
import decode as dec  # noqa: E402
import tessera  # noqa: E402

D, DT = 128, torch.float16


def run(lens, ps, hq, hkv, q, layout="NHD", tc=False):
    k, v, indptr, indices, last = dec.paged_cache(lens, ps, hkv, seed=len(lens) + ps)
    if layout == "HND":
        k, v = k.transpose(1, 2).contiguous(), v.transpose(1, 2).contiguous()
    ws = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    w = tessera.BatchDecodeWithPagedKVCacheWrapper(ws, layout, use_tensor_cores=tc)
    w.plan(indptr, indices, last, hq, hkv, D, ps, q_data_type=DT, kv_data_type=DT)
    out = torch.empty_like(q)
    return common.bench_ms(lambda: w.run(q, (k, v), out=out))


def main():
    ceiling = common.read_probe_best()
    print(f"# read ceiling {ceiling:.2f} TB/s")
    for (hq, hkv), dist, b in [((32, 32), "const:4096", 128), ((32, 8), "uniform:512-1024", 64), ((32, 8), "zipf:1024", 64),
                               ((32, 8), "const:4096", 128), ((32, 8), "const:32768", 2)]:
        lens = common.kv_lengths(dist, b, seed=b)
        nb = dec.needed_bytes(lens, hq, hkv)
        q = torch.randn(b, hq, D, dtype=DT, device="cuda")
        cells = []
        for name, kw, cta in [("cc-NHD", {}, ""), ("cc-HND", dict(layout="HND"), ""), ("tc16", dict(tc=True), ""),
                              ("tc64", dict(tc=True), "64"), ("tc64-HND", dict(layout="HND", tc=True), "64")]:
            os.environ["TESSERA_DECODE_TC_CTA_Q"] = cta
            if not cta:
                os.environ.pop("TESSERA_DECODE_TC_CTA_Q")
            ms = run(lens, 16, hq, hkv, q, **kw)
            cells.append(f"{name} {nb / ms / 1e9:5.2f}")
        cd = dec.run_sdpa(lens, hq, hkv, "cudnn")[0]
        cells.append(f"cudnn {nb / cd / 1e9:5.2f}" if cd else "cudnn -")
        print(f"{hq}/{hkv} {dist:>16} B{b:<4} TB/s: " + " | ".join(cells), flush=True)


TC_SETTINGS = [  # name, environment
    ("default", {}),
    ("kv128", {"TESSERA_PREFILL_TILE": "128,0,0,0"}),
    ("k3v4", {"TESSERA_SM90_RINGS": "3,4,1"}),
    ("k4v5", {"TESSERA_SM90_RINGS": "4,5,1"}),
    ("q128", {"TESSERA_DECODE_TC_CTA_Q": "128"}),
]


def tc_sweep():
    ceiling = common.read_probe_best()
    print(f"# read ceiling {ceiling:.2f} TB/s; tensor-core decode, page 16, TB/s per setting")
    keys = {k for _, env in TC_SETTINGS for k in env}
    for (hq, hkv), dist, b in [((32, 32), "const:4096", 128), ((32, 8), "uniform:512-1024", 16),
                               ((32, 8), "uniform:512-1024", 64), ((32, 8), "zipf:1024", 16), ((32, 8), "const:32768", 2)]:
        lens = common.kv_lengths(dist, b, seed=b)
        nb = dec.needed_bytes(lens, hq, hkv)
        q = torch.randn(b, hq, D, dtype=DT, device="cuda")
        cells = []
        for name, env in TC_SETTINGS:
            for k in keys:
                os.environ.pop(k, None)
            os.environ.update(env)
            try:
                ms = run(lens, 16, hq, hkv, q, tc=True)
                cells.append(f"{name} {nb / ms / 1e9:5.2f}")
            except Exception as e:  # a setting that does not fit must not end the sweep
                cells.append(f"{name} ({type(e).__name__})")
        for k in keys:
            os.environ.pop(k, None)
        cd = dec.run_sdpa(lens, hq, hkv, "cudnn")[0]
        cells.append(f"cudnn {nb / cd / 1e9:5.2f}" if cd else "cudnn -")
        print(f"{hq}/{hkv} {dist:>16} B{b:<4}: " + " | ".join(cells), flush=True)


if __name__ == "__main__":
    tc_sweep() if "--tc-sweep" in sys.argv[1:] else main()
