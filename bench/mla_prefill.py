"""MLA prefill: the absorbed form against the expanded one, per shape. A
DeepSeek-style layer's attention over a chunk of `chunk` new tokens per
request after `ctx` cached ones, H heads, bf16, the latent cache paged
(page 64):

  absorbed  q_nope (128) -> 512 through W_UK (one bmm), Tessera's MLA kernel
            over the paged latent cache (576-wide keys, 512-wide values,
            causal among the new tokens), the 512-wide output -> 128 through
            W_UV (one bmm). No copies: the bmms read and write the kernel's
            strided views.
  expanded  k_nope and v of every cached and new token from the latent rows
            (two GEMMs [N, 512] x [512, H * 128]), k = k_nope | kpe (one copy,
            kpe shared by the heads), then Tessera's ragged prefill with
            head_dim_qk 192 and head_dim_vo 128 (causal, bottom-right). The
            latent rows are read contiguous: an engine's gather of the paged
            rows is not counted, so the expanded times are a lower bound.

Both forms compute the same attention; each row checks their outputs against
each other (relative to the output's largest value) before timing. Timing:
each form's whole step replayed from one CUDA graph (common.bench_graph_ms),
the forms in interleaved rounds, medians; ratios paired by round. The pick
is the faster form. Results: bench/results/mla-prefill.json.

Usage: python bench/mla_prefill.py [--quick] [--rounds 3] [--workloads H:batch:chunk:ctx,...]
"""
import argparse
import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402
from common import torch, tessera  # noqa: E402

DC, DR, DN, DV, PAGE = 512, 64, 128, 128, 64
SHAPES = [(1, 8192, 0), (1, 4096, 4096), (2, 2048, 8192), (4, 512, 8192), (8, 128, 16384), (16, 32, 4096),
          (32, 8, 4096)]
GRID = [(h,) + s for h in (16, 128) for s in SHAPES]
QUICK = [(h,) + s for h in (16, 128) for s in ((1, 4096, 0), (4, 512, 8192), (16, 32, 4096))]


