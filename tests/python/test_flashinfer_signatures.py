"""The FlashInfer 0.7.2 (flashinfer-python 0.7.2.post1) parameter lists of
every function and wrapper method Tessera offers, checked with
inspect.signature without a GPU: the same names in the same order, the same
kinds (positional-or-keyword, *args, keyword-only, **kwargs) and the same
defaults (value and type), so that any call valid for FlashInfer binds the
same way here.

FLASHINFER was written down from the wheel's sources: for overloaded
functions the implementation's list (the overloads only narrow return_lse).
FlashInfer's decode plan() takes its options as **kwargs and forwards them
to _plan_impl, whose keyword-only list is the second decode entry; Tessera
mirrors that split. TESSERA_EXTRAS lists Tessera's own parameters, which
must come after FlashInfer's, keyword-only and with defaults.
"""

import functools
import importlib
import inspect

import pytest

import tessera

# (tessera module named like FlashInfer's, qualified name) -> FlashInfer's parameters, without self.
FLASHINFER = {
    # flashinfer.decode
    ("decode", "single_decode_with_kv_cache"): (
        "q, k, v, kv_layout='NHD', pos_encoding_mode='NONE', use_tensor_cores=False, q_scale=None, k_scale=None, "
        "v_scale=None, window_left=-1, logits_soft_cap=None, sm_scale=None, rope_scale=None, rope_theta=None, "
        "return_lse=False"),
    ("decode", "BatchDecodeWithPagedKVCacheWrapper.__init__"): (
        "float_workspace_buffer, kv_layout='NHD', use_cuda_graph=False, use_tensor_cores=False, "
        "paged_kv_indptr_buffer=None, paged_kv_indices_buffer=None, paged_kv_last_page_len_buffer=None, "
        "backend='auto', jit_args=None"),
    ("decode", "BatchDecodeWithPagedKVCacheWrapper.plan"): (
        "indptr, indices, last_page_len, num_qo_heads, num_kv_heads, head_dim, page_size, "
        "*deprecated_positional_args, **kwargs"),
    ("decode", "BatchDecodeWithPagedKVCacheWrapper._plan_impl"): (
        "indptr, indices, last_page_len, num_qo_heads, num_kv_heads, head_dim, page_size, *, "
        "pos_encoding_mode='NONE', window_left=-1, window_right=0, logits_soft_cap=None, q_data_type='float16', "
        "kv_data_type=None, o_data_type=None, data_type=None, sm_scale=None, rope_scale=None, rope_theta=None, "
        "non_blocking=True, block_tables=None, seq_lens=None, fixed_split_size=None, disable_split_kv=False, "
        "q_len_per_req=1, is_causal=None"),
    ("decode", "BatchDecodeWithPagedKVCacheWrapper.run"): (
        "q, paged_kv_cache, *args, q_scale=None, k_scale=None, v_scale=None, out=None, lse=None, "
        "return_lse=False, enable_pdl=None, window_left=None, sinks=None, q_len_per_req=None, "
        "skip_softmax_threshold_scale_factor=None, kv_cache_sf=None"),
    ("decode", "BatchDecodeWithPagedKVCacheWrapper.forward"): (
        "q, paged_kv_cache, pos_encoding_mode='NONE', q_scale=None, k_scale=None, v_scale=None, window_left=-1, "
        "logits_soft_cap=None, sm_scale=None, rope_scale=None, rope_theta=None"),
    ("decode", "BatchDecodeWithPagedKVCacheWrapper.forward_return_lse"): (
        "q, paged_kv_cache, pos_encoding_mode='NONE', q_scale=None, k_scale=None, v_scale=None, window_left=-1, "
        "logits_soft_cap=None, sm_scale=None, rope_scale=None, rope_theta=None"),
    ("decode", "BatchDecodeWithPagedKVCacheWrapper.reset_workspace_buffer"): (
        "float_workspace_buffer, int_workspace_buffer"),
    ("decode", "CUDAGraphBatchDecodeWithPagedKVCacheWrapper.__init__"): (
        "workspace_buffer, indptr_buffer, indices_buffer, last_page_len_buffer, kv_layout='NHD', "
        "use_tensor_cores=False"),
    # flashinfer.prefill
    ("prefill", "single_prefill_with_kv_cache"): (
        "q, k, v, scale_q=None, scale_k=None, scale_v=None, o_dtype=None, custom_mask=None, "
        "packed_custom_mask=None, causal=False, kv_layout='NHD', pos_encoding_mode='NONE', "
        "use_fp16_qk_reduction=False, sm_scale=None, window_left=-1, logits_soft_cap=None, rope_scale=None, "
        "rope_theta=None, backend='auto', return_lse=False, kv_cache_sf=None, k_scale=None, v_scale=None"),
    ("prefill", "BatchPrefillWithPagedKVCacheWrapper.__init__"): (
        "float_workspace_buffer, kv_layout='NHD', use_cuda_graph=False, qo_indptr_buf=None, "
        "paged_kv_indptr_buf=None, paged_kv_indices_buf=None, paged_kv_last_page_len_buf=None, "
        "custom_mask_buf=None, mask_indptr_buf=None, backend='auto', jit_args=None, jit_kwargs=None, "
        "variant_owns_mask=False"),
    ("prefill", "BatchPrefillWithPagedKVCacheWrapper.plan"): (
        "qo_indptr, paged_kv_indptr, paged_kv_indices, paged_kv_last_page_len, num_qo_heads, num_kv_heads, "
        "head_dim_qk, page_size, head_dim_vo=None, custom_mask=None, packed_custom_mask=None, causal=False, "
        "pos_encoding_mode='NONE', use_fp16_qk_reduction=False, sm_scale=None, window_left=-1, "
        "logits_soft_cap=None, rope_scale=None, rope_theta=None, q_data_type='float16', kv_data_type=None, "
        "o_data_type=None, non_blocking=True, prefix_len_ptr=None, token_pos_in_items_ptr=None, "
        "token_pos_in_items_len=0, max_item_len_ptr=None, seq_lens=None, seq_lens_q=None, block_tables=None, "
        "max_token_per_sequence=None, max_sequence_kv=None, fixed_split_size=None, disable_split_kv=False, "
        "uniform_q_len=None"),
    ("prefill", "BatchPrefillWithPagedKVCacheWrapper.run"): (
        "q, paged_kv_cache, *args, q_scale=None, k_scale=None, v_scale=None, out=None, lse=None, "
        "return_lse=False, lse_base='log2', lse_layout='NH', enable_pdl=None, window_left=None, sinks=None, "
        "kv_cache_sf=None, skip_softmax_threshold_scale_factor=None, use_fp16_softmax=None, uses_spcompress=None"),
    ("prefill", "BatchPrefillWithPagedKVCacheWrapper.forward"): (
        "q, paged_kv_cache, causal=False, pos_encoding_mode='NONE', use_fp16_qk_reduction=False, k_scale=None, "
        "v_scale=None, window_left=-1, logits_soft_cap=None, sm_scale=None, rope_scale=None, rope_theta=None"),
    ("prefill", "BatchPrefillWithPagedKVCacheWrapper.forward_return_lse"): (
        "q, paged_kv_cache, causal=False, pos_encoding_mode='NONE', use_fp16_qk_reduction=False, k_scale=None, "
        "v_scale=None, window_left=-1, logits_soft_cap=None, sm_scale=None, rope_scale=None, rope_theta=None"),
    ("prefill", "BatchPrefillWithPagedKVCacheWrapper.reset_workspace_buffer"): (
        "float_workspace_buffer, int_workspace_buffer"),
    ("prefill", "BatchPrefillWithRaggedKVCacheWrapper.__init__"): (
        "float_workspace_buffer, kv_layout='NHD', use_cuda_graph=False, qo_indptr_buf=None, kv_indptr_buf=None, "
        "custom_mask_buf=None, mask_indptr_buf=None, backend='auto', jit_args=None, jit_kwargs=None, "
        "variant_owns_mask=False"),
    ("prefill", "BatchPrefillWithRaggedKVCacheWrapper.plan"): (
        "qo_indptr, kv_indptr, num_qo_heads, num_kv_heads, head_dim_qk, head_dim_vo=None, custom_mask=None, "
        "packed_custom_mask=None, causal=False, pos_encoding_mode='NONE', use_fp16_qk_reduction=False, "
        "window_left=-1, logits_soft_cap=None, sm_scale=None, rope_scale=None, rope_theta=None, "
        "q_data_type='float16', kv_data_type=None, o_data_type=None, non_blocking=True, prefix_len_ptr=None, "
        "token_pos_in_items_ptr=None, token_pos_in_items_len=0, max_item_len_ptr=None, fixed_split_size=None, "
        "disable_split_kv=False, seq_lens=None, seq_lens_q=None, max_token_per_sequence=None, "
        "max_sequence_kv=None, v_indptr=None, o_indptr=None, uniform_q_len=None"),
    ("prefill", "BatchPrefillWithRaggedKVCacheWrapper.run"): (
        "q, k, v, *args, q_scale=None, k_scale=None, v_scale=None, o_scale=None, out=None, lse=None, "
        "return_lse=False, lse_base='log2', lse_layout='NH', enable_pdl=None, kv_cache_sf=None"),
    ("prefill", "BatchPrefillWithRaggedKVCacheWrapper.forward"): (
        "q, k, v, causal=False, pos_encoding_mode='NONE', use_fp16_qk_reduction=False, window_left=-1, "
        "logits_soft_cap=None, sm_scale=None, rope_scale=None, rope_theta=None"),
    ("prefill", "BatchPrefillWithRaggedKVCacheWrapper.forward_return_lse"): (
        "q, k, v, causal=False, pos_encoding_mode='NONE', use_fp16_qk_reduction=False, window_left=-1, "
        "logits_soft_cap=None, sm_scale=None, rope_scale=None, rope_theta=None"),
    ("prefill", "BatchPrefillWithRaggedKVCacheWrapper.reset_workspace_buffer"): (
        "float_workspace_buffer, int_workspace_buffer"),
    # flashinfer.sparse
    ("sparse", "BlockSparseAttentionWrapper.__init__"): "float_workspace_buffer, backend='auto'",
    ("sparse", "BlockSparseAttentionWrapper.plan"): (
        "indptr, indices, M, N, R, C, num_qo_heads, num_kv_heads, head_dim, mask=None, packed_mask=None, "
        "causal=False, pos_encoding_mode='NONE', use_fp16_qk_reduction=False, logits_soft_cap=None, "
        "sm_scale=None, rope_scale=None, rope_theta=None, q_data_type='float16', kv_data_type=None, "
        "o_data_type='float16', non_blocking=True, block_mask=None, kv_block_lens=None, q2k_indices=None, "
        "q2k_num=None, kv_splits=None, use_clc=None, q_scale=None, k_scale=None, v_scale=None"),
    ("sparse", "BlockSparseAttentionWrapper.run"): (
        "q, k, v, scale_q=None, scale_k=None, scale_v=None, out=None, lse=None, return_lse=False, enable_pdl=None"),
    ("sparse", "BlockSparseAttentionWrapper.forward"): (
        "q, k, v, scale_q=None, scale_k=None, scale_v=None, pos_encoding_mode='NONE', "
        "use_fp16_qk_reduction=False, logits_soft_cap=None, sm_scale=None, rope_scale=None, rope_theta=None"),
    ("sparse", "BlockSparseAttentionWrapper.reset_workspace_buffer"): "float_workspace_buffer, int_workspace_buffer",
    ("sparse", "VariableBlockSparseAttentionWrapper.__init__"): "float_workspace_buffer, backend='auto'",
    ("sparse", "VariableBlockSparseAttentionWrapper.reset_workspace_buffer"): (
        "float_workspace_buffer, int_workspace_buffer"),
    ("sparse", "VariableBlockSparseAttentionWrapper.plan"): (
        "block_mask_map, block_row_sz, block_col_sz, num_qo_heads, num_kv_heads, head_dim, causal=False, "
        "pos_encoding_mode='NONE', use_fp16_qk_reduction=False, logits_soft_cap=None, sm_scale=None, "
        "rope_scale=None, rope_theta=None, non_blocking=True, q_data_type='float16', kv_data_type=None"),
    ("sparse", "VariableBlockSparseAttentionWrapper.run"): (
        "q, k, v, out=None, lse=None, return_lse=False, enable_pdl=None"),
    ("sparse", "VariableBlockSparseAttentionWrapper.forward"): (
        "q, k, v, pos_encoding_mode='NONE', use_fp16_qk_reduction=False, logits_soft_cap=None, sm_scale=None, "
        "rope_scale=None, rope_theta=None"),
    # flashinfer.cascade
    ("cascade", "merge_state"): "v_a, s_a, v_b, s_b",
    ("cascade", "merge_state_in_place"): "v, s, v_other, s_other, mask=None",
    ("cascade", "merge_states"): "v, s",
    ("cascade", "MultiLevelCascadeAttentionWrapper.__init__"): (
        "num_levels, float_workspace_buffer, kv_layout='NHD', use_cuda_graph=False, qo_indptr_buf_arr=None, "
        "paged_kv_indptr_buf_arr=None, paged_kv_indices_buf_arr=None, paged_kv_last_page_len_buf_arr=None"),
    ("cascade", "MultiLevelCascadeAttentionWrapper.plan"): (
        "qo_indptr_arr, paged_kv_indptr_arr, paged_kv_indices_arr, paged_kv_last_page_len, num_qo_heads, "
        "num_kv_heads, head_dim, page_size, causal=False, pos_encoding_mode='NONE', use_fp16_qk_reduction=False, "
        "sm_scale=None, window_left=-1, logits_soft_cap=None, rope_scale=None, rope_theta=None, "
        "q_data_type='float16', kv_data_type=None"),
    ("cascade", "MultiLevelCascadeAttentionWrapper.run"): "q, paged_kv_cache",
    ("cascade", "MultiLevelCascadeAttentionWrapper.reset_workspace_buffer"): (
        "float_workspace_buffer, int_workspace_buffers"),
    ("cascade", "BatchDecodeWithSharedPrefixPagedKVCacheWrapper.__init__"): "float_workspace_buffer, kv_layout='NHD'",
    ("cascade", "BatchDecodeWithSharedPrefixPagedKVCacheWrapper.reset_workspace_buffer"): (
        "float_workspace_buffer, int_workspace_buffer"),
    ("cascade", "BatchDecodeWithSharedPrefixPagedKVCacheWrapper.begin_forward"): (
        "unique_kv_indptr, unique_kv_indices, unique_kv_last_page_len, num_qo_heads, num_kv_heads, head_dim, "
        "page_size, data_type='float16'"),
    ("cascade", "BatchDecodeWithSharedPrefixPagedKVCacheWrapper.forward"): "q, k_shared, v_shared, unique_kv_cache",
    ("cascade", "BatchPrefillWithSharedPrefixPagedKVCacheWrapper.__init__"): "float_workspace_buffer, kv_layout='NHD'",
    ("cascade", "BatchPrefillWithSharedPrefixPagedKVCacheWrapper.reset_workspace_buffer"): (
        "float_workspace_buffer, int_workspace_buffer"),
    ("cascade", "BatchPrefillWithSharedPrefixPagedKVCacheWrapper.begin_forward"): (
        "qo_indptr, paged_kv_indptr, paged_kv_indices, paged_kv_last_page_len, num_qo_heads, num_kv_heads, "
        "head_dim, page_size"),
    ("cascade", "BatchPrefillWithSharedPrefixPagedKVCacheWrapper.forward"): (
        "q, k_shared, v_shared, unique_kv_cache, causal=False, use_fp16_qk_reduction=False, sm_scale=None, "
        "rope_scale=None, rope_theta=None"),
    # flashinfer.attention (FlashInfer's dtype defaults are torch.bfloat16; torch is optional here, so the name)
    ("attention", "BatchAttention.__init__"): "kv_layout='NHD', device='cuda'",
    ("attention", "BatchAttention.plan"): (
        "qo_indptr, kv_indptr, kv_indices, kv_len_arr, num_qo_heads, num_kv_heads, head_dim_qk, head_dim_vo, "
        "page_size, causal=False, sm_scale=None, logits_soft_cap=None, q_data_type='bfloat16', "
        "kv_data_type='bfloat16', use_profiler=False"),
    ("attention", "BatchAttention.run"): (
        "q, kv_cache, out=None, lse=None, k_scale=None, v_scale=None, logits_soft_cap=0.0, profiler_buffer=None, "
        "kv_cache_sf=None"),
    # flashinfer.pod
    ("pod", "PODWithPagedKVCacheWrapper.__init__"): (
        "float_workspace_buffer, kv_layout='NHD', use_cuda_graph=False, paged_kv_indptr_buffer=None, "
        "paged_kv_indices_buffer=None, paged_kv_last_page_len_buffer=None, jit_args=None"),
    ("pod", "PODWithPagedKVCacheWrapper.reset_workspace_buffer"): "float_workspace_buffer, int_workspace_buffer",
    ("pod", "PODWithPagedKVCacheWrapper.plan"): (
        "indptr, indices, last_page_len, num_qo_heads, num_kv_heads, head_dim, page_size, pos_encoding_mode='NONE', "
        "window_left=-1, q_data_type='float16', kv_data_type=None, data_type=None, sm_scale=None, rope_scale=None, "
        "rope_theta=None, non_blocking=True"),
    ("pod", "PODWithPagedKVCacheWrapper.run"): (
        "q_p, k_p, v_p, q_d, paged_kv_cache_d, custom_mask_p=None, packed_custom_mask_p=None, causal_p=False, "
        "kv_layout_p='NHD', pos_encoding_mode_p='NONE', sm_scale_p=None, window_left_p=-1, rope_scale_p=None, "
        "rope_theta_p=None, return_lse_p=False, custom_mask_d=None, packed_custom_mask_d=None, causal_d=False, "
        "kv_layout_d='NHD', pos_encoding_mode_d='NONE', sm_scale_d=None, window_left_d=-1, rope_scale_d=None, "
        "rope_theta_d=None, q_scale=None, k_scale=None, v_scale=None, return_lse_d=False, "
        "use_fp16_qk_reduction=False, enable_pdl=None, *args"),
    ("decode", "fast_decode_plan"): (
        "self, indptr, indices, last_page_len, num_qo_heads, num_kv_heads, head_dim, page_size, "
        "pos_encoding_mode='NONE', window_left=-1, logits_soft_cap=None, q_data_type=None, kv_data_type=None, "
        "data_type=None, sm_scale=None, rope_scale=None, rope_theta=None, non_blocking=True, "
        "fixed_split_size=None, disable_split_kv=False, q_len_per_req=1, global_override_indptr_cpu=None"),
    ("decode", "BatchDecodeWithPagedKVCacheWrapper.workspace_size"): (
        "indptr, indices, last_page_len, num_qo_heads, num_kv_heads, head_dim, page_size, pos_encoding_mode='NONE', "
        "window_left=-1, logits_soft_cap=None, q_data_type='float16', kv_data_type=None, o_data_type=None, "
        "data_type=None, sm_scale=None, rope_scale=None, rope_theta=None, block_tables=None, seq_lens=None, "
        "fixed_split_size=None, disable_split_kv=False, q_len_per_req=1"),
    ("prefill", "BatchPrefillWithPagedKVCacheWrapper.workspace_size"): (
        "qo_indptr, paged_kv_indptr, paged_kv_indices, paged_kv_last_page_len, num_qo_heads, num_kv_heads, "
        "head_dim_qk, page_size, head_dim_vo=None, custom_mask=None, packed_custom_mask=None, causal=False, "
        "pos_encoding_mode='NONE', use_fp16_qk_reduction=False, sm_scale=None, window_left=-1, "
        "logits_soft_cap=None, rope_scale=None, rope_theta=None, q_data_type='float16', kv_data_type=None, "
        "o_data_type=None, prefix_len_ptr=None, token_pos_in_items_ptr=None, token_pos_in_items_len=0, "
        "max_item_len_ptr=None, seq_lens=None, seq_lens_q=None, block_tables=None, max_token_per_sequence=None, "
        "max_sequence_kv=None, fixed_split_size=None, disable_split_kv=False, uniform_q_len=None"),
    # flashinfer.jit (the warm-up interface) and flashinfer.utils
    ("jit", "build_jit_specs"): "specs, verbose=False, skip_prebuilt=True",
    ("decode", "gen_batch_decode_module"): (
        "dtype_q, dtype_kv, dtype_o, dtype_idx, head_dim_qk, head_dim_vo, pos_encoding_mode, use_sliding_window, "
        "use_logits_soft_cap"),
    ("decode", "gen_single_decode_module"): (
        "dtype_q, dtype_kv, dtype_o, head_dim_qk, head_dim_vo, pos_encoding_mode, use_sliding_window, "
        "use_logits_soft_cap"),
    ("prefill", "gen_batch_prefill_module"): (
        "backend, dtype_q, dtype_kv, dtype_o, dtype_idx, head_dim_qk, head_dim_vo, pos_encoding_mode, "
        "use_sliding_window, use_logits_soft_cap, use_fp16_qk_reduction"),
    ("prefill", "gen_single_prefill_module"): (
        "backend, dtype_q, dtype_kv, dtype_o, head_dim_qk, head_dim_vo, pos_encoding_mode, use_sliding_window, "
        "use_logits_soft_cap, use_fp16_qk_reduction"),
    ("attention", "gen_batch_attention_module"): (
        "dtype_q, dtype_kv, dtype_o, dtype_idx, head_dim_qk, head_dim_vo, pos_encoding_mode, use_logits_soft_cap, "
        "use_profiler"),
    ("utils", "is_fa3_backend_supported"): (
        "pos_encoding_mode, use_fp16_qk_reductions, use_custom_mask, dtype_q, dtype_kv"),
    ("utils", "is_fa3_prefill_head_dim_supported"): "head_dim_qk, head_dim_vo",
    ("utils", "get_compute_capability"): "device",
    ("utils", "is_sm90a_supported"): "device",
    # flashinfer.mla (the implementation's list; the overloads only narrow it)
    ("mla", "BatchMLAPagedAttentionWrapper.__init__"): (
        "float_workspace_buffer, use_cuda_graph=False, qo_indptr=None, kv_indptr=None, kv_indices=None, "
        "kv_len_arr=None, backend='auto'"),
    ("mla", "BatchMLAPagedAttentionWrapper.plan"): (
        "qo_indptr=None, kv_indptr=None, kv_indices=None, kv_len_arr=None, num_heads=None, head_dim_ckv=None, "
        "head_dim_kpe=None, page_size=None, causal=None, sm_scale=None, q_data_type=None, kv_data_type=None, "
        "use_profiler=False, *, metadata=None, cum_seq_lens_q=None, block_tables=None, seq_lens=None, "
        "max_q_len=None, query_layout=None, kv_cache_layout=None, lse_mode='none', output_dtype=None, "
        "output_scale='none', scale_mode='default', skip_softmax=False, enable_pdl=None, use_sinks=False"),
    ("mla", "BatchMLAPagedAttentionWrapper.run"): (
        "q_nope=None, q_pe=None, ckv_cache=None, kpe_cache=None, out=None, lse=None, return_lse=False, "
        "profiler_buffer=None, kv_len=None, page_table=None, return_lse_base_on_e=False, o_scale=None, *, "
        "query=None, kv_cache=None, ckv_scale=None, ckv_scale_arr=None, kpe_scale=None, sinks=None, "
        "skip_softmax_threshold_scale_factor=None, bmm1_scale=None, bmm2_scale=None"),
    # flashinfer.page
    ("page", "append_paged_mla_kv_cache"): (
        "append_ckv, append_kpe, batch_indices, positions, ckv_cache, kpe_cache, kv_indices, kv_indptr, "
        "kv_last_page_len"),
    ("page", "append_paged_kv_cache"): (
        "append_key, append_value, batch_indices, positions, paged_kv_cache, kv_indices, kv_indptr, "
        "kv_last_page_len, kv_layout='NHD'"),
    ("page", "get_batch_indices_positions"): "append_indptr, seq_lens, nnz, batch_indices=None, positions=None",
    ("page", "get_seq_lens"): "kv_indptr, kv_last_page_len, page_size",
    # flashinfer.rope
    ("rope", "rope_quantize_fp8"): (
        "q_rope, k_rope, q_nope, k_nope, cos_sin_cache, pos_ids, is_neox=True, quantize_dtype=None, "
        "quant_scale_q=1.0, quant_scale_kv=1.0, q_rope_out=None, k_rope_out=None, q_nope_out=None, "
        "k_nope_out=None, enable_pdl=False, backend='cuda'"),
    ("rope", "mla_rope_quantize_fp8"): (
        "q_rope, k_rope, q_nope, k_nope, cos_sin_cache, pos_ids, is_neox=True, quantize_dtype=None, "
        "quant_scale_q=1.0, quant_scale_kv=1.0, q_rope_out=None, k_rope_out=None, q_nope_out=None, "
        "k_nope_out=None, enable_pdl=False"),
    ("rope", "rope_quantize_fp8_append_paged_kv_cache"): (
        "q_rope, k_rope, q_nope, k_nope, v, cos_sin_cache, pos_ids, paged_kv_cache, kv_indices, kv_indptr, "
        "batch_indices, positions, is_neox=True, quantize_dtype=None, quant_scale_q=1.0, quant_scale_kv=1.0, "
        "page_size=16, kv_layout='NHD', q_rope_out=None, q_nope_out=None, enable_pdl=False"),
    ("rope", "apply_rope"): (
        "q, k, indptr, offsets, rotary_dim=None, interleave=False, rope_scale=1, rope_theta=10000.0"),
    ("rope", "apply_rope_inplace"): (
        "q, k, indptr, offsets, rotary_dim=None, interleave=False, rope_scale=1, rope_theta=10000.0"),
    ("rope", "apply_rope_pos_ids"): (
        "q, k, pos_ids, rotary_dim=None, interleave=False, rope_scale=1, rope_theta=10000.0"),
    ("rope", "apply_rope_pos_ids_inplace"): (
        "q, k, pos_ids, rotary_dim=None, interleave=False, rope_scale=1, rope_theta=10000.0"),
    ("rope", "apply_llama31_rope"): (
        "q, k, indptr, offsets, rotary_dim=None, interleave=False, rope_scale=8, rope_theta=500000.0, "
        "low_freq_factor=1, high_freq_factor=4, old_context_len=8192"),
    ("rope", "apply_llama31_rope_inplace"): (
        "q, k, indptr, offsets, rotary_dim=None, interleave=False, rope_scale=8, rope_theta=500000.0, "
        "low_freq_factor=1, high_freq_factor=4, old_context_len=8192"),
    ("rope", "apply_llama31_rope_pos_ids"): (
        "q, k, pos_ids, rotary_dim=None, interleave=False, rope_scale=8, rope_theta=500000.0, "
        "low_freq_factor=1, high_freq_factor=4, old_context_len=8192"),
    ("rope", "apply_llama31_rope_pos_ids_inplace"): (
        "q, k, pos_ids, rotary_dim=None, interleave=False, rope_scale=8, rope_theta=500000.0, "
        "low_freq_factor=1, high_freq_factor=4, old_context_len=8192"),
    ("rope", "apply_rope_with_cos_sin_cache"): "positions, query, key, head_size, cos_sin_cache, is_neox=True",
    ("rope", "apply_rope_with_cos_sin_cache_inplace"): (
        "positions, query, key, head_size, cos_sin_cache, is_neox=True"),
    # flashinfer.quantization
    ("quantization", "packbits"): "x, bitorder='big'",
    ("quantization", "segment_packbits"): "x, indptr, bitorder='big'",
}

