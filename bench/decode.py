"""Batch decode benchmark: Tessera vs PyTorch SDPA (flash, cuDNN) on padded
dense KV, FlexAttention with a length block mask, side by side in one run.

Reports per workload: time (us), achieved TB/s counting only the KV bytes the
batch needs (each request's K and V once, plus q and o), the fraction of the
HBM read ceiling measured in the same run, and speedups of Tessera over each
peer (and over its own no-split ablation, which shows what load balancing buys).
Each row also times Tessera with use_tensor_cores=True (decode on the
tensor-core prefill kernel; fields tessera-tc_*), so one run compares the
CUDA-core and tensor-core decode paths.

FlashInfer itself is not run: its PyPI wheel (flashinfer-python 0.7.2.post1)
is 62 MB before its dependencies (apache-tvm-ffi, nvidia-cutlass-dsl,
nvidia-cudnn-frontend, cuda-tile, ...), over the 64 MiB that can be carried to
the offline GPU machine, and it JIT-compiles its kernels with nvcc on first use.

Usage: python bench/decode.py [--quick] [--no-flex]
"""
import argparse
import itertools
import statistics
import time
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
import common  # noqa: E402
import tessera  # noqa: E402

D = 128
DTYPE = torch.float16
PLAN_REPEATS = 20  # re-plans timed per case
MEM_LIMIT = 24 << 30  # skip a peer whose (padded) KV would exceed this


def paged_cache(lens, page_size, hkv, seed, shuffle=True):
    g = torch.Generator(device="cuda").manual_seed(seed)
    pages = [(n + page_size - 1) // page_size for n in lens]
    total = sum(pages)
    k = torch.randn(total, page_size, hkv, D, dtype=DTYPE, device="cuda", generator=g)
    v = torch.randn(total, page_size, hkv, D, dtype=DTYPE, device="cuda", generator=g)
    perm = (torch.randperm(total, generator=torch.Generator().manual_seed(seed)) if shuffle else torch.arange(total)).to(torch.int32)
    indptr = torch.zeros(len(lens) + 1, dtype=torch.int32)
    indptr[1:] = torch.cumsum(torch.tensor(pages, dtype=torch.int32), 0)
    last = torch.tensor([n - (p - 1) * page_size if p else 0 for n, p in zip(lens, pages)], dtype=torch.int32)
    return k, v, indptr, perm, last


def needed_bytes(lens, hq, hkv):
    return sum(lens) * hkv * D * 2 * 2 + 2 * len(lens) * hq * D * 2


def run_tessera(lens, page_size, hq, hkv, q, split=True, check=False, shuffle=True, tensor_cores=False, bench=True,
                device_ids=False):
    k, v, indptr, indices, last = paged_cache(lens, page_size, hkv, seed=len(lens) + page_size, shuffle=shuffle)
    if device_ids:  # the page table stays on the GPU, as serving engines keep it (plan() never reads it)
        indices = indices.cuda()
    ws = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    w = tessera.BatchDecodeWithPagedKVCacheWrapper(ws, "NHD", use_tensor_cores=tensor_cores)
    if not split:
        w._split_kv = False  # Tessera-only switch for the ablation (planner without KV splitting)
    w.plan(indptr, indices, last, hq, hkv, D, page_size, q_data_type=DTYPE, kv_data_type=DTYPE)
    # plan() runs once per generation step: the first one also loads the
    # kernel and sizes the workspace, so the host time that matters is that of
    # the plans after it (median of re-plans; C++ time inside plan(), and the
    # whole Python call). A step ends with the host waiting for its tokens, so
    # each timed plan starts with the GPU idle: back-to-back plans would
    # instead time the wait for the previous plan's upload (~10 us), which a
    # serving loop never sees.
    first_plan_us = w.last_plan_us
    cpp_us, py_us = [], []
    for _ in range(PLAN_REPEATS):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        w.plan(indptr, indices, last, hq, hkv, D, page_size, q_data_type=DTYPE, kv_data_type=DTYPE)
        py_us.append((time.perf_counter() - t0) * 1e6)
        cpp_us.append(w.last_plan_us)
    plan_us = dict(first=first_plan_us, cpp=statistics.median(cpp_us), python=statistics.median(py_us))
    out = torch.empty_like(q)
    fn = lambda: w.run(q, (k, v), out=out)  # noqa: E731
    ms = common.bench_ms(fn) if bench else None
    err = None
    if check:  # spot-check two requests against a float32 softmax
        errs = []
        for r in (0, len(lens) - 1):
            pages = indices[indptr[r]:indptr[r + 1]].long().cuda()
            kk = k[pages].reshape(-1, hkv, D)[: lens[r]].float()
            vv = v[pages].reshape(-1, hkv, D)[: lens[r]].float()
            g = hq // hkv
            qq = q[r].float().view(hkv, g, D)
            s = torch.einsum("hgd,nhd->hgn", qq, kk) / D**0.5
            ref = torch.einsum("hgn,nhd->hgd", torch.softmax(s, -1), vv).reshape(hq, D)
            errs.append(((out[r].float() - ref).abs().max() / ref.abs().max()).item())
        err = max(errs)
    del k, v, ws
    return ms, err, plan_us


def run_sdpa(lens, hq, hkv, backend):
    from torch.nn.attention import SDPBackend, sdpa_kernel
    b, lmax = len(lens), max(lens)
    if 2 * b * hkv * lmax * D * 2 > MEM_LIMIT:
        return None, f"padded KV {2 * b * hkv * lmax * D * 2 / 2**30:.0f} GiB"
    q = torch.randn(b, hq, 1, D, dtype=DTYPE, device="cuda")
    k = torch.randn(b, hkv, lmax, D, dtype=DTYPE, device="cuda")
    v = torch.randn_like(k)
    be = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION}[backend]
    try:
        with sdpa_kernel([be]):
            fn = lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=hq != hkv)  # noqa: E731
            fn()
            ms = common.bench_ms(fn)
        return ms, None
    except RuntimeError as e:
        return None, str(e).split("\n")[0][:60]
    finally:
        del q, k, v


