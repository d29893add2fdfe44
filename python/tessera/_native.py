"""Loads the compiled extension tessera._C with an actionable error.

Kept separate so every module imports the extension the same way, and so a
missing build says how to make one instead of a bare ModuleNotFoundError.
"""

import os

try:
    from . import _C  # noqa: F401  (re-exported)
except ImportError as exc:  # pragma: no cover - depends on the build state
    raise ImportError(
        "tessera: the native extension tessera._C is not built. Build it in-tree with "
        "scripts/build_python.sh (then use PYTHONPATH=python), or install the package with "
        f"`pip install .`. Original error: {exc}"
    ) from exc

# A wheel ships the built-in kernels compiled ahead of time (tessera/kernels,
# a kernel pack): the first call of a built-in kernel then needs no JIT.
_PACK = os.path.join(os.path.dirname(os.path.abspath(__file__)), "kernels")
if os.path.isdir(_PACK):
    _C.add_kernel_pack(_PACK)
