"""Shared-prefix decode (parallel generation, paper section 3.1.2 and Figure
10): composable formats against a flat page table, side by side in one run.

Each of P prompts has a prefix of L tokens shared by its n samples; each
sample has its own suffix (uniform 64..512 tokens) and one query token. The
same paged cache (page 16, NHD, fp16, head dim 128) is attended four ways:
  cascade:  tessera.MultiLevelCascadeAttentionWrapper, 2 levels: each
            prompt's prefix pages once, as one group of its n query rows,
            then every sample's suffix pages;
  flat:     BatchDecodeWithPagedKVCacheWrapper over each sample's full page
            list (prefix pages repeated per sample), CUDA cores and tensor
            cores (the best of the two is the baseline);
  sdpa:     PyTorch SDPA (cuDNN and flash backends) on padded dense KV, each
            sample's prefix copied in (what a serving engine without
            prefix sharing runs);
  flashinfer: FlashInfer's MultiLevelCascadeAttentionWrapper on the same
            levels and cache, when it is installed (its run() allocates its
            output; checked against the flat decode too).
Reports us, the KV bytes each form must read (cascade: every prefix once;
flat: once per sample), TB/s of the bytes the cascade needs, and speedups of
the cascade over each. The cascade is checked against the flat decode.
Usage: python bench/cascade.py [--quick] [--profile] [--tile-sweep]
  --profile: also list the GPU kernels of one cascade run per case (torch.profiler)
  --tile-sweep: only time the shared level (level 0) alone as a batch prefill
      under several kernel templates and query tiles
"""
import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402
import decode  # noqa: E402
from common import torch, tessera  # noqa: E402

D, PS = 128, 16
DT = torch.float16 if torch else None


