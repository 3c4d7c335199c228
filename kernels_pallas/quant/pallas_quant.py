"""Pallas quantisation kernels (row-wise: blocks along the last axis of a 2-D array).

One kernel per recipe family, each a `pl.pallas_call` over row tiles of `tr` rows x the full
quantised axis (the full row is needed for NVFP4 per-token global scales and keeps every block in
one tile). The math is the reference's elementwise bit arithmetic (`kernels_pallas.bits`), with
two deliberately independent pieces: E2M1 codes come from the comparison encoder
`bits.e2m1_encode` (the reference uses the dtype cast) and nibbles are packed in-kernel.
Kernels write FP8 element outputs in their FP8 dtype (a plain convert on GPU) and the wrapper
bitcasts them to uint8 codes.

`interpret=True` runs on CPU (the only way there); `interpret=False` compiles for the default
backend (GPU via Pallas' Triton lowering; never compiled or run in this repository so far, see
kernels_pallas/README.md). Column-wise quantisation is obtained by the caller transposing first.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from kernels_pallas import bits
from kernels_pallas.formats import E4M3, get_format
from kernels_pallas.quant import reference as ref

DEFAULT_ROW_TILE = 32


def _pad_rows(x: jax.Array, tr: int) -> tuple[jax.Array, int]:
    r = x.shape[0]
    pad = (-r) % tr
    return (jnp.pad(x, ((0, pad), (0, 0))) if pad else x), r


def _pack_in_kernel(codes: jax.Array) -> jax.Array:
    tr, k = codes.shape
    c = codes.reshape(tr, k // 2, 2)
    return c[:, :, 0] | (c[:, :, 1] << 4)


# ------------------------------------------------------------------ MX
def _mx_kernel(x_ref, data_ref, scale_ref, *, elem, scale_mode):
    x = x_ref[...].astype(jnp.float32)                          # (tr, K)
    tr, k = x.shape
    xb = x.reshape(tr, k // 32, 32)
    amax = jnp.max(jnp.abs(xb), axis=-1)                        # (tr, K/32)
    if scale_mode == "rceil":
        s = bits.e8m0_rceil(amax, elem.emax, elem.mant_thresh)
    else:
        s = bits.e8m0_floor(amax, elem.emax)
    y = jnp.clip(xb * bits.recip_pow2_from_e8m0(s)[:, :, None], -elem.max, elem.max)
    dead = ((amax == 0) | (s == bits.NAN_BYTE))[:, :, None]
    y = jnp.where(dead, 0.0, y).reshape(tr, k)
    if elem.bits == 4:
        data_ref[...] = _pack_in_kernel(bits.e2m1_encode(y))
    else:
        data_ref[...] = y.astype(elem.dtype)
    scale_ref[...] = s


@functools.partial(jax.jit, static_argnames=("fmt", "scale_mode", "interpret", "tr"))
def mx_quantize_2d(x: jax.Array, fmt: str, scale_mode: str = "rceil", interpret: bool = True,
                   tr: int = DEFAULT_ROW_TILE):
    """x (R, K) -> (codes uint8 (R, K) or packed (R, K/2), E8M0 bytes (R, K/32))."""
    elem = get_format(fmt).elem
    ref.to_blocks(x[:1], 32)  # shape check with a clear error
    tr = min(tr, x.shape[0])
    xp, r = _pad_rows(x, tr)
    rp, k = xp.shape
    kd = k // 2 if elem.bits == 4 else k
    ddt = jnp.uint8 if elem.bits == 4 else elem.dtype
    data, s = pl.pallas_call(
        functools.partial(_mx_kernel, elem=elem, scale_mode=scale_mode),
        grid=(rp // tr,),
        in_specs=[pl.BlockSpec((tr, k), lambda i: (i, 0))],
        out_specs=[pl.BlockSpec((tr, kd), lambda i: (i, 0)),
                   pl.BlockSpec((tr, k // 32), lambda i: (i, 0))],
        out_shape=[jax.ShapeDtypeStruct((rp, kd), ddt), jax.ShapeDtypeStruct((rp, k // 32), jnp.uint8)],
        interpret=interpret,
    )(xp)
    if elem.bits != 4:
        data = jax.lax.bitcast_convert_type(data, jnp.uint8)
    return data[:r], s[:r]


# ------------------------------------------------------------------ NVFP4
def _nvfp4_kernel(x_ref, g_ref, data_ref, scale_ref, sdec_ref, *, per_row, div):
    x = x_ref[...].astype(jnp.float32)                          # (tr, K)
    tr, k = x.shape
    if per_row:
        gamax = jnp.max(jnp.abs(x), axis=-1, keepdims=True)     # (tr, 1)
    else:
        gamax = jnp.broadcast_to(g_ref[...], (tr, 1))           # precomputed tensor/expert amax
    s_enc, s_dec = ref.nvfp4_global_scales(gamax, div)
    xb = x.reshape(tr, k // 16, 16)
    vmax = jnp.max(jnp.abs(xb), axis=-1)                        # (tr, K/16)
    byte, enc = ref.nvfp4_block_scales(vmax, s_enc, s_dec, div)
    y = jnp.clip(xb * enc[:, :, None], -6.0, 6.0)
    dead = ((vmax == 0) | (byte == bits.NAN_BYTE))[:, :, None]
    y = jnp.where(dead, 0.0, y).reshape(tr, k)
    data_ref[...] = _pack_in_kernel(bits.e2m1_encode(y))
    scale_ref[...] = byte
    sdec_ref[...] = s_dec


@functools.partial(jax.jit, static_argnames=("per_row", "div", "interpret", "tr"))
def nvfp4_quantize_2d(x: jax.Array, gamax: jax.Array | None = None, per_row: bool = False,
                      div: str = "exact", interpret: bool = True, tr: int = DEFAULT_ROW_TILE):
    """x (R, K) -> (packed codes (R, K/2), E4M3 bytes (R, K/16), S_dec (R, 1) f32).

    `per_row=True` is `nvfp4_per_token` (amax of each row inside the kernel); otherwise `gamax`
    is the per-row global amax to use, shape (R, 1) (the tensor amax broadcast, or the amax of
    the expert each row belongs to)."""
    ref.to_blocks(x[:1], 16)
    tr = min(tr, x.shape[0])
    if gamax is None:
        gamax = jnp.broadcast_to(jnp.max(jnp.abs(x.astype(jnp.float32))), (x.shape[0], 1))
    xp, r = _pad_rows(x, tr)
    gp, _ = _pad_rows(gamax.astype(jnp.float32).reshape(-1, 1), tr)
    rp, k = xp.shape
    data, s, sdec = pl.pallas_call(
        functools.partial(_nvfp4_kernel, per_row=per_row, div=div),
        grid=(rp // tr,),
        in_specs=[pl.BlockSpec((tr, k), lambda i: (i, 0)), pl.BlockSpec((tr, 1), lambda i: (i, 0))],
        out_specs=[pl.BlockSpec((tr, k // 2), lambda i: (i, 0)),
                   pl.BlockSpec((tr, k // 16), lambda i: (i, 0)),
                   pl.BlockSpec((tr, 1), lambda i: (i, 0))],
        out_shape=[jax.ShapeDtypeStruct((rp, k // 2), jnp.uint8),
                   jax.ShapeDtypeStruct((rp, k // 16), jnp.uint8),
                   jax.ShapeDtypeStruct((rp, 1), jnp.float32)],
        interpret=interpret,
    )(xp, gp)
    return data[:r], s[:r], sdec[:r]


# ------------------------------------------------------------------ FP8 blockwise
def _fp8_kernel(x_ref, data_ref, scale_ref, *, tile, div):
    x = x_ref[...].astype(jnp.float32)
    tr, k = x.shape
    if tile == (1, 128):
        xb = x.reshape(tr, k // 128, 128)
        amax = jnp.max(jnp.abs(xb), axis=-1)                    # (tr, K/128)
        enc, dec = ref.fp8_blockwise_scales(amax, div)
        bad = ~jnp.isfinite(amax)
        y = jnp.clip(xb * enc[:, :, None], -E4M3.max, E4M3.max)
        y = jnp.where((bad | (amax == 0))[:, :, None], 0.0, y).reshape(tr, k)
    else:  # one 128x128 tile per grid step
        amax = jnp.max(jnp.abs(x)).reshape(1, 1)
        enc, dec = ref.fp8_blockwise_scales(amax, div)
        bad = ~jnp.isfinite(amax)
        y = jnp.where(bad | (amax == 0), 0.0, jnp.clip(x * enc, -E4M3.max, E4M3.max))
    data_ref[...] = y.astype(E4M3.dtype)
    scale_ref[...] = jnp.where(bad, jnp.nan, dec)


@functools.partial(jax.jit, static_argnames=("tile", "div", "interpret", "tr"))
def fp8_blockwise_quantize_2d(x: jax.Array, tile=(1, 128), div: str = "exact",
                              interpret: bool = True, tr: int = DEFAULT_ROW_TILE):
    """x (R, K) -> (E4M3 codes uint8 (R, K), FP32 decode scales (R, K/128) or (R/128, K/128))."""
    tile = tuple(tile)
    r, k = x.shape
    if tile == (1, 128):
        ref.to_blocks(x[:1], 128)
        tr = min(tr, r)
        xp, r = _pad_rows(x, tr)
        rp = xp.shape[0]
        grid, in_spec = (rp // tr,), pl.BlockSpec((tr, k), lambda i: (i, 0))
        out_specs = [in_spec, pl.BlockSpec((tr, k // 128), lambda i: (i, 0))]
        shapes = [(rp, k), (rp, k // 128)]
    else:
        if r % 128 or k % 128:
            raise ValueError(f"128x128 fp8_blockwise needs both axes multiples of 128, got {x.shape}")
        xp, rp = x, r
        grid, in_spec = (r // 128, k // 128), pl.BlockSpec((128, 128), lambda i, j: (i, j))
        out_specs = [in_spec, pl.BlockSpec((1, 1), lambda i, j: (i, j))]
        shapes = [(r, k), (r // 128, k // 128)]
    data, s = pl.pallas_call(
        functools.partial(_fp8_kernel, tile=tile, div=div),
        grid=grid, in_specs=[in_spec], out_specs=out_specs,
        out_shape=[jax.ShapeDtypeStruct(shapes[0], E4M3.dtype), jax.ShapeDtypeStruct(shapes[1], jnp.float32)],
        interpret=interpret,
    )(xp)
    data = jax.lax.bitcast_convert_type(data, jnp.uint8)
    return (data[:r], s[:r]) if tile == (1, 128) else (data, s)
