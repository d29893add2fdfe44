"""Attention-state merge: tessera.merge_state / merge_state_in_place /
merge_states / merge_states_ragged against the float64 base-2 reference.

CPU tests use numpy (float16, float32); GPU tests use torch (float16,
bfloat16, head dims 64/128/256) and skip with "skipped: no GPU" without one.
Outputs start as NaN (the `poison` fixture), so "no NaN" also means "fully
written".
"""

import numpy as np
import pytest

import tessera
from conftest import TOL, assert_lse_close, ref_merge, rel_error, to_np

LSE_ATOL = 1e-4  # LSE is float32 and computed in float32 or better


def make_states(rng, num, shape, dtype, lse_range=5.0):
    """num random states: values [num, *shape] of dtype, LSE float32 [num, *shape[:-1]]."""
    v = rng.standard_normal((num,) + shape).astype(dtype)
    s = (rng.uniform(-lse_range, lse_range, (num,) + shape[:-1])).astype(np.float32)
    return v, s


def check(v, s, v_ref, s_ref, dtype_name):
    """Values within the dtype's tolerance, no NaN; LSE matching (incl. -inf)."""
    err = rel_error(to_np(v), v_ref)
    assert err < TOL[dtype_name], f"value error {err} >= {TOL[dtype_name]}"
    assert_lse_close(to_np(s), s_ref, LSE_ATOL)


# ======================================================================= CPU
@pytest.mark.parametrize("dtype", ["float16", "float32"])
@pytest.mark.parametrize("head_dim", [64, 128])
def test_merge_state_cpu(rng, poison, dtype, head_dim):
    v, s = make_states(rng, 2, (9, 4, head_dim), dtype)
    out_v, out_s = tessera.merge_state(v[0], s[0], v[1], s[1])
    assert out_v.dtype == np.dtype(dtype) and out_v.shape == (9, 4, head_dim)
    assert out_s.dtype == np.float32 and out_s.shape == (9, 4)
    v_ref, s_ref = ref_merge(v, s)
    check(out_v, out_s, v_ref, s_ref, dtype)


def test_merge_state_empty_states_cpu(rng, poison):
    """lse = -inf states are ignored even when their values are NaN; all-empty rows give (0, -inf)."""
    v, s = make_states(rng, 2, (6, 2, 64), np.float32)
    s[0, 0:2] = -np.inf  # a empty
    v[0, 0:2] = np.nan
    s[1, 2:4] = -np.inf  # b empty
    v[1, 2:4] = np.nan
    s[:, 4] = -np.inf  # both empty in row 4
    out_v, out_s = tessera.merge_state(v[0], s[0], v[1], s[1])
    v_ref, s_ref = ref_merge(v, s)
    np.testing.assert_array_equal(out_v[4], 0.0)
    assert np.isneginf(out_s[4]).all()
    np.testing.assert_allclose(out_v[0:2], v[1, 0:2], rtol=1e-6)  # only b counts
    check(out_v, out_s, v_ref, s_ref, "float32")


@pytest.mark.parametrize("base", [0.0, 1000.0, -1000.0])
def test_merge_state_lse_gap_300_cpu(rng, poison, base):
    """A state 300 (base-2) units above the other dominates exactly, without overflow."""
    v, s = make_states(rng, 2, (4, 2, 64), np.float32)
    s[0] = base + 300.0
    s[1] = base
    s[0, 1] = base  # row 1: the other way round
    s[1, 1] = base + 300.0
    out_v, out_s = tessera.merge_state(v[0], s[0], v[1], s[1])
    np.testing.assert_allclose(out_v[0], v[0, 0], rtol=1e-6)
    np.testing.assert_allclose(out_v[1], v[1, 1], rtol=1e-6)
    np.testing.assert_allclose(out_s, base + 300.0, rtol=0, atol=1e-3)
    v_ref, s_ref = ref_merge(v, s)
    check(out_v, out_s, v_ref, s_ref, "float32")


@pytest.mark.parametrize("with_mask", [False, True])
def test_merge_state_in_place_cpu(rng, with_mask):
    v, s = make_states(rng, 2, (8, 3, 64), np.float16)
    mine_v, mine_s = v[0].copy(), s[0].copy()
    mask = np.array([1, 0, 1, 1, 0, 0, 1, 1], dtype=bool) if with_mask else None
    assert tessera.merge_state_in_place(mine_v, mine_s, v[1], s[1], mask=mask) is None
    v_ref, s_ref = ref_merge(v, s)
    keep = ~mask if with_mask else np.zeros(8, dtype=bool)
    v_ref[keep], s_ref[keep] = v[0][keep], s[0][keep]
    check(mine_v, mine_s, v_ref, s_ref, "float16")
    np.testing.assert_array_equal(mine_v[keep], v[0][keep])  # untouched rows are bitwise unchanged
    np.testing.assert_array_equal(mine_s[keep], s[0][keep])


