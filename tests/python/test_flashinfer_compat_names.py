"""FlashInfer's utility, JIT warm-up and FP4 names that Tessera provides so
that code written against FlashInfer imports and runs unchanged: the values
they return, their validation, and that FP4 operations refuse clearly. No GPU
needed (device queries skip without torch and a GPU)."""

import pytest

import tessera
from tessera import utils
from tessera.jit import JitSpec, MissingJITCacheError, build_jit_specs
from tessera.jit.core import build_jit_specs as core_build_jit_specs
from tessera.quantization.nvfp4_quantization_utils import NVFP44Over6Config, NVFP44Over6ErrMode, nvfp4_e4m3_max


def test_jit_core_is_the_same_function():
    assert core_build_jit_specs is build_jit_specs


def test_gen_module_specs_name_their_arguments():
    a = tessera.decode.gen_batch_decode_module("float16", "float16", "float16", "int32", 128, 128, 0, False, True)
    b = tessera.decode.gen_batch_decode_module("float16", "float16", "float16", "int32", 128, 128, 0, False, True)
    c = tessera.decode.gen_batch_decode_module("float16", "float16", "float16", "int32", 64, 64, 0, False, True)
    assert isinstance(a, JitSpec) and a == b and hash(a) == hash(b) and a != c
    assert a.name.startswith("batch_decode_") and "128" in a.name
    p = tessera.prefill.gen_batch_prefill_module("fa2", "bfloat16", "bfloat16", "bfloat16", "int32", 64, 64, 1,
                                                  True, False, False)
    assert p.name.startswith("batch_prefill_fa2_") and p.build_and_load() is None
    specs = [a, p, tessera.prefill.gen_single_prefill_module("fa3", "float16", "float16", "float16", 128, 128, 0,
                                                             False, False, False),
             tessera.decode.gen_single_decode_module("float16", "float16", "float16", 128, 128, 0, False, False),
             tessera.attention.gen_batch_attention_module("float16", "float16", "float16", "int32", 128, 128, 0,
                                                          False, False),
             tessera.page.gen_page_module(), tessera.quantization.gen_quantization_module()]
    assert build_jit_specs(specs, verbose=True) is None
    assert len(set(specs)) == len(specs)


def test_build_jit_specs_rejects_non_specs():
    with pytest.raises(TypeError, match=r"specs\[1\]: expected a JitSpec"):
        build_jit_specs([tessera.page.gen_page_module(), "page"])


def test_missing_jit_cache_error_is_a_runtime_error():
    assert issubclass(MissingJITCacheError, RuntimeError)


def test_fa3_support_queries():
    assert utils.is_fa3_prefill_head_dim_supported(128, 128)
    assert utils.is_fa3_prefill_head_dim_supported(64, 64) and utils.is_fa3_prefill_head_dim_supported(256, 256)
    assert not utils.is_fa3_prefill_head_dim_supported(192, 128)
    assert not utils.is_fa3_prefill_head_dim_supported(512, 512)
    assert utils.is_fa3_backend_supported(0, False, True, "float16", "float16")
    assert not utils.is_fa3_backend_supported(utils.PosEncodingMode.ROPE_LLAMA, False, False, "float16", "float16")
    assert not utils.is_fa3_backend_supported(0, True, False, "float16", "float16")


def test_enums_and_integer_helpers():
    assert [m.value for m in utils.PosEncodingMode] == [0, 1, 2]
    assert utils.TensorLayout.HND.value == 1 and utils.MaskMode.CUSTOM.value == 2
    assert utils.round_up(5, 4) == 8 and utils.round_up(8, 4) == 8 and utils.ceil_div(9, 4) == 3
    assert issubclass(utils.GPUArchitectureError, Exception)


def test_has_jit_cache_reports_the_kernel_packs():
    assert utils.has_flashinfer_jit_cache() == bool(tessera.jit.kernel_packs())
    assert utils.has_tessera_jit_cache is utils.has_flashinfer_jit_cache


def test_device_queries_need_a_cuda_device():
    torch = pytest.importorskip("torch")
    with pytest.raises(ValueError, match="device: expected a cuda device"):
        utils.get_compute_capability(torch.device("cpu"))
    if not torch.cuda.is_available():
        pytest.skip("skipped: no GPU")
    major, minor = utils.get_compute_capability(torch.device("cuda"))
    assert (major, minor) == torch.cuda.get_device_capability()
    assert utils.is_sm90a_supported(torch.device("cuda")) == (major == 9)
    assert not utils.is_sm100a_supported(torch.device("cuda"))


def test_nvfp4_recipe_validation():
    assert nvfp4_e4m3_max() == 448.0 and nvfp4_e4m3_max(NVFP44Over6Config(e4m3_max=256)) == 256.0
    assert NVFP44Over6Config(err_mode="mse").err_mode is NVFP44Over6ErrMode.MSE
    with pytest.raises(ValueError, match="e4m3_max: expected 256 or 448"):
        NVFP44Over6Config(e4m3_max=300)
    with pytest.raises(ValueError, match="err_mode: expected 'MAE' or 'MSE'"):
        NVFP44Over6Config(err_mode="max")


def test_fp4_operations_refuse():
    from tessera.fp4_quantization import e2m1_and_ufp8sf_scale_to_float
    with pytest.raises(tessera.NotSupportedError, match=r"^e2m1_tensor=.*not supported yet"):
        e2m1_and_ufp8sf_scale_to_float(None, None)


