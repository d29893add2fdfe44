"""torch.compile support: the GPU run paths as torch.library custom ops.

Imported only while torch.compile traces a call (T.torch_ops), so tessera
still imports without torch. Dynamo does not trace into the wrappers'
argument handling or the nanobind calls: run() hands its tensors and scalars
to one opaque op (namespace ``tessera``), whose real implementation is the
eager run() and whose fake (meta) implementation only checks shapes.

* The wrapper objects cannot be graph inputs: each carries an int handle
  (W.register_handle, given at construction), which the ops take and look up
  in a registry of weak references when they run.
* The plan stays eager, outside the compiled region, as in FlashInfer: the
  traced code reads only what plan() fixed per configuration (the output
  dtype), never per-step lengths, so a new plan() does not recompile.
* The wrapper ops write into out / lse (``mutates_args``), allocated by the
  traced code as eager run() does (or given by the caller); the functional
  ops (single_decode / single_prefill / merge_state) return new tensors.
"""

from typing import Optional, Tuple

import torch

from . import _compat as C
from . import _prefill_base as B
from . import _wrapper_util as W

Tensor = torch.Tensor


def _empty(like, shape, dtype):
    """torch.empty on like's device; dtype a torch dtype or a name such as 'float16'."""
    if isinstance(dtype, str):
        dtype = getattr(torch, dtype)
    return torch.empty(shape, dtype=dtype, device=like.device)


def _planned(w):
    """The wrapper's plan (ValueError before plan(), as run())."""
    plan = w._planned
    if plan is None:
        raise ValueError("run: expected plan() to be called first")
    return plan


def _split_scale(x):
    """A k_scale / v_scale as (float or None, tensor or None)."""
    if isinstance(x, torch.Tensor):
        return None, x
    return x, None


def _paged_kv(paged_kv_cache):
    if isinstance(paged_kv_cache, (tuple, list)):
        if len(paged_kv_cache) != 2:
            raise ValueError(f"paged_kv_cache: expected a (k_cache, v_cache) pair, got {len(paged_kv_cache)} items")
        return paged_kv_cache[0], paged_kv_cache[1]
    return paged_kv_cache, None


def _cache(k, v):
    return k if v is None else (k, v)


def _check_q(q, rank, what):
    if q.dim() != rank:
        raise ValueError(f"q: expected a {rank}-D tensor [{what}], got shape {tuple(q.shape)}")


# ======================================================================= batch decode
@torch.library.custom_op("tessera::batch_decode_run", mutates_args=("out", "lse"), device_types="cuda")
def batch_decode_run(handle: int, q: Tensor, k_cache: Tensor, v_cache: Optional[Tensor], out: Tensor,
                     lse: Optional[Tensor], q_scale: Optional[float], k_scale: Optional[float],
                     v_scale: Optional[float], k_scale_tensor: Optional[Tensor], v_scale_tensor: Optional[Tensor],
                     enable_pdl: Optional[bool], window_left: Optional[int], sinks: Optional[Tensor]) -> None:
    """BatchDecodeWithPagedKVCacheWrapper.run of the wrapper `handle` into out (and lse when given)."""
    w = W.wrapper_of(handle)
    w._run(q, _cache(k_cache, v_cache), q_scale=q_scale,
           k_scale=k_scale if k_scale_tensor is None else k_scale_tensor,
           v_scale=v_scale if v_scale_tensor is None else v_scale_tensor,
           out=out, lse=lse, enable_pdl=enable_pdl, window_left=window_left, sinks=sinks)


@batch_decode_run.register_fake
def _(handle, q, k_cache, v_cache, out, lse, q_scale, k_scale, v_scale, k_scale_tensor, v_scale_tensor, enable_pdl,
      window_left, sinks):
    return None


