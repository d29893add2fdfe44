"""The exception for FlashInfer arguments whose feature Tessera does not implement yet (see _compat.py)."""


class NotSupportedError(NotImplementedError, ValueError):
    """An argument asks for a FlashInfer feature that Tessera does not implement yet.

    The message starts with the argument's name and says "not supported yet".
    A NotImplementedError (FlashInfer's exception for a missing backend
    feature) and a ValueError (Tessera's for such options before), so either
    except clause catches it.
    """


def describe(value):
    """A short text for a value in a message (tensors by shape, not by content)."""
    if not isinstance(value, type) and hasattr(value, "shape") and hasattr(value, "dtype"):
        return f"a {type(value).__name__} of shape {tuple(value.shape)}"
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def not_supported(name, value, why):
    """The NotSupportedError for argument `name` given `value`; `why` says what the value would need."""
    return NotSupportedError(f"{name}={describe(value)}: not supported yet ({why})")
