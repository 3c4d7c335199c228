"""End to end: 50 real optax Adam steps (donated train state, as the CPT step does), each version
published in the background as an XOR delta; the reader's rebuilt weights are sha256-identical to
the trainer's for every leaf, both as f32 masters and as the bf16 an engine would receive.

The default test trains a small MLP (seconds); the slow one the tiny MoE model with its real
next-token + MTP loss (the compile alone takes ~30 s of CPU)."""
from __future__ import annotations

import functools
import hashlib

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from c2jax.model.config import preset
from c2jax.model.transformer import init
from c2jax.sync import WeightPublisher, WeightSubscriber, store_index
from c2jax.sync.deltas import changed_share_by_dtype, flatten_tree
from c2jax.train.smoke import smoke_loss

STEPS = 50


def _sha(tree) -> dict:
    return {k: hashlib.sha256(np.ascontiguousarray(np.asarray(x)).reshape(-1).view(np.uint8)).hexdigest()
            for k, x in flatten_tree(tree).items()}


def _mlp_problem():
    """A 2-layer MLP regressing a fixed random target: (params, loss(params, batch), batch)."""
    k = jax.random.split(jax.random.PRNGKey(0), 4)
    params = {"layers": [{"w": jax.random.normal(k[0], (32, 64)) * 0.2, "b": jnp.zeros((64,))},
                         {"w": jax.random.normal(k[1], (64, 8)) * 0.2, "b": jnp.zeros((8,))}],
              "scale": jnp.ones((8,))}
    x = jax.random.normal(k[2], (16, 32))
    y = jax.random.normal(k[3], (16, 8))

    def loss(p, batch):
        bx, by = batch
        h = jax.nn.gelu(bx @ p["layers"][0]["w"] + p["layers"][0]["b"])
        return jnp.mean(((h @ p["layers"][1]["w"] + p["layers"][1]["b"]) * p["scale"] - by) ** 2)
    return params, loss, (x, y)


def _tiny_moe_problem():
    cfg = preset("tiny")
    tokens = jax.random.randint(jax.random.PRNGKey(1), (2, 32), 0, cfg.vocab_size)
    return init(cfg, jax.random.PRNGKey(0)), lambda p, t: smoke_loss(p, t, cfg, 0.3)[0], tokens


def test_rebuilt_weights_hash_identical_after_50_adam_steps(tmp_path):
    _check_50_steps(tmp_path, *_mlp_problem())


@pytest.mark.slow
def test_rebuilt_weights_hash_identical_after_50_adam_steps_tiny_moe(tmp_path):
    _check_50_steps(tmp_path, *_tiny_moe_problem())


def _check_50_steps(tmp_path, params, loss, batch) -> None:
    tx = optax.adam(1e-3)
    opt_state = tx.init(params)

    @functools.partial(jax.jit, donate_argnums=(0, 1))
    def step(params, opt_state, batch):
        grads = jax.grad(loss)(params, batch)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state

    f32 = WeightPublisher(str(tmp_path / "f32"), full_every=10, keep_full=None)
    bf16 = WeightPublisher(str(tmp_path / "bf16"), full_every=10, keep_full=None, wire_dtype="bfloat16")
    follower = WeightSubscriber(str(tmp_path / "bf16"))  # the engine's side, rebuilding as it goes
    prev_bf16 = None
    for v in range(1, STEPS + 1):
        params, opt_state = step(params, opt_state, batch)
        f32.publish(params, v)
        bf16.publish(params, v)
        if v % 7 == 0 or v == STEPS:
            bf16.flush()
            wire = jax.tree_util.tree_map(lambda x: x.astype(jnp.bfloat16), params)
            assert _sha(follower.rebuild(v)) == _sha(wire) and follower.version == v
    f32.close()
    bf16.close()
    want_f32 = _sha(params)
    want_bf16 = _sha(jax.tree_util.tree_map(lambda x: x.astype(jnp.bfloat16), params))
    assert len(want_f32) == len(jax.tree_util.tree_leaves(params))
    assert _sha(WeightSubscriber(str(tmp_path / "f32")).rebuild(STEPS)) == want_f32  # fresh reader: full 41 + 9 deltas
    assert _sha(WeightSubscriber(str(tmp_path / "bf16")).rebuild()) == want_bf16
    idx = store_index(WeightSubscriber(str(tmp_path / "f32")).store)
    assert sorted(v for v, r in idx.items() if r.kind == "full") == [1, 11, 21, 31, 41]
    assert len(idx) == STEPS
    # the statistics describe the real update: brute-force share of bit-identical bf16 elements
    sub = WeightSubscriber(str(tmp_path / "bf16"))
    a, b = flatten_tree(sub.rebuild(STEPS - 1)), flatten_tree(sub.rebuild(STEPS))
    last = bf16.history[-1]
    assert last.version == STEPS and last.kind == "delta"
    assert last.identical_share == changed_share_by_dtype(a, b)
    assert 0.0 < last.stored_over_raw < 1.0
