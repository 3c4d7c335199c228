"""`grouped_matmul` with a per-precision forward/backward recipe through `jax.custom_vjp`.

y = ragged_dot(lhs, rhs, group_sizes): lhs (M, K) rows sorted by expert, rhs (G, K, N).
Every quantisation starts from the high-precision source (never re-quantises a dequantised
tensor) and blocks run along the contraction axis of the GEMM that consumes them:

| precision            | fprop (x, w)                                | dgrad dY W^T (dY, W)     | wgrad X^T dY (X, dY)                 |
|----------------------|---------------------------------------------|--------------------------|--------------------------------------|
| f32 / bf16           | operands cast, FP32 accumulate              | same                     | same                                 |
| fp8_blockwise        | x 1x128 along K, w 128x128                  | dY 1x128 along N, W 128x128 | x, dY 128x1 along tokens (groups padded to 128) |
| mxfp8                | x, w MXFP8 E4M3 along K                     | dY, W MXFP8 along N      | x, dY MXFP8 along tokens (groups padded to 32) |
| nvfp4_fwd_mxfp8_bwd  | x nvfp4_per_token along K; w NVFP4 1x16 along K with one FP32 scale per expert | as mxfp8 | as mxfp8 |

Gradients are straight-through (quantisation is treated as identity in the backward). The
group_sizes input gets no gradient. `impl='xla'` runs the same quantisers and then
`jax.lax.ragged_dot` / a masked einsum on the dequantised operands (the oracle, and the CPU
path); 'interpret' / 'pallas' run `pallas_gmm` kernels (on a GPU, 'pallas' routes the FP8 GEMMs to
the Mosaic GPU kernels of `hopper.py`); 'triton' / 'triton_interpret' run the GPU-lowerable
`triton_gmm` kernels (compiled, or in interpret mode on CPU) for f32 / bf16 / fp8_blockwise / mxfp8
(the NVFP4 forward of `nvfp4_fwd_mxfp8_bwd` has no Triton kernel and takes the reference path). Contraction and output axes are zero-padded
to the block sizes the recipe needs (exact: zero blocks contribute nothing).
"""
from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp

from kernels_pallas.gmm import groups, pallas_gmm, triton_gmm
from kernels_pallas.gmm.reference import gmm_ref, tgmm_ref
from kernels_pallas.quant import reference as qref

TRITON_IMPLS = ("triton", "triton_interpret")
GMM_IMPLS = ("xla", "interpret", "pallas") + TRITON_IMPLS
_TM = 64


def _pad_axis(x, axis, mult):
    pad = (-x.shape[axis]) % mult
    if not pad:
        return x
    widths = [(0, 0)] * x.ndim
    widths[axis] = (0, pad)
    return jnp.pad(x, widths)


def _e4m3(codes):
    return jax.lax.bitcast_convert_type(codes, jnp.float8_e4m3fn)


def _q(x, fmt, axis, **kw):
    return qref.quantize(x, fmt, axis, **kw)


def _triton_gmm(lhs_ops, rhs_ops, gs, kind, impl):
    """Forward/dgrad through `triton_gmm.gmm`: plain K and plain/mx N padded to 16 (zeros, exact),
    tiles shrunk to divide K and N."""
    n = rhs_ops[0].shape[2]
    if kind == "plain":
        lhs_ops = (_pad_axis(lhs_ops[0], 1, 16),)
        rhs_ops = (_pad_axis(rhs_ops[0], 1, 16),)
    if kind in ("plain", "mx"):
        rhs_ops = tuple(_pad_axis(o, 2, 16) for o in rhs_ops)
    k, np_ = lhs_ops[0].shape[1], rhs_ops[0].shape[2]
    cfg = triton_gmm.fit_config(triton_gmm.GMM_DEFAULTS[kind], k, np_,
                                k_min={"plain": 16, "mx": 32, "fp8bw": 128}[kind])
    kmajor = kind == "fp8bw"  # FP8 wgmma reads K-major operands: pass the transposed weight copy
    if kmajor:
        rhs_ops = (jnp.swapaxes(rhs_ops[0], 1, 2),) + tuple(rhs_ops[1:])
    out = triton_gmm.gmm(lhs_ops, rhs_ops, gs, kind=kind, config=cfg, interpret=impl == "triton_interpret",
                         rhs_kmajor=kmajor)
    return out[:, :n]


