"""Old build vs new build, paired in one run: the performance acceptance of a
change (every ratio >= --threshold, default 0.98).

Two worker processes, one per build, each importing the tessera package of
its own python folder (a build's `python/` with the compiled extension, or a
checkout whose `python/` holds one: scripts/build_python.sh builds it in
tree). The driver sets each case up in both, then times it in interleaved
rounds, old and new alternating which goes first, one worker at a time on
the GPU; it reports the median time of each and the median over rounds of
old time / new time (> 1: the new build is faster), and exits 1 when a ratio
is below the threshold.

Cases (both builds get the same inputs: same seeds):
  decode   page 16, fp16, head dim 128, batch 16 / 64 / 128, GQA 32/8 and
           MHA 32/32, on tensor cores and CUDA cores; timed over rotating
           cache copies replayed from a CUDA graph (common.bench_graph_ms);
           each build's output checked against a float32 softmax first;
  prefill  paper Table-1: batch 16, 16 heads, head dim 128 (--head-dim), causal, fp16,
           512 .. 16k, per kernel template (fa3 on sm_90, fa2); timed with
           do_bench; the last 256 query rows of request 0 checked against
           float32 attention first;
  mla      latent attention (bench/mla.py's inputs: page 64, q of --mla-dtype), H x
           q_len x batch x KV per --mla workload and cache type per --mla-cache
           (fp16, or fp8 with unit scales), the wrapper's kernel choice;
           timed over rotating caches from a CUDA graph; request 0's rows
           checked against float32 attention over its latent rows first.

Two builds side by side, e.g. the merge base against this checkout:
  git worktree add /tmp/tessera-old OLD_COMMIT
  (cd /tmp/tessera-old && bash scripts/build_python.sh)   # tessera._C in /tmp/tessera-old/python
  bash scripts/build_python.sh                              # the new build, in ./python
  python bench/ab.py --old /tmp/tessera-old --new .
Both share the JIT disk cache; its keys hash the kernel sources, so each
build compiles and loads its own kernels.

Usage: python bench/ab.py --old OLD_DIR --new NEW_DIR [--rounds 5] [--only decode|prefill|mla]
           [--batches 16,64,128] [--heads 32/8,32/32] [--lengths const:1024,const:4096] [--paths tc,cc,hint]
           [--seqs 512,1024,2048,4096,8192,16384] [--backends fa3,fa2] [--mla 128:1:64:4096,...]
           [--mla-cache float16,float8_e4m3fn] [--mla-dtype float16|bfloat16]
           [--threshold 0.98]
Results: bench/results/ab.json (and $OUT/ab.json).
"""
import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
TAG = "@@ab "  # prefix of the workers' replies on stdout (anything else there is the library's output)


def python_dir(d):
    """DIR itself when it holds the tessera package, else DIR/python."""
    d = os.path.abspath(d)
    if os.path.isdir(os.path.join(d, "tessera")):
        return d
    if os.path.isdir(os.path.join(d, "python", "tessera")):
        return os.path.join(d, "python")
    raise SystemExit(f"{d}: no tessera package there (nor in {d}/python)")


# ------------------------------------------------------------------ worker
class Worker:
    """One build's benchmark process (this file with --worker DIR)."""

    def __init__(self, name, pydir):
        self.name = name
        self.proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--worker", pydir],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1)
        self.hello = self.call(op="hello")

    def call(self, **msg):
        self.proc.stdin.write(json.dumps(msg) + "\n")
        self.proc.stdin.flush()
        for line in self.proc.stdout:
            if line.startswith(TAG):
                reply = json.loads(line[len(TAG):])
                if "error" in reply:
                    raise RuntimeError(f"{self.name}: {reply['error']}")
                return reply
            sys.stderr.write(f"[{self.name}] {line}")
        raise RuntimeError(f"{self.name}: worker exited (rc {self.proc.wait()})")

    def close(self):
        try:
            self.call(op="quit")
        except Exception:
            pass
        self.proc.wait()


