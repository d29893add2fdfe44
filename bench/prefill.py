"""Batch prefill benchmark: Tessera's tensor-core prefill vs PyTorch SDPA
(flash and cuDNN backends), compiled FlexAttention and FlashInfer when it is
installed, side by side in one process.

  (a) paper Table-1 setting: batch 16, 16 heads, head dim 128, causal, fp16,
      sequence 512..16384 (all peers on dense [B, H, L, D]); every peer of a
      length timed in interleaved rounds (--rounds), medians, and ratios
      paired by round;
  (b) batch prefill with constant / uniform / skewed (Zipf) lengths, causal
      (SDPA on inputs padded to the longest request, its best case);
  (c) chunked prefill: query chunks of 128 / 512 against 4k..32k KV (causal,
      bottom-right); SDPA runs without a mask (its best case);
  (d) dense (ragged) vs paged (page size 1 and 16) vs BSR (Bc = 1) KV at the
      same shapes (paper Appendix B: sparse gathering overhead).
TFLOP/s count causal attention as half of the full square. Tessera runs with
each backend given (fa2: the mma.sync template; fa3: the Hopper wgmma kernel,
sm_90 only); rows carry the backend. Results: prefill.json (every part, head
dim 128), else prefill-PARTS[-dN].json, or NAME.json with --save-as NAME.

Other modes:
  --ab CFG ...  settings of one kernel template (--backend) timed in
                interleaved rounds on the Table-1 shape (--seqs, --window N for
                a causal sliding window), each checked against SDPA first;
                CFG = NAME:KEY=VALUE,... with KEY cta_q (16, 32, 64, 128: the
                query tile; 0 = heuristic) or group_heads (0 auto, 1 a plan
                per KV head, 2 heads grouped); --peers flash,cudnn,flashinfer
                adds SDPA / FlashInfer (on the same template: --backend fa2
                times its fa2 kernel) to the rounds with per-round ratios;
                results: prefill-ab.json
  --fp8         the Table-1 shape (--seqs) with an fp8 (e4m3) KV cache beside
                fp16 (the default pick and fa2), in interleaved rounds; speed
                ratios paired by round; results: prefill-fp8.json
  --single      one configuration run a few times (--seq, --kv, --sdpa): the
                target for a profiler (bench/ncu_prefill.sh) or a quick timing;
                --sdpa flash / cudnn / flashinfer times that peer instead
                (FlashInfer on the --backend template)

Usage: python bench/prefill.py [--quick] [--no-flex] [--backends fa2,fa3] [--parts abcd] [--head-dim 128] [--rounds 3]
       python bench/prefill.py --ab base: --ab q64:cta_q=64 [--seqs 1024,4096] [--window 1024] [--peers flash]
       python bench/prefill.py --fp8 [--seqs 512,1024,2048,4096,8192,16384]
       python bench/prefill.py --single [--seq 4096] [--kv ragged|paged:16|bsr] [--backend fa3] [--sdpa flash]
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402
from common import torch, tessera  # noqa: E402

D = 128
DT = torch.float16 if torch else None


def workspace():
    return common.workspace()


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


def tessera_ragged_fn(q_lens, kv_lens, hq, hkv, causal, backend="auto", cta_q=0, ws=None, window=-1, kv_dtype=None,
                      fp8_mma=False, group_heads=0):
    """A planned ragged prefill as a callable (one run per call). Callables
    that live side by side need their own workspace `ws`. kv_dtype: the KV
    dtype (None: fp16 like q; torch.float8_e4m3fn: an fp8 cache); fp8_mma:
    an fp8 cache's GEMMs on fp8 tensor cores (PrefillOptions::fp8_mma);
    group_heads: PrefillOptions::group_heads (0 auto, 1 one plan per KV head,
    2 heads grouped)."""
    qo = torch.tensor([0] + q_lens).cumsum(0).to(torch.int32)
    kvp = torch.tensor([0] + kv_lens).cumsum(0).to(torch.int32)
    kv_dtype = kv_dtype or DT
    q = torch.randn(int(qo[-1]), hq, D, dtype=DT, device="cuda")
    k = torch.randn(int(kvp[-1]), hkv, D, dtype=DT, device="cuda").to(kv_dtype)
    v = torch.randn(int(kvp[-1]), hkv, D, dtype=DT, device="cuda").to(kv_dtype)
    w = tessera.BatchPrefillWithRaggedKVCacheWrapper(workspace() if ws is None else ws, "NHD", backend=backend)
    w._cta_q = cta_q  # Tessera-only knob: 0 = the heuristic's query tile
    w._fp8_mma = fp8_mma
    w._group_heads = group_heads
    w.plan(qo, kvp, hq, hkv, D, causal=causal, window_left=window, q_data_type=DT, kv_data_type=kv_dtype)
    out = torch.empty_like(q)
    fn = lambda: w.run(q, k, v, out=out)  # noqa: E731
    fn.inputs = (w, q, k, v, out)
    return fn


def tessera_ragged(q_lens, kv_lens, hq, hkv, causal, backend="auto", cta_q=0):
    return common.bench_ms(tessera_ragged_fn(q_lens, kv_lens, hq, hkv, causal, backend, cta_q))


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


def sdpa_fn(b, hq, hkv, lq, lkv, causal, backend):
    return common.sdpa_fn(b, hq, hkv, lq, lkv, causal, backend, D, DT)


def sdpa(b, hq, hkv, lq, lkv, causal, backend):
    fn = sdpa_fn(b, hq, hkv, lq, lkv, causal, backend)
    return fn and common.bench_ms(fn)


def flex_fn(b, hq, hkv, lq, lkv, causal):
    off = lkv - lq
    mask = (lambda bb, h, qi, kv: kv <= qi + off) if causal else (lambda bb, h, qi, kv: kv >= 0)  # noqa: E731
    return common.flex_fn(b, hq, hkv, lq, lkv, mask, d=D, dtype=DT)


def flashinfer_fn(q_lens, kv_lens, hq, hkv, causal, backend=None):
    """FlashInfer's ragged prefill on template backend ("fa2" / "fa3"; anything else: its default)."""
    backend = backend if backend in ("fa2", "fa3") else None
    fi = common.flashinfer()
    if fi is None:
        return None
    try:
        return common.ragged_prefill_fn(fi, q_lens, kv_lens, hq, hkv, causal, D, backend=backend,
                                        ws=common.new_workspace(256 << 20), dtype=DT)
    except Exception as e:  # a peer that refuses a shape is reported, not fatal
        print(f"# flashinfer: {type(e).__name__}: {str(e)[:80]}", flush=True)
        return None


