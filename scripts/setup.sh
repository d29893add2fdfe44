#!/usr/bin/env bash
# Installs whatever is missing to build and test Tessera on a Debian machine
# (no GPU needed): compilers and CMake/Ninja/GoogleTest from Debian, and the
# Python build/test packages from PyPI into .venv. Idempotent and quiet when
# everything is already there. The CUDA toolkit (nvcc, NVRTC, cudart) must be
# installed; it is checked here with a clear message.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"

need_apt=()
command -v cmake >/dev/null || need_apt+=(cmake)
command -v ninja >/dev/null || need_apt+=(ninja-build)
command -v g++ >/dev/null || need_apt+=(g++)
[ -f /usr/include/gtest/gtest.h ] || need_apt+=(libgtest-dev)
python3 -c 'import venv, ensurepip' 2>/dev/null || need_apt+=(python3-venv)
if [ ${#need_apt[@]} -gt 0 ]; then
  echo "setup: installing ${need_apt[*]} from Debian"
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need_apt[@]}" >/dev/null
fi

if ! command -v nvcc >/dev/null; then
  for d in /usr/local/cuda/bin /usr/local/cuda-*/bin; do
    [ -x "$d/nvcc" ] && export PATH="$d:$PATH" && break
  done
fi
if ! command -v nvcc >/dev/null; then
  echo "setup: error: the CUDA toolkit (nvcc, NVRTC, cudart; 12.0 or newer) is required but nvcc was not found." >&2
  echo "       Install it (e.g. NVIDIA's cuda-toolkit package) and put its bin/ on PATH." >&2
  exit 1
fi

# Python packages for the extension and its tests, in a project venv.
if [ ! -x .venv/bin/python ]; then
  python3 -m venv .venv
fi
if ! .venv/bin/python -c 'import nanobind, numpy, pytest, scikit_build_core' 2>/dev/null; then
  echo "setup: installing nanobind, scikit-build-core, numpy, pytest from PyPI into .venv"
  .venv/bin/python -m pip install -q --upgrade pip >/dev/null
  .venv/bin/python -m pip install -q nanobind scikit-build-core numpy pytest
fi
