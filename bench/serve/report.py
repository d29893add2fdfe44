"""Results of run_all.py: the JSON document, a markdown summary and a PNG plot.

The JSON is rewritten after every study (a run cut short keeps what it had);
the markdown and the plot are made from it at the end.
"""
import json
import math
import os


def _f(x, nd=2):
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.{nd}f}"


def write_json(path, doc):
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(doc, f, indent=1, default=float)
        f.write("\n")
    os.replace(tmp, path)


def markdown(doc):
    out = [f"# Serving loop ({doc.get('mode', '?')})", "",
           f"{doc.get('device', '?')}, {doc.get('date', '?')}, torch {doc.get('torch', '?')}; model "
           f"{doc['model']['layers']} layers x hidden {doc['model']['hidden']}, {doc['model']['q_heads']}/"
           f"{doc['model']['kv_heads']} heads of {doc['model']['head_dim']}, {doc['dtype']}; page 16, token budget "
           f"{doc['config']['token_budget']}, max running {doc['config']['max_running']}.", "",
           f"Command: `{doc.get('command', '')}`", ""]
    chk = doc.get("check")
    if chk:
        out += ["## Logits check (loop vs dense float32 forward)", "",
                "| backend | ok | error | control (dense, model dtype) | bound | rows | steps (mixed / decode) |",
                "|---|---|---|---|---|---|---|"]
        for name, r in chk.items():
            if "error" in r and "err" not in r:
                out.append(f"| {name} | no | {r['error']} | | | | |")
            else:
                out.append(f"| {name} | {'yes' if r['ok'] else 'NO'} | {r['err']:.2e} | {r['control']:.2e} | "
                           f"{r['bound']:.2e} | {r['rows']} | {r['mixed_steps']} / {r['decode_steps']} |")
        out.append("")
    rows = [r for r in doc.get("serving", []) if "itl_ms" in r]
    if rows or doc.get("serving"):
        out += ["## Study 1: ShareGPT-like trace, Poisson arrivals", "",
                "| backend | rate (req/s) | requests | ITL median / p99 (ms) | TTFT median / p99 (ms) "
                "| batch max / mean | ITL median vs tessera |", "|---|---|---|---|---|---|---|"]
        base = {r["rate"]: r["itl_ms"]["median"] for r in rows if r["backend"] == "tessera"}
        for r in rows:
            rel = base.get(r["rate"])
            out.append(f"| {r['backend']} | {r['rate']:g} | {r['requests']} | {_f(r['itl_ms']['median'])} / "
                       f"{_f(r['itl_ms']['p99'])} | {_f(r['ttft_ms']['median'], 1)} / {_f(r['ttft_ms']['p99'], 1)} | "
                       f"{r['batch']['max']} / {r['batch']['mean']:.1f} | "
                       f"{_f(r['itl_ms']['median'] / rel, 3) if rel else '-'}"
                       + (" (truncated)" if r.get("truncated") else "") + " |")
        for r in doc.get("serving", []):
            if "skipped" in r:
                out.append(f"| {r['backend']} | {r.get('rate', '-')} | skipped: {r['skipped'][:120]} | | | | |")
        out.append("")
    par = [r for r in doc.get("parallel", []) if "itl_ms" in r]
    if par:
        graphs = all(r.get("graphs") for r in par)
        out += [f"## Study 2: parallel generation, Tessera with / without shared_prefix=\"auto\" "
                f"({'decode steps from CUDA graphs' if graphs else 'no CUDA graphs'})", "",
                "| prompt median | n | prompts | ITL median none / auto (ms) | ratio | none / none again | "
                "ITL p99 none / auto | TTFT median none / auto | decode step: plan + GPU, none / auto (ms) | "
                "plans with groups | detection (us) |",
                "|---|---|---|---|---|---|---|---|---|---|---|"]
        by = {}
        for r in par:
            by.setdefault((r.get("prompt_median", 0), r["n"]), {})[r["arm"]] = r
        for (median, n), arms in sorted(by.items()):
            a, b = arms.get("auto"), arms.get("none")
            if not (a and b):
                continue
            st = a.get("backend_stats", {})
            grouped = st.get("grouped_fraction", st.get("split_fraction", float("nan")))
            again = arms.get("none-again")
            aa = _f(b['itl_ms']['median'] / again['itl_ms']['median'], 3) if again else ""
            sb, sa = b["steps"], a["steps"]
            out.append(f"| {median} | {n} | {a['prompts']} | {_f(b['itl_ms']['median'])} / "
                       f"{_f(a['itl_ms']['median'])} | {_f(a.get('itl_ratio', b['itl_ms']['median'] / a['itl_ms']['median']), 3)} | {aa} | "
                       f"{_f(b['itl_ms']['p99'])} / {_f(a['itl_ms']['p99'])} | {_f(b['ttft_ms']['median'], 1)} / "
                       f"{_f(a['ttft_ms']['median'], 1)} | {_f(sb.get('decode_plan_ms_median'))} + "
                       f"{_f(sb.get('decode_gpu_ms_median'))} / {_f(sa.get('decode_plan_ms_median'))} + "
                       f"{_f(sa.get('decode_gpu_ms_median'))} | {_f(100 * grouped, 0)}% | "
                       f"{_f(st.get('detect_us_median'), 1)} |")
        out.append("")
    st = doc.get("streaming", [])
    if st:
        out += ["## Study 3: Streaming-LLM, RoPE fused in the kernel vs a separate kernel", "",
                "| batch | KV per sample | fused ITL median / p99 (ms) | unfused ITL median / p99 (ms) "
                "| unfused / fused | first-step logits diff |", "|---|---|---|---|---|---|"]
        by = {}
        for r in st:
            by.setdefault(r["batch"], {})[r["arm"]] = r
        for b, arms in sorted(by.items()):
            f, u = arms.get("fused"), arms.get("unfused")
            if f and u:
                out.append(f"| {b} | {f['kv_len']} | {_f(f['itl_ms']['median'])} / {_f(f['itl_ms']['p99'])} | "
                           f"{_f(u['itl_ms']['median'])} / {_f(u['itl_ms']['p99'])} | "
                           f"{_f(u['itl_ms']['median'] / f['itl_ms']['median'], 3)} | "
                           f"{u.get('vs_fused_first_step', float('nan')):.1e} |")
        out.append("")
    for k, v in doc.get("notes", {}).items():
        out.append(f"- {k}: {v}")
    return "\n".join(out) + "\n"


