#!/usr/bin/env bash
# Configures (CMake preset "default": library, CLI, tests, Python extension)
# and builds into build/.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
TESSERA_ROOT="$root" source scripts/env.sh
cmake --preset default -DPython_EXECUTABLE="$TESSERA_PYTHON" ${TESSERA_CMAKE_ARGS:-} >/dev/null
cmake --build --preset default -j "$(nproc)"