_flex = None


def run_flex(lens, hq, hkv):
    global _flex
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention
    if _flex is None:
        torch._dynamo.config.cache_size_limit = 1000
        torch._dynamo.config.accumulated_cache_size_limit = 4000
        _flex = torch.compile(flex_attention)
    b, lmax = len(lens), max(lens)
    lmax = (lmax + 127) // 128 * 128
    if 2 * b * hkv * lmax * D * 2 > MEM_LIMIT:
        return None, "padded KV too large"
    lens_t = torch.tensor(lens, device="cuda")
    mask = lambda bb, h, qi, kv: kv < lens_t[bb]  # noqa: E731
    bm = create_block_mask(mask, b, None, 1, lmax, device="cuda")
    q = torch.randn(b, hq, 1, D, dtype=DTYPE, device="cuda")
    k = torch.randn(b, hkv, lmax, D, dtype=DTYPE, device="cuda")
    v = torch.randn_like(k)
    try:
        fn = lambda: _flex(q, k, v, block_mask=bm, enable_gqa=hq != hkv)  # noqa: E731
        fn()
        return common.bench_ms(fn), None
    except Exception as e:  # compile failures are reported, not fatal
        return None, type(e).__name__ + ": " + str(e).split("\n")[0][:50]
    finally:
        del q, k, v