# Tessera-only parameters, keyword-only after FlashInfer's.
TESSERA_EXTRAS = {
    "MultiLevelCascadeAttentionWrapper.__init__": ("backend",),
    "PODWithPagedKVCacheWrapper.__init__": ("backend",),
    "MultiLevelCascadeAttentionWrapper.run": ("out", "lse", "return_lse", "k_scale", "v_scale"),
    "append_paged_kv_cache": ("k_scale", "v_scale"),
    "BatchDecodeWithPagedKVCacheWrapper._plan_impl": ("shared_prefix", "on_device", "batch_size"),
    "BatchPrefillWithPagedKVCacheWrapper.plan": ("shared_prefix", "on_device", "batch_size", "max_total_q"),
    "BatchPrefillWithRaggedKVCacheWrapper.plan": ("on_device", "batch_size", "max_total_q", "max_kv_tokens"),
    "MultiLevelCascadeAttentionWrapper.plan": ("on_device", "batch_size", "max_total_q"),
    "PODWithPagedKVCacheWrapper.plan": ("on_device", "batch_size"),
    "merge_state": ("enable_pdl",),
    "merge_state_in_place": ("enable_pdl",),
    "merge_states": ("enable_pdl",),
}

_EMPTY = inspect.Parameter.empty


def _expected(params):
    """The parameters of a function declared with FlashInfer's parameter text."""
    scope = {}
    exec(f"def reference({params}):\n    pass", scope)
    return list(inspect.signature(scope["reference"]).parameters.values())


