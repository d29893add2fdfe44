"""FlashInfer's JIT build interface (flashinfer.jit.core): JitSpec, build_jit_specs and
MissingJITCacheError, for warm-up code written against FlashInfer."""


class MissingJITCacheError(RuntimeError):
    """FlashInfer's error for a kernel missing from an ahead-of-time cache. Tessera compiles any
    missing kernel at first use instead, so it never raises this; the name exists for callers
    that catch it."""


class JitSpec:
    """A FlashInfer-style request to build one kernel module ahead of time, as made by the
    gen_*_module functions (tessera.decode.gen_batch_decode_module, ...). Tessera specializes
    kernels at their first call and ships the built-in ones prebuilt, so a JitSpec only records
    what was asked for; build_jit_specs accepts a list of them."""

    def __init__(self, name, kind, args):
        self.name = name
        self.kind = kind
        self.args = tuple(args)

    def build_and_load(self):
        """Nothing to build ahead of time: the kernel loads (or compiles) at its first call."""
        return None

    def __repr__(self):
        return f"JitSpec({self.name!r})"

    def __eq__(self, other):
        return isinstance(other, JitSpec) and (self.kind, self.args) == (other.kind, other.args)

    def __hash__(self):
        return hash((self.kind, self.args))


def _spec_token(value):
    name = getattr(value, "name", None)  # enums
    if name is None and hasattr(value, "is_floating_point"):  # torch dtypes
        name = str(value).replace("torch.", "")
    return str(value if name is None else name)


def module_spec(kind, *args):
    """The JitSpec a FlashInfer gen_*_module call stands for (kind: its name without gen_/_module)."""
    return JitSpec("_".join([kind] + [_spec_token(a) for a in args]), kind, [_spec_token(a) for a in args])


def build_jit_specs(specs, verbose=False, skip_prebuilt=True):
    """FlashInfer's ahead-of-time build of a list of JitSpecs. Tessera's kernels need no build step
    before their first call (built-ins ship prebuilt; others compile once and stay in the disk
    cache), so this checks the list and returns. compile_builtin() fills the cache ahead of time."""
    del verbose, skip_prebuilt
    specs = list(specs)
    for i, spec in enumerate(specs):
        if not isinstance(spec, JitSpec):
            raise TypeError(f"specs[{i}]: expected a JitSpec, got {type(spec).__name__}")
    return None

