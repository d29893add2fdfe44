#!/usr/bin/env bash
# Builds the Python extension tessera._C in-tree (into python/tessera/) for
# the tests: `PYTHONPATH=python python3 -m pytest tests/python`.
#
# Uses its own build directory (build-py) with the C++ tests off, so it does
# not disturb the `default` preset's build tree. Needs nanobind installed in
# the active python3 (scripts/setup.sh installs it).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD_DIR="${TESSERA_PY_BUILD_DIR:-${ROOT}/build-py}"
PYTHON="$(command -v python3 || true)"

if [[ -z "${PYTHON}" ]]; then
  echo "error: python3 not found on PATH" >&2
  exit 1
fi
if ! "${PYTHON}" -m nanobind --cmake_dir >/dev/null 2>&1; then
  echo "error: nanobind is not installed for ${PYTHON}." >&2
  echo "       Run scripts/setup.sh (or: ${PYTHON} -m pip install nanobind) and retry." >&2
  exit 1
fi

cmake -S "${ROOT}" -B "${BUILD_DIR}" -G Ninja \
  -DCMAKE_BUILD_TYPE="${CMAKE_BUILD_TYPE:-Release}" \
  -DTESSERA_BUILD_PYTHON=ON \
  -DTESSERA_BUILD_TESTS=OFF \
  -DPython_EXECUTABLE="${PYTHON}"
cmake --build "${BUILD_DIR}" --target _C -j"$(nproc)"

echo "built: $(ls "${ROOT}"/python/tessera/_C*.so)"
