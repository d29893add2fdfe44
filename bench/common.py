"""The benchmark harness every script in bench/ shares: imports, timing,
peers, workloads and result files.

Timing (all CUDA events, medians):
  bench_ms        triton's do_bench: L2 flushed (zeroed) before each call;
  bench_ms_clean  single launches after L2 was emptied by a read (clean lines);
  bench_graph_ms  calls over rotating input copies (>= 2x L2) replayed back to
                  back from one CUDA graph: no flush, no host launch gaps (short
                  decode steps);
  interleaved     every callable of a shape timed once per round, the first
                  one rotating, so clock and temperature drift hit all alike;
  paired_ratio    the median over rounds of one round's peer time / ours.
Peers: PyTorch SDPA (flash, cuDNN backends), compiled FlexAttention, and
FlashInfer when it is installed (its wrappers have Tessera's signatures).
Results: save_results() writes bench/results/KIND.json (and $OUT/KIND.json)
with the device, date and command line.

torch and the tessera package are imported on first use, so `--help` and
py_compile work on a machine without them."""
import datetime
import json
import math
import os
import platform
import statistics
import sys

import numpy as np

try:
    import torch
    import torch.nn.functional as F
except ImportError:  # --help works without torch; running a benchmark needs it
    torch = F = None

HERE = os.path.dirname(os.path.abspath(__file__))
REPO_PYTHON = os.path.normpath(os.path.join(HERE, "..", "python"))
_TESSERA = None


def require(python_dir=None):
    """Imports the tessera package (from python_dir, else the repository's
    python/ folder) and returns it; exits with a clear message without torch / CUDA."""
    global _TESSERA
    if _TESSERA is not None:
        return _TESSERA
    if torch is None:
        raise SystemExit("bench: PyTorch is not installed (the benchmarks need torch with CUDA)")
    if not torch.cuda.is_available():
        raise SystemExit("bench: no CUDA device")
    sys.path.insert(0, os.path.abspath(python_dir or REPO_PYTHON))
    import tessera as _t
    _TESSERA = _t
    return _t


class _LazyTessera:
    """Stands for the tessera module; imports it (require()) on first attribute use."""

    def __getattr__(self, name):
        return getattr(require(), name)


tessera = _LazyTessera()


# ------------------------------------------------------------------ timing
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
    times = [ms / n for ms in graph_replay_ms(graph, reps)]
    del graph
    return float(np.median(times))