def _triton_tgmm(x_ops, dy_ops, gs, kind, impl):
    """Wgrad through `triton_gmm.tgmm`: K and N (last axes of every operand) padded to 16."""
    k, n = x_ops[0].shape[1], dy_ops[0].shape[1]
    x_ops = tuple(_pad_axis(o, 1, 16) for o in x_ops)
    dy_ops = tuple(_pad_axis(o, 1, 16) for o in dy_ops)
    cfg = triton_gmm.fit_config(triton_gmm.TGMM_DEFAULTS[kind], x_ops[0].shape[1], dy_ops[0].shape[1])
    out = triton_gmm.tgmm(x_ops, dy_ops, gs, kind=kind, config=cfg, interpret=impl == "triton_interpret")
    return out[:, :k, :n]


# ------------------------------------------------------------------ one GEMM per role
# Forward-style GEMM a (M,K) @ w[g] (G,K,N) per recipe family, registered by family name.
def _plain_gemm(dt):
    def gemm(a, w, gs, impl):
        m, k = a.shape
        a, w = a.astype(dt), w.astype(dt)
        if impl == "xla":
            return jax.lax.ragged_dot(a, w, gs, preferred_element_type=jnp.float32,
                                      precision=jax.lax.Precision.HIGHEST)
        if impl in TRITON_IMPLS:
            return _triton_gmm((a,), (w,), gs, "plain", impl)
        return _kernel_gmm((a,), (w,), gs, "plain", m, k, w.shape[2], impl)
    return gemm


def _fp8bw_gemm(a, w, gs, impl):
    m, k = a.shape
    qa = _q(a, "fp8_blockwise", 1)
    qw = _q(w, "fp8_blockwise", 1, tile=(128, 128))
    if impl == "xla":
        return gmm_ref(qref.dequantize(qa), qref.dequantize(qw), gs)
    if impl in TRITON_IMPLS:
        return _triton_gmm((_e4m3(qa.data), qa.scales), (_e4m3(qw.data), qw.scales), gs, "fp8bw", impl)
    if impl == "pallas" and jax.default_backend() == "gpu":  # Hopper wgmma kernel (hopper.py)
        from kernels_pallas.gmm.hopper import fp8_blockwise_gmm_hopper
        return fp8_blockwise_gmm_hopper(_e4m3(qa.data), qa.scales, _e4m3(jnp.swapaxes(qw.data, 1, 2)),
                                        qw.scales, gs)
    return _kernel_gmm((_e4m3(qa.data), qa.scales), (_e4m3(qw.data), qw.scales), gs, "fp8bw",
                       m, k, w.shape[2], impl)


def _mx_gemm(a, w, gs, impl):
    m, k = a.shape
    qa = _q(a, "mxfp8_e4m3", 1)
    qw = _q(w, "mxfp8_e4m3", 1)
    if impl == "xla":
        return gmm_ref(qref.dequantize(qa), qref.dequantize(qw), gs)
    if impl in TRITON_IMPLS:
        return _triton_gmm((_e4m3(qa.data), qa.scales), (_e4m3(qw.data), qw.scales), gs, "mx", impl)
    if impl == "pallas" and jax.default_backend() == "gpu":  # Hopper wgmma kernel (hopper.py)
        from kernels_pallas.gmm.hopper import mxfp8_gmm_hopper
        return mxfp8_gmm_hopper(_e4m3(qa.data), qa.scales, _e4m3(jnp.swapaxes(qw.data, 1, 2)),
                                qw.scales, gs)
    return _kernel_gmm((_e4m3(qa.data), qa.scales), (_e4m3(qw.data), qw.scales), gs, "mx",
                       m, k, w.shape[2], impl)


def _nvfp4_gemm(a, w, gs, impl):
    m, k = a.shape
    qa = _q(a, "nvfp4_per_token", 1)
    qw = _q(w, "nvfp4", 1, group_axis=0)
    if impl == "xla" or impl in TRITON_IMPLS:  # no Triton NVFP4 kernel: the reference path
        return gmm_ref(qref.dequantize(qa), qref.dequantize(qw), gs)
    if impl == "pallas" and jax.default_backend() == "gpu":  # Hopper: BF16 wgmma (hopper.py)
        from kernels_pallas.gmm.hopper import nvfp4_gmm_hopper
        return nvfp4_gmm_hopper(qa.data, qa.scales, qa.global_scale, qw.data, qw.scales,
                                qw.global_scale, gs)
    return _kernel_gmm((qa.data, _e4m3(qa.scales), qa.global_scale),
                       (qw.data, _e4m3(qw.scales), qw.global_scale), gs, "nvfp4", m, k, w.shape[2], impl)


