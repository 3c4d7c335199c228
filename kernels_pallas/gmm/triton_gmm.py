"""Grouped matmuls that lower through Pallas' **Triton** backend (GPU; no TPU-only primitives).

Why a second kernel family: `pallas_gmm.py` drives its BlockSpecs with TPU scalar prefetch
(`PrefetchScalarGridSpec`), which has no GPU lowering, and `hopper.py` needs Mosaic GPU (sm_90
only). These kernels use only what the Triton lowering supports: a plain grid, whole-array refs,
dynamic `pl.ds` loads, scalar loads of the work-item tables, `lax.fori_loop` (dynamic bounds) and a
masked `plt.store`. The same code runs on CPU with `interpret=True` (tested against the references)
and lowers to Triton IR for a CUDA target from a CPU-only jaxlib (tested:
`jax.jit(f).trace(...).lower(lowering_platforms=("cuda",))`); compiling that IR to PTX needs a
CUDA jaxlib and a GPU (`benchmarks/gpu_kit.sh`).

Forward / dgrad `gmm`: out[m] = lhs[m] @ rhs[group(m)], lhs (M, K) rows sorted by group, rhs
(G, K, N). The grid is (work item, N tile); work items are the megablox-style (row tile, group)
pairs of `groups.tile_schedule`, read by scalar loads. Each item runs the whole K loop and stores
only the rows of its group (masked store), so a row tile shared by two groups is written by two
items, each its own rows. Wgrad `tgmm`: out[g] = lhs[rows of g]^T @ dy[rows of g] -> (G, K, N),
grid (K tile, N tile, group), a dynamic loop over the group's row chunks (empty group -> zeros).

Operand kinds (all accumulate in FP32):
  * 'plain' — f32 / bf16 operands (f32 dots at IEEE precision, not TF32).
  * 'fp8bw' — DeepSeek FP8: E4M3 x E4M3 dot per 128-element chunk of the contraction axis, promoted
              into the FP32 accumulator with its two FP32 scales (`acc += part * sa * sb`): FP32
              promotion every 128 (tk = 128 for gmm, 128-token chunks for tgmm).
  * 'mx'    — MXFP8: E4M3 codes x E8M0 scales per 32 along the contraction axis, dequantised
              in-kernel to BF16 (exact: 4 significant bits times a power of two) and multiplied on
              BF16 tensor cores (Hopper has no block-scaled MMA; kernels.md 3.6).
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, replace

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plt

from kernels_pallas import bits
from kernels_pallas.gmm.groups import group_bounds, tile_schedule

KINDS = ("plain", "fp8bw", "mx")


@dataclass(frozen=True)
class TileConfig:
    """Tile sizes (powers of two, as Triton requires) and Triton launch parameters.

    gmm: tm rows x tn columns per program, tk-wide K steps. tgmm: tk x tn output tile per program,
    tm-token chunks of the group's rows."""

    tm: int = 64
    tk: int = 64
    tn: int = 128
    num_warps: int = 4
    num_stages: int = 3

    def check(self) -> None:
        for name in ("tm", "tk", "tn"):
            v = getattr(self, name)
            if v < 16 or v & (v - 1):
                raise ValueError(f"TileConfig.{name}={v}: Triton tiles must be powers of two >= 16")


def fit_config(cfg: TileConfig, k: int, n: int, *, k_min: int = 16, n_min: int = 16) -> TileConfig:
    """Halve tk / tn (down to k_min / n_min) until they divide K / N; ValueError if they cannot."""
    tk, tn = cfg.tk, cfg.tn
    while k % tk and tk > k_min:
        tk //= 2
    while n % tn and tn > n_min:
        tn //= 2
    if k % tk or n % tn:
        raise ValueError(f"no power-of-two tiles >= ({k_min}, {n_min}) divide (K, N) = ({k}, {n}); pad first")
    return replace(cfg, tk=tk, tn=tn)


# Defaults per kind; the GPU kit sweeps a few alternatives (benchmarks/gpu_kit.py).
GMM_DEFAULTS = {"plain": TileConfig(128, 64, 128, 8, 3), "fp8bw": TileConfig(128, 128, 128, 8, 3),
                "mx": TileConfig(128, 64, 128, 8, 3)}