@pytest.mark.parametrize("dtype", ["float16", "float32"])
@pytest.mark.parametrize("num_states", [1, 3, 6])
def test_merge_states_cpu(rng, poison, dtype, num_states):
    v, s = make_states(rng, num_states, (5, 4, 128), dtype)
    s[0, 1] = -np.inf  # an empty state somewhere
    s[:, 3, 2] = -np.inf  # a row whose states are all empty (head 2 of row 3)
    v_seq = np.ascontiguousarray(v.transpose(1, 0, 2, 3))  # [seq, S, H, D]
    s_seq = np.ascontiguousarray(s.transpose(1, 0, 2))
    out_v, out_s = tessera.merge_states(v_seq, s_seq)
    assert out_v.shape == (5, 4, 128) and out_s.shape == (5, 4)
    v_ref, s_ref = ref_merge(v, s)
    check(out_v, out_s, v_ref, s_ref, dtype)


@pytest.mark.parametrize("as_list", [False, True])
def test_merge_states_ragged_cpu(rng, poison, as_list):
    indptr = [0, 2, 2, 5, 6, 10]  # row 1 is empty
    v, s = make_states(rng, 1, (10, 2, 64), np.float32)
    v, s = v[0], s[0]
    s[7, 1] = -np.inf
    ip = indptr if as_list else np.asarray(indptr, dtype=np.int32)
    out_v, out_s = tessera.merge_states_ragged(v, s, ip)
    assert out_v.shape == (5, 2, 64) and out_s.shape == (5, 2)
    np.testing.assert_array_equal(out_v[1], 0.0)
    assert np.isneginf(out_s[1]).all()
    for r in range(5):
        a, b = indptr[r], indptr[r + 1]
        if a == b:
            continue
        v_ref, s_ref = ref_merge(v[a:b], s[a:b])
        check(out_v[r], out_s[r], v_ref, s_ref, "float32")


def test_merge_accepts_strided_views_cpu(rng, poison):
    """Views with non-default strides (a slice of a bigger state set) merge correctly."""
    v, s = make_states(rng, 2, (12, 4, 64), np.float32)
    out_v, out_s = tessera.merge_state(v[0, ::2], s[0, ::2], v[1, ::2], s[1, ::2])
    v_ref, s_ref = ref_merge(v[:, ::2], s[:, ::2])
    check(out_v, out_s, v_ref, s_ref, "float32")


# ======================================================================= GPU
GPU_DTYPES = ["float16", "bfloat16"]
GPU_DIMS = [64, 128, 256]


def to_gpu(torch, x, dtype):
    """numpy -> CUDA tensor of the given dtype name."""
    return torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32)).to("cuda").to(getattr(torch, dtype))


@pytest.mark.parametrize("dtype", GPU_DTYPES)
@pytest.mark.parametrize("head_dim", GPU_DIMS)
def test_merge_state_gpu(torch_cuda, rng, poison, dtype, head_dim):
    torch = torch_cuda
    v, s = make_states(rng, 2, (37, 8, head_dim), np.float32)
    s[0, 3] = -np.inf
    s[:, 5, 1] = -np.inf
    s[1, 7] = s[0, 7] + 300.0
    tv, ts = to_gpu(torch, v, dtype), torch.from_numpy(s).cuda()
    out_v, out_s = tessera.merge_state(tv[0], ts[0], tv[1], ts[1])
    torch.cuda.synchronize()
    assert out_v.is_cuda and out_v.dtype == getattr(torch, dtype) and out_s.dtype == torch.float32
    v_ref, s_ref = ref_merge(to_np(tv), s)
    check(out_v, out_s, v_ref, s_ref, dtype)


@pytest.mark.parametrize("dtype", GPU_DTYPES)
@pytest.mark.parametrize("head_dim", GPU_DIMS)
@pytest.mark.parametrize("with_mask", [False, True])
def test_merge_state_in_place_gpu(torch_cuda, rng, dtype, head_dim, with_mask):
    torch = torch_cuda
    v, s = make_states(rng, 2, (29, 4, head_dim), np.float32)
    s[1, 2] = -np.inf
    tv, ts = to_gpu(torch, v, dtype), torch.from_numpy(s).cuda()
    mine_v, mine_s = tv[0].clone(), ts[0].clone()
    mask_np = rng.integers(0, 2, 29).astype(bool)
    mask = torch.from_numpy(mask_np).cuda() if with_mask else None
    tessera.merge_state_in_place(mine_v, mine_s, tv[1], ts[1], mask=mask)
    torch.cuda.synchronize()
    v_in = to_np(tv)
    v_ref, s_ref = ref_merge(v_in, s)
    if with_mask:
        v_ref[~mask_np], s_ref[~mask_np] = v_in[0][~mask_np], s[0][~mask_np]
        assert torch.equal(mine_v[torch.from_numpy(~mask_np).cuda()], tv[0][torch.from_numpy(~mask_np).cuda()])
    check(mine_v, mine_s, v_ref, s_ref, dtype)