FPROP_GEMMS = {  # recipe family -> gemm(a, w, group_sizes, impl) -> (M, N) f32
    "plain32": _plain_gemm(jnp.float32),
    "plain16": _plain_gemm(jnp.bfloat16),
    "fp8bw": _fp8bw_gemm,
    "mx": _mx_gemm,
    "nvfp4": _nvfp4_gemm,
}


def _fwd_gemm(a, w, gs, family, impl):
    """a (M,K) @ w[g] (G,K,N) under a recipe family (a `FPROP_GEMMS` name)."""
    return FPROP_GEMMS[family](a, w, gs, impl)


def _no_gpu_kernel(what: str):
    if jax.default_backend() == "gpu":
        raise NotImplementedError(
            f"impl='pallas' has no GPU kernel for {what} yet (Hopper kernels exist for the "
            "fp8_blockwise and MXFP8 GEMMs only, gmm/hopper.py); use impl='xla'")


def _kernel_gmm(lhs_ops, rhs_ops, gs, kind, m, k, n, impl):
    if impl == "pallas":
        _no_gpu_kernel(f"the '{kind}' grouped matmul")
    mp = -(-m // _TM) * _TM if m > _TM else m
    if mp != m:
        lhs_ops = tuple(_pad_axis(o, 0, _TM) for o in lhs_ops)
    tk = k if k <= 512 else 256
    tn = n if n <= 256 else 128
    out = pallas_gmm.gmm(lhs_ops, rhs_ops, gs, kind=kind, m=mp, k=k, n=n, tm=_TM, tk=tk, tn=tn,
                         interpret=impl == "interpret")
    return out[:m]


def _wgrad_gemm(x, dy, gs, family, impl):
    """x^T dy per group -> (G, K, N) f32."""
    m, k = x.shape
    n = dy.shape[1]
    if family in ("plain32", "plain16"):
        dt = jnp.float32 if family == "plain32" else jnp.bfloat16
        x, dy = x.astype(dt), dy.astype(dt)
        if impl == "xla":
            return tgmm_ref(x, dy, gs)
        if impl in TRITON_IMPLS:
            return _triton_tgmm((x,), (dy,), gs, "plain", impl)
        if impl == "pallas":
            _no_gpu_kernel("the plain wgrad")
        mp = -(-m // _TM) * _TM if m > _TM else m
        return pallas_gmm.tgmm((_pad_axis(x, 0, _TM),), (_pad_axis(dy, 0, _TM),), gs, kind="plain",
                               m=mp, k=k, n=n, tm=_TM, tk=min(k, 128), tn=min(n, 128),
                               interpret=impl == "interpret")
    align = 128 if family == "fp8bw" else 32
    tm = 128 if family == "fp8bw" else _TM
    xp, pgs, _ = groups.pad_groups(x, gs, align, tm)
    dyp, _, _ = groups.pad_groups(dy, gs, align, tm)
    fmt = "fp8_blockwise" if family == "fp8bw" else "mxfp8_e4m3"
    qx, qd = _q(xp, fmt, 0), _q(dyp, fmt, 0)
    if impl == "xla":
        return tgmm_ref(qref.dequantize(qx), qref.dequantize(qd), pgs)
    kind = "fp8bw" if family == "fp8bw" else "mx"
    if impl in TRITON_IMPLS:
        return _triton_tgmm((_e4m3(qx.data), qx.scales), (_e4m3(qd.data), qd.scales), pgs, kind, impl)
    if impl == "pallas" and jax.default_backend() == "gpu":  # Hopper kernels, transposed FP8 copies
        from kernels_pallas.gmm import hopper
        f = hopper.fp8_blockwise_tgmm_hopper if kind == "fp8bw" else hopper.mxfp8_tgmm_hopper
        return f(_e4m3(qx.data.T), qx.scales, _e4m3(qd.data.T), qd.scales, pgs)
    if impl == "pallas":
        _no_gpu_kernel(f"the '{kind}' wgrad")
    return pallas_gmm.tgmm((_e4m3(qx.data), qx.scales), (_e4m3(qd.data), qd.scales), pgs, kind=kind,
                           m=xp.shape[0], k=k, n=n, tm=tm, tk=min(k, 128), tn=min(n, 128),
                           interpret=impl == "interpret")


@dataclasses.dataclass(frozen=True)
class Recipe:
    """A precision's GEMM family per role (`FPROP_GEMMS` names; wgrad: plain or block-quantised)
    and the contraction-axis alignment its blocks need."""

    fprop: str
    dgrad: str
    wgrad: str
    align: int


# The registry of precisions: `grouped_matmul(precision=...)` accepts exactly these names.
RECIPES: dict[str, Recipe] = {
    "f32": Recipe("plain32", "plain32", "plain32", 1),
    "bf16": Recipe("plain16", "plain16", "plain16", 1),
    "fp8_blockwise": Recipe("fp8bw", "fp8bw", "fp8bw", 128),
    "mxfp8": Recipe("mx", "mx", "mx", 32),
    "nvfp4_fwd_mxfp8_bwd": Recipe("nvfp4", "mx", "mx", 32),
}
PRECISIONS = tuple(RECIPES)


# ------------------------------------------------------------------ custom_vjp
@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4))
def _gmm_vjp(lhs, rhs, group_sizes, precision, impl):
    return _forward(lhs, rhs, group_sizes, precision, impl)


