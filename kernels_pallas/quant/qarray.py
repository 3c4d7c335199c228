"""`QArray`: a quantised array (element codes + scales [+ FP32 global scale]) as a JAX pytree."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import jax


@jax.tree_util.register_dataclass
@dataclass(frozen=True)
class QArray:
    """A block-quantised tensor in the layout of its high-precision source.

    data:   element codes. FP8 formats: uint8 with the source shape. FP4 formats: uint8 with the
            quantised axis halved (two codes per byte, even element in the low nibble).
    scales: per-block scales with the quantised axis divided by the block size (for 128x128
            `fp8_blockwise` tiles, the last two axes divided by 128). E8M0/E4M3 as uint8 bytes,
            `fp8_blockwise` as FP32 decode scales.
    global_scale: FP32 decode scale of the second level (NVFP4: one per tensor, per row for
            `nvfp4_per_token`, or per index of `group_axis`), broadcastable against `scales`;
            None for formats without one.
    """

    data: jax.Array
    scales: jax.Array
    global_scale: Optional[jax.Array]
    fmt: str = field(metadata=dict(static=True))
    axis: int = field(metadata=dict(static=True))          # quantised axis (non-negative)
    shape: tuple = field(metadata=dict(static=True))       # source shape
    tile: tuple = field(default=(1,), metadata=dict(static=True))  # (block,) or (128, 128)