@pytest.mark.parametrize("dtype", GPU_DTYPES)
@pytest.mark.parametrize("head_dim", GPU_DIMS)
@pytest.mark.parametrize("num_states", [1, 4, 9])
def test_merge_states_gpu(torch_cuda, rng, poison, dtype, head_dim, num_states):
    torch = torch_cuda
    v, s = make_states(rng, num_states, (23, 4, head_dim), np.float32)
    s[0, 4] = -np.inf
    s[:, 6, 3] = -np.inf
    tv = to_gpu(torch, v.transpose(1, 0, 2, 3), dtype)  # [seq, S, H, D]
    ts = torch.from_numpy(np.ascontiguousarray(s.transpose(1, 0, 2))).cuda()
    out_v, out_s = tessera.merge_states(tv, ts)
    torch.cuda.synchronize()
    v_ref, s_ref = ref_merge(to_np(tv).transpose(1, 0, 2, 3), s)
    check(out_v, out_s, v_ref, s_ref, dtype)


@pytest.mark.parametrize("dtype", GPU_DTYPES)
@pytest.mark.parametrize("head_dim", GPU_DIMS)
def test_merge_states_ragged_gpu(torch_cuda, rng, poison, dtype, head_dim):
    torch = torch_cuda
    lengths = [3, 0, 1, 7, 0, 2, 16]
    indptr = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    total = int(indptr[-1])
    v, s = make_states(rng, 1, (total, 4, head_dim), np.float32)
    v, s = v[0], s[0]
    s[5, 0] = -np.inf
    tv, ts = to_gpu(torch, v, dtype), torch.from_numpy(s).cuda()
    out_v, out_s = tessera.merge_states_ragged(tv, ts, torch.from_numpy(indptr).cuda())
    torch.cuda.synchronize()
    v_in = to_np(tv)
    v_ref = np.zeros((len(lengths), 4, head_dim))
    s_ref = np.full((len(lengths), 4), -np.inf)
    for r in range(len(lengths)):
        a, b = indptr[r], indptr[r + 1]
        if a < b:
            v_ref[r], s_ref[r] = ref_merge(v_in[a:b], s[a:b])
    check(out_v, out_s, v_ref, s_ref, dtype)


def test_merge_states_deterministic_gpu(torch_cuda, rng):
    torch = torch_cuda
    v, s = make_states(rng, 7, (64, 8, 128), np.float32)
    tv = to_gpu(torch, v.transpose(1, 0, 2, 3), "bfloat16")
    ts = torch.from_numpy(np.ascontiguousarray(s.transpose(1, 0, 2))).cuda()
    a_v, a_s = tessera.merge_states(tv, ts)
    b_v, b_s = tessera.merge_states(tv, ts)
    torch.cuda.synchronize()
    assert torch.equal(a_v, b_v) and torch.equal(a_s, b_s)


def test_merges_enable_pdl_gpu(torch_cuda, rng):
    """Each merge reading what the one before wrote, launched with and
    without programmatic dependent launch: both chains match the float64
    reference and each other bit for bit."""
    torch = torch_cuda
    v, s = make_states(rng, 3, (4096, 8, 128), np.float32)
    tv, ts = to_gpu(torch, v, "float16"), torch.from_numpy(s).cuda()

    def chain(pdl):
        x_v, x_s = tessera.merge_state(tv[0], ts[0], tv[1], ts[1], enable_pdl=pdl)
        tessera.merge_state_in_place(x_v, x_s, tv[2], ts[2], enable_pdl=pdl)
        y_v, y_s = tessera.merge_states(x_v[:, None], x_s[:, None], enable_pdl=pdl)
        z_v, z_s = tessera.merge_states_ragged(y_v, y_s, torch.arange(4097, dtype=torch.int32, device="cuda"),
                                               enable_pdl=pdl)
        torch.cuda.synchronize()
        return z_v, z_s

    inputs = to_np(tv)
    x_v, x_s = ref_merge(inputs[:2], s[:2])  # the chain rounds x to float16 before its next merge
    ref_v, ref_s = ref_merge(np.stack([x_v.astype(np.float16), inputs[2]]), np.stack([x_s, s[2]]))
    for pdl in (None, True, False):
        got_v, got_s = chain(pdl)
        check(got_v, got_s, ref_v, ref_s, "float16")
    on, off = chain(True), chain(False)
    assert torch.equal(on[0], off[0]) and torch.equal(on[1], off[1])


