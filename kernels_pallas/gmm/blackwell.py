"""Blackwell (sm_100) block-scaled MMA: the scale layout the tensor cores read and a CPU emulation
of `tcgen05.mma ... block_scale` semantics, both checked against the plain reference.

What is here (runs and is tested on CPU):
* `swizzle_scales` / `unswizzle_scales`: the cuBLAS/TE "128x4" scale-factor layout (torchao
  `to_blocked`): scales (R, C) padded to multiples of (128, 4), cut into 128x4 tiles stored
  row-block-major, each tile 512 contiguous bytes in which row r, column c sits at
  `(r % 32) * 16 + (r // 32) * 4 + c`.
* `swizzled_offset`: that address computed directly from (row, scale column) — what a kernel's
  scale load (or the TMEM copy) addresses; tested against the array permutation.
* `block_scaled_mma_emulated`: D = sum_k (A_k * sa) (B_k * sb) reading the scales *from the swizzled
  buffer* through `swizzled_offset`, for the three PTX kinds: 'mxf8f6f4' (FP8 + E8M0 per 32),
  'mxf4' (E2M1 + E8M0 per 32), 'mxf4nvf4' (E2M1 + E4M3 per 16; NVFP4's FP32 global scales are the
  epilogue alpha). Accumulation is FP32 in an unspecified order (compare with a tolerance).

What is NOT here: the `plgpu.tcgen05_mma(..., a_scale=, b_scale=)` kernel itself. It cannot be
compiled, lowered or interpreted without an sm_100 GPU and a CUDA jaxlib (this machine has
neither; the Mosaic GPU interpreter has no tcgen05/TMEM support), so writing it would be untested
code; `require_sm100()` is the capability check such a kernel must sit behind.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from kernels_pallas import bits


def require_sm100() -> None:
    """Raise unless running on a Blackwell (compute capability 10.x) GPU."""
    dev = jax.devices()[0]
    cc = getattr(dev, "compute_capability", None)
    if dev.platform != "gpu" or cc is None or not str(cc).startswith("10"):
        raise NotImplementedError(f"block-scaled tcgen05 MMA needs an sm_100 GPU; this device is "
                                  f"{dev.device_kind} ({dev.platform}, cc={cc})")


def _pad_to(x, rows, cols):
    return jnp.pad(x, ((0, rows - x.shape[0]), (0, cols - x.shape[1])))


def swizzle_scales(s: jax.Array) -> jax.Array:
    """(R, C) scale bytes -> flat (ceil(R/128) * ceil(C/4) * 512,) in the tensor-core layout."""
    r, c = s.shape
    nr, nc = -(-r // 128), -(-c // 4)
    p = _pad_to(s, nr * 128, nc * 4)
    blocks = p.reshape(nr, 128, nc, 4).transpose(0, 2, 1, 3)          # (nr, nc, 128, 4)
    tiles = blocks.reshape(nr * nc, 4, 32, 4).transpose(0, 2, 1, 3)    # row r = 32*i + j -> [j, i]
    return tiles.reshape(-1)


def unswizzle_scales(flat: jax.Array, r: int, c: int) -> jax.Array:
    nr, nc = -(-r // 128), -(-c // 4)
    tiles = flat.reshape(nr * nc, 32, 4, 4).transpose(0, 2, 1, 3)     # (tile, i, j, col)
    blocks = tiles.reshape(nr, nc, 128, 4).transpose(0, 2, 1, 3)
    return blocks.reshape(nr * 128, nc * 4)[:r, :c]


def swizzled_offset(row: jax.Array, col: jax.Array, n_cols: int) -> jax.Array:
    """Byte offset of scale (row, col) in the swizzled buffer of a matrix with `n_cols` scale columns."""
    nc = -(-n_cols // 4)
    tile = (row // 128) * nc + col // 4
    rr = row % 128
    return tile * 512 + (rr % 32) * 16 + (rr // 32) * 4 + col % 4


def _read_scales(flat, rows, k_blocks):
    r = jnp.arange(rows)[:, None]
    c = jnp.arange(k_blocks)[None, :]
    return flat[swizzled_offset(r, c, k_blocks)]                         # (rows, k_blocks)


KINDS = {"mxf8f6f4": (32, "e8m0"), "mxf4": (32, "e8m0"), "mxf4nvf4": (16, "e4m3")}


def block_scaled_mma_emulated(a_vals: jax.Array, a_scales_swz: jax.Array, b_vals: jax.Array,
                              b_scales_swz: jax.Array, kind: str, alpha: jax.Array | float = 1.0):
    """D (M, N) f32 = alpha * sum_k A[m,k] sa[m, k/bs] B[n,k] sb[n, k/bs].

    a_vals (M, K), b_vals (N, K): element values (FP8 or E2M1 codes already decoded to f32; both
    operands K-major as the tensor core reads them). *_scales_swz: swizzled scale bytes.
    """
    bs, enc = KINDS[kind]
    m, k = a_vals.shape
    n = b_vals.shape[0]
    kb = k // bs

    def dec(flat, rows):
        s = _read_scales(flat, rows, kb)
        if enc == "e8m0":
            return bits.pow2_from_e8m0(s)
        return jax.lax.bitcast_convert_type(s, jnp.float8_e4m3fn).astype(jnp.float32)

    sa = jnp.repeat(dec(a_scales_swz, m), bs, axis=1)
    sb = jnp.repeat(dec(b_scales_swz, n), bs, axis=1)
    d = jax.lax.dot_general(a_vals * sa, b_vals * sb, (((1,), (1,)), ((), ())),
                            precision=jax.lax.Precision.HIGHEST, preferred_element_type=jnp.float32)
    return d * alpha
