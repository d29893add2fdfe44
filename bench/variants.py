"""Attention variants benchmark: Tessera's JIT variants (tessera.AttentionWrapper)
side by side with the peers users would pick instead, in one process.

  (a) paper Tables 1-4 setting: batch 16, 16 heads, head dim 128, fp16,
      sequence 512..16384, causal; variants causal, logits soft-cap (30),
      ALiBi and causal sliding window (1024) against compiled FlexAttention
      with the equivalent score_mod / block_mask (dense [B, H, L, D]);
  (b) fused RoPE (paper Figure 9): decode (32/32 heads, paged cache of
      un-rotated keys, page 16, the Streaming-LLM setting) and causal prefill,
      fused vs unfused (our apply_rope on q and every key, then our plain
      attention) vs PyTorch (RoPE from cached cos/sin tables, then SDPA);
  (c) JIT cost per kernel of each built-in variant: cold NVRTC compile, warm
      load from the disk cache (file read + module load, what a new process
      pays) and in-memory lookup.
TFLOP/s count visible query-key pairs only (causal: half the square, the
sliding window its band); decode reports TB/s of K and V read. Ratios are
peer time / Tessera time (> 1: Tessera faster). Part (a) times the peers of
each shape in interleaved rounds (--rounds, default 3) and reports medians
and ratios paired by round. Results: variants.json (every part), else
variants-PARTS.json, or NAME.json with --save-as NAME.
Usage: python bench/variants.py [--quick] [--no-flex] [--parts abc] [--backends fa2,fa3] [--rounds N]
"""
import argparse
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402
from common import F, torch, tessera  # noqa: E402

D = 128
DT = torch.float16 if torch else None
CAP, WINDOW = 30.0, 1024
workspace = common.workspace


def visible_pairs(L, variant):
    """Query-key pairs a causal length-L sequence computes (per batch and head)."""
    if variant == "sliding_window":
        w = min(WINDOW, L - 1)
        return w * (w + 1) // 2 + (L - w) * (w + 1)
    return L * (L + 1) // 2


def tflops(pairs, ms):
    return 4 * D * pairs / (ms * 1e-3) / 1e12


def ratio(peer, ms):
    return f"{peer / ms:6.2f}x" if peer else f"{'-':>7}"


# ------------------------------------------------------------------ (a)
_OWN_WS = {}


def tessera_variant(variant, B, H, L, backend):
    """The planned run() of one variant as a callable. Each backend plans into
    its own workspace: the callables of both backends are timed side by side,
    and a plan lives in its workspace (a second plan into a shared one would
    replace the first)."""
    spec = {"causal": tessera.variants.causal(), "soft_cap": tessera.variants.soft_cap(CAP, causal=True),
            "alibi": tessera.variants.alibi(causal=True),
            "sliding_window": tessera.variants.sliding_window(WINDOW, causal=True)}[variant]
    extras = {"alibi_slopes": torch.from_numpy(tessera.variants.alibi_slopes(H)).cuda()} if variant == "alibi" else {}
    task = tessera.TaskInfo(H, H, page_size=1, max_batch=B, max_pages=1, max_total_q=B * L)
    if backend not in _OWN_WS:
        _OWN_WS[backend] = common.new_workspace()
    w = tessera.AttentionWrapper(tessera.AttentionSpec(spec, q_dtype=DT, head_dim=D), task, _OWN_WS[backend],
                                 kind="prefill", backend=backend)
    indptr = torch.arange(B + 1, dtype=torch.int32) * L
    w.plan_ragged(indptr, indptr)
    q = torch.randn(B * L, H, D, dtype=DT, device="cuda")
    k, v = torch.randn_like(q), torch.randn_like(q)
    out = torch.empty_like(q)
    return lambda: w.run_ragged(q, k, v, out=out, **extras)


def flex_variant(variant, B, H, L):
    """Compiled FlexAttention of one variant as a callable (None when it does not compile)."""
    slopes = torch.from_numpy(tessera.variants.alibi_slopes(H)).cuda()

    def causal(b, h, qi, kv):
        return kv <= qi

    def window(b, h, qi, kv):
        return (kv <= qi) & (qi - kv <= WINDOW)

    def soft_cap(score, b, h, qi, kv):
        return CAP * torch.tanh(score / CAP)

    def alibi(score, b, h, qi, kv):
        return score + slopes[h] * (kv - qi)

    mask = window if variant == "sliding_window" else causal
    score_mod = {"soft_cap": soft_cap, "alibi": alibi}.get(variant)
    return common.flex_fn(B, H, H, L, L, mask, score_mod=score_mod, d=D, dtype=DT)