def graph_replay_ms(graph, reps):
    """Milliseconds of each of `reps` replays of a captured CUDA graph (CUDA events), after one replay that
    uploads it."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start.record()
        graph.replay()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return times


def interleaved(fns, rounds, timer=None):
    """{name: [ms per round]}: each round times every callable once (timer,
    default bench_ms), the first one rotating from round to round. Timed one
    after another instead, whichever ran after a heavy peer ran hotter: at
    8k-16k prefill the power-capped clock moves +-10% with the temperature."""
    timer = timer or bench_ms
    names = list(fns)
    times = {n: [] for n in names}
    for r in range(rounds):
        k = r % len(names) if names else 0
        for n in names[k:] + names[:k]:
            times[n].append(timer(fns[n]))
    return times


def median(xs):
    xs = [x for x in xs if x is not None and not (isinstance(x, float) and math.isnan(x))]
    return statistics.median(xs) if xs else float("nan")


def paired_ratio(times, peer, ours):
    """Median over rounds of (peer's time / ours) in the same round (> 1: ours
    faster). A ratio of two medians would not cancel round-to-round drift."""
    return median([p / o for p, o in zip(times[peer], times[ours])])


# ------------------------------------------------------------------ resources
_WORKSPACE = None


def workspace(nbytes=512 << 20):
    """One device workspace for every wrapper of a run (grown when asked for
    more). Wrappers whose plans must live side by side need their own
    (new_workspace): a later plan into the same workspace replaces the first."""
    global _WORKSPACE
    if _WORKSPACE is None or _WORKSPACE.numel() < nbytes:
        _WORKSPACE = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    return _WORKSPACE


def new_workspace(nbytes=512 << 20):
    return torch.empty(nbytes, dtype=torch.uint8, device="cuda")


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


def is_hopper():
    return torch.cuda.get_device_capability()[0] == 9


# ------------------------------------------------------------------ workloads
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


def parse_workload(w):
    """HQ/HKV:LENGTHS:BATCH (LENGTHS as kv_lengths takes them) -> ((hq, hkv), lengths, batch)."""
    try:
        heads, rest = w.split(":", 1)
        dist, b = rest.rsplit(":", 1)
        hq, hkv = heads.split("/")
        return (int(hq), int(hkv)), dist, int(b)
    except ValueError:
        raise SystemExit(f"workload: expected HQ/HKV:LENGTHS:BATCH (e.g. 32/8:const:1024:16), got {w!r}")


def parse_config(cfg, allowed):
    """NAME:KEY=VALUE,KEY=VALUE -> (name, {key: value}); keys must be in `allowed`."""
    name, _, rest = cfg.partition(":")
    opts = {}
    for kv in filter(None, rest.replace("|", ",").split(",")):
        k, eq, v = kv.partition("=")
        if not eq or k not in allowed:
            raise SystemExit(f"--ab {cfg!r}: expected NAME:KEY=VALUE,... with KEY one of {', '.join(allowed)}")
        opts[k] = v
    return name or "base", opts


# ------------------------------------------------------------------ peers
def sdpa_fn(b, hq, hkv, lq, lkv, causal, backend, d=128, dtype=None):
    """SDPA with one backend ('flash', 'cudnn') forced on dense [B, H, L, D], as a
    callable; None if it refuses the shape."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    be = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION}[backend]
    dtype = dtype or torch.float16
    q = torch.randn(b, hq, lq, d, dtype=dtype, device="cuda")
    k = torch.randn(b, hkv, lkv, d, dtype=dtype, device="cuda")
    v = torch.randn_like(k)

    def fn():
        with sdpa_kernel([be]):
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=hq != hkv)
    try:
        fn()
        return fn
    except RuntimeError:
        return None