def serve(pydir):
    """Worker loop: JSON requests on stdin, TAG-prefixed JSON replies on stdout."""
    sys.path.insert(0, HERE)
    import common
    tessera = common.require(pydir)  # this build's package, before decode / prefill import anything
    import decode as dec
    import prefill as pf
    torch = common.torch
    state = {}

    def reply(**kw):
        sys.stdout.write(TAG + json.dumps(kw) + "\n")
        sys.stdout.flush()

    def setup_decode(c):
        lens = common.kv_lengths(c["lengths"], c["batch"], seed=c["batch"])
        hq, hkv = c["hq"], c["hkv"]
        torch.manual_seed(c["batch"])
        q = torch.randn(c["batch"], hq, dec.D, dtype=dec.DTYPE, device="cuda")
        out = torch.empty_like(q)
        st = dec.decode_wrapper(tessera, lens, 16, hq, hkv, seed=c["batch"] + 16, tensor_cores=c["path"] == "tc",
                                cuda_cores=c["path"] == "cc")
        out.fill_(float("nan"))
        st["w"].run(q, (st["k"], st["v"]), out=out)
        err = dec.spot_check(lens, q, out, st["k"], st["v"], st["indptr"], st["indices"], hq, hkv)
        copies = common.rotation_copies(dec.needed_bytes(lens, hq, hkv))
        caches = [(st["k"], st["v"])] + [(torch.randn_like(st["k"]), torch.randn_like(st["v"])) for _ in range(copies - 1)]
        calls = [lambda kv=kv: st["w"].run(q, kv, out=out) for kv in caches]
        return (lambda: common.bench_graph_ms(calls)), err, (st, q, out, caches)

    def setup_prefill(c):
        L, b, h = c["seq"], 16, 16
        pf.D = c.get("head_dim", 128)
        torch.manual_seed(L)
        fn = pf.tessera_ragged_fn([L] * b, [L] * b, h, h, True, c["backend"], ws=common.new_workspace())
        w, q, k, v, out = fn.inputs
        out.fill_(float("nan"))
        fn()
        rows = min(256, L)  # request 0's last rows: they see every key, and the reference stays small
        qq = q[L - rows:L].float().transpose(0, 1)
        kk, vv = k[:L].float().transpose(0, 1), v[:L].float().transpose(0, 1)
        i = torch.arange(L - rows, L, device="cuda")
        keep = torch.arange(L, device="cuda")[None, :] <= i[:, None]
        ref = torch.nn.functional.scaled_dot_product_attention(qq, kk, vv, attn_mask=keep).transpose(0, 1)
        err = ((out[L - rows:L].float() - ref).abs().max() / ref.norm(dim=-1).max()).item()
        return (lambda: common.bench_ms(fn)), err, (fn,)

    def setup_mla(c):
        import mla as ml
        h, ql, b, kv = c["h"], c["q"], c["batch"], c["kv"]
        torch.manual_seed(h * 1000 + b)
        made = ml.make_calls(tessera, h, ql, b, kv, getattr(torch, c["dtype"]), common.new_workspace(256 << 20),
                             kv_dtype=None if c["cache"] == "float16" else getattr(torch, c["cache"]))
        if made is None:
            raise RuntimeError(f"mla {h}:{ql}:{b}:{kv}: the rotated caches exceed bench/mla.py's memory limit")
        calls, st = made
        st["out"].fill_(float("nan"))
        calls[0]()
        # Request 0 against float32 attention over its latent rows (K = ckv | kpe, V = ckv; causal among its
        # q_len new tokens, bottom-right aligned).
        pages = st["kv_indices"][: st["pages_per"]].long()
        # fp8 caches run at unit scales, so their float values are the dequantized rows; their pages are
        # gathered as bytes (advanced indexing of float8 tensors is not in every torch).
        def rows(x):
            gathered = x.view(torch.uint8)[pages].view(x.dtype) if x.element_size() == 1 else x[pages]
            return gathered.reshape(-1, x.shape[-1])[:kv].float()
        ckv, kpe = (rows(x) for x in st["caches"][0])
        qn, qp = st["q_nope"][:ql].float(), st["q_pe"][:ql].float()  # [q_len, H, 512 / 64]
        s = (torch.einsum("qhd,kd->qhk", qn, ckv) + torch.einsum("qhd,kd->qhk", qp, kpe)) * ml.SM_SCALE
        keys = torch.arange(kv, device="cuda")
        visible = keys[None, :] <= (kv - ql + torch.arange(ql, device="cuda"))[:, None]
        s = s.masked_fill(~visible[:, None, :], float("-inf"))
        ref = torch.einsum("qhk,kd->qhd", torch.softmax(s, dim=-1), ckv)
        err = ((st["out"][:ql].float() - ref).abs().max() / ref.abs().max()).item()
        return (lambda: common.bench_graph_ms(calls)), err, (st,)

    for line in sys.stdin:
        msg = json.loads(line)
        try:
            op = msg["op"]
            if op == "hello":
                reply(device=common.device_name(), tessera=getattr(tessera, "__file__", ""), torch=torch.__version__)
            elif op == "setup":
                c = msg["case"]
                setup = {"decode": setup_decode, "prefill": setup_prefill, "mla": setup_mla}[c["kind"]]
                timer, err, keep = setup(c)
                state.clear()
                state.update(timer=timer, keep=keep)
                reply(err=err)
            elif op == "time":
                reply(ms=state["timer"]())
            elif op == "free":
                state.clear()
                torch.cuda.empty_cache()
                reply(ok=True)
            elif op == "quit":
                reply(ok=True)
                return
        except Exception as e:  # reported to the driver, which stops the run
            reply(error=f"{type(e).__name__}: {e}")


