"""POD: a prompt chunk's prefill beside a decode batch, in one launch or two.

Llama-3.1-8B attention shape (32 / 8 heads of 128, fp16, page 16): one
prefill chunk of Q tokens after P cached ones (causal, contiguous K / V) and
a decode batch of B requests with L keys each (paged, shuffled pages), per
layer. Four ways, timed alike (common.bench_graph_ms: rotating input copies
replayed from one CUDA graph, interleaved rounds, medians):
  fused      tessera.PODWithPagedKVCacheWrapper.run: both plans in one
             persistent launch (the Hopper kernel on sm_90, where prompt
             chunks over 1024 queries run in a launch of their own);
  fused_fa2  the same with backend="fa2" (the FA2 template);
  two_fa2    fused_fa2's two plans launched one after the other (what the
             fusion saves on FA2);
  two_best   the two calls an engine makes without POD: the prefill on the
             ragged wrapper's pick (the Hopper kernel on sm_90), then
             BatchDecodeWithPagedKVCacheWrapper (the wrapper's kernel pick).
FlashInfer's POD module is not among the peer's prebuilt sm_90a modules (its
nvcc JIT takes minutes), so it is not timed here.
Usage: python bench/pod.py [--rounds N] [--cases Q:P:B:L,...]
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402
from common import torch, tessera  # noqa: E402

HQ, HKV, D, PAGE = 32, 8, 128, 16
CASES = ("512:0:32:2048,512:2048:64:2048,1024:0:64:2048,1024:2048:128:2048,2048:0:64:2048,2048:4096:128:2048,"
         "8192:0:32:4096")


def make_case(q_len, prefix, batch, kv_len, copies, gen):
    """`copies` input sets of one case: prefill q / k / v, decode q and a paged cache (shared page table)."""
    pages = (kv_len + PAGE - 1) // PAGE
    perm = torch.randperm(batch * pages, generator=gen).to(torch.int32)
    table = dict(indptr=torch.arange(0, batch * pages + 1, pages, dtype=torch.int32), indices=perm,
                 last=torch.full((batch,), kv_len - (pages - 1) * PAGE, dtype=torch.int32))

    def rand(*shape):
        return torch.randn(*shape, dtype=torch.float16, device="cuda")
    sets = [dict(q_p=rand(q_len, HQ, D), k_p=rand(prefix + q_len, HKV, D), v_p=rand(prefix + q_len, HKV, D),
                 q_d=rand(batch, HQ, D), cache=rand(batch * pages, 2, PAGE, HKV, D)) for _ in range(copies)]
    return table, sets


def callables(table, sets):
    pods = {}
    for backend in ("auto", "fa2"):
        pods[backend] = tessera.PODWithPagedKVCacheWrapper(common.new_workspace(256 << 20), backend=backend)
        pods[backend].plan(table["indptr"], table["indices"], table["last"], HQ, HKV, D, PAGE,
                           q_data_type=torch.float16)
    pod, pod_fa2 = pods["auto"], pods["fa2"]
    dec = tessera.BatchDecodeWithPagedKVCacheWrapper(common.new_workspace(256 << 20))
    dec.plan(table["indptr"], table["indices"], table["last"], HQ, HKV, D, PAGE, q_data_type=torch.float16)
    # single_prefill's kernel (the Hopper one on sm_90), planned here: a plan does not belong in a graph.
    q_len, kv_len = sets[0]["q_p"].shape[0], sets[0]["k_p"].shape[0]
    pre = tessera.BatchPrefillWithRaggedKVCacheWrapper(common.new_workspace(256 << 20))
    pre.plan([0, q_len], [0, kv_len], HQ, HKV, D, causal=True, q_data_type=torch.float16)
    def fused_by(w):
        return [lambda s=s: w.run(s["q_p"], s["k_p"], s["v_p"], s["q_d"], s["cache"], causal_p=True) for s in sets]
    fused, fused_fa2 = fused_by(pod), fused_by(pod_fa2)
    fused[0](), fused_fa2[0]()  # plan the prefill sides (their lengths stay)

    def two_fa2(s):
        pod_fa2._prefills["fused"][0].run(s["q_p"], s["k_p"], s["v_p"])
        pod_fa2._decode.run(s["q_d"], s["cache"])

    def two_best(s):
        pre.run(s["q_p"], s["k_p"], s["v_p"])
        dec.run(s["q_d"], s["cache"])
    return dict(fused=fused, fused_fa2=fused_fa2, two_fa2=[lambda s=s: two_fa2(s) for s in sets],
                two_best=[lambda s=s: two_best(s) for s in sets]), (pod, dec)


def check(table, s, pod, dec):
    """The fused outputs against the two separate calls (fp16 rounding apart)."""
    out_p, out_d = pod.run(s["q_p"], s["k_p"], s["v_p"], s["q_d"], s["cache"], causal_p=True)
    ref_p = tessera.single_prefill_with_kv_cache(s["q_p"], s["k_p"], s["v_p"], causal=True)
    ref_d = dec.run(s["q_d"], s["cache"])
    return max(float((out_p.float() - ref_p.float()).abs().max() / ref_p.float().abs().max()),
               float((out_d.float() - ref_d.float()).abs().max() / ref_d.float().abs().max()))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--cases", default=CASES)
    args = ap.parse_args()
    common.require()
    gen = torch.Generator().manual_seed(0)
    rows = []
    for case in args.cases.split(","):
        q_len, prefix, batch, kv_len = (int(x) for x in case.split(":"))
        one = (2 * (prefix + q_len) * HKV + 2 * q_len * HQ) * D * 2 + batch * (2 * kv_len * HKV + 2 * HQ) * D * 2
        table, sets = make_case(q_len, prefix, batch, kv_len, common.rotation_copies(one), gen)
        fns, (pod, dec) = callables(table, sets)
        err = check(table, sets[0], pod, dec)
        times = common.interleaved({n: f for n, f in fns.items()}, args.rounds,
                                   timer=lambda calls: common.bench_graph_ms(calls) * 1e3)
        row = dict(q_len=q_len, prefix=prefix, batch=batch, kv_len=kv_len, max_rel_diff=err,
                   us={n: common.median(t) for n, t in times.items()},
                   two_best_over_fused=common.paired_ratio(times, "two_best", "fused"),
                   two_fa2_over_fused_fa2=common.paired_ratio(times, "two_fa2", "fused_fa2"),
                   two_best_over_fused_fa2=common.paired_ratio(times, "two_best", "fused_fa2"),
                   entry=pod._pair.entry if pod._pair is not None else "two launches")
        rows.append(row)
        us = row["us"]
        print(f"prefill {q_len} after {prefix}, decode {batch} x {kv_len}: fused {us['fused']:.1f} us (two best "
              f"launches {us['two_best']:.1f} us, {row['two_best_over_fused']:.3f}x); FA2 fused "
              f"{us['fused_fa2']:.1f} us (its two launches {us['two_fa2']:.1f} us, "
              f"{row['two_fa2_over_fused_fa2']:.3f}x); max rel diff {err:.1e}", flush=True)
    common.save_results("pod", dict(heads=[HQ, HKV], head_dim=D, page_size=PAGE, dtype="float16", rows=rows))


if __name__ == "__main__":
    main()