def _ours(module, qualname):
    obj = importlib.import_module(f"tessera.{module}")
    for part in qualname.split("."):
        obj = getattr(obj, part)
    params = list(inspect.signature(obj).parameters.values())
    return params[1:] if "." in qualname else params  # methods: without self


def _describe(p):
    default = "" if p.default is _EMPTY else f"={p.default!r} ({type(p.default).__name__})"
    return f"{p.kind.name} {p.name}{default}"


def _same_default(a, b):
    return a is b or (type(a) is type(b) and a == b)


@pytest.mark.parametrize("module, qualname", list(FLASHINFER))
def test_signature_matches_flashinfer(module, qualname):
    want = _expected(FLASHINFER[module, qualname])
    got = _ours(module, qualname)
    extras = TESSERA_EXTRAS.get(qualname, ())
    assert [p.name for p in got] == [p.name for p in want] + list(extras), qualname
    for w, g in zip(want, got):
        assert g.kind == w.kind and _same_default(g.default, w.default), \
            f"{qualname}: {_describe(g)}, FlashInfer has {_describe(w)}"
    for g in got[len(want):]:
        assert g.kind == inspect.Parameter.KEYWORD_ONLY and g.default is not _EMPTY, \
            f"{qualname}: Tessera's {g.name} must be keyword-only with a default"


