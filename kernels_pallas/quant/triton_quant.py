"""Quantisation kernels that lower through Pallas' **Triton** backend: MXFP8 (E4M3 / E5M2, E8M0
RCEIL scales per 32) and NVFP4 per token (`nvfp4_per_token`: E2M1 codes, E4M3 scales per 16, one
FP32 decode scale per row).

Why separate from `pallas_quant.py`: those kernels take the full quantised axis per tile and use no
compiler params, so on a GPU they would go to Mosaic GPU (which rejects them) and, for Triton, a
7168-wide row is not a power of two. Here every tile is a power of two:
  * MXFP8: grid (row tiles, column tiles); tc = the largest power of two <= 512 that divides K
    (K a multiple of 32), BlockSpecs for the tiles.
  * NVFP4 per token: one program per row tile loops over the row twice (row amax, then codes),
    whole-array refs with dynamic `pl.ds` slices, because the row's global scale needs its amax.
Nibble packing avoids slicing register tensors (Triton cannot): codes viewed (tr, K/2, 2) and
packed as the sum over the pair of `code << 4*i` (a reduction over a size-2 axis).

The arithmetic is the reference's (`kernels_pallas.bits`, `quant.reference` scale helpers), so the
bytes are identical to `quant.reference` in interpret mode (tested) and, on a GPU, are checked by
`benchmarks/gpu_kit.py` before auto-dispatch may use them (`kernels_pallas.gpu_validation`).
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plt

from kernels_pallas import bits
from kernels_pallas.formats import get_format
from kernels_pallas.quant import reference as ref

MX_FORMATS = ("mxfp8_e4m3", "mxfp8_e5m2")
FORMATS = MX_FORMATS + ("nvfp4_per_token",)


def _col_tile(k: int, block: int, cap: int = 512) -> int:
    """Largest power of two <= cap dividing k, at least `block` (k must be a multiple of block)."""
    if k % block:
        raise ValueError(f"quantised axis has size {k}, not a multiple of the block size {block}; pad it")
    t = cap
    while k % t:
        t //= 2
    return max(t, block)


def _pad_rows(x: jax.Array, tr: int) -> jax.Array:
    pad = (-x.shape[0]) % tr
    return jnp.pad(x, ((0, pad), (0, 0))) if pad else x


def _pack_pairs(codes: jax.Array) -> jax.Array:
    """(tr, c) uint8 codes -> (tr, c/2): element 2i in the low nibble, 2i+1 in the high nibble."""
    tr, c = codes.shape
    pairs = codes.astype(jnp.int32).reshape(tr, c // 2, 2)
    shift = lax.broadcasted_iota(jnp.int32, (tr, c // 2, 2), 2) * 4
    return jnp.sum(pairs << shift, axis=-1).astype(jnp.uint8)


# ------------------------------------------------------------------ MXFP8
def _mx_kernel(x_ref, data_ref, scale_ref, *, elem):
    x = x_ref[...].astype(jnp.float32)                              # (tr, tc)
    tr, tc = x.shape
    xb = x.reshape(tr, tc // 32, 32)
    amax = jnp.max(jnp.abs(xb), axis=-1)                            # (tr, tc/32)
    s = bits.e8m0_rceil(amax, elem.emax, elem.mant_thresh)
    y = jnp.clip(xb * bits.recip_pow2_from_e8m0(s)[:, :, None], -elem.max, elem.max)
    dead = ((amax == 0) | (s == bits.NAN_BYTE))[:, :, None]
    data_ref[...] = jnp.where(dead, 0.0, y).reshape(tr, tc).astype(elem.dtype)
    scale_ref[...] = s


@functools.partial(jax.jit, static_argnames=("fmt", "interpret", "tr", "tc", "num_warps"))
def mx_quantize_2d(x: jax.Array, fmt: str = "mxfp8_e4m3", interpret: bool = False, tr: int = 16,
                   tc: int | None = None, num_warps: int = 4):
    """x (R, K) -> (E4M3/E5M2 codes uint8 (R, K), E8M0 bytes (R, K/32)), RCEIL, blocks along K."""
    if fmt not in MX_FORMATS:
        raise ValueError(f"Triton MX quantiser formats: {MX_FORMATS}, got {fmt!r}")
    elem = get_format(fmt).elem
    r, k = x.shape
    tc = tc or _col_tile(k, 32)
    if k % tc or tc % 32:
        raise ValueError(f"column tile {tc} must be a multiple of 32 dividing K={k}")
    xp = _pad_rows(x, tr)
    rp = xp.shape[0]
    data, s = pl.pallas_call(
        functools.partial(_mx_kernel, elem=elem),
        grid=(rp // tr, k // tc),
        in_specs=[pl.BlockSpec((tr, tc), lambda i, j: (i, j))],
        out_specs=[pl.BlockSpec((tr, tc), lambda i, j: (i, j)),
                   pl.BlockSpec((tr, tc // 32), lambda i, j: (i, j))],
        out_shape=[jax.ShapeDtypeStruct((rp, k), elem.dtype),
                   jax.ShapeDtypeStruct((rp, k // 32), jnp.uint8)],
        compiler_params=plt.CompilerParams(num_warps=num_warps, num_stages=1),
        interpret=interpret, name=f"triton_quant_{fmt}",
    )(xp)
    return lax.bitcast_convert_type(data, jnp.uint8)[:r], s[:r]


# ------------------------------------------------------------------ NVFP4 per token
def _nvfp4_row_kernel(x_ref, data_ref, scale_ref, sdec_ref, *, tr, tc, nc, div):
    row0 = pl.program_id(0) * tr

    def chunk(c):
        return x_ref[pl.ds(row0, tr), pl.ds(c * tc, tc)].astype(jnp.float32)   # (tr, tc)

    def amax_step(c, m):
        return jnp.maximum(m, jnp.max(jnp.abs(chunk(c)), axis=1, keepdims=True))

    gamax = lax.fori_loop(0, nc, amax_step, jnp.zeros((tr, 1), jnp.float32))   # (tr, 1)
    s_enc, s_dec = ref.nvfp4_global_scales(gamax, div)

    def quant_step(c, carry):
        xb = chunk(c).reshape(tr, tc // 16, 16)
        vmax = jnp.max(jnp.abs(xb), axis=-1)                                # (tr, tc/16)
        byte, enc = ref.nvfp4_block_scales(vmax, s_enc, s_dec, div)
        y = jnp.clip(xb * enc[:, :, None], -6.0, 6.0)
        dead = ((vmax == 0) | (byte == bits.NAN_BYTE))[:, :, None]
        codes = bits.e2m1_encode(jnp.where(dead, 0.0, y).reshape(tr, tc))
        data_ref[pl.ds(row0, tr), pl.ds(c * (tc // 2), tc // 2)] = _pack_pairs(codes)
        scale_ref[pl.ds(row0, tr), pl.ds(c * (tc // 16), tc // 16)] = byte
        return carry

    lax.fori_loop(0, nc, quant_step, 0)
    sdec_ref[pl.ds(row0, tr), :] = s_dec


@functools.partial(jax.jit, static_argnames=("interpret", "tr", "tc", "num_warps", "div"))
def nvfp4_per_token_quantize_2d(x: jax.Array, interpret: bool = False, tr: int = 16,
                                tc: int | None = None, num_warps: int = 4, div: str = "exact"):
    """x (R, K) -> (packed E2M1 (R, K/2), E4M3 scale bytes (R, K/16), S_dec (R, 1) f32), each row
    quantised as if it were a tensor (TE's row-scaled NVFP4), so a row's bits never depend on the
    other rows of the batch."""
    r, k = x.shape
    tc = tc or _col_tile(k, 32)
    if k % tc or tc % 32:
        raise ValueError(f"column tile {tc} must be a multiple of 32 dividing K={k}")
    xp = _pad_rows(x, tr)
    rp = xp.shape[0]
    data, s, sdec = pl.pallas_call(
        functools.partial(_nvfp4_row_kernel, tr=tr, tc=tc, nc=k // tc, div=div),
        grid=(rp // tr,),
        out_shape=[jax.ShapeDtypeStruct((rp, k // 2), jnp.uint8),
                   jax.ShapeDtypeStruct((rp, k // 16), jnp.uint8),
                   jax.ShapeDtypeStruct((rp, 1), jnp.float32)],
        compiler_params=plt.CompilerParams(num_warps=num_warps, num_stages=1),
        interpret=interpret, name="triton_quant_nvfp4_per_token",
    )(xp)
    return data[:r], s[:r], sdec[:r]
