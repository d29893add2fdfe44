#!/usr/bin/env bash
# Profile one Tessera prefill configuration with Nsight Compute and print
# what decides the Hopper kernel's speed: pipe utilization (tensor, MUFU,
# shared memory), issue activity, warp stall reasons, and the SASS lines with
# the most stall samples. Run on the GPU machine after scripts/gpu_suite.sh
# has built the extension:
#   bench/ncu_prefill.sh OUTDIR [bench/prefill.py --single args: --seq L --kv paged:16 ...]
# NCU_KERNEL picks the kernel (default regex:tessera_prefill), e.g.
# NCU_KERNEL=regex:flash with --sdpa flash profiles the peer, and
# NCU_KERNEL=regex:PrefillWithKVCache with --sdpa flashinfer FlashInfer's fa3 kernel
# (regex:BatchPrefillWithRagged with --sdpa flashinfer --backend fa2: its fa2 kernel).
# NCU_KEEP=1 keeps the per-instruction table (sass.csv) and details.csv.
# NCU_BENCH replaces the profiled command "bench/prefill.py --single" (the
# arguments after OUTDIR follow it), e.g. NCU_BENCH="bench/mla.py --single
# 128:1:64:4096" NCU_KERNEL=regex:tessera_mla for the MLA kernel.
set -euo pipefail
out="$1"; shift
root="$(cd "$(dirname "$0")/.." && pwd)"
mkdir -p "$out"
out="$(cd "$out" && pwd)"
cd "$root"  # NCU_BENCH's paths are the repository's
rep="$out/prefill"
PYTHONPATH="$root/python${PYTHONPATH:+:$PYTHONPATH}" ncu -f -o "$rep" -k "${NCU_KERNEL:-regex:tessera_prefill}" --launch-skip 5 --launch-count 1 \
  --section SpeedOfLight --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis \
  --section WarpStateStats --section SchedulerStats --section InstructionStats --section SourceCounters \
  --import-source no python3 ${NCU_BENCH:-bench/prefill.py --single} "$@" >"$out/ncu_run.log" 2>&1 || { tail -20 "$out/ncu_run.log"; exit 1; }
grep -E "TFLOP/s" "$out/ncu_run.log" || true
ncu -i "$rep.ncu-rep" --page details --csv >"$out/details.csv"
# The metrics that matter, one per line.
grep -E '"(Duration|Compute \(SM\) Throughput|Memory Throughput|Issue Slots Busy|Issued Ipc Active|No Eligible|Active Warps Per Scheduler|Eligible Warps Per Scheduler|Warp Cycles Per Issued Instruction|Executed Instructions|Registers Per Thread|L1/TEX Hit Rate|Mem Pipes Busy|Shared Memory|DRAM Throughput)"' \
  "$out/details.csv" | awk -F'","' '{print $(NF-2) " = " $NF " " $(NF-1)}' | tr -d '"' | sort -u
ncu -i "$rep.ncu-rep" --page raw --csv --metrics \
sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,sm__inst_executed_pipe_xu.avg.pct_of_peak_sustained_active,\
sm__pipe_shared_cycles_active.avg.pct_of_peak_sustained_active,l1tex__data_pipe_lsu_wavefronts_mem_shared.avg.pct_of_peak_sustained_elapsed,\
l1tex__data_bank_conflicts_pipe_lsu_mem_shared.sum,smsp__issue_active.avg.pct_of_peak_sustained_active,\
smsp__average_warp_latency_issue_stalled_barrier.ratio,smsp__average_warp_latency_issue_stalled_long_scoreboard.ratio,\
smsp__average_warp_latency_issue_stalled_wait.ratio,smsp__average_warp_latency_issue_stalled_math_pipe_throttle.ratio,\
smsp__average_warp_latency_issue_stalled_short_scoreboard.ratio,smsp__average_warp_latency_issue_stalled_membar.ratio,\
smsp__average_warp_latency_issue_stalled_mio_throttle.ratio,smsp__average_warp_latency_issue_stalled_lg_throttle.ratio,\
smsp__average_warp_latency_issue_stalled_dispatch_stall.ratio,smsp__average_warp_latency_issue_stalled_not_selected.ratio,\
smsp__average_warp_latency_issue_stalled_selected.ratio,smsp__average_warp_latency_issue_stalled_sleeping.ratio,\
smsp__average_warp_latency_issue_stalled_branch_resolving.ratio,smsp__average_warp_latency_issue_stalled_no_instruction.ratio,\
smsp__average_warp_latency_issue_stalled_misc.ratio,smsp__average_warp_latency_issue_stalled_drain.ratio,\
smsp__average_warp_latency_issue_stalled_tex_throttle.ratio,smsp__average_warp_latency_issue_stalled_imc_miss.ratio \
  >"$out/raw.csv" 2>&1 || true
python3 - "$out/raw.csv" <<'PY'
import csv, sys
rows = list(csv.reader(open(sys.argv[1])))
if len(rows) >= 3:
    for name, val in zip(rows[0], rows[2]):
        if name.startswith(("sm__", "smsp__", "l1tex__")):
            print(f"{name} = {val}")
PY
# SASS lines by stall samples (warp-level sampling): the stall reasons over
# the whole kernel, the 30 hottest lines, and every mbarrier wait with its
# execution count (a wait's retry loop runs once per failed try).
ncu -i "$rep.ncu-rep" --page source --csv --print-source sass >"$out/sass.csv" 2>/dev/null || true
python3 - "$out/sass.csv" <<'PY'
import csv, sys
rows = list(csv.reader(open(sys.argv[1])))
hdr_i = next((i for i, r in enumerate(rows[:5]) if "Address" in r and "Source" in r), None)
if hdr_i is None:
    print("no SASS table"); sys.exit()
hdr = rows[hdr_i]
ix = {h: i for i, h in enumerate(hdr)}
stalls = [h for h in hdr if h.startswith("stall_") and "Not Issued" not in h]
recs = []
for r in rows[hdr_i + 1:]:
    try:
        a = int(r[ix["Address"]], 16)
    except (ValueError, IndexError):
        continue
    num = lambda k: float(r[ix[k]] or 0) if k in ix else 0.0
    recs.append((a, r[ix["Source"]].strip(), num("Warp Stall Sampling (All Samples)"),
                 {k: num(k) for k in stalls}, int(num("Instructions Executed"))))
if not recs:
    sys.exit()
base, total = recs[0][0], sum(r[2] for r in recs) or 1
agg = {k: sum(r[3][k] for r in recs) for k in stalls}
print("stall reasons:", ", ".join(f"{k[6:]} {100 * v / total:.1f}%" for k, v in sorted(agg.items(), key=lambda x: -x[1]) if v))
print("hottest SASS lines (offset, share of samples, instruction, executions, top reason):")
for a, src, smp, d, e in sorted(recs, key=lambda x: -x[2])[:30]:
    top = max(d.items(), key=lambda x: x[1])
    print(f"  {a - base:6x} {100 * smp / total:5.1f}% {src[:64]:64s} x{e} {top[0][6:]}")
print("mbarrier waits (offset, executions):")
for a, src, smp, d, e in recs:
    if "TRYWAIT" in src:
        print(f"  {a - base:6x} x{e} {src[:70]}")
PY
[ "${NCU_KEEP:-0}" = 1 ] || rm -f "$out/sass.csv" "$out/details.csv"
rm -f "$rep.ncu-rep"