# ------------------------------------------------------------------ (b)
def rope_tables(positions, theta=1e4):
    """cos/sin [len(positions), D] of half-split RoPE (as HF caches them)."""
    inv = 1.0 / theta ** (torch.arange(0, D, 2, dtype=torch.float32, device="cuda") / D)
    ang = positions.float()[:, None] * inv[None, :]
    ang = torch.cat([ang, ang], dim=-1)
    return ang.cos().to(DT), ang.sin().to(DT)


def rope_torch(x, cos, sin):
    """x [..., L, D] with cos/sin [L, D] (half-split, PyTorch ops)."""
    x1, x2 = x[..., : D // 2], x[..., D // 2:]
    return x * cos + torch.cat([-x2, x1], dim=-1) * sin


def decode_case(B, L, H):
    """(fused ms, unfused ms, torch ms) of one RoPE decode step over a paged cache of un-rotated keys."""
    ps = 16
    pages = (L + ps - 1) // ps
    indptr = torch.arange(B + 1, dtype=torch.int32) * pages
    indices = torch.randperm(B * pages).to(torch.int32)
    last = torch.full((B,), L - (pages - 1) * ps, dtype=torch.int32)
    kc = torch.randn(B * pages, ps, H, D, dtype=DT, device="cuda")
    vc = torch.randn_like(kc)
    q = torch.randn(B, H, D, dtype=DT, device="cuda")
    qo = torch.arange(B + 1, dtype=torch.int32)
    task = tessera.TaskInfo(H, H, page_size=ps, max_batch=B, max_pages=B * pages)
    fused = tessera.AttentionWrapper(tessera.AttentionSpec(tessera.variants.rope(), q_dtype=DT), task, workspace(),
                                     kind="decode")
    fused.plan(qo, indptr, indices, last)
    out = torch.empty_like(q)
    t_fused = common.bench_ms(lambda: fused.run(q, (kc, vc), out=out, rope_scale=1.0, rope_theta=1e4))

    # Unfused (ours): rotate q and every cached key (positions of each slot), then plain decode.
    slot_pos = torch.empty(B * pages, ps, dtype=torch.int32)
    slot_pos[indices.long()] = torch.arange(pages * ps, dtype=torch.int32).view(pages, ps).repeat(B, 1)
    slot_pos, q_pos = slot_pos.view(-1).cuda(), torch.full((B,), L - 1, dtype=torch.int32, device="cuda")
    plain = tessera.AttentionWrapper(tessera.AttentionSpec(tessera.variants.standard(), q_dtype=DT), task, workspace(),
                                     kind="decode")
    plain.plan(qo, indptr, indices, last)
    k_rows = kc.view(-1, H, D)
    no_heads_q, no_heads_k = q[:, :0], k_rows[:, :0]
    k_rot, q_rot = torch.empty_like(kc), torch.empty_like(q)
    k_rot_rows = k_rot.view(-1, H, D)

    def unfused():
        tessera._C.apply_rope_pos_ids(q, no_heads_q, q_rot, no_heads_q, q_pos, stream=torch.cuda.current_stream().cuda_stream)
        tessera._C.apply_rope_pos_ids(k_rows, no_heads_k, k_rot_rows, no_heads_k, slot_pos,
                                      stream=torch.cuda.current_stream().cuda_stream)
        plain.run(q_rot, (k_rot, vc), out=out)
    t_unfused = common.bench_ms(unfused)

    # PyTorch: dense [B, H, L, D] cache, RoPE from cached tables, then SDPA.
    kd = torch.randn(B, H, L, D, dtype=DT, device="cuda")
    vd = torch.randn_like(kd)
    cos, sin = rope_tables(torch.arange(L, device="cuda"))
    qd = q[:, :, None, :]
    t_torch = common.bench_ms(lambda: F.scaled_dot_product_attention(rope_torch(qd, cos[-1:], sin[-1:]),
                                                                      rope_torch(kd, cos, sin), vd))
    return t_fused, t_unfused, t_torch


def prefill_case(B, L, H, backend):
    """(fused ms, unfused ms, torch ms) of causal RoPE prefill over ragged KV."""
    indptr = torch.arange(B + 1, dtype=torch.int32) * L
    offsets = torch.zeros(B, dtype=torch.int32)
    q = torch.randn(B * L, H, D, dtype=DT, device="cuda")
    k, v = torch.randn_like(q), torch.randn_like(q)
    out = torch.empty_like(q)
    task = tessera.TaskInfo(H, H, page_size=1, max_batch=B, max_pages=1, max_total_q=B * L)
    fused = tessera.AttentionWrapper(tessera.AttentionSpec(tessera.variants.rope(causal=True), q_dtype=DT), task,
                                     workspace(), kind="prefill", backend=backend)
    fused.plan_ragged(indptr, indptr)
    t_fused = common.bench_ms(lambda: fused.run_ragged(q, k, v, out=out, rope_scale=1.0, rope_theta=1e4))
    plain = tessera.AttentionWrapper(tessera.AttentionSpec(tessera.variants.causal(), q_dtype=DT), task, workspace(),
                                     kind="prefill", backend=backend)
    plain.plan_ragged(indptr, indptr)
    q_rot, k_rot = torch.empty_like(q), torch.empty_like(k)
    ind, off = indptr.cuda(), offsets.cuda()

    def unfused():
        tessera._C.apply_rope(q, k, q_rot, k_rot, ind, off, stream=torch.cuda.current_stream().cuda_stream)
        plain.run_ragged(q_rot, k_rot, v, out=out)
    t_unfused = common.bench_ms(unfused)
    qd, kd, vd = (x.view(B, L, H, D).transpose(1, 2) for x in (q, k, v))
    cos, sin = rope_tables(torch.arange(L, device="cuda"))
    t_torch = common.bench_ms(lambda: F.scaled_dot_product_attention(rope_torch(qd, cos, sin), rope_torch(kd, cos, sin), vd,
                                                                      is_causal=True))
    return t_fused, t_unfused, t_torch


# ------------------------------------------------------------------ (c)
def jit_costs():
    sm90 = torch.cuda.get_device_capability()[0] == 9
    rows = []
    builtins = [tessera.variants.causal(), tessera.variants.soft_cap(CAP, causal=True), tessera.variants.alibi(True),
                tessera.variants.sliding_window(WINDOW, True), tessera.variants.flash_sigmoid(),
                tessera.variants.attention_sink(), tessera.variants.rope()]
    for v in builtins:
        families = ["decode", "prefill"] + (["prefill_sm90"] if sm90 else [])
        with tempfile.TemporaryDirectory() as d:
            for r in tessera._C.measure_jit(v._tuple(), "float16", D, 4, families, os.path.join(d, "cache")):
                rows.append(dict(part="c", variant=v.name, **r))
                print(f"{r['entry']:>64}: compile {r['compile_ms']:8.0f} ms | warm load {r['warm_load_ms']:6.2f} ms "
                      f"(disk read {r['disk_read_ms']:5.2f}) | lookup {r['lookup_us']:5.2f} us", flush=True)
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--no-flex", action="store_true")
    ap.add_argument("--parts", default="abc", help="which of the parts (a)-(c) to run")
    ap.add_argument("--variants", default="causal,soft_cap,alibi,sliding_window", help="part (a)'s variants")
    ap.add_argument("--backends", default=None, help="fa2,fa3 (default: both on sm_90, else fa2)")
    ap.add_argument("--rounds", type=int, default=3,
                    help="part (a): timing rounds, peers interleaved; each time is the median of its rounds (clocks "
                         "drift with the power a run draws, so one timing right after a heavy peer can be ~10%% off)")
    ap.add_argument("--save-as", metavar="NAME", help="results file bench/results/NAME.json")
    args = ap.parse_args()
    common.require()
    args.backends = args.backends or ("fa2,fa3" if common.is_hopper() else "fa2")
    backends = args.backends.split(",")
    peak = common.matmul_ceiling_tflops()
    read = common.read_probe_best()
    print(f"# {common.device_name()}: dense fp16 matmul ceiling {peak:.0f} TFLOP/s, HBM read {read:.2f} TB/s")
    rows = []

    print("# (a) batch 16, 16 heads, d 128, causal: Tessera variants vs compiled FlexAttention")
    seqs = [1024, 4096] if args.quick else [512, 1024, 2048, 4096, 8192, 16384]
    for variant in (args.variants.split(",") if "a" in args.parts else []):
        for L in seqs:
            fns = {be: tessera_variant(variant, 16, 16, L, be) for be in backends}
            flex_fn = None if args.no_flex else flex_variant(variant, 16, 16, L)
            if flex_fn is not None:
                fns["flex"] = flex_fn
            times = common.interleaved(fns, args.rounds)  # drift hits every peer alike
            med = {n: common.median(t) for n, t in times.items()}
            fx = med.get("flex")
            pairs = 16 * 16 * visible_pairs(L, variant)
            for be in backends:
                ms = med[be]
                # Paired: the median of each round's flex / ours (as bench/prefill.py part (a)).
                paired = common.paired_ratio(times, "flex", be) if fx else None
                rows.append(dict(part="a", variant=variant, backend=be, seq=L, us=ms * 1e3, tflops=tflops(pairs, ms),
                                 flex_us=fx and fx * 1e3, flex_tflops=fx and tflops(pairs, fx), flex_paired_ratio=paired,
                                 rounds_ms={n: times[n] for n in (be, "flex") if n in times}))
                print(f"{variant:>15} {L:>6} {be} {ms * 1e3:9.1f} us {tflops(pairs, ms):7.1f} TFLOP/s | flex "
                      f"{tflops(pairs, fx) if fx else float('nan'):7.1f} TFLOP/s {ratio(fx, ms)}"
                      + (f" (paired {paired:.2f}x)" if paired else ""), flush=True)

    print("# (b) fused RoPE: decode (32/32 heads, page 16) and causal prefill (batch 4, 32/32 heads)")
    for B in ([16, 64] if "b" in args.parts else []):
        for L in ([4096] if args.quick else [1024, 4096, 16384]):
            f, u, t = decode_case(B, L, 32)
            tbps = 2 * B * L * 32 * D * 2 / (f * 1e-3) / 1e12
            rows.append(dict(part="b", op="decode", batch=B, kv=L, fused_us=f * 1e3, unfused_us=u * 1e3,
                             torch_us=t * 1e3, fused_tbps=tbps))
            print(f"decode B {B:>3} L {L:>6}: fused {f * 1e3:8.1f} us ({tbps:.2f} TB/s, {tbps / read:.0%}) | unfused "
                  f"{ratio(u, f)} | torch rope+sdpa {ratio(t, f)}", flush=True)
    for L in ([1024, 4096] if "b" in args.parts else []):
        for be in backends:
            f, u, t = prefill_case(4, L, 32, be)
            pairs = 4 * 32 * visible_pairs(L, "causal")
            rows.append(dict(part="b", op="prefill", backend=be, seq=L, fused_us=f and f * 1e3, unfused_us=u * 1e3,
                             torch_us=t * 1e3))
            shown = f"{f * 1e3:8.1f} us ({tflops(pairs, f):.0f} TFLOP/s)" if f else "n/a (prefill.cuh not wired)"
            print(f"prefill L {L:>6} {be}: fused {shown} | unfused {u * 1e3:8.1f} us {ratio(u, f) if f else ''} | "
                  f"torch rope+sdpa {t * 1e3:8.1f} us", flush=True)

    if "c" in args.parts:
        print("# (c) JIT cost per kernel (fp16, d 128, group 4)")
        rows += jit_costs()
    # A partial run is saved under its own name (variants-a-..., variants-quick-...), never over a full one.
    kind = "variants" if args.parts == "abc" and not args.quick else "variants-" + ("quick" if args.quick else args.parts)
    path = common.save_results(args.save_as or kind, dict(variants=args.variants, backends=args.backends, matmul_ceiling_tflops=peak,
                                          read_tbps=read, head_dim=D, dtype="float16", rows=rows))
    print(f"# results: {path}")


if __name__ == "__main__":
    main()
