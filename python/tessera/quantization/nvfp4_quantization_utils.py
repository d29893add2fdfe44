"""FlashInfer's NVFP4 recipe types (flashinfer.quantization.nvfp4_quantization_utils).

Tessera has no FP4 KV cache or FP4 kernels. These plain definitions exist so
that code importing them loads; every FP4 operation (tessera.fp4_quantization)
raises tessera.NotSupportedError.
"""

from dataclasses import dataclass
from enum import IntEnum

FLOAT8_E4M3_MAX = 448.0


class NVFP44Over6ErrMode(IntEnum):
    """Error metric choosing between the amax/6 and amax/4 block scales."""

    MAE = 0
    MSE = 1


@dataclass(frozen=True)
class NVFP44Over6Config:
    """The NVFP4 "4over6" recipe: the E4M3 block-scale bound (256 or 448) and the error metric."""

    e4m3_max: int = 448
    err_mode: NVFP44Over6ErrMode = NVFP44Over6ErrMode.MAE
    err_use_fast_math: bool = False

    def __post_init__(self):
        if self.e4m3_max not in (256, 448):
            raise ValueError(f"e4m3_max: expected 256 or 448, got {self.e4m3_max!r}")
        mode = self.err_mode
        try:
            mode = NVFP44Over6ErrMode[mode.upper()] if isinstance(mode, str) else NVFP44Over6ErrMode(mode)
        except (KeyError, ValueError):
            raise ValueError(f"err_mode: expected 'MAE' or 'MSE', got {self.err_mode!r}") from None
        object.__setattr__(self, "err_mode", mode)


def nvfp4_e4m3_max(nvfp4_4over6_config=None):
    """The E4M3 block-scale bound of a recipe (448 for standard NVFP4)."""
    return FLOAT8_E4M3_MAX if nvfp4_4over6_config is None else float(nvfp4_4over6_config.e4m3_max)