def pairs(batch, chunk, ctx):
    """(query, key) pairs a causal step visits: row j of a chunk sees ctx + j + 1 keys."""
    return batch * (chunk * ctx + chunk * (chunk + 1) // 2)


def make_step(h, batch, chunk, ctx, dtype, gen):
    kv = ctx + chunk
    n, t = batch * kv, batch * chunk
    dev = "cuda"

    def randn(*shape, scale=1.0):
        return (torch.randn(*shape, generator=gen, device=dev, dtype=torch.float32) * scale).to(dtype)

    s = dict(h=h, batch=batch, chunk=chunk, ctx=ctx)
    s["q"] = randn(t, h, DN + DR)  # the q projection's output: q_nope (128) | q_pe (64)
    s["ckv"] = randn(n, DC)  # latent rows of every request, in request order
    s["kpe"] = randn(n, DR)
    s["w_uk"] = randn(h, DN, DC, scale=DN ** -0.5)
    s["w_uv"] = randn(h, DC, DV, scale=DC ** -0.5)
    # The same weights as the expanded form's [512, H * 128] matrices.
    s["w_k"] = s["w_uk"].permute(2, 0, 1).reshape(DC, h * DN).contiguous()
    s["w_v"] = s["w_uv"].permute(1, 0, 2).reshape(DC, h * DV).contiguous()
    # Paged latent cache: each request's rows on shuffled pages of 64.
    per = (kv + PAGE - 1) // PAGE
    ids = torch.randperm(batch * per, generator=torch.Generator().manual_seed(gen.initial_seed()))
    s["kv_indices"] = ids.to(torch.int32)
    ckv_cache = torch.zeros(batch * per, PAGE, DC, dtype=dtype, device=dev)
    kpe_cache = torch.zeros(batch * per, PAGE, DR, dtype=dtype, device=dev)
    for b in range(batch):
        rows = torch.arange(per * PAGE, device=dev).clamp(max=kv - 1) + b * kv
        pages = ids[b * per:(b + 1) * per].to(dev)
        ckv_cache[pages] = s["ckv"][rows].view(per, PAGE, DC)
        kpe_cache[pages] = s["kpe"][rows].view(per, PAGE, DR)
    s["ckv_cache"], s["kpe_cache"] = ckv_cache, kpe_cache
    s["qo_indptr"] = torch.arange(0, (batch + 1) * chunk, chunk, dtype=torch.int32)
    s["kv_indptr_pages"] = torch.arange(0, (batch + 1) * per, per, dtype=torch.int32)
    s["kv_indptr_tokens"] = torch.arange(0, (batch + 1) * kv, kv, dtype=torch.int32)
    s["kv_lens"] = torch.full((batch,), kv, dtype=torch.int32)
    return s


def absorbed_fn(s, dtype, scale):
    h, t = s["h"], s["q"].shape[0]
    w = tessera.BatchMLAPagedAttentionWrapper(common.new_workspace(256 << 20))
    w.plan(s["qo_indptr"], s["kv_indptr_pages"], s["kv_indices"], s["kv_lens"], h, DC, DR, PAGE, True, scale,
           dtype, dtype)
    q_abs = torch.empty(h, t, DC, dtype=dtype, device="cuda")  # head-major: the bmms' layout, strided for the kernel
    o_lat = torch.empty(h, t, DC, dtype=dtype, device="cuda")
    out = torch.empty(h, t, DV, dtype=dtype, device="cuda")
    q_nope, q_pe = s["q"][..., :DN].transpose(0, 1), s["q"][..., DN:]

    def step():
        torch.bmm(q_nope, s["w_uk"], out=q_abs)
        w.run(q_abs.transpose(0, 1), q_pe, s["ckv_cache"], s["kpe_cache"], out=o_lat.transpose(0, 1))
        torch.bmm(o_lat, s["w_uv"], out=out)
    return step, lambda: out.transpose(0, 1), w


def expanded_fn(s, dtype, scale):
    h, n = s["h"], s["ckv"].shape[0]
    w = tessera.BatchPrefillWithRaggedKVCacheWrapper(common.new_workspace(256 << 20), "NHD")
    w.plan(s["qo_indptr"], s["kv_indptr_tokens"], h, h, DN + DR, head_dim_vo=DV, causal=True, sm_scale=scale,
           q_data_type=dtype)
    k_nope = torch.empty(n, h * DN, dtype=dtype, device="cuda")
    v = torch.empty(n, h * DV, dtype=dtype, device="cuda")
    k = torch.empty(n, h, DN + DR, dtype=dtype, device="cuda")
    out = torch.empty(s["q"].shape[0], h, DV, dtype=dtype, device="cuda")
    kpe = s["kpe"][:, None, :].expand(n, h, DR)

    def step():
        torch.mm(s["ckv"], s["w_k"], out=k_nope)
        torch.mm(s["ckv"], s["w_v"], out=v)
        k[..., :DN].copy_(k_nope.view(n, h, DN))
        k[..., DN:].copy_(kpe)
        w.run(s["q"], k, v.view(n, h, DV), out=out)
    return step, lambda: out, w


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--workloads", default="", help="H:batch:chunk:ctx,...")
    args = ap.parse_args()
    common.require()
    dtype, scale = torch.bfloat16, 1 / math.sqrt(DN + DR)
    workloads = ([tuple(int(x) for x in w.split(":")) for w in args.workloads.split(",") if w]
                 or (QUICK if args.quick else GRID))
    mm_tflops = common.matmul_ceiling_tflops()
    print(f"device: {common.device_name()}  dense fp16 mma {mm_tflops:.0f} TFLOP/s  bf16, page {PAGE}")
    print(f"{'H':>4} {'batch':>5} {'chunk':>5} {'ctx':>6} | {'absorbed us':>11} {'expanded us':>11} "
          f"{'exp/abs':>7} | pick      | err")
    rows = []
    gen = torch.Generator(device="cuda")
    for h, batch, chunk, ctx in workloads:
        gen.manual_seed(h * 1000003 + batch * 1009 + chunk * 31 + ctx)
        s = make_step(h, batch, chunk, ctx, dtype, gen)
        absorbed, a_out, keep_a = absorbed_fn(s, dtype, scale)
        expanded, e_out, keep_e = expanded_fn(s, dtype, scale)
        absorbed()
        expanded()
        torch.cuda.synchronize()
        a, e = a_out().float(), e_out().float()
        if not (torch.isfinite(a).all() and torch.isfinite(e).all()):
            raise SystemExit(f"non-finite output at H {h}, {batch} x {chunk} after {ctx}")
        err = float((a - e).abs().max() / e.abs().max())
        if err > 5e-2:  # bf16 through different roundings (q_abs / o_lat vs k / v)
            raise SystemExit(f"the forms disagree at H {h}, {batch} x {chunk} after {ctx}: {err:.3g}")
        times = common.interleaved({"absorbed": lambda: common.bench_graph_ms([absorbed]),
                                    "expanded": lambda: common.bench_graph_ms([expanded])},
                                   args.rounds, timer=lambda f: f())
        ta, te = common.median(times["absorbed"]) * 1e3, common.median(times["expanded"]) * 1e3
        ratio = common.paired_ratio(times, "expanded", "absorbed")
        pick = "absorbed" if ratio > 1 else "expanded"
        p = pairs(batch, chunk, ctx)
        attn_flops = {"absorbed": 2.0 * h * p * (DC + DR + DC), "expanded": 2.0 * h * p * (DN + DR + DV)}
        gemm_flops = {"absorbed": 2.0 * batch * chunk * h * DN * DC * 2,
                      "expanded": 2.0 * batch * (ctx + chunk) * DC * h * (DN + DV)}
        print(f"{h:>4} {batch:>5} {chunk:>5} {ctx:>6} | {ta:11.1f} {te:11.1f} {ratio:7.2f} | {pick:9} | {err:.1e}",
              flush=True)
        rows.append(dict(heads=h, batch=batch, chunk=chunk, ctx=ctx, absorbed_us=ta, expanded_us=te,
                         expanded_over_absorbed=ratio, pick=pick, max_rel_diff=err, attention_flops=attn_flops,
                         gemm_flops=gemm_flops, times_ms=times))
        del s, keep_a, keep_e, absorbed, expanded
        torch.cuda.empty_cache()
    path = common.save_results("mla-prefill", dict(dtype="bfloat16", page_size=PAGE, mma_tflops=mm_tflops,
                                                   rows=rows))
    print(f"results: {path}")


if __name__ == "__main__":
    main()
