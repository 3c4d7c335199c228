"""Public kernel API: `quantize`, `dequantize`, `grouped_matmul` (and `moe_expert_matmul`).

`impl` picks the implementation, tokamax style:
  * 'xla'       — the plain-jnp reference (`*/reference.py`), any backend;
  * 'interpret' — the Pallas kernels in interpret mode (CPU; slow, for tests);
  * 'pallas'    — the Pallas kernels compiled for the default backend (GPU);
  * 'triton'    — the GPU-lowerable Pallas Triton kernels (`gmm/triton_gmm.py`,
                  `quant/triton_quant.py`), compiled; 'triton_interpret' runs them on CPU;
  * 'auto'      — 'triton' on a GPU for a kernel that `benchmarks/gpu_kit.py` validated on this
                  device kind under this JAX version (`kernels_pallas.gpu_validation` record),
                  else 'xla' (no record, a failed check, CPU/TPU). On CPU the reference gives the
                  same bits.
"""
from __future__ import annotations

import math
from typing import Optional, Sequence

import jax
import jax.numpy as jnp

from kernels_pallas import gpu_validation
from kernels_pallas.formats import FORMATS, get_format
from kernels_pallas.gmm import ops as gmm_ops
from kernels_pallas.quant import pallas_quant, triton_quant
from kernels_pallas.quant import reference as qref
from kernels_pallas.quant.qarray import QArray

IMPLS = ("auto", "xla", "pallas", "interpret", "triton", "triton_interpret")

_ref_quantize = jax.jit(qref.quantize, static_argnames=("fmt", "axis", "scale_mode", "div", "tile",
                                                         "group_axis"))


def resolve_impl(impl: str, kernel: Optional[str] = None) -> str:
    """The concrete impl for `impl`; 'auto' is 'triton' only when `kernel` (a
    `gpu_validation.KERNELS` name) passed the GPU kit on this device kind, else 'xla'."""
    if impl not in IMPLS:
        raise ValueError(f"impl must be one of {IMPLS}, got {impl!r}")
    if impl != "auto":
        return impl
    if kernel is not None and jax.default_backend() == "gpu" and gpu_validation.validated(kernel):
        return "triton"
    return "xla"


def _triton_quantize(x: jax.Array, fmt: str, ax: int, interpret: bool) -> QArray:
    """`quantize` through `quant/triton_quant.py` (MXFP8 E4M3/E5M2, nvfp4_per_token)."""
    xm = jnp.moveaxis(x, ax, -1)
    lead, k = xm.shape[:-1], xm.shape[-1]
    x2 = xm.reshape(-1, k)
    gs = None
    if fmt in triton_quant.MX_FORMATS:
        d, s = triton_quant.mx_quantize_2d(x2, fmt, interpret=interpret)
        t = (32,)
    else:
        d, s, sd = triton_quant.nvfp4_per_token_quantize_2d(x2, interpret=interpret)
        gs = jnp.moveaxis(sd.reshape(*lead, 1), -1, ax)
        t = (16,)
    d = d.reshape(*lead, d.shape[-1])
    s = s.reshape(*lead, s.shape[-1])
    return QArray(jnp.moveaxis(d, -1, ax), jnp.moveaxis(s, -1, ax), gs, fmt, ax, tuple(x.shape), t)


