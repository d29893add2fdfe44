"""Shared benchmark helpers: timing, ceilings, workloads, result files.

Timing uses triton.testing.do_bench (CUDA events, L2 flushed between runs,
median of the repetitions), or for short decode steps bench_graph_ms (calls
over rotating input copies replayed from a CUDA graph). Ceilings are measured in the same process: HBM
read bandwidth (a read-only reduction and a device copy) and dense fp16
tensor-core rate (a large matmul)."""
import datetime
import json
import math
import os
import platform

import numpy as np
import torch


def bench_ms(fn, warmup=25, rep=100):
    from triton.testing import do_bench
    return float(do_bench(fn, warmup=warmup, rep=rep, return_mode="median"))


_FLUSH = None


def bench_ms_clean(fn, reps=50):
    """Median of event-timed single launches, each after L2 was emptied by a
    read of 256 MB: L2 holds only clean lines (do_bench zeroes its flush
    buffer, and writing its dirty lines back shares HBM with a short kernel)."""
    global _FLUSH
    if _FLUSH is None:
        _FLUSH = torch.ones(32 << 20, dtype=torch.int64, device="cuda")
    for _ in range(5):
        fn()
    ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(reps)]
    for s, e in ev:
        _FLUSH.amax()
        s.record()
        fn()
        e.record()
    torch.cuda.synchronize()
    return float(np.median([s.elapsed_time(e) for s, e in ev]))


def rotation_copies(nbytes, factor=2):
    """How many copies of a call's inputs (nbytes each) to rotate through so
    that consecutive calls read memory the previous ones pushed out of L2:
    together at least `factor` times L2, and at least one."""
    l2 = torch.cuda.get_device_properties(torch.cuda.current_device()).L2_cache_size
    return max(1, math.ceil(factor * l2 / max(nbytes, 1)))


def bench_graph_ms(calls, reps=10, target_ms=20.0):
    """Per-call GPU time of `calls`, closures over their own inputs (rotating
    copies, rotation_copies), replayed back to back from one CUDA graph:
    nothing runs between them, so no flush kernel leaves dirty L2 lines for
    a short kernel to write back (do_bench zeroes its flush buffer: ~9 us of
    a 30-60 us decode step on the H100), and no host launch gap shows. The
    graph repeats the rotation to about target_ms; median of `reps` replays."""
    for c in calls:  # warm up (JIT, cuDNN plans) outside the capture
        c()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for c in calls:
        c()
    end.record()
    torch.cuda.synchronize()
    per_call = max(start.elapsed_time(end) / len(calls), 1e-3)
    n = len(calls) * max(1, round(target_ms / per_call / len(calls)))
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # torch's recipe: warm up on a side stream before capturing
        for c in calls:
            c()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(n):
            calls[i % len(calls)]()
    graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start.record()
        graph.replay()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) / n)
    del graph
    return float(np.median(times))


_WORKSPACE = None


def workspace(nbytes=512 << 20):
    """One device workspace for every wrapper of a benchmark run (grown when asked for more)."""
    global _WORKSPACE
    if _WORKSPACE is None or _WORKSPACE.numel() < nbytes:
        _WORKSPACE = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    return _WORKSPACE


def hbm_ceilings():
    """Returns (read_TBps, copy_TBps). read: bytes read by a float32-accumulated
    sum of a 4 GiB fp16 tensor; copy: (bytes read + written) by a device copy."""
    n = 1 << 31  # 2^31 fp16 = 4 GiB
    x = torch.empty(n, dtype=torch.float16, device="cuda").uniform_(-1, 1)
    t_read = bench_ms(lambda: torch.sum(x, dtype=torch.float32), warmup=5, rep=30)
    y = torch.empty_like(x)
    t_copy = bench_ms(lambda: y.copy_(x), warmup=5, rep=30)
    read = x.numel() * 2 / (t_read * 1e-3) / 1e12
    copy = 2 * x.numel() * 2 / (t_copy * 1e-3) / 1e12
    del x, y
    torch.cuda.empty_cache()
    return read, copy


def read_probe_best():
    """The best of a few read-only reductions over 4 GiB (TB/s of bytes read)."""
    x = torch.empty(1 << 31, dtype=torch.float16, device="cuda").uniform_(-1, 1)
    best = 0.0
    for fn in (lambda: x.view(torch.int64).amax(), lambda: x.view(torch.float32).sum()):
        best = max(best, x.numel() * 2 / (bench_ms(fn, warmup=5, rep=30) * 1e-3) / 1e12)
    del x
    torch.cuda.empty_cache()
    return best


def matmul_ceiling_tflops():
    a = torch.randn(8192, 8192, dtype=torch.float16, device="cuda")
    b = torch.randn(8192, 8192, dtype=torch.float16, device="cuda")
    t = bench_ms(lambda: a @ b, warmup=5, rep=30)
    return 2 * 8192**3 / (t * 1e-3) / 1e12


def kv_lengths(kind, batch, seed=0):
    """Per-request KV lengths: 'const:N', 'uniform:LO-HI', 'zipf:MEAN' (paper Figure 8)."""
    rng = np.random.default_rng(seed)
    name, arg = kind.split(":")
    if name == "const":
        return [int(arg)] * batch
    if name == "uniform":
        lo, hi = (int(v) for v in arg.split("-"))
        return [int(v) for v in rng.integers(lo, hi + 1, size=batch)]
    if name == "zipf":
        mean = int(arg)
        raw = rng.zipf(1.6, size=batch).astype(np.float64)
        raw = np.minimum(raw, 64.0)  # bounded skew: the longest is at most 64x the shortest draw
        lens = np.maximum(1, np.round(raw / raw.mean() * mean)).astype(int)
        return [int(v) for v in lens]
    raise ValueError(f"unknown length distribution {kind}")


def with_env(env, fn):
    """fn() with the environment variables in `env` set, restored afterwards
    (settings the JIT and the wrappers read when they are built)."""
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


def device_name():
    return torch.cuda.get_device_name()


def save_results(kind, payload):
    here = os.path.dirname(os.path.abspath(__file__))
    out = os.path.join(here, "results")
    os.makedirs(out, exist_ok=True)
    date = datetime.date.today().isoformat()
    dev = device_name().replace(" ", "-")
    path = os.path.join(out, f"{kind}-{dev}-{date}.json")
    payload = dict(payload)
    payload["device"] = device_name()
    payload["date"] = date
    payload["torch"] = torch.__version__
    payload["host"] = platform.node()
    with open(path, "w") as f:
        json.dump(payload, f, indent=1)
    if os.environ.get("OUT"):
        with open(os.path.join(os.environ["OUT"], os.path.basename(path)), "w") as f:
            json.dump(payload, f, indent=1)
    return path


def fmt(x, nd=2):
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.{nd}f}"
