"""Pallas grouped-matmul kernels (megablox-style tile schedule), forward/dgrad (`gmm`) and wgrad
(`tgmm`), with exact block-scaled operand semantics.

Schedule: `groups.tile_schedule` lists (row tile, group) work items; the group ids, tile ids and
flags are scalar-prefetched and drive the BlockSpec index maps, so each item loads only its own
expert's weights. Rows of a tile outside the item's group are masked at the write (gmm) or zeroed
before the dot (tgmm).

Operand kinds (all accumulate in FP32):
  * 'plain'  — f32 / bf16 operands.
  * 'mx'     — E4M3 codes with E8M0 scales per 32 along the contraction axis (K for gmm, tokens for
               tgmm), dequantised in-kernel (`code * 2^(s-127)`: exact in BF16, so on a Hopper GPU
               this is the BF16-wgmma emulation of MXFP8; here the dot runs in f32).
  * 'nvfp4'  — packed E2M1 codes with E4M3 scales per 16 along K (gmm only), dequantised in-kernel
               (exact); the FP32 global decode scales (per row of lhs, per expert of rhs) multiply
               the accumulator at the end, as the GEMM epilogue's alpha does.
  * 'fp8bw'  — DeepSeek FP8: E4M3 x E4M3 products per 128-element chunk of the contraction axis,
               each chunk's FP32 partial sum promoted into the accumulator with its two scales
               (`acc += partial * sa * sb`), i.e. FP32 promotion every 128 K-elements.

This kernel uses TPU-style scalar prefetch (`pltpu.PrefetchScalarGridSpec`): it runs in interpret
mode on CPU (tested) and targets TPU lowering; it is NOT the Hopper kernel (see README).
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from kernels_pallas import bits
from kernels_pallas.gmm.groups import group_bounds, tile_schedule

KINDS = ("plain", "mx", "nvfp4", "fp8bw")


# ------------------------------------------------------------------ in-kernel tile decoders
def _expand(s: jax.Array, axis: int, rep: int) -> jax.Array:
    """Repeat each scale `rep` times along `axis` of a 2-D tile (broadcast + reshape)."""
    r, c = s.shape
    if axis == 1:
        return jnp.broadcast_to(s[:, :, None], (r, c, rep)).reshape(r, c * rep)
    return jnp.broadcast_to(s[:, None, :], (r, rep, c)).reshape(r * rep, c)


def _mx_tile(codes, s, axis):
    return codes.astype(jnp.float32) * _expand(bits.pow2_from_e8m0(s), axis, 32)


def _unpack(p, axis):
    lo, hi = p & 0xF, p >> 4
    r, c = p.shape
    if axis == 1:
        return jnp.stack([lo, hi], axis=2).reshape(r, 2 * c)
    return jnp.stack([lo, hi], axis=1).reshape(2 * r, c)


def _nvfp4_tile(packed, s, axis):
    vals = bits.e2m1_decode(_unpack(packed, axis))
    return vals * _expand(s.astype(jnp.float32), axis, 16)


def _dot(a, b):
    return jax.lax.dot(a, b, precision=jax.lax.Precision.HIGHEST, preferred_element_type=jnp.float32)


def _dot_t(a, b):  # a^T @ b, contracting the row axis
    return jax.lax.dot_general(a, b, (((0,), (0,)), ((), ())), precision=jax.lax.Precision.HIGHEST,
                               preferred_element_type=jnp.float32)


# ------------------------------------------------------------------ forward / dgrad: gmm
def _gmm_kernel(grp_ref, tile_ref, first_ref, last_ref, starts_ref, ends_ref, *refs, kind, tm, n_in):
    in_refs, o_ref, acc_ref = refs[:n_in], refs[n_in], refs[n_in + 1]
    i, kk = pl.program_id(1), pl.program_id(2)

    @pl.when(kk == 0)
    def _():
        acc_ref[...] = jnp.zeros_like(acc_ref)

    if kind == "plain":
        a, b = in_refs[0][...], in_refs[1][...]
        acc_ref[...] += _dot(a, b)
    elif kind == "mx":
        a = _mx_tile(in_refs[0][...], in_refs[1][...], 1)
        b = _mx_tile(in_refs[2][...], in_refs[3][...], 0)
        acc_ref[...] += _dot(a, b)
    elif kind == "nvfp4":
        a = _nvfp4_tile(in_refs[0][...], in_refs[1][...], 1)
        b = _nvfp4_tile(in_refs[3][...], in_refs[4][...], 0)
        acc_ref[...] += _dot(a, b)
    else:  # fp8bw: promote every 128 K-elements
        a, sa, b, sb = (r[...] for r in in_refs)
        acc = acc_ref[...]
        for c in range(a.shape[1] // 128):
            part = _dot(a[:, c * 128:(c + 1) * 128].astype(jnp.float32),
                        b[c * 128:(c + 1) * 128, :].astype(jnp.float32))
            acc = acc + part * sa[:, c:c + 1] * sb[c:c + 1, :]
        acc_ref[...] = acc

    @pl.when(kk == pl.num_programs(2) - 1)
    def _():
        g = grp_ref[i]
        rows = tile_ref[i] * tm + jax.lax.broadcasted_iota(jnp.int32, (tm, 1), 0)
        mask = (rows >= starts_ref[g]) & (rows < ends_ref[g])
        val = acc_ref[...]
        if kind == "nvfp4":
            val = val * in_refs[2][...] * in_refs[5][...].reshape(1, 1)
        prev = jnp.where(first_ref[i] == 1, jnp.zeros_like(val), o_ref[...].astype(jnp.float32))
        o_ref[...] = jnp.where(mask, val, prev).astype(o_ref.dtype)


def gmm(lhs_ops: tuple, rhs_ops: tuple, group_sizes: jax.Array, *, kind: str, m: int, k: int, n: int,
        out_dtype=jnp.float32, tm: int = 64, tk: int = 256, tn: int = 128, interpret: bool = True):
    """Grouped matmul out[m] = lhs[m] @ rhs[group(m)] -> (m, n); operands per `kind` (module doc).

    lhs_ops: plain (lhs,); mx (codes_e4m3 (M,K), e8m0 (M,K/32)); nvfp4 (packed (M,K/2),
    e4m3 scales (M,K/16), row decode (M,1)); fp8bw (codes (M,K), f32 (M,K/128)).
    rhs_ops: plain (rhs (G,K,N),); mx (codes (G,K,N), e8m0 (G,K/32,N)); nvfp4 (packed (G,K/2,N),
    e4m3 (G,K/16,N), expert decode (G,1,1)); fp8bw (codes (G,K,N), f32 (G,K/128,N/128)).
    """
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}")
    tm, tk, tn = min(tm, m), min(tk, k), min(tn, n)
    if kind == "fp8bw":
        tk, tn = max(128, tk - tk % 128), 128
    if m % tm or k % tk or n % tn:
        raise ValueError(f"gmm tiles ({tm},{tk},{tn}) must divide (M,K,N)=({m},{k},{n}); pad first")
    grp, tile, first, last = tile_schedule(group_sizes, m, tm)
    starts, ends = group_bounds(group_sizes)
    L = lambda shape, f: pl.BlockSpec(shape, f)
    lrow = lambda j, i, kk, grp, tile, *_: (tile[i], kk)
    rblk = lambda j, i, kk, grp, tile, *_: (grp[i], kk, j)
    if kind == "plain":
        specs = [L((tm, tk), lrow), L((None, tk, tn), rblk)]
    elif kind == "mx":
        specs = [L((tm, tk), lrow), L((tm, tk // 32), lrow),
                 L((None, tk, tn), rblk), L((None, tk // 32, tn), rblk)]
    elif kind == "nvfp4":
        specs = [L((tm, tk // 2), lrow), L((tm, tk // 16), lrow),
                 L((tm, 1), lambda j, i, kk, grp, tile, *_: (tile[i], 0)),
                 L((None, tk // 2, tn), rblk), L((None, tk // 16, tn), rblk),
                 L((None, 1, 1), lambda j, i, kk, grp, tile, *_: (grp[i], 0, 0))]
    else:
        specs = [L((tm, tk), lrow), L((tm, tk // 128), lrow),
                 L((None, tk, tn), rblk), L((None, tk // 128, 1), rblk)]
    ops = (*lhs_ops, *rhs_ops)
    grid_spec = pltpu.PrefetchScalarGridSpec(
        num_scalar_prefetch=6, grid=(n // tn, grp.shape[0], k // tk), in_specs=specs,
        out_specs=L((tm, tn), lambda j, i, kk, grp, tile, *_: (tile[i], j)),
        scratch_shapes=[pltpu.VMEM((tm, tn), jnp.float32)])
    out = pl.pallas_call(
        functools.partial(_gmm_kernel, kind=kind, tm=tm, n_in=len(ops)),
        grid_spec=grid_spec, out_shape=jax.ShapeDtypeStruct((m, n), out_dtype), interpret=interpret,
    )(grp, tile, first, last, starts, ends, *ops)
    # row tiles that no group touches (rows past sum(group_sizes)) are never written
    rows = jnp.arange(m)[:, None]
    return jnp.where(rows < ends[-1], out, 0).astype(out_dtype)


# ------------------------------------------------------------------ wgrad: tgmm
def _tgmm_kernel(grp_ref, tile_ref, gfirst_ref, last_ref, starts_ref, ends_ref, *refs, kind, tm, n_in):
    in_refs, o_ref, acc_ref = refs[:n_in], refs[n_in], refs[n_in + 1]
    i = pl.program_id(2)
    g = grp_ref[i]

    @pl.when(gfirst_ref[i] == 1)
    def _():
        acc_ref[...] = jnp.zeros_like(acc_ref)

    rows = tile_ref[i] * tm + jax.lax.broadcasted_iota(jnp.int32, (tm, 1), 0)
    mask = (rows >= starts_ref[g]) & (rows < ends_ref[g])
    if kind == "plain":
        a, d = in_refs[0][...].astype(jnp.float32), in_refs[1][...].astype(jnp.float32)
        acc_ref[...] += _dot_t(jnp.where(mask, a, 0.0), d)
    elif kind == "mx":
        a = _mx_tile(in_refs[0][...], in_refs[1][...], 0)
        d = _mx_tile(in_refs[2][...], in_refs[3][...], 0)
        acc_ref[...] += _dot_t(jnp.where(mask, a, 0.0), d)
    else:  # fp8bw: promote every 128 tokens
        a, sa, d, sd = (r[...] for r in in_refs)
        a = jnp.where(mask, a.astype(jnp.float32), 0.0)
        acc = acc_ref[...]
        for c in range(tm // 128):
            part = _dot_t(a[c * 128:(c + 1) * 128], d[c * 128:(c + 1) * 128].astype(jnp.float32))
            acc = acc + part * sa[c:c + 1, :].reshape(-1, 1) * sd[c:c + 1, :]
        acc_ref[...] = acc

    @pl.when(last_ref[i] == 1)
    def _():
        o_ref[...] = acc_ref[...].astype(o_ref.dtype)


def tgmm(lhs_ops: tuple, dy_ops: tuple, group_sizes: jax.Array, *, kind: str, m: int, k: int, n: int,
         out_dtype=jnp.float32, tm: int = 64, tk: int = 128, tn: int = 128, interpret: bool = True):
    """Grouped wgrad out[g] = lhs[g rows]^T @ dy[g rows] -> (G, k, n).

    plain: (lhs (M,K),), (dy (M,N),); mx: (codes (M,K), e8m0 (M/32,K)), (codes (M,N), e8m0 (M/32,N));
    fp8bw: (codes (M,K), f32 (M/128,K)), (codes (M,N), f32 (M/128,N)). For mx/fp8bw the groups
    must start at multiples of 32/128 (`groups.pad_groups`) so no block straddles two experts.
    """
    if kind not in ("plain", "mx", "fp8bw"):
        raise ValueError("tgmm kinds: plain, mx, fp8bw")
    g_count = group_sizes.shape[0]
    tm, tk, tn = min(tm, m), min(tk, k), min(tn, n)
    if kind == "fp8bw":
        tm = max(128, tm - tm % 128)
    if m % tm or k % tk or n % tn:
        raise ValueError(f"tgmm tiles ({tm},{tk},{tn}) must divide (M,K,N)=({m},{k},{n}); pad first")
    grp, tile, _, last = tile_schedule(group_sizes, m, tm)
    prev = jnp.concatenate([jnp.full((1,), -1, jnp.int32), grp[:-1]])
    gfirst = (grp != prev).astype(jnp.int32)
    starts, ends = group_bounds(group_sizes)
    L = lambda shape, f: pl.BlockSpec(shape, f)
    a_map = lambda kk, j, i, grp, tile, *_: (tile[i], kk)
    d_map = lambda kk, j, i, grp, tile, *_: (tile[i], j)
    if kind == "plain":
        specs = [L((tm, tk), a_map), L((tm, tn), d_map)]
    else:
        bs = 32 if kind == "mx" else 128
        specs = [L((tm, tk), a_map), L((tm // bs, tk), a_map), L((tm, tn), d_map), L((tm // bs, tn), d_map)]
    ops = (*lhs_ops, *dy_ops)
    grid_spec = pltpu.PrefetchScalarGridSpec(
        num_scalar_prefetch=6, grid=(k // tk, n // tn, grp.shape[0]), in_specs=specs,
        out_specs=L((None, tk, tn), lambda kk, j, i, grp, *_: (grp[i], kk, j)),
        scratch_shapes=[pltpu.VMEM((tk, tn), jnp.float32)])
    out = pl.pallas_call(
        functools.partial(_tgmm_kernel, kind=kind, tm=tm, n_in=len(ops)),
        grid_spec=grid_spec, out_shape=jax.ShapeDtypeStruct((g_count, k, n), out_dtype),
        interpret=interpret,
    )(grp, tile, gfirst, last, starts, ends, *ops)
    return jnp.where((group_sizes > 0)[:, None, None], out, 0).astype(out_dtype)
