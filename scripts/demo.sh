#!/usr/bin/env bash
# Quick start (a): install what is missing, build, and run `tessera demo`, a
# serving-style attention step verified against the CPU reference.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
bash "$root/scripts/setup.sh"
bash "$root/scripts/build.sh" >/dev/null
exec "$root/build/tessera" demo "$@"
