"""tessera.BatchAttention (flashinfer.attention): a batch mixing decode
requests (one query) and prefill requests (many) over a paged cache with
shuffled pages, KV lengths given in tokens (kv_len_arr, some requests
listing more pages than their length needs), against the float64 reference
with outputs poisoned (NaN); its base-2 LSE; the kv_len_arr conversion and
the argument errors without a GPU.
"""

import numpy as np
import pytest

import tessera
from conftest import to_np
from prefill_reference import HKV, check, expect, indptr_of, ref_batch
from tessera.attention import kv_lengths_to_pages


# ======================================================================= CPU
def test_kv_lengths_to_pages_matches_a_loop(rng):
    page_size = 16
    for _ in range(20):
        batch = int(rng.integers(1, 9))
        lens = rng.integers(0, 70, batch)
        pages = [-(-int(n) // page_size) + int(rng.integers(0, 3)) for n in lens]  # some spare pages
        kv = indptr_of(pages)
        indptr, keep, last = kv_lengths_to_pages(kv, lens.astype(np.int64), page_size)
        ids = np.arange(int(kv[-1]), dtype=np.int32) * 7 + 3
        used = ids if keep is None else ids[keep]
        want_ids, want_last, want_ptr = [], [], [0]
        for i, n in enumerate(lens):
            need = -(-int(n) // page_size)
            want_ids += list(ids[kv[i]: kv[i] + need])
            want_last.append(int(n) - (need - 1) * page_size if need else 0)
            want_ptr.append(want_ptr[-1] + need)
        np.testing.assert_array_equal(used, want_ids)
        np.testing.assert_array_equal(last, want_last)
        np.testing.assert_array_equal(indptr, want_ptr)
        assert indptr.dtype == np.int32 and last.dtype == np.int32
    # Exactly the pages each length needs: the caller's ids are used as they are.
    assert kv_lengths_to_pages(indptr_of([2, 1]), [17, 16], 16)[1] is None


def test_kv_lengths_to_pages_errors():
    kv = indptr_of([1, 2])
    expect(ValueError, "^kv_len_arr: request 1 has 40 tokens, more than its 2 pages",
           lambda: kv_lengths_to_pages(kv, [3, 40], 16))
    expect(ValueError, "^kv_len_arr: expected 2 entries", lambda: kv_lengths_to_pages(kv, [3], 16))
    expect(ValueError, "^kv_len_arr: expected lengths >= 0", lambda: kv_lengths_to_pages(kv, [3, -1], 16))
    expect(ValueError, "^kv_indptr: expected non-decreasing", lambda: kv_lengths_to_pages(
        np.array([0, 2, 1], np.int32), [3, 0], 16))
    expect(TypeError, "^kv_len_arr", lambda: kv_lengths_to_pages(kv, np.array([1.0, 2.0]), 16))


def cpu_wrapper(**kwargs):
    return tessera.BatchAttention(device="cpu", **kwargs)


def plan_args(**kwargs):
    args = dict(qo_indptr=[0, 1, 6, 7], kv_indptr=[0, 2, 3, 5], kv_indices=[4, 0, 2, 1, 3], kv_len_arr=[20, 9, 17],
                num_qo_heads=8, num_kv_heads=HKV, head_dim_qk=128, head_dim_vo=128, page_size=16)
    args.update(kwargs)
    return args


def test_batch_attention_plan_errors_without_gpu():
    expect(ValueError, "^kv_layout", lambda: tessera.BatchAttention("NDH", "cpu"))
    expect(ValueError, "^device", lambda: tessera.BatchAttention("NHD", "tpu"))
    expect(TypeError, "^device", lambda: tessera.BatchAttention("NHD", 0))
    w = cpu_wrapper()
    # Valid arguments pass every check; the workspace's device ends the plan.
    expect(TypeError, "^device: expected a CUDA device", lambda: w.plan(**plan_args()))
    expect(TypeError, "^device: expected a CUDA device", lambda: w.plan(**plan_args(
        causal=True, logits_soft_cap=30.0, sm_scale=0.1, q_data_type="float16", kv_data_type="float16")))
    expect(tessera.NotSupportedError, "^head_dim_vo=64: not supported yet", lambda: w.plan(**plan_args(head_dim_vo=64)))
    # DeepSeek-style 192 / 128 and head dim 512 pass (the paged prefill kernel takes both).
    expect(TypeError, "^device: expected a CUDA device", lambda: w.plan(**plan_args(head_dim_qk=192, head_dim_vo=128)))
    expect(TypeError, "^device: expected a CUDA device", lambda: w.plan(**plan_args(head_dim_qk=512, head_dim_vo=512)))
    expect(tessera.NotSupportedError, "^use_profiler=True: not supported yet",
           lambda: w.plan(**plan_args(use_profiler=True)))
    expect(ValueError, "^kv_len_arr: request 0 has 40 tokens", lambda: w.plan(**plan_args(kv_len_arr=[40, 9, 17])))
    expect(ValueError, "^kv_indptr: expected 4 entries", lambda: w.plan(**plan_args(kv_indptr=[0, 2, 5])))
    expect(ValueError, "^kv_indices: expected at least 4 entries",
           lambda: w.plan(**plan_args(kv_indices=[4, 0, 2], kv_len_arr=[20, 9, 1])))
    expect(ValueError, "^num_kv_heads", lambda: w.plan(**plan_args(num_kv_heads=0)))
    expect(TypeError, "^q_data_type", lambda: w.plan(**plan_args(q_data_type="float32")))
    expect(ValueError, "^logits_soft_cap", lambda: w.plan(**plan_args(logits_soft_cap=-1.0)))
    expect(ValueError, "^head_dim", lambda: w.plan(**plan_args(head_dim_qk=100, head_dim_vo=100)))
    expect(ValueError, "^run: expected plan", lambda: w.run(np.zeros((7, 8, 128), np.float16), None))
    expect(tessera.NotSupportedError, "^profiler_buffer", lambda: w.run(None, None, profiler_buffer=np.zeros(4)))
    expect(tessera.NotSupportedError, "^kv_cache_sf", lambda: w.run(None, None, kv_cache_sf=np.zeros(4)))


# ======================================================================= GPU
# (q_len, kv_len, spare pages): decode requests next to prefills, an empty one, one without keys.
MIXED = [(1, 40, 0), (17, 17, 1), (1, 1, 0), (0, 12, 0), (64, 100, 2), (1, 0, 1), (5, 130, 0), (1, 16, 0)]


@pytest.mark.parametrize("dtype, head_dim, group, page_size, layout, causal, device_ids", [
    ("float16", 128, 4, 16, "NHD", True, False), ("bfloat16", 128, 1, 1, "HND", True, True),
    ("float16", 64, 8, 16, "HND", False, True), ("bfloat16", 256, 4, 7, "NHD", False, False)])
def test_batch_attention_matches_reference(torch_cuda, rng, poison, dtype, head_dim, group, page_size, layout,
                                           causal, device_ids):
    torch = torch_cuda
    tdt = getattr(torch, dtype)
    hq = HKV * group
    q_lens, kv_lens, spare = (np.array(x) for x in zip(*MIXED))
    pages = -(-kv_lens // page_size) + spare
    kv_indptr = indptr_of(pages)
    num_pages = int(kv_indptr[-1]) + 5
    indices = rng.permutation(num_pages)[: kv_indptr[-1]].astype(np.int32)
    qo = indptr_of(q_lens)
    page = (page_size, HKV, head_dim) if layout == "NHD" else (HKV, page_size, head_dim)
    k_cache = torch.from_numpy(rng.uniform(-1, 1, (num_pages,) + page).astype(np.float32)).cuda().to(tdt)
    v_cache = torch.from_numpy(rng.uniform(-1, 1, (num_pages,) + page).astype(np.float32)).cuda().to(tdt)
    q = torch.from_numpy(rng.uniform(-2, 2, (int(qo[-1]), hq, head_dim)).astype(np.float32)).cuda().to(tdt)
    w = tessera.BatchAttention(layout)
    ids = torch.from_numpy(indices).cuda() if device_ids else indices
    w.plan(torch.from_numpy(qo).cuda(), torch.from_numpy(kv_indptr).cuda(), ids,
           torch.from_numpy(kv_lens.astype(np.int32)).cuda(), hq, HKV, head_dim, head_dim, page_size, causal=causal,
           q_data_type=tdt, kv_data_type=tdt)
    out = torch.full_like(q, float("nan"))
    lse = torch.full(q.shape[:2], float("nan"), device="cuda")
    o, s = w.run(q, (k_cache, v_cache), out=out, lse=lse)
    assert o is out and s is lse
    kn, vn = to_np(k_cache), to_np(v_cache)
    if layout == "HND":
        kn, vn = kn.transpose(0, 2, 1, 3), vn.transpose(0, 2, 1, 3)

    def kv_of(i):
        toks = kn[indices[kv_indptr[i]: kv_indptr[i + 1]]].reshape(-1, HKV, head_dim)[: kv_lens[i]]
        vals = vn[indices[kv_indptr[i]: kv_indptr[i + 1]]].reshape(-1, HKV, head_dim)[: kv_lens[i]]
        return toks, vals

    ref_o, ref_lse = ref_batch(to_np(q), qo, kv_of, causal)
    check(o, s, ref_o, ref_lse, dtype)  # the LSE in base 2, as FlashInfer's BatchAttention writes it
    # Allocated outputs (poisoned), and the interleaved cache: the same bits.
    o2, s2 = w.run(q, torch.stack([k_cache, v_cache], 1))
    assert torch.equal(o2, o) and torch.equal(s2, s)


def test_batch_attention_soft_cap_and_scales(torch_cuda, rng, poison):
    torch = torch_cuda
    q_lens, kv_lens = [3, 1, 9], [30, 47, 9]
    qo, pages = indptr_of(q_lens), indptr_of([-(-n // 16) for n in kv_lens])
    num_pages = int(pages[-1])
    indices = rng.permutation(num_pages).astype(np.int32)
    k_cache = torch.randn(num_pages, 16, HKV, 128, device="cuda", dtype=torch.float16)
    v_cache = torch.randn_like(k_cache)
    q = (3 * torch.randn(int(qo[-1]), 8, 128, device="cuda")).half()
    w = tessera.BatchAttention()
    w.plan(qo, pages, indices, np.array(kv_lens), 8, HKV, 128, 128, 16, causal=True, sm_scale=0.2,
           logits_soft_cap=4.0, q_data_type=torch.float16, kv_data_type=torch.float16)
    kn, vn = to_np(k_cache), to_np(v_cache)

    def kv_of(i):
        sel = indices[pages[i]: pages[i + 1]]
        return kn[sel].reshape(-1, HKV, 128)[: kv_lens[i]], vn[sel].reshape(-1, HKV, 128)[: kv_lens[i]]

    ref_o, ref_lse = ref_batch(to_np(q), qo, kv_of, True, 0.2, logits_soft_cap=4.0)
    o, s = w.run(q, (k_cache, v_cache))
    check(o, s, ref_o, ref_lse, "float16")
    o1, _ = w.run(q, (k_cache, v_cache), logits_soft_cap=4.0)  # the planned cap, given again
    assert torch.equal(o1, o)
    expect(ValueError, "^logits_soft_cap", lambda: w.run(q, (k_cache, v_cache), logits_soft_cap=5.0))
    o3, _ = w.run(q, (k_cache, v_cache), v_scale=0.5)
    check(o3, None, 0.5 * ref_o, None, "float16")