TGMM_DEFAULTS = {"plain": TileConfig(64, 64, 64, 4, 3), "fp8bw": TileConfig(128, 64, 64, 4, 3),
                 "mx": TileConfig(64, 64, 64, 4, 3)}


# ------------------------------------------------------------------ in-kernel helpers
def _expand(s: jax.Array, axis: int, rep: int) -> jax.Array:
    """Repeat each entry of a 2-D scale tile `rep` times along `axis` (broadcast + reshape)."""
    r, c = s.shape
    if axis == 1:
        return jnp.broadcast_to(s[:, :, None], (r, c, rep)).reshape(r, c * rep)
    return jnp.broadcast_to(s[:, None, :], (r, rep, c)).reshape(r * rep, c)


def _mx_bf16(codes: jax.Array, scale_bytes: jax.Array, axis: int) -> jax.Array:
    """E4M3 codes x 2^(s-127) per 32 along `axis`, as BF16 (exact for normal results)."""
    s = _expand(bits.pow2_from_e8m0(scale_bytes), axis, 32)
    return (codes.astype(jnp.float32) * s).astype(jnp.bfloat16)


def _dot(a: jax.Array, b: jax.Array) -> jax.Array:
    prec = lax.Precision.HIGHEST if a.dtype == jnp.float32 else None
    return jnp.dot(a, b, precision=prec, preferred_element_type=jnp.float32)


def _dot_t(a: jax.Array, b: jax.Array) -> jax.Array:  # a^T @ b
    return _dot(a.T, b)


def _params(cfg: TileConfig):
    return plt.CompilerParams(num_warps=cfg.num_warps, num_stages=cfg.num_stages)


def _pad_rows(x: jax.Array, mult: int) -> jax.Array:
    pad = (-x.shape[0]) % mult
    return jnp.pad(x, ((0, pad),) + ((0, 0),) * (x.ndim - 1)) if pad else x