def _forward(lhs, rhs, gs, precision, impl):
    recipe = RECIPES[precision]
    k, n = lhs.shape[1], rhs.shape[2]
    a = _pad_axis(lhs, 1, recipe.align)
    w = _pad_axis(_pad_axis(rhs, 1, recipe.align), 2, 128 if recipe.fprop == "fp8bw" else 1)
    y = _fwd_gemm(a, w, gs, recipe.fprop, impl)
    return y[:, :n].astype(lhs.dtype)


def _gmm_fwd(lhs, rhs, group_sizes, precision, impl):
    return _forward(lhs, rhs, group_sizes, precision, impl), (lhs, rhs, group_sizes)


def _gmm_bwd(precision, impl, res, dy):
    lhs, rhs, gs = res
    recipe = RECIPES[precision]
    dfam, wfam, align = recipe.dgrad, recipe.wgrad, recipe.align
    m, k = lhs.shape
    n = rhs.shape[2]
    # dgrad: dX = dY @ W^T, contraction over N
    d = _pad_axis(dy, 1, align)
    wt = _pad_axis(_pad_axis(jnp.swapaxes(rhs, 1, 2), 1, align), 2, 128 if dfam == "fp8bw" else 1)
    dx = _fwd_gemm(d, wt, gs, dfam, impl)[:, :k]
    # wgrad: dW[g] = X_g^T dY_g, contraction over the tokens of each group
    kpad = 128 if wfam == "fp8bw" else 1
    dw = _wgrad_gemm(_pad_axis(lhs, 1, kpad), _pad_axis(dy, 1, kpad), gs, wfam, impl)[:, :k, :n]
    return dx.astype(lhs.dtype), dw.astype(rhs.dtype), None


_gmm_vjp.defvjp(_gmm_fwd, _gmm_bwd)


def grouped_matmul(lhs: jax.Array, rhs: jax.Array, group_sizes: jax.Array, *, precision: str = "f32",
                   impl: str = "xla") -> jax.Array:
    """Ragged grouped matmul (M, K) x (G, K, N) -> (M, N) in `lhs.dtype`, differentiable in lhs and
    rhs with the recipe of `precision` (module docstring). impl: one of `GMM_IMPLS`."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS}, got {precision!r}")
    if impl not in GMM_IMPLS:
        raise ValueError(f"impl must be one of {GMM_IMPLS}, got {impl!r}")
    if lhs.ndim != 2 or rhs.ndim != 3 or lhs.shape[1] != rhs.shape[1] or group_sizes.shape != (rhs.shape[0],):
        raise ValueError(f"grouped_matmul expects lhs (M,K), rhs (G,K,N), group_sizes (G,); got "
                         f"{lhs.shape}, {rhs.shape}, {group_sizes.shape}")
    return _gmm_vjp(lhs, rhs, group_sizes.astype(jnp.int32), precision, impl)