@pytest.mark.parametrize("module, qualname, base", [
    ("decode", "BatchDecodeWithPagedKVCacheWrapper.run_return_lse", "BatchDecodeWithPagedKVCacheWrapper.run"),
    ("prefill", "BatchPrefillWithPagedKVCacheWrapper.run_return_lse", "BatchPrefillWithPagedKVCacheWrapper.run"),
    ("prefill", "BatchPrefillWithRaggedKVCacheWrapper.run_return_lse", "BatchPrefillWithRaggedKVCacheWrapper.run"),
])
def test_run_return_lse_is_run_with_return_lse(module, qualname, base):
    """FlashInfer defines run_return_lse as functools.partialmethod(run, return_lse=True)."""
    scope = {}
    exec(f"def run(self, {FLASHINFER[module, base]}):\n    pass", scope)
    reference = type("Reference", (), {"run": scope["run"]})
    reference.run_return_lse = functools.partialmethod(reference.run, return_lse=True)
    want = list(inspect.signature(reference.run_return_lse).parameters.values())[1:]
    got = _ours(module, qualname)
    assert [(p.name, p.kind, p.default) for p in got] == [(p.name, p.kind, p.default) for p in want]


def test_single_prefill_return_lse_is_a_partial():
    """FlashInfer's single_prefill_with_kv_cache_return_lse is functools.partial(..., return_lse=True): the
    parameters from return_lse on become keyword-only."""
    scope = {}
    exec(f"def reference({FLASHINFER['prefill', 'single_prefill_with_kv_cache']}):\n    pass", scope)
    want = inspect.signature(functools.partial(scope["reference"], return_lse=True)).parameters.values()
    got = inspect.signature(tessera.single_prefill_with_kv_cache_return_lse).parameters.values()
    assert [(p.name, p.kind, p.default) for p in got] == [(p.name, p.kind, p.default) for p in want]