@pytest.mark.parametrize("dtype", GPU_DTYPES)
@pytest.mark.parametrize("head_dim", GPU_DIMS)
@pytest.mark.parametrize("seq_len", [1, 3, 1001])
def test_merge_state_layout_gpu(torch_cuda, rng, poison, dtype, head_dim, seq_len):
    """Row counts that leave a warp step or a thread's second row empty; empty
    states (NaN values) on either side and on both."""
    torch = torch_cuda
    v, s = make_states(rng, 2, (seq_len, 5, head_dim), np.float32)
    s[0, 0] = -np.inf  # a empty in row 0, b in row 1 (when there is one), both in the last row's head 2
    v[0, 0] = np.nan
    s[1, min(1, seq_len - 1), 1:] = -np.inf
    v[1, min(1, seq_len - 1), 1:] = np.nan
    s[:, -1, 2] = -np.inf
    tv, ts = to_gpu(torch, v, dtype), torch.from_numpy(s).cuda()
    out_v, out_s = tessera.merge_state(tv[0], ts[0], tv[1], ts[1])
    torch.cuda.synchronize()
    v_ref, s_ref = ref_merge(to_np(tv), s)
    check(out_v, out_s, v_ref, s_ref, dtype)
    assert (to_np(out_v)[-1, 2] == 0).all()


@pytest.mark.parametrize("dtype", GPU_DTYPES)
@pytest.mark.parametrize("head_dim", GPU_DIMS)
def test_merge_state_strided_views_gpu(torch_cuda, rng, poison, dtype, head_dim):
    """Every other head of a bigger state set (head stride 2 * head_dim), merged
    into and in place on strided views."""
    torch = torch_cuda
    v, s = make_states(rng, 2, (41, 8, head_dim), np.float32)
    s[1, 4, ::3] = -np.inf
    tv, ts = to_gpu(torch, v, dtype), torch.from_numpy(s).cuda()
    a_v, a_s, b_v, b_s = tv[0, :, ::2], ts[0, :, ::2], tv[1, :, ::2], ts[1, :, ::2]
    out_v, out_s = tessera.merge_state(a_v, a_s, b_v, b_s)
    torch.cuda.synchronize()
    v_ref, s_ref = ref_merge(to_np(tv)[:, :, ::2], s[:, :, ::2])
    check(out_v, out_s, v_ref, s_ref, dtype)
    tessera.merge_state_in_place(a_v, a_s, b_v, b_s)
    torch.cuda.synchronize()
    check(a_v, a_s, v_ref, s_ref, dtype)
    assert torch.equal(tv[0, :, 1::2], to_gpu(torch, v[0, :, 1::2], dtype))  # the other heads untouched


def test_merge_state_misaligned_stride_gpu(torch_cuda, rng):
    """A head stride the 16-byte vectors cannot follow is refused, not misread."""
    torch = torch_cuda
    big = torch.zeros(4, 2, 68, dtype=torch.float16, device="cuda")
    v = big[:, :, :64]  # head stride 68 elements
    s = torch.zeros(4, 2, dtype=torch.float32, device="cuda")
    with pytest.raises(ValueError, match="multiple of 8"):
        tessera.merge_state(v, s, v, s)


@pytest.mark.parametrize("dtype", GPU_DTYPES)
@pytest.mark.parametrize("num_states", [2, 5, 8])
def test_merge_states_many_rows_gpu(torch_cuda, rng, poison, dtype, num_states):
    """Many rows (several blocks), head_dim 128, partial and whole blocks of 4 states."""
    torch = torch_cuda
    v, s = make_states(rng, num_states, (517, 6, 128), np.float32, lse_range=40.0)
    s[:, 7, 3] = -np.inf
    s[num_states - 1, 9] = -np.inf
    tv = to_gpu(torch, v.transpose(1, 0, 2, 3), dtype)
    ts = torch.from_numpy(np.ascontiguousarray(s.transpose(1, 0, 2))).cuda()
    out_v, out_s = tessera.merge_states(tv, ts)
    torch.cuda.synchronize()
    v_ref, s_ref = ref_merge(to_np(tv).transpose(1, 0, 2, 3), s)
    check(out_v, out_s, v_ref, s_ref, dtype)
