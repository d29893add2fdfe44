"""A decode step of a 32-layer attention stack driven from Python as a
serving engine drives it: planned on the host (plan() each step, then the
CUDA graph captured for that batch size) against planned on the GPU (one
CUDA graph holding plan(on_device=True) and every layer's run(), replayed
for any batch size). `tessera device-plan` measures the same from C++;
this is what an engine's Python loop pays, plan()'s Python layer included.

Per step (GQA 32/8, head dim 128, fp16, page 16, page ids on the GPU as
engines keep them): a batch size and KV lengths drawn at random, then both
paths in turn (alternating which goes first), each timed on the host clock
from its first call to the end of a synchronize (the engine waits for the
step's tokens), and its last layer's output compared bitwise with the other
path's. Both paths copy the step's lengths to the GPU (pinned, async); the
device path also its batch size, all in one copy. Medians over the steps of each phase:
  small    batch 1-16, keys 1-1024
  serving  batch 1-256, keys 1-4096

Usage: python bench/device_plan.py [--layers 32] [--steps 60] [--tensor-cores 0|1]
Results: bench/results/device-plan-python.json
"""
import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

HQ, HKV, D, PAGE = 32, 8, 128, 16
PHASES = (("small", 1, 16, 1024), ("serving", 1, 256, 4096))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--tensor-cores", type=int, default=1, choices=(0, 1))
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    tessera = common.require()
    torch = common.torch
    rng = np.random.default_rng(args.seed)
    tc = bool(args.tensor_cores)
    max_batch = max(p[2] for p in PHASES)
    max_len = max(p[3] for p in PHASES)
    pool = max_batch * ((max_len + PAGE - 1) // PAGE)
    g = torch.Generator(device="cuda").manual_seed(args.seed)
    k = torch.randn(pool, PAGE, HKV, D, dtype=torch.float16, device="cuda", generator=g)
    v = torch.randn(pool, PAGE, HKV, D, dtype=torch.float16, device="cuda", generator=g)
    qs = [torch.randn(max_batch, HQ, D, dtype=torch.float16, device="cuda", generator=g) for _ in range(args.layers)]
    out_host = [torch.empty_like(q) for q in qs]
    out_dev = [torch.empty_like(q) for q in qs]
    perm = torch.randperm(pool, generator=torch.Generator().manual_seed(args.seed)).to(torch.int32)
    ids_dev = torch.zeros(pool, dtype=torch.int32, device="cuda")  # the engine's page table, on the GPU

    def i32(n, pinned=False):
        return torch.zeros(n, dtype=torch.int32, pin_memory=pinned) if pinned else \
            torch.zeros(n, dtype=torch.int32, device="cuda")

    # Device path: bound-sized step tensors and one graph (planner + every layer). The step's
    # lengths live in one buffer, [batch | indptr (max_batch + 1) | last (max_batch)], written
    # on the host through numpy and uploaded by one copy, as an engine would batch them.
    d_meta, h_meta = i32(2 + 2 * max_batch), i32(2 + 2 * max_batch, pinned=True)
    h_np = h_meta.numpy()
    d_batch, d_indptr, d_last = d_meta[:1], d_meta[1:2 + max_batch], d_meta[2 + max_batch:]
    ws_dev = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    dev = tessera.BatchDecodeWithPagedKVCacheWrapper(
        ws_dev, "NHD", use_cuda_graph=True, use_tensor_cores=tc, paged_kv_indptr_buffer=d_indptr,
        paged_kv_indices_buffer=ids_dev, paged_kv_last_page_len_buffer=d_last)

    def write_meta(indptr, last):
        b = len(last)
        h_np[0] = b
        h_np[1:2 + b] = indptr
        h_np[2 + max_batch:2 + max_batch + b] = last

    def upload_meta():
        d_meta.copy_(h_meta, non_blocking=True)

    def device_step():
        dev.plan(d_indptr, ids_dev, d_last, HQ, HKV, D, PAGE, q_data_type=torch.float16, on_device=True,
                 batch_size=d_batch)
        for q, o in zip(qs, out_dev):
            dev.run(q, (k, v), out=o, enable_pdl=True)

    def table(lens):
        pages = [(n + PAGE - 1) // PAGE for n in lens]
        indptr = np.zeros(len(lens) + 1, np.int32)
        indptr[1:] = np.cumsum(pages)
        last = np.array([n - (p - 1) * PAGE for n, p in zip(lens, pages)], np.int32)
        return indptr, last

    # First plan outside any capture (builds the C++ object, loads the kernels).
    indptr, last = table([64])
    ids_dev.copy_(perm.cuda())
    write_meta(indptr, last)
    upload_meta()
    device_step()
    torch.cuda.synchronize()
    dev_graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(dev_graph):
        device_step()

    # Host path: one wrapper with buffers of the same bounds (so both paths plan alike), re-planned each step,
    # and a CUDA graph of the layers per batch size, captured at the size's first step.
    h_indptr, h_last = i32(max_batch + 1), i32(max_batch)
    host_w = tessera.BatchDecodeWithPagedKVCacheWrapper(
        torch.empty(256 << 20, dtype=torch.uint8, device="cuda"), "NHD", use_cuda_graph=True, use_tensor_cores=tc,
        paged_kv_indptr_buffer=h_indptr, paged_kv_indices_buffer=ids_dev, paged_kv_last_page_len_buffer=h_last)
    host = {}

    def host_plan(indptr, last):
        host_w.plan(torch.from_numpy(indptr), ids_dev, torch.from_numpy(last), HQ, HKV, D, PAGE,
                    q_data_type=torch.float16)

    def host_layers(b):
        for q, o in zip(qs, out_host):
            host_w.run(q[:b], (k, v), out=o[:b], enable_pdl=True)

    results = {"device": common.device_name(), "layers": args.layers, "tensor_cores": tc, "phases": []}
    print(f"{args.layers} attention layers, GQA {HQ}/{HKV}, d{D}, fp16, page {PAGE}, "
          f"{'tensor cores' if tc else 'CUDA cores'}; {args.steps} steps per phase")
    for name, lo, hi, max_keys in PHASES:
        wall = {"host": [], "device": []}
        calls = {"host": [], "device": []}
        plan_us, mismatches = [], 0
        for s in range(args.steps):
            b = int(rng.integers(lo, hi + 1))
            lens = [int(x) for x in rng.integers(1, max_keys + 1, size=b)]
            indptr, last = table(lens)
            if b not in host:  # capture outside the timed steps, after the step's plan
                host_plan(indptr, last)
                host_layers(b)
                torch.cuda.synchronize()
                host[b] = torch.cuda.CUDAGraph()
                with torch.cuda.graph(host[b]):
                    host_layers(b)
            for path in (("device", "host") if s % 2 == 0 else ("host", "device")):
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                if path == "host":
                    t_plan = time.perf_counter()
                    host_plan(indptr, last)
                    plan_us.append((time.perf_counter() - t_plan) * 1e6)
                    host[b].replay()
                else:
                    write_meta(indptr, last)
                    upload_meta()
                    dev_graph.replay()
                t1 = time.perf_counter()
                torch.cuda.synchronize()
                t2 = time.perf_counter()
                calls[path].append((t1 - t0) * 1e6)
                wall[path].append((t2 - t0) * 1e6)
            mismatches += not torch.equal(out_host[-1][:b], out_dev[-1][:b])
        med = {p: common.median(wall[p]) for p in wall}
        ratios = [d / h for d, h in zip(wall["device"], wall["host"])]
        row = dict(phase=name, batch=[lo, hi], max_keys=max_keys, wall_host_us=med["host"],
                   wall_device_us=med["device"], ratio_device_over_host=common.median(ratios),
                   calls_host_us=common.median(calls["host"]), calls_device_us=common.median(calls["device"]),
                   plan_host_us=common.median(plan_us), bitwise_equal=mismatches == 0)
        results["phases"].append(row)
        print(f"{name:8s} batch {lo}-{hi}, keys 1-{max_keys}: step wall us host-planned {med['host']:.1f}, "
              f"device-planned {med['device']:.1f} (ratio {row['ratio_device_over_host']:.3f}); host us of the "
              f"calls: host path {row['calls_host_us']:.1f} (plan() {row['plan_host_us']:.1f}), device path "
              f"{row['calls_device_us']:.1f}; last layer bitwise equal: {'yes' if mismatches == 0 else 'NO'}")
    common.save_results("device-plan-python", results)


if __name__ == "__main__":
    main()