def plan_timing():
    """Host time of a steady-state plan() for 256 requests (issue 3: under 30 us), both decode paths."""
    rows = []
    print("# plan() host time, 256 requests, 32/8 heads: median of re-plans (C++ inside plan() | whole Python call)")
    for dist in ("const:1024", "zipf:1024", "const:8192"):
        lens = common.kv_lengths(dist, 256, seed=256)
        q = torch.randn(256, 32, D, dtype=DTYPE, device="cuda")
        for ps in (16, 1):
            for tc, dev in itertools.product((False, True), (False, True)):
                pages = sum((n + ps - 1) // ps for n in lens)
                if pages * ps * 8 * D * 4 > MEM_LIMIT:
                    continue
                _, _, plan_us = run_tessera(lens, ps, 32, 8, q, tensor_cores=tc, bench=False, device_ids=dev)
                rows.append(dict(part="plan", lengths=dist, batch=256, page_size=ps, pages=pages, tensor_cores=tc,
                                 page_ids="gpu" if dev else "host", plan_cpp_us=plan_us["cpp"],
                                 plan_python_us=plan_us["python"], first_plan_us=plan_us["first"]))
                print(f"  {dist:>12} page {ps:>2} ({pages:>7} page ids on the {'gpu ' if dev else 'host'}) "
                      f"{'tc' if tc else 'cc'}: {plan_us['cpp']:7.1f} us C++ | {plan_us['python']:7.1f} us Python | "
                      f"first plan {plan_us['first']:8.1f} us", flush=True)
        del q
        torch.cuda.empty_cache()
    return rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="a small grid")
    ap.add_argument("--no-flex", action="store_true")
    ap.add_argument("--plan-only", action="store_true", help="only the plan() host-time table")
    args = ap.parse_args()
    if args.plan_only:
        plan_timing()
        return
    read_tbps, copy_tbps = common.hbm_ceilings()
    read_tbps = max(read_tbps, common.read_probe_best())
    ceiling = max(read_tbps, copy_tbps)
    print(f"# {common.device_name()}: HBM read ceiling {read_tbps:.2f} TB/s (sum), copy {copy_tbps:.2f} TB/s (R+W); "
          f"fractions below use {ceiling:.2f}")

    heads = [(32, 32), (32, 8)]
    dists = ["const:1024", "const:8192", "uniform:512-1024", "zipf:1024"]
    batches = [16, 64, 128, 256]
    extra = [("const:4096", 128), ("const:32768", 1), ("const:32768", 2), ("const:32768", 4)]
    if args.quick:
        dists, batches, extra = ["const:1024", "zipf:1024"], [16, 128], [("const:4096", 128), ("const:32768", 1)]
    work = [(h, d, b) for h in heads for d in dists for b in batches] + [(h, d, b) for h in heads for d, b in extra]

    rows = []
    hdr = (f"{'Hq/Hkv':>6} {'lengths':>16} {'B':>4} {'pg':>3} {'us':>8} {'TB/s':>5} {'ceil':>5} | "
           f"{'tc us':>8} {'TB/s':>5} | {'tc':>7} {'nosplit':>7} {'sdpa-fl':>7} {'cudnn':>7} {'flex':>7}"
           f"  (x = Tessera (CUDA cores) speedup; tc = use_tensor_cores=True)")
    print(hdr)
    checked = set()
    for (hq, hkv), dist, b in work:
        lens = common.kv_lengths(dist, b, seed=b)
        nb = needed_bytes(lens, hq, hkv)
        if nb > MEM_LIMIT:
            continue
        q = torch.randn(b, hq, D, dtype=DTYPE, device="cuda")
        peers = {"sdpa-flash": run_sdpa(lens, hq, hkv, "flash"), "sdpa-cudnn": run_sdpa(lens, hq, hkv, "cudnn")}
        peers["flex"] = (None, "off") if args.no_flex or b > 16 else run_flex(lens, hq, hkv)
        for ps in (1, 16):
            check = (hq, hkv, ps) not in checked
            checked.add((hq, hkv, ps))
            ms, err, plan_us = run_tessera(lens, ps, hq, hkv, q, check=check)
            if err is not None and err > 1e-3:
                raise SystemExit(f"Tessera decode spot check failed: rel err {err:.2e}")
            ms_ns = run_tessera(lens, ps, hq, hkv, q, split=False)[0] if ps == 16 else None
            ms_tc, err_tc, plan_us_tc = run_tessera(lens, ps, hq, hkv, q, check=check, tensor_cores=True)
            if err_tc is not None and err_tc > 1e-3:
                raise SystemExit(f"Tessera tensor-core decode spot check failed: rel err {err_tc:.2e}")
            tbps = nb / (ms * 1e-3) / 1e12
            tbps_tc = nb / (ms_tc * 1e-3) / 1e12
            row = dict(hq=hq, hkv=hkv, lengths=dist, batch=b, page_size=ps, us=ms * 1e3, tbps=tbps,
                       frac_ceiling=tbps / ceiling, plan_us=plan_us, spot_check_err=err,
                       no_split_us=ms_ns * 1e3 if ms_ns else None, max_len=max(lens), mean_len=sum(lens) / b)
            # The tensor-core path, under the same field names with the "tessera-tc_" prefix.
            row.update({"tessera-tc_us": ms_tc * 1e3, "tessera-tc_tbps": tbps_tc,
                        "tessera-tc_frac_ceiling": tbps_tc / ceiling, "tessera-tc_plan_us": plan_us_tc,
                        "tessera-tc_spot_check_err": err_tc})
            for name, (pms, why) in peers.items():
                row[name + "_us"] = pms * 1e3 if pms else None
                row[name + "_note"] = why
            rows.append(row)
            ratio = lambda other: f"{other / ms:6.2f}x" if other else f"{'-':>7}"  # noqa: E731
            print(f"{hq:>3}/{hkv:<2} {dist:>16} {b:>4} {ps:>3} {ms * 1e3:8.1f} {tbps:5.2f} {tbps / ceiling:5.0%} | "
                  f"{ms_tc * 1e3:8.1f} {tbps_tc:5.2f} | {ratio(ms_tc)} "
                  f"{ratio(ms_ns)} {ratio(peers['sdpa-flash'][0])} {ratio(peers['sdpa-cudnn'][0])} {ratio(peers['flex'][0])}",
                  flush=True)
        del q
        torch.cuda.empty_cache()
    # Page placement: the grid above scatters pages at random over the pool (a
    # worst case for locality); a fresh cache allocates them in order.
    lens = [4096] * 128
    q = torch.randn(128, 32, D, dtype=DTYPE, device="cuda")
    ms_seq = run_tessera(lens, 16, 32, 32, q, shuffle=False)[0]
    ms_seq_tc = run_tessera(lens, 16, 32, 32, q, shuffle=False, tensor_cores=True)[0]
    tb = needed_bytes(lens, 32, 32) / (ms_seq * 1e-3) / 1e12
    tb_tc = needed_bytes(lens, 32, 32) / (ms_seq_tc * 1e-3) / 1e12
    print(f"# 32/32 const:4096 B128 pg16 with pages in order: {ms_seq * 1e3:.1f} us, {tb:.2f} TB/s, {tb / ceiling:.0%} of "
          f"ceiling; tensor cores {ms_seq_tc * 1e3:.1f} us, {tb_tc:.2f} TB/s")
    rows.append({"hq": 32, "hkv": 32, "lengths": "const:4096", "batch": 128, "page_size": 16, "pages": "in order",
                 "us": ms_seq * 1e3, "tbps": tb, "frac_ceiling": tb / ceiling, "tessera-tc_us": ms_seq_tc * 1e3,
                 "tessera-tc_tbps": tb_tc, "tessera-tc_frac_ceiling": tb_tc / ceiling})
    rows += plan_timing()
    path = common.save_results("decode", dict(read_ceiling_tbps=read_tbps, copy_tbps=copy_tbps, ceiling_tbps=ceiling,
                                              head_dim=D, dtype="float16", rows=rows))
    print(f"# results: {path}")


if __name__ == "__main__":
    main()
