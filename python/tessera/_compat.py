"""FlashInfer argument compatibility shared by the public functions and wrappers.

Every function and wrapper method that FlashInfer 0.7.2 offers and Tessera
implements takes FlashInfer's parameters: the same names, order, defaults
and keyword-only markers, so a serving engine switches by changing its
import. Tessera-only options exist only as keyword-only parameters after
FlashInfer's, and none of them is needed.

Arguments whose feature Tessera does not have yet
-------------------------------------------------
Such arguments (attention sinks, FP8 scale tensors, fixed KV split sizes,
several queries per decode request, multi-item scoring, a right window
bound, cuDNN / TensorRT-LLM backend switches, ...) are accepted
in the signature. Their default means "off" and runs; any other value raises
``NotSupportedError`` before any work is done, with a message that starts
with the argument's name and says "not supported yet". It is never ignored
and never turned into an approximation. ``NotSupportedError`` derives from
``NotImplementedError`` (what FlashInfer raises when a backend lacks a
feature) and from ``ValueError`` (what Tessera raised for such options
before), so either ``except`` clause catches it.

Metadata that FlashInfer lets some backends take in two forms (seq_lens next
to the page table, seq_lens_q next to qo_indptr, v_indptr / o_indptr next to
kv_indptr / qo_indptr, a dense block_tables next to indptr / indices) is
accepted when it says the same as the form Tessera reads; values that differ
need the feature and raise NotSupportedError.

Bad values of supported features stay ValueError (a value) or TypeError (a
type, dtype or device), naming the argument.
"""

import functools
import inspect
import numbers
import warnings

import numpy as np

from . import _tensors as T
from . import _wrapper_util as W
from ._errors import not_supported


def refuse_given(why, **arguments):
    """NotSupportedError for the first argument that is not None (None means the feature is off)."""
    for name, value in arguments.items():
        if value is not None:
            raise not_supported(name, value, why)


def refuse_true(name, value, why):
    """NotSupportedError when a flag whose default is None / False is set."""
    if value is not None and value is not False:
        if not isinstance(value, (bool, np.bool_)):
            raise TypeError(f"{name}: expected a bool or None, got {type(value).__name__}")
        if value:
            raise not_supported(name, value, why)


def int_arg(value, name, allow_none=False):
    """An int argument (bools are not ints here); TypeError naming it otherwise."""
    if value is None and allow_none:
        return None
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name}: expected an int{' or None' if allow_none else ''}, got {type(value).__name__}")
    return int(value)


def fixed_split_size_arg(fixed_split_size):
    """FlashInfer's fixed_split_size in pages: None (or -1, what FlashInfer turns None into) is the planner's own
    split, returned as 0; else the positive page count."""
    value = int_arg(fixed_split_size, "fixed_split_size", allow_none=True)
    if value is None or value == -1:
        return 0
    if value < 1:
        raise ValueError(f"fixed_split_size: expected None, -1 or a page count >= 1, got {value}")
    return value


def multi_item_scoring(prefix_len_ptr, token_pos_in_items_ptr, token_pos_in_items_len, max_item_len_ptr):
    """FlashInfer's multi-item scoring mask (its four plan() arguments): only 'off' is supported."""
    refuse_given("multi-item scoring masks are not implemented", prefix_len_ptr=prefix_len_ptr,
                 token_pos_in_items_ptr=token_pos_in_items_ptr, max_item_len_ptr=max_item_len_ptr)
    if int_arg(token_pos_in_items_len, "token_pos_in_items_len") != 0:
        raise not_supported("token_pos_in_items_len", token_pos_in_items_len,
                            "multi-item scoring masks are not implemented")


def same_lengths(value, expected, name, derived_from):
    """Checks that a per-request length tensor (any int dtype and device) equals the lengths Tessera derives
    from `derived_from`; lengths that differ would need the feature the argument stands for."""
    got = W.host_ints(value.reshape(-1) if hasattr(value, "reshape") else value, name)
    expected = np.asarray(expected)
    if got.size != expected.size:
        raise ValueError(f"{name}: expected {expected.size} entries (batch size), got {got.size}")
    if not np.array_equal(got, expected):
        i = int(np.argmax(got != expected))
        raise not_supported(name, value, f"request {i} has length {int(got[i])} where {derived_from} gives "
                            f"{int(expected[i])}; lengths other than those are not supported")


