"""What a custom mask costs: the same causal attention through the built-in
causal variant and through a packed custom mask holding the causal pattern
(FlashInfer's layout, as tree attention / speculative verification would pass
it), batch prefill on ragged KV, both kernel templates, timed in interleaved
rounds. The custom-mask runs trim each work item to the KV tiles its rows
can see (PrefillOptions::trim_masked_tiles, on by default). TFLOP/s count
the visible pairs (causal: half). Results: bench/results/custom-mask.json.
Usage: python bench/custom_mask.py [--seqs 1024,4096] [--batch 16] [--heads 16] [--rounds 3]"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402
from common import torch, tessera  # noqa: E402

D = 128


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seqs", default="1024,4096")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=3, help="interleaved timing rounds (medians)")
    a = ap.parse_args()
    common.require()
    rows = []
    print("seq    backend   causal TFLOP/s   custom-mask TFLOP/s   ratio (paired)   max |diff|", flush=True)
    for L in (int(s) for s in a.seqs.split(",")):
        b, h = a.batch, a.heads
        if b * L * L >= 2**31:  # segment_packbits (as FlashInfer's) takes int32 bit offsets
            print(f"{L:<6} skipped: {b} x {L}^2 mask bits pass int32 offsets", flush=True)
            continue
        qo = torch.arange(0, b + 1, dtype=torch.int32) * L
        q = torch.randn(b * L, h, D, dtype=torch.float16, device="cuda")
        k, v = torch.randn_like(q), torch.randn_like(q)
        i = torch.arange(L, device="cuda")
        causal = (i[None, :] <= i[:, None]).flatten().repeat(b)
        bits, _ = tessera.segment_packbits(causal, (torch.arange(0, b + 1, device="cuda") * L * L).to(torch.int32),
                                           bitorder="little")
        flops = 4 * b * h * D * L * (L + 1) / 2
        for backend in (("fa3", "fa2") if common.is_hopper() else ("fa2",)):
            fns, outs = {}, {}
            for kind in ("causal", "custom"):  # each its own workspace: both plans live side by side
                w = tessera.BatchPrefillWithRaggedKVCacheWrapper(common.new_workspace(), "NHD", backend=backend)
                extra = dict(causal=True) if kind == "causal" else dict(packed_custom_mask=bits)
                w.plan(qo, qo, h, h, D, q_data_type=torch.float16, **extra)
                outs[kind] = torch.empty_like(q)
                fns[kind] = (lambda w=w, o=outs[kind]: w.run(q, k, v, out=o))
                fns[kind]()
            diff = (outs["causal"].float() - outs["custom"].float()).abs().max().item()
            if not diff < 2e-3:
                raise SystemExit(f"{backend} seq {L}: the custom mask differs from the causal variant by {diff:.2e}")
            times = common.interleaved(fns, a.rounds)
            tf = {kk: flops / (common.median(t) * 1e-3) / 1e12 for kk, t in times.items()}
            paired = common.paired_ratio(times, "causal", "custom")
            print(f"{L:<6} {backend:<9} {tf['causal']:14.1f} {tf['custom']:21.1f} {paired:16.2f} {diff:12.2e}",
                  flush=True)
            rows.append(dict(seq=L, backend=backend, causal_tflops=tf["causal"], custom_tflops=tf["custom"],
                             custom_vs_causal_paired=paired, max_diff=diff, rounds_ms=times))
            del fns, outs
    path = common.save_results("custom-mask", dict(batch=a.batch, heads=a.heads, head_dim=D, dtype="float16", rows=rows))
    print("# results:", path)


if __name__ == "__main__":
    main()
