"""Sizing the caller's workspace for a plan() and building the C++ plan/run object on it: the bounds that
size a workspace (Bound), the choice between ideal and minimum layouts (fit_workspace), FlashInfer's
workspace_size() probe, and ensure_native, which every wrapper's plan() goes through."""

import threading
from typing import NamedTuple, Optional

from . import _tensors as T


class Bound(NamedTuple):
    """One workspace bound of a C++ wrapper (e.g. max_batch) and how plan() arguments reach it."""
    name: str  # the C++ bound, as messages name it: max_batch, max_total_q, max_pages
    arg: str  # the plan() argument that brings the count
    what: str  # what is counted, for messages ("batch size", "page count")
    fixed: Optional[int] = None  # fixed by a caller's buffer, else None
    fixed_by: str = ""  # that buffer's argument name


def fit_workspace(want, need, have, size, bounds):
    """The bounds to build for, and their pinned host bytes, in a workspace of `have` bytes.

    want: the grown (doubled) bounds, need: the ones this plan() needs;
    size(bounds) -> (ideal_device_bytes, min_device_bytes, host_bytes). The
    doubled bounds where the buffer holds their ideal layout, else the needed
    ones; where it holds neither, the first of them whose minimum fits (the
    split-KV partial states shrink; the doubled bounds' larger index sections
    cost few rows and spare later re-sizes). Below every minimum: ValueError
    naming float_workspace_buffer, the minimum for `need` and the ideal.
    """
    options = [want] if want == need else [want, need]
    sized = [(w,) + tuple(size(w)) for w in options]
    pick = next((s for s in sized if s[1] <= have), None) or next((s for s in sized if s[2] <= have), None)
    if pick is None:
        _, ideal, least, _ = sized[-1]
        bounds_text = ", ".join(f"{b.name}={w}" for b, w in zip(bounds, need))
        raise ValueError(f"float_workspace_buffer: expected at least {least} bytes for {bounds_text}, got {have} "
                         f"({ideal} bytes hold every split-KV partial state: the fastest plans)")
    return pick[0], pick[3]


class _WorkspaceProbe(Exception):
    """Raised by ensure_native while workspace_size() probes: the sizes plan() would build for."""

    def __init__(self, device_bytes, host_bytes):
        super().__init__(device_bytes, host_bytes)
        self.device_bytes, self.host_bytes = device_bytes, host_bytes


def probe_workspace_size(owner, plan_fn, args, kwargs):
    """FlashInfer's workspace_size(): (float_workspace_size, int_workspace_size) in bytes for what
    plan_fn(owner, *args, **kwargs) plans, found by running plan()'s own checks up to the workspace
    sizing. The float size is the ideal one (every split-KV partial state; plan() also takes smaller
    buffers down to the minimum); the int size is the pinned host staging plan() uploads from (Tessera
    keeps no int workspace on the GPU). The wrapper's plan state is left as it was."""
    wrappers = [owner] + [w for w in (getattr(owner, "_multi", None),) if w is not None]
    saved = [dict(w.__dict__) for w in wrappers]
    _PROBE.active = True
    try:
        plan_fn(owner, *args, **kwargs)
    except _WorkspaceProbe as p:
        return p.device_bytes, max(p.host_bytes, 1)
    finally:
        _PROBE.active = False
        for w, d in zip(wrappers, saved):
            w.__dict__.clear()
            w.__dict__.update(d)
    raise RuntimeError("workspace_size: plan() finished without sizing a workspace")


# active inside probe_workspace_size, on its thread only (other threads keep planning): ensure_native then
# reports sizes instead of building.
_PROBE = threading.local()


def ensure_native(owner, config, counts, bounds, size, make, exact=False):
    """Builds (or re-sizes) owner's C++ plan/run object for `config` and these counts.

    owner: the wrapper; reads _float_workspace_buffer, _use_cuda_graph and
        keeps _native, _native_key and _pinned (the pinned staging buffer).
    counts: one count per bound (what this plan() needs).
    size(want, device) -> (ideal_device_bytes, min_device_bytes, host_bytes)
        for the bounds `want`: the C++ workspace_size and min_workspace_size.
    make(want, ws_ptr, ws_bytes, host_ptr, host_bytes, device) -> the object,
        given the whole buffer: below the ideal size its split-KV partial
        states get what fits (FlashInfer callers bring fixed buffers, often
        16 MB), so plans split less KV; only below the minimum is the buffer
        refused (ValueError naming float_workspace_buffer and the minimum).

    Bounds that cannot move are the caller's buffers and, in CUDA-graph
    mode, those of the object already built (a captured run() holds the
    workspace addresses); a count beyond one is a ValueError naming it.

    exact: the counts are the bounds themselves (planning on the GPU: the
    C++ object's bounds are the sizes of the caller's tensors, and run()
    takes q of exactly those rows), so the object is built for them, not
    grown, and rebuilt when its bounds differ; a count other than a bound
    that cannot move is a ValueError naming it.
    """
    key = owner._native_key
    same = key is not None and key[0] == config
    if getattr(_PROBE, "active", False):
        fixed = list(key[1]) if same and owner._use_cuda_graph else [b.fixed for b in bounds]
        need = tuple(c if f is None else max(c, f) for c, f in zip(counts, fixed))
        ideal, _, host = size(need, owner._float_workspace_buffer.device.index or 0)
        raise _WorkspaceProbe(ideal, host)
    if same and (tuple(counts) == tuple(key[1]) if exact else all(c <= b for c, b in zip(counts, key[1]))):
        return
    fixed = [b.fixed for b in bounds]
    if same and owner._use_cuda_graph:
        fixed = list(key[1])
    for b, c, f in zip(bounds, counts, fixed):
        if f is not None and (c != f if exact else c > f):
            by = f"{b.fixed_by}, or by " if b.fixed_by else ""
            if exact:
                raise ValueError(f"{b.arg}: {b.what} {c} differs from the workspace bound {b.name}={f} (fixed by "
                                 f"{by}the first plan() with use_cuda_graph=True); on_device=True plans for "
                                 "exactly the bounds it is given")
            raise ValueError(f"{b.arg}: {b.what} {c} exceeds the workspace bound {b.name}={f} "
                             f"(fixed by {by}the first plan() with use_cuda_graph=True)")
    need = tuple(c if f is None else f for c, f in zip(counts, fixed))
    # Growing without fixed bounds: double, so a slowly growing workload
    # re-sizes rarely (each re-size waits for the GPU once).
    if same and not exact:
        grown = (max(c, 2 * b) for c, b in zip(counts, key[1]))
        want = tuple(g if f is None else f for g, f in zip(grown, fixed))
    else:
        want = need
    torch = T._torch()
    buf = owner._float_workspace_buffer
    device = buf.device.index or 0
    have = buf.numel()
    want, host_bytes = fit_workspace(want, need, have, lambda w: size(w, device), bounds)
    if owner._native is not None:
        # Queued kernels may still read the old schedule, and a queued
        # upload may still read the pinned staging buffer.
        torch.cuda.synchronize(buf.device)
    if owner._pinned is None or owner._pinned.numel() < host_bytes:
        owner._pinned = torch.empty(max(host_bytes, 1), dtype=torch.uint8, pin_memory=True)
    owner._native = None  # release the old object (and its claim on the workspace) first
    owner._native = make(want, buf.data_ptr(), have, owner._pinned.data_ptr(), owner._pinned.numel(), device)
    owner._native_key = (config, tuple(want))
