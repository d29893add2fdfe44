"""Tessera: an attention engine following the FlashInfer paper.

The public functions mirror FlashInfer's Python API names and signatures:

* tessera.merge_state, merge_state_in_place, merge_states,
  merge_states_ragged (flashinfer.cascade): combine partial attention states;
  LSE values are in base 2 throughout. MultiLevelCascadeAttentionWrapper:
  shared prefixes as levels of the paged cache (composable formats).
  BatchDecodeWithSharedPrefixPagedKVCacheWrapper and
  BatchPrefillWithSharedPrefixPagedKVCacheWrapper: a prefix every request
  shares, as contiguous K / V, plus each request's paged suffix; the prefix
  runs as one single prefill over all query rows, merged with the batch
  wrapper's suffix state.
* tessera.single_decode_with_kv_cache, BatchDecodeWithPagedKVCacheWrapper
  and CUDAGraphBatchDecodeWithPagedKVCacheWrapper, fast_decode_plan
  (flashinfer.decode).
* tessera.single_prefill_with_kv_cache, BatchPrefillWithPagedKVCacheWrapper,
  BatchPrefillWithRaggedKVCacheWrapper and BlockSparseAttentionWrapper
  (flashinfer.prefill, flashinfer.sparse).
* tessera.VariableBlockSparseAttentionWrapper (flashinfer.sparse): block
  masks per KV head with variable row / column block sizes, run as one
  batch prefill whose requests are (KV head, block row) pairs over their
  visible keys (ids built on the host at plan()).
* tessera.BatchAttention (flashinfer.attention): a batch mixing prefill and
  decode requests (any query length each) in one persistent launch of the
  paged prefill kernel, on a workspace the wrapper owns; returns (out, lse),
  lse in base 2.
* tessera.PODWithPagedKVCacheWrapper (flashinfer.pod): one prefill request
  (contiguous K / V) and a planned decode batch per run(), as two launches
  (batch decode, then single prefill) where FlashInfer fuses them.
* tessera.append_paged_kv_cache, get_batch_indices_positions, get_seq_lens
  (flashinfer.page).
* tessera.packbits, segment_packbits (flashinfer.quantization): pack custom
  attention masks (bitorder="little" is the order the kernels read).
* tessera.apply_rope, apply_rope_pos_ids, apply_llama31_rope,
  apply_llama31_rope_pos_ids, apply_rope_with_cos_sin_cache and their
  _inplace forms (flashinfer.rope): linear, Llama 3.1 or cached angles.
* tessera.utils and tessera.jit: FlashInfer's capability queries, enums and
  JIT warm-up names (JitSpec, build_jit_specs, gen_*_module), so warm-up
  code written for FlashInfer runs unchanged.
* tessera.AttentionWrapper with tessera.AttentionSpec / VariantSpec /
  TaskInfo: any attention variant as CUDA code with extra parameters (the
  paper's Listing 1); tessera.variants holds the built-in variants.

Arguments: every FlashInfer parameter of these functions is accepted, in
FlashInfer's order and with its defaults. A parameter whose feature Tessera
does not implement yet runs at its default and raises
tessera.NotSupportedError (a NotImplementedError and a ValueError, its
message starting with the argument's name and saying "not supported yet")
for any other value; it is never ignored. Tessera's own options come after
FlashInfer's, keyword-only. Workspaces may have any dtype (they are used as
bytes); index arrays may be int32 or int64.

Inputs are torch tensors (CPU or CUDA) or numpy arrays; results come back in
the same framework, on the same device. torch is optional: with numpy alone
everything runs on the CPU. tessera.gpu_available() says whether a CUDA
device can be used, no_gpu_reason() why not.
"""

from ._errors import NotSupportedError
from ._native import _C
from .attention import BatchAttention
from .cascade import (BatchDecodeWithSharedPrefixPagedKVCacheWrapper, BatchPrefillWithSharedPrefixPagedKVCacheWrapper,
                      MultiLevelCascadeAttentionWrapper, merge_state, merge_state_in_place, merge_states,
                      merge_states_ragged)
from .decode import (BatchDecodeWithPagedKVCacheWrapper, CUDAGraphBatchDecodeWithPagedKVCacheWrapper, fast_decode_plan,
                     single_decode_with_kv_cache)
from .jit import cache_dir, compile_builtin
from .mla import BatchMLAPagedAttentionWrapper, append_paged_mla_kv_cache
from .page import append_paged_kv_cache, get_batch_indices_positions, get_seq_lens
from .pod import PODWithPagedKVCacheWrapper
from .prefill import (
    BatchPrefillWithPagedKVCacheWrapper,
    BatchPrefillWithRaggedKVCacheWrapper,
    BlockSparseAttentionWrapper,
    single_prefill_with_kv_cache,
    single_prefill_with_kv_cache_return_lse,
)
from .quantization import packbits, segment_packbits
from .sparse import VariableBlockSparseAttentionWrapper
from . import fp4_quantization, jit, utils, variants  # noqa: F401 (submodules FlashInfer callers reach as attributes)
from .rope import (apply_llama31_rope, apply_llama31_rope_inplace, apply_llama31_rope_pos_ids,
                   apply_llama31_rope_pos_ids_inplace, apply_rope, apply_rope_inplace, apply_rope_pos_ids,
                   apply_rope_pos_ids_inplace, apply_rope_with_cos_sin_cache, apply_rope_with_cos_sin_cache_inplace)
from .variants import AttentionSpec, AttentionWrapper, TaskInfo, VariantSpec

__version__ = "0.1.0"


def gpu_available():
    """True when a usable CUDA device (and driver) is present."""
    return _C.gpu_available()


def no_gpu_reason():
    """Why no GPU can be used ('' when one can)."""
    return _C.no_gpu_reason()


__all__ = [
    "merge_state",
    "merge_state_in_place",
    "merge_states",
    "merge_states_ragged",
    "MultiLevelCascadeAttentionWrapper",
    "BatchDecodeWithSharedPrefixPagedKVCacheWrapper",
    "BatchPrefillWithSharedPrefixPagedKVCacheWrapper",
    "BatchAttention",
    "PODWithPagedKVCacheWrapper",
    "single_decode_with_kv_cache",
    "BatchDecodeWithPagedKVCacheWrapper",
    "CUDAGraphBatchDecodeWithPagedKVCacheWrapper",
    "fast_decode_plan",
    "single_prefill_with_kv_cache",
    "single_prefill_with_kv_cache_return_lse",
    "BatchPrefillWithPagedKVCacheWrapper",
    "BatchPrefillWithRaggedKVCacheWrapper",
    "BlockSparseAttentionWrapper",
    "VariableBlockSparseAttentionWrapper",
    "append_paged_kv_cache",
    "append_paged_mla_kv_cache",
    "BatchMLAPagedAttentionWrapper",
    "get_batch_indices_positions",
    "get_seq_lens",
    "packbits",
    "segment_packbits",
    "apply_rope",
    "apply_rope_inplace",
    "apply_rope_pos_ids",
    "apply_rope_pos_ids_inplace",
    "apply_llama31_rope",
    "apply_llama31_rope_inplace",
    "apply_llama31_rope_pos_ids",
    "apply_llama31_rope_pos_ids_inplace",
    "apply_rope_with_cos_sin_cache",
    "apply_rope_with_cos_sin_cache_inplace",
    "AttentionSpec",
    "AttentionWrapper",
    "TaskInfo",
    "VariantSpec",
    "variants",
    "NotSupportedError",
    "gpu_available",
    "no_gpu_reason",
    "compile_builtin",
    "cache_dir",
    "__version__",
]