def ratio(peer, ms):
    return f"{peer / ms:6.2f}x" if peer else f"{'-':>7}"


def table1(args, backends, peak):
    rows = []
    print(f"# (a) Table-1: batch 16, 16 heads, d {D}, causal")
    print(f"{'seq':>6} {'be':>3} {'us':>9} {'TFLOP/s':>8} {'ceil':>5} | {'sdpa-fl':>7} {'cudnn':>7} {'flex':>7} {'fi':>7}")
    seqs = [1024, 4096] if args.quick else [512, 1024, 2048, 4096, 8192, 16384]
    own_ws = {be: common.new_workspace() for be in backends}
    for L in seqs:
        fl = 4 * 16 * 16 * D * L * L / 2
        fns = {"flash": sdpa_fn(16, 16, 16, L, L, True, "flash"), "cudnn": sdpa_fn(16, 16, 16, L, L, True, "cudnn"),
               "flex": None if args.no_flex else flex_fn(16, 16, 16, L, L, True),
               "flashinfer": flashinfer_fn([L] * 16, [L] * 16, 16, 16, True)}
        fns.update({be: tessera_ragged_fn([L] * 16, [L] * 16, 16, 16, True, backend=be, ws=own_ws[be]) for be in backends})
        fns = {n: f for n, f in fns.items() if f is not None}
        times = common.interleaved(fns, args.rounds)
        med = {n: common.median(t) for n, t in times.items()}
        fa, cd, fx, fi = (med.get(n) for n in ("flash", "cudnn", "flex", "flashinfer"))
        for be in backends:
            ms = med[be]
            paired = {n: common.paired_ratio(times, n, be) for n in ("flash", "cudnn", "flex", "flashinfer") if n in times}
            rows.append(dict(part="a", backend=be, seq=L, us=ms * 1e3, tflops=tflops(fl, ms), sdpa_flash_us=fa and fa * 1e3,
                             sdpa_cudnn_us=cd and cd * 1e3, flex_us=fx and fx * 1e3, flashinfer_us=fi and fi * 1e3,
                             rounds_ms=times, paired_ratio=paired))
            print(f"{L:>6} {be} {ms * 1e3:9.1f} {tflops(fl, ms):8.1f} {tflops(fl, ms) / peak:5.0%} | {ratio(fa, ms)} "
                  f"{ratio(cd, ms)} {ratio(fx, ms)} {ratio(fi, ms)} | paired cudnn {paired.get('cudnn', float('nan')):.2f}x",
                  flush=True)
    return rows


