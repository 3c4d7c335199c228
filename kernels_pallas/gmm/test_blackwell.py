"""Blackwell scale layout and block-scaled MMA emulation (CPU): swizzle == torchao `to_blocked`,
address formula == permutation, emulated MMA == GEMM of the dequantised operands."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from kernels_pallas import api
from kernels_pallas.gmm import blackwell
from kernels_pallas.quant import reference as qref


def test_swizzle_round_trip_and_address_formula():
    s = jnp.asarray(np.random.default_rng(0).integers(0, 255, (200, 7)), jnp.uint8)
    flat = blackwell.swizzle_scales(s)
    assert flat.shape == (2 * 2 * 512,)
    np.testing.assert_array_equal(np.asarray(blackwell.unswizzle_scales(flat, 200, 7)), np.asarray(s))
    r, c = np.meshgrid(np.arange(200), np.arange(7), indexing="ij")
    np.testing.assert_array_equal(np.asarray(flat)[np.asarray(blackwell.swizzled_offset(r, c, 7))], np.asarray(s))


def test_swizzle_matches_torchao_to_blocked():
    torch = pytest.importorskip("torch")
    from torchao.prototype.mx_formats.utils import to_blocked

    s = np.random.default_rng(1).integers(0, 255, (300, 10)).astype(np.uint8)
    want = to_blocked(torch.from_numpy(s)).numpy()
    np.testing.assert_array_equal(np.asarray(blackwell.swizzle_scales(jnp.asarray(s))), want)


@pytest.mark.parametrize("kind,fmt", [("mxf8f6f4", "mxfp8_e4m3"), ("mxf4", "mxfp4"), ("mxf4nvf4", "nvfp4")])
def test_block_scaled_mma_emulation_matches_dequantised_gemm(kind, fmt):
    a = jax.random.normal(jax.random.key(0), (136, 128))
    b = jax.random.normal(jax.random.key(1), (72, 128))
    qa, qb = api.quantize(a, fmt, 1, impl="xla"), api.quantize(b, fmt, 1, impl="xla")
    elem = qref.get_format(fmt).elem
    av = qref.elem_values(qref.codes_of(qa), elem)
    bv = qref.elem_values(qref.codes_of(qb), elem)
    alpha = 1.0 if qa.global_scale is None else qa.global_scale.reshape(()) * qb.global_scale.reshape(())
    d = blackwell.block_scaled_mma_emulated(av, blackwell.swizzle_scales(qa.scales), bv,
                                            blackwell.swizzle_scales(qb.scales), kind, alpha)
    ref = qref.dequantize(qa) @ qref.dequantize(qb).T
    mag = jnp.abs(qref.dequantize(qa)) @ jnp.abs(qref.dequantize(qb)).T
    assert bool(jnp.all(jnp.abs(d - ref) <= 4 * 130 * 2.0 ** -24 * mag + 1e-30))


def test_capability_check_refuses_non_blackwell():
    with pytest.raises(NotImplementedError, match="sm_100"):
        blackwell.require_sm100()
