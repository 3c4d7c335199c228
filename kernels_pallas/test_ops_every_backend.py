"""One base test per op, run by every CPU-runnable backend (tokamax's pattern).

Each backend class only names its `impl`; the checks live once in the base class, so a new backend
(or a new precision) is covered by adding one line. The reference is always `impl="xla"` (the pure
jnp path); GPU-only impls ('pallas' Mosaic GPU, 'triton') are checked by benchmarks/gpu_kit.sh on a
GPU, and by lowering tests on CPU (tests/kernels_pallas/test_gmm_gpu_triton.py).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from kernels_pallas import api
from kernels_pallas.gmm import ops

G, M, K, N = 2, 64, 128, 128  # one 128-block for fp8_blockwise; 32-blocks for MX
GROUPS = jnp.asarray([40, 24], jnp.int32)


def _operands(seed: int = 0):
    k = jax.random.split(jax.random.PRNGKey(seed), 3)
    a = jax.random.normal(k[0], (M, K), jnp.float32)
    w = jax.random.normal(k[1], (G, K, N), jnp.float32) * 0.1
    dy = jax.random.normal(k[2], (M, N), jnp.float32)
    return a, w, dy


def _fwd_and_grads(impl: str, precision: str):
    a, w, dy = _operands()

    def loss(a, w):
        return jnp.sum(ops.grouped_matmul(a, w, GROUPS, precision=precision, impl=impl) * dy)

    y = ops.grouped_matmul(a, w, GROUPS, precision=precision, impl=impl)
    ga, gw = jax.grad(loss, (0, 1))(a, w)
    return [np.asarray(t) for t in (y, ga, gw)]


class GroupedMatmulBase:
    """grouped_matmul forward, dgrad and wgrad of every backend against the XLA reference."""

    impl: str = ""

    # The quantised precisions interpret every block (~60 s on 2 cores): -m slow. The default run
    # still checks the quantised kinds of the same kernel in kernels_pallas/gmm/test_gmm.py.
    @pytest.mark.parametrize("precision", ["f32", pytest.param("fp8_blockwise", marks=pytest.mark.slow),
                                           pytest.param("mxfp8", marks=pytest.mark.slow)])
    def test_forward_dgrad_wgrad_match_reference(self, precision):
        got = _fwd_and_grads(self.impl, precision)
        want = _fwd_and_grads("xla", precision)
        for name, g, r in zip(("forward", "dgrad", "wgrad"), got, want):
            scale = float(np.max(np.abs(r))) or 1.0
            assert np.max(np.abs(g - r)) <= 1e-5 * scale, (self.impl, precision, name)


class QuantizeBase:
    """Block quantisers of every backend: bit-identical codes and scales to the XLA reference."""

    impl: str = ""
    formats: tuple = ("mxfp8_e4m3", "nvfp4_per_token")

    def test_bits_match_reference(self):
        x = jax.random.normal(jax.random.PRNGKey(1), (32, 128), jnp.float32) * 3.0
        for fmt in self.formats:
            q, r = api.quantize(x, fmt, -1, impl=self.impl), api.quantize(x, fmt, -1, impl="xla")
            assert np.array_equal(np.asarray(q.data), np.asarray(r.data)), (self.impl, fmt)
            assert np.array_equal(np.asarray(q.scales), np.asarray(r.scales)), (self.impl, fmt)


class TestGroupedMatmulInterpret(GroupedMatmulBase):
    impl = "interpret"


class TestGroupedMatmulTritonInterpret(GroupedMatmulBase):
    impl = "triton_interpret"


class TestQuantizeInterpret(QuantizeBase):
    impl = "interpret"


class TestQuantizeTritonInterpret(QuantizeBase):
    impl = "triton_interpret"