def plot(doc, path):
    """The PNG: ITL and TTFT per backend and rate, parallel generation, Streaming-LLM. '' or why not."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except Exception as e:
        return f"matplotlib not importable ({type(e).__name__}): no plot"
    fig, ax = plt.subplots(2, 2, figsize=(12, 8.5))
    rows = [r for r in doc.get("serving", []) if "itl_ms" in r]
    for name in dict.fromkeys(r["backend"] for r in rows):
        rs = sorted((r for r in rows if r["backend"] == name), key=lambda r: r["rate"])
        x = [r["rate"] for r in rs]
        line, = ax[0, 0].plot(x, [r["itl_ms"]["median"] for r in rs], "o-", label=f"{name} median")
        ax[0, 0].plot(x, [r["itl_ms"]["p99"] for r in rs], "x--", color=line.get_color(), label=f"{name} p99")
        line, = ax[0, 1].plot(x, [r["ttft_ms"]["median"] for r in rs], "o-", label=f"{name} median")
        ax[0, 1].plot(x, [r["ttft_ms"]["p99"] for r in rs], "x--", color=line.get_color(), label=f"{name} p99")
    for a, title in ((ax[0, 0], "Study 1: inter-token latency"), (ax[0, 1], "Study 1: time to first token")):
        a.set_xlabel("request rate (req/s)")
        a.set_ylabel("ms")
        a.set_title(title)
        a.grid(alpha=0.3)
        if rows:
            a.legend(fontsize=7)
    if rows:
        ax[0, 0].set_yscale("log")
        ax[0, 1].set_yscale("log")
    par = [r for r in doc.get("parallel", []) if "itl_ms" in r]
    a = ax[1, 0]
    for median in sorted({r.get("prompt_median", 0) for r in par}):
        for arm, label in (("none", "shared_prefix=None"), ("auto", 'shared_prefix="auto"')):
            rs = sorted((r for r in par if r["arm"] == arm and r.get("prompt_median", 0) == median),
                        key=lambda r: r["n"])
            if rs:
                a.plot([r["n"] for r in rs], [r["itl_ms"]["median"] for r in rs], "o-" if arm == "auto" else "x--",
                       label=f"prompts ~{median}: {label}")
    a.set_xscale("log", base=2)
    a.set_xlabel("samples per prompt (n)")
    a.set_ylabel("ITL median (ms)")
    a.set_title("Study 2: parallel generation (Tessera)")
    a.grid(alpha=0.3)
    if par:
        a.legend(fontsize=7)
    st = doc.get("streaming", [])
    a = ax[1, 1]
    batches = sorted({r["batch"] for r in st})
    for i, arm in enumerate(("fused", "unfused")):
        vals = [next((r["itl_ms"]["median"] for r in st if r["batch"] == b and r["arm"] == arm), 0) for b in batches]
        a.bar([j + 0.4 * i for j in range(len(batches))], vals, width=0.4, label=f"RoPE {arm}")
    a.set_xticks([j + 0.2 for j in range(len(batches))], [f"batch {b}" for b in batches])
    a.set_ylabel("ITL median (ms)")
    a.set_title("Study 3: Streaming-LLM (sinks + window)")
    a.grid(alpha=0.3, axis="y")
    if st:
        a.legend(fontsize=7)
    for a, present in ((ax[0, 0], rows), (ax[0, 1], rows), (ax[1, 0], par), (ax[1, 1], st)):
        if not present:
            a.text(0.5, 0.5, "not run", ha="center", va="center", transform=a.transAxes, color="gray")
    fig.suptitle(f"Serving loop, {doc.get('device', '?')}, {doc['model']['layers']} layers ({doc.get('mode', '')})")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return ""
