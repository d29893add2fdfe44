#!/usr/bin/env bash
# The GPU workflow, in one call on a machine with an NVIDIA GPU and the CUDA
# toolkit, no network needed: build everything, run the C++ GPU suite
# (sharded over processes) and the Python suite against the reference, time
# JIT cold compile / warm disk load / load onto the GPU, run the demo, and
# print a short summary last.
#
#   scripts/gpu_suite.sh [--cache TGZ] [--out DIR] [--sanitize] [--filter GTEST_FILTER]
#                        [--pytest EXPR] [--quick] [--bench "SCRIPT ARGS"]...
#     --cache TGZ   restore the JIT disk cache from TGZ first (if it exists)
#                   and save the cubins it used back to DIR/jitcache.tgz.N (scripts/jitcache.sh)
#     --out DIR     where logs.tgz, summary.txt and jitcache.tgz go (default: $OUT or ./gpu-out)
#     --sanitize    also run a GPU subset under compute-sanitizer (memcheck)
#     --filter F    run only the C++ tests matching the GoogleTest filter F ("-": none,
#                   e.g. to split a run whose JIT cache is cold over two calls)
#     --pytest E    run only the Python tests matching pytest's -k expression E ("-": none)
#     --quick       skip the JIT timing and the demo (iteration runs)
#     --bench CMD   after the tests, run a benchmark script (repeatable), e.g.
#                   --bench "bench/prefill.py --parts a"; its JSON lands in DIR too
# GoogleTest: the system's, else Debian's libgtest-dev .deb unpacked from .deps/
# (fetch it once with: mkdir -p .deps && cd .deps && apt-get download libgtest-dev).
set -uo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
cache_tgz=""; out="${OUT:-$root/gpu-out}"; sanitize=0; filter="*"; pyexpr=""; quick=0; benches=()
while [ $# -gt 0 ]; do
  case "$1" in
    --cache) cache_tgz="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    --sanitize) sanitize=1; shift ;;
    --filter) filter="$2"; shift 2 ;;
    --pytest) pyexpr="$2"; shift 2 ;;
    --quick) quick=1; shift ;;
    --bench) benches+=("$2"); shift 2 ;;
    *) echo "usage: $0 [--cache TGZ] [--out DIR] [--sanitize] [--filter F] [--pytest E] [--quick] [--bench CMD]..."; exit 2 ;;
  esac
done
mkdir -p "$out"
logs=/tmp/tessera-gpu-logs; rm -rf "$logs"; mkdir -p "$logs"
TESSERA_ROOT="$root" source scripts/env.sh
export TESSERA_CACHE_DIR=/tmp/tessera-jitcache
source scripts/jitcache.sh
jitcache_restore "$cache_tgz" && echo "jit cache restored: $(ls "$TESSERA_CACHE_DIR" | grep -c cubin) cubins"
summary=(); failed=0
note() { summary+=("$1"); }

nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$logs/gpu.txt"

gtest_args=()
if [ ! -f /usr/include/gtest/gtest.h ]; then
  for f in .deps/libgtest-dev_*.deb; do [ -f "$f" ] && dpkg -x "$f" /tmp/gtest-root; done
  gtest_args=(-DGTest_DIR=/tmp/gtest-root/usr/lib/x86_64-linux-gnu/cmake/GTest)
fi
t0=$(date +%s)
cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DTESSERA_BUILD_PYTHON=ON -DTESSERA_BUILD_TESTS=ON \
  -DPython_EXECUTABLE="$TESSERA_PYTHON" "${gtest_args[@]}" >"$logs/configure.log" 2>&1 || { cat "$logs/configure.log"; exit 1; }
if ! cmake --build build-gpu -j "$(nproc)" >"$logs/build.log" 2>&1; then
  grep -E "error|Error" -A3 "$logs/build.log" | head -60; exit 1
fi
note "build: $(( $(date +%s) - t0 )) s"

# JIT: cold compile into an empty cache, then a second process loads from disk.
if [ "$quick" = 0 ]; then
  cold=/tmp/tessera-cold; rm -rf "$cold"
  TESSERA_CACHE_DIR=$cold ./build-gpu/tessera compile --arch sm_90a | tee "$logs/jit_cold.txt"
  TESSERA_CACHE_DIR=$cold ./build-gpu/tessera compile --arch sm_90a --load | tee "$logs/jit_warm.txt"
  note "jit cold: $(grep -o 'compiled [0-9]* (mean [0-9.]* ms, max [0-9.]* ms' "$logs/jit_cold.txt")"
  note "jit warm: $(grep -o 'from disk [0-9]* (mean [0-9.]* ms, max [0-9.]* ms' "$logs/jit_warm.txt")"
  note "jit load: $(grep -o 'mean [0-9.]* ms, max [0-9.]* ms per kernel (cubin.*' "$logs/jit_warm.txt")"
fi