def same_page_table(block_tables, indptr, indices, name="block_tables"):
    """Checks a dense page table given beside the CSR one (FlashInfer's block_tables, [batch, width], which its
    cuDNN and TensorRT-LLM backends read): row b must start with indices[indptr[b]:indptr[b + 1]]. Both are read
    on the host (a CUDA tensor is copied, as FlashInfer's plan() copies its seq_lens)."""
    if block_tables is None:
        return
    table = W.int_table(block_tables, name)
    pages = np.diff(np.asarray(indptr, np.int64))
    if pages.size and int(pages.min()) < 0:
        return  # plan() names the decreasing indptr
    if table.ndim != 2 or table.shape[0] != pages.size:
        raise ValueError(f"{name}: expected shape [{pages.size}, max pages] (a row per request), got "
                         f"{tuple(table.shape)}")
    if pages.size and int(pages.max()) > table.shape[1]:
        b = int(np.argmax(pages))
        raise ValueError(f"{name}: {table.shape[1]} columns, but request {b} has {int(pages[b])} pages")
    count = int(pages.sum())
    ids = indices.tensor[:count] if isinstance(indices, W.DeviceIds) else indices
    ids = W.host_ints(ids[:count], "indices")
    if ids.size < count:
        return  # plan() names the short indices
    rows, cols = W.csr_cells(indptr)
    differ = table[rows, cols] != ids
    if differ.any():
        b = int(rows[np.argmax(differ)])
        raise not_supported(name, block_tables, f"request {b}'s row differs from its pages in the indices; Tessera "
                            "reads indptr / indices, and a second, different page table is not supported")


def same_indptr(value, expected, name, like):
    """Checks that an optional indptr (FlashInfer's v_indptr / o_indptr) equals `like`'s."""
    if value is None:
        return
    got = W.host_ints(value, name)
    if not np.array_equal(got, expected):
        raise not_supported(name, value, f"an indptr different from {like} is not supported")


def max_length(value, lengths, name, what):
    """A caller's upper bound on per-request lengths (a cuDNN sizing hint): None, or an int >= the longest."""
    value = int_arg(value, name, allow_none=True)
    longest = int(np.max(lengths)) if np.size(lengths) else 0
    if value is not None and value < longest:
        raise ValueError(f"{name}: expected at least the longest {what} ({longest}), got {value}")


def uniform_q_len_arg(uniform_q_len):
    """FlashInfer's uniform_q_len: a scheduling hint for CUDA-graph plans that never changes a result (FlashInfer
    drops it when it does not describe the batch); Tessera's planner sizes tiles from the actual lengths."""
    int_arg(uniform_q_len, "uniform_q_len", allow_none=True)


def check_int_workspace(int_workspace_buffer, name):
    """reset_workspace_buffer()'s int workspace: a tensor (a list of them for a cascade). Tessera keeps its whole
    schedule in float_workspace_buffer, so the buffer is accepted and not written."""
    items = int_workspace_buffer if isinstance(int_workspace_buffer, (list, tuple)) else [int_workspace_buffer]
    for i, x in enumerate(items):
        label = f"{name}[{i}]" if isinstance(int_workspace_buffer, (list, tuple)) else name
        T.framework(x, label)
        W.check_aligned(x, label)



LSE_BASES = ("log2", "ln")
LSE_LAYOUTS = ("NH", "HN")
_LN2 = 0.6931471805599453


def lse_options(lse_base, lse_layout):
    """run()'s lse_base / lse_layout: base 2 or natural; only the kernels' [rows, heads] layout so far."""
    if lse_base not in LSE_BASES:
        raise ValueError(f"lse_base: expected one of {LSE_BASES}, got {lse_base!r}")
    if lse_layout not in LSE_LAYOUTS:
        raise ValueError(f"lse_layout: expected one of {LSE_LAYOUTS}, got {lse_layout!r}")
    if lse_layout != "NH":
        raise not_supported("lse_layout", lse_layout, "the kernels write the LSE as [rows, heads]; the transposed "
                            "[heads, rows] layout is not implemented")


