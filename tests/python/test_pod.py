"""tessera.PODWithPagedKVCacheWrapper (flashinfer.pod): one prefill request
(contiguous K / V, causal / window / custom mask options) next to a decode
batch over shuffled pages, in one launch (FA2 or Hopper; a long prompt chunk
in two on Hopper), each against its float64 reference with the outputs the
wrapper allocates poisoned; the decode-side run() options that must agree
with plan(); argument errors without a GPU.
"""

import numpy as np
import pytest

import tessera
from conftest import to_np
from decode_reference import make_table, ref_batch_decode
from prefill_reference import HKV, check, expect, ref_request


# ======================================================================= CPU
def test_pod_errors_without_gpu():
    buf = np.zeros(16, np.uint8)
    expect(ValueError, "^kv_layout", lambda: tessera.PODWithPagedKVCacheWrapper(buf, "NDH"))
    expect(tessera.NotSupportedError, "^jit_args", lambda: tessera.PODWithPagedKVCacheWrapper(buf, jit_args=["x"]))
    expect(ValueError, "^backend", lambda: tessera.PODWithPagedKVCacheWrapper(buf, backend="fa4"))
    w = tessera.PODWithPagedKVCacheWrapper(buf, "HND")
    assert not w.is_cuda_graph_enabled
    args = ([0, 1, 3], [0, 2, 1], [5, 16], 8, HKV, 128, 16)
    expect(TypeError, "^float_workspace_buffer", lambda: w.plan(*args))  # every check passed
    expect(TypeError, "^float_workspace_buffer", lambda: w.plan(*args, window_left=8, sm_scale=0.1))
    expect(TypeError, "^q_data_type", lambda: w.plan(*args, q_data_type="float32"))
    expect(ValueError, "^window_left", lambda: w.plan(*args, window_left=-2))
    expect(ValueError, "^run: expected plan", lambda: w.run(*[None] * 5))
    expect(tessera.NotSupportedError, "^custom_mask_d", lambda: w.run(*[None] * 5, custom_mask_d=np.ones(4, bool)))
    expect(tessera.NotSupportedError, "^args", lambda: w.run(*[None] * 5, *[None] * 25, 1))


# ======================================================================= GPU
DECODE_LENS = [33, 0, 1, 200, 16]


@pytest.mark.parametrize("dtype, head_dim, group, layout, page_size, prefill_opts, backend", [
    ("float16", 128, 4, "NHD", 16, dict(causal_p=True), "fa2"),
    ("float16", 128, 4, "NHD", 16, dict(causal_p=True), "auto"),
    ("bfloat16", 64, 1, "HND", 1, dict(window_left_p=9, causal_p=True, sm_scale_p=0.2), "fa2"),
    ("float16", 128, 8, "HND", 5, dict(custom_mask_p=True), "fa2"),
    ("bfloat16", 256, 2, "NHD", 16, dict(kv_layout_p="HND"), "fa2"),
    ("bfloat16", 256, 2, "NHD", 16, dict(kv_layout_p="HND"), "auto"),
    ("float16", 128, 4, "NHD", 16, dict(causal_p=True, qo_len=1100), "auto")])
def test_pod_matches_reference(torch_cuda, rng, poison, dtype, head_dim, group, layout, page_size, prefill_opts,
                               backend):
    torch = torch_cuda
    tdt = getattr(torch, dtype)
    hq = HKV * group
    prefill_opts = dict(prefill_opts)
    qo_len = prefill_opts.pop("qo_len", 37)
    kv_len = qo_len + 53
    q_p = torch.from_numpy(rng.uniform(-2, 2, (qo_len, hq, head_dim)).astype(np.float32)).cuda().to(tdt)
    shape_p = (kv_len, HKV, head_dim) if prefill_opts.get("kv_layout_p", "NHD") == "NHD" else (HKV, kv_len, head_dim)
    k_p, v_p = (torch.from_numpy(rng.uniform(-1, 1, shape_p).astype(np.float32)).cuda().to(tdt) for _ in range(2))
    visible = None
    if prefill_opts.pop("custom_mask_p", False):
        visible = rng.random((qo_len, kv_len)) < 0.6
        visible[3] = False  # a row without keys
        prefill_opts["custom_mask_p"] = torch.from_numpy(visible).cuda()
    indptr, indices, last, num_pages = make_table(rng, DECODE_LENS, page_size)
    page = (page_size, HKV, head_dim) if layout == "NHD" else (HKV, page_size, head_dim)
    k_d, v_d = (torch.from_numpy(rng.uniform(-1, 1, (num_pages,) + page).astype(np.float32)).cuda().to(tdt)
                for _ in range(2))
    q_d = torch.from_numpy(rng.uniform(-2, 2, (len(DECODE_LENS), hq, head_dim)).astype(np.float32)).cuda().to(tdt)
    w = tessera.PODWithPagedKVCacheWrapper(torch.empty(128 << 20, dtype=torch.uint8, device="cuda"), layout,
                                           backend=backend)
    w.plan(torch.from_numpy(indptr).cuda(), torch.from_numpy(indices).cuda(), torch.from_numpy(last).cuda(), hq, HKV,
           head_dim, page_size, window_left=50, q_data_type=tdt)
    out_p, out_d = w.run(q_p, k_p, v_p, q_d, (k_d, v_d), v_scale=0.5, **prefill_opts)
    kn, vn = to_np(k_p), to_np(v_p)
    if prefill_opts.get("kv_layout_p") == "HND":
        kn, vn = kn.transpose(1, 0, 2), vn.transpose(1, 0, 2)
    ref_p = ref_request(to_np(q_p), kn, vn, prefill_opts.get("causal_p", False), prefill_opts.get("sm_scale_p"),
                        visible=visible, window_left=prefill_opts.get("window_left_p", -1))[0]
    ref_d = ref_batch_decode(to_np(q_d), to_np(k_d), to_np(v_d), layout, indptr, indices, last, page_size,
                             window_left=50)[0]
    check(out_p, None, ref_p, None, dtype)
    check(out_d, None, 0.5 * ref_d, None, dtype)
    # Both sides in one launch: the Hopper kernel with "auto" on sm_90, else
    # FA2; a prompt chunk of over 1024 queries in a launch of its own there.
    hopper = backend == "auto" and torch.cuda.get_device_capability()[0] == 9
    if hopper and qo_len > 1024:
        assert w._pair is None
    else:
        assert w._pair.entry.startswith("tessera_prefill_pair_") and w._pair.entry.endswith("_sm90ws") == hopper
    # The decode side's run() options: the planned ones agree, others are refused.
    again = w.run(q_p, k_p, v_p, q_d, (k_d, v_d), window_left_d=50, kv_layout_d=layout, causal_d=True,
                  return_lse_p=True, return_lse_d=True, **prefill_opts)
    assert torch.equal(again[0], out_p)
    check(again[1], None, ref_d, None, dtype)
    expect(ValueError, "^window_left_d", lambda: w.run(q_p, k_p, v_p, q_d, (k_d, v_d), window_left_d=7,
                                                         **prefill_opts))
    expect(ValueError, "^sm_scale_d", lambda: w.run(q_p, k_p, v_p, q_d, (k_d, v_d), sm_scale_d=0.3, **prefill_opts))
