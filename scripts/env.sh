# Sourced by the scripts: puts nvcc on PATH and picks the Python to build the
# extension with (.venv when present, else python3, as on the GPU machine).
if ! command -v nvcc >/dev/null; then
  for d in /usr/local/cuda/bin /usr/local/cuda-*/bin; do
    [ -x "$d/nvcc" ] && export PATH="$d:$PATH" && break
  done
fi
if [ -x "${TESSERA_ROOT:-.}/.venv/bin/python" ]; then
  TESSERA_PYTHON="$(cd "${TESSERA_ROOT:-.}" && pwd)/.venv/bin/python"
else
  TESSERA_PYTHON="$(command -v python3)"
fi
export TESSERA_PYTHON
