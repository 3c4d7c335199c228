"""Hopper FP8-blockwise grouped matmul (Mosaic GPU) run on CPU through the Mosaic GPU interpreter
(private JAX API; logic test only: no layout/swizzle/resource checks). Oracle: ragged_dot on the
dequantised operands; bound 4 * (K + 3K/128 + 2) * 2^-24 * (|A| @ |B|) (summation order + one
rounding per promotion)."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from kernels_pallas.gmm.reference import gmm_ref
from kernels_pallas.quant import reference as qref

interp = pytest.importorskip("jax._src.pallas.mosaic_gpu.interpret.params")


def test_hopper_fp8_blockwise_gmm_in_gpu_interpreter():
    from kernels_pallas.gmm.hopper import fp8_blockwise_gmm_hopper

    m, k, n = 128, 256, 128
    a = jax.random.normal(jax.random.key(0), (m, k))
    w = jax.random.normal(jax.random.key(1), (3, k, n))
    gs = jnp.array([40, 0, 70], jnp.int32)  # empty group, ragged sizes, 18 unused rows
    qa = qref.quantize(a, "fp8_blockwise", 1)
    qw = qref.quantize(w, "fp8_blockwise", 1, tile=(128, 128))
    e4 = lambda c: jax.lax.bitcast_convert_type(c, jnp.float8_e4m3fn)
    y = fp8_blockwise_gmm_hopper(e4(qa.data), qa.scales, e4(jnp.swapaxes(qw.data, 1, 2)), qw.scales, gs,
                                 interpret=interp.InterpretGPUParams())
    da, dw = qref.dequantize(qa), qref.dequantize(qw)
    ref = np.asarray(gmm_ref(da, dw, gs))
    bound = 4 * (k + 3 * k / 128 + 2) * 2.0 ** -24 * np.asarray(gmm_ref(jnp.abs(da), jnp.abs(dw), gs))
    err = np.abs(np.asarray(y) - ref)
    assert (err <= bound + 1e-30).all(), err.max()
    assert (np.asarray(y)[110:] == 0).all()


def test_hopper_fp8_blockwise_wgrad_in_gpu_interpreter():
    from kernels_pallas.gmm import groups
    from kernels_pallas.gmm.hopper import fp8_blockwise_tgmm_hopper
    from kernels_pallas.gmm.reference import tgmm_ref

    x = jax.random.normal(jax.random.key(0), (128, 128))
    dy = jax.random.normal(jax.random.key(1), (128, 128))
    gs = jnp.array([40, 0, 70], jnp.int32)
    xp, pgs, _ = groups.pad_groups(x, gs, 128)
    dp, _, _ = groups.pad_groups(dy, gs, 128)
    qx, qd = qref.quantize(xp, "fp8_blockwise", 0), qref.quantize(dp, "fp8_blockwise", 0)
    e4 = lambda c: jax.lax.bitcast_convert_type(c, jnp.float8_e4m3fn)
    dw = fp8_blockwise_tgmm_hopper(e4(qx.data.T), qx.scales, e4(qd.data.T), qd.scales, pgs,
                                   interpret=interp.InterpretGPUParams())
    dx, dd = qref.dequantize(qx), qref.dequantize(qd)
    ref = np.asarray(tgmm_ref(dx, dd, pgs))
    kk = 128 + 2 * 128
    bound = 4 * (kk + 3 * kk / 128 + 2) * 2.0 ** -24 * np.asarray(tgmm_ref(jnp.abs(dx), jnp.abs(dd), pgs))
    err = np.abs(np.asarray(dw) - ref)
    assert (err <= bound + 1e-30).all(), err.max()
    assert (np.asarray(dw)[1] == 0).all()