def parts(args):
    backends = args.backends.split(",")
    peak = common.matmul_ceiling_tflops()
    print(f"# {common.device_name()}: dense fp16 matmul ceiling {peak:.0f} TFLOP/s")
    rows = table1(args, backends, peak) if "a" in args.parts else []

    print("# (b) batch prefill, batch 16, 32/8 heads, causal (SDPA padded)")
    for dist in ["const:1024", "uniform:512-1024", "zipf:1024"] if "b" in args.parts else []:
        lens = common.kv_lengths(dist, 16, seed=3)
        fl = flops(lens, lens, 32, True)
        fa, cd = sdpa(16, 32, 8, max(lens), max(lens), True, "flash"), sdpa(16, 32, 8, max(lens), max(lens), True, "cudnn")
        for be in backends:
            ms = tessera_ragged(lens, lens, 32, 8, True, backend=be)
            rows.append(dict(part="b", backend=be, lengths=dist, us=ms * 1e3, tflops=tflops(fl, ms),
                             sdpa_flash_us=fa and fa * 1e3, sdpa_cudnn_us=cd and cd * 1e3))
            print(f"{dist:>16} {be} {ms * 1e3:9.1f} us {tflops(fl, ms):7.1f} TFLOP/s | sdpa-flash {ratio(fa, ms)} "
                  f"cudnn {ratio(cd, ms)}", flush=True)

    print("# (c) chunked prefill, batch 4, 32/8 heads, causal bottom-right, paged (page 16)")
    for qc in [128, 512] if "c" in args.parts else []:
        for kv in ([4096, 16384, 32768] if not args.quick else [16384]):
            fl = flops([qc] * 4, [kv] * 4, 32, True)
            fa, cd = sdpa(4, 32, 8, qc, kv, False, "flash"), sdpa(4, 32, 8, qc, kv, False, "cudnn")
            for be in backends:
                ms = tessera_paged([qc] * 4, [kv] * 4, 32, 8, True, 16, backend=be)
                rows.append(dict(part="c", backend=be, q_chunk=qc, kv=kv, us=ms * 1e3, tflops=tflops(fl, ms),
                                 sdpa_flash_us=fa and fa * 1e3, sdpa_cudnn_us=cd and cd * 1e3))
                print(f"q {qc:>4} kv {kv:>6} {be} {ms * 1e3:9.1f} us {tflops(fl, ms):7.1f} TFLOP/s | sdpa-flash "
                      f"{ratio(fa, ms)} cudnn {ratio(cd, ms)}", flush=True)

    print("# (d) dense vs paged vs BSR (Bc = 1), 32/32 heads, non-causal")
    for b, L in ([(8, 2048), (4, 8192)] if not args.quick else [(8, 2048)]) if "d" in args.parts else []:
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
    # A partial run is saved under its own name (prefill-a, prefill-quick, ...), never over a full one.
    kind = "prefill" if args.parts == "abcd" and not args.quick else "prefill-" + ("quick" if args.quick else args.parts)
    if D != 128:
        kind += f"-d{D}"
    return common.save_results(args.save_as or kind, dict(matmul_ceiling_tflops=peak, head_dim=D, dtype="float16", rows=rows))


