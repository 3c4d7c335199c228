"""Plain-jnp reference quantisers: the oracle every kernel is checked against, bit for bit.

Formats (kernels.md section 1; `kernels_pallas/formats.py`):

* MX (`mxfp8_e4m3`, `mxfp8_e5m2`, `mxfp4`): 32-element blocks along `axis`, E8M0 scale byte by
  the RCEIL integer rule (FLOOR optional), elements RNE(clamp(x * 2^(127-s), -max, max)).
* `nvfp4` / `nvfp4_per_token`: Transformer Engine's reference formula
  (`quantization_ref_nvfp4.py`, 1x16 tiles, no RHT, no 4over6) with the FP32 global scale taken per
  tensor, per index of `group_axis` (per expert) or per row (`nvfp4_per_token`: each row quantised as
  if it were a tensor, so a token's bits never depend on the other tokens in the batch).
* `fp8_blockwise`: DeepSeek-V3/DeepGEMM, E4M3 with FP32 scales amax/448 (amax clamped >= 1e-4)
  on 1x128 tiles (activations) or 128x128 tiles (weights).

Pinned edge cases (identical in the kernels): an all-zero block gets scale byte 0 (FP32 scale
1e-4/448 for fp8_blockwise) and +0 elements; a block containing NaN or Inf gets scale byte 0xFF
(FP32 NaN for fp8_blockwise) and zero element codes; elements are clamped before the cast and
rounded to nearest even; a negative value rounding to zero keeps its sign (-0).

Every division is `bits.divide(..., div)`: exact (`div_rn`) by default, `div='approx'` for the
ablation. Sites: NVFP4 global encode 2688/amax, global decode 1/S_enc, block encode
1/(sdec*S_dec); fp8_blockwise 448/amax and amax/448. MX needs no division at all.
"""
from __future__ import annotations

from typing import Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from kernels_pallas import bits
from kernels_pallas.formats import E2M1, E4M3, ElemFormat, get_format
from kernels_pallas.quant.qarray import QArray

INV6 = float(np.float32(1.0) / np.float32(6.0))  # fl32(1/6), as TE's torch.reciprocal(6.0)
FP8_BLOCKWISE_MIN_AMAX = 1e-4


# ------------------------------------------------------------------ element casts
def _fp8_codes(y: jax.Array, elem: ElemFormat) -> jax.Array:
    """RNE cast of clamped f32 to FP8 codes (uint8)."""
    y = jnp.clip(y, -elem.max, elem.max)
    return jax.lax.bitcast_convert_type(y.astype(elem.dtype), jnp.uint8)


def _fp4_codes(y: jax.Array) -> jax.Array:
    """RNE cast of clamped f32 to E2M1 codes (uint8 0..15) via the dtype cast (ml_dtypes/XLA)."""
    y = jnp.clip(y, -6.0, 6.0)
    return jax.lax.bitcast_convert_type(y.astype(jnp.float4_e2m1fn), jnp.uint4).astype(jnp.uint8)


def elem_codes(y: jax.Array, elem: ElemFormat) -> jax.Array:
    return _fp4_codes(y) if elem.bits == 4 else _fp8_codes(y, elem)


def elem_values(codes: jax.Array, elem: ElemFormat) -> jax.Array:
    """f32 values of element codes."""
    if elem.bits == 4:
        return bits.e2m1_decode(codes)
    return jax.lax.bitcast_convert_type(codes, elem.dtype).astype(jnp.float32)


