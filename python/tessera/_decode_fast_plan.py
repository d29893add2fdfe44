"""fast_decode_plan: FlashInfer's plan entry point for multi-step draft decoding, called as a function
on a decode wrapper (engines bind it with functools.partial(fast_decode_plan, wrapper))."""


def fast_decode_plan(self, indptr, indices, last_page_len, num_qo_heads, num_kv_heads, head_dim, page_size,
                     pos_encoding_mode="NONE", window_left=-1, logits_soft_cap=None, q_data_type=None,
                     kv_data_type=None, data_type=None, sm_scale=None, rope_scale=None, rope_theta=None,
                     non_blocking=True, fixed_split_size=None, disable_split_kv=False, q_len_per_req=1,
                     global_override_indptr_cpu=None):
    """Plans a decode step on `self` (a BatchDecodeWithPagedKVCacheWrapper) like its plan().

    FlashInfer offers this as a cheaper plan that skips buffer copies. Tessera's plan() already
    copies nothing it need not (device page ids stay on the device, the schedule is built on the
    host from the lengths), so this is plan() with FlashInfer's positional order. Given
    global_override_indptr_cpu (a host copy of indptr), the lengths are read from it instead of
    from indptr, which then need not be read back from the device.
    """
    plan = getattr(type(self), "plan", None)
    if plan is None or not hasattr(self, "_plan_impl"):
        raise TypeError(f"self: expected a BatchDecodeWithPagedKVCacheWrapper, got {type(self).__name__}")
    if not isinstance(q_len_per_req, int) or q_len_per_req < 1:
        raise ValueError(f"q_len_per_req: expected an int >= 1, got {q_len_per_req!r}")
    if global_override_indptr_cpu is not None:
        indptr = global_override_indptr_cpu
    if q_data_type is None:
        q_data_type = data_type if data_type is not None else "float16"
    # Unbound: engines often replace the instance's plan attribute with this very function.
    plan(self, indptr, indices, last_page_len, num_qo_heads, num_kv_heads, head_dim, page_size,
         pos_encoding_mode=pos_encoding_mode, window_left=window_left, logits_soft_cap=logits_soft_cap,
         q_data_type=q_data_type, kv_data_type=kv_data_type, data_type=data_type, sm_scale=sm_scale,
         rope_scale=rope_scale, rope_theta=rope_theta, non_blocking=non_blocking,
         fixed_split_size=fixed_split_size, disable_split_kv=disable_split_kv, q_len_per_req=q_len_per_req)
