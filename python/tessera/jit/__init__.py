"""JIT helpers: ahead-of-time compilation of the built-in kernels and the
location of the kernel cache.

Tessera compiles kernels with NVRTC at first use and caches the cubins on disk
($TESSERA_CACHE_DIR, else $XDG_CACHE_HOME/tessera, else ~/.cache/tessera).
Installed packages ship the built-in kernels prebuilt for sm_80 and sm_90a
(kernel packs, see kernel_packs()): those load without compiling.
compile_builtin fills that cache ahead of time (no GPU needed), e.g. while
building a container image, so the first request does not pay for compilation.

FlashInfer's JIT names (JitSpec, build_jit_specs, MissingJITCacheError and
the gen_*_module functions of the decode, prefill, attention, page and
quantization modules) are accepted so that warm-up code written for
FlashInfer runs unchanged.
"""

from collections import namedtuple

from .._native import _C
from .core import JitSpec, MissingJITCacheError, build_jit_specs, module_spec

CompiledKernel = namedtuple("CompiledKernel", ["entry", "compile_ms", "from_disk"])
CompiledKernel.__doc__ = """One built-in kernel: its entry name, NVRTC time in ms (0 when it came from
the disk cache) and whether it was loaded from the disk cache."""


def compile_builtin(arch="sm_90a", threads=0, progress=True):
    """Compiles every built-in kernel for `arch` ("sm_80", "sm_90a", "8.9", ...).

    threads: compiler threads (0 = all hardware threads).
    progress: print a line to stderr at most every 10 s while compiling.
    Returns a list of CompiledKernel(entry, compile_ms, from_disk).
    Raises RuntimeError("CompileError: ...") if NVRTC rejects a kernel.
    """
    if not isinstance(arch, str):
        raise TypeError(f"arch: expected a string such as 'sm_90a', got {type(arch).__name__}")
    if not isinstance(threads, int) or threads < 0:
        raise ValueError(f"threads: expected a non-negative int, got {threads!r}")
    return [CompiledKernel(*t) for t in _C.compile_builtin(arch, threads, bool(progress))]


def kernel_packs():
    """The directories of prebuilt kernels (kernel packs) the JIT looks in before its cache: an installed
    wheel's tessera/kernels and the C++ install's share/tessera/kernels when present."""
    return list(_C.kernel_packs())


def cache_dir():
    """The directory of the on-disk kernel cache."""
    return _C.cache_dir()


def gen_single_decode_module(dtype_q, dtype_kv, dtype_o, head_dim_qk, head_dim_vo, pos_encoding_mode,
                             use_sliding_window, use_logits_soft_cap):
    return module_spec("single_decode", dtype_q, dtype_kv, dtype_o, head_dim_qk, head_dim_vo, pos_encoding_mode,
                       use_sliding_window, use_logits_soft_cap)


def gen_batch_decode_module(dtype_q, dtype_kv, dtype_o, dtype_idx, head_dim_qk, head_dim_vo, pos_encoding_mode,
                            use_sliding_window, use_logits_soft_cap):
    return module_spec("batch_decode", dtype_q, dtype_kv, dtype_o, dtype_idx, head_dim_qk, head_dim_vo,
                       pos_encoding_mode, use_sliding_window, use_logits_soft_cap)


def gen_single_prefill_module(backend, dtype_q, dtype_kv, dtype_o, head_dim_qk, head_dim_vo, pos_encoding_mode,
                              use_sliding_window, use_logits_soft_cap, use_fp16_qk_reduction):
    return module_spec("single_prefill", backend, dtype_q, dtype_kv, dtype_o, head_dim_qk, head_dim_vo,
                       pos_encoding_mode, use_sliding_window, use_logits_soft_cap, use_fp16_qk_reduction)


def gen_batch_prefill_module(backend, dtype_q, dtype_kv, dtype_o, dtype_idx, head_dim_qk, head_dim_vo,
                             pos_encoding_mode, use_sliding_window, use_logits_soft_cap, use_fp16_qk_reduction):
    return module_spec("batch_prefill", backend, dtype_q, dtype_kv, dtype_o, dtype_idx, head_dim_qk, head_dim_vo,
                       pos_encoding_mode, use_sliding_window, use_logits_soft_cap, use_fp16_qk_reduction)


def gen_batch_attention_module(dtype_q, dtype_kv, dtype_o, dtype_idx, head_dim_qk, head_dim_vo, pos_encoding_mode,
                               use_logits_soft_cap, use_profiler):
    return module_spec("batch_attention", dtype_q, dtype_kv, dtype_o, dtype_idx, head_dim_qk, head_dim_vo,
                       pos_encoding_mode, use_logits_soft_cap, use_profiler)


def gen_page_module():
    return module_spec("page")


def gen_quantization_module():
    return module_spec("quantization")