def decode_run(w, q, paged_kv_cache, args, q_scale, k_scale, v_scale, out, lse, return_lse, enable_pdl, window_left,
               sinks, q_len_per_req, skip_softmax_threshold_scale_factor, kv_cache_sf):
    """run() of BatchDecodeWithPagedKVCacheWrapper under torch.compile: outputs as eager run() allocates them,
    the kernel through tessera::batch_decode_run."""
    if args:
        raise C.not_supported("args", args, "extra run() arguments feed custom JIT variants, which run through "
                              "tessera.AttentionWrapper")
    C.refuse_given("skip-softmax sparsity is not implemented",
                   skip_softmax_threshold_scale_factor=skip_softmax_threshold_scale_factor)
    C.refuse_given("NVFP4 KV caches are not implemented", kv_cache_sf=kv_cache_sf)
    plan = _planned(w)
    planned_n = plan.get("multi", 1)
    if q_len_per_req is not None and q_len_per_req != planned_n:
        raise ValueError(f"q_len_per_req: expected {planned_n} (as planned), got {q_len_per_req}")
    _check_q(q, 3, "batch_size, num_qo_heads, head_dim")
    o_dtype = w._multi._planned["o_dtype"] if planned_n > 1 else plan["o_dtype"]
    if out is None:
        out = _empty(q, q.shape, o_dtype)
    if lse is None and (return_lse or sinks is not None):
        lse = _empty(q, q.shape[:2], "float32")
    k, v = _paged_kv(paged_kv_cache)
    ks, kt = _split_scale(k_scale)
    vs, vt = _split_scale(v_scale)
    torch.ops.tessera.batch_decode_run(w._handle, q, k, v, out, lse, q_scale, ks, vs, kt, vt, enable_pdl,
                                       window_left, sinks)
    return (out, lse) if return_lse else out


# ======================================================================= batch prefill (paged, ragged)
@torch.library.custom_op("tessera::batch_prefill_paged_run", mutates_args=("out", "lse"), device_types="cuda")
def batch_prefill_paged_run(handle: int, q: Tensor, k_cache: Tensor, v_cache: Optional[Tensor], out: Tensor,
                            lse: Optional[Tensor], q_scale: Optional[float], k_scale: Optional[float],
                            v_scale: Optional[float], k_scale_tensor: Optional[Tensor],
                            v_scale_tensor: Optional[Tensor], return_lse: bool, lse_base: str,
                            enable_pdl: Optional[bool], window_left: Optional[int], sinks: Optional[Tensor]) -> None:
    """BatchPrefillWithPagedKVCacheWrapper.run of the wrapper `handle` into out (and lse when given)."""
    w = W.wrapper_of(handle)
    w._run(q, _cache(k_cache, v_cache), q_scale=q_scale,
           k_scale=k_scale if k_scale_tensor is None else k_scale_tensor,
           v_scale=v_scale if v_scale_tensor is None else v_scale_tensor, out=out, lse=lse,
           return_lse=return_lse, lse_base=lse_base, enable_pdl=enable_pdl, window_left=window_left, sinks=sinks)


@batch_prefill_paged_run.register_fake
def _(handle, q, k_cache, v_cache, out, lse, q_scale, k_scale, v_scale, k_scale_tensor, v_scale_tensor, return_lse,
      lse_base, enable_pdl, window_left, sinks):
    return None


@torch.library.custom_op("tessera::batch_prefill_ragged_run", mutates_args=("out", "lse"), device_types="cuda")
def batch_prefill_ragged_run(handle: int, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Optional[Tensor],
                             q_scale: Optional[float], k_scale: Optional[float], v_scale: Optional[float],
                             k_scale_tensor: Optional[Tensor], v_scale_tensor: Optional[Tensor], return_lse: bool,
                             lse_base: str, enable_pdl: Optional[bool]) -> None:
    """BatchPrefillWithRaggedKVCacheWrapper.run of the wrapper `handle` into out (and lse when given)."""
    w = W.wrapper_of(handle)
    w._run(q, k, v, q_scale=q_scale, k_scale=k_scale if k_scale_tensor is None else k_scale_tensor,
           v_scale=v_scale if v_scale_tensor is None else v_scale_tensor, out=out, lse=lse, return_lse=return_lse,
           lse_base=lse_base, enable_pdl=enable_pdl)


@batch_prefill_ragged_run.register_fake
def _(handle, q, k, v, out, lse, q_scale, k_scale, v_scale, k_scale_tensor, v_scale_tensor, return_lse, lse_base,
      enable_pdl):
    return None


def _prefill_checks(w, args, features, lse_base, lse_layout):
    if args:
        raise C.not_supported("args", args, "extra run() arguments feed custom JIT variants, which run through "
                              "tessera.AttentionWrapper")
    for name, value in features.items():
        if value is not None:
            raise C.not_supported(name, value, B._RUN_FEATURES[name])
    C.lse_options(lse_base, lse_layout)
    return _planned(w)