# flashinfer's top-level attention, cascade, page, rope and mask-packing names that Tessera offers.
TOP_LEVEL = ["single_decode_with_kv_cache", "BatchDecodeWithPagedKVCacheWrapper",
             "CUDAGraphBatchDecodeWithPagedKVCacheWrapper", "single_prefill_with_kv_cache",
             "single_prefill_with_kv_cache_return_lse", "BatchPrefillWithPagedKVCacheWrapper",
             "BatchPrefillWithRaggedKVCacheWrapper", "BlockSparseAttentionWrapper", "MultiLevelCascadeAttentionWrapper",
             "BatchDecodeWithSharedPrefixPagedKVCacheWrapper", "BatchPrefillWithSharedPrefixPagedKVCacheWrapper",
             "BatchAttention", "VariableBlockSparseAttentionWrapper", "PODWithPagedKVCacheWrapper",
             "merge_state", "merge_state_in_place", "merge_states", "append_paged_kv_cache",
             "get_batch_indices_positions", "get_seq_lens", "apply_rope", "apply_rope_inplace", "apply_rope_pos_ids",
             "apply_rope_pos_ids_inplace", "apply_llama31_rope", "apply_llama31_rope_inplace",
             "apply_llama31_rope_pos_ids", "apply_llama31_rope_pos_ids_inplace", "apply_rope_with_cos_sin_cache",
             "apply_rope_with_cos_sin_cache_inplace", "packbits", "segment_packbits", "fast_decode_plan"]

