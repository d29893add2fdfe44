"""Batch prefill benchmark: Tessera's tensor-core prefill vs PyTorch SDPA
(flash and cuDNN backends) and compiled FlexAttention, side by side.

  (a) paper Table-1 setting: batch 16, 16 heads, head dim 128, causal, fp16,
      sequence 512..16384 (all peers on dense [B, H, L, D]);
  (b) batch prefill with constant / uniform / skewed (Zipf) lengths, causal
      (SDPA on inputs padded to the longest request, its best case);
  (c) chunked prefill: query chunks of 128 / 512 against 4k..32k KV (causal,
      bottom-right); SDPA runs without a mask (its best case);
  (d) dense (ragged) vs paged (page size 1 and 16) vs BSR (Bc = 1) KV at the
      same shapes (paper Appendix B: sparse gathering overhead).
TFLOP/s count causal attention as half of the full square. Tessera runs with
each backend given (fa2: the mma.sync template; fa3: the Hopper wgmma
template, sm_90 only); rows carry the backend. FlashInfer is not run (see
bench/decode.py for why).
Part (a) times all peers of a length in interleaved rounds (--rounds, default
3) and reports medians.
Usage: python bench/prefill.py [--quick] [--no-flex] [--backends fa2,fa3] [--parts abcd] [--head-dim 128] [--rounds 3]
(--head-dim 64 / 256 runs every part at that head dim; results go to prefill-*-dN-*.json)
"""
import argparse
import os
import statistics
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
import common  # noqa: E402
import tessera  # noqa: E402

D = 128
DT = torch.float16
WS = None


def workspace():
    global WS
    if WS is None:
        WS = torch.empty(512 << 20, dtype=torch.uint8, device="cuda")
    return WS


def flops(q_lens, kv_lens, heads, causal):
    total = 0
    for q, kv in zip(q_lens, kv_lens):
        if causal:  # row i sees kv - q + i + 1 keys
            total += sum(max(0, min(kv, kv - q + i + 1)) for i in range(q)) if q < 4096 else q * kv - q * (q - 1) / 2
        else:
            total += q * kv
    return 4 * total * heads * D


def tflops(fl, ms):
    return fl / (ms * 1e-3) / 1e12


def tessera_ragged(q_lens, kv_lens, hq, hkv, causal, backend="auto", cta_q=0):
    return common.bench_ms(tessera_ragged_fn(q_lens, kv_lens, hq, hkv, causal, backend, cta_q))


def tessera_ragged_fn(q_lens, kv_lens, hq, hkv, causal, backend="auto", cta_q=0, ws=None):
    """A planned ragged prefill as a callable (one run per call). Callables
    that live side by side need their own workspace `ws`: a plan lives in its
    workspace, and a later plan into the same one replaces it."""
    qo = torch.tensor([0] + q_lens).cumsum(0).to(torch.int32)
    kvp = torch.tensor([0] + kv_lens).cumsum(0).to(torch.int32)
    q = torch.randn(int(qo[-1]), hq, D, dtype=DT, device="cuda")
    k = torch.randn(int(kvp[-1]), hkv, D, dtype=DT, device="cuda")
    v = torch.randn_like(k)
    w = tessera.BatchPrefillWithRaggedKVCacheWrapper(workspace() if ws is None else ws, "NHD", backend=backend)
    w._cta_q = cta_q  # Tessera-only knob: 0 = the heuristic's query tile
    w.plan(qo, kvp, hq, hkv, D, causal=causal, q_data_type=DT)
    out = torch.empty_like(q)
    return lambda: w.run(q, k, v, out=out)