def finish_lse(lse, lse_base):
    """Rescales the base-2 LSE the kernels write (in place) to the natural log when lse_base is 'ln'."""
    if lse is not None and lse_base == "ln":
        if T.is_torch(lse):
            lse.mul_(_LN2)
        else:
            lse *= _LN2
    return lse


def merge_legacy_positional(api, values, names, kwargs):
    """FlashInfer's deprecated calling convention: plan() options after page_size given by position, in the
    order `names`. Returns the keyword arguments, warning as FlashInfer does."""
    if len(values) > len(names):
        raise TypeError(f"{api}() takes at most {len(names)} optional positional arguments after page_size, got "
                        f"{len(values)}")
    merged = dict(kwargs)
    for name, value in zip(names, values):
        if name in merged:
            raise TypeError(f"{api}() got multiple values for argument {name!r}")
        merged[name] = value
    warnings.warn(f"passing {api}() options after page_size by position is deprecated (as in FlashInfer); pass "
                  "them by keyword", DeprecationWarning, stacklevel=3)
    return merged


# ----------------------------------------------------------------------- forward() shims
def recorded_plan(impl):
    """Wraps a plan() so that it remembers its arguments after it succeeds: FlashInfer's deprecated forward()
    takes plan options again, and Tessera specialises the kernel at plan(), so forward() re-plans when they
    differ (see replan). The signature seen by inspect is impl's."""

    @functools.wraps(impl)
    def plan(self, *args, **kwargs):
        self._plan_call = None
        impl(self, *args, **kwargs)
        self._plan_call = (args, kwargs)
        _record_plan_options(self, impl, args, kwargs)

    return plan


# The plan() options FlashInfer's wrappers keep as attributes after plan(), which engines read back
# (vLLM checks _window_left, _logits_soft_cap and _sm_scale against its layer's; _causal for prefill).
_PLAN_ATTRIBUTES = ("causal", "pos_encoding_mode", "window_left", "logits_soft_cap", "sm_scale", "rope_scale",
                    "rope_theta", "use_fp16_qk_reduction")


@functools.lru_cache(maxsize=None)
def _plan_parameters(impl, hidden):
    """impl's positional parameter names after self, and the defaults of impl's parameters and then of
    hidden's (decode: the options are _plan_impl's keywords): built once per plan function, since
    inspect.signature costs tens of microseconds and plan() runs every step."""
    params = list(inspect.signature(impl).parameters.values())[1:]
    positional = tuple(p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD))
    defaults = {p.name: p.default for p in params if p.default is not inspect.Parameter.empty}
    if hidden is not None:
        for name, p in inspect.signature(hidden).parameters.items():
            if p.default is not inspect.Parameter.empty:
                defaults.setdefault(name, p.default)
    return positional, defaults


def _record_plan_options(wrapper, impl, args, kwargs):
    """Sets wrapper._<option> for FlashInfer's recorded plan options, as FlashInfer's plan() leaves them
    (logits_soft_cap None becomes 0.0; sm_scale stays None when not given). Called after impl accepted
    args and kwargs, so they bind."""
    positional, defaults = _plan_parameters(impl, getattr(type(wrapper), "_plan_impl", None))
    values = dict(defaults)
    values.update(zip(positional, args))
    values.update(kwargs)
    for name in _PLAN_ATTRIBUTES:
        if name in values:
            value = values[name]
            setattr(wrapper, "_" + name, 0.0 if name == "logits_soft_cap" and value is None else value)


def replan(wrapper, plan_fn, options):
    """What FlashInfer's forward() does to the last plan: its options replace the planned ones, for this call
    and the ones after. When an option differs from the last plan()'s, plan_fn runs again with the same index
    arrays and the new options; otherwise nothing happens."""
    call = getattr(wrapper, "_plan_call", None)
    if call is None:
        raise ValueError("forward: expected plan() to be called first")
    args, kwargs = call
    bound = inspect.signature(plan_fn).bind(wrapper, *args, **kwargs)
    bound.apply_defaults()
    arguments = dict(bound.arguments)
    del arguments["self"]
    if all(_same(arguments[name], value) for name, value in options.items()):
        return
    arguments.update(options)
    plan_fn(wrapper, **arguments)


def _same(a, b):
    return a is b or (type(a) is type(b) and not hasattr(a, "shape") and a == b)