def _prefill_outputs(q, out, lse, want_lse, o_dtype, head_dim_vo=None):
    _check_q(q, 3, "total_q, num_qo_heads, head_dim")
    if out is None:  # v's head dim (head_dim_vo), q's unless planned otherwise
        out = _empty(q, tuple(q.shape[:2]) + (head_dim_vo or q.shape[2],), o_dtype)
    if lse is None and want_lse:
        lse = _empty(q, q.shape[:2], "float32")
    return out, lse


def prefill_paged_run(w, q, paged_kv_cache, args, q_scale, k_scale, v_scale, out, lse, return_lse, lse_base,
                      lse_layout, enable_pdl, window_left, sinks, kv_cache_sf, skip_softmax_threshold_scale_factor,
                      use_fp16_softmax, uses_spcompress):
    """run() of BatchPrefillWithPagedKVCacheWrapper under torch.compile (tessera::batch_prefill_paged_run)."""
    B.check_run_flags(use_fp16_softmax, uses_spcompress)
    plan = _prefill_checks(w, args, dict(kv_cache_sf=kv_cache_sf, skip_softmax_threshold_scale_factor=(
        skip_softmax_threshold_scale_factor)), lse_base, lse_layout)
    out, lse = _prefill_outputs(q, out, lse, return_lse or sinks is not None, plan["o_dtype"], plan.get("head_dim_vo"))
    k, v = _paged_kv(paged_kv_cache)
    (ks, kt), (vs, vt) = _split_scale(k_scale), _split_scale(v_scale)
    torch.ops.tessera.batch_prefill_paged_run(w._handle, q, k, v, out, lse, q_scale, ks, vs, kt, vt, bool(return_lse),
                                              lse_base, enable_pdl, window_left, sinks)
    return (out, lse) if return_lse else out


def prefill_ragged_run(w, q, k, v, args, q_scale, k_scale, v_scale, o_scale, out, lse, return_lse, lse_base,
                       lse_layout, enable_pdl, kv_cache_sf):
    """run() of BatchPrefillWithRaggedKVCacheWrapper under torch.compile (tessera::batch_prefill_ragged_run)."""
    plan = _prefill_checks(w, args, dict(o_scale=o_scale, kv_cache_sf=kv_cache_sf), lse_base, lse_layout)
    out, lse = _prefill_outputs(q, out, lse, return_lse, plan["o_dtype"], plan.get("head_dim_vo"))
    (ks, kt), (vs, vt) = _split_scale(k_scale), _split_scale(v_scale)
    torch.ops.tessera.batch_prefill_ragged_run(w._handle, q, k, v, out, lse, q_scale, ks, vs, kt, vt,
                                               bool(return_lse), lse_base, enable_pdl)
    return (out, lse) if return_lse else out


# ======================================================================= single-request functions, merge_state
@torch.library.custom_op("tessera::single_decode", mutates_args=(), device_types="cuda")
def single_decode(q: Tensor, k: Tensor, v: Tensor, kv_layout: str, pos_encoding_mode: str,
                  q_scale: Optional[float], k_scale: Optional[float], v_scale: Optional[float],
                  k_scale_tensor: Optional[Tensor], v_scale_tensor: Optional[Tensor], window_left: int,
                  logits_soft_cap: Optional[float], sm_scale: Optional[float], rope_scale: Optional[float],
                  rope_theta: Optional[float]) -> Tuple[Tensor, Tensor]:
    """single_decode_with_kv_cache: (o like q, lse float32 [num_qo_heads])."""
    from ._single_decode import _single_decode
    return _single_decode(q, k, v, kv_layout, pos_encoding_mode, q_scale,
                          k_scale if k_scale_tensor is None else k_scale_tensor,
                          v_scale if v_scale_tensor is None else v_scale_tensor, window_left, logits_soft_cap,
                          sm_scale, rope_scale, rope_theta, True)


@single_decode.register_fake
def _(q, k, v, kv_layout, pos_encoding_mode, q_scale, k_scale, v_scale, k_scale_tensor, v_scale_tensor, window_left,
      logits_soft_cap, sm_scale, rope_scale, rope_theta):
    _check_q(q, 2, "num_qo_heads, head_dim")
    return q.new_empty(q.shape), q.new_empty(q.shape[:1], dtype=torch.float32)


