#!/usr/bin/env bash
# Quick start (b): install what is missing, build, and run every test: the C++
# suite (GoogleTest; GPU tests report "skipped: no GPU" without one), every
# built-in kernel JIT-compiled for sm_80 and sm_90a, the Python suite, and the
# C++ package (scripts/check_package.sh).
# Ends with one line: "total: N passed, N failed, N skipped".
set -uo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
bash scripts/setup.sh || exit 1
bash scripts/build.sh || exit 1
TESSERA_ROOT="$root" source scripts/env.sh
export TESSERA_CACHE_DIR="${TESSERA_CACHE_DIR:-$root/build/jitcache}"

log=$(mktemp -d)
status=0
./build/tessera_tests --gtest_brief=1 2>&1 | tee "$log/gtest.txt" || status=1
./build/tessera compile --arch sm_80,sm_90a 2>&1 | tee "$log/compile.txt" || status=1
PYTHONPATH="$root/python" "$TESSERA_PYTHON" -m pytest -q -rs tests/python 2>&1 | tee "$log/pytest.txt" || status=1

# C++ package: the example built against an installed prefix (find_package)
# and as a subproject (add_subdirectory), and run; counts as one check.
pkg_pass=0; pkg_fail=0
if bash scripts/check_package.sh 2>&1 | tee "$log/package.txt"; then pkg_pass=1; else pkg_fail=1; status=1; fi

# Counts from both runners, summed into the closing line.
g_total=$(sed -n 's/.*\[==========\] \([0-9]*\) tests\? from .* ran.*/\1/p' "$log/gtest.txt" | tail -1)
g_skip=$(sed -n 's/.*\[  SKIPPED \] \([0-9]*\) tests\?.*/\1/p' "$log/gtest.txt" | tail -1)
g_fail=$(grep -c '^\[  FAILED  \] .*([0-9]* ms)$' "$log/gtest.txt")
g_total=${g_total:-0}; g_skip=${g_skip:-0}; g_fail=${g_fail:-0}
[ "$g_total" -gt 0 ] || { echo "test.sh: the C++ suite did not run"; status=1; }
g_pass=$((g_total - g_skip - g_fail))
last=$(grep -E '[0-9]+ (passed|failed|skipped)' "$log/pytest.txt" | tail -1)
count() { echo "$last" | grep -oE "[0-9]+ $1" | grep -oE '[0-9]+' | head -1; }
p_pass=$(count passed); p_pass=${p_pass:-0}
p_fail=$(count failed); p_fail=${p_fail:-0}
p_err=$(count error); p_err=${p_err:-0}
p_skip=$(count skipped); p_skip=${p_skip:-0}
[ $((p_pass + p_fail + p_skip)) -gt 0 ] || { echo "test.sh: the Python suite did not run"; status=1; }
fail=$((g_fail + p_fail + p_err + pkg_fail))
[ "$fail" -eq 0 ] || status=1
echo "C++: $g_pass passed, $g_fail failed, $g_skip skipped | Python: $p_pass passed, $((p_fail + p_err)) failed, $p_skip skipped | package: $pkg_pass passed, $pkg_fail failed"
echo "total: $((g_pass + p_pass + pkg_pass)) passed, $fail failed, $((g_skip + p_skip)) skipped"
rm -rf "$log"
exit $status
