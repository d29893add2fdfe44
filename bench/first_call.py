"""First call of a built-in kernel in a fresh process with an empty kernel
cache: the kernel pack an install ships (prebuilt cubins) vs the JIT.

A kernel pack is a directory of <key>.cubin files; this script makes one the
way an install does (every built-in kernel compiled for this GPU, here into a
temporary directory), then starts fresh Python processes with an empty
TESSERA_CACHE_DIR, with and without that pack, and times in each the first
plan() + run() + synchronize of a call, after torch has created its CUDA
context (what a serving process pays on its first request). Calls: batch
decode as engines call it (use_tensor_cores=False: the tensor-core kernel on
sm_90), the CUDA-core decode kernel, causal batch prefill; fp16, head dim 128,
GQA 32/8, page 16.

Usage: python bench/first_call.py [--rounds 3]
Results: bench/results/first-call.json
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

CHILD = r"""
import json, sys, time
import torch
sys.path.insert(0, {python!r})
import tessera
from tessera import _C
if {pack!r}:
    _C.add_kernel_pack({pack!r})
torch.ones(1, device="cuda").sum().item()  # CUDA context and torch kernels: not ours to time
which = {which!r}
page, hq, hkv, d = 16, 32, 8, 128
ws = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
if which == "prefill":
    lens = [512, 300]
    qo = torch.tensor([0, 512, 812], dtype=torch.int32)
    q = torch.randn(812, hq, d, dtype=torch.float16, device="cuda")
    k = torch.randn(812, hkv, d, dtype=torch.float16, device="cuda")
    v = torch.randn_like(k)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    w = tessera.BatchPrefillWithRaggedKVCacheWrapper(ws)
    w.plan(qo, qo, hq, hkv, d, causal=True, q_data_type=torch.float16)
    out = w.run(q, k, v)
else:
    batch, pages = 4, 64
    k = torch.randn(batch * pages, page, hkv, d, dtype=torch.float16, device="cuda")
    v = torch.randn_like(k)
    indptr = torch.arange(batch + 1, dtype=torch.int32) * pages
    indices = torch.arange(batch * pages, dtype=torch.int32)
    last = torch.full((batch,), page, dtype=torch.int32)
    q = torch.randn(batch, hq, d, dtype=torch.float16, device="cuda")
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    w = tessera.BatchDecodeWithPagedKVCacheWrapper(ws, "NHD")
    w._cuda_cores = which == "decode-cuda-cores"
    w.plan(indptr, indices, last, hq, hkv, d, page, q_data_type=torch.float16)
    out = w.run(q, (k, v))
torch.cuda.synchronize()
ms = (time.perf_counter() - t0) * 1e3
assert torch.isfinite(out).all()
print("@@first " + json.dumps(dict(ms=ms)))
"""


def child(python_dir, which, pack, cache):
    env = dict(os.environ, TESSERA_CACHE_DIR=cache)
    code = CHILD.format(python=python_dir, pack=pack, which=which)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=False)
    for line in out.stdout.splitlines():
        if line.startswith("@@first "):
            return json.loads(line[8:])["ms"]
    raise SystemExit(f"first-call child failed ({which}, pack={bool(pack)}):\n{out.stdout}\n{out.stderr}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    tessera = common.require()
    torch = common.torch
    major, minor = torch.cuda.get_device_capability()
    arch = f"sm_{major}{minor}" + ("a" if major >= 9 else "")
    python_dir = os.path.dirname(os.path.dirname(os.path.abspath(tessera.__file__)))
    with tempfile.TemporaryDirectory() as pack:
        env = dict(os.environ, TESSERA_CACHE_DIR=pack)
        build = f"import sys; sys.path.insert(0, {python_dir!r}); import tessera.jit as j; j.compile_builtin({arch!r})"
        subprocess.run([sys.executable, "-c", build], env=env, check=True)
        n = sum(1 for f in os.listdir(pack) if f.endswith(".cubin"))
        print(f"# kernel pack: {n} built-in kernels for {arch}")
        rows = []
        print(f"{'call':>18} {'pack ms':>9} {'JIT ms':>9}")
        for which in ("decode", "decode-cuda-cores", "prefill"):
            times = {"pack": [], "jit": []}
            for _ in range(args.rounds):
                for mode in ("pack", "jit"):
                    with tempfile.TemporaryDirectory() as cache:
                        times[mode].append(child(python_dir, which, pack if mode == "pack" else "", cache))
            med = {m: common.median(t) for m, t in times.items()}
            rows.append(dict(call=which, pack_ms=med["pack"], jit_ms=med["jit"], rounds_ms=times))
            print(f"{which:>18} {med['pack']:9.1f} {med['jit']:9.1f}", flush=True)
    common.save_results("first-call", dict(arch=arch, pack_kernels=n, rounds=args.rounds, rows=rows))


if __name__ == "__main__":
    main()