def ab_flops(L, b, h, window):
    if window < 0:
        return flops([L] * b, [L] * b, h, True)
    keys = sum(min(i + 1, window + 1) for i in range(L))  # row i sees keys max(0, i - window) .. i
    return 4 * keys * b * h * D


def ab_check(fn, L, b, h, window):
    """Max error / reference norm of one run against SDPA in float32 (causal, + window)."""
    w, q, k, v, out = fn.inputs
    out.fill_(float("nan"))
    fn()
    t = lambda x: x.view(b, L, h, D).transpose(1, 2)  # noqa: E731
    i = torch.arange(L, device="cuda")
    keep = i[None, :] <= i[:, None]
    if window >= 0:
        keep &= i[None, :] >= i[:, None] - window
    ref = torch.nn.functional.scaled_dot_product_attention(t(q).float(), t(k).float(), t(v).float(), attn_mask=keep)
    ref = ref.transpose(1, 2).reshape(b * L, h, D)
    return ((out.float() - ref).abs().max() / ref.norm(dim=-1).max()).item()


def ab(args):
    """Settings of one template in interleaved rounds (each its own workspace), SDPA peers in the same rounds."""
    configs = [common.parse_config(c, ("cta_q", "group_heads")) for c in args.ab]
    peers = [x.strip() for x in args.peers.split(",") if x.strip()]
    if any(x not in ("flash", "cudnn", "flashinfer") for x in peers):
        raise SystemExit(f"--peers: expected flash, cudnn and/or flashinfer, got {args.peers!r}")
    if peers and args.window >= 0:
        raise SystemExit("--peers: the peers time the causal mask only (no --window)")
    seqs = [int(s) for s in args.seqs.split(",")]
    b, h = args.batch, args.heads
    wss = {n: common.new_workspace() for n, _ in configs}
    errors, rows = {}, []
    col = {x: x if x == "flashinfer" else "sdpa-" + x for x in peers}  # the peers' columns
    names = [n for n, _ in configs] + list(col.values())
    print("TFLOP/s (median of rounds)\nseq      " + "".join(f"{n:>12s}" for n in names))
    for L in seqs:
        fns = {n: tessera_ragged_fn([L] * b, [L] * b, h, h, True, args.backend, int(o.get("cta_q", 0)), wss[n],
                                    args.window, group_heads=int(o.get("group_heads", 0))) for n, o in configs}
        for n, fn in fns.items():
            if L == seqs[0]:
                errors[n] = ab_check(fn, L, b, h, args.window)
                print(f"check {n}: error {errors[n]:.2e}; grid {getattr(fn.inputs[0], 'grid', None)}", flush=True)
                if not errors[n] < 1e-3:
                    raise SystemExit(f"FAILED: {n} at seq {L}: max error / reference norm = {errors[n]}")
        for x in peers:
            fns[col[x]] = (flashinfer_fn([L] * b, [L] * b, h, h, True, args.backend) if x == "flashinfer"
                           else sdpa_fn(b, h, h, L, L, True, x))
        times = common.interleaved({n: f for n, f in fns.items() if f is not None}, args.rounds)
        fl = ab_flops(L, b, h, args.window)
        tf = {n: tflops(fl, common.median(times[n])) if n in times else float("nan") for n in names}
        row = dict(seq=L, tflops=tf, ms_rounds=times)
        line = f"{L:<9d}" + "".join(f"{tf[n]:12.1f}" for n in names)
        for x in peers:  # speed over the peer's, paired by round
            if col[x] in times:
                row["vs_" + x] = {n: common.paired_ratio(times, col[x], n) for n, _ in configs}
                line += f"   vs {x}: " + " ".join(f"{n} {r:.3f}" for n, r in row["vs_" + x].items())
        rows.append(row)
        print(line, flush=True)
        del fns
        torch.cuda.empty_cache()
    return common.save_results(args.save_as or "prefill-ab", dict(
        setting=dict(batch=b, heads=h, head_dim=D, dtype="float16", causal=True, backend=args.backend,
                     window_left=args.window, rounds=args.rounds, peers=peers),
        configs=dict(configs), check_error=errors, rows=rows))