# Methods and attributes of FlashInfer's wrappers that Tessera implements.
METHODS = {
    "BatchDecodeWithPagedKVCacheWrapper": ["plan", "begin_forward", "run", "run_return_lse", "forward",
                                           "forward_return_lse", "reset_workspace_buffer", "use_tensor_cores",
                                           "is_cuda_graph_enabled"],
    "CUDAGraphBatchDecodeWithPagedKVCacheWrapper": ["plan", "run", "run_return_lse", "reset_workspace_buffer"],
    "BatchPrefillWithPagedKVCacheWrapper": ["plan", "begin_forward", "run", "run_return_lse", "forward",
                                            "forward_return_lse", "reset_workspace_buffer", "is_cuda_graph_enabled"],
    "BatchPrefillWithRaggedKVCacheWrapper": ["plan", "begin_forward", "run", "run_return_lse", "forward",
                                             "forward_return_lse", "reset_workspace_buffer", "is_cuda_graph_enabled"],
    "BlockSparseAttentionWrapper": ["plan", "begin_forward", "run", "forward", "reset_workspace_buffer"],
    "MultiLevelCascadeAttentionWrapper": ["plan", "begin_forward", "run", "forward", "reset_workspace_buffer",
                                          "is_cuda_graph_enabled"],
    "BatchDecodeWithSharedPrefixPagedKVCacheWrapper": ["begin_forward", "forward", "reset_workspace_buffer"],
    "BatchPrefillWithSharedPrefixPagedKVCacheWrapper": ["begin_forward", "forward", "reset_workspace_buffer"],
    "BatchAttention": ["plan", "run"],
    "PODWithPagedKVCacheWrapper": ["plan", "begin_forward", "run", "reset_workspace_buffer", "is_cuda_graph_enabled"],
    "VariableBlockSparseAttentionWrapper": ["plan", "run", "forward", "reset_workspace_buffer"],
}