# C++ suite, sharded over 8 processes on the one GPU.
t0=$(date +%s)
if [ "$filter" != "-" ]; then
  shards=8; pids=()
  for i in $(seq 0 $((shards - 1))); do
    GTEST_TOTAL_SHARDS=$shards GTEST_SHARD_INDEX=$i ./build-gpu/tessera_tests --gtest_brief=1 --gtest_filter="$filter" \
      >"$logs/gtest_$i.log" 2>&1 &
    pids+=($!)
  done
  gfail=0; for p in "${pids[@]}"; do wait "$p" || gfail=1; done
  gp=0; gs=0; gf=0
  for i in $(seq 0 $((shards - 1))); do
    t=$(sed -n 's/.*\[==========\] \([0-9]*\) tests\? from .* ran.*/\1/p' "$logs/gtest_$i.log" | tail -1)
    s=$(sed -n 's/.*\[  SKIPPED \] \([0-9]*\) tests\?.*/\1/p' "$logs/gtest_$i.log" | tail -1)
    f=$(grep -c '^\[  FAILED  \] .*([0-9]* ms)$' "$logs/gtest_$i.log")
    gp=$((gp + ${t:-0} - ${s:-0} - ${f:-0})); gs=$((gs + ${s:-0})); gf=$((gf + ${f:-0}))
  done
  cat "$logs"/gtest_*.log | grep -E "FAILED|Failure|error|Expected|Which is|rel error" | head -40
  [ "$gf" -eq 0 ] && [ "$gfail" -eq 0 ] && [ "$gp" -gt 0 ] || failed=1
  note "C++ tests: $gp passed, $gf failed, $gs skipped ($(( $(date +%s) - t0 )) s)"
fi

t0=$(date +%s)
if [ "$pyexpr" != "-" ]; then
  PYTHONPATH="$root/python${PYTHONPATH:+:$PYTHONPATH}" "$TESSERA_PYTHON" -m pytest -q -rs -x tests/python ${pyexpr:+-k "$pyexpr"} 2>&1 | \
    tee "$logs/pytest.log" | tail -15
  [ "${PIPESTATUS[0]}" -eq 0 ] || failed=1
  note "Python tests: $(grep -E '[0-9]+ (passed|failed)' "$logs/pytest.log" | tail -1) ($(( $(date +%s) - t0 )) s)"
fi

if [ "$quick" = 0 ]; then
  ./build-gpu/tessera demo 2>&1 | tee "$logs/demo.txt"
  [ "${PIPESTATUS[0]}" -eq 0 ] || failed=1
  while read -r line; do note "demo $line"; done < <(grep -E "^(decode|prefill|step) " "$logs/demo.txt" | cut -c1-150)
fi

# Benchmarks (their JSON goes to bench/results/ and, via OUT, to DIR).
for b in "${benches[@]}"; do
  echo "### $b"
  # shellcheck disable=SC2086
  PYTHONUNBUFFERED=1 OUT="$out" PYTHONPATH="$root/python${PYTHONPATH:+:$PYTHONPATH}" "$TESSERA_PYTHON" $b 2>&1 | tee -a "$logs/bench.log" | \
    grep -vE "^(W|I)[0-9]{4} " || failed=1
done

if [ "$sanitize" = 1 ] && command -v compute-sanitizer >/dev/null; then
  compute-sanitizer --tool memcheck --leak-check full --error-exitcode 9 ./build-gpu/tessera_tests \
    --gtest_filter='All/MergeGpu.*/0:All/MergeGpu.*/4:All/SingleDecodeGpu.*/0:All/BatchGpu.*/5:BatchGpuErrors.*:All/DecodeGpu.*/0:All/DecodeTensorCoresGpu.*/3:DecodeTensorCoresGpuExtra.ShortStepStaysUnsplit:All/PrefillPaged.*/76:All/PrefillPaged.*/77:All/PrefillPaged.*/178:All/PrefillPaged.*/188:All/PrefillPaged.*/190:All/PrefillPaged.*/191:All/PrefillTma.*/23:All/PrefillQTma.*/19:All/PrefillQTma.*/45:All/PrefillRagged.*/7:All/PrefillBsr.*/4:All/Cascade.*/0:All/Cascade.*/13:CascadeGraph.*:All/DevicePageIdsDecode.BadIdRaisedByTheNextCall/*:DevicePageIdsPrefill.*:All/PdlDecode.*:Structured/PrefillMaskTrim.*/0:Structured/PrefillMaskTrim.*/3:Structured/PrefillMaskTrim.*/4:All/PrefillCustomMask.*/0:All/PrefillCustomMask.*/1:All/PrefillCustomMask.*/5:Kernels/DevicePlanDecode.BadDeviceInput*:DevicePlanDecodeExtra.*:All/PrefillPairGpu.*/2:All/PrefillPairGpu.*/21:All/PrefillPairGpu.*/33:PrefillPairGpuArgs.*:Templates/MlaGpuBackend.CudaGraphReplayWithChangedLengths/*:MlaGpu.BadDevicePageIdIsRaisedByTheNextCall:All/MergeIntoOutput.*/1:All/MergeIntoOutput.*/2:All/MergeIntoOutput.*/15:All/SharedPrefixDecode.*/1:All/SharedPrefixDecode.*/3:SharedPrefixDecodeGraph.*:All/SharedPrefixPrefill.*/1:All/Fp8MmaPrefillGpu.*/0' \
    >"$logs/sanitizer.log" 2>&1
  rc=$?; [ "$rc" -eq 0 ] || failed=1
  note "compute-sanitizer memcheck: rc=$rc $(grep -E 'ERROR SUMMARY' "$logs/sanitizer.log" | tail -1)"
fi

[ -n "$cache_tgz" ] && note "$(jitcache_save "$out")"
tar czf "$out/logs.tgz" -C "$logs" .
{
  echo
  echo "==================== GPU suite summary ===================="
  for line in "${summary[@]}"; do echo "$line"; done
  echo "result: $([ "$failed" = 0 ] && echo PASS || echo FAIL)"
} | tee "$out/summary.txt"
exit "$failed"
