"""FlashInfer's FP4 conversion names (flashinfer.fp4_quantization).

Tessera has no FP4 support: each function raises tessera.NotSupportedError.
They exist so that code importing them loads and fails only where it uses FP4.
"""

from ._errors import not_supported


def e2m1_and_ufp8sf_scale_to_float(e2m1_tensor, ufp8_scale_tensor, global_scale_tensor=None, sf_vec_size=16,
                                   ufp8_type=1, is_sf_swizzled_layout=True, is_sf_8x4_layout=False):
    raise not_supported("e2m1_tensor", e2m1_tensor, "FP4 (E2M1) tensors")
