"""The tiled dropless MoE's two tile loops give the same values and gradients as autodiff through the
per-tile weight gather: the batched custom VJP (`moe_impls.TILED_CUSTOM_VJP`: re-gathers the tile
weights in the backward, segment-sums per-tile weight gradients) and the scan over tiles
(`moe_impls.TILE_LOOP = "scan"`, `c2jax/model/moe_tile_scan.py`: per-tile weight slices, gradients
added into each expert in the loop)."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from c2jax.model import moe_impls
from c2jax.model.config import MoEConfig


def _setup():
    m = MoEConfig(n_routed_experts=8, top_k=2, intermediate_size=24)
    k = jax.random.split(jax.random.key(0), 6)
    n, d = 150, 16  # uneven groups: some experts get partial tiles, maybe none
    p = {"gate_proj": 0.2 * jax.random.normal(k[0], (8, d, 24)), "up_proj": 0.2 * jax.random.normal(k[1], (8, d, 24)),
         "down_proj": 0.2 * jax.random.normal(k[2], (8, 24, d))}
    x = jax.random.normal(k[3], (n, d))
    first = jax.random.randint(k[4], (n,), 0, 6)  # experts 6, 7 only as second choices
    idx = jnp.stack([first, (first + 1 + (jnp.arange(n) % 2)) % 8], axis=1)
    w = jax.nn.softmax(jax.random.normal(k[5], (n, 2)))
    return m, p, x, idx, w


def _value_and_grads(monkeypatch, lowering: str, custom_vjp: bool, tile_loop: str = "batched"):
    m, p, x, idx, w = _setup()
    monkeypatch.setattr(moe_impls, "DROPLESS_LOWERING", lowering)
    monkeypatch.setattr(moe_impls, "TILED_CUSTOM_VJP", custom_vjp)
    monkeypatch.setattr(moe_impls, "TILE_LOOP", tile_loop)

    def loss(p, x):
        y, _ = moe_impls.dropless_moe(p, x, idx, w, m)
        return jnp.sum(y * jnp.cos(y))
    return jax.jit(jax.value_and_grad(loss, (0, 1)))(p, x)


def test_tile_custom_vjp_equals_autodiff(monkeypatch):
    ours_tree = _value_and_grads(monkeypatch, "tiled", True)
    ours = jax.tree.leaves(ours_tree)
    gather = jax.tree.leaves(_value_and_grads(monkeypatch, "tiled", False))
    for a, b in zip(ours, gather):  # (tiled vs ragged_dot: covered by the model core tests)
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-6, atol=1e-6)
    assert float(jnp.abs(ours_tree[1][0]["down_proj"][7]).max()) > 0  # a second-choice-only expert gets gradient


def test_tile_scan_equals_autodiff_through_the_gather(monkeypatch):
    ours_tree = _value_and_grads(monkeypatch, "tiled", True, "scan")
    gather = jax.tree.leaves(_value_and_grads(monkeypatch, "tiled", False, "batched"))
    for a, b in zip(jax.tree.leaves(ours_tree), gather):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-6, atol=1e-6)
    assert float(jnp.abs(ours_tree[1][0]["gate_proj"][7]).max()) > 0  # a second-choice-only expert gets gradient
    ragged = jax.tree.leaves(_value_and_grads(monkeypatch, "ragged", True, "scan"))  # no tiles at all
    for a, b in zip(jax.tree.leaves(ours_tree), ragged):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-5)


def test_tile_scan_is_what_the_tiled_path_runs_by_default():
    """The default tiled path traces the scan, not the batched per-tile weight gather."""
    m, p, x, idx, w = _setup()
    jaxpr = str(jax.make_jaxpr(lambda p, x: moe_impls.dropless_moe(p, x, idx, w, m)[0])(p, x))
    assert "tile_scan_swiglu" in jaxpr and "_tile_matmul" not in jaxpr