# ------------------------------------------------------------------ forward / dgrad
def _gmm_kernel(grp_ref, tile_ref, starts_ref, ends_ref, *refs, kind: str, nk: int, cfg: TileConfig):
    o_ref = refs[-1]
    tm, tk, tn = cfg.tm, cfg.tk, cfg.tn
    i, j = pl.program_id(0), pl.program_id(1)
    g, t = grp_ref[i], tile_ref[i]
    row0, col0 = t * tm, j * tn
    rows = row0 + lax.broadcasted_iota(jnp.int32, (tm,), 0)
    mask = (rows >= starts_ref[g]) & (rows < ends_ref[g])                 # (tm,)

    def body(kk, acc):                                                    # acc (tm, tn) f32
        k0 = kk * tk
        if kind == "plain":
            a_ref, b_ref = refs[0], refs[1]
            return acc + _dot(a_ref[pl.ds(row0, tm), pl.ds(k0, tk)], b_ref[g, pl.ds(k0, tk), pl.ds(col0, tn)])
        if kind == "fp8bw":                                               # tk == 128: one promotion
            a_ref, sa_ref, b_ref, sb_ref = refs[:4]
            part = _dot(a_ref[pl.ds(row0, tm), pl.ds(k0, tk)], b_ref[g, pl.ds(k0, tk), pl.ds(col0, tn)])
            sa = sa_ref[pl.ds(row0, tm), kk]                              # (tm,)
            sb = sb_ref[g, kk, col0 // 128]                               # scalar (tn divides 128)
            return acc + part * sa[:, None] * sb
        a_ref, sa_ref, b_ref, sb_ref = refs[:4]                           # mx
        a = _mx_bf16(a_ref[pl.ds(row0, tm), pl.ds(k0, tk)], sa_ref[pl.ds(row0, tm), pl.ds(kk * (tk // 32), tk // 32)], 1)
        b = _mx_bf16(b_ref[g, pl.ds(k0, tk), pl.ds(col0, tn)],
                     sb_ref[g, pl.ds(kk * (tk // 32), tk // 32), pl.ds(col0, tn)], 0)
        return acc + _dot(a, b)

    acc = lax.fori_loop(0, nk, body, jnp.zeros((tm, tn), jnp.float32))
    plt.store(o_ref.at[pl.ds(row0, tm), pl.ds(col0, tn)], acc.astype(o_ref.dtype), mask=mask[:, None])


def _check_kind(kind: str, cfg: TileConfig, k: int, n: int, what: str) -> None:
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
    cfg.check()
    if kind == "fp8bw" and (cfg.tk != 128 if what == "gmm" else cfg.tm != 128):
        raise ValueError("fp8bw promotes every 128 contraction elements: "
                         + ("tk must be 128" if what == "gmm" else "tm must be 128"))
    if kind == "fp8bw" and what == "gmm" and 128 % cfg.tn:
        raise ValueError("fp8bw gmm: tn must divide 128 (one weight scale per 128x128 block)")
    if k % cfg.tk or n % cfg.tn:
        raise ValueError(f"{what}: K={k} and N={n} must be multiples of tk={cfg.tk} and tn={cfg.tn}; pad first")


def gmm(lhs_ops: tuple, rhs_ops: tuple, group_sizes: jax.Array, *, kind: str, out_dtype=jnp.float32,
        config: TileConfig | None = None, interpret: bool = False) -> jax.Array:
    """Grouped matmul -> (M, N) `out_dtype`; rows past sum(group_sizes) are zero.

    lhs_ops: plain (lhs (M,K),); fp8bw (codes e4m3 (M,K), f32 (M,K/128)); mx (codes e4m3 (M,K),
    E8M0 bytes (M,K/32)). rhs_ops: plain (rhs (G,K,N),); fp8bw (codes e4m3 (G,K,N), f32
    (G,K/128,N/128)); mx (codes e4m3 (G,K,N), E8M0 bytes (G,K/32,N)). `interpret=True` runs on CPU.
    """
    cfg = config or GMM_DEFAULTS.get(kind, TileConfig())
    m, k = lhs_ops[0].shape
    g, k2, n = rhs_ops[0].shape
    if k != k2 or group_sizes.shape != (g,):
        raise ValueError(f"gmm: lhs {lhs_ops[0].shape}, rhs {rhs_ops[0].shape}, group_sizes {group_sizes.shape}")
    _check_kind(kind, cfg, k, n, "gmm")
    lhs_ops = tuple(_pad_rows(x, cfg.tm) for x in lhs_ops)
    mp = lhs_ops[0].shape[0]
    gs = group_sizes.astype(jnp.int32)
    grp, tile, _, _ = tile_schedule(gs, mp, cfg.tm)
    starts, ends = group_bounds(gs)
    out = pl.pallas_call(
        functools.partial(_gmm_kernel, kind=kind, nk=k // cfg.tk, cfg=cfg),
        grid=(grp.shape[0], n // cfg.tn),
        out_shape=jax.ShapeDtypeStruct((mp, n), out_dtype),
        compiler_params=_params(cfg), interpret=interpret, name=f"triton_gmm_{kind}",
    )(grp, tile, starts, ends, *lhs_ops, *rhs_ops)
    rows = jnp.arange(mp)[:, None]
    return jnp.where(rows < ends[-1], out, 0).astype(out_dtype)[:m]  # unwritten rows -> 0


# ------------------------------------------------------------------ wgrad
def _tgmm_kernel(starts_ref, ends_ref, *refs, kind: str, cfg: TileConfig):
    o_ref = refs[-1]
    tm, tk, tn = cfg.tm, cfg.tk, cfg.tn
    kt, j, g = pl.program_id(0), pl.program_id(1), pl.program_id(2)
    start, end = starts_ref[g], ends_ref[g]
    k0, n0 = kt * tk, j * tn

    def body(c, acc):                                                     # acc (tk, tn) f32
        r0 = c * tm
        rows = r0 + lax.broadcasted_iota(jnp.int32, (tm, 1), 0)
        inside = (rows >= start) & (rows < end)                          # (tm, 1)
        if kind == "plain":
            x_ref, d_ref = refs[0], refs[1]
            x = jnp.where(inside, x_ref[pl.ds(r0, tm), pl.ds(k0, tk)], 0)
            return acc + _dot_t(x, d_ref[pl.ds(r0, tm), pl.ds(n0, tn)])
        x_ref, sx_ref, d_ref, sd_ref = refs[:4]
        if kind == "fp8bw":  # groups start at multiples of 128 = tm and are zero-padded: no mask
            part = _dot_t(x_ref[pl.ds(r0, tm), pl.ds(k0, tk)], d_ref[pl.ds(r0, tm), pl.ds(n0, tn)])
            return acc + part * sx_ref[c, pl.ds(k0, tk)][:, None] * sd_ref[c, pl.ds(n0, tn)][None, :]
        b0 = c * (tm // 32)                                               # mx: scales per 32 tokens
        x = _mx_bf16(x_ref[pl.ds(r0, tm), pl.ds(k0, tk)], sx_ref[pl.ds(b0, tm // 32), pl.ds(k0, tk)], 0)
        d = _mx_bf16(d_ref[pl.ds(r0, tm), pl.ds(n0, tn)], sd_ref[pl.ds(b0, tm // 32), pl.ds(n0, tn)], 0)
        return acc + _dot_t(jnp.where(inside, x, jnp.zeros_like(x)), d)

    lo = start // tm
    hi = (end + tm - 1) // tm
    acc = lax.fori_loop(lo, hi, body, jnp.zeros((tk, tn), jnp.float32))
    o_ref[g, pl.ds(k0, tk), pl.ds(n0, tn)] = acc.astype(o_ref.dtype)


def tgmm(lhs_ops: tuple, dy_ops: tuple, group_sizes: jax.Array, *, kind: str, out_dtype=jnp.float32,
         config: TileConfig | None = None, interpret: bool = False) -> jax.Array:
    """Grouped wgrad out[g] = lhs[rows of g]^T @ dy[rows of g] -> (G, K, N) `out_dtype`.

    plain: (lhs (M,K),), (dy (M,N),). fp8bw: (codes e4m3 (M,K), f32 (M/128,K)), (codes (M,N), f32
    (M/128,N)); mx: (codes (M,K), E8M0 (M/32,K)), (codes (M,N), E8M0 (M/32,N)). For fp8bw / mx the
    groups must start at multiples of 128 / 32 with zero rows between them (`groups.pad_groups`).
    """
    cfg = config or TGMM_DEFAULTS.get(kind, TileConfig())
    m, k = lhs_ops[0].shape
    m2, n = dy_ops[0].shape
    g = group_sizes.shape[0]
    if m != m2:
        raise ValueError(f"tgmm: lhs has {m} rows, dy has {m2}")
    _check_kind(kind, cfg, k, n, "tgmm")
    if kind == "mx" and cfg.tm % 32:
        raise ValueError("mx tgmm: tm must be a multiple of 32 (one scale row per 32 tokens)")
    block = {"plain": 1, "fp8bw": 128, "mx": 32}[kind]
    if m % max(block, 1) and kind != "plain":
        raise ValueError(f"tgmm {kind}: M={m} must be a multiple of {block} (pad the groups)")
    mult = cfg.tm
    lhs_ops = (_pad_rows(lhs_ops[0], mult),) + tuple(_pad_rows(s, mult // block) for s in lhs_ops[1:])
    dy_ops = (_pad_rows(dy_ops[0], mult),) + tuple(_pad_rows(s, mult // block) for s in dy_ops[1:])
    starts, ends = group_bounds(group_sizes.astype(jnp.int32))
    return pl.pallas_call(
        functools.partial(_tgmm_kernel, kind=kind, cfg=cfg),
        grid=(k // cfg.tk, n // cfg.tn, g),
        out_shape=jax.ShapeDtypeStruct((g, k, n), out_dtype),
        compiler_params=_params(cfg), interpret=interpret, name=f"triton_tgmm_{kind}",
    )(starts, ends, *lhs_ops, *dy_ops)