def single_decode_call(q, k, v, kv_layout, pos_encoding_mode, q_scale, k_scale, v_scale, window_left,
                       logits_soft_cap, sm_scale, rope_scale, rope_theta, return_lse):
    """single_decode_with_kv_cache under torch.compile (tessera::single_decode)."""
    ks, kt = _split_scale(k_scale)
    vs, vt = _split_scale(v_scale)
    o, lse = torch.ops.tessera.single_decode(q, k, v, kv_layout, pos_encoding_mode, q_scale, ks, vs, kt, vt,
                                             window_left, logits_soft_cap, sm_scale, rope_scale, rope_theta)
    return (o, lse) if return_lse else o


@torch.library.custom_op("tessera::single_prefill", mutates_args=(), device_types="cuda")
def single_prefill(q: Tensor, k: Tensor, v: Tensor, o_dtype: Optional[torch.dtype], custom_mask: Optional[Tensor],
                   packed_custom_mask: Optional[Tensor], causal: bool, kv_layout: str, pos_encoding_mode: str,
                   sm_scale: Optional[float], window_left: int, logits_soft_cap: Optional[float],
                   rope_scale: Optional[float], rope_theta: Optional[float], backend: str, k_scale: Optional[float],
                   v_scale: Optional[float]) -> Tuple[Tensor, Tensor]:
    """single_prefill_with_kv_cache: (o [qo_len, heads, head_dim] in o_dtype or q's, lse float32 [qo_len, heads])."""
    from ._single_prefill import _single_prefill
    return _single_prefill(q, k, v, None, None, None, o_dtype, custom_mask, packed_custom_mask, causal, kv_layout,
                           pos_encoding_mode, sm_scale, window_left, logits_soft_cap, rope_scale, rope_theta, backend,
                           True, None, k_scale, v_scale)


@single_prefill.register_fake
def _(q, k, v, o_dtype, custom_mask, packed_custom_mask, causal, kv_layout, pos_encoding_mode, sm_scale, window_left,
      logits_soft_cap, rope_scale, rope_theta, backend, k_scale, v_scale):
    _check_q(q, 3, "qo_len, num_qo_heads, head_dim")
    return (q.new_empty(tuple(q.shape[:2]) + tuple(v.shape[-1:]), dtype=q.dtype if o_dtype is None else o_dtype),
            q.new_empty(q.shape[:2], dtype=torch.float32))


def _float_scale(name, x):
    """single_prefill's k_scale / v_scale under torch.compile: a float or None (a tensor raises eager run()'s
    error; its custom op takes floats)."""
    if isinstance(x, torch.Tensor):
        W.run_scales(1.0, 1, None, x if name == "k_scale" else None, x if name == "v_scale" else None)
    return x


def single_prefill_call(q, k, v, o_dtype, custom_mask, packed_custom_mask, causal, kv_layout, pos_encoding_mode,
                        sm_scale, window_left, logits_soft_cap, rope_scale, rope_theta, backend, return_lse, k_scale,
                        v_scale):
    """single_prefill_with_kv_cache under torch.compile (tessera::single_prefill); o_dtype a torch dtype, a
    name or None."""
    if o_dtype is not None and not isinstance(o_dtype, torch.dtype):
        o_dtype = getattr(torch, W.dtype_arg(o_dtype, "o_dtype"))
    o, lse = torch.ops.tessera.single_prefill(q, k, v, o_dtype, custom_mask, packed_custom_mask, bool(causal),
                                              kv_layout, pos_encoding_mode, sm_scale, window_left, logits_soft_cap,
                                              rope_scale, rope_theta, backend, _float_scale("k_scale", k_scale),
                                              _float_scale("v_scale", v_scale))
    return (o, lse) if return_lse else o


@torch.library.custom_op("tessera::merge_state", mutates_args=(), device_types="cuda")
def merge_state(v_a: Tensor, s_a: Tensor, v_b: Tensor, s_b: Tensor, pdl: bool) -> Tuple[Tensor, Tensor]:
    """tessera.merge_state: (v like v_a, s float32 [seq_len, num_heads])."""
    from .cascade import _merge_state
    return _merge_state(v_a, s_a, v_b, s_b, pdl)


@merge_state.register_fake
def _(v_a, s_a, v_b, s_b, pdl):
    return v_a.new_empty(v_a.shape), v_a.new_empty(v_a.shape[:-1], dtype=torch.float32)


def merge_state_call(v_a, s_a, v_b, s_b, pdl):
    """merge_state under torch.compile (tessera::merge_state)."""
    return tuple(torch.ops.tessera.merge_state(v_a, s_a, v_b, s_b, pdl))