def quantize(x: jax.Array, fmt: str, axis: int = -1, impl: str = "auto", *,
             scale_mode: str = "rceil", div: str = "exact", tile: Optional[Sequence[int]] = None,
             group_axis: Optional[int] = None) -> QArray:
    """Block-quantise `x` along `axis` into `fmt` (one of `kernels_pallas.formats.FORMATS`).

    Returns a `QArray` with `.data` (uint8 codes; FP4 packed two per byte, even element in the low
    nibble), `.scales` (E8M0/E4M3 bytes, FP32 for fp8_blockwise) and `.global_scale` (NVFP4 FP32
    decode scale: per tensor, per `group_axis` index, or per row for `nvfp4_per_token`).
    All impls give identical bits.
    """
    get_format(fmt)
    tri_ok = fmt in triton_quant.FORMATS and scale_mode == "rceil" and div == "exact"
    impl = resolve_impl(impl, f"quant_{fmt}" if tri_ok else None)
    if impl in ("triton", "triton_interpret"):
        if not tri_ok:
            raise ValueError(f"impl={impl!r} quantises {triton_quant.FORMATS} with scale_mode='rceil', "
                             f"div='exact'; got fmt={fmt!r}, scale_mode={scale_mode!r}, div={div!r}")
        return _triton_quantize(x, fmt, axis % x.ndim, impl == "triton_interpret")
    if impl == "xla":
        return _ref_quantize(x, fmt, axis, scale_mode=scale_mode, div=div,
                             tile=None if tile is None else tuple(tile), group_axis=group_axis)
    interpret = impl == "interpret"
    ax = axis % x.ndim
    if fmt == "fp8_blockwise" and tuple(tile or (1, 128)) == (128, 128):
        if ax not in (x.ndim - 2, x.ndim - 1):
            raise ValueError("128x128 tiles cover the last two axes; axis must be one of them")
        lead = x.shape[:-2]
        x3 = x.reshape(-1, *x.shape[-2:])
        f = lambda a: pallas_quant.fp8_blockwise_quantize_2d(a, (128, 128), div, interpret)
        d, s = jax.vmap(f)(x3)
        return QArray(d.reshape(x.shape), s.reshape(*lead, *s.shape[-2:]), None, fmt, ax,
                      tuple(x.shape), (128, 128))
    xm = jnp.moveaxis(x, ax, -1)
    lead, k = xm.shape[:-1], xm.shape[-1]
    x2 = xm.reshape(-1, k)
    f = get_format(fmt)
    gs = None
    if f.scale == "e8m0":
        d, s = pallas_quant.mx_quantize_2d(x2, fmt, scale_mode, interpret)
        t = (32,)
    elif fmt == "fp8_blockwise":
        d, s = pallas_quant.fp8_blockwise_quantize_2d(x2, (1, 128), div, interpret)
        t = (1, 128)
    else:
        per_row = f.global_scale == "row"
        gamax = None
        if not per_row:
            if group_axis is None:
                gamax = jnp.broadcast_to(jnp.max(jnp.abs(x.astype(jnp.float32))), (x2.shape[0], 1))
            else:
                g = group_axis % x.ndim
                if g == ax:
                    raise ValueError("group_axis must differ from the quantised axis")
                red = tuple(i for i in range(x.ndim) if i != g)
                gm = jnp.max(jnp.abs(x.astype(jnp.float32)), axis=red, keepdims=True)
                gamax = jnp.broadcast_to(jnp.moveaxis(gm, ax, -1), (*lead, 1)).reshape(-1, 1)
        d, s, sd = pallas_quant.nvfp4_quantize_2d(x2, gamax, per_row, div, interpret)
        t = (16,)
        if per_row:
            gs = jnp.moveaxis(sd.reshape(*lead, 1), -1, ax)
        elif group_axis is None:
            gs = sd[:1].reshape((1,) * x.ndim)
        else:
            gs = jnp.moveaxis(sd.reshape(*lead, 1), -1, ax)
            gs = jnp.max(gs, axis=tuple(i for i in range(x.ndim) if i != group_axis % x.ndim),
                         keepdims=True)
    d = d.reshape(*lead, d.shape[-1])
    s = s.reshape(*lead, s.shape[-1])
    return QArray(jnp.moveaxis(d, -1, ax), jnp.moveaxis(s, -1, ax), gs, fmt, ax, tuple(x.shape), t)


def dequantize(q: QArray, dtype=jnp.float32) -> jax.Array:
    """Values of a `QArray` (element x block scale [x global decode scale]) in `dtype`."""
    return qref.dequantize(q, dtype)


def grouped_matmul(lhs: jax.Array, rhs: jax.Array, group_sizes: jax.Array, *, precision: str = "f32",
                   impl: str = "auto") -> jax.Array:
    """Ragged grouped matmul lhs (M, K) [rows sorted by group] x rhs (G, K, N) -> (M, N) in
    lhs.dtype; rows past sum(group_sizes) give zeros (as `jax.lax.ragged_dot`).

    Differentiable in lhs and rhs through `jax.custom_vjp` with the per-precision recipe of
    `kernels_pallas.gmm.ops` (precision in 'f32' | 'bf16' | 'fp8_blockwise' | 'mxfp8' |
    'nvfp4_fwd_mxfp8_bwd'). impl 'xla': the quantisers then ragged_dot on dequantised operands
    (the oracle; the CPU path); 'interpret' / 'pallas': the Pallas grouped-matmul kernels;
    'triton' / 'triton_interpret': the GPU-lowerable Triton kernels; 'auto': 'triton' once the GPU
    kit validated `gmm_<precision>` on this device kind, else 'xla'.
    """
    return gmm_ops.grouped_matmul(lhs, rhs, group_sizes, precision=precision,
                                  impl=resolve_impl(impl, f"gmm_{precision}"))


def moe_expert_matmul(x: jax.Array, w: jax.Array, group_sizes: jax.Array, precision: str = "f32",
                      impl: str = "auto") -> jax.Array:
    """The MoE layer's expert matmul (alias of `grouped_matmul`, positional precision)."""
    return grouped_matmul(x, w, group_sizes, precision=precision, impl=impl)


PRECISIONS = gmm_ops.PRECISIONS

__all__ = ["quantize", "dequantize", "grouped_matmul", "moe_expert_matmul", "QArray", "FORMATS",
           "IMPLS", "PRECISIONS", "resolve_impl"]