def test_fast_decode_plan_refuses_other_objects():
    with pytest.raises(TypeError, match="self: expected a BatchDecodeWithPagedKVCacheWrapper"):
        tessera.fast_decode_plan(object(), [0, 1], [0], [1], 8, 8, 128, 16)


def test_fast_decode_plan_matches_plan_on_gpu():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available() or not tessera.gpu_available():
        pytest.skip("skipped: no GPU")
    import functools
    torch.manual_seed(0)
    dev = torch.device("cuda")
    batch, page, hq, hkv, d = 5, 16, 8, 2, 128
    lens = [1, 17, 160, 33, 250]
    pages = [(n + page - 1) // page for n in lens]
    indptr = torch.tensor([0] + list(torch.tensor(pages).cumsum(0)), dtype=torch.int32)
    total = int(indptr[-1])
    indices = torch.randperm(total + 3, dtype=torch.int32)[:total]
    last = torch.tensor([(n - 1) % page + 1 for n in lens], dtype=torch.int32)
    cache = torch.randn(total + 3, 2, page, hkv, d, dtype=torch.float16, device=dev)
    q = torch.randn(batch, hq, d, dtype=torch.float16, device=dev)
    outs = []
    for fast in (False, True):
        w = tessera.BatchDecodeWithPagedKVCacheWrapper(torch.empty(64 << 20, dtype=torch.int8, device=dev), "NHD")
        if fast:
            w.plan = functools.partial(tessera.fast_decode_plan, w)
        extra = {"global_override_indptr_cpu": indptr} if fast else {}
        w.plan(indptr.to(dev), indices.to(dev), last.to(dev), hq, hkv, d, page, data_type=torch.float16,
               q_data_type=torch.float16, **extra)
        outs.append(w.run(q, cache))
    assert torch.equal(outs[0], outs[1])
    # Against float64 attention over the gathered pages.
    for b in range(batch):
        ids = indices[int(indptr[b]):int(indptr[b + 1])].long().to(dev)
        k = cache[ids, 0].reshape(-1, hkv, d)[:lens[b]].double()
        v = cache[ids, 1].reshape(-1, hkv, d)[:lens[b]].double()
        k = k.repeat_interleave(hq // hkv, dim=1)
        v = v.repeat_interleave(hq // hkv, dim=1)
        s = torch.einsum("hd,khd->hk", q[b].double(), k) / d ** 0.5
        ref = torch.einsum("hk,khd->hd", s.softmax(-1), v)
        err = (outs[1][b].double() - ref).abs().max() / ref.norm()
        assert torch.isfinite(outs[1][b]).all() and err < 1e-3


@pytest.mark.parametrize("kind", ["decode", "decode_tc", "prefill"])
def test_workspace_size_plans_with_exact_buffers_gpu(torch_cuda, kind):
    """FlashInfer's workspace_size(): the returned float / int sizes are buffers plan() and run() work with, and
    asking leaves an existing plan intact."""
    torch = torch_cuda
    batch, kv_len, page, hq, hkv, d = 4, 4096, 16, 16, 4, 128
    per = kv_len // page
    indptr = torch.arange(batch + 1, dtype=torch.int32, device="cuda") * per
    indices = torch.arange(batch * per, dtype=torch.int32, device="cuda")
    last = torch.full((batch,), page, dtype=torch.int32, device="cuda")
    cache = torch.randn(batch * per, 2, page, hkv, d, dtype=torch.float16, device="cuda")
    big = torch.empty(64 << 20, dtype=torch.uint8, device="cuda")
    if kind == "prefill":
        w = tessera.BatchPrefillWithPagedKVCacheWrapper(big)
        qo = torch.arange(batch + 1, dtype=torch.int32, device="cuda") * 7
        args = (qo, indptr, indices, last, hq, hkv, d, page)
        kw = dict(causal=True, q_data_type=torch.float16)
        q = torch.randn(int(qo[-1]), hq, d, dtype=torch.float16, device="cuda")
    else:
        w = tessera.BatchDecodeWithPagedKVCacheWrapper(big, use_tensor_cores=kind == "decode_tc")
        args = (indptr, indices, last, hq, hkv, d, page)
        kw = dict(q_data_type=torch.float16, kv_data_type=torch.float16)
        q = torch.randn(batch, hq, d, dtype=torch.float16, device="cuda")
    w.plan(*args, **kw)
    before = w.run(q, cache)
    f, i = w.workspace_size(*args, **kw)
    assert f > 0 and i > 0 and w._plan_info is not None
    assert torch.equal(w.run(q, cache), before)  # the probe left the plan alone
    w.reset_workspace_buffer(torch.empty(f, dtype=torch.uint8, device="cuda"),
                             torch.empty(i, dtype=torch.uint8, device="cuda"))
    w.plan(*args, **kw)
    assert torch.equal(w.run(q, cache), before)  # the ideal size splits like the large buffer


def test_unaligned_workspace_refused():
    torch = pytest.importorskip("torch")
    base = torch.empty(4096 + 1, dtype=torch.uint8)
    view = base[1:]
    with pytest.raises(ValueError, match="float_workspace_buffer must be 16-byte aligned"):
        tessera.BatchPrefillWithPagedKVCacheWrapper(view)
    with pytest.raises(ValueError, match="float_workspace_buffer must be 16-byte aligned"):
        tessera.BatchDecodeWithPagedKVCacheWrapper(view)
    w = tessera.BatchDecodeWithPagedKVCacheWrapper(base[:4096])
    with pytest.raises(ValueError, match="int_workspace_buffer must be 16-byte aligned"):
        w.reset_workspace_buffer(base[:4096], view)