def build(prompts, n, prefix, hkv, rng):
    """Page tables of one step: per prompt its prefix pages, per sample its suffix pages."""
    suffix = rng.integers(64, 513, size=prompts * n)
    pre_pages = -(-prefix // PS)
    suf_pages = [-(-int(s) // PS) for s in suffix]
    total = prompts * pre_pages + sum(suf_pages)
    perm = rng.permutation(total).astype(np.int32)
    pre_ids = [perm[i * pre_pages:(i + 1) * pre_pages] for i in range(prompts)]
    at, suf_ids = prompts * pre_pages, []
    for p in suf_pages:
        suf_ids.append(perm[at:at + p])
        at += p
    last_pre = prefix - (pre_pages - 1) * PS
    last_suf = np.array([int(s) - (p - 1) * PS for s, p in zip(suffix, suf_pages)], np.int32)
    b = prompts * n
    levels = (
        [np.arange(0, b + 1, n, dtype=np.int32), np.arange(b + 1, dtype=np.int32)],  # qo_indptr per level
        [np.arange(0, prompts * pre_pages + 1, pre_pages, dtype=np.int32),
         np.concatenate([[0], np.cumsum(suf_pages)]).astype(np.int32)],
        [np.concatenate(pre_ids), np.concatenate(suf_ids)],
        [np.full(prompts, last_pre, np.int32), last_suf],
    )
    # Flat: each sample's prefix pages (the last one partial when L % 16 != 0
    # cannot sit mid-sequence in one page table, so the flat form needs L % 16 == 0).
    assert prefix % PS == 0, "flat page tables need whole prefix pages"
    flat_ids = [np.concatenate([pre_ids[i // n], suf_ids[i]]) for i in range(b)]
    flat = (np.concatenate([[0], np.cumsum([len(x) for x in flat_ids])]).astype(np.int32),
            np.concatenate(flat_ids), last_suf)
    lens = [prefix + int(s) for s in suffix]
    return levels, flat, total, lens, int(suffix.sum())


def profile(fn):
    """The GPU kernels of one fn() (after a warm-up): name and microseconds."""
    from torch.profiler import ProfilerActivity, profile as prof
    fn()
    torch.cuda.synchronize()
    with prof(activities=[ProfilerActivity.CUDA]) as p:
        fn()
        torch.cuda.synchronize()
    return [(e.name[:60], e.device_time) for e in p.events() if e.device_time > 0]


def run_case(prompts, n, prefix, hq, hkv, rng, show=False):
    levels, flat, total, lens, suffix_tokens = build(prompts, n, prefix, hkv, rng)
    b = prompts * n
    k = torch.randn(total, PS, hkv, D, dtype=DT, device="cuda")
    v = torch.randn_like(k)
    q = torch.randn(b, hq, D, dtype=DT, device="cuda")
    tok_bytes = hkv * D * 2 * 2
    need_cascade = (prompts * prefix + suffix_tokens) * tok_bytes
    need_flat = sum(lens) * tok_bytes
    row = dict(prompts=prompts, n=n, prefix=prefix, hq=hq, hkv=hkv, batch=b, cascade_bytes=need_cascade,
               flat_bytes=need_flat)

    cas = tessera.MultiLevelCascadeAttentionWrapper(2, common.workspace())
    cas.plan(*levels, hq, hkv, D, PS, q_data_type=DT)
    out = torch.empty_like(q)
    row["cascade_us"] = common.bench_ms(lambda: cas.run(q, (k, v), out=out)) * 1e3
    if show:
        for name, us in profile(lambda: cas.run(q, (k, v), out=out)):
            print(f"    {us:8.1f} us  {name}")
    ref = None
    for tc in (False, True):
        ws = common.new_workspace(256 << 20)
        dec = tessera.BatchDecodeWithPagedKVCacheWrapper(ws, "NHD", use_tensor_cores=tc)
        dec._cuda_cores = not tc  # both kernels, whatever the wrapper would pick
        dec.plan(*flat, hq, hkv, D, PS, q_data_type=DT)
        o2 = torch.empty_like(q)
        row[f"flat_{'tc' if tc else 'cc'}_us"] = common.bench_ms(lambda: dec.run(q, (k, v), out=o2)) * 1e3
        if ref is None:
            ref = o2.clone()
        del ws
    cas.run(q, (k, v), out=out)
    row["max_rel_err_vs_flat"] = ((out.float() - ref.float()).abs().max() / ref.float().abs().max()).item()
    row["flat_us"] = min(row["flat_cc_us"], row["flat_tc_us"])
    fi = common.flashinfer()
    if fi is not None:
        try:
            fcas = fi.MultiLevelCascadeAttentionWrapper(2, common.new_workspace(256 << 20), "NHD")
            fcas.plan(*[[torch.from_numpy(a).cuda() for a in level] for level in levels], hq, hkv, D, PS,
                      q_data_type=DT)
            row["flashinfer_us"] = common.bench_ms(lambda: fcas.run(q, (k, v))) * 1e3
            o_fi = fcas.run(q, (k, v)).float()
            row["flashinfer_max_rel_err_vs_flat"] = ((o_fi - ref.float()).abs().max() / ref.float().abs().max()).item()
        except Exception as e:  # a module FlashInfer cannot build here: the row says why
            row["flashinfer_note"] = f"{type(e).__name__}: {str(e)[:120]}"
    for backend in ("cudnn", "flash"):  # bench/decode.py's peers: padded dense KV of the same lengths
        ms, why = decode.run_sdpa(lens, hq, hkv, backend)
        row[f"sdpa-{backend}_us"] = ms * 1e3 if ms else None
        if why:
            row[f"sdpa-{backend}_note"] = why
    del k, v
    torch.cuda.empty_cache()
    return row


def tile_sweep():
    """The shared level alone: its groups as a batch prefill, per (backend, query tile)."""
    rng = np.random.default_rng(0)
    for prompts, n, prefix in [(1, 16, 8192), (8, 8, 4096), (1, 64, 8192), (1, 4, 32768)]:
        levels, _, total, _, _ = build(prompts, n, prefix, 8, rng)
        k = torch.randn(total, PS, 8, D, dtype=DT, device="cuda")
        v = torch.randn_like(k)
        q = torch.randn(prompts * n, 32, D, dtype=DT, device="cuda")
        out = torch.empty_like(q)
        res = []
        for backend, cta_q in (("fa3", 64), ("fa2", 16), ("fa2", 32), ("fa2", 64)):
            w = tessera.BatchPrefillWithPagedKVCacheWrapper(common.workspace(), backend=backend)
            w._cta_q = cta_q
            w.plan(levels[0][0], levels[1][0], levels[2][0], levels[3][0], 32, 8, D, PS, q_data_type=DT)
            res.append(f"{backend}/{cta_q} {common.bench_ms(lambda: w.run(q, (k, v), out=out)) * 1e3:7.1f} us")
        print(f"32/8 {prompts}x{n} prefix {prefix}: " + " | ".join(res), flush=True)
        del k, v


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="two cases, GQA only")
    ap.add_argument("--profile", action="store_true", help="list the GPU kernels of one cascade run per case")
    ap.add_argument("--tile-sweep", action="store_true", help="time the shared level alone per template and query tile")
    args = ap.parse_args()
    common.require()
    if args.tile_sweep:
        return tile_sweep()
    rng = np.random.default_rng(0)
    read, _ = common.hbm_ceilings()
    print(f"# {common.device_name()}: HBM read ceiling {read:.2f} TB/s; page {PS}, fp16, head dim {D}")
    cases = [(1, 16, 8192), (1, 64, 8192), (8, 8, 4096), (4, 32, 16384), (1, 4, 32768), (32, 4, 2048)]
    heads = [(32, 8), (32, 32)]
    if args.quick:
        cases, heads = [(1, 16, 8192), (8, 8, 4096)], [(32, 8)]
    print(f"{'Hq/Hkv':>6} {'P x n':>7} {'prefix':>6} | {'cascade us':>10} {'TB/s':>5} | {'flat cc':>8} {'flat tc':>8} "
          f"{'cudnn':>8} {'flash':>8} {'FI casc':>8} | {'x flat':>6} {'x cudnn':>7} {'x flash':>7} {'x FI':>7} | err")
    rows = []
    for hq, hkv in heads:
        for prompts, n, prefix in cases:
            r = run_case(prompts, n, prefix, hq, hkv, rng, args.profile)
            r["cascade_tbps"] = r["cascade_bytes"] / (r["cascade_us"] * 1e-6) / 1e12
            r["cascade_frac_ceiling"] = r["cascade_tbps"] / read
            rows.append(r)
            ratio = lambda x: f"{x / r['cascade_us']:6.2f}x" if x else f"{'-':>7}"  # noqa: E731
            us = lambda x: f"{x:8.1f}" if x else f"{'-':>8}"  # noqa: E731
            print(f"{hq:>3}/{hkv:<2} {prompts:>3}x{n:<3} {prefix:>6} | {r['cascade_us']:10.1f} {r['cascade_tbps']:5.2f} | "
                  f"{us(r['flat_cc_us'])} {us(r['flat_tc_us'])} {us(r['sdpa-cudnn_us'])} {us(r['sdpa-flash_us'])} "
                  f"{us(r.get('flashinfer_us'))} | {ratio(r['flat_us'])} {ratio(r['sdpa-cudnn_us'])} "
                  f"{ratio(r['sdpa-flash_us'])} {ratio(r.get('flashinfer_us'))} | {r['max_rel_err_vs_flat']:.1e}",
                  flush=True)
            if "flashinfer_note" in r:
                print(f"    flashinfer: {r['flashinfer_note']}", flush=True)
            if r["max_rel_err_vs_flat"] > 2e-3:
                raise SystemExit(f"cascade differs from the flat decode: {r['max_rel_err_vs_flat']:.2e}")
            if r.get("flashinfer_max_rel_err_vs_flat", 0.0) > 2e-3:
                raise SystemExit(f"FlashInfer's cascade differs from the flat decode: "
                                 f"{r['flashinfer_max_rel_err_vs_flat']:.2e}")
    path = common.save_results("cascade", dict(read_ceiling_tbps=read, page_size=PS, head_dim=D, dtype="float16",
                                               rows=rows))
    print(f"# results: {path}")


if __name__ == "__main__":
    main()