def fp8(args):
    """The Table-1 shape with an fp8 (e4m3) KV cache beside fp16 (each as the default pick and on the FA2 template,
    and fp8 on fp8 tensor cores: fp8-mma), interleaved rounds; each checked against SDPA in float32 on the
    (dequantized) inputs first (fp8-mma within its own bound: it quantizes q and P too)."""
    e4m3 = torch.float8_e4m3fn
    configs = {"fp16": ("auto", None, False), "fp16-fa2": ("fa2", None, False), "fp8": ("auto", e4m3, False),
               "fp8-fa2": ("fa2", e4m3, False), "fp8-mma": ("auto", e4m3, True)}
    bounds = {"fp8-mma": 4e-2}
    seqs = [int(s) for s in args.seqs.split(",")]
    b, h = args.batch, args.heads
    wss = {n: common.new_workspace() for n in configs}
    rows, errors = [], {}
    print("TFLOP/s (median of rounds); ratios paired by round\nseq      " + "".join(f"{n:>10s}" for n in configs))
    for L in seqs:
        fns = {n: tessera_ragged_fn([L] * b, [L] * b, h, h, True, be, 0, wss[n], -1, kd, mma)
               for n, (be, kd, mma) in configs.items()}
        for n, fn in fns.items():
            err = ab_check(fn, L, b, h, -1)
            errors.setdefault(n, []).append(err)
            if not err < bounds.get(n, 1e-3):
                raise SystemExit(f"FAILED: {n} at seq {L}: max error / reference norm = {err}")
        times = common.interleaved(fns, args.rounds)
        fl = ab_flops(L, b, h, -1)
        tf = {n: tflops(fl, common.median(times[n])) for n in configs}
        speed = {f"fp8/{n}": common.paired_ratio(times, n, "fp8") for n in ("fp16", "fp16-fa2")}
        speed["fp8-fa2/fp16-fa2"] = common.paired_ratio(times, "fp16-fa2", "fp8-fa2")
        speed["fp8-mma/fp16"] = common.paired_ratio(times, "fp16", "fp8-mma")
        rows.append(dict(seq=L, tflops=tf, speed_ratio=speed, ms_rounds=times))
        print(f"{L:<9d}" + "".join(f"{tf[n]:10.1f}" for n in configs) + "   speed " +
              " ".join(f"{k} {r:.3f}" for k, r in speed.items()), flush=True)
        del fns
        torch.cuda.empty_cache()
    return common.save_results(args.save_as or "prefill-fp8", dict(
        setting=dict(batch=b, heads=h, head_dim=D, q_dtype="float16", kv_dtype="float8_e4m3fn", causal=True,
                     rounds=args.rounds), check_error=errors, rows=rows))


