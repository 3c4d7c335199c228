"""Element and scale formats of the block-scaled low-precision recipes (one table, used everywhere).

Numbers follow the OCP Microscaling (MX) v1.0 spec and NVIDIA's NVFP4 format: element max, the exponent of the max
(`emax_elem`) and the 23-bit FP32 mantissa field of the max (`mant_thresh`, used by the
division-free RCEIL rule), the block size along the contraction axis and the scale encoding.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import jax.numpy as jnp


@dataclass(frozen=True)
class ElemFormat:
    name: str
    dtype: object          # jnp dtype of the element (for casts)
    max: float             # largest finite magnitude
    emax: int              # unbiased exponent of `max`
    mant_thresh: int       # FP32 mantissa field of `max` (RCEIL rule threshold)
    bits: int              # storage bits per element (4 -> packed two per byte)


E4M3 = ElemFormat("e4m3", jnp.float8_e4m3fn, 448.0, 8, 0x600000, 8)
E5M2 = ElemFormat("e5m2", jnp.float8_e5m2, 57344.0, 15, 0x600000, 8)
E2M1 = ElemFormat("e2m1", jnp.float4_e2m1fn, 6.0, 2, 0x400000, 4)


@dataclass(frozen=True)
class QuantFormat:
    """A quantisation recipe: element format, block size and scale encoding."""

    name: str
    elem: ElemFormat
    block: int                      # elements per scale along the quantised axis
    scale: str                      # 'e8m0' | 'e4m3' | 'f32'
    global_scale: Optional[str]     # None | 'tensor' | 'row' (FP32 second-level scale)


FORMATS: dict[str, QuantFormat] = {
    "mxfp8_e4m3": QuantFormat("mxfp8_e4m3", E4M3, 32, "e8m0", None),
    "mxfp8_e5m2": QuantFormat("mxfp8_e5m2", E5M2, 32, "e8m0", None),
    "mxfp4": QuantFormat("mxfp4", E2M1, 32, "e8m0", None),
    "nvfp4": QuantFormat("nvfp4", E2M1, 16, "e4m3", "tensor"),
    "nvfp4_per_token": QuantFormat("nvfp4_per_token", E2M1, 16, "e4m3", "row"),
    "fp8_blockwise": QuantFormat("fp8_blockwise", E4M3, 128, "f32", None),
}


def get_format(fmt: str) -> QuantFormat:
    if fmt not in FORMATS:
        raise ValueError(f"unknown quantisation format {fmt!r}; expected one of {sorted(FORMATS)}")
    return FORMATS[fmt]
