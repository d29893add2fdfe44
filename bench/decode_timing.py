"""Where a small decode step's time goes: the same batch timed three ways.
  flushed:   common.bench_ms (L2 flushed before each launch, the benchmark's number:
             triton zeroes a 256 MB buffer, so L2 is full of dirty lines
             that go back to HBM while the step runs)
  clean:     the same, but L2 emptied by reading a 256 MB buffer (clean lines,
             nothing to write back: the state after a GEMM or a read)
  stream:    back-to-back launches on a stream, caches rotated so each launch
             reads KV that is not in L2 (launch overheads overlap)
  graph:     the same launches captured in one CUDA graph
Run under Nsight Compute to add the kernel's own duration:
  ncu --section SpeedOfLight -k regex:tessera python bench/decode_timing.py
Usage: python bench/decode_timing.py [--hq 32] [--hkv 8] [--batch 16] [--lengths uniform:512-1024] [--page 16]"""
import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402
import decode as dec  # noqa: E402
import tessera  # noqa: E402

D, DT = 128, torch.float16


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--hq", type=int, default=32)
    ap.add_argument("--hkv", type=int, default=8)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--lengths", default="uniform:512-1024")
    ap.add_argument("--page", type=int, default=16)
    a = ap.parse_args()
    lens = common.kv_lengths(a.lengths, a.batch)
    kv_bytes = sum(lens) * a.hkv * D * 2 * 2
    copies = max(2, (160 << 20) // kv_bytes + 1)  # > 3x the 50 MB L2 across the rotation
    caches = [dec.paged_cache(lens, a.page, a.hkv, seed=i) for i in range(copies)]
    q = torch.randn(a.batch, a.hq, D, dtype=DT, device="cuda")
    rows = []
    for tc in (False, True):
        _, _, indptr, indices, last = caches[0]
        w = tessera.BatchDecodeWithPagedKVCacheWrapper(common.workspace(), "NHD", use_tensor_cores=tc)
        w.plan(indptr, indices, last, a.hq, a.hkv, D, a.page, q_data_type=DT, kv_data_type=DT)
        out = torch.empty_like(q)
        # One plan (copy 0's page table) for every copy: the copies have the
        # same number of pages, so each launch reads the same amount of
        # memory from its own storage (timing only; values are not checked).
        kvs = [(c[0], c[1]) for c in caches]
        flushed = common.bench_ms(lambda: w.run(q, kvs[0], out=out))
        clean = common.bench_ms_clean(lambda: w.run(q, kvs[0], out=out))
        n = 60
        for kv in kvs:
            w.run(q, kv, out=out)
        torch.cuda.synchronize()
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        for i in range(n):
            w.run(q, kvs[i % len(kvs)], out=out)
        e.record()
        torch.cuda.synchronize()
        stream_us = s.elapsed_time(e) * 1e3 / n
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            for i in range(n):
                w.run(q, kvs[i % len(kvs)], out=out)
        g.replay()
        torch.cuda.synchronize()
        s.record()
        g.replay()
        e.record()
        torch.cuda.synchronize()
        graph_us = s.elapsed_time(e) * 1e3 / n
        tb = lambda us: kv_bytes / us / 1e6
        print(f"{'tc' if tc else 'cc'} {a.hq}/{a.hkv} batch {a.batch} {a.lengths} page {a.page} ({kv_bytes / 1e6:.1f} MB): "
              f"flushed {flushed * 1e3:.1f} us ({tb(flushed * 1e3):.2f} TB/s), clean {clean * 1e3:.1f} us "
              f"({tb(clean * 1e3):.2f}), stream {stream_us:.1f} us "
              f"({tb(stream_us):.2f}), graph {graph_us:.1f} us ({tb(graph_us):.2f})", flush=True)
        rows.append(dict(kernel="tc" if tc else "cc", flushed_us=flushed * 1e3, clean_us=clean * 1e3, stream_us=stream_us, graph_us=graph_us))
    # The peer on its best case (dense padded KV, no page table), both L2 states.
    from torch.nn.attention import SDPBackend, sdpa_kernel
    lmax = max(lens)
    qd = torch.randn(a.batch, a.hq, 1, D, dtype=DT, device="cuda")
    kd = torch.randn(a.batch, a.hkv, lmax, D, dtype=DT, device="cuda")
    vd = torch.randn_like(kd)
    with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
        fn = lambda: torch.nn.functional.scaled_dot_product_attention(qd, kd, vd, enable_gqa=a.hq != a.hkv)  # noqa: E731
        fl, cl = common.bench_ms(fn) * 1e3, common.bench_ms_clean(fn) * 1e3
    tb = lambda us: kv_bytes / us / 1e6  # noqa: E731  (needed bytes, as for ours)
    print(f"sdpa-cudnn (dense, padded to {lmax}): flushed {fl:.1f} us ({tb(fl):.2f} TB/s), clean {cl:.1f} us "
          f"({tb(cl):.2f})", flush=True)
    rows.append(dict(kernel="sdpa-cudnn", flushed_us=fl, clean_us=cl))
    tag = f"{a.hq}-{a.hkv}-b{a.batch}-{a.lengths.replace(':', '')}-p{a.page}"
    common.save_results(f"decode-timing-{tag}", dict(hq=a.hq, hkv=a.hkv, batch=a.batch, lengths=a.lengths, page_size=a.page,
                                                     head_dim=D, kv_bytes=kv_bytes, rows=rows))


if __name__ == "__main__":
    main()