def single(args):
    """One configuration, timed (a profiler's target: it runs the kernel a few dozen times)."""
    L, b, h = args.seq, args.batch, args.heads
    causal, hkv = not args.non_causal, args.kv_heads or args.heads
    backend, kv = args.backend, args.kv
    if args.sdpa == "flashinfer":
        fn = flashinfer_fn([L] * b, [L] * b, h, hkv, causal, backend)
        if fn is None:
            raise SystemExit("--sdpa flashinfer: FlashInfer is not importable or refused the shape")
        ms = common.bench_ms(fn)
        backend, kv = f"flashinfer {backend}", "ragged"
    elif args.sdpa:
        ms = sdpa(b, h, hkv, L, L, causal, args.sdpa)
        backend, kv = "sdpa-" + args.sdpa, "dense"
    elif kv.startswith("paged:"):
        ms = tessera_paged([L] * b, [L] * b, h, hkv, causal, int(kv[6:]), backend=backend)
    elif kv == "bsr":
        causal = False  # block-sparse masks are the sparsity pattern: no causal flag
        ms = tessera_bsr_vector(L, L, b, h, hkv, backend=backend)
    else:
        ms = tessera_ragged([L] * b, [L] * b, h, hkv, causal, backend=backend)
    fl = flops([L] * b, [L] * b, h, causal)
    print(f"seq {L} batch {b} heads {h} causal {causal} {backend} {kv}: {ms * 1e3:.1f} us, {tflops(fl, ms):.1f} TFLOP/s")


def main():
    global D
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--no-flex", action="store_true")
    ap.add_argument("--parts", default="abcd", help="which of the parts (a)-(d) to run")
    ap.add_argument("--backends", default=None, help="fa2,fa3 (default: both on sm_90, else fa2)")
    ap.add_argument("--head-dim", type=int, default=128, choices=[64, 128, 256])
    ap.add_argument("--rounds", type=int, default=3, help="(a) and --ab: timing rounds, peers interleaved (medians)")
    ap.add_argument("--ab", action="append", default=[], metavar="NAME:KEY=VALUE,...",
                    help="a setting to A/B (repeatable; 'base:' = defaults); key: cta_q")
    ap.add_argument("--seqs", default="1024,2048,4096,16384", help="--ab: sequence lengths")
    ap.add_argument("--window", type=int, default=-1, help="--ab: causal sliding window, window_left (-1: none)")
    ap.add_argument("--backend", default="fa3", choices=["fa2", "fa3", "auto"], help="--ab / --single: kernel template")
    ap.add_argument("--peers", default="", help="--ab: SDPA backends timed in the same rounds (flash, cudnn)")
    ap.add_argument("--fp8", action="store_true", help="the Table-1 shape (--seqs) with an e4m3 KV cache vs fp16")
    ap.add_argument("--save-as", metavar="NAME", help="results file bench/results/NAME.json")
    ap.add_argument("--single", action="store_true", help="one configuration (--seq, --kv, --sdpa), e.g. for ncu")
    ap.add_argument("--seq", type=int, default=4096, help="--single: sequence length")
    ap.add_argument("--batch", type=int, default=16, help="--ab / --single: batch")
    ap.add_argument("--heads", type=int, default=16, help="--ab / --single: query heads")
    ap.add_argument("--kv-heads", type=int, default=0, help="--single: KV heads (0: as --heads)")
    ap.add_argument("--non-causal", action="store_true", help="--single")
    ap.add_argument("--kv", default="ragged", help="--single: ragged, paged:PAGE_SIZE or bsr (Br 16, Bc 1; non-causal)")
    ap.add_argument("--sdpa", choices=["flash", "cudnn", "flashinfer"],
                    help="--single: time a peer instead (an SDPA backend, or FlashInfer's ragged prefill)")
    args = ap.parse_args()
    D = args.head_dim
    common.require()
    args.backends = args.backends or ("fa2,fa3" if common.is_hopper() else "fa2")
    if args.single:
        return single(args)
    path = fp8(args) if args.fp8 else ab(args) if args.ab else parts(args)
    print(f"# results: {path}")


if __name__ == "__main__":
    main()