# ------------------------------------------------------------------ driver
def cases(args):
    out = []
    if args.only in ("", "decode"):
        for hh in args.heads.split(","):
            hq, hkv = (int(x) for x in hh.split("/"))
            for b in (int(x) for x in args.batches.split(",")):
                for lengths in args.lengths.split(","):
                    for path in args.paths.split(","):
                        out.append(dict(kind="decode", hq=hq, hkv=hkv, batch=b, lengths=lengths, path=path))
    if args.only in ("", "prefill"):
        for be in args.backends.split(","):
            for L in (int(x) for x in args.seqs.split(",")):
                out.append(dict(kind="prefill", backend=be, seq=L, head_dim=args.head_dim))
    if args.only in ("", "mla"):
        for cache in args.mla_cache.split(","):
            for wl in filter(None, args.mla.split(",")):
                h, q, b, kv = (int(x) for x in wl.split(":"))
                out.append(dict(kind="mla", h=h, q=q, batch=b, kv=kv, cache=cache, dtype=args.mla_dtype))
    return out


def label(c):
    if c["kind"] == "decode":
        return f"decode {c['path']} {c['hq']}/{c['hkv']} {c['lengths']} x {c['batch']}"
    if c["kind"] == "mla":
        cache = "" if c["cache"] == "float16" else f" {c['cache'].replace('float8_', '')}"
        q = "" if c["dtype"] == "float16" else " bf16 q"
        return f"mla H {c['h']} q {c['q']} {c['batch']} x {c['kv']}{cache}{q}"
    d = "" if c.get("head_dim", 128) == 128 else f" d{c['head_dim']}"
    return f"prefill {c['backend']} Table-1{d} {c['seq']}"