# FlashInfer module paths (flashinfer.X.Y) of the names above: the same objects as the top-level ones.
MODULE_PATHS = [("attention", "BatchAttention"), ("pod", "PODWithPagedKVCacheWrapper"),
                ("cascade", "BatchDecodeWithSharedPrefixPagedKVCacheWrapper"),
                ("cascade", "BatchPrefillWithSharedPrefixPagedKVCacheWrapper"),
                ("cascade", "MultiLevelCascadeAttentionWrapper"), ("sparse", "VariableBlockSparseAttentionWrapper"),
                ("sparse", "BlockSparseAttentionWrapper"), ("prefill", "BlockSparseAttentionWrapper"),
                ("decode", "BatchDecodeWithPagedKVCacheWrapper"), ("prefill", "BatchPrefillWithPagedKVCacheWrapper")]


@pytest.mark.parametrize("module, name", MODULE_PATHS)
def test_flashinfer_module_path_resolves(module, name):
    assert getattr(importlib.import_module(f"tessera.{module}"), name) is getattr(tessera, name)


@pytest.mark.parametrize("name", TOP_LEVEL)
def test_flashinfer_name_is_exported(name):
    assert name in tessera.__all__ and hasattr(tessera, name)


@pytest.mark.parametrize("cls, method", [(c, m) for c, ms in METHODS.items() for m in ms])
def test_wrapper_method_exists(cls, method):
    assert hasattr(getattr(tessera, cls), method)