def sdpa_decode_fns(lens, hq, hkv, backend, d=128, copies=1, mem_limit=24 << 30, dtype=None):
    """One decode step of SDPA on dense KV padded to the longest request, as
    `copies` callables over their own caches (for bench_graph_ms), or (None,
    why) when the padded KV is too large or the backend refuses it."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    be = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION}[backend]
    dtype = dtype or torch.float16
    b, lmax = len(lens), max(lens)
    if 2 * b * hkv * lmax * d * 2 * copies > mem_limit:
        return None, f"padded KV {2 * b * hkv * lmax * d * 2 * copies / 2**30:.0f} GiB"
    q = torch.randn(b, hq, 1, d, dtype=dtype, device="cuda")
    kvs = [(torch.randn(b, hkv, lmax, d, dtype=dtype, device="cuda"),
            torch.randn(b, hkv, lmax, d, dtype=dtype, device="cuda")) for _ in range(copies)]

    def one(k, v):
        def fn():
            with sdpa_kernel([be]):
                return F.scaled_dot_product_attention(q, k, v, enable_gqa=hq != hkv)
        return fn
    fns = [one(k, v) for k, v in kvs]
    try:
        fns[0]()
        return fns, None
    except RuntimeError as e:
        return None, str(e).split("\n")[0][:60]


_FLEX = None


def flex_compiled():
    global _FLEX
    if _FLEX is None:
        from torch.nn.attention.flex_attention import flex_attention
        # One compiled kernel per (shape, score_mod): raise the recompile limits so every shape compiles.
        for name, value in (("cache_size_limit", 1000), ("accumulated_cache_size_limit", 4000),
                            ("recompile_limit", 1000), ("accumulated_recompile_limit", 4000)):
            if hasattr(torch._dynamo.config, name):
                setattr(torch._dynamo.config, name, value)
        _FLEX = torch.compile(flex_attention)
    return _FLEX


def flex_fn(b, hq, hkv, lq, lkv, mask_mod, score_mod=None, mask_batch=None, d=128, dtype=None):
    """Compiled FlexAttention on dense [B, H, L, D] with a block mask from
    mask_mod (batch-independent unless mask_batch = B), as a callable; None
    when it does not compile (reported, not fatal)."""
    from torch.nn.attention.flex_attention import create_block_mask
    dtype = dtype or torch.float16
    flex = flex_compiled()
    bm = create_block_mask(mask_mod, mask_batch, None, lq, lkv, device="cuda")
    q = torch.randn(b, hq, lq, d, dtype=dtype, device="cuda")
    k = torch.randn(b, hkv, lkv, d, dtype=dtype, device="cuda")
    v = torch.randn_like(k)
    try:
        fn = lambda: flex(q, k, v, score_mod=score_mod, block_mask=bm, enable_gqa=hq != hkv)  # noqa: E731
        fn()
        return fn
    except Exception as e:  # a compile failure must not end the run
        print(f"# flex {lq}x{lkv}: {type(e).__name__}: {str(e).splitlines()[0][:80] if str(e) else ''}", flush=True)
        return None


def flashinfer():
    """The flashinfer module when it is installed (a peer with Tessera's wrapper signatures), else None."""
    try:
        import flashinfer as fi
        return fi
    except Exception:
        return None


def ragged_prefill_fn(lib, q_lens, kv_lens, hq, hkv, causal, d=128, backend=None, ws=None, dtype=None):
    """A planned ragged batch prefill of `lib` (tessera or flashinfer) as a
    callable (one run per call), with fresh random inputs."""
    dtype = dtype or torch.float16
    qo = torch.tensor([0] + list(q_lens)).cumsum(0).to(torch.int32)
    kvp = torch.tensor([0] + list(kv_lens)).cumsum(0).to(torch.int32)
    q = torch.randn(int(qo[-1]), hq, d, dtype=dtype, device="cuda")
    k = torch.randn(int(kvp[-1]), hkv, d, dtype=dtype, device="cuda")
    v = torch.randn_like(k)
    kw = {"backend": backend} if backend else {}
    w = lib.BatchPrefillWithRaggedKVCacheWrapper(workspace() if ws is None else ws, "NHD", **kw)
    w.plan(qo, kvp, hq, hkv, d, causal=causal, q_data_type=dtype)
    out = torch.empty_like(q)
    return lambda: w.run(q, k, v, out=out)


# ------------------------------------------------------------------ results
def device_name():
    return torch.cuda.get_device_name()


def save_results(kind, payload):
    """Writes bench/results/KIND.json (over the current one: git keeps the
    history) and, when $OUT is set, $OUT/KIND.json; returns the path."""
    out = os.path.join(HERE, "results")
    os.makedirs(out, exist_ok=True)
    path = os.path.join(out, f"{kind}.json")
    doc = dict(device=device_name(), date=datetime.date.today().isoformat(),
               command="python " + " ".join([os.path.relpath(sys.argv[0], os.path.join(HERE, ".."))] + sys.argv[1:]),
               torch=torch.__version__, host=platform.node())
    doc.update(payload)
    text = json.dumps(doc, indent=1) + "\n"
    with open(path, "w") as f:
        f.write(text)
    if os.environ.get("OUT"):  # the GPU scripts' output folder (scripts/gpu_suite.sh, gpu_bench.sh)
        with open(os.path.join(os.environ["OUT"], os.path.basename(path)), "w") as f:
            f.write(text)
    return path


def fmt(x, nd=2):
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.{nd}f}"