def to_blocks(x: jax.Array, block: int) -> jax.Array:
    """(..., K) -> (..., K/block, block); K must be a multiple of block."""
    k = x.shape[-1]
    if k % block:
        raise ValueError(f"quantised axis has size {k}, not a multiple of the block size {block}; "
                         "pad it (MoE token groups are padded to a multiple of the block)")
    return x.reshape(*x.shape[:-1], k // block, block)


# ------------------------------------------------------------------ MX
def mx_quantize_last(x: jax.Array, elem: ElemFormat, scale_mode: str = "rceil"):
    """MX quantisation along the last axis. Returns (codes (..., K) uint8 unpacked, scales uint8)."""
    xb = to_blocks(x.astype(jnp.float32), 32)                      # (..., nb, 32)
    amax = jnp.max(jnp.abs(xb), axis=-1)                          # (..., nb), NaN-propagating
    if scale_mode == "rceil":
        s = bits.e8m0_rceil(amax, elem.emax, elem.mant_thresh)
    elif scale_mode == "floor":
        s = bits.e8m0_floor(amax, elem.emax)
    else:
        raise ValueError(f"scale_mode must be 'rceil' or 'floor', got {scale_mode!r}")
    y = xb * bits.recip_pow2_from_e8m0(s)[..., None]
    codes = elem_codes(y, elem)
    dead = (amax == 0) | (s == bits.NAN_BYTE)
    codes = jnp.where(dead[..., None], jnp.uint8(0), codes)
    return codes.reshape(x.shape), s


def mx_dequantize_last(codes: jax.Array, s: jax.Array, elem: ElemFormat) -> jax.Array:
    vals = to_blocks(elem_values(codes, elem), 32)
    return (vals * bits.pow2_from_e8m0(s)[..., None]).reshape(codes.shape)


# ------------------------------------------------------------------ NVFP4 (TE formula)
def nvfp4_global_scales(gamax: jax.Array, div: str = "exact"):
    """(S_enc, S_dec) from a global amax: S_enc = min(448*6/amax, FLT_MAX), 0 -> 1; S_dec = 1/S_enc."""
    s_enc = bits.divide(jnp.float32(448.0 * 6.0), gamax, div)
    s_enc = jnp.minimum(s_enc, bits.F32_MAX)
    s_enc = jnp.where(s_enc == 0, jnp.float32(1.0), s_enc)
    s_dec = bits.divide(jnp.float32(1.0), s_enc, div)
    return s_enc, s_dec


def nvfp4_block_scales(vmax: jax.Array, s_enc: jax.Array, s_dec: jax.Array, div: str = "exact"):
    """Block scale byte (E4M3, RNE) and the block encode scale, TE's order of operations."""
    dec = vmax * (s_enc * jnp.float32(INV6))
    dec = jnp.minimum(dec, bits.F32_MAX)
    dec = jnp.clip(dec, -448.0, 448.0)
    byte = jax.lax.bitcast_convert_type(dec.astype(jnp.float8_e4m3fn), jnp.uint8)
    bad = ~jnp.isfinite(vmax) | jnp.isnan(dec)
    byte = jnp.where(bad, jnp.uint8(bits.NAN_BYTE), byte)
    sdec = jax.lax.bitcast_convert_type(byte, jnp.float8_e4m3fn).astype(jnp.float32)
    enc = jnp.minimum(bits.divide(jnp.float32(1.0), sdec * s_dec, div), bits.F32_MAX)
    return byte, enc


def nvfp4_quantize_last(x: jax.Array, gamax: jax.Array, div: str = "exact"):
    """NVFP4 along the last axis given the global amax (broadcastable to x[..., :1]).

    Returns (codes (..., K) uint8 unpacked, scale bytes (..., K/16), S_dec shaped like gamax).
    """
    xb = to_blocks(x.astype(jnp.float32), 16)
    vmax = jnp.max(jnp.abs(xb), axis=-1)                          # (..., nb)
    s_enc, s_dec = nvfp4_global_scales(gamax.astype(jnp.float32), div)
    byte, enc = nvfp4_block_scales(vmax, s_enc, s_dec, div)
    codes = _fp4_codes(xb * enc[..., None])
    dead = (vmax == 0) | (byte == bits.NAN_BYTE)
    codes = jnp.where(dead[..., None], jnp.uint8(0), codes)
    return codes.reshape(x.shape), byte, s_dec


def nvfp4_dequantize_last(codes, byte, s_dec) -> jax.Array:
    vals = to_blocks(bits.e2m1_decode(codes), 16)
    sdec = jax.lax.bitcast_convert_type(byte, jnp.float8_e4m3fn).astype(jnp.float32)
    return ((vals * sdec[..., None]) * s_dec[..., None]).reshape(codes.shape)


# ------------------------------------------------------------------ FP8 blockwise (DeepSeek)
def fp8_blockwise_scales(amax: jax.Array, div: str = "exact"):
    """(encode 448/amax, decode amax/448) with amax clamped below at 1e-4, as DeepGEMM."""
    a = jnp.maximum(amax.astype(jnp.float32), jnp.float32(FP8_BLOCKWISE_MIN_AMAX))
    return bits.divide(jnp.float32(448.0), a, div), bits.divide(a, jnp.float32(448.0), div)


def fp8_blockwise_quantize(x: jax.Array, tile: tuple, div: str = "exact"):
    """1x128 (along the last axis) or 128x128 (over the last two axes) FP8 E4M3 quantisation."""
    xf = x.astype(jnp.float32)
    if tuple(tile) == (1, 128):
        xb = to_blocks(xf, 128)[..., None, :]                         # (..., nb, 1, 128)
    elif tuple(tile) == (128, 128):
        r, c = x.shape[-2:]
        if r % 128 or c % 128:
            raise ValueError(f"128x128 fp8_blockwise needs the last two axes multiples of 128, got {x.shape}")
        xb = xf.reshape(*x.shape[:-2], r // 128, 128, c // 128, 128).swapaxes(-3, -2)
        xb = xb.reshape(*x.shape[:-2], r // 128, c // 128, 128, 128)
    else:
        raise ValueError(f"fp8_blockwise tile must be (1, 128) or (128, 128), got {tile}")
    amax = jnp.max(jnp.abs(xb), axis=(-2, -1))
    enc, dec = fp8_blockwise_scales(amax, div)
    codes = _fp8_codes(xb * enc[..., None, None], E4M3)
    bad = ~jnp.isfinite(amax)
    codes = jnp.where((bad | (amax == 0))[..., None, None], jnp.uint8(0), codes)
    dec = jnp.where(bad, jnp.float32(jnp.nan), dec)
    return _unblock(codes, x.shape, tile), dec


def _unblock(b: jax.Array, shape, tile) -> jax.Array:
    if tuple(tile) == (1, 128):
        return b.reshape(shape)
    r, c = shape[-2:]
    b = b.reshape(*shape[:-2], r // 128, c // 128, 128, 128).swapaxes(-3, -2)
    return b.reshape(shape)


def fp8_blockwise_dequantize(codes: jax.Array, dec: jax.Array, tile: tuple) -> jax.Array:
    vals = elem_values(codes, E4M3)
    if tuple(tile) == (1, 128):
        return (to_blocks(vals, 128) * dec[..., None]).reshape(codes.shape)
    r, c = codes.shape[-2:]
    full = jnp.repeat(jnp.repeat(dec, 128, axis=-2), 128, axis=-1)
    return vals * full


# ------------------------------------------------------------------ public reference entry points
def _norm_axis(axis: int, ndim: int) -> int:
    if not -ndim <= axis < ndim:
        raise ValueError(f"axis {axis} out of range for a {ndim}-d array")
    return axis % ndim


def quantize(x: jax.Array, fmt: str, axis: int = -1, *, scale_mode: str = "rceil",
             div: str = "exact", tile: Optional[Sequence[int]] = None,
             group_axis: Optional[int] = None) -> QArray:
    """Reference quantisation of `x` with blocks along `axis` (see the module docstring).

    `tile`: for `fp8_blockwise`, (1, 128) (default) or (128, 128) over the last two axes.
    `group_axis`: for `nvfp4`, one global scale per index of this axis (e.g. per expert) instead of
    one per tensor. `scale_mode`: MX only, 'rceil' (default) or 'floor' (OCP).
    """
    f = get_format(fmt)
    if not jnp.issubdtype(x.dtype, jnp.floating):
        raise TypeError(f"quantize expects a floating array, got {x.dtype}")
    ax = _norm_axis(axis, x.ndim)
    if fmt == "fp8_blockwise":
        tile = tuple(tile or (1, 128))
        if tile == (128, 128):
            if ax not in (x.ndim - 2, x.ndim - 1):
                raise ValueError("128x128 tiles cover the last two axes; axis must be one of them")
            codes, dec = fp8_blockwise_quantize(x, tile, div)
            return QArray(codes, dec, None, fmt, ax, tuple(x.shape), tile)
    xm = jnp.moveaxis(x, ax, -1)
    gs = None
    if f.scale == "e8m0":
        codes, s = mx_quantize_last(xm, f.elem, scale_mode)
        tile = (32,)
    elif fmt == "fp8_blockwise":
        codes, s = fp8_blockwise_quantize(xm, (1, 128), div)
    else:
        ax_abs = jnp.abs(xm.astype(jnp.float32))
        if f.global_scale == "row":
            gamax = jnp.max(ax_abs, axis=-1, keepdims=True)               # (..., 1)
        elif group_axis is None:
            gamax = jnp.max(ax_abs).reshape((1,) * xm.ndim)
        else:
            g = _norm_axis(group_axis, x.ndim)
            if g == ax:
                raise ValueError("group_axis must differ from the quantised axis")
            gm = jnp.moveaxis(jnp.abs(x.astype(jnp.float32)), g, 0)
            gamax = jnp.max(gm.reshape(gm.shape[0], -1), axis=1)
            shape = [1] * x.ndim
            shape[g] = x.shape[g]
            gamax = jnp.moveaxis(gamax.reshape(shape), ax, -1)
        codes, s, gs = nvfp4_quantize_last(xm, gamax, div)
        tile = (16,)
        gs = jnp.moveaxis(gs, -1, ax)
    if f.elem.bits == 4:
        codes = bits.pack_nibbles(codes)
    return QArray(jnp.moveaxis(codes, -1, ax), jnp.moveaxis(s, -1, ax), gs, fmt, ax,
                  tuple(x.shape), tuple(tile))


def codes_of(q: QArray) -> jax.Array:
    """Unpacked element codes of `q` in the source layout (FP4 nibbles unpacked)."""
    if get_format(q.fmt).elem.bits == 4:
        return jnp.moveaxis(bits.unpack_nibbles(jnp.moveaxis(q.data, q.axis, -1)), -1, q.axis)
    return q.data


def dequantize(q: QArray, dtype=jnp.float32) -> jax.Array:
    """Reference dequantisation: element value x block scale (x global decode scale) in f32."""
    f = get_format(q.fmt)
    if q.fmt == "fp8_blockwise" and q.tile == (128, 128):
        return fp8_blockwise_dequantize(q.data, q.scales, q.tile).astype(dtype)
    codes = jnp.moveaxis(codes_of(q), q.axis, -1)
    s = jnp.moveaxis(q.scales, q.axis, -1)
    if f.scale == "e8m0":
        out = mx_dequantize_last(codes, s, f.elem)
    elif q.fmt == "fp8_blockwise":
        out = fp8_blockwise_dequantize(codes, s, (1, 128))
    else:
        out = nvfp4_dequantize_last(codes, s, jnp.moveaxis(q.global_scale, q.axis, -1))
    return jnp.moveaxis(out, -1, q.axis).astype(dtype)
