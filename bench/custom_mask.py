"""What a custom mask costs: the same causal attention through the built-in
causal variant and through a packed custom mask holding the causal pattern
(FlashInfer's layout, as tree attention / speculative verification would pass
it), batch prefill on ragged KV, both kernel templates; the custom mask with
its fully masked tiles trimmed off the work items (the default) and without
(TESSERA_MASK_TRIM=0). TFLOP/s count the visible pairs (causal: half).
Usage: python bench/custom_mask.py [--seqs 1024,4096] [--batch 16] [--heads 16]"""
import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402
import tessera  # noqa: E402

D = 128


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seqs", default="1024,4096")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--heads", type=int, default=16)
    a = ap.parse_args()
    rows = []
    print("seq    backend   causal TFLOP/s   custom-mask TFLOP/s   untrimmed   ratio   max |diff|", flush=True)
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
        for backend in ("fa3", "fa2"):
            outs, ms = {}, {}
            for kind in ("causal", "custom", "untrimmed"):
                if kind == "untrimmed":
                    os.environ["TESSERA_MASK_TRIM"] = "0"  # read when the first plan() builds the kernel
                w = tessera.BatchPrefillWithRaggedKVCacheWrapper(common.workspace(), "NHD", backend=backend)
                extra = dict(causal=True) if kind == "causal" else dict(packed_custom_mask=bits)
                w.plan(qo, qo, h, h, D, q_data_type=torch.float16, **extra)
                os.environ.pop("TESSERA_MASK_TRIM", None)
                out = torch.empty_like(q)
                ms[kind] = common.bench_ms(lambda: w.run(q, k, v, out=out))
                outs[kind] = out.clone()
            tf = {kk: flops / (t * 1e-3) / 1e12 for kk, t in ms.items()}
            diff = (outs["causal"].float() - outs["custom"].float()).abs().max().item()
            same = torch.equal(outs["custom"], outs["untrimmed"])
            print(f"{L:<6} {backend:<9} {tf['causal']:14.1f} {tf['custom']:21.1f} {tf['untrimmed']:11.1f} "
                  f"{tf['custom'] / tf['causal']:7.2f} {diff:12.2e}{'' if same else '  TRIMMED != UNTRIMMED'}",
                  flush=True)
            rows.append(dict(seq=L, backend=backend, causal_tflops=tf["causal"], custom_tflops=tf["custom"],
                             untrimmed_tflops=tf["untrimmed"], max_diff=diff, trimmed_bitwise_untrimmed=same))
    common.save_results("custom-mask", dict(batch=a.batch, heads=a.heads, head_dim=D, dtype="float16", rows=rows))


if __name__ == "__main__":
    main()
