#!/usr/bin/env bash
# Builds the Python extension and runs benchmark scripts on a GPU machine (no
# network needed), restoring/saving the JIT disk cache like gpu_suite.sh:
#   scripts/gpu_bench.sh [--cache TGZ] [--out DIR] bench/decode.py [args] [-- bench/prefill.py [args] ...]
# Each benchmark writes its JSON under bench/results/ (and DIR when OUT is set).
set -uo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
cache_tgz=""; out="${OUT:-$root/gpu-out}"
while [ $# -gt 0 ]; do
  case "$1" in
    --cache) cache_tgz="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    *) break ;;
  esac
done
mkdir -p "$out"
TESSERA_ROOT="$root" source scripts/env.sh
export TESSERA_CACHE_DIR=/tmp/tessera-jitcache PYTHONUNBUFFERED=1
source scripts/jitcache.sh
jitcache_restore "$cache_tgz"
cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DTESSERA_BUILD_PYTHON=ON -DTESSERA_BUILD_TESTS=OFF \
  -DPython_EXECUTABLE="$TESSERA_PYTHON" >/dev/null || exit 1
cmake --build build-gpu -j "$(nproc)" --target _C >/dev/null || { echo "build failed"; exit 1; }
rc=0
while [ $# -gt 0 ]; do
  cmd=()
  while [ $# -gt 0 ] && [ "$1" != "--" ]; do cmd+=("$1"); shift; done
  [ $# -gt 0 ] && shift
  echo "### ${cmd[*]}"
  PYTHONPATH="$root/python" "$TESSERA_PYTHON" "${cmd[@]}" || rc=1
done
[ -n "$cache_tgz" ] && jitcache_save "$out"
exit $rc
