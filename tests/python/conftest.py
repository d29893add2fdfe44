"""Shared fixtures and float64 numpy references for the tessera Python tests.

The references are written from the formulas (not from Tessera's code) so a
mistake in the library cannot be mirrored here:

* attention state merge with base-2 LSE (FlashInfer paper, section 2.2);
* decode attention: softmax(q k^T * sm_scale) v per query head, with query
  head h reading KV head h // (num_qo_heads // num_kv_heads).

GPU tests ask for the `torch_cuda` fixture, which skips with the reason
"skipped: no GPU" unless torch imports and sees a CUDA device.
"""

import numpy as np
import pytest


# ------------------------------------------------------------------ fixtures
@pytest.fixture
def rng():
    """A seeded generator so failures reproduce."""
    return np.random.default_rng(1234)


@pytest.fixture
def torch_cuda():
    """The torch module when a CUDA device is usable; skips the test otherwise."""
    try:
        import torch
    except Exception:
        pytest.skip("skipped: no GPU")
    if not torch.cuda.is_available():
        pytest.skip("skipped: no GPU")
    import tessera

    if not tessera.gpu_available():
        pytest.skip("skipped: no GPU")
    return torch


@pytest.fixture
def poison(monkeypatch):
    """Makes every output tessera allocates start as NaN, so a test that
    checks for NaN also proves every element was written."""
    import tessera._tensors as tensors

    allocate = tensors.empty

    def nan_empty(like, shape, dtype=None):
        out = allocate(like, shape, dtype)
        if tensors.is_torch(out):
            out.fill_(float("nan"))
        else:
            out.fill(np.nan)
        return out

    monkeypatch.setattr(tensors, "empty", nan_empty)


def to_np(x):
    """A float64 numpy copy of a numpy array or a torch tensor (any device/dtype)."""
    if hasattr(x, "detach"):
        return x.detach().float().cpu().numpy().astype(np.float64)
    return np.asarray(x, dtype=np.float64)


# ------------------------------------------------------------------ references
def ref_merge(values, lses):
    """Merges K states in float64.

    values: [K, ..., D] array, lses: [K, ...] base-2 LSE. States with
    lse = -inf are ignored (their values may be anything, even NaN); if all
    are empty the result is (0, -inf). Returns (v [..., D], s [...]).
    """
    values = np.asarray(values, dtype=np.float64)
    lses = np.asarray(lses, dtype=np.float64)
    m = lses.max(axis=0)
    empty_row = np.isneginf(m)
    m_safe = np.where(empty_row, 0.0, m)
    present = ~np.isneginf(lses)
    w = np.where(present, np.exp2(np.where(present, lses, 0.0) - m_safe), 0.0)  # [K, ...]
    denom = w.sum(axis=0)
    safe_values = np.where(present[..., None], values, 0.0)
    num = (w[..., None] * safe_values).sum(axis=0)
    with np.errstate(divide="ignore", invalid="ignore"):
        v = np.where(empty_row[..., None], 0.0, num / np.where(denom == 0, 1.0, denom)[..., None])
        s = np.where(empty_row, -np.inf, m_safe + np.log2(np.where(denom == 0, 1.0, denom)))
    return v, s


def ref_decode(q, k, v, kv_layout="NHD", sm_scale=None, window_left=-1, logits_soft_cap=0.0):
    """Decode attention in float64: q [Hq, D]; k, v NHD [L, Hkv, D] or HND [Hkv, L, D].

    window_left >= 0 keeps keys j >= L - 1 - window_left (the query is the
    last position); logits_soft_cap > 0 maps each logit x (after sm_scale) to
    cap * tanh(x / cap). Returns (o [Hq, D], lse [Hq]) with lse in base 2;
    with L = 0, o = 0 and lse = -inf.
    """
    q = np.asarray(q, dtype=np.float64)
    k = np.asarray(k, dtype=np.float64)
    v = np.asarray(v, dtype=np.float64)
    if kv_layout == "HND":
        k, v = k.transpose(1, 0, 2), v.transpose(1, 0, 2)
    hq, d = q.shape
    hkv = k.shape[1]
    group = hq // hkv
    scale = 1.0 / np.sqrt(d) if sm_scale is None else sm_scale
    o = np.zeros((hq, d))
    lse = np.full(hq, -np.inf)
    if window_left >= 0:
        first = max(0, k.shape[0] - 1 - window_left)
        k, v = k[first:], v[first:]
    if k.shape[0] == 0:
        return o, lse
    for h in range(hq):
        logits = k[:, h // group, :] @ q[h] * scale  # natural-base logits [L]
        if logits_soft_cap:
            logits = logits_soft_cap * np.tanh(logits / logits_soft_cap)
        mx = logits.max()
        p = np.exp(logits - mx)
        o[h] = p @ v[:, h // group, :] / p.sum()
        lse[h] = (mx + np.log(p.sum())) / np.log(2.0)  # log2 of sum(exp(logits))
    return o, lse


def rel_error(got, ref):
    """max |got - ref| / max |ref| over finite reference entries (NaN in got -> inf)."""
    got = np.asarray(got, dtype=np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    if np.isnan(got).any():
        return np.inf
    scale = np.abs(ref).max() if ref.size else 1.0
    return np.abs(got - ref).max() / max(scale, 1e-30) if ref.size else 0.0


def assert_lse_close(got, ref, atol):
    """LSE check: -inf where the reference is -inf, else |got - ref| <= atol."""
    got = np.asarray(got, dtype=np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    assert not np.isnan(got).any(), "lse has NaN"
    np.testing.assert_array_equal(np.isneginf(got), np.isneginf(ref))
    fin = np.isfinite(ref)
    if fin.any():
        err = np.abs(got[fin] - ref[fin]).max()
        assert err <= atol, f"lse error {err} > {atol}"


# Tolerances of the error metric rel_error, by output dtype name.
TOL = {"float16": 1e-3, "bfloat16": 1e-2, "float32": 1e-5}
