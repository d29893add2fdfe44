"""Loads the compiled extension tessera._C with an actionable error.

Kept separate so every module imports the extension the same way, and so a
missing build says how to make one instead of a bare ModuleNotFoundError.
"""

try:
    from . import _C  # noqa: F401  (re-exported)
except ImportError as exc:  # pragma: no cover - depends on the build state
    raise ImportError(
        "tessera: the native extension tessera._C is not built. Build it in-tree with "
        "scripts/build_python.sh (then use PYTHONPATH=python), or install the package with "
        f"`pip install .`. Original error: {exc}"
    ) from exc
