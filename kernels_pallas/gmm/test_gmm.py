"""Grouped-matmul tests: schedule/padding bookkeeping, each Pallas kernel kind (interpret mode) vs
`ragged_dot` / masked einsum on the dequantised operands, and the custom_vjp recipes.

Tolerances: f32 paths <= 1e-5 relative. Quantised kernels get the same quantised inputs as the
oracle, so they differ only by FP32 summation order (and, for fp8bw, one extra rounding per
128-chunk promotion): |out - ref| <= 4 * (K + 3 K/128) * 2^-24 * (|A| @ |B|) elementwise
(kernels.md 2.7 with c = 4).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from kernels_pallas.gmm import groups, ops, pallas_gmm
from kernels_pallas.gmm.reference import gmm_ref, tgmm_ref
from kernels_pallas import api
from kernels_pallas.quant import reference as qref

def _qz(x, fmt, axis, **kw):
    """Jitted reference quantiser (eager dispatch of the bit arithmetic is slow)."""
    return api.quantize(x, fmt, axis, impl="xla", **kw)


GS = np.array([30, 0, 41, 3, 20], np.int32)  # empty group, sizes not multiples of any tile, 34 unused rows


def _bound(a_abs, b_abs, gs, k, wgrad=False):
    mag = tgmm_ref(a_abs, b_abs, gs) if wgrad else gmm_ref(a_abs, b_abs, gs)
    return 4 * (k + 3 * k / 128 + 2) * 2.0 ** -24 * np.asarray(mag) + 1e-30


def _data(m=128, k=256, n=128, g=5, seed=0):
    ka, kw, kd = jax.random.split(jax.random.key(seed), 3)
    return (jax.random.normal(ka, (m, k)), jax.random.normal(kw, (g, k, n)) * 0.1,
            jax.random.normal(kd, (m, n)))


# ------------------------------------------------------------------ bookkeeping
def test_tile_schedule_covers_each_tile_group_pair_once():
    gs = jnp.asarray(GS)
    grp, tile, first, last = map(np.asarray, groups.tile_schedule(gs, 128, 32))
    starts, ends = np.cumsum(GS) - GS, np.cumsum(GS)
    want = {(t, g) for g in range(len(GS)) for t in range(4)
            if GS[g] and starts[g] < (t + 1) * 32 and ends[g] > t * 32}
    total = len(want)
    assert {(t, g) for t, g in zip(tile[:total], grp[:total])} == want and len(set(zip(tile, grp))) == total
    assert first[:total].sum() == len({t for t, _ in want}) and last.sum() == (GS > 0).sum()


def test_pad_groups_aligns_and_round_trips():
    x = jnp.arange(128 * 3, dtype=jnp.float32).reshape(128, 3) + 1
    xp, pgs, src = groups.pad_groups(x, jnp.asarray(GS), 32)
    assert xp.shape[0] == groups.padded_size(128, 5, 32) and xp.shape[0] % 32 == 0
    np.testing.assert_array_equal(np.asarray(pgs), [32, 0, 64, 32, 32])
    starts = np.cumsum(pgs) - pgs
    for g in range(5):
        np.testing.assert_array_equal(np.asarray(xp[starts[g]:starts[g] + GS[g]]),
                                      np.asarray(x[GS[:g].sum():GS[:g].sum() + GS[g]]))
    np.testing.assert_array_equal(np.asarray(groups.unpad_groups(xp, src, 128))[:GS.sum()],
                                  np.asarray(x)[:GS.sum()])


# ------------------------------------------------------------------ kernels (interpret) vs oracle
def test_gmm_plain_f32_matches_ragged_dot():
    a, w, _ = _data()
    gs = jnp.asarray(GS)
    y = pallas_gmm.gmm((a,), (w,), gs, kind="plain", m=128, k=256, n=128, tm=32, tk=128)
    ref = gmm_ref(a, w, gs)
    np.testing.assert_allclose(np.asarray(y), np.asarray(ref), rtol=1e-5, atol=1e-5 * float(jnp.abs(ref).max()))
    assert (np.asarray(y)[GS.sum():] == 0).all()


@pytest.mark.parametrize("kind", ["mx", "nvfp4", "fp8bw"])
def test_gmm_quantised_kinds_match_dequantised_ragged_dot(kind):
    a, w, _ = _data()
    gs = jnp.asarray(GS)
    e4 = lambda c: jax.lax.bitcast_convert_type(c, jnp.float8_e4m3fn)
    if kind == "mx":
        qa, qw = _qz(a, "mxfp8_e4m3", 1), _qz(w, "mxfp8_e4m3", 1)
        lo, ro = (e4(qa.data), qa.scales), (e4(qw.data), qw.scales)
    elif kind == "nvfp4":
        qa, qw = _qz(a, "nvfp4_per_token", 1), _qz(w, "nvfp4", 1, group_axis=0)
        lo = (qa.data, e4(qa.scales), qa.global_scale)
        ro = (qw.data, e4(qw.scales), qw.global_scale)
    else:
        qa, qw = _qz(a, "fp8_blockwise", 1), _qz(w, "fp8_blockwise", 1, tile=(128, 128))
        lo, ro = (e4(qa.data), qa.scales), (e4(qw.data), qw.scales)
    y = pallas_gmm.gmm(lo, ro, gs, kind=kind, m=128, k=256, n=128, tm=32, tk=256)
    da, dw = qref.dequantize(qa), qref.dequantize(qw)
    ref = np.asarray(gmm_ref(da, dw, gs))
    err = np.abs(np.asarray(y) - ref)
    assert (err <= _bound(jnp.abs(da), jnp.abs(dw), gs, 256)).all(), err.max()


@pytest.mark.parametrize("kind", ["plain", "mx", "fp8bw"])
def test_tgmm_kinds_match_masked_einsum(kind):
    a, _, dy = _data()
    gs = jnp.asarray(GS)
    e4 = lambda c: jax.lax.bitcast_convert_type(c, jnp.float8_e4m3fn)
    if kind == "plain":
        dw = pallas_gmm.tgmm((a,), (dy,), gs, kind="plain", m=128, k=256, n=128, tm=32)
        ref = tgmm_ref(a, dy, gs)
        np.testing.assert_allclose(np.asarray(dw), np.asarray(ref), rtol=1e-5, atol=1e-4)
        assert (np.asarray(dw)[1] == 0).all()  # empty group
        return
    align = 32 if kind == "mx" else 128
    xp, pgs, _ = groups.pad_groups(a, gs, align, 128)
    dp, _, _ = groups.pad_groups(dy, gs, align, 128)
    fmt = "mxfp8_e4m3" if kind == "mx" else "fp8_blockwise"
    qx, qd = _qz(xp, fmt, 0), _qz(dp, fmt, 0)
    dw = pallas_gmm.tgmm((e4(qx.data), qx.scales), (e4(qd.data), qd.scales), pgs, kind=kind,
                         m=xp.shape[0], k=256, n=128, tm=128)
    dx, dd = qref.dequantize(qx), qref.dequantize(qd)
    ref = np.asarray(tgmm_ref(dx, dd, pgs))
    err = np.abs(np.asarray(dw) - ref)
    assert (err <= _bound(jnp.abs(dx), jnp.abs(dd), pgs, int(GS.max()) + 128, wgrad=True)).all(), err.max()
    assert (np.asarray(dw)[1] == 0).all()


# ------------------------------------------------------------------ custom_vjp recipes
def _loss(a, w, dy, gs, precision, impl):
    return jnp.sum(ops.grouped_matmul(a, w, gs, precision=precision, impl=impl) * dy)


_grad = jax.jit(jax.grad(_loss, (0, 1)), static_argnames=("precision", "impl"))


def test_f32_recipe_gradients_equal_autodiff_of_ragged_dot():
    a, w, dy = _data(96, 64, 128, 5)
    gs = jnp.asarray([30, 0, 41, 3, 20], jnp.int32)
    got = _grad(a, w, dy, gs, precision="f32", impl="interpret")
    want = jax.grad(lambda a, w: jnp.sum(gmm_ref(a, w, gs) * dy), (0, 1))(a, w)
    for g, r in zip(got, want):
        np.testing.assert_allclose(np.asarray(g), np.asarray(r), rtol=1e-5, atol=1e-5 * float(jnp.abs(r).max()))


@pytest.mark.parametrize("precision", [pytest.param("bf16", marks=pytest.mark.slow), "mxfp8",
                                       pytest.param("fp8_blockwise", marks=pytest.mark.slow),
                                       pytest.param("nvfp4_fwd_mxfp8_bwd", marks=pytest.mark.slow)])
def test_recipe_interpret_equals_xla_oracle(precision):
    """Same quantisation, kernels vs dequantised oracle: forward and both gradients agree to
    FP32-summation-order error (1e-5 of the output scale)."""
    a, w, dy = _data(96, 64, 128, 4, seed=1)
    gs = jnp.asarray([30, 0, 41, 20], jnp.int32)
    y_x = jax.jit(lambda a, w: ops.grouped_matmul(a, w, gs, precision=precision, impl="xla"))(a, w)
    y_i = jax.jit(lambda a, w: ops.grouped_matmul(a, w, gs, precision=precision, impl="interpret"))(a, w)
    np.testing.assert_allclose(np.asarray(y_i), np.asarray(y_x), atol=1e-5 * float(jnp.abs(y_x).max()))
    for g_i, g_x in zip(_grad(a, w, dy, gs, precision=precision, impl="interpret"),
                        _grad(a, w, dy, gs, precision=precision, impl="xla")):
        np.testing.assert_allclose(np.asarray(g_i), np.asarray(g_x), atol=1e-5 * float(jnp.abs(g_x).max()))


@pytest.mark.parametrize("precision,min_cos,max_rel", [
    pytest.param("bf16", 0.9999, 0.01, marks=pytest.mark.slow),
    pytest.param("fp8_blockwise", 0.99, 0.06, marks=pytest.mark.slow),
    ("mxfp8", 0.99, 0.06), ("nvfp4_fwd_mxfp8_bwd", 0.97, 0.2)])
def test_recipe_gradients_close_to_f32(precision, min_cos, max_rel):
    a, w, dy = _data(96, 64, 128, 4, seed=2)
    gs = jnp.asarray([30, 0, 41, 20], jnp.int32)
    ref = _grad(a, w, dy, gs, precision="f32", impl="xla")
    got = _grad(a, w, dy, gs, precision=precision, impl="xla")
    for g, r in zip(got, ref):
        cos = float(jnp.sum(g * r) / (jnp.linalg.norm(g) * jnp.linalg.norm(r)))
        assert cos >= min_cos
    y = jax.jit(lambda a, w: ops.grouped_matmul(a, w, gs, precision=precision, impl="xla"))(a, w)
    y32 = gmm_ref(a, w, gs)
    assert float(jnp.linalg.norm(y - y32) / jnp.linalg.norm(y32)) < max_rel


def test_bad_arguments_raise():
    a, w, _ = _data(32, 64, 32, 2)
    with pytest.raises(ValueError, match="precision"):
        ops.grouped_matmul(a, w, jnp.array([16, 16]), precision="fp16")
    with pytest.raises(ValueError, match="expects lhs"):
        ops.grouped_matmul(a, w, jnp.array([16, 16, 0]))
    with pytest.raises(ValueError, match="impl"):
        ops.grouped_matmul(a, w, jnp.array([16, 16]), impl="triton")