def tessera_paged(q_lens, kv_lens, hq, hkv, causal, page_size, backend="auto"):
    qo = torch.tensor([0] + q_lens).cumsum(0).to(torch.int32)
    pages = [(n + page_size - 1) // page_size for n in kv_lens]
    indptr = torch.tensor([0] + pages).cumsum(0).to(torch.int32)
    indices = torch.randperm(sum(pages)).to(torch.int32)
    last = torch.tensor([n - (p - 1) * page_size for n, p in zip(kv_lens, pages)], dtype=torch.int32)
    q = torch.randn(int(qo[-1]), hq, D, dtype=DT, device="cuda")
    kc = torch.randn(sum(pages), page_size, hkv, D, dtype=DT, device="cuda")
    vc = torch.randn_like(kc)
    w = tessera.BatchPrefillWithPagedKVCacheWrapper(workspace(), "NHD", backend=backend)
    w.plan(qo, indptr, indices, last, hq, hkv, D, page_size, causal=causal, q_data_type=DT)
    out = torch.empty_like(q)
    return common.bench_ms(lambda: w.run(q, (kc, vc), out=out))


def tessera_bsr_vector(q_len, kv_len, batch, hq, hkv, backend="auto"):
    """Each request as BSR block rows of Br = 16 queries over Bc = 1 columns
    (vector sparsity), its KV columns shuffled: the same work as dense."""
    br = 16
    rows = batch * q_len // br
    cols = torch.randperm(batch * kv_len).to(torch.int32)
    indptr = torch.arange(0, rows + 1, dtype=torch.int32) * kv_len
    indices = torch.cat([cols[(r * br // q_len) * kv_len:(r * br // q_len + 1) * kv_len] for r in range(rows)])
    q = torch.randn(batch * q_len, hq, D, dtype=DT, device="cuda")
    k = torch.randn(batch * kv_len, hkv, D, dtype=DT, device="cuda")
    v = torch.randn_like(k)
    w = tessera.BlockSparseAttentionWrapper(workspace(), backend=backend)
    w.plan(indptr, indices, batch * q_len, batch * kv_len, br, 1, hq, hkv, D, q_data_type=DT)
    out = torch.empty_like(q)
    return common.bench_ms(lambda: w.run(q, k, v, out=out))


def sdpa(b, hq, hkv, lq, lkv, causal, backend):
    fn = sdpa_fn(b, hq, hkv, lq, lkv, causal, backend)
    return fn and common.bench_ms(fn)


def sdpa_fn(b, hq, hkv, lq, lkv, causal, backend):
    """SDPA with one backend forced, as a callable; None if it refuses the shape."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    be = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION}[backend]
    q = torch.randn(b, hq, lq, D, dtype=DT, device="cuda")
    k = torch.randn(b, hkv, lkv, D, dtype=DT, device="cuda")
    v = torch.randn_like(k)
    def fn():
        with sdpa_kernel([be]):
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=hq != hkv)
    try:
        fn()
        return fn
    except RuntimeError:
        return None


_flex = None


def flex(b, hq, hkv, lq, lkv, causal):
    fn = flex_fn(b, hq, hkv, lq, lkv, causal)
    return fn and common.bench_ms(fn)


def flex_fn(b, hq, hkv, lq, lkv, causal):
    """Compiled FlexAttention with the equivalent block mask, as a callable; None if it fails."""
    global _flex
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention
    if _flex is None:
        torch._dynamo.config.cache_size_limit = 1000
        torch._dynamo.config.accumulated_cache_size_limit = 4000
        _flex = torch.compile(flex_attention)
    off = lkv - lq
    mask = (lambda bb, h, qi, kv: kv <= qi + off) if causal else (lambda bb, h, qi, kv: kv >= 0)  # noqa: E731
    bm = create_block_mask(mask, None, None, lq, lkv, device="cuda")
    q = torch.randn(b, hq, lq, D, dtype=DT, device="cuda")
    k = torch.randn(b, hkv, lkv, D, dtype=DT, device="cuda")
    v = torch.randn_like(k)
    try:
        fn = lambda: _flex(q, k, v, block_mask=bm, enable_gqa=hq != hkv)  # noqa: E731
        fn()
        return fn
    except Exception:
        return None


def ratio(peer, ms):
    return f"{peer / ms:6.2f}x" if peer else f"{'-':>7}"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--no-flex", action="store_true")
    ap.add_argument("--parts", default="abcd", help="which of the parts (a)-(d) to run")
    ap.add_argument("--backends", default="fa2,fa3" if torch.cuda.get_device_capability()[0] == 9 else "fa2")
    ap.add_argument("--head-dim", type=int, default=128, choices=[64, 128, 256])
    ap.add_argument("--rounds", type=int, default=3, help="part (a): timing rounds, peers interleaved (medians)")
    args = ap.parse_args()
    global D
    D = args.head_dim
    ap_parts = args.parts
    backends = args.backends.split(",")
    peak = common.matmul_ceiling_tflops()
    print(f"# {common.device_name()}: dense fp16 matmul ceiling {peak:.0f} TFLOP/s")
    rows = []

    print(f"# (a) Table-1: batch 16, 16 heads, d {D}, causal")
    print(f"{'seq':>6} {'be':>3} {'us':>9} {'TFLOP/s':>8} {'ceil':>5} | {'sdpa-fl':>7} {'cudnn':>7} {'flex':>7}")
    seqs = ([512, 1024, 2048, 4096, 8192, 16384] if not args.quick else [1024, 4096]) if "a" in ap_parts else []
    own_ws = {be: torch.empty(512 << 20, dtype=torch.uint8, device="cuda") for be in backends} if seqs else {}
    for L in seqs:
        fl = 4 * 16 * 16 * D * L * L / 2
        # Every peer timed in interleaved rounds, each time the median of its
        # rounds: at 8k-16k one call takes 10-60 ms and the clocks drift with
        # temperature, so timing peers one after another favoured whichever
        # ran first (same-build runs of ours moved 8-12% with the order).
        fns = {"flash": sdpa_fn(16, 16, 16, L, L, True, "flash"), "cudnn": sdpa_fn(16, 16, 16, L, L, True, "cudnn"),
               "flex": None if args.no_flex else flex_fn(16, 16, 16, L, L, True)}
        fns.update({be: tessera_ragged_fn([L] * 16, [L] * 16, 16, 16, True, backend=be, ws=own_ws[be]) for be in backends})
        fns = {n: f for n, f in fns.items() if f is not None}
        times = {n: [] for n in fns}
        for r in range(args.rounds):
            order = list(fns)
            order = order[r % len(order):] + order[:r % len(order)]  # rotate who goes first
            for n in order:
                times[n].append(common.bench_ms(fns[n]))
        med = {n: statistics.median(t) for n, t in times.items()}
        fa, cd, fx = med.get("flash"), med.get("cudnn"), med.get("flex")
        for be in backends:
            ms = med[be]
            # Paired ratios: each round's peer time over ours from the same
            # round, then the median. The power-capped clock drifts with the
            # GPU's temperature from round to round (+-10% at 8k-16k), which
            # a ratio of two medians does not cancel.
            paired = {n: statistics.median(a / b for a, b in zip(times[n], times[be]))
                      for n in ("flash", "cudnn", "flex") if n in times}
            rows.append(dict(part="a", backend=be, seq=L, us=ms * 1e3, tflops=tflops(fl, ms), sdpa_flash_us=fa and fa * 1e3,
                             sdpa_cudnn_us=cd and cd * 1e3, flex_us=fx and fx * 1e3, rounds_ms=times, paired_ratio=paired))
            print(f"{L:>6} {be} {ms * 1e3:9.1f} {tflops(fl, ms):8.1f} {tflops(fl, ms) / peak:5.0%} | {ratio(fa, ms)} {ratio(cd, ms)} "
                  f"{ratio(fx, ms)} | paired cudnn {paired.get('cudnn', float('nan')):.2f}x", flush=True)

    print("# (b) batch prefill, batch 16, 32/8 heads, causal (SDPA padded)")
    for dist in ["const:1024", "uniform:512-1024", "zipf:1024"] if "b" in ap_parts else []:
        lens = common.kv_lengths(dist, 16, seed=3)
        fl = flops(lens, lens, 32, True)
        fa, cd = sdpa(16, 32, 8, max(lens), max(lens), True, "flash"), sdpa(16, 32, 8, max(lens), max(lens), True, "cudnn")
        for be in backends:
            ms = tessera_ragged(lens, lens, 32, 8, True, backend=be)
            rows.append(dict(part="b", backend=be, lengths=dist, us=ms * 1e3, tflops=tflops(fl, ms),
                             sdpa_flash_us=fa and fa * 1e3, sdpa_cudnn_us=cd and cd * 1e3))
            print(f"{dist:>16} {be} {ms * 1e3:9.1f} us {tflops(fl, ms):7.1f} TFLOP/s | sdpa-flash {ratio(fa, ms)} cudnn {ratio(cd, ms)}",
                  flush=True)

    print("# (c) chunked prefill, batch 4, 32/8 heads, causal bottom-right, paged (page 16)")
    for qc in [128, 512] if "c" in ap_parts else []:
        for kv in ([4096, 16384, 32768] if not args.quick else [16384]):
            fl = flops([qc] * 4, [kv] * 4, 32, True)
            fa, cd = sdpa(4, 32, 8, qc, kv, False, "flash"), sdpa(4, 32, 8, qc, kv, False, "cudnn")
            for be in backends:
                ms = tessera_paged([qc] * 4, [kv] * 4, 32, 8, True, 16, backend=be)
                rows.append(dict(part="c", backend=be, q_chunk=qc, kv=kv, us=ms * 1e3, tflops=tflops(fl, ms),
                                 sdpa_flash_us=fa and fa * 1e3, sdpa_cudnn_us=cd and cd * 1e3))
                print(f"q {qc:>4} kv {kv:>6} {be} {ms * 1e3:9.1f} us {tflops(fl, ms):7.1f} TFLOP/s | sdpa-flash {ratio(fa, ms)} "
                      f"cudnn {ratio(cd, ms)}", flush=True)

    print("# (d) dense vs paged vs BSR (Bc = 1), 32/32 heads, non-causal")
    for b, L in ([(8, 2048), (4, 8192)] if not args.quick else [(8, 2048)]) if "d" in ap_parts else []:
        for be in backends:
            dense = tessera_ragged([L] * b, [L] * b, 32, 32, False, backend=be)
            p1 = tessera_paged([L] * b, [L] * b, 32, 32, False, 1, backend=be)
            p16 = tessera_paged([L] * b, [L] * b, 32, 32, False, 16, backend=be)
            bsr = tessera_bsr_vector(L, L, b, 32, 32, backend=be)
            fl = 4 * b * 32 * D * L * L
            rows.append(dict(part="d", backend=be, batch=b, seq=L, dense_us=dense * 1e3, paged1_us=p1 * 1e3,
                             paged16_us=p16 * 1e3, bsr1_us=bsr * 1e3))
            print(f"B {b} L {L} {be}: dense {tflops(fl, dense):.0f}, paged-1 {tflops(fl, p1):.0f} ({p1 / dense - 1:+.0%}), "
                  f"paged-16 {tflops(fl, p16):.0f} ({p16 / dense - 1:+.0%}), BSR Bc=1 {tflops(fl, bsr):.0f} "
                  f"({bsr / dense - 1:+.0%}) TFLOP/s", flush=True)
    # A partial run is saved under its own name (prefill-a-...), never over a full one.
    kind = "prefill" if ap_parts == "abcd" and not args.quick else "prefill-" + ("quick" if args.quick else ap_parts)
    if D != 128:
        kind += f"-d{D}"
    path = common.save_results(kind, dict(matmul_ceiling_tflops=peak, head_dim=D, dtype="float16", rows=rows))
    print(f"# results: {path}")


if __name__ == "__main__":
    main()
