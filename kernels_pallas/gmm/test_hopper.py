"""Hopper scaled-FP8 grouped matmuls (Mosaic GPU) run on CPU through the Mosaic GPU interpreter
(private JAX API; logic test only: no layout/swizzle/resource checks). Oracle: ragged_dot / masked
einsum on the dequantised operands; bound 4 * (K + 3K/bk + 2) * 2^-24 * (|A| @ |B|) (summation
order + one rounding per promotion)."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from kernels_pallas.gmm import groups
from kernels_pallas.gmm.reference import gmm_ref, tgmm_ref
from kernels_pallas import api
from kernels_pallas.quant import reference as qref

interp = pytest.importorskip("jax._src.pallas.mosaic_gpu.interpret.params")
_qz = lambda x, fmt, axis, **kw: api.quantize(x, fmt, axis, impl="xla", **kw)
e4 = lambda c: jax.lax.bitcast_convert_type(c, jnp.float8_e4m3fn)


def _check(out, da, db, gs, k, wgrad=False):
    ref_fn = tgmm_ref if wgrad else gmm_ref
    ref = np.asarray(ref_fn(da, db, gs))
    bound = 4 * (k + 3 * k / 32 + 2) * 2.0 ** -24 * np.asarray(ref_fn(jnp.abs(da), jnp.abs(db), gs))
    err = np.abs(np.asarray(out) - ref)
    assert (err <= bound + 1e-30).all(), err.max()


@pytest.mark.parametrize("recipe", ["fp8_blockwise", pytest.param("mxfp8", marks=pytest.mark.slow)])
def test_hopper_gmm_in_gpu_interpreter(recipe):
    from kernels_pallas.gmm import hopper

    a = jax.random.normal(jax.random.key(0), (128, 256))
    w = jax.random.normal(jax.random.key(1), (3, 256, 128))
    gs = jnp.array([40, 0, 70], jnp.int32)  # empty group, ragged sizes, 18 unused rows
    p = interp.InterpretGPUParams()
    if recipe == "fp8_blockwise":
        qa, qw = _qz(a, "fp8_blockwise", 1), _qz(w, "fp8_blockwise", 1, tile=(128, 128))
        y = hopper.fp8_blockwise_gmm_hopper(e4(qa.data), qa.scales, e4(jnp.swapaxes(qw.data, 1, 2)),
                                            qw.scales, gs, interpret=p)
    else:
        qa, qw = _qz(a, "mxfp8_e4m3", 1), _qz(w, "mxfp8_e4m3", 1)
        y = hopper.mxfp8_gmm_hopper(e4(qa.data), qa.scales, e4(jnp.swapaxes(qw.data, 1, 2)), qw.scales,
                                    gs, interpret=p)
    _check(y, qref.dequantize(qa), qref.dequantize(qw), gs, 256)
    assert (np.asarray(y)[110:] == 0).all()


@pytest.mark.parametrize("recipe", [pytest.param("fp8_blockwise", marks=pytest.mark.slow), "mxfp8"])
def test_hopper_wgrad_in_gpu_interpreter(recipe):
    from kernels_pallas.gmm import hopper

    x = jax.random.normal(jax.random.key(0), (128, 128))
    dy = jax.random.normal(jax.random.key(1), (128, 128))
    gs = jnp.array([40, 0, 70], jnp.int32)
    align, fmt = (128, "fp8_blockwise") if recipe == "fp8_blockwise" else (32, "mxfp8_e4m3")
    xp, pgs, _ = groups.pad_groups(x, gs, align, 128)
    dp, _, _ = groups.pad_groups(dy, gs, align, 128)
    qx, qd = _qz(xp, fmt, 0), _qz(dp, fmt, 0)
    f = hopper.fp8_blockwise_tgmm_hopper if recipe == "fp8_blockwise" else hopper.mxfp8_tgmm_hopper
    dw = f(e4(qx.data.T), qx.scales, e4(qd.data.T), qd.scales, pgs, interpret=interp.InterpretGPUParams())
    _check(dw, qref.dequantize(qx), qref.dequantize(qd), pgs, xp.shape[0], wgrad=True)
    assert (np.asarray(dw)[1] == 0).all()


@pytest.mark.slow
def test_hopper_nvfp4_forward_in_gpu_interpreter():
    """BF16 output: bound adds half a BF16 ulp of the output to the FP32 summation bound."""
    from kernels_pallas.gmm import hopper

    a = jax.random.normal(jax.random.key(0), (128, 128))
    w = jax.random.normal(jax.random.key(1), (3, 128, 64))
    gs = jnp.array([40, 0, 70], jnp.int32)
    qa = _qz(a, "nvfp4_per_token", 1)
    qw = _qz(w, "nvfp4", 1, group_axis=0)
    y = hopper.nvfp4_gmm_hopper(qa.data, qa.scales, qa.global_scale, qw.data, qw.scales, qw.global_scale,
                                gs, interpret=interp.InterpretGPUParams())
    da, dw = qref.dequantize(qa), qref.dequantize(qw)
    ref = np.asarray(gmm_ref(da, dw, gs))
    mag = np.asarray(gmm_ref(jnp.abs(da), jnp.abs(dw), gs))
    err = np.abs(np.asarray(y) - ref)
    assert (err <= 4 * 140 * 2.0 ** -24 * mag + 2.0 ** -8 * np.abs(ref) * 1.01 + 1e-30).all(), err.max()
    assert (np.asarray(y)[110:] == 0).all()