def mla_caches(text):
    """--mla-cache: a comma list of the latent cache types bench/mla.py takes."""
    allowed = ("float16", "float8_e4m3fn", "float8_e5m2")
    bad = [x for x in text.split(",") if x not in allowed]
    if bad or not text:
        raise argparse.ArgumentTypeError(f"expected a comma list of {', '.join(allowed)}, got {text!r}")
    return text


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--old", help="the old build: its python/ folder (or a checkout holding one)")
    ap.add_argument("--new", help="the new build: its python/ folder (or a checkout holding one)")
    ap.add_argument("--rounds", type=int, default=5, help="interleaved rounds per case")
    ap.add_argument("--only", default="", choices=["", "decode", "prefill", "mla"])
    ap.add_argument("--batches", default="16,64,128", help="decode batches")
    ap.add_argument("--heads", default="32/8,32/32", help="decode heads, HQ/HKV,... (GQA and MHA)")
    ap.add_argument("--lengths", default="const:1024,const:4096", help="decode KV lengths (common.kv_lengths)")
    ap.add_argument("--paths", default="tc,cc,hint", help="decode kernels: tc (use_tensor_cores=True), cc (the "
                    "CUDA-core kernel, forced where a build picks), hint (use_tensor_cores=False: the build's pick)")
    ap.add_argument("--seqs", default="512,1024,2048,4096,8192,16384", help="prefill sequence lengths")
    ap.add_argument("--backends", default="fa3,fa2", help="prefill kernel templates (fa3 needs sm_90)")
    ap.add_argument("--head-dim", type=int, default=128, choices=[64, 128, 256], help="prefill head dim")
    ap.add_argument("--mla", default="16:1:64:4096,128:1:64:4096,16:2:64:4096,16:1:1:32768",
                    help="MLA workloads, H:q_len:batch:KV,... (sm_90 picks the Hopper kernel)")
    ap.add_argument("--mla-cache", default="float16", type=mla_caches,
                    help="MLA latent cache types, each over every --mla workload: float16, float8_e4m3fn, "
                    "float8_e5m2 (fp8 on sm_90)")
    ap.add_argument("--mla-dtype", default="float16", choices=["float16", "bfloat16"],
                    help="MLA query type (--mla-cache float16 means a 16-bit cache of this type)")
    ap.add_argument("--threshold", type=float, default=0.98, help="lowest acceptable old/new time ratio")
    ap.add_argument("--worker", metavar="DIR", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        return serve(args.worker)
    if not args.old or not args.new:
        ap.error("--old and --new are required")
    try:
        workers = {"old": Worker("old", python_dir(args.old)), "new": Worker("new", python_dir(args.new))}
    except RuntimeError as e:  # the worker printed why (e.g. no torch, no extension) on stderr
        raise SystemExit(f"ab: {e}")
    device = workers["new"].hello["device"]
    print(f"# {device}; old: {workers['old'].hello['tessera']}; new: {workers['new'].hello['tessera']}")
    print(f"# {args.rounds} interleaved rounds per case; ratio = median over rounds of old time / new time "
          f"(> 1: new faster); threshold {args.threshold}")
    print(f"{'case':<44} {'old us':>10} {'new us':>10} {'ratio':>7}  check err (old / new)")
    rows, failed = [], []
    try:
        for c in cases(args):
            try:
                errs = {n: w.call(op="setup", case=c)["err"] for n, w in workers.items()}
            except RuntimeError as e:
                raise SystemExit(f"ab: {label(c)}: {e}")
            tol = 1e-2 if c.get("dtype") == "bfloat16" else 2e-3  # bf16's 8-bit mantissa
            bad = [n for n, e in errs.items() if not (e is not None and e < tol)]
            if bad:
                raise SystemExit(f"{label(c)}: {', '.join(bad)} output off the reference ({errs})")
            times = {"old": [], "new": []}
            for r in range(args.rounds):
                for n in (("old", "new") if r % 2 == 0 else ("new", "old")):
                    times[n].append(workers[n].call(op="time")["ms"])
            for w in workers.values():
                w.call(op="free")
            ratio = statistics.median(o / n for o, n in zip(times["old"], times["new"]))
            med = {n: statistics.median(t) for n, t in times.items()}
            ok = ratio >= args.threshold
            if not ok:
                failed.append(label(c))
            print(f"{label(c):<44} {med['old'] * 1e3:10.1f} {med['new'] * 1e3:10.1f} {ratio:7.3f}{'' if ok else ' <'}  "
                  f"{errs['old']:.1e} / {errs['new']:.1e}", flush=True)
            rows.append(dict(case=c, old_us=med["old"] * 1e3, new_us=med["new"] * 1e3, ratio=ratio,
                             rounds_ms=times, check_err=errs))
    finally:
        for w in workers.values():
            w.close()
    doc = dict(device=device, date=datetime.date.today().isoformat(), command="python bench/ab.py " + " ".join(sys.argv[1:]),
               old=workers["old"].hello, new=workers["new"].hello, rounds=args.rounds, threshold=args.threshold,
               min_ratio=min((r["ratio"] for r in rows), default=None), below_threshold=failed, rows=rows)
    text = json.dumps(doc, indent=1) + "\n"
    for d in filter(None, (os.path.join(HERE, "results"), os.environ.get("OUT"))):
        with open(os.path.join(d, "ab.json"), "w") as f:
            f.write(text)
    print(f"# min ratio {doc['min_ratio']:.3f}; " + (f"below {args.threshold}: {', '.join(failed)}" if failed
                                                     else f"every ratio >= {args.threshold}"))
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
