#!/usr/bin/env bash
# Quick start (b): install what is missing, build, and run every test, in
# phases that each print a header line and, when done, their time:
#   build    install what is missing (scripts/setup.sh), then CMake preset
#            "default": library, CLI, C++ tests, Python extension
#   kernels  every built-in kernel JIT-compiled for sm_80 and sm_90a (no GPU
#            needed); this fills the run's kernel cache, which the tests reuse
#   C++      the GoogleTest suite, the JIT suites beside the rest
#   Python   the pytest suite
#   package  the C++ example built against an installed prefix
#            (find_package) and as a subproject (add_subdirectory), and run
# Without a GPU the GPU tests skip; skips are summed by reason in one line
# each, failures are shown in full. Ends with one line that CI parses,
#   total: N passed, N failed, N skipped
# and exits non-zero if anything failed.
#
# TESSERA_CACHE_DIR (default build/jitcache) is the kernel cache every phase
# shares. Logs of the last run stay in build/test-logs/. To add a phase, write
# a function that returns non-zero on failure and list it in `phases` below.
set -uo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
TESSERA_ROOT="$root" source scripts/env.sh
export TESSERA_CACHE_DIR="${TESSERA_CACHE_DIR:-$root/build/jitcache}"

logs="$root/build/test-logs"
# Everything the build and the tests put in a temp dir goes here, and is
# removed at the end; what is left is named, as a test that leaves files
# behind has a bug.
scratch="$root/build/test-tmp"
rm -rf "$logs" "$scratch"
mkdir -p "$logs" "$scratch"
export TMPDIR="$scratch"

passed=0 failed=0 skipped=0
: >"$logs/skips"  # "COUNT<TAB>REASON" lines, summed at the end

elapsed() { printf '%dm%02ds' $(($1 / 60)) $(($1 % 60)); }

# ------------------------------------------------------------------ phases
phase_build() {
  bash scripts/setup.sh && TESSERA_ROOT="$root" source scripts/env.sh && bash scripts/build.sh
}

phase_kernels() {
  ./build/tessera compile --arch sm_80,sm_90a 2>&1 | tee "$logs/kernels.txt"
}

# One gtest process's output ($1) and exit status ($2), shown without the
# per-test skip notes (counted by reason instead) and added to the counts.
# Failures stay whole; a process that fails without a failed test (a crash,
# no tests run) counts as one failure.
gtest_report() {
  local out="$1" rc="$2" total skip fail
  awk -v skips="$logs/skips" '
    /^Running main\(\) from / { next }
    /: Skipped$/ { if ((getline reason) > 0) n[reason]++; next }
    { print }
    END { for (r in n) printf "%d\t%s\n", n[r], r >> skips }' "$out"
  total=$(sed -n 's/^\[==========\] \([0-9]*\) tests\? from .* ran.*/\1/p' "$out" | tail -1)
  skip=$(sed -n 's/^\[  SKIPPED \] \([0-9]*\) tests\?.*/\1/p' "$out" | tail -1)
  fail=$(grep -c '^\[  FAILED  \] .*([0-9]* ms)$' "$out")
  total=${total:-0} skip=${skip:-0} fail=${fail:-0}
  passed=$((passed + total - skip - fail)) skipped=$((skipped + skip))
  if [ "$fail" -eq 0 ] && { [ "$rc" -ne 0 ] || [ "$total" -eq 0 ]; }; then
    echo "test.sh: $out: exit status $rc, $total tests ran, none reported failed"
    fail=1
  fi
  failed=$((failed + fail))
  [ "$fail" -eq 0 ]
}

