"""Does the KV source limit tensor-core decode bandwidth?

The same decode batch (one query per request) through the Hopper kernel with
the KV cache gathered from pages by cp.async (page 16 NHD and HND, shuffled
or in order; page 256 HND; one page of 4096 per request, in order, which is
cuDNN's dense [B, H, L, D] layout), and as ragged contiguous KV, which the
kernel loads with the TMA; SDPA-cuDNN on dense padded KV for reference. Outputs are checked
against SDPA before timing. Usage: python bench/decode_sources.py"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402
import decode as dec  # noqa: E402
from common import torch, tessera  # noqa: E402

D = 128
DT = torch.float16 if torch else None


def paged(lens, ps, hq, hkv, q, k_tok, v_tok, layout, shuffle=True):
    """k_tok / v_tok: [total, hkv, D] ragged tokens, laid into shuffled (or in-order) pages."""
    pages = [(n + ps - 1) // ps for n in lens]
    total = sum(pages)
    perm = torch.randperm(total, generator=torch.Generator().manual_seed(1)) if shuffle else torch.arange(total)
    k = torch.zeros(total, ps, hkv, D, dtype=DT, device="cuda")
    v = torch.zeros_like(k)
    start, p0 = 0, 0
    for n, p in zip(lens, pages):
        ids = perm[p0:p0 + p].cuda()
        kk = torch.zeros(p * ps, hkv, D, dtype=DT, device="cuda")
        vv = torch.zeros_like(kk)
        kk[:n], vv[:n] = k_tok[start:start + n], v_tok[start:start + n]
        k[ids], v[ids] = kk.view(p, ps, hkv, D), vv.view(p, ps, hkv, D)
        start += n
        p0 += p
    if layout == "HND":
        k, v = k.transpose(1, 2).contiguous(), v.transpose(1, 2).contiguous()
    indptr = torch.zeros(len(lens) + 1, dtype=torch.int32)
    indptr[1:] = torch.cumsum(torch.tensor(pages, dtype=torch.int32), 0)
    last = torch.tensor([n - (p - 1) * ps for n, p in zip(lens, pages)], dtype=torch.int32)
    w = tessera.BatchDecodeWithPagedKVCacheWrapper(common.workspace(), layout, use_tensor_cores=True)
    w.plan(indptr, perm.to(torch.int32), last, hq, hkv, D, ps, q_data_type=DT, kv_data_type=DT)
    out = torch.empty_like(q)
    return lambda: w.run(q, (k, v), out=out), out


def ragged(lens, hq, hkv, q, k_tok, v_tok):
    qo = torch.arange(len(lens) + 1, dtype=torch.int32)
    kv = torch.zeros(len(lens) + 1, dtype=torch.int32)
    kv[1:] = torch.cumsum(torch.tensor(lens, dtype=torch.int32), 0)
    w = tessera.BatchPrefillWithRaggedKVCacheWrapper(common.workspace(), "NHD")
    w.plan(qo, kv, hq, hkv, D, causal=False, q_data_type=DT)
    out = torch.empty_like(q)
    return lambda: w.run(q, k_tok, v_tok, out=out), out


def main():
    argparse.ArgumentParser(description=__doc__.split("\n\n")[0]).parse_args()
    common.require()
    ceiling = common.read_probe_best()
    print(f"# read ceiling {ceiling:.2f} TB/s; TB/s of KV bytes needed (error vs SDPA in brackets)")
    rows = []
    for (hq, hkv), dist, b in [((32, 32), "const:4096", 128), ((32, 8), "const:4096", 128),
                               ((32, 8), "const:32768", 2), ((32, 8), "uniform:512-1024", 16)]:
        lens = common.kv_lengths(dist, b, seed=b)
        nb = dec.needed_bytes(lens, hq, hkv)
        total = sum(lens)
        q = torch.randn(b, hq, D, dtype=DT, device="cuda")
        k_tok = torch.randn(total, hkv, D, dtype=DT, device="cuda")
        v_tok = torch.randn_like(k_tok)
        # Reference: SDPA on dense padded KV (the cuDNN timing uses the same tensors).
        L = max(lens)
        kd = torch.zeros(b, hkv, L, D, dtype=DT, device="cuda")
        vd = torch.zeros_like(kd)
        mask = torch.zeros(b, 1, 1, L, dtype=torch.bool, device="cuda")
        s = 0
        for i, n in enumerate(lens):
            kd[i, :, :n], vd[i, :, :n] = k_tok[s:s + n].transpose(0, 1), v_tok[s:s + n].transpose(0, 1)
            mask[i, ..., :n] = True
            s += n
        qd = q.view(b, hq, 1, D)
        rep = hq // hkv
        ref = torch.nn.functional.scaled_dot_product_attention(
            qd.float(), kd.float().repeat_interleave(rep, 1), vd.float().repeat_interleave(rep, 1),
            attn_mask=mask).view(b, hq, D)
        row = dict(hq=hq, hkv=hkv, lengths=dist, batch=b, needed_mb=nb / 1e6)
        cases = [("paged16-NHD", lambda: paged(lens, 16, hq, hkv, q, k_tok, v_tok, "NHD")),
                 ("paged16-HND", lambda: paged(lens, 16, hq, hkv, q, k_tok, v_tok, "HND")),
                 ("paged16-HND-inorder", lambda: paged(lens, 16, hq, hkv, q, k_tok, v_tok, "HND", shuffle=False)),
                 ("paged256-HND", lambda: paged(lens, 256, hq, hkv, q, k_tok, v_tok, "HND")),
                 ("ragged-TMA", lambda: ragged(lens, hq, hkv, q, k_tok, v_tok))]
        if max(lens) <= 4096:  # one page per request, in order: cuDNN's dense [B, H, L, D] layout
            cases.append(("paged4096-HND", lambda: paged(lens, 4096, hq, hkv, q, k_tok, v_tok, "HND", shuffle=False)))
        line = f"{hq}/{hkv} {dist:>16} b{b:<4}"
        for name, make in cases:
            fn, out = make()
            out.fill_(float("nan"))
            fn()
            torch.cuda.synchronize()
            err = ((out.float() - ref).norm() / ref.norm()).item()
            assert err == err and err < 1e-3, f"{name}: error {err}"
            ms = common.bench_ms(fn)
            row[name + "_us"], row[name + "_tbps"], row[name + "_err"] = ms * 1e3, nb / ms / 1e9, err
            line += f" | {name} {nb / ms / 1e9:.2f} ({err:.0e})"
        if all(n == lens[0] for n in lens):  # cuDNN only on unpadded (equal-length) batches
            from torch.nn.attention import SDPBackend, sdpa_kernel
            with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
                f = lambda: torch.nn.functional.scaled_dot_product_attention(qd, kd, vd, enable_gqa=rep > 1)  # noqa
                f()
                ms = common.bench_ms(f)
            row["cudnn_us"], row["cudnn_tbps"] = ms * 1e3, nb / ms / 1e9
            line += f" | cuDNN {nb / ms / 1e9:.2f}"
        print(line, flush=True)
        rows.append(row)
        del kd, vd, k_tok, v_tok
        torch.cuda.empty_cache()
    print("# results:", common.save_results("decode-sources", dict(read_ceiling_tbps=ceiling, rows=rows)))


if __name__ == "__main__":
    main()
