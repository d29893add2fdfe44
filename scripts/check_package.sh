#!/usr/bin/env bash
# Checks the C++ package the way a user consumes it, with examples/paged_attention:
#  1. install: `cmake --install` of the library into a temporary prefix, then
#     the example configured with find_package(tessera CONFIG) against it,
#     built with no extra flags, and run;
#  2. add_subdirectory: the example built with Tessera's sources as a
#     subproject (library only: tests, tools and Python default off), and run.
# Without a GPU the example checks the API's CPU path and says so.
#
# The install reuses build/ (scripts/build.sh) when it is configured, and the
# subproject build is kept in build/package-subdir, so a second run only
# rebuilds what changed. --fresh builds everything in the temporary folder
# (a library build from scratch: a few minutes on 2 cores).
# Ends with "package: PASS" or "package: FAIL"; exit status 0 only on PASS.
set -uo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
TESSERA_ROOT="$root" source scripts/env.sh

fresh=0
case "${1:-}" in
  --fresh) fresh=1 ;;
  "") ;;
  *) echo "usage: scripts/check_package.sh [--fresh]" >&2; exit 2 ;;
esac
[ -f build/CMakeCache.txt ] || fresh=1

tmp="$(mktemp -d "${TMPDIR:-/tmp}/tessera-package.XXXXXX")" || { echo "package: FAIL (no temporary folder)"; exit 1; }
trap 'rm -rf "$tmp"' EXIT
export TESSERA_CACHE_DIR="${TESSERA_CACHE_DIR:-$tmp/jitcache}"
gen=()
command -v ninja >/dev/null && gen=(-G Ninja)
jobs="$(nproc)"
example="$root/examples/paged_attention"
t0=$SECONDS

# Runs a build step quietly; its log is shown only when it fails.
quiet() {
  local name="$1"; shift
  if ! "$@" >"$tmp/$name.log" 2>&1; then
    tail -n 40 "$tmp/$name.log"
    echo "package: FAIL ($name: $*)"
    exit 1
  fi
}

# --- 1. install + find_package ------------------------------------------------
prefix="$tmp/prefix"
if [ "$fresh" = 1 ]; then
  echo "package: building the library alone (tests, tools, Python off)"
  quiet configure-library cmake -S "$root" -B "$tmp/library" "${gen[@]}" -DCMAKE_BUILD_TYPE=Release \
    -DTESSERA_BUILD_TESTS=OFF -DTESSERA_BUILD_TOOLS=OFF -DTESSERA_BUILD_PYTHON=OFF -DTESSERA_NVCC_CHECK=OFF
  quiet build-library cmake --build "$tmp/library" --target tessera -j "$jobs"
  quiet install cmake --install "$tmp/library" --prefix "$prefix" --component dev
else
  echo "package: installing the library of build/"
  quiet build-library cmake --build build --target tessera -j "$jobs"
  quiet install cmake --install build --prefix "$prefix" --component dev
fi
[ -f "$prefix/lib/cmake/tessera/tesseraConfig.cmake" ] && [ -f "$prefix/include/tessera/tessera.hpp" ] || {
  echo "package: FAIL (the install has no tesseraConfig.cmake or headers)"; exit 1; }
echo "package: installed $(find "$prefix" -type f | wc -l) files into a temporary prefix"
if [ "$fresh" = 0 ]; then  # build/ has the tool, so the install ships the kernel pack
  n=$(find "$prefix/share/tessera/kernels" -name '*.cubin' 2>/dev/null | wc -l)
  [ "$n" -gt 0 ] || { echo "package: FAIL (the install has no kernel pack in share/tessera/kernels)"; exit 1; }
  echo "package: the install ships $n prebuilt kernels"
fi

quiet configure-find-package cmake -S "$example" -B "$tmp/find-package" "${gen[@]}" -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_PREFIX_PATH="$prefix"
quiet build-find-package cmake --build "$tmp/find-package" -j "$jobs"
echo "package: example built with find_package(tessera); running it"
"$tmp/find-package/paged_attention" || { echo "package: FAIL (find_package example)"; exit 1; }

# --- 2. add_subdirectory --------------------------------------------------------
sub="$root/build/package-subdir"
[ "$fresh" = 1 ] && sub="$tmp/subdir"
echo "package: building the example with add_subdirectory(<tessera source>)"
quiet configure-subdir cmake -S "$example" -B "$sub" "${gen[@]}" -DCMAKE_BUILD_TYPE=Release \
  -DTESSERA_SOURCE_DIR="$root"
quiet build-subdir cmake --build "$sub" -j "$jobs"
echo "package: example built with add_subdirectory; running it"
"$sub/paged_attention" || { echo "package: FAIL (add_subdirectory example)"; exit 1; }

echo "package: PASS ($((SECONDS - t0)) s)"