# The JIT suites spend their time in NVRTC (CPU only, no GPU); the rest take
# seconds together. Three processes run side by side, each reported when it
# ends, with a line every 30 s while any is still running.
phase_cpp() {
  local bin=./build/tessera_tests ok=0 start=$SECONDS last=$SECONDS
  local -a names=("non-JIT suites" "Jit" "VariantJit")
  local -a filters=("-Jit.*:VariantJit.*" "Jit.*" "VariantJit.*")
  local -A pids=()
  echo "  $("$bin" --gtest_list_tests | grep -c '^  ') tests in ${#names[@]} processes: ${names[*]}"
  for i in "${!names[@]}"; do
    "$bin" --gtest_brief=1 --gtest_filter="${filters[$i]}" >"$logs/gtest_$i.txt" 2>&1 &
    pids[$i]=$!
  done
  while [ ${#pids[@]} -gt 0 ]; do
    sleep 1
    for i in "${!pids[@]}"; do
      kill -0 "${pids[$i]}" 2>/dev/null && continue
      wait "${pids[$i]}"
      local rc=$? before=$((passed + failed + skipped)) fails=$failed
      unset "pids[$i]"
      gtest_report "$logs/gtest_$i.txt" "$rc" >"$logs/gtest_$i.shown" || ok=1
      grep -vE '^\[(==========|  PASSED  |  SKIPPED )\] ' "$logs/gtest_$i.shown"
      echo "  ${names[$i]}: $((passed + failed + skipped - before)) tests, $((failed - fails)) failed ($(elapsed $((SECONDS - start))))"
    done
    if [ ${#pids[@]} -gt 0 ] && [ $((SECONDS - last)) -ge 30 ]; then
      last=$SECONDS
      local running=()
      for i in "${!pids[@]}"; do running+=("${names[$i]}"); done
      echo "  ... still running: ${running[*]} ($(elapsed $((SECONDS - start))))"
    fi
  done
  return $ok
}

phase_python() {
  local out="$logs/pytest.txt" last count rc
  # -rs records skip reasons in the log; the screen gets them as counts.
  PYTHONPATH="$root/python" "$TESSERA_PYTHON" -m pytest -q -rs -p no:cacheprovider tests/python 2>&1 |
    tee "$out" | grep --line-buffered -vE '^SKIPPED \[[0-9]+\] |^=+ short test summary info =+$'
  rc=${PIPESTATUS[0]}
  sed -n 's/^SKIPPED \[\([0-9]*\)\] [^:]*:[0-9]*: \(.*\)/\1\t\2/p' "$out" >>"$logs/skips"
  last=$(grep -E '[0-9]+ (passed|failed|skipped)' "$out" | tail -1)
  count() { echo "$last" | grep -oE "[0-9]+ $1" | grep -oE '[0-9]+' | head -1; }
  local p f e s
  p=$(count passed) f=$(count failed) e=$(count error) s=$(count skipped)
  p=${p:-0} f=${f:-0} e=${e:-0} s=${s:-0}
  passed=$((passed + p)) failed=$((failed + f + e)) skipped=$((skipped + s))
  [ $((p + f + s)) -gt 0 ] || { echo "test.sh: the Python suite did not run"; return 1; }
  [ "$rc" -eq 0 ]
}

# The C++ package (scripts/check_package.sh) counts as one check.
phase_package() {
  if bash scripts/check_package.sh 2>&1 | tee "$logs/package.txt"; then
    passed=$((passed + 1))
  else
    failed=$((failed + 1)); return 1
  fi
}

# name|title; a phase marked "!" stops the run when it fails.
phases=(
  "phase_build|build!"
  "phase_kernels|compile every built-in kernel for sm_80 and sm_90a"
  "phase_cpp|C++ tests"
  "phase_python|Python tests"
  "phase_package|C++ package (find_package and add_subdirectory)"
)

# ------------------------------------------------------------------ run
status=0
start_all=$SECONDS
for i in "${!phases[@]}"; do
  fn=${phases[$i]%%|*} title=${phases[$i]#*|} fatal=0
  [ "${title: -1}" = "!" ] && fatal=1 title=${title%!}
  tag="[$((i + 1))/${#phases[@]}]"
  echo "$tag $title"
  t0=$SECONDS
  if "$fn"; then result=ok; else result=FAILED status=1; fi
  echo "$tag $title: $result, $(elapsed $((SECONDS - t0)))"
  if [ $status -ne 0 ] && [ $fatal -eq 1 ]; then
    echo "test.sh: $title failed; stopping"
    exit 1
  fi
done

if [ -n "$(ls -A "$scratch")" ]; then
  echo "test.sh: warning: left in the temp dir by the build or the tests (now removed):"
  ls -A "$scratch" | head -20 | sed 's/^/  /'
fi
rm -rf "$scratch"

awk -F'\t' '{ n[$2] += $1 } END { for (r in n) print n[r] "\t" r }' "$logs/skips" | sort -rn |
  while IFS=$'\t' read -r n reason; do
    case "$reason" in skipped*) echo "$n $reason" ;; *) echo "$n skipped: $reason" ;; esac
  done
[ "$failed" -eq 0 ] || status=1
echo "time: $(elapsed $((SECONDS - start_all))) | logs: build/test-logs/"
echo "total: $passed passed, $failed failed, $skipped skipped"
exit $status
