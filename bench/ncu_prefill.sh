#!/usr/bin/env bash
# Profile one Tessera prefill configuration with Nsight Compute and print
# what decides the Hopper kernel's speed: pipe utilization (tensor, MUFU,
# shared memory), issue activity, warp stall reasons, and the SASS lines with
# the most stall samples. Run on the GPU machine after scripts/gpu_suite.sh
# has built the extension:
#   bench/ncu_prefill.sh OUTDIR [prefill_one.py args...]
# (TESSERA_SM90_DEFINES passes -D switches to the JIT, as for any run.)
set -euo pipefail
out="$1"; shift
root="$(cd "$(dirname "$0")/.." && pwd)"
mkdir -p "$out"
rep="$out/prefill"
PYTHONPATH="$root/python" ncu -f -o "$rep" -k regex:tessera_prefill --launch-skip 5 --launch-count 1 \
  --section SpeedOfLight --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis \
  --section WarpStateStats --section SchedulerStats --section InstructionStats --section SourceCounters \
  --import-source no python3 "$root/bench/prefill_one.py" "$@" >"$out/ncu_run.log" 2>&1 || { tail -20 "$out/ncu_run.log"; exit 1; }
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
# SASS lines by stall samples (warp-level sampling), the top 40.
ncu -i "$rep.ncu-rep" --page source --csv --print-source sass >"$out/sass.csv" 2>/dev/null || true
python3 - "$out/sass.csv" <<'PY'
import csv, sys
rows = list(csv.reader(open(sys.argv[1])))
if not rows:
    sys.exit()
hdr = rows[0]
def col(*names):
    for n in names:
        for i, h in enumerate(hdr):
            if h.strip() == n:
                return i
    return None
src, samp, ex = col("Source"), col("Warp Stall Sampling (All Samples)", "Sampling Data (All)"), col("Instructions Executed")
addr = col("Address")
if src is None or samp is None:
    print("sass columns:", hdr[:20]); sys.exit()
data = []
for r in rows[1:]:
    try:
        data.append((float(r[samp] or 0), r[addr] if addr is not None else "", r[src], r[ex] if ex is not None else ""))
    except (ValueError, IndexError):
        pass
total = sum(d[0] for d in data) or 1
print(f"stall samples: {total:.0f}")
for s, a, text, e in sorted(data, reverse=True)[:40]:
    print(f"{100 * s / total:5.1f}% {a} {text.strip()[:70]} (exec {e})")
PY
